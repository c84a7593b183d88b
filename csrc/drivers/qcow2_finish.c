/* qcow2 checkpoints and finishing: the L2 tables held in memory written
 * in an order that keeps the image on disk one a resumed writer can open,
 * whenever a crash comes (checkpoints), then, at finish(), the refcounts
 * that count them and the header saying the image is complete. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "qcow2_state.h"

static struct qcow2_state *state(struct ic_image *img)
{
    return qcow2_state_of(img);
}

/* The L2 tables a checkpoint writes, encoded as they were when it took
 * them (writes go on meanwhile): the first `nfresh` go where the L1 table
 * on disk does not name yet (new tables), the others back where it does. */
struct table_batch {
    uint64_t n, nfresh;
    uint64_t *index, *host;
    uint8_t *buf; /* n clusters, in the order of index[] */
};

static void batch_free(struct table_batch *b)
{
    free(b->index);
    free(b->host);
    free(b->buf);
    *b = (struct table_batch){0};
}

static int pending(uint8_t flags)
{
    return (flags & (L2_CHANGED | L2_UNLINKED)) != 0;
}

/* A checkpoint takes at most this many bytes of tables at a time (a
 * preallocated image's first one holds every table: 512 MiB for 1 TiB of
 * 64 KiB clusters). */
#define BATCH_BYTES (16u << 20)

/* The tables changed since the last checkpoint took them, and those whose
 * L1 entry is not on disk yet, from L1 index `from` on, as many as a
 * batch holds; *next: where the next batch starts (s->l1_len: none).  New
 * ones get a cluster at the end of the file now (in guest order, so that
 * they are contiguous).  meta_lock held. */
static int take_tables(struct ic_image *img, uint64_t from, uint64_t *next,
                       struct table_batch *b, struct ic_error *err)
{
    struct qcow2_state *s = state(img);
    struct l2_store *st = &s->l2;
    uint64_t csz = s->h.cluster_size, n = 0, most = BATCH_BYTES / csz ? BATCH_BYTES / csz : 1, end = from;
    while (end < s->l1_len && n < most)
        n += pending(st->dirty[end++]);
    *next = end;
    if (n == 0)
        return 0;
    b->index = malloc(n * sizeof *b->index);
    b->host = malloc(n * sizeof *b->host);
    b->buf = malloc((size_t)(n * csz));
    if (!b->index || !b->host || !b->buf) {
        batch_free(b);
        return ic_error_nomem(err);
    }
    for (uint64_t i = from; i < end; i++) {
        if (!pending(st->dirty[i]) || (s->l1[i] & QCOW2_OFFSET_MASK))
            continue;
        uint64_t host;
        if (qcow2_alloc_clusters(img, 1, &host, err) < 0) {
            batch_free(b); /* those placed already stay unlinked: next time */
            return -1;
        }
        s->l1[i] = host | QCOW2_OFLAG_COPIED;
        st->dirty[i] |= L2_UNLINKED;
    }
    /* unlinked first, then the others; each in guest order */
    for (int pass = 0; pass < 2; pass++) {
        for (uint64_t i = from; i < end; i++) {
            int unlinked = (st->dirty[i] & L2_UNLINKED) != 0;
            if (!pending(st->dirty[i]) || unlinked != (pass == 0))
                continue;
            uint8_t *be = b->buf + b->n * csz;
            for (uint64_t k = 0; k < s->l2_entries; k++)
                qcow2_put_be64(be + k * 8, st->tables[i][k]);
            b->index[b->n] = i;
            b->host[b->n] = s->l1[i] & QCOW2_OFFSET_MASK;
            b->n++;
            st->dirty[i] &= (uint8_t)~L2_CHANGED;
        }
        if (pass == 0)
            b->nfresh = b->n;
    }
    return 0;
}

/* Tables [from, to) of the batch, runs of contiguous clusters in one
 * write each. */
static int write_batch(struct ic_image *img, const struct table_batch *b, uint64_t from,
                       uint64_t to, struct ic_error *err)
{
    struct qcow2_state *s = state(img);
    uint64_t csz = s->h.cluster_size;
    for (uint64_t k = from; k < to;) {
        uint64_t end = k + 1;
        while (end < to && b->host[end] == b->host[end - 1] + csz && end - k < 1024)
            end++;
        if (ic_image_pwrite(s->file, b->buf + k * csz, (size_t)((end - k) * csz), b->host[k],
                            err) < 0)
            return -1;
        k = end;
    }
    return 0;
}

/* The L1 entries of the batch's new tables: the 512-byte sectors holding
 * them, whole (an entry never straddles two, so a torn write leaves each
 * entry old or new).  The other entries of those sectors are as on disk
 * already.  Only checkpoints and finish() change the L1 table, and they
 * hold checkpoint_lock: it is read without meta_lock. */
static int write_l1_entries(struct ic_image *img, const struct table_batch *b,
                            struct ic_error *err)
{
    struct qcow2_state *s = state(img);
    const uint64_t per = 512 / 8;
    uint8_t *buf = NULL;
    size_t cap = 0;
    int ret = 0;
    for (uint64_t k = 0; k < b->nfresh && ret == 0;) {
        uint64_t first = b->index[k] / per, last = first;
        while (k < b->nfresh && b->index[k] / per <= last + 1)
            last = b->index[k++] / per;
        size_t len = (size_t)((last - first + 1) * 512);
        if (len > cap) {
            uint8_t *grown = realloc(buf, len);
            if (!grown) {
                ret = ic_error_nomem(err);
                break;
            }
            buf = grown;
            cap = len;
        }
        for (uint64_t j = 0; j < len / 8; j++)
            qcow2_put_be64(buf + j * 8, qcow2_l1_entry(s, first * per + j));
        ret = ic_image_pwrite(s->file, buf, len, s->h.l1_table_offset + first * 512, err);
    }
    free(buf);
    return ret;
}

