/* VHDX, read-only: open (headers, log, regions, metadata, BAT), reads and
 * block status, and the driver table.  The parsing is in vhdx_format.c.
 *
 * Payload block states, as qemu's read path and the spec read them:
 * NOT_PRESENT is not held here (the parent's, or zeros without one);
 * ZERO, UNMAPPED and, without a parent, UNDEFINED read as zeros held here;
 * FULLY_PRESENT is data at its file offset; PARTIALLY_PRESENT (only in a
 * differencing disk) is data where its chunk's sector bitmap has a bit
 * set, the parent's elsewhere.  In a differencing disk an UNDEFINED block
 * has no content of its own either: the parent answers. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../image.h"
#include "vhdx_format.h"

struct bat_range {
    uint64_t first, end;
};

struct vhdx_state {
    struct ic_image *file;
    struct vhdx_header h;
    struct vhdx_regions *regions;
    struct vhdx_meta m;
    struct vhdx_geometry g;
    struct vhdx_locator loc;
    uint64_t *bat;
    /* The BAT's entries the file holds as data, ranges [first, end) in
     * order: the others lie in holes of the file and read as zeros (not
     * present), as they do for qemu. */
    struct bat_range *held;
    size_t nheld;
    /* the parent is the one named by the locator's parent_linkage: 0 not
     * checked yet (the image layer opens it after us), 1 yes, -1 no */
    atomic_int linkage;
};

static struct vhdx_state *state_of(struct ic_image *img)
{
    return img->drv_state;
}

static void vhdx_close(struct ic_image *img)
{
    struct vhdx_state *s = state_of(img);
    if (!s)
        return;
    free(s->bat);
    free(s->held);
    free(s->regions);
    free(s);
    img->drv_state = NULL;
}

/* `len` bytes at `off` of the file, which must hold them */
static int read_file(struct ic_image *img, void *buf, uint64_t len, uint64_t off,
                     const char *what, struct ic_error *err)
{
    struct vhdx_state *s = state_of(img);
    uint64_t fsize = ic_image_size(s->file);
    if (off > fsize || len > fsize - off)
        return ic_error_format(err, img->path, "VHDX %s (%llu bytes at %llu) lies past the end "
                               "of the file (%llu bytes)", what, (unsigned long long)len,
                               (unsigned long long)off, (unsigned long long)fsize);
    return ic_image_pread(s->file, buf, (size_t)len, off, err);
}

/* ---- open ------------------------------------------------------------------ */

static int load_metadata(struct ic_image *img, struct ic_error *err)
{
    struct vhdx_state *s = state_of(img);
    const struct vhdx_range *mr = &s->regions->metadata;
    uint8_t *table = calloc(1, VHDX_TABLE_SIZE);
    if (!table)
        return ic_error_nomem(err);
    size_t tlen = mr->length < VHDX_TABLE_SIZE ? (size_t)mr->length : VHDX_TABLE_SIZE;
    struct vhdx_item items[VHDX_ITEM_COUNT];
    int r = read_file(img, table, tlen, mr->offset, "metadata table", err);
    if (r == 0)
        r = vhdx_parse_metadata_table(table, tlen, mr->length, items, img->path, err);
    free(table);
    if (r < 0)
        return -1;

    /* the fixed-size items are small: one buffer each, of their minimum */
    uint8_t vals[VHDX_ITEM_PARENT_LOCATOR][16];
    static const uint32_t need[VHDX_ITEM_PARENT_LOCATOR] = {8, 8, 16, 4, 4};
    const uint8_t *bufs[VHDX_ITEM_COUNT] = {0};
    struct vhdx_item sized[VHDX_ITEM_COUNT];
    memcpy(sized, items, sizeof sized);
    for (int k = 0; k < VHDX_ITEM_PARENT_LOCATOR; k++) {
        if (read_file(img, vals[k], need[k], mr->offset + items[k].offset, "metadata item",
                      err) < 0)
            return -1;
        sized[k].length = need[k];
        bufs[k] = vals[k];
    }
    if (vhdx_parse_meta_values(sized, bufs, &s->m, img->path, err) < 0)
        return -1;
    if (!s->m.has_parent)
        return 0;
    const struct vhdx_item *li = &items[VHDX_ITEM_PARENT_LOCATOR];
    if (li->length > VHDX_MAX_LOCATOR)
        return ic_error_format(err, img->path, "VHDX parent locator of %u bytes is too large",
                               li->length);
    uint8_t *lb = malloc(li->length);
    if (!lb)
        return ic_error_nomem(err);
    r = read_file(img, lb, li->length, mr->offset + li->offset, "parent locator", err);
    if (r == 0)
        r = vhdx_parse_locator(lb, li->length, &s->loc, img->path, err);
    free(lb);
    return r;
}

