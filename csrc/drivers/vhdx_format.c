/* VHDX headers, region table, metadata and parent locator: pure parsing
 * of buffers (vhdx_format.h).  qemu's block/vhdx.c decides what a reader
 * accepts where the spec leaves room; where qemu trusts a field (offsets
 * inside the file, items inside their region) we check it. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "vhdx_format.h"

/* ---- CRC-32C (Castagnoli, reflected 0x82f63b78), slicing by 4 -------- */

static uint32_t crc_table[4][256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1;
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 4; t++)
            crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xff];
}

/* qemu's crc32c(crc, ...) convention: no final inversion, the caller
 * starts from 0xffffffff; VHDX stores the result of that as is */
uint32_t vhdx_crc32c(uint32_t crc, const void *vbuf, size_t len)
{
    /* opens may run in parallel threads */
    if (pthread_once(&crc_once, crc_init) != 0)
        crc_init(); /* it fails only for invalid arguments: never here */
    const uint8_t *p = vbuf;
    while (len >= 4) {
        crc ^= vhdx_le32(p);
        crc = crc_table[3][crc & 0xff] ^ crc_table[2][(crc >> 8) & 0xff] ^
              crc_table[1][(crc >> 16) & 0xff] ^ crc_table[0][crc >> 24];
        p += 4;
        len -= 4;
    }
    while (len--)
        crc = (crc >> 8) ^ crc_table[0][(crc ^ *p++) & 0xff];
    return crc;
}

int vhdx_checksum_ok(const uint8_t *buf, size_t len, size_t crc_off)
{
    static const uint8_t zero[4];
    if (len < crc_off + 4)
        return 0;
    uint32_t crc = vhdx_crc32c(0xffffffffu, buf, crc_off);
    crc = vhdx_crc32c(crc, zero, 4);
    crc = vhdx_crc32c(crc, buf + crc_off + 4, len - crc_off - 4);
    return (crc ^ 0xffffffffu) == vhdx_le32(buf + crc_off);
}

/* ---- GUIDs, as stored: data1..3 little endian, data4 as bytes --------- */

#define GUID(d1, d2, d3, a, b, c, d, e, f, g, h)                                          \
    {(d1) & 0xff, ((d1) >> 8) & 0xff, ((d1) >> 16) & 0xff, ((uint32_t)(d1) >> 24) & 0xff, \
     (d2) & 0xff, ((d2) >> 8) & 0xff, (d3) & 0xff, ((d3) >> 8) & 0xff,                    \
     a, b, c, d, e, f, g, h}

static const uint8_t bat_guid[16] =
    GUID(0x2dc27766, 0xf623, 0x4200, 0x9d, 0x64, 0x11, 0x5e, 0x9b, 0xfd, 0x4a, 0x08);
static const uint8_t metadata_guid[16] =
    GUID(0x8b7ca206, 0x4790, 0x4b9a, 0xb8, 0xfe, 0x57, 0x5f, 0x05, 0x0f, 0x88, 0x6e);
static const uint8_t item_guids[VHDX_ITEM_COUNT][16] = {
    [VHDX_ITEM_PARAMS] =
        GUID(0xcaa16737, 0xfa36, 0x4d43, 0xb3, 0xb6, 0x33, 0xf0, 0xaa, 0x44, 0xe7, 0x6b),
    [VHDX_ITEM_DISK_SIZE] =
        GUID(0x2fa54224, 0xcd1b, 0x4876, 0xb2, 0x11, 0x5d, 0xbe, 0xd8, 0x3b, 0xf4, 0xb8),
    [VHDX_ITEM_PAGE83] =
        GUID(0xbeca12ab, 0xb2e6, 0x4523, 0x93, 0xef, 0xc3, 0x09, 0xe0, 0x00, 0xc7, 0x46),
    [VHDX_ITEM_LOGICAL_SECTOR] =
        GUID(0x8141bf1d, 0xa96f, 0x4709, 0xba, 0x47, 0xf2, 0x33, 0xa8, 0xfa, 0xab, 0x5f),
    [VHDX_ITEM_PHYSICAL_SECTOR] =
        GUID(0xcda348c7, 0x445d, 0x4471, 0x9c, 0xc9, 0xe9, 0x88, 0x52, 0x51, 0xc5, 0x56),
    [VHDX_ITEM_PARENT_LOCATOR] =
        GUID(0xa8d35f2d, 0xb30b, 0x454d, 0xab, 0xf7, 0xd3, 0xd8, 0x48, 0x34, 0xab, 0x0c),
};
static const char *const item_names[VHDX_ITEM_COUNT] = {
    "file parameters", "virtual disk size", "page 83 data", "logical sector size",
    "physical sector size", "parent locator",
};
/* the smallest each item can be */
static const uint32_t item_min[VHDX_ITEM_COUNT] = {8, 8, 16, 4, 4, 20};
static const uint8_t parent_vhdx_guid[16] =
    GUID(0xb04aefb7, 0xd19e, 0x4a81, 0xb7, 0x89, 0x25, 0xb8, 0xe9, 0x44, 0x59, 0x13);

