/* Persistent bitmaps a qcow2 writer stores (qcow2.txt: "Bitmaps"), as
 * qemu-img convert --bitmaps stores the source's: a bitmap's bits are
 * written when it is added, one cluster of bits at a time from its dirty
 * ranges (a cluster without a bit set is no cluster: its table entry is 0,
 * as qemu writes it; a cluster of ones is written as such, as qemu does,
 * never as the all-ones entry), so that a bitmap of a 1 TiB disk costs its
 * table in memory, not its bits.  finish() then writes each bitmap's table
 * and the directory, before the refcounts (which count them), and the
 * complete header names the directory in the bitmaps extension with
 * auto-clear bit 0 set.
 *
 * Until that header is written nothing on disk references these clusters:
 * a crash leaves clusters a resumed writer treats as free (or cuts off),
 * and the resumed copy adds its bitmaps again.  A write of the guest's
 * data after the finish() that stored them drops them (imgcopy keeps no
 * bitmap up to date); writes between adding them and finish() do not
 * change them: they hold the bits they were given, as qemu-img convert's
 * bitmaps hold the source's, added after the copy.
 *
 * Everything a caller gives is checked against qemu's limits (a name of
 * 1 to 1023 bytes, unique; at most 65535 bitmaps and a 64 MiB directory;
 * granularity 2^9 to 2^31; a table of at most 512 MiB of bits) and the
 * ranges against the disk: what qemu would refuse to open is never
 * written. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "qcow2_state.h"

struct qcow2_new_bitmap {
    char *name;
    unsigned granularity_bits;
    uint32_t flags;      /* QCOW2_BITMAP_AUTO or 0 */
    uint32_t table_size; /* entries: qcow2_bitmap_table_needed() */
    uint64_t *table;     /* host offsets of its clusters of bits; 0: none */
    uint64_t table_off;  /* where the last finish() wrote the table (0: nowhere) */
};

static uint64_t clusters_of(uint64_t bytes, uint64_t csz)
{
    return (bytes + csz - 1) / csz;
}

/* A directory entry's bytes: fixed part, name, padding to 8. */
static uint64_t entry_bytes(size_t name_len)
{
    return (QCOW2_BITMAP_ENTRY_FIXED + name_len + 7) / 8 * 8;
}

static void bitmap_free(struct qcow2_new_bitmap *b)
{
    if (b) {
        free(b->name);
        free(b->table);
        free(b);
    }
}

/* The clusters of b's bits given back (meta_lock held). */
static void release_bits(struct qcow2_state *s, const struct qcow2_new_bitmap *b)
{
    for (uint32_t k = 0; k < b->table_size; k++)
        if (b->table[k])
            qcow2_release_cluster(s, b->table[k]);
}

static void release_run(struct qcow2_state *s, uint64_t off, uint64_t n)
{
    for (uint64_t k = 0; k < n; k++)
        qcow2_release_cluster(s, off + k * s->h.cluster_size);
}

/* The tables and the directory the last finish() wrote given back
 * (meta_lock held). */
static void release_tables(struct qcow2_state *s)
{
    struct qcow2_writer *w = s->w;
    uint64_t csz = s->h.cluster_size;
    for (size_t i = 0; i < w->nnew_bitmaps; i++) {
        struct qcow2_new_bitmap *b = w->new_bitmaps[i];
        if (b->table_off)
            release_run(s, b->table_off, clusters_of((uint64_t)b->table_size * 8, csz));
        b->table_off = 0;
    }
    if (w->bitmap_dir_off)
        release_run(s, w->bitmap_dir_off, w->bitmap_dir_clusters);
    w->bitmap_dir_off = w->bitmap_dir_clusters = 0;
    w->bitmaps_stored = 0;
}

void qcow2_drop_bitmaps(struct qcow2_state *s)
{
    struct qcow2_writer *w = s->w;
    release_tables(s);
    for (size_t i = 0; i < w->nnew_bitmaps; i++)
        release_bits(s, w->new_bitmaps[i]);
    qcow2_new_bitmaps_free(w);
}

void qcow2_new_bitmaps_free(struct qcow2_writer *w)
{
    for (size_t i = 0; i < w->nnew_bitmaps; i++)
        bitmap_free(w->new_bitmaps[i]);
    free(w->new_bitmaps);
    w->new_bitmaps = NULL;
    w->nnew_bitmaps = 0;
    w->bitmap_dir_bytes = 0;
    w->bitmaps_stored = 0;
}