/* `name` (a host path) names a file, relative to the image's directory */
static int resolves(const char *image_path, const char *name)
{
    char full[IC_BACKING_NAME_MAX + IC_ERROR_PATH_MAX];
    const char *slash = strrchr(image_path, '/');
    if (name[0] == '/' || !slash)
        snprintf(full, sizeof full, "%s", name);
    else
        snprintf(full, sizeof full, "%.*s/%s", (int)(slash - image_path), image_path, name);
    struct stat st;
    return stat(full, &st) == 0;
}

/* The parent, as the spec orders the locator's paths: relative_path, then
 * volume_path, then absolute_win32_path; the absolute ones only when they
 * name a file here.  A relative path that does not resolve is still the
 * answer when nothing else does (opening it then says what is missing). */
static int choose_parent(struct ic_image *img, struct ic_error *err)
{
    struct vhdx_state *s = state_of(img);
    char rel[VHDX_PATH_MAX] = "", cand[VHDX_PATH_MAX];
    if (s->loc.relative_path[0] &&
        vhdx_host_path(s->loc.relative_path, rel, sizeof rel) == 0 && rel[0] == '/')
        rel[0] = '\0'; /* "\dir\x.vhdx" is not relative: treat it as unusable */
    if (rel[0] && resolves(img->path, rel)) {
        snprintf(img->backing_name, sizeof img->backing_name, "%s", rel);
    } else if (s->loc.volume_path[0] &&
               vhdx_host_path(s->loc.volume_path, cand, sizeof cand) == 0 &&
               resolves(img->path, cand)) {
        snprintf(img->backing_name, sizeof img->backing_name, "%s", cand);
    } else if (s->loc.absolute_win32_path[0] &&
               vhdx_host_path(s->loc.absolute_win32_path, cand, sizeof cand) == 0 &&
               resolves(img->path, cand)) {
        snprintf(img->backing_name, sizeof img->backing_name, "%s", cand);
    } else if (rel[0]) {
        snprintf(img->backing_name, sizeof img->backing_name, "%s", rel);
    } else {
        return ic_error_format(err, img->path, "VHDX differencing image: its parent (%s) is "
                               "not found", s->loc.absolute_win32_path[0]
                                   ? s->loc.absolute_win32_path : s->loc.volume_path);
    }
    snprintf(img->backing_format, sizeof img->backing_format, "vhdx");
    return 0;
}

/* A block's or bitmap's file offset: past the header section, clear of
 * every region, its first `len` bytes inside the file. */
static int check_host(struct ic_image *img, uint64_t i, uint64_t off, uint64_t len,
                      struct ic_error *err)
{
    struct vhdx_state *s = state_of(img);
    uint64_t fsize = ic_image_size(s->file);
    if (off < VHDX_HEADER_SECTION || off > fsize || len > fsize - off)
        return ic_error_format(err, img->path, "VHDX BAT entry %llu points outside the file "
                               "(%llu bytes at %llu; the file has %llu): has it been "
                               "truncated?", (unsigned long long)i, (unsigned long long)len,
                               (unsigned long long)off, (unsigned long long)fsize);
    if (vhdx_overlaps_region(s->regions, off, len))
        return ic_error_format(err, img->path, "VHDX BAT entry %llu (at %llu) overlaps a "
                               "metadata region", (unsigned long long)i, (unsigned long long)off);
    return 0;
}

/* Entries [first, end) of the BAT, read and held (after those held
 * already: ranges come in order). */