static int guid_zero(const uint8_t *g)
{
    static const uint8_t zero[16];
    return memcmp(g, zero, 16) == 0;
}

/* ---- headers and log ---------------------------------------------------- */

static int header_valid(const uint8_t *b, struct vhdx_header *h)
{
    if (memcmp(b, "head", 4) != 0 || !vhdx_checksum_ok(b, VHDX_HEADER_SIZE, 4))
        return 0;
    h->sequence = vhdx_le64(b + 8);
    memcpy(h->file_write_guid, b + 16, 16);
    memcpy(h->data_write_guid, b + 32, 16);
    memcpy(h->log_guid, b + 48, 16);
    h->log_version = vhdx_le16(b + 64);
    h->version = vhdx_le16(b + 66);
    h->log_length = vhdx_le32(b + 68);
    h->log_offset = vhdx_le64(b + 72);
    return h->version == 1;
}

int vhdx_pick_header(const uint8_t *h1, const uint8_t *h2, struct vhdx_header *out,
                     const char *path, struct ic_error *err)
{
    struct vhdx_header a, b;
    int va = header_valid(h1, &a), vb = header_valid(h2, &b);
    if (!va && !vb)
        return ic_error_format(err, path, "no valid VHDX header (both checksums or "
                               "signatures are wrong)");
    if (va && vb && a.sequence == b.sequence) {
        /* Disk2VHD writes two identical headers */
        if (memcmp(h1, h2, VHDX_HEADER_SIZE) != 0)
            return ic_error_format(err, path, "the two VHDX headers differ but have the "
                                   "same sequence number %llu", (unsigned long long)a.sequence);
        *out = a;
        return 0;
    }
    *out = va && (!vb || a.sequence > b.sequence) ? a : b;
    return 0;
}

int vhdx_check_log(const struct vhdx_header *h, uint64_t file_size, const char *path,
                   struct ic_error *err)
{
    if (h->log_offset < VHDX_MIB || h->log_offset % VHDX_MIB)
        return ic_error_format(err, path, "VHDX log offset %llu is not a whole MiB past the "
                               "header section", (unsigned long long)h->log_offset);
    if (h->log_version != 0)
        return ic_error_format(err, path, "unsupported VHDX log version %u", h->log_version);
    if (guid_zero(h->log_guid) || h->log_length == 0)
        return 0;
    if (h->log_length % VHDX_MIB || h->log_offset > file_size ||
        h->log_length > file_size - h->log_offset)
        return ic_error_format(err, path, "VHDX log (%u bytes at %llu) is misplaced",
                               h->log_length, (unsigned long long)h->log_offset);
    return 1; /* a log of this header's: replay is owed if it holds an entry */
}

uint32_t vhdx_log_entry_length(const uint8_t *sector, const struct vhdx_header *h)
{
    if (memcmp(sector, "loge", 4) != 0 || memcmp(sector + 32, h->log_guid, 16) != 0)
        return 0;
    uint32_t len = vhdx_le32(sector + 8);
    return len && len % VHDX_LOG_SECTOR == 0 && len <= h->log_length ? len : 0;
}

