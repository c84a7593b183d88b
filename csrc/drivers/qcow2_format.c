/* The qcow2 header, its extensions, the snapshot table's entries and the
 * bitmap directory, checked as qemu checks them when it opens an image
 * (qcow2_do_open and what it calls): what qemu refuses, imgcopy refuses,
 * naming the field as docs/interop/qcow2.txt spells it; what qemu accepts
 * (names ending at a NUL, tables past the end of the file), imgcopy reads
 * as qemu does. */
#include "qcow2_format.h"

#include <stdint.h>
#include <string.h>

#include "../compression.h"

#define INT64_MAXU ((uint64_t)INT64_MAX)

uint64_t qcow2_be64(const void *p)
{
    const uint8_t *b = p;
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | b[i];
    return v;
}

uint32_t qcow2_be32(const void *p)
{
    const uint8_t *b = p;
    return (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | b[3];
}

void qcow2_put_be64(uint8_t *p, uint64_t v)
{
    for (int i = 7; i >= 0; i--, v >>= 8)
        p[i] = (uint8_t)v;
}

void qcow2_put_be32(uint8_t *p, uint32_t v)
{
    for (int i = 3; i >= 0; i--, v >>= 8)
        p[i] = (uint8_t)v;
}

uint64_t qcow2_refcount_entry(const uint8_t *block, uint64_t idx, unsigned bits)
{
    uint64_t bitpos = idx * bits, v = 0;
    if (bits < 8)
        return (block[bitpos / 8] >> (bitpos % 8)) & ((1u << bits) - 1);
    for (unsigned b = 0; b < bits / 8; b++)
        v = v << 8 | block[bitpos / 8 + b];
    return v;
}

static uint16_t be16(const uint8_t *b)
{
    return (uint16_t)(b[0] << 8 | b[1]);
}

static int bad(const char *path, struct ic_error *err, const char *what,
               unsigned long long value)
{
    return ic_error_format(err, path, "corrupt qcow2 header: %s (%llu)", what, value);
}

/* A table of `n` entries of `entry` bytes at `off`: qemu's
 * validate_table, and its limit on where a read may reach. */
static int check_table(uint64_t off, uint64_t n, uint64_t entry, uint64_t max_n,
                       uint64_t cluster_size, const char *count_field, const char *offset_field,
                       const char *path, struct ic_error *err)
{
    if (n > max_n)
        return ic_error_format(err, path, "corrupt qcow2 header: %s %llu is above the limit "
                               "of %llu", count_field, (unsigned long long)n,
                               (unsigned long long)max_n);
    uint64_t bytes = n * entry;
    if (off % cluster_size || off > INT64_MAXU - bytes)
        return ic_error_format(err, path, "corrupt qcow2 header: %s 0x%llx is invalid (not "
                               "cluster aligned, or the table ends past 2^63)", offset_field,
                               (unsigned long long)off);
    if (n && off + bytes > QCOW2_MAX_OFFSET)
        return ic_error_format(err, path, "corrupt qcow2 header: %s 0x%llx: the table cannot "
                               "be read (it ends past 2^63 - 2^30)", offset_field,
                               (unsigned long long)off);
    return 0;
}

int qcow2_parse_header(const uint8_t *buf, size_t len, struct qcow2_header *h,
                       const char *path, struct ic_error *err)
{
    return qcow2_parse_header_as(buf, len, 0, h, path, err);
}

int qcow2_parse_header_as(const uint8_t *buf, size_t len, unsigned how,
                          struct qcow2_header *h, const char *path, struct ic_error *err)
{
    memset(h, 0, sizeof *h);
    /* an incomplete v2 image of imgcopy's writer: no magic, version 2 */
    int no_magic = (how & QCOW2_PARSE_INCOMPLETE) && len >= 8 &&
                   memcmp(buf, "\0\0\0\0", 4) == 0 && qcow2_be32(buf + 4) == 2;
    if (!no_magic && (len < 4 || memcmp(buf, QCOW2_MAGIC, 4) != 0))
        return ic_error_format(err, path, "not a qcow2 image (bad magic)");
    if (len < QCOW2_HEADER_V2_LEN)
        return ic_error_format(err, path, "not a qcow2 image (header truncated to %zu bytes)",
                               len);
    h->version = qcow2_be32(buf + 4);
    h->backing_file_offset = qcow2_be64(buf + 8);
    h->backing_file_size = qcow2_be32(buf + 16);
    h->cluster_bits = qcow2_be32(buf + 20);
    h->size = qcow2_be64(buf + 24);
    h->crypt_method = qcow2_be32(buf + 32);
    h->l1_size = qcow2_be32(buf + 36);
    h->l1_table_offset = qcow2_be64(buf + 40);
    h->refcount_table_offset = qcow2_be64(buf + 48);
    h->refcount_table_clusters = qcow2_be32(buf + 56);
    h->nb_snapshots = qcow2_be32(buf + 60);
    h->snapshots_offset = qcow2_be64(buf + 64);

    if (h->version != 2 && h->version != 3)
        return ic_error_format(err, path, "qcow2 version %u is not supported", h->version);
    if (h->cluster_bits < QCOW2_MIN_CLUSTER_BITS || h->cluster_bits > QCOW2_MAX_CLUSTER_BITS)
        return bad(path, err, "cluster_bits out of range 9..21", h->cluster_bits);
    h->cluster_size = 1ull << h->cluster_bits;

    if (h->version == 2) {
        h->refcount_order = 4;
        h->header_length = QCOW2_HEADER_V2_LEN;
    } else {
        if (len < QCOW2_HEADER_V3_MIN)
            return ic_error_format(err, path, "truncated qcow2 v3 header (%zu bytes)", len);
        h->incompatible = qcow2_be64(buf + 72);
        h->compatible = qcow2_be64(buf + 80);
        h->autoclear = qcow2_be64(buf + 88);
        h->refcount_order = qcow2_be32(buf + 96);
        h->header_length = qcow2_be32(buf + 100);
        if (h->header_length < QCOW2_HEADER_V3_MIN)
            return bad(path, err, "header_length below 104", h->header_length);
        if (h->header_length > h->cluster_size)
            return bad(path, err, "header_length exceeds the cluster size", h->header_length);
        if (h->header_length > 104 && len > 104)
            h->compression_type = buf[104];
    }
    uint64_t marks = QCOW2_INCOMPAT_DIRTY | QCOW2_INCOMPAT_CORRUPT;
    h->incomplete = no_magic || (h->version >= 3 && (h->incompatible & marks) == marks);
    if (h->backing_file_offset > h->cluster_size)
        return bad(path, err, "backing_file_offset past the header cluster",
                   h->backing_file_offset);
    if (h->refcount_order > 6)
        return bad(path, err, "refcount_order above 6", h->refcount_order);
    if (h->crypt_method > 2)
        return bad(path, err, "unknown crypt_method", h->crypt_method);

    /* the refcount table */
    /* imgcopy writes the refcounts last: an incomplete image may have none */
    if (h->refcount_table_clusters == 0 && !((how & QCOW2_PARSE_INCOMPLETE) && h->incomplete))
        return bad(path, err, "refcount_table_clusters is 0: no refcount table", 0);
    if (check_table(h->refcount_table_offset, h->refcount_table_clusters, h->cluster_size,
                    QCOW2_MAX_REFTABLE_BYTES / h->cluster_size, h->cluster_size,
                    "refcount_table_clusters", "refcount_table_offset", path, err) < 0)
        return -1;

    /* the snapshot table's place (its entries are read by the driver) */
    if (check_table(h->snapshots_offset, h->nb_snapshots, QCOW2_SNAPSHOT_FIXED,
                    QCOW2_MAX_SNAPSHOTS, h->cluster_size, "nb_snapshots", "snapshots_offset",
                    path, err) < 0)
        return -1;

    /* the L1 table must map the whole virtual disk, within qemu's cap */
    if (check_table(h->l1_table_offset, h->l1_size, 8, QCOW2_MAX_L1_BYTES / 8, h->cluster_size,
                    "l1_size", "l1_table_offset", path, err) < 0)
        return -1;
    uint64_t l2_entries = h->cluster_size / ((h->incompatible & QCOW2_INCOMPAT_EXTL2) ? 16 : 8);
    uint64_t clusters = h->size / h->cluster_size + (h->size % h->cluster_size != 0);
    uint64_t needed = clusters / l2_entries + (clusters % l2_entries != 0);
    if (needed > INT32_MAX)
        return ic_error_format(err, path, "corrupt qcow2 header: the virtual size (size field, "
                               "%llu bytes) is too large for qcow2",
                               (unsigned long long)h->size);
    if (h->l1_size < needed)
        return bad(path, err, "l1_size too small for the virtual size", h->l1_size);

    if (h->backing_file_offset) {
        uint64_t room = h->cluster_size - h->backing_file_offset;
        if (h->backing_file_size > QCOW2_MAX_BACKING_NAME || h->backing_file_size > room)
            return bad(path, err, "backing_file_size: the backing file name is too long",
                       h->backing_file_size);
    }
    return 0;
}

/* The bitmaps extension: taken only when its auto-clear bit says a
 * bitmap-aware program wrote the image last. */
static int parse_bitmaps(const uint8_t *data, uint32_t elen, struct qcow2_header *h,
                         const char *path, struct ic_error *err)
{
    if (elen != 24)
        return bad(path, err, "bitmaps extension is not 24 bytes long", elen);
    if (!(h->autoclear & QCOW2_AUTOCLEAR_BITMAPS))
        return 0;
    uint32_t nb = qcow2_be32(data), reserved = qcow2_be32(data + 4);
    uint64_t size = qcow2_be64(data + 8), off = qcow2_be64(data + 16);
    if (reserved)
        return bad(path, err, "the bitmaps extension's reserved field is not zero", reserved);
    if (nb > QCOW2_MAX_BITMAPS)
        return bad(path, err, "nb_bitmaps above 65535", nb);
    if (nb == 0)
        return bad(path, err, "nb_bitmaps is 0 in the bitmaps extension", 0);
    if (off % h->cluster_size)
        return bad(path, err, "bitmap_directory_offset is not cluster aligned", off);
    if (size > QCOW2_MAX_BITMAP_DIRECTORY)
        return bad(path, err, "bitmap_directory_size above 67107840", size);
    h->has_bitmaps = 1;
    h->nb_bitmaps = nb;
    h->bitmap_directory_size = size;
    h->bitmap_directory_offset = off;
    return 0;
}

int qcow2_parse_extensions(const uint8_t *cluster0, size_t len, struct qcow2_header *h,
                           const char *path, struct ic_error *err)
{
    /* extensions run from the end of the header to the backing file name
     * (or the end of the cluster) */
    size_t end = len < h->cluster_size ? len : (size_t)h->cluster_size;
    if (h->backing_file_offset && h->backing_file_offset < end)
        end = (size_t)h->backing_file_offset;
    size_t off = h->header_length;
    while (off < end) {
        if (end - off < 8)
            return ic_error_format(err, path, "corrupt qcow2 header: header extension at %zu "
                                   "runs past the extension area", off);
        uint32_t type = qcow2_be32(cluster0 + off);
        uint32_t elen = qcow2_be32(cluster0 + off + 4);
        off += 8;
        if (elen > end - off)
            return ic_error_format(err, path, "corrupt qcow2 header: header extension 0x%08x "
                                   "(%u bytes) runs past the extension area", type, elen);
        if (type == QCOW2_EXT_END)
            break;
        const uint8_t *data = cluster0 + off;
        if (type == QCOW2_EXT_BACKING_FORMAT) {
            if (elen > QCOW2_MAX_BACKING_FORMAT)
                return bad(path, err, "backing format extension longer than 15 bytes", elen);
            memcpy(h->backing_format, data, elen); /* a C string: a NUL ends it */
            h->backing_format[elen] = '\0';
        } else if (type == QCOW2_EXT_FEATURE_TABLE) {
            for (uint32_t k = 0; k + 48 <= elen; k += 48) {
                if (data[k] == 0 && data[k + 1] < 64) {
                    memcpy(h->incompatible_names[data[k + 1]], data + k + 2, 46);
                    h->incompatible_names[data[k + 1]][46] = '\0';
                }
            }
        } else if (type == QCOW2_EXT_CRYPTO) {
            if (h->crypt_method != 2)
                return bad(path, err, "crypto header extension without LUKS encryption "
                           "(crypt_method)", h->crypt_method);
        } else if (type == QCOW2_EXT_BITMAPS) {
            if (parse_bitmaps(data, elen, h, path, err) < 0)
                return -1;
        }
        off += ((size_t)elen + 7) / 8 * 8;
    }
    /* the name is a C string too: a NUL ends it, and an empty one means
     * no backing file */
    if (h->backing_file_offset && h->backing_file_size) {
        memcpy(h->backing_name, cluster0 + h->backing_file_offset, h->backing_file_size);
        h->backing_name[h->backing_file_size] = '\0';
    }
    return 0;
}

int qcow2_check_features(const struct qcow2_header *h, int force, int writable,
                         const char *path, struct ic_error *err)
{
    if (h->crypt_method)
        return ic_error_format(err, path, "encrypted qcow2 images are not supported "
                               "(crypt_method %u)", h->crypt_method);
    uint64_t in = h->incompatible;
    if (h->compression_type > QCOW2_COMPRESSION_ZSTD)
        return bad(path, err, "unknown compression_type", h->compression_type);
    if (h->compression_type == QCOW2_COMPRESSION_ZLIB && (in & QCOW2_INCOMPAT_COMPRESSION))
        return bad(path, err, "compression_type is zlib but its incompatible feature bit 3 is "
                   "set", 0);
    if (h->compression_type != QCOW2_COMPRESSION_ZLIB && !(in & QCOW2_INCOMPAT_COMPRESSION))
        return bad(path, err, "compression_type set without its incompatible feature bit 3",
                   h->compression_type);
    uint64_t known = QCOW2_INCOMPAT_DIRTY | QCOW2_INCOMPAT_CORRUPT | QCOW2_INCOMPAT_DATA_FILE |
                     QCOW2_INCOMPAT_COMPRESSION | QCOW2_INCOMPAT_EXTL2;
    for (unsigned bit = 0; bit < 64; bit++) {
        if ((in & ~known) >> bit & 1) {
            const char *name = h->incompatible_names[bit];
            return ic_error_format(err, path, "unsupported qcow2 incompatible_features bit "
                                   "%u%s%s%s", bit, name[0] ? " ('" : "", name,
                                   name[0] ? "')" : "");
        }
    }
    if ((in & QCOW2_INCOMPAT_EXTL2) && h->cluster_size / QCOW2_SUBCLUSTERS < 512)
        return ic_error_format(err, path, "corrupt qcow2 header: extended L2 entries with "
                               "%llu-byte subclusters (cluster_bits %u; at least 14 needed)",
                               (unsigned long long)(h->cluster_size / QCOW2_SUBCLUSTERS), h->cluster_bits);
    /* read-only, the caller may read such an image anyway */
    enum ic_remedy remedy = writable ? IC_REMEDY_NONE : IC_REMEDY_FORCE;
    if (in & QCOW2_INCOMPAT_CORRUPT && (!force || writable)) {
        ic_error_format(err, path, "the image is marked corrupt");
        return ic_error_remedy(err, remedy);
    }
    if (in & QCOW2_INCOMPAT_DIRTY && (!force || writable)) {
        ic_error_format(err, path, "the image is marked dirty (not closed cleanly); "
                        "qemu-img check -r all repairs it");
        return ic_error_remedy(err, remedy);
    }
    if (in & QCOW2_INCOMPAT_DATA_FILE)
        return ic_error_format(err, path, "qcow2 external data files are not supported");
    if (h->autoclear & QCOW2_AUTOCLEAR_DATA_FILE_RAW)
        return bad(path, err, "autoclear_features bit 1 (data-file-raw) without an external "
                   "data file", h->autoclear);
    if ((in & QCOW2_INCOMPAT_EXTL2) && writable)
        return ic_error_format(err, path, "writing into qcow2 images with extended L2 entries "
                               "(subclusters) is not supported; they are read only");
    if (h->compression_type == QCOW2_COMPRESSION_ZSTD &&
        !ic_compression_available(IC_COMPRESSION_ZSTD))
        return ic_error_format(err, path, "zstd-compressed qcow2 images are not supported "
                               "(imgcopy was built without libzstd: install libzstd-dev "
                               "and rebuild)");
    return 0;
}

/* ---- bitmap directory -------------------------------------------------- */

#define BITMAP_ENTRY_FIXED QCOW2_BITMAP_ENTRY_FIXED
#define BITMAP_MAX_TABLE_SIZE QCOW2_BITMAP_MAX_TABLE_SIZE
#define BITMAP_MAX_PHYS_SIZE QCOW2_BITMAP_MAX_PHYS_SIZE
#define BITMAP_MIN_GRANULARITY QCOW2_BITMAP_MIN_GRANULARITY
#define BITMAP_MAX_GRANULARITY QCOW2_BITMAP_MAX_GRANULARITY
#define BITMAP_MAX_NAME QCOW2_BITMAP_MAX_NAME
#define BITMAP_KNOWN_FLAGS (QCOW2_BITMAP_IN_USE | QCOW2_BITMAP_AUTO)
#define BITMAP_TYPE_DIRTY QCOW2_BITMAP_TYPE_DIRTY

/* qemu's constraints on one directory entry */
static int bitmap_entry_ok(const uint8_t *e, const struct qcow2_header *h)
{
    uint64_t table_offset = qcow2_be64(e);
    uint32_t table_size = qcow2_be32(e + 8), flags = qcow2_be32(e + 12);
    unsigned type = e[16], granularity = e[17];
    uint16_t name_size = be16(e + 18);
    if (table_size == 0 || table_offset == 0 || table_offset % h->cluster_size ||
        table_size > BITMAP_MAX_TABLE_SIZE || granularity > BITMAP_MAX_GRANULARITY ||
        granularity < BITMAP_MIN_GRANULARITY || (flags & ~BITMAP_KNOWN_FLAGS) ||
        name_size > BITMAP_MAX_NAME || type != BITMAP_TYPE_DIRTY)
        return 0;
    uint64_t phys = (uint64_t)table_size * h->cluster_size;
    if (phys > BITMAP_MAX_PHYS_SIZE)
        return 0;
    /* a bitmap in use may be stale; one that is not must cover the disk
     * (its length as qemu sees it: whole sectors) */
    return (flags & QCOW2_BITMAP_IN_USE) || h->size / 512 * 512 <= ((phys * 8) << granularity);
}

int qcow2_parse_bitmap_directory(const uint8_t *dir, size_t len, const struct qcow2_header *h,
                                 struct qcow2_bitmap *out, char *names, const char *path,
                                 struct ic_error *err)
{
    if (len == 0)
        return bad(path, err, "bitmap_directory_size is 0", 0);
    uint32_t count = 0;
    size_t pos = 0;
    while (pos < len) {
        if (len - pos < BITMAP_ENTRY_FIXED)
            return bad(path, err, "bitmap directory broken (entry past bitmap_directory_size)",
                       pos);
        const uint8_t *e = dir + pos;
        if (++count > h->nb_bitmaps)
            return bad(path, err, "bitmap directory holds more bitmaps than nb_bitmaps",
                       h->nb_bitmaps);
        uint16_t name_size = be16(e + 18);
        uint32_t extra = qcow2_be32(e + 20);
        uint64_t entry_len = ((uint64_t)BITMAP_ENTRY_FIXED + name_size + extra + 7) / 8 * 8;
        if (entry_len > len - pos)
            return bad(path, err, "bitmap directory broken (entry past bitmap_directory_size)",
                       pos);
        if (extra)
            return bad(path, err, "bitmap directory entry with extra data", extra);
        const char *name = (const char *)e + BITMAP_ENTRY_FIXED;
        if (!bitmap_entry_ok(e, h)) {
            int n = name_size > 64 ? 64 : name_size;
            return ic_error_format(err, path, "corrupt qcow2 image: bitmap '%.*s' of the "
                                   "bitmap directory breaks qcow2's constraints", n, name);
        }
        if (out && names) {
            /* the name goes where its entry starts in the directory: names
             * never overlap, and its NUL fits in the entry's fixed part */
            char *copy = names + pos;
            size_t n = strnlen(name, name_size);
            memcpy(copy, name, n);
            copy[n] = '\0';
            out[count - 1] = (struct qcow2_bitmap){
                .name = copy,
                .granularity_bits = e[17],
                .flags = qcow2_be32(e + 12),
                .table_offset = qcow2_be64(e),
                .table_size = qcow2_be32(e + 8),
            };
        }
        pos += (size_t)entry_len;
    }
    if (count != h->nb_bitmaps)
        return bad(path, err, "bitmap directory holds fewer bitmaps than nb_bitmaps",
                   h->nb_bitmaps);
    return 0;
}

int qcow2_bitmap_table_entry_ok(uint64_t entry, uint64_t cluster_size)
{
    const uint64_t reserved = 0xff000000000001feull;
    if (entry & reserved)
        return 0;
    uint64_t off = entry & QCOW2_BITMAP_OFFSET_MASK;
    return off == 0 || (!(entry & QCOW2_BITMAP_ALL_ONES) && off % cluster_size == 0);
}

uint64_t qcow2_bitmap_table_needed(uint64_t disk_len, unsigned granularity_bits,
                                   uint64_t cluster_size)
{
    if (disk_len == 0)
        return 0;
    /* qemu serializes the bits in 64-bit words: the words the disk's
     * granules fill, in bytes, in whole clusters */
    uint64_t bits = ((disk_len - 1) >> granularity_bits) + 1;
    uint64_t bytes = ((bits - 1) / 64 + 1) * 8;
    return (bytes - 1) / cluster_size + 1;
}

/* ---- snapshot table ---------------------------------------------------- */

int qcow2_parse_snapshot_entry(const uint8_t fixed[QCOW2_SNAPSHOT_FIXED], uint32_t index,
                               struct qcow2_snapshot_entry *e, uint64_t *entry_len,
                               const char *path, struct ic_error *err)
{
    e->l1_table_offset = qcow2_be64(fixed);
    e->l1_size = qcow2_be32(fixed + 8);
    e->id_str_size = be16(fixed + 12);
    e->name_size = be16(fixed + 14);
    e->date_sec = qcow2_be32(fixed + 16);
    e->date_nsec = qcow2_be32(fixed + 20);
    e->vm_clock_nsec = qcow2_be64(fixed + 24);
    e->vm_state_size = qcow2_be32(fixed + 32);
    e->extra_data_size = qcow2_be32(fixed + 36);
    if (e->extra_data_size > QCOW2_MAX_SNAPSHOT_EXTRA)
        return ic_error_format(err, path, "corrupt qcow2 image: snapshot table entry %u has "
                               "%u bytes of extra data (at most %u)", index,
                               e->extra_data_size, QCOW2_MAX_SNAPSHOT_EXTRA);
    *entry_len = ((uint64_t)QCOW2_SNAPSHOT_FIXED + e->extra_data_size + e->id_str_size +
                  e->name_size + 7) / 8 * 8;
    return 0;
}

/* ---- writing ------------------------------------------------------------ */

void qcow2_encode_header(const struct qcow2_header *q, int complete, uint8_t *h, size_t *len)
{
    int v2 = q->version == 2;
    int bitmaps = complete && !v2 && q->has_bitmaps;
    size_t pos = v2 ? QCOW2_HEADER_V2_LEN : QCOW2_HEADER_V3_LEN;
    memset(h, 0, QCOW2_HEADER_MAX);
    /* the extensions, the end marker, then the backing file name */
    if (q->backing_name[0]) {
        size_t flen = strlen(q->backing_format);
        qcow2_put_be32(h + pos, QCOW2_EXT_BACKING_FORMAT);
        qcow2_put_be32(h + pos + 4, (uint32_t)flen);
        memcpy(h + pos + 8, q->backing_format, flen);
        pos += 8 + (flen + 7) / 8 * 8;
    }
    if (bitmaps) {
        qcow2_put_be32(h + pos, QCOW2_EXT_BITMAPS);
        qcow2_put_be32(h + pos + 4, QCOW2_BITMAPS_EXT_LEN);
        qcow2_put_be32(h + pos + 8, q->nb_bitmaps); /* then 4 reserved bytes */
        qcow2_put_be64(h + pos + 16, q->bitmap_directory_size);
        qcow2_put_be64(h + pos + 24, q->bitmap_directory_offset);
        pos += 8 + QCOW2_BITMAPS_EXT_LEN;
    }
    *len = pos;
    if (q->backing_name[0] || bitmaps)
        *len = pos + 8; /* the end marker: zeros */
    if (q->backing_name[0]) {
        size_t nlen = strlen(q->backing_name);
        memcpy(h + *len, q->backing_name, nlen);
        qcow2_put_be64(h + 8, *len);
        qcow2_put_be32(h + 16, (uint32_t)nlen);
        *len += nlen;
    }
    /* an incomplete v2 image has no magic: nothing takes it for qcow2 */
    if (complete || !v2)
        memcpy(h, QCOW2_MAGIC, 4);
    qcow2_put_be32(h + 4, q->version);
    qcow2_put_be32(h + 20, q->cluster_bits);
    qcow2_put_be64(h + 24, q->size);
    qcow2_put_be32(h + 36, q->l1_size);
    qcow2_put_be64(h + 40, q->l1_table_offset);
    qcow2_put_be64(h + 48, q->refcount_table_offset);
    qcow2_put_be32(h + 56, q->refcount_table_clusters);
    if (!v2) {
        qcow2_put_be64(h + 72, complete ? 0 : QCOW2_INCOMPAT_DIRTY | QCOW2_INCOMPAT_CORRUPT);
        qcow2_put_be64(h + 88, bitmaps ? QCOW2_AUTOCLEAR_BITMAPS : 0);
        qcow2_put_be32(h + 96, q->refcount_order);
        qcow2_put_be32(h + 100, QCOW2_HEADER_V3_LEN);
        if (q->compression_type != QCOW2_COMPRESSION_ZLIB) {
            h[79] |= QCOW2_INCOMPAT_COMPRESSION; /* the low byte of a big-endian 64 */
            h[104] = q->compression_type;
        }
    }
}

void qcow2_patch_header(const uint8_t *found, const struct qcow2_header *q, int complete,
                        uint8_t *h, size_t *len)
{
    *len = q->version == 2 ? QCOW2_HEADER_V2_LEN : QCOW2_HEADER_V3_MIN;
    memcpy(h, found, *len);
    if (q->version == 2)
        memcpy(h, complete ? QCOW2_MAGIC : "\0\0\0\0", 4);
    qcow2_put_be64(h + 48, q->refcount_table_offset);
    qcow2_put_be32(h + 56, q->refcount_table_clusters);
    if (q->version >= 3) {
        uint64_t marks = QCOW2_INCOMPAT_DIRTY | QCOW2_INCOMPAT_CORRUPT;
        uint64_t in = q->incompatible & ~marks;
        qcow2_put_be64(h + 72, complete ? in : in | marks);
        qcow2_put_be64(h + 88, 0);
    }
}