static int hold(struct ic_image *img, uint64_t first, uint64_t end, struct ic_error *err)
{
    struct vhdx_state *s = state_of(img);
    if (s->nheld && s->held[s->nheld - 1].end >= first) {
        first = s->held[s->nheld - 1].end;
        if (first >= end)
            return 0;
        s->held[s->nheld - 1].end = end;
    } else {
        /* one more range: the array doubles at powers of two */
        if ((s->nheld & (s->nheld - 1)) == 0) {
            struct bat_range *grown = realloc(s->held, (s->nheld ? 2 * s->nheld : 1) *
                                                           sizeof *grown);
            if (!grown)
                return ic_error_nomem(err);
            s->held = grown;
        }
        s->held[s->nheld++] = (struct bat_range){first, end};
    }
    if (read_file(img, s->bat + first, (end - first) * 8, s->regions->bat.offset + first * 8,
                  "BAT", err) < 0)
        return -1;
    for (uint64_t i = first; i < end; i++)
        s->bat[i] = vhdx_le64((const uint8_t *)&s->bat[i]);
    return 0;
}

/* The first entry from i on that the file holds as data (those before it
 * are zeros), or g.bat_entries. */
static uint64_t next_held(const struct vhdx_state *s, uint64_t i)
{
    size_t lo = 0, hi = s->nheld;
    while (lo < hi) { /* the first range ending past i */
        size_t mid = lo + (hi - lo) / 2;
        if (s->held[mid].end <= i)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == s->nheld)
        return s->g.bat_entries;
    return s->held[lo].first > i ? s->held[lo].first : i;
}

/* The BAT lies inside the file, but a header may size it at 128 MiB in a
 * sparse file of a few KiB of data: only the parts the file holds as data
 * are read, byte-swapped and checked; its holes read as zeros (calloc),
 * entries that say "not present", as qemu reads them. */
static int load_bat(struct ic_image *img, struct ic_error *err)
{
    struct vhdx_state *s = state_of(img);
    const struct vhdx_geometry *g = &s->g;
    uint64_t bytes = g->bat_entries * 8;
    if (ic_image_take_meta_budget(img, bytes) < 0)
        return ic_error_format(err, img->path, "the backing chain's VHDX BATs need more than "
                               "%u MiB of memory", IC_CHAIN_META_BUDGET >> 20);
    s->bat = calloc(g->bat_entries ? g->bat_entries : 1, sizeof *s->bat);
    if (!s->bat)
        return ic_error_nomem(err);
    for (uint64_t pos = 0; pos < bytes;) {
        struct ic_extent x;
        if (ic_image_data_status(s->file, pos, s->regions->bat.offset + pos, bytes - pos, &x,
                                 err) < 0)
            return -1;
        if (!(x.flags & IC_EXT_ZERO) && hold(img, pos / 8, (pos + x.length + 7) / 8, err) < 0)
            return -1;
        pos += x.length;
    }
    uint64_t cr = g->chunk_ratio, bs = s->m.block_size;
    /* the entries not held are zeros: not present, nothing to check */
    for (uint64_t i = next_held(s, 0); i < g->bat_entries; i = next_held(s, i + 1)) {
        uint64_t e = s->bat[i];
        unsigned state = (unsigned)(e & VHDX_BAT_STATE_MASK);
        uint64_t off = e & VHDX_BAT_OFFSET_MASK;
        if (i % (cr + 1) == cr) {
            /* a sector bitmap entry: only a differencing disk reads them */
            if (!s->m.has_parent)
                continue;
            if (state == VHDX_SB_PRESENT) {
                if (check_host(img, i, off, VHDX_SECTOR_BITMAP_SIZE, err) < 0)
                    return -1;
            } else if (state != VHDX_SB_NOT_PRESENT) {
                return ic_error_format(err, img->path, "VHDX sector bitmap entry %llu has "
                                       "state %u", (unsigned long long)i, state);
            }
            continue;
        }
        uint64_t block = i - i / (cr + 1);
        if (block >= g->blocks)
            continue; /* the padding of a differencing disk's last chunk */
        uint64_t guest = s->m.disk_size - block * bs < bs ? s->m.disk_size - block * bs : bs;
        switch (state) {
        case VHDX_PAYLOAD_NOT_PRESENT:
        case VHDX_PAYLOAD_UNDEFINED:
        case VHDX_PAYLOAD_ZERO:
        case VHDX_PAYLOAD_UNMAPPED:
        case VHDX_PAYLOAD_UNMAPPED_V095:
            break;
        case VHDX_PAYLOAD_PARTIALLY_PRESENT: {
            if (!s->m.has_parent)
                return ic_error_format(err, img->path, "VHDX block %llu is partially present "
                                       "in an image without a parent",
                                       (unsigned long long)block);
            uint64_t sb = s->bat[(block / cr) * (cr + 1) + cr];
            if ((sb & VHDX_BAT_STATE_MASK) != VHDX_SB_PRESENT)
                return ic_error_format(err, img->path, "VHDX block %llu is partially present "
                                       "but its chunk has no sector bitmap",
                                       (unsigned long long)block);
        }
            /* fall through */
        case VHDX_PAYLOAD_FULLY_PRESENT:
            if (check_host(img, i, off, guest, err) < 0)
                return -1;
            break;
        default:
            return ic_error_format(err, img->path, "VHDX BAT entry %llu has the unknown state "
                                   "%u", (unsigned long long)i, state);
        }
    }
    return 0;
}