int vhdx_log_needs_replay(const char *path, struct ic_error *err)
{
    /* a read-only open cannot replay it, and reading without replaying
     * would return stale data */
    return ic_error_format(err, path, "VHDX image contains a log that needs to be replayed "
                           "(it was not closed cleanly); imgcopy opens it read-only. To "
                           "replay the log, run: qemu-img check -r all '%s'", path);
}

/* ---- region table --------------------------------------------------------- */

static int overlaps(uint64_t a, uint64_t alen, uint64_t b, uint64_t blen)
{
    return alen && blen && a < b + blen && b < a + alen;
}

int vhdx_overlaps_region(const struct vhdx_regions *r, uint64_t off, uint64_t len)
{
    for (size_t i = 0; i < r->count; i++)
        if (overlaps(off, len, r->all[i].offset, r->all[i].length))
            return 1;
    return 0;
}

static int add_region(struct vhdx_regions *r, uint64_t off, uint64_t len, const char *what,
                      const char *path, struct ic_error *err)
{
    if (vhdx_overlaps_region(r, off, len))
        return ic_error_format(err, path, "VHDX %s (%llu bytes at %llu) overlaps another "
                               "region", what, (unsigned long long)len, (unsigned long long)off);
    r->all[r->count].offset = off;
    r->all[r->count].length = len;
    r->count++;
    return 0;
}

int vhdx_parse_regions(const uint8_t *t, const struct vhdx_header *h, uint64_t file_size,
                       struct vhdx_regions *out, const char *path, struct ic_error *err)
{
    memset(out, 0, sizeof *out);
    if (memcmp(t, "regi", 4) != 0 || !vhdx_checksum_ok(t, VHDX_TABLE_SIZE, 4))
        return ic_error_format(err, path, "bad VHDX region table (signature or checksum)");
    uint32_t count = vhdx_le32(t + 8);
    if (count > VHDX_MAX_REGIONS)
        return ic_error_format(err, path, "VHDX region table has %u entries (at most %u)",
                               count, VHDX_MAX_REGIONS);
    add_region(out, 0, VHDX_HEADER_SECTION, "header section", path, err);
    if (add_region(out, h->log_offset, h->log_length, "log", path, err) < 0)
        return -1;
    int have_bat = 0, have_meta = 0;
    for (uint32_t i = 0; i < count; i++) {
        const uint8_t *e = t + 16 + 32 * (size_t)i;
        uint64_t off = vhdx_le64(e + 16);
        uint32_t len = vhdx_le32(e + 24);
        uint32_t bits = vhdx_le32(e + 28);
        int is_bat = memcmp(e, bat_guid, 16) == 0, is_meta = memcmp(e, metadata_guid, 16) == 0;
        const char *what = is_bat ? "BAT region" : is_meta ? "metadata region" : "region";
        if (off > UINT64_MAX - len)
            return ic_error_format(err, path, "VHDX %s offset %llu overflows", what,
                                   (unsigned long long)off);
        if ((is_bat || is_meta) && (off < VHDX_HEADER_SECTION || off + len > file_size))
            return ic_error_format(err, path, "VHDX %s (%u bytes at %llu) lies outside the "
                                   "file (%llu bytes) or in its header section", what, len,
                                   (unsigned long long)off, (unsigned long long)file_size);
        if (add_region(out, off, len, what, path, err) < 0)
            return -1;
        if (is_bat || is_meta) {
            int *have = is_bat ? &have_bat : &have_meta;
            if (*have)
                return ic_error_format(err, path, "VHDX region table names the %s twice",
                                       what);
            *have = 1;
            struct vhdx_range *r = is_bat ? &out->bat : &out->metadata;
            r->offset = off;
            r->length = len;
        } else if (bits & 1) {
            return ic_error_format(err, path, "VHDX image requires a region imgcopy does not "
                                   "know (entry %u)", i);
        }
    }
    if (!have_bat || !have_meta)
        return ic_error_format(err, path, "VHDX region table lacks the %s region",
                               have_bat ? "metadata" : "BAT");
    return 0;
}

/* ---- metadata ------------------------------------------------------------- */