/* ---- adding one --------------------------------------------------------- */

/* What qemu refuses of a new persistent bitmap (qcow2_co_can_store_new_dirty_bitmap
 * and the constraints of a directory entry qemu opens), in its words. */
static int refuse(struct ic_image *img, const char *name, unsigned gbits, uint64_t *table_size,
                  struct ic_error *err)
{
    struct qcow2_state *s = qcow2_state_of(img);
    struct qcow2_writer *w = s->w;
    uint64_t csz = s->h.cluster_size;
    size_t nlen = strnlen(name, QCOW2_BITMAP_MAX_NAME + 1);
    if (s->h.version < 3)
        return ic_error_value(err, "%s: Cannot store dirty bitmaps in qcow2 v2 files "
                              "(compat=0.10): a bitmap needs compat=1.1", img->path);
    if (w->existing && !w->resumed)
        return ic_error_os(err, ENOTSUP, img->path, "storing persistent bitmaps into an "
                           "existing qcow2 image is not supported (imgcopy stores them in "
                           "images it creates)");
    if (nlen == 0)
        return ic_error_value(err, "%s: a bitmap needs a name", img->path);
    if (nlen > QCOW2_BITMAP_MAX_NAME)
        return ic_error_value(err, "%s: Name length exceeds maximum (%u characters): "
                              "'%.64s...'", img->path, QCOW2_BITMAP_MAX_NAME, name);
    if (gbits < QCOW2_BITMAP_MIN_GRANULARITY)
        return ic_error_value(err, "%s: bitmap '%.64s': Granularity is under minimum "
                              "(%u bytes)", img->path, name, 1u << QCOW2_BITMAP_MIN_GRANULARITY);
    if (gbits > QCOW2_BITMAP_MAX_GRANULARITY)
        return ic_error_value(err, "%s: bitmap '%.64s': Granularity exceeds maximum "
                              "(%llu bytes)", img->path, name,
                              1ull << QCOW2_BITMAP_MAX_GRANULARITY);
    for (size_t i = 0; i < w->nnew_bitmaps; i++)
        if (strcmp(w->new_bitmaps[i]->name, name) == 0)
            return ic_error_value(err, "%s: Bitmap already exists: %.64s", img->path, name);
    if (w->nnew_bitmaps >= QCOW2_MAX_BITMAPS)
        return ic_error_value(err, "%s: Maximum number of persistent bitmaps is already "
                              "reached (%u)", img->path, QCOW2_MAX_BITMAPS);
    if (w->bitmap_dir_bytes + entry_bytes(nlen) > QCOW2_MAX_BITMAP_DIRECTORY)
        return ic_error_value(err, "%s: Not enough space in the bitmap directory for "
                              "'%.64s'", img->path, name);
    /* qemu stores no bitmap of an empty disk (its table would be empty) */
    *table_size = qcow2_bitmap_table_needed(img->size, gbits, csz);
    if (*table_size == 0)
        return ic_error_value(err, "%s: a disk of 0 bytes cannot store persistent bitmaps",
                              img->path);
    if (*table_size > QCOW2_BITMAP_MAX_TABLE_SIZE ||
        *table_size * csz > QCOW2_BITMAP_MAX_PHYS_SIZE)
        return ic_error_value(err, "%s: bitmap '%.64s': Too much space will be occupied by "
                              "the bitmap. Use larger granularity", img->path, name);
    /* the header cluster must hold the bitmaps extension too */
    struct qcow2_header q = s->h;
    uint8_t h[QCOW2_HEADER_MAX];
    size_t len;
    q.has_bitmaps = 1;
    qcow2_encode_header(&q, 1, h, &len);
    if (len > csz)
        return ic_error_value(err, "%s: no room for the bitmaps extension in the header "
                              "cluster (%llu bytes) beside the backing file name", img->path,
                              (unsigned long long)csz);
    return 0;
}

/* Bits [from, to) of a cluster of bits set: bit k is bit k % 8 of byte
 * k / 8 (qcow2.txt: "Bitmap data"). */
static void set_bits(uint8_t *bits, uint64_t from, uint64_t to)
{
    for (; from < to && from % 8; from++)
        bits[from / 8] |= (uint8_t)(1u << (from % 8));
    if (to - from >= 8) {
        memset(bits + from / 8, 0xff, (size_t)((to - from) / 8));
        from += (to - from) / 8 * 8;
    }
    for (; from < to; from++)
        bits[from / 8] |= (uint8_t)(1u << (from % 8));
}