/* Whether the log holds an entry of the header's log (qemu's search: a
 * whole entry whose checksum holds, at any 4 KiB sector of the circular
 * log): an image closed cleanly keeps its log GUID, and nothing to
 * replay.  Read in chunks; an entry longer than VERIFY_MAX, or more than
 * that verified in all (a hostile log of claimed entries), is taken as
 * owing a replay, unread. */
#define LOG_CHUNK (1u << 20)
#define VERIFY_MAX (256ull << 20)
static int log_has_entry(struct vhdx_state *s, int *found, struct ic_error *err)
{
    const struct vhdx_header *h = &s->h;
    uint8_t *chunk = malloc(LOG_CHUNK), *entry = NULL;
    uint64_t verified = 0;
    *found = 0;
    if (!chunk)
        return ic_error_nomem(err);
    int r = 0;
    for (uint64_t pos = 0; r == 0 && !*found && pos < h->log_length; pos += LOG_CHUNK) {
        size_t n = h->log_length - pos < LOG_CHUNK ? (size_t)(h->log_length - pos) : LOG_CHUNK;
        r = ic_image_pread(s->file, chunk, n, h->log_offset + pos, err);
        for (size_t i = 0; r == 0 && !*found && i + VHDX_LOG_SECTOR <= n; i += VHDX_LOG_SECTOR) {
            uint32_t len = vhdx_log_entry_length(chunk + i, h);
            if (!len)
                continue;
            if (len > VERIFY_MAX || (verified += len) > VERIFY_MAX) {
                *found = 1;
                break;
            }
            uint8_t *grown = realloc(entry, len);
            if (!grown) {
                r = ic_error_nomem(err);
                break;
            }
            entry = grown;
            uint64_t at = pos + i, first = h->log_length - at < len ? h->log_length - at : len;
            r = ic_image_pread(s->file, entry, (size_t)first, h->log_offset + at, err);
            if (r == 0 && first < len) /* the log wraps around */
                r = ic_image_pread(s->file, entry + first, (size_t)(len - first), h->log_offset,
                                   err);
            if (r == 0 && vhdx_checksum_ok(entry, len, 4))
                *found = 1;
        }
    }
    free(chunk);
    free(entry);
    return r;
}

static int load(struct ic_image *img, struct ic_error *err)
{
    struct vhdx_state *s = state_of(img);
    uint64_t fsize = ic_image_size(s->file);
    if (fsize < VHDX_HEADER_SECTION)
        return ic_error_format(err, img->path, "truncated VHDX file (%llu bytes)",
                               (unsigned long long)fsize);
    uint8_t *buf = malloc(VHDX_TABLE_SIZE + 2 * VHDX_HEADER_SIZE);
    if (!buf)
        return ic_error_nomem(err);
    uint8_t *h1 = buf + VHDX_TABLE_SIZE, *h2 = h1 + VHDX_HEADER_SIZE;
    int r = ic_image_pread(s->file, buf, 8, 0, err);
    if (r == 0 && memcmp(buf, "vhdxfile", 8) != 0)
        r = ic_error_format(err, img->path, "not a VHDX file (no \"vhdxfile\" signature)");
    if (r == 0)
        r = ic_image_pread(s->file, h1, VHDX_HEADER_SIZE, VHDX_HEADER1_OFFSET, err);
    if (r == 0)
        r = ic_image_pread(s->file, h2, VHDX_HEADER_SIZE, VHDX_HEADER2_OFFSET, err);
    if (r == 0)
        r = vhdx_pick_header(h1, h2, &s->h, img->path, err);
    if (r == 0 && (r = vhdx_check_log(&s->h, fsize, img->path, err)) > 0) {
        int owed = 0;
        r = log_has_entry(s, &owed, err);
        if (r == 0 && owed)
            r = vhdx_log_needs_replay(img->path, err);
    }
    if (r == 0)
        r = ic_image_pread(s->file, buf, VHDX_TABLE_SIZE, VHDX_REGION_TABLE_OFFSET, err);
    if (r == 0 && !(s->regions = malloc(sizeof *s->regions)))
        r = ic_error_nomem(err);
    if (r == 0)
        r = vhdx_parse_regions(buf, &s->h, fsize, s->regions, img->path, err);
    free(buf);
    if (r < 0 || load_metadata(img, err) < 0)
        return -1;
    if (vhdx_geometry(&s->m, s->regions->bat.length, &s->g, img->path, err) < 0 ||
        load_bat(img, err) < 0)
        return -1;
    /* qemu sees whole 512-byte sectors */
    img->size = s->m.disk_size / 512 * 512;
    if (s->m.has_parent && choose_parent(img, err) < 0)
        return -1;
    return 0;
}