int vhdx_parse_metadata_table(const uint8_t *t, size_t len, uint64_t region_len,
                              struct vhdx_item items[VHDX_ITEM_COUNT], const char *path,
                              struct ic_error *err)
{
    memset(items, 0, sizeof *items * VHDX_ITEM_COUNT);
    if (len < 32 || memcmp(t, "metadata", 8) != 0)
        return ic_error_format(err, path, "bad VHDX metadata table signature");
    uint16_t count = vhdx_le16(t + 10);
    if (count > VHDX_MAX_METADATA_ENTRIES || 32 + 32 * (size_t)count > len)
        return ic_error_format(err, path, "VHDX metadata table has %u entries (room for %zu)",
                               count, len < 32 ? 0 : (len - 32) / 32);
    for (uint16_t i = 0; i < count; i++) {
        const uint8_t *e = t + 32 + 32 * (size_t)i;
        uint32_t off = vhdx_le32(e + 16), ilen = vhdx_le32(e + 20), flags = vhdx_le32(e + 24);
        int k = 0;
        while (k < VHDX_ITEM_COUNT && memcmp(e, item_guids[k], 16) != 0)
            k++;
        if (k == VHDX_ITEM_COUNT) {
            if (flags & 4)
                return ic_error_format(err, path, "VHDX image requires a metadata item "
                                       "imgcopy does not know (entry %u)", i);
            continue;
        }
        if (items[k].present)
            return ic_error_format(err, path, "VHDX metadata names the %s twice",
                                   item_names[k]);
        /* items follow the 64 KiB table, inside the region */
        if (ilen < item_min[k] || off < VHDX_TABLE_SIZE || (uint64_t)off + ilen > region_len)
            return ic_error_format(err, path, "VHDX %s item (%u bytes at %u) is outside the "
                                   "metadata region or too short", item_names[k], ilen, off);
        for (int j = 0; j < VHDX_ITEM_COUNT; j++)
            if (items[j].present && overlaps(off, ilen, items[j].offset, items[j].length))
                return ic_error_format(err, path, "VHDX %s and %s items overlap",
                                       item_names[k], item_names[j]);
        items[k].present = 1;
        items[k].offset = off;
        items[k].length = ilen;
    }
    for (int k = 0; k < VHDX_ITEM_PARENT_LOCATOR; k++)
        if (!items[k].present)
            return ic_error_format(err, path, "VHDX metadata lacks the %s item", item_names[k]);
    return 0;
}

int vhdx_parse_meta_values(const struct vhdx_item items[VHDX_ITEM_COUNT],
                           const uint8_t *const bufs[VHDX_ITEM_COUNT], struct vhdx_meta *m,
                           const char *path, struct ic_error *err)
{
    memset(m, 0, sizeof *m);
    for (int k = 0; k < VHDX_ITEM_PARENT_LOCATOR; k++)
        if (!items[k].present || !bufs[k] || items[k].length < item_min[k])
            return ic_error_format(err, path, "VHDX metadata lacks the %s item", item_names[k]);
    const uint8_t *p = bufs[VHDX_ITEM_PARAMS];
    m->block_size = vhdx_le32(p);
    uint32_t flags = vhdx_le32(p + 4);
    m->leave_blocks_allocated = (flags & 1) != 0;
    m->has_parent = (flags & 2) != 0;
    m->disk_size = vhdx_le64(bufs[VHDX_ITEM_DISK_SIZE]);
    memcpy(m->page83, bufs[VHDX_ITEM_PAGE83], 16);
    m->logical_sector_size = vhdx_le32(bufs[VHDX_ITEM_LOGICAL_SECTOR]);
    m->physical_sector_size = vhdx_le32(bufs[VHDX_ITEM_PHYSICAL_SECTOR]);
    if (m->block_size < VHDX_BLOCK_MIN || m->block_size > VHDX_BLOCK_MAX ||
        (m->block_size & (m->block_size - 1)))
        return ic_error_format(err, path, "VHDX block size %u is not a power of two from "
                               "1 MiB to 256 MiB", m->block_size);
    if (m->logical_sector_size != 512 && m->logical_sector_size != 4096)
        return ic_error_format(err, path, "VHDX logical sector size %u is neither 512 nor 4096",
                               m->logical_sector_size);
    if (m->physical_sector_size != 512 && m->physical_sector_size != 4096)
        return ic_error_format(err, path, "VHDX physical sector size %u is neither 512 nor "
                               "4096", m->physical_sector_size);
    if (m->disk_size > VHDX_MAX_DISK_SIZE)
        return ic_error_format(err, path, "VHDX virtual disk size %llu is above 64 TiB",
                               (unsigned long long)m->disk_size);
    if (m->has_parent && !items[VHDX_ITEM_PARENT_LOCATOR].present)
        return ic_error_format(err, path, "VHDX differencing image without a parent locator");
    return 0;
}

