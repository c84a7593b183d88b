/* A persistent bitmap's bits (qcow2.txt, "Bitmaps"), read as a dirty map.
 *
 * Bit k of a bitmap covers guest bytes [k << granularity_bits, (k + 1) <<
 * granularity_bits); bits are stored in clusters, each holding
 * cluster_size * 8 of them, bit k at bit (k % 8) of byte k / 8 (qemu's
 * hbitmap serialization: little-endian 64-bit words).  The bitmap table
 * names each cluster: a host offset, or 0 with bit 0 saying whether all
 * of that cluster's bits are set (a cluster of ones) or none.  Bits past
 * the disk's end mean nothing.
 *
 * Read lazily: a query reads the table entries its range needs (a window
 * of them at a time) and only the clusters of bits those entries name,
 * so a 1 TiB disk whose bitmap has a few clusters maps in a few reads.
 * Every entry is checked again as it is used (open checked those inside
 * the file; the rest read as zeros), and clusters past the end of the
 * file read as zeros, as qemu reads them. */
#include <stdlib.h>
#include <string.h>

#include "qcow2_state.h"

/* Entries of a bitmap table read at once: 4 KiB. */
#define TABLE_WINDOW 512u
/* A call stops, once it has an answer, before reading more clusters of
 * bits than this (the caller asks again from where it ended). */
#define STATUS_BYTES (1u << 20)
/* nor does it append more extents than this (a bitmap of alternating
 * bits holds millions of them in a cluster) */
#define STATUS_EXTENTS 1024u

struct qcow2_dirty_cache {
    const struct qcow2_bitmap *table_of; /* whose entries `entries` holds, or NULL */
    uint64_t first, count;               /* which: [first, first + count) */
    uint64_t entries[TABLE_WINDOW];      /* host byte order */
    uint64_t bits_at;                    /* the host offset `bits` holds; 0: none */
    uint8_t *bits;                       /* one cluster */
};

void qcow2_dirty_free(struct qcow2_state *s)
{
    if (s->dirty) {
        free(s->dirty->bits);
        free(s->dirty);
        s->dirty = NULL;
    }
}

/* The bitmap a dirty map may read, or NULL: none of that name (or none at
 * all, once the image has been written: its bitmaps are disowned). */
static const struct qcow2_bitmap *find_bitmap(struct qcow2_state *s, const char *name)
{
    pthread_mutex_lock(&s->meta_lock);
    int dropped = s->w && s->w->bitmaps_dropped;
    pthread_mutex_unlock(&s->meta_lock);
    for (size_t i = 0; !dropped && i < s->nbitmaps; i++)
        if (strcmp(s->bitmaps[i].name, name) == 0)
            return &s->bitmaps[i];
    return NULL;
}

/* Entry `idx` of bitmap b's table, checked as qemu checks it. */
static int table_entry(struct ic_image *img, struct qcow2_dirty_cache *c,
                       const struct qcow2_bitmap *b, uint64_t idx, uint64_t *out,
                       struct ic_error *err)
{
    struct qcow2_state *s = qcow2_state_of(img);
    if (idx >= b->table_size)
        return ic_error_format(err, img->path, "corrupt qcow2 image: bitmap '%.64s''s table "
                               "ends before the disk does", b->name);
    if (c->table_of != b || idx < c->first || idx - c->first >= c->count) {
        uint64_t first = idx / TABLE_WINDOW * TABLE_WINDOW;
        uint64_t n = b->table_size - first < TABLE_WINDOW ? b->table_size - first : TABLE_WINDOW;
        c->table_of = NULL;
        /* open made sure the table lies below QCOW2_MAX_OFFSET; reads past
         * the end of the file are zeros */
        if (first * 8 > QCOW2_MAX_OFFSET - b->table_offset)
            return qcow2_corrupt(img, err, "unreadable bitmap table", b->table_offset);
        if (qcow2_read_meta(img, c->entries, n * 8, b->table_offset + first * 8,
                            "unreadable bitmap table", err) < 0)
            return -1;
        for (uint64_t k = 0; k < n; k++)
            c->entries[k] = qcow2_be64(&c->entries[k]);
        c->table_of = b;
        c->first = first;
        c->count = n;
    }
    *out = c->entries[idx - c->first];
    if (!qcow2_bitmap_table_entry_ok(*out, s->h.cluster_size))
        return ic_error_format(err, img->path, "corrupt qcow2 image: entry %llu of bitmap "
                               "'%.64s''s table is invalid", (unsigned long long)idx, b->name);
    return 0;
}

/* The cluster of bits at host offset `off` into c->bits: 1 when it was
 * read, 0 when it was there already. */
static int load_bits(struct ic_image *img, struct qcow2_dirty_cache *c, uint64_t off,
                     struct ic_error *err)
{
    if (c->bits_at == off)
        return 0;
    c->bits_at = 0;
    if (qcow2_read_meta(img, c->bits, qcow2_state_of(img)->h.cluster_size, off,
                        "unreadable bitmap cluster", err) < 0)
        return -1;
    c->bits_at = off;
    return 1;
}