static int vhdx_open(struct ic_image *img, struct ic_error *err)
{
    if (img->open_flags & IC_OPEN_RDWR)
        return ic_error_format(err, img->path, "imgcopy reads VHDX images only");
    struct vhdx_state *s = calloc(1, sizeof *s);
    if (!s)
        return ic_error_nomem(err);
    s->file = img->file;
    img->drv_state = s;
    if (load(img, err) < 0) {
        vhdx_close(img);
        return -1;
    }
    return 0;
}

/* ---- the parent's identity ------------------------------------------------ */

/* The spec's check that the parent is the image this one was made from:
 * its data write GUID is the locator's parent_linkage (or
 * parent_linkage2).  Done at the first read, when the parent is open. */
static int check_linkage(struct ic_image *img, struct ic_error *err)
{
    struct vhdx_state *s = state_of(img);
    int v = atomic_load(&s->linkage);
    if (v == 0) {
        v = 1;
        struct ic_image *parent = img->backing;
        if (s->loc.parent_linkage[0] && parent && parent->drv == &ic_format_vhdx) {
            const uint8_t *g = state_of(parent)->h.data_write_guid;
            if (!vhdx_guid_matches(s->loc.parent_linkage, g) &&
                !(s->loc.parent_linkage2[0] && vhdx_guid_matches(s->loc.parent_linkage2, g)))
                v = -1;
        }
        atomic_store(&s->linkage, v);
    }
    if (v > 0)
        return 0;
    char have[40];
    vhdx_guid_text(state_of(img->backing)->h.data_write_guid, have);
    return ic_error_format(err, img->path, "VHDX parent %s is not the image this differencing "
                           "image was made from (its data write GUID %s is not the "
                           "parent_linkage %s)", img->backing->path, have,
                           s->loc.parent_linkage);
}

/* ---- blocks ------------------------------------------------------------------ */

enum kind { K_BELOW, K_ZERO, K_DATA, K_PARTIAL };

static enum kind classify(const struct vhdx_state *s, uint64_t block, uint64_t *host)
{
    uint64_t cr = s->g.chunk_ratio;
    uint64_t e = s->bat[block + block / cr];
    *host = e & VHDX_BAT_OFFSET_MASK;
    switch (e & VHDX_BAT_STATE_MASK) {
    case VHDX_PAYLOAD_FULLY_PRESENT:
        return K_DATA;
    case VHDX_PAYLOAD_PARTIALLY_PRESENT:
        return K_PARTIAL;
    case VHDX_PAYLOAD_NOT_PRESENT:
        return K_BELOW;
    case VHDX_PAYLOAD_UNDEFINED:
        return s->m.has_parent ? K_BELOW : K_ZERO;
    default:
        return K_ZERO;
    }
}

/* The sector bitmap bits of sectors [first, first+n) of `block`, from
 * bit 0 of out[0] on. */