/* ---- parent locator ------------------------------------------------------- */

/* UTF-16LE -> UTF-8, NUL terminated; -1 on a NUL, a lone surrogate or no
 * room */
static int utf16_to_utf8(const uint8_t *p, size_t n, char *out, size_t cap)
{
    size_t o = 0;
    for (size_t i = 0; i + 1 < n; i += 2) {
        uint32_t c = vhdx_le16(p + i);
        if (c >= 0xd800 && c < 0xdc00) {
            if (i + 3 >= n)
                return -1;
            uint32_t lo = vhdx_le16(p + i + 2);
            if (lo < 0xdc00 || lo >= 0xe000)
                return -1;
            c = 0x10000 + ((c - 0xd800) << 10) + (lo - 0xdc00);
            i += 2;
        } else if ((c >= 0xdc00 && c < 0xe000) || c == 0) {
            return -1;
        }
        uint8_t b[4];
        size_t k;
        if (c < 0x80) {
            b[0] = (uint8_t)c;
            k = 1;
        } else if (c < 0x800) {
            b[0] = (uint8_t)(0xc0 | c >> 6);
            b[1] = (uint8_t)(0x80 | (c & 0x3f));
            k = 2;
        } else if (c < 0x10000) {
            b[0] = (uint8_t)(0xe0 | c >> 12);
            b[1] = (uint8_t)(0x80 | ((c >> 6) & 0x3f));
            b[2] = (uint8_t)(0x80 | (c & 0x3f));
            k = 3;
        } else {
            b[0] = (uint8_t)(0xf0 | c >> 18);
            b[1] = (uint8_t)(0x80 | ((c >> 12) & 0x3f));
            b[2] = (uint8_t)(0x80 | ((c >> 6) & 0x3f));
            b[3] = (uint8_t)(0x80 | (c & 0x3f));
            k = 4;
        }
        if (o + k >= cap)
            return -1;
        memcpy(out + o, b, k);
        o += k;
    }
    out[o] = '\0';
    return 0;
}

int vhdx_parse_locator(const uint8_t *buf, size_t len, struct vhdx_locator *out,
                       const char *path, struct ic_error *err)
{
    memset(out, 0, sizeof *out);
    if (len < 20)
        return ic_error_format(err, path, "VHDX parent locator is too short");
    if (memcmp(buf, parent_vhdx_guid, 16) != 0)
        return ic_error_format(err, path, "VHDX differencing image with a parent locator of "
                               "an unknown type (only VHDX parents are supported)");
    uint16_t count = vhdx_le16(buf + 18);
    if (20 + 12 * (size_t)count > len)
        return ic_error_format(err, path, "VHDX parent locator has %u entries in %zu bytes",
                               count, len);
    struct {
        const char *key;
        char *value;
        size_t cap;
    } keys[] = {
        {"parent_linkage", out->parent_linkage, sizeof out->parent_linkage},
        {"parent_linkage2", out->parent_linkage2, sizeof out->parent_linkage2},
        {"relative_path", out->relative_path, sizeof out->relative_path},
        {"volume_path", out->volume_path, sizeof out->volume_path},
        {"absolute_win32_path", out->absolute_win32_path, sizeof out->absolute_win32_path},
    };
    for (uint16_t i = 0; i < count; i++) {
        const uint8_t *e = buf + 20 + 12 * (size_t)i;
        uint32_t koff = vhdx_le32(e), voff = vhdx_le32(e + 4);
        uint16_t klen = vhdx_le16(e + 8), vlen = vhdx_le16(e + 10);
        if (klen == 0 || vlen == 0 || klen % 2 || vlen % 2 || koff > len || klen > len - koff ||
            voff > len || vlen > len - voff)
            return ic_error_format(err, path, "VHDX parent locator entry %u is outside the "
                                   "locator", i);
        char key[64];
        if (utf16_to_utf8(buf + koff, klen, key, sizeof key) < 0)
            continue; /* not a key we know */
        for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
            if (strcmp(key, keys[k].key) != 0)
                continue;
            if (keys[k].value[0])
                return ic_error_format(err, path, "VHDX parent locator has %s twice", key);
            if (utf16_to_utf8(buf + voff, vlen, keys[k].value, keys[k].cap) < 0)
                return ic_error_format(err, path, "VHDX parent locator's %s is too long or "
                                       "not text", key);
        }
    }
    if (!out->relative_path[0] && !out->volume_path[0] && !out->absolute_win32_path[0])
        return ic_error_format(err, path, "VHDX parent locator names no parent path");
    return 0;
}

