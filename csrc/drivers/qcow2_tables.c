/* qcow2 tables qemu reads when it opens an image, beyond the header and
 * L1: the snapshot table (listed by info) and, when the bitmaps extension
 * is valid, the bitmap directory and the bitmaps' tables.  qemu refuses an
 * image whose tables break its limits; so does imgcopy. */
#include <stdlib.h>
#include <string.h>

#include "qcow2_state.h"

/* Reads a table front to back through a window, so that a table of
 * thousands of small entries costs a few reads. */
#define WINDOW (256u << 10)

struct window {
    struct ic_image *img;
    uint8_t *buf;
    uint64_t start, len; /* what buf holds */
};

static int window_read(struct window *w, void *out, uint64_t len, uint64_t off,
                       const char *what, struct ic_error *err)
{
    if (len > WINDOW)
        return qcow2_read_meta(w->img, out, len, off, what, err);
    if (off < w->start || off - w->start + len > w->len) {
        w->start = off;
        w->len = WINDOW;
        if (off > QCOW2_MAX_OFFSET - WINDOW) /* the last window reaches the limit only */
            w->len = QCOW2_MAX_OFFSET - off < len ? len : QCOW2_MAX_OFFSET - off;
        if (qcow2_read_meta(w->img, w->buf, w->len, off, what, err) < 0) {
            w->len = 0;
            return -1;
        }
    }
    memcpy(out, w->buf + (off - w->start), (size_t)len);
    return 0;
}

/* A string of the table, cut as qemu cuts it: at `cap - 1` bytes and at
 * the first NUL. */
static int read_string(struct window *w, char *out, size_t cap, uint64_t size, uint64_t off,
                       struct ic_error *err)
{
    uint64_t n = size < cap - 1 ? size : cap - 1;
    if (n && window_read(w, out, n, off, "unreadable snapshot table", err) < 0)
        return -1;
    out[n] = '\0';
    return 0;
}

int qcow2_load_snapshots(struct ic_image *img, struct ic_error *err)
{
    struct qcow2_state *s = qcow2_state_of(img);
    uint32_t nb = s->h.nb_snapshots;
    if (nb == 0)
        return 0;
    if (ic_image_take_meta_budget(img, (uint64_t)nb * (sizeof *s->snapshots +
                                                       sizeof *s->snapshot_extra)) < 0)
        return ic_error_format(err, img->path, "the backing chain's snapshot tables need "
                               "more than %u MiB of memory", IC_CHAIN_META_BUDGET >> 20);
    struct window w = {.img = img, .buf = malloc(WINDOW)};
    s->snapshots = calloc(nb, sizeof *s->snapshots);
    s->snapshot_extra = calloc(nb, sizeof *s->snapshot_extra);
    if (!w.buf || !s->snapshots || !s->snapshot_extra) {
        free(w.buf);
        return ic_error_nomem(err);
    }
    int ret = 0;
    uint64_t off = s->h.snapshots_offset, table_len = 0;
    for (uint32_t i = 0; i < nb && ret == 0; i++) {
        off = (off + 7) / 8 * 8;
        uint8_t fixed[QCOW2_SNAPSHOT_FIXED], extra[24] = {0};
        struct qcow2_snapshot_entry e;
        uint64_t entry_len;
        struct ic_snapshot *sn = &s->snapshots[i];
        if (window_read(&w, fixed, sizeof fixed, off, "unreadable snapshot table", err) < 0 ||
            qcow2_parse_snapshot_entry(fixed, i, &e, &entry_len, img->path, err) < 0) {
            ret = -1;
            break;
        }
        table_len += entry_len;
        if (table_len > QCOW2_MAX_SNAPSHOTS_BYTES || off - s->h.snapshots_offset > INT32_MAX) {
            ret = ic_error_format(err, img->path, "corrupt qcow2 image: the snapshot table is "
                                  "larger than 64 MiB (at entry %u)", i);
            break;
        }
        uint64_t extra_off = off + QCOW2_SNAPSHOT_FIXED;
        uint64_t nextra = e.extra_data_size < sizeof extra ? e.extra_data_size : sizeof extra;
        uint64_t id_off = extra_off + e.extra_data_size;
        if ((nextra && window_read(&w, extra, nextra, extra_off, "unreadable snapshot table",
                                   err) < 0) ||
            read_string(&w, sn->id, sizeof sn->id, e.id_str_size, id_off, err) < 0 ||
            read_string(&w, sn->name, sizeof sn->name, e.name_size, id_off + e.id_str_size,
                        err) < 0) {
            ret = -1;
            break;
        }
        /* the 64-bit state size and the icount live in the extra data */
        sn->vm_state_size = nextra >= 8 ? qcow2_be64(extra) : e.vm_state_size;
        sn->icount = nextra >= 24 ? (int64_t)qcow2_be64(extra + 16) : -1;
        sn->vm_clock_nsec = e.vm_clock_nsec;
        sn->date_sec = e.date_sec;
        sn->date_nsec = e.date_nsec;
        s->snapshot_extra[i] = e.extra_data_size;
        off += entry_len;
    }
    free(w.buf);
    if (ret == 0)
        s->nsnapshots = nb;
    return ret;
}

int qcow2_snapshots(struct ic_image *img, const struct ic_snapshot **out, size_t *count)
{
    struct qcow2_state *s = qcow2_state_of(img);
    *out = s->snapshots;
    *count = s->nsnapshots;
    return 0;
}