/* The bits of one bitmap as they come, a cluster at a time. */
struct builder {
    struct ic_image *img;
    struct qcow2_new_bitmap *b;
    uint8_t *bits;   /* one cluster */
    uint64_t index;  /* the cluster `bits` holds (its table index); UINT64_MAX: none */
};

/* The cluster `bits` holds, written into a cluster of its own. */
static int put_cluster(struct builder *bd, struct ic_error *err)
{
    struct qcow2_state *s = qcow2_state_of(bd->img);
    uint64_t csz = s->h.cluster_size, host;
    if (bd->index == UINT64_MAX)
        return 0;
    if (bd->index >= bd->b->table_size) /* cannot be: the ranges are inside the disk */
        return ic_error_value(err, "%s: bitmap '%.64s': bits past its table", bd->img->path,
                              bd->b->name);
    pthread_mutex_lock(&s->meta_lock);
    int ret = qcow2_alloc_clusters(bd->img, 1, &host, err);
    if (ret == 0)
        bd->b->table[bd->index] = host; /* released with the others on failure */
    pthread_mutex_unlock(&s->meta_lock);
    if (ret == 0)
        ret = ic_image_pwrite(s->file, bd->bits, (size_t)csz, host, err);
    bd->index = UINT64_MAX;
    return ret;
}

/* The dirty ranges from `next`, in order, inside the disk, into clusters. */
static int build(struct builder *bd, ic_dirty_next_fn *next, void *ctx, struct ic_error *err)
{
    struct ic_image *img = bd->img;
    uint64_t csz = qcow2_state_of(img)->h.cluster_size, per = csz * 8;
    unsigned g = bd->b->granularity_bits;
    uint64_t done = 0; /* where the last range ended */
    int first = 1;
    for (;;) {
        struct ic_range r;
        int got = next(ctx, &r, err);
        if (got < 0)
            return -1;
        if (got == 0)
            break;
        if (r.length == 0)
            continue;
        if ((!first && r.offset < done) || r.offset > img->size ||
            r.length > img->size - r.offset)
            return ic_error_value(err, "%s: bitmap '%.64s': dirty range %llu+%llu is not "
                                  "after the one before (ending at %llu) inside the disk "
                                  "(%llu bytes)", img->path, bd->b->name,
                                  (unsigned long long)r.offset, (unsigned long long)r.length,
                                  (unsigned long long)done, (unsigned long long)img->size);
        first = 0;
        done = r.offset + r.length;
        /* every granule the range touches */
        uint64_t bit = r.offset >> g, end = ((done - 1) >> g) + 1;
        while (bit < end) {
            uint64_t index = bit / per;
            if (index != bd->index) {
                if (put_cluster(bd, err) < 0)
                    return -1;
                memset(bd->bits, 0, (size_t)csz);
                bd->index = index;
            }
            uint64_t stop = end < (index + 1) * per ? end : (index + 1) * per;
            set_bits(bd->bits, bit - index * per, stop - index * per);
            bit = stop;
        }
    }
    return put_cluster(bd, err);
}

int qcow2_add_bitmap(struct ic_image *img, const char *name, unsigned granularity_bits,
                     unsigned flags, ic_dirty_next_fn *next, void *ctx, struct ic_error *err)
{
    struct qcow2_state *s = qcow2_state_of(img);
    struct qcow2_writer *w = s->w;
    uint64_t table_size = 0;
    if (!w)
        return ic_error_readonly(err, img->path);
    pthread_mutex_lock(&s->meta_lock);
    int ret = refuse(img, name, granularity_bits, &table_size, err);
    pthread_mutex_unlock(&s->meta_lock);
    if (ret < 0)
        return -1;
    struct qcow2_new_bitmap *b = calloc(1, sizeof *b);
    struct builder bd = {.img = img, .b = b, .index = UINT64_MAX};
    struct qcow2_new_bitmap **grown = NULL;
    if (!b || !(b->name = strdup(name)) || !(b->table = calloc(table_size, sizeof *b->table)) ||
        !(bd.bits = malloc(s->h.cluster_size))) {
        bitmap_free(b);
        return ic_error_nomem(err);
    }
    b->granularity_bits = granularity_bits;
    b->flags = (flags & IC_BITMAP_AUTO) ? QCOW2_BITMAP_AUTO : 0;
    b->table_size = (uint32_t)table_size;
    /* the image is incomplete from now on, until finish() */
    pthread_mutex_lock(&s->meta_lock);
    ret = qcow2_mark_written_locked(img, err) < 0 ? -1 : 0;
    pthread_mutex_unlock(&s->meta_lock);
    if (ret == 0)
        ret = build(&bd, next, ctx, err);
    free(bd.bits);
    pthread_mutex_lock(&s->meta_lock);
    if (ret == 0) {
        grown = realloc(w->new_bitmaps, (w->nnew_bitmaps + 1) * sizeof *grown);
        ret = grown ? 0 : ic_error_nomem(err);
    }
    if (ret == 0) {
        w->new_bitmaps = grown;
        w->new_bitmaps[w->nnew_bitmaps++] = b;
        w->bitmap_dir_bytes += entry_bytes(strlen(name));
    } else {
        release_bits(s, b);
        bitmap_free(b);
    }
    pthread_mutex_unlock(&s->meta_lock);
    return ret;
}