static int bit_at(const uint8_t *bits, uint64_t i)
{
    return (bits[i / 8] >> (i % 8)) & 1;
}

/* The 64 bits of the word holding bit i, bit i % 64 of the value being
 * bit i (bytes in order, low bit first, whatever the host's byte order). */
static uint64_t word_of(const uint8_t *bits, uint64_t i)
{
    const uint8_t *p = bits + i / 64 * 8;
    uint64_t w = 0;
    for (int k = 7; k >= 0; k--)
        w = w << 8 | p[k];
    return w;
}

/* The first bit in [from, to) that is `want`, else `to`: a word at a time
 * (a cluster of 2 MiB holds 16 Mi bits). */
static uint64_t find_bit(const uint8_t *bits, uint64_t from, uint64_t to, int want)
{
    uint64_t flip = want ? 0 : ~0ull;
    while (from < to) {
        uint64_t w = (word_of(bits, from) ^ flip) >> (from % 64);
        if (w) {
            uint64_t at = from + (uint64_t)__builtin_ctzll(w);
            return at < to ? at : to;
        }
        from = (from / 64 + 1) * 64;
    }
    return to;
}

static int push(struct ic_extent_list *out, size_t first, uint64_t start, uint64_t end,
                int dirty, struct ic_error *err)
{
    struct ic_extent e = {.start = start, .length = end - start,
                          .flags = dirty ? IC_EXT_DIRTY : 0};
    return ic_extent_list_join(out, first, &e, err);
}

/* [start, end) from the table entries it needs and the clusters of bits
 * they name, until the range is covered or the call has read enough. */
static int walk(struct ic_image *img, struct qcow2_dirty_cache *c, const struct qcow2_bitmap *b,
                uint64_t start, uint64_t end, struct ic_extent_list *out, struct ic_error *err)
{
    struct qcow2_state *s = qcow2_state_of(img);
    uint64_t fsize = ic_image_size(s->file);
    unsigned g = b->granularity_bits;
    /* guest bytes one cluster of bits covers: at most 2^24 bits of 2^31 bytes */
    uint64_t cover = (s->h.cluster_size * 8) << g;
    uint64_t pos = start, read = 0;
    size_t first = out->count;
    while (pos < end) {
        uint64_t idx = pos / cover, base = idx * cover, entry = 0;
        uint64_t chunk_end = end - base < cover ? end : base + cover;
        if (table_entry(img, c, b, idx, &entry, err) < 0)
            return -1;
        uint64_t off = entry & QCOW2_BITMAP_OFFSET_MASK;
        if (off == 0 || off >= fsize) {
            /* no cluster (all ones or all zeros), or one past the end of
             * the file (zeros): nothing to read */
            if (push(out, first, pos, chunk_end, off == 0 && (entry & QCOW2_BITMAP_ALL_ONES),
                     err) < 0)
                return -1;
            pos = chunk_end;
            continue;
        }
        if (read >= STATUS_BYTES)
            break; /* enough for one call: the range so far is the answer */
        int got = load_bits(img, c, off, err);
        if (got < 0)
            return -1;
        read += got ? s->h.cluster_size : 0;
        /* bits [0, last) of the cluster cover [base, chunk_end) */
        uint64_t last = ((chunk_end - 1 - base) >> g) + 1;
        while (pos < chunk_end) {
            uint64_t bit = (pos - base) >> g;
            int v = bit_at(c->bits, bit);
            uint64_t next = find_bit(c->bits, bit + 1, last, !v);
            uint64_t run_end = base + (next << g) < chunk_end ? base + (next << g) : chunk_end;
            if (push(out, first, pos, run_end, v, err) < 0)
                return -1;
            pos = run_end;
            if (out->count - first >= STATUS_EXTENTS)
                return 0;
        }
    }
    return 0;
}

int qcow2_dirty_status(struct ic_image *img, const char *name, uint64_t start, uint64_t end,
                       struct ic_extent_list *out, struct ic_error *err)
{
    struct qcow2_state *s = qcow2_state_of(img);
    const struct qcow2_bitmap *b = find_bitmap(s, name);
    if (!b)
        return ic_error_value(err, "%s: Bitmap '%.64s' is not found", img->path, name);
    if (b->flags & QCOW2_BITMAP_IN_USE) /* its table was never checked: unusable */
        return ic_error_format(err, img->path, "Bitmap '%.64s' is inconsistent and cannot "
                               "be used", name);
    if (end > img->size)
        end = img->size;
    pthread_mutex_lock(&s->dirty_lock);
    struct qcow2_dirty_cache *c = s->dirty;
    if (!c && (c = calloc(1, sizeof *c)) && !(c->bits = malloc(s->h.cluster_size))) {
        free(c);
        c = NULL;
    }
    s->dirty = c;
    size_t first = out->count;
    int ret = c ? walk(img, c, b, start, end, out, err) : ic_error_nomem(err);
    if (ret < 0)
        out->count = first;
    pthread_mutex_unlock(&s->dirty_lock);
    return ret;
}