void vhdx_guid_text(const uint8_t g[16], char *out)
{
    snprintf(out, 39, "{%08x-%04x-%04x-%02x%02x-%02x%02x%02x%02x%02x%02x}", vhdx_le32(g),
             vhdx_le16(g + 4), vhdx_le16(g + 6), g[8], g[9], g[10], g[11], g[12], g[13], g[14],
             g[15]);
}

int vhdx_guid_matches(const char *text, const uint8_t g[16])
{
    char want[40];
    vhdx_guid_text(g, want);
    size_t n = strlen(text);
    const char *w = want;
    if (n == 36) /* without braces */
        w++;
    else if (n != 38)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = text[i];
        if (c >= 'A' && c <= 'F')
            c = (char)(c - 'A' + 'a');
        if (c != w[i])
            return 0;
    }
    return 1;
}

int vhdx_host_path(const char *win, char *out, size_t cap)
{
    const char *p = win;
    if (strncmp(p, "\\\\?\\", 4) == 0) {
        /* \\?\Volume{GUID}\dir\file: the volume is the root */
        p += 4;
        const char *sep = strchr(p, '\\');
        if (!sep)
            return -1;
        p = sep;
    } else if (((p[0] | 0x20) >= 'a' && (p[0] | 0x20) <= 'z') && p[1] == ':') {
        p += 2;
        if (*p != '\\' && *p != '/')
            return -1; /* relative to a drive's current directory */
    } else if (p[0] == '\\' && p[1] == '\\') {
        return -1; /* a network share */
    }
    size_t n = strlen(p);
    if (n == 0 || n >= cap)
        return -1;
    for (size_t i = 0; i <= n; i++)
        out[i] = p[i] == '\\' ? '/' : p[i];
    return 0;
}

/* ---- the BAT's shape -------------------------------------------------------- */

int vhdx_geometry(const struct vhdx_meta *m, uint64_t bat_region_len, struct vhdx_geometry *g,
                  const char *path, struct ic_error *err)
{
    memset(g, 0, sizeof *g);
    g->sectors_per_block = m->block_size / m->logical_sector_size;
    /* a sector bitmap block has a bit for each of 2^23 sectors */
    g->chunk_ratio = (1ull << 23) * m->logical_sector_size / m->block_size;
    g->blocks = m->disk_size / m->block_size + (m->disk_size % m->block_size != 0);
    if (m->has_parent) {
        uint64_t chunks = g->blocks / g->chunk_ratio + (g->blocks % g->chunk_ratio != 0);
        g->bat_entries = chunks * (g->chunk_ratio + 1);
    } else {
        g->bat_entries = g->blocks ? g->blocks + (g->blocks - 1) / g->chunk_ratio : 0;
    }
    if (g->bat_entries > bat_region_len / 8)
        return ic_error_format(err, path, "VHDX BAT region (%llu bytes) is too small for "
                               "%llu entries", (unsigned long long)bat_region_len,
                               (unsigned long long)g->bat_entries);
    return 0;
}