/* ---- storing them at finish() ------------------------------------------- */

/* `n` new clusters at the end of the file, `len` bytes of `buf` written
 * into them (the rest zeros). */
static int write_clusters(struct ic_image *img, const uint8_t *buf, uint64_t len, uint64_t n,
                          uint64_t *off, struct ic_error *err)
{
    struct qcow2_state *s = qcow2_state_of(img);
    if (qcow2_alloc_clusters(img, n, off, err) < 0)
        return -1;
    return ic_image_pwrite(s->file, buf, (size_t)len, *off, err);
}

static int store_table(struct ic_image *img, struct qcow2_new_bitmap *b, struct ic_error *err)
{
    uint64_t csz = qcow2_state_of(img)->h.cluster_size;
    uint64_t bytes = (uint64_t)b->table_size * 8, n = clusters_of(bytes, csz);
    uint8_t *buf = calloc(n, csz);
    if (!buf)
        return ic_error_nomem(err);
    for (uint32_t k = 0; k < b->table_size; k++)
        qcow2_put_be64(buf + (uint64_t)k * 8, b->table[k]);
    /* whole clusters: the last one's tail is zeros on disk too */
    int ret = write_clusters(img, buf, n * csz, n, &b->table_off, err);
    free(buf);
    return ret;
}

static int store_directory(struct ic_image *img, struct ic_error *err)
{
    struct qcow2_state *s = qcow2_state_of(img);
    struct qcow2_writer *w = s->w;
    uint64_t csz = s->h.cluster_size, n = clusters_of(w->bitmap_dir_bytes, csz);
    uint8_t *buf = calloc(n, csz), *e = buf;
    if (!buf)
        return ic_error_nomem(err);
    for (size_t i = 0; i < w->nnew_bitmaps; i++) {
        const struct qcow2_new_bitmap *b = w->new_bitmaps[i];
        size_t nlen = strlen(b->name);
        qcow2_put_be64(e, b->table_off);
        qcow2_put_be32(e + 8, b->table_size);
        qcow2_put_be32(e + 12, b->flags);
        e[16] = QCOW2_BITMAP_TYPE_DIRTY;
        e[17] = (uint8_t)b->granularity_bits;
        e[18] = (uint8_t)(nlen >> 8);
        e[19] = (uint8_t)nlen;
        /* no extra data (bytes 20-23); the name, then zeros to 8 */
        memcpy(e + QCOW2_BITMAP_ENTRY_FIXED, b->name, nlen);
        e += entry_bytes(nlen);
    }
    w->bitmap_dir_clusters = n;
    int ret = write_clusters(img, buf, n * csz, n, &w->bitmap_dir_off, err);
    free(buf);
    return ret;
}

int qcow2_store_bitmaps(struct ic_image *img, struct ic_error *err)
{
    struct qcow2_state *s = qcow2_state_of(img);
    struct qcow2_writer *w = s->w;
    release_tables(s);
    if (w->nnew_bitmaps == 0)
        return 0;
    for (size_t i = 0; i < w->nnew_bitmaps; i++)
        if (store_table(img, w->new_bitmaps[i], err) < 0)
            return -1; /* what was allocated is released by the next try */
    if (store_directory(img, err) < 0)
        return -1;
    w->bitmaps_stored = 1;
    return 0;
}