static int read_bits(struct ic_image *img, uint64_t block, uint64_t first, uint64_t n,
                     uint8_t *out, struct ic_error *err)
{
    struct vhdx_state *s = state_of(img);
    uint64_t cr = s->g.chunk_ratio;
    uint64_t sb = s->bat[(block / cr) * (cr + 1) + cr] & VHDX_BAT_OFFSET_MASK;
    uint64_t bit = (block % cr) * s->g.sectors_per_block + first;
    uint64_t lo = bit / 8, hi = (bit + n + 7) / 8;
    uint8_t *raw = malloc(hi - lo);
    if (!raw)
        return ic_error_nomem(err);
    if (ic_image_pread(s->file, raw, (size_t)(hi - lo), sb + lo, err) < 0) {
        free(raw);
        return -1;
    }
    memset(out, 0, (size_t)((n + 7) / 8));
    for (uint64_t i = 0; i < n; i++) {
        uint64_t b = bit + i - lo * 8;
        if (raw[b / 8] >> (b % 8) & 1)
            out[i / 8] |= (uint8_t)(1u << (i % 8));
    }
    free(raw);
    return 0;
}

static int bit_at(const uint8_t *bits, uint64_t i)
{
    return bits[i / 8] >> (i % 8) & 1;
}

/* The runs of present and absent sectors of a partially present block
 * over [a, b) (offsets in the block): runs_start, then runs_next until it
 * returns 0, then runs_end. */
struct runs {
    uint8_t *bits;
    uint64_t ss, first, n, i, a, b;
};

static int runs_start(struct ic_image *img, uint64_t block, uint64_t a, uint64_t b,
                      struct runs *r, struct ic_error *err)
{
    uint64_t ss = state_of(img)->m.logical_sector_size;
    *r = (struct runs){.ss = ss, .first = a / ss, .a = a, .b = b};
    r->n = (b + ss - 1) / ss - r->first;
    if (!(r->bits = malloc((size_t)((r->n + 7) / 8))))
        return ic_error_nomem(err);
    if (read_bits(img, block, r->first, r->n, r->bits, err) < 0) {
        free(r->bits);
        return -1;
    }
    return 0;
}

/* The next run, [*x, *y) clipped to [a, b), and whether it is present. */
static int runs_next(struct runs *r, uint64_t *x, uint64_t *y, int *present)
{
    if (r->i >= r->n)
        return 0;
    uint64_t j = r->i + 1;
    *present = bit_at(r->bits, r->i);
    while (j < r->n && bit_at(r->bits, j) == *present)
        j++;
    *x = (r->first + r->i) * r->ss;
    *y = (r->first + j) * r->ss;
    if (*x < r->a)
        *x = r->a;
    if (*y > r->b)
        *y = r->b;
    r->i = j;
    return 1;
}

static void runs_end(struct runs *r)
{
    free(r->bits);
}

/* ---- reads -------------------------------------------------------------------- */

static int read_partial(struct ic_image *img, uint8_t *buf, uint64_t len, uint64_t off,
                        uint64_t block, uint64_t host, struct ic_read_batch *data,
                        struct ic_error *err)
{
    struct vhdx_state *s = state_of(img);
    uint64_t bs = s->m.block_size, in = off - block * bs, a, b;
    struct runs runs;
    int present, r = runs_start(img, block, in, in + len, &runs, err);
    if (r < 0)
        return -1;
    while (r == 0 && runs_next(&runs, &a, &b, &present)) {
        uint8_t *p = buf + (a - in);
        r = present ? ic_read_batch_add(data, s->file, p, (size_t)(b - a), host + a, err)
                    : ic_image_read_below(img, p, (size_t)(b - a), block * bs + a, err);
    }
    runs_end(&runs);
    return r;
}

static int vhdx_pread(struct ic_image *img, void *vbuf, size_t len, uint64_t off,
                      struct ic_error *err)
{
    struct vhdx_state *s = state_of(img);
    uint8_t *buf = vbuf;
    uint64_t bs = s->m.block_size;
    if (s->m.has_parent && check_linkage(img, err) < 0)
        return -1;
    /* the present runs of the request, in blocks anywhere in the file, are
     * read together once all are known */
    struct ic_read_batch data;
    ic_read_batch_init(&data);
    while (len > 0) {
        uint64_t block = off / bs, in = off % bs, host;
        uint64_t n = bs - in < len ? bs - in : len;
        int r = 0;
        switch (classify(s, block, &host)) {
        case K_BELOW:
            r = ic_image_read_below(img, buf, (size_t)n, off, err);
            break;
        case K_ZERO:
            memset(buf, 0, (size_t)n);
            break;
        case K_DATA:
            r = ic_read_batch_add(&data, s->file, buf, (size_t)n, host + in, err);
            break;
        case K_PARTIAL:
            r = read_partial(img, buf, n, off, block, host, &data, err);
            break;
        }
        if (r < 0)
            return -1;
        buf += n;
        off += n;
        len -= (size_t)n;
    }
    return ic_read_batch_flush(&data, err);
}