/* The tables of one batch, written so that the image on disk is one a
 * resumed writer can open at every moment (with `sync`; without, in the
 * same order, the file deciding when each write is durable):
 *   1. new tables, into clusters nothing on disk references;
 *   2. flush: the data of every write completed before the tables were
 *      taken, the new tables, and the file's size (every cluster their
 *      entries name lies inside it);
 *   3. the tables the L1 table names already, back in place (each entry
 *      old or new: both name clusters inside the file, the old one's bytes
 *      intact: nothing freed is reused before finish()), and the L1
 *      entries of the new tables (each 0 or naming a table on disk);
 *   4. flush.
 * `data`: flush at 2. even without tables (the first batch: the data of
 * the writes completed before the checkpoint).  `locked`: the caller
 * holds meta_lock throughout (finish); else it is taken to take the
 * tables only, and writes go on meanwhile.  checkpoint_lock held. */
static int write_batch_of_tables(struct ic_image *img, uint64_t from, uint64_t *next, int sync,
                                 int data, int locked, struct ic_error *err)
{
    struct qcow2_state *s = state(img);
    struct table_batch b = {0};
    if (!locked)
        pthread_mutex_lock(&s->meta_lock);
    int ret = take_tables(img, from, next, &b, err);
    if (!locked)
        pthread_mutex_unlock(&s->meta_lock);
    if (ret == 0)
        ret = write_batch(img, &b, 0, b.nfresh, err);
    if (ret == 0 && sync && (b.n || data))
        ret = ic_image_flush(s->file, err);
    if (ret == 0)
        ret = write_batch(img, &b, b.nfresh, b.n, err);
    if (ret == 0)
        ret = write_l1_entries(img, &b, err);
    if (ret == 0 && sync && b.n)
        ret = ic_image_flush(s->file, err);
    if (!locked)
        pthread_mutex_lock(&s->meta_lock);
    for (uint64_t k = 0; k < b.n; k++) {
        uint8_t *flags = &s->l2.dirty[b.index[k]];
        if (ret < 0)
            *flags |= L2_CHANGED; /* the next checkpoint writes it again */
        else if (k < b.nfresh)
            *flags &= (uint8_t)~L2_UNLINKED;
    }
    if (!locked)
        pthread_mutex_unlock(&s->meta_lock);
    batch_free(&b);
    return ret;
}

/* Every table a checkpoint takes, batch after batch (each one leaving the
 * image on disk consistent). */
static int write_tables(struct ic_image *img, int sync, int locked, struct ic_error *err)
{
    struct qcow2_state *s = state(img);
    uint64_t from = 0;
    int ret;
    do
        ret = write_batch_of_tables(img, from, &from, sync, from == 0, locked, err);
    while (ret == 0 && from < s->l1_len);
    return ret;
}

int qcow2_checkpoint(struct ic_image *img, struct ic_error *err)
{
    struct qcow2_state *s = state(img);
    if (!s->w)
        return 0;
    pthread_mutex_lock(&s->checkpoint_lock);
    int ret = write_tables(img, 1, 0, err);
    pthread_mutex_unlock(&s->checkpoint_lock);
    return ret;
}

/* The tables (as a checkpoint writes them), the bitmaps' tables and
 * directory (qcow2_bitmaps_write.c), then the refcounts, which count them
 * (in clusters nothing on disk references any more), then the header
 * saying the image is complete (and naming the bitmaps).  A crash at any
 * step leaves an image a resumed writer opens (with `sync`). */
int qcow2_finish(struct ic_image *img, int sync, struct ic_error *err)
{
    struct qcow2_state *s = state(img);
    struct qcow2_writer *w = s->w;
    if (!w)
        return 0;
    pthread_mutex_lock(&s->checkpoint_lock);
    pthread_mutex_lock(&s->meta_lock);
    int ret = 0;
    if (!w->marked)
        goto out; /* nothing written since it was last complete */
    ret = write_tables(img, sync, 1, err);
    if (ret == 0)
        ret = qcow2_store_bitmaps(img, err);
    if (ret == 0)
        ret = qcow2_write_refcounts(img, err);
    if (ret == 0)
        ret = ic_image_truncate(s->file, w->host_end, err);
    if (ret == 0)
        w->file_size = w->host_end; /* what is appended later grows it again */
    /* the metadata is durable before the header says it is complete */
    if (ret == 0 && sync)
        ret = ic_image_flush(s->file, err);
    if (ret == 0)
        ret = qcow2_write_header(img, 1, err);
    if (ret == 0 && sync)
        ret = ic_image_flush(s->file, err);
    if (ret == 0) {
        qcow2_l2_written(s);
        w->marked = 0;
    }
out:
    pthread_mutex_unlock(&s->meta_lock);
    pthread_mutex_unlock(&s->checkpoint_lock);
    return ret;
}