/* Each bitmap not in use has a table of cluster offsets: qemu loads it at
 * open and refuses entries with reserved bits or misaligned offsets.  Its
 * entries past the end of the file read as zeros, which are valid: only
 * those inside the file are read (a table may claim 64 Mi entries), and
 * tables that overlap each other are refused past what the file holds. */
static int check_bitmap_tables(struct ic_image *img, struct ic_error *err)
{
    struct qcow2_state *s = qcow2_state_of(img);
    uint64_t fsize = ic_image_size(s->file), allowed = qcow2_bitmap_entries_allowed(fsize);
    struct window w = {.img = img, .buf = malloc(WINDOW)};
    if (!w.buf)
        return ic_error_nomem(err);
    int ret = 0;
    for (size_t i = 0; i < s->nbitmaps && ret == 0; i++) {
        const struct qcow2_bitmap *b = &s->bitmaps[i];
        if (b->flags & QCOW2_BITMAP_IN_USE)
            continue;
        uint64_t table = b->table_offset;
        uint32_t entries = b->table_size;
        uint64_t live = qcow2_entries_in_file(fsize, table, entries);
        if (live > allowed) {
            ret = ic_error_format(err, img->path, "corrupt qcow2 image: the bitmaps' tables "
                                  "hold more than %llu entries in a file of %llu bytes "
                                  "(tables overlapping?)",
                                  (unsigned long long)qcow2_bitmap_entries_allowed(fsize),
                                  (unsigned long long)fsize);
            break;
        }
        allowed -= live;
        for (uint32_t k = 0; k < live && ret == 0; k++) {
            uint8_t raw[8];
            if (window_read(&w, raw, 8, table + 8ull * k, "unreadable bitmap table", err) < 0)
                ret = -1;
            else if (!qcow2_bitmap_table_entry_ok(qcow2_be64(raw), s->h.cluster_size))
                ret = ic_error_format(err, img->path, "corrupt qcow2 image: entry %u of "
                                      "bitmap '%.64s''s table is invalid", k, b->name);
        }
        /* the rest read as zeros, unless qemu cannot read them at all:
         * from QCOW2_MAX_OFFSET on (tables are cluster aligned: so is the
         * entry where reading fails) */
        if (ret == 0 && (table > QCOW2_MAX_OFFSET || 8ull * entries > QCOW2_MAX_OFFSET - table))
            ret = qcow2_corrupt(img, err, "unreadable bitmap table",
                                table > QCOW2_MAX_OFFSET ? table : QCOW2_MAX_OFFSET);
        /* then qemu loads the bits, from a table of exactly the clusters
         * the disk needs (one too large or too small fails the open) */
        uint64_t needed = qcow2_bitmap_table_needed(img->size, b->granularity_bits,
                                                    s->h.cluster_size);
        if (ret == 0 && entries != needed)
            ret = ic_error_format(err, img->path, "corrupt qcow2 image: bitmap '%.64s''s "
                                  "table has %u entries where a disk of %llu bytes needs %llu "
                                  "(qemu cannot read the bitmap)", b->name, entries,
                                  (unsigned long long)img->size, (unsigned long long)needed);
    }
    free(w.buf);
    return ret;
}

int qcow2_load_bitmaps(struct ic_image *img, struct ic_error *err)
{
    struct qcow2_state *s = qcow2_state_of(img);
    if (!s->h.has_bitmaps)
        return 0;
    uint64_t len = s->h.bitmap_directory_size; /* at most 64 MiB: parse_bitmaps */
    uint32_t nb = s->h.nb_bitmaps;              /* 1 to 65535 */
    if (ic_image_take_meta_budget(img, (uint64_t)nb * sizeof *s->bitmaps + len) < 0)
        return ic_error_format(err, img->path, "the backing chain's bitmap directories need "
                               "more than %u MiB of memory", IC_CHAIN_META_BUDGET >> 20);
    uint8_t *dir = malloc(len ? len : 1);
    s->bitmaps = calloc(nb, sizeof *s->bitmaps);
    s->bitmap_names = malloc(len ? len : 1);
    if (!dir || !s->bitmaps || !s->bitmap_names) {
        free(dir);
        return ic_error_nomem(err); /* what was allocated is freed at close */
    }
    int ret = 0;
    if ((len && qcow2_read_meta(img, dir, len, s->h.bitmap_directory_offset,
                                "unreadable bitmap directory", err) < 0) ||
        qcow2_parse_bitmap_directory(dir, (size_t)len, &s->h, s->bitmaps, s->bitmap_names,
                                     img->path, err) < 0)
        ret = -1;
    free(dir);
    if (ret == 0) {
        s->nbitmaps = nb;
        ret = check_bitmap_tables(img, err);
    }
    return ret;
}

size_t qcow2_bitmaps(struct ic_image *img, struct ic_bitmap *out, size_t cap)
{
    struct qcow2_state *s = qcow2_state_of(img);
    pthread_mutex_lock(&s->meta_lock);
    size_t n = s->w && s->w->bitmaps_dropped ? 0 : s->nbitmaps;
    pthread_mutex_unlock(&s->meta_lock);
    for (size_t i = 0; i < n && i < cap; i++) {
        const struct qcow2_bitmap *b = &s->bitmaps[i];
        out[i] = (struct ic_bitmap){
            .name = b->name,
            .granularity = 1ull << b->granularity_bits,
            .flags = ((b->flags & QCOW2_BITMAP_IN_USE) ? IC_BITMAP_IN_USE : 0) |
                     ((b->flags & QCOW2_BITMAP_AUTO) ? IC_BITMAP_AUTO : 0),
        };
    }
    return n;
}