/* ---- block status ------------------------------------------------------------- */

/* Append, merging with the last extent when it continues it. */
static int add(struct ic_extent_list *out, uint64_t start, uint64_t len, uint32_t flags,
               uint64_t host, struct ic_error *err)
{
    struct ic_extent e = {.start = start, .length = len, .flags = flags, .host_offset = host};
    return ic_extent_list_join(out, 0, &e, err);
}

#define DATA_FLAGS (IC_EXT_DATA | IC_EXT_PRESENT | IC_EXT_OFFSET_VALID)
/* blocks walked past `want` (each costs a BAT lookup, or a bitmap read) */
#define WALK_EXTRA_BLOCKS 256

static int status_partial(struct ic_image *img, uint64_t a, uint64_t b, uint64_t block,
                          uint64_t host, struct ic_extent_list *out, struct ic_error *err)
{
    uint64_t base = block * state_of(img)->m.block_size, x, y;
    struct runs runs;
    int present, r = runs_start(img, block, a - base, b - base, &runs, err);
    if (r < 0)
        return -1;
    while (r == 0 && runs_next(&runs, &x, &y, &present))
        r = present ? add(out, base + x, y - x, DATA_FLAGS, host + x, err)
                    : add(out, base + x, y - x, IC_EXT_BELOW, 0, err);
    runs_end(&runs);
    return r;
}

static int vhdx_block_status(struct ic_image *img, uint64_t start, uint64_t end, uint64_t want,
                             struct ic_extent_list *out, struct ic_error *err)
{
    struct vhdx_state *s = state_of(img);
    uint64_t bs = s->m.block_size, extra = 0;
    if (s->m.has_parent && check_linkage(img, err) < 0)
        return -1;
    for (uint64_t pos = start; pos < end && (pos <= want || extra < WALK_EXTRA_BLOCKS);) {
        uint64_t block = pos / bs, host;
        uint64_t b = (block + 1) * bs < end ? (block + 1) * bs : end;
        uint64_t cr = s->g.chunk_ratio, i = block + block / cr, next = next_held(s, i);
        if (next > i) {
            /* entries in holes of the file, up to the next one held: not
             * present, one run */
            uint64_t until = next - next / (cr + 1); /* the block of entry `next` */
            b = until * bs < end ? until * bs : end;
            if (add(out, pos, b - pos, IC_EXT_BELOW, 0, err) < 0)
                return -1;
            if (pos > want)
                extra += (b - pos) / bs + 1;
            pos = b;
            continue;
        }
        int r = 0;
        switch (classify(s, block, &host)) {
        case K_BELOW:
            r = add(out, pos, b - pos, IC_EXT_BELOW, 0, err);
            break;
        case K_ZERO:
            r = add(out, pos, b - pos, IC_EXT_ZERO | IC_EXT_PRESENT, 0, err);
            break;
        case K_DATA:
            r = add(out, pos, b - pos, DATA_FLAGS, host + (pos - block * bs), err);
            break;
        case K_PARTIAL:
            r = status_partial(img, pos, b, block, host, out, err);
            break;
        }
        if (r < 0)
            return -1;
        if (pos > want)
            extra++;
        pos = b;
    }
    return 0;
}

/* ---- info ---------------------------------------------------------------------- */

static void vhdx_describe(struct ic_image *img, struct ic_image_info *out)
{
    struct vhdx_state *s = state_of(img);
    out->cluster_size = s->m.block_size;
    out->qemu_sees_all_data = 1; /* qemu 7.2's vhdx driver has no block status */
    if (s->m.has_parent) {
        out->has_backing = 1;
        snprintf(out->backing_name, sizeof out->backing_name, "%.1023s", img->backing_name);
        snprintf(out->backing_format, sizeof out->backing_format, "vhdx");
    }
}

const struct ic_driver ic_format_vhdx = {
    .name = "vhdx",
    .kind = IC_FORMAT,
    .open = vhdx_open,
    .close = vhdx_close,
    .pread = vhdx_pread,
    .block_status = vhdx_block_status,
    .random_access_status = 1,
    .describe = vhdx_describe,
};
