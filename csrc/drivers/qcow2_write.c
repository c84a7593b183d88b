/* qcow2 writes: stage (compress, in the worker threads), place (allocate
 * host clusters and fill L2 entries, in the order the copy engine calls
 * it: guest order), commit (write the data; a compressed cluster's entry
 * is filled then, after its bytes).  Host space is appended, so
 * a sequential copy lays data clusters out in guest order.  The tables
 * are written by checkpoints and by finish() (qcow2_finish.c), after the
 * data, which then writes the refcounts: a copy that fails
 * leaves a header marked dirty and corrupt (v3) or without its magic
 * (v2), never an image that looks complete. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "qcow2_state.h"

/* One guest cluster of a compressed write. */
struct blob {
    const uint8_t *data;
    size_t len;
    int raw; /* did not shrink: stored as a normal cluster */
    uint64_t host;
    /* the L2 entry place() made for it (0: not placed), which commit()
     * puts in its table once the bytes are written (`linked`): a
     * checkpoint never makes an entry durable before the compressed
     * bytes it names, which a resumed writer may have to inflate */
    uint64_t entry;
    int linked;
};

struct staged {
    size_t n;
    uint8_t *arena; /* compressed bytes */
    struct blob b[];
};

static struct qcow2_state *state(struct ic_image *img)
{
    return qcow2_state_of(img);
}

static int write_zeroes(struct ic_image *img, uint64_t off, uint64_t len, struct ic_error *err);

/* ---- host clusters for guest clusters (meta_lock held) ----------------- */

/* Inflate the compressed cluster `entry` into host cluster `host`. */
static int copy_compressed(struct ic_image *img, uint64_t entry, uint64_t host,
                          struct ic_error *err)
{
    struct qcow2_state *s = state(img);
    uint8_t *buf = malloc(s->h.cluster_size);
    if (!buf)
        return ic_error_nomem(err);
    int ret = qcow2_inflate_cluster(img, entry, buf, err);
    if (ret == 0)
        ret = ic_image_pwrite(s->file, buf, s->h.cluster_size, host, err);
    free(buf);
    return ret;
}

/* The backing's data of guest cluster gc, into host cluster `host`. */
static int copy_from_backing(struct ic_image *img, uint64_t gc, uint64_t host,
                            struct ic_error *err)
{
    struct qcow2_state *s = state(img);
    uint64_t csz = s->h.cluster_size, off = gc * csz;
    uint64_t n = s->h.size - off < csz ? s->h.size - off : csz;
    uint8_t *buf = malloc(csz);
    if (!buf)
        return ic_error_nomem(err);
    int ret = ic_image_read_below(img, buf, (size_t)n, off, err);
    if (ret == 0)
        ret = ic_image_pwrite(s->file, buf, n, host, err);
    free(buf);
    return ret;
}

/* The clusters under [off, end) get host clusters of their own, which
 * the write may fill: new ones are appended (and zero-filled before data
 * goes in), a zero or compressed one is replaced by a new one. */
int qcow2_ensure_clusters(struct ic_image *img, uint64_t off, uint64_t end, struct ic_error *err)
{
    struct qcow2_state *s = state(img);
    uint64_t csz = s->h.cluster_size;
    for (uint64_t gc = off / csz; gc <= (end - 1) / csz; gc++) {
        uint64_t *l2 = qcow2_l2_for_update(img, gc, err);
        if (!l2)
            return -1;
        uint64_t *e = &l2[gc % s->l2_entries];
        uint64_t host = *e & QCOW2_OFFSET_MASK;
        uint64_t old_entry = *e;
        int whole = off <= gc * csz && (end >= (gc + 1) * csz || end >= ic_image_size(img));
        if (*e & QCOW2_OFLAG_COMPRESSED) {
            qcow2_release_compressed(s, *e);
        } else if (host && !(*e & QCOW2_OFLAG_ZERO)) {
            if (!(*e & QCOW2_OFLAG_COPIED))
                return ic_error_format(err, img->path, "cluster 0x%llx is shared (internal "
                                       "snapshot?): copy-on-write is not supported",
                                       (unsigned long long)host);
            continue;
        } else if (host) {
            qcow2_release_cluster(s, host); /* a zero cluster's old space: stale data */
        }
        uint64_t fresh;
        if (qcow2_alloc_clusters(img, 1, &fresh, err) < 0)
            return -1;
        *e = fresh | QCOW2_OFLAG_COPIED;
        /* a compressed cluster written in part keeps the rest of its data:
         * rare enough (writing into an existing compressed image) to do
         * here, before any other write can reach the new cluster */
        if ((old_entry & QCOW2_OFLAG_COMPRESSED) && !whole &&
            copy_compressed(img, old_entry, fresh, err) < 0)
            return -1;
        /* an overlay's cluster written in part: the rest from the backing */
        if (!old_entry && !whole && img->backing &&
            copy_from_backing(img, gc, fresh, err) < 0)
            return -1;
    }
    return 0;
}

uint64_t qcow2_write_alignment(const struct ic_image *img)
{
    const struct qcow2_state *s = img->drv_state;
    /* compressed clusters are written whole (an overlay's others are
     * written in part, the rest copied from the backing file, as qemu
     * writes them) */
    return s->w && s->w->compress ? s->h.cluster_size : 1;
}

/* ---- staged writes ------------------------------------------------------ */

/* A write of the guest's data: the image is marked incomplete. */
static int writable(struct ic_image *img, struct ic_error *err)
{
    struct qcow2_state *s = state(img);
    if (!s->w)
        return ic_error_readonly(err, img->path);
    pthread_mutex_lock(&s->meta_lock);
    int r = qcow2_mark_written_locked(img, err);
    /* the header on disk names them no more: their clusters may go */
    if (r > 0 && s->w->bitmaps_stored)
        qcow2_drop_bitmaps(s);
    pthread_mutex_unlock(&s->meta_lock);
    return r < 0 ? -1 : 0;
}

int qcow2_stage(struct ic_image *img, struct ic_staged_write *sw, struct ic_error *err)
{
    struct qcow2_state *s = state(img);
    if (writable(img, err) < 0)
        return -1;
    if (!s->w->compress || !sw->buf)
        return 0;
    uint64_t csz = s->h.cluster_size;
    /* whole clusters, but for the image's last one, which a source of
     * another size may fill in part: the rest is zeros, compressed along
     * (qemu-img convert -c does the same) */
    uint64_t end = sw->off + sw->len, size = ic_image_size(img);
    uint64_t last_cluster = size ? (size - 1) / csz * csz : 0;
    if (sw->off % csz || (sw->len % csz && !(end > last_cluster && end <= size)))
        return ic_error_value(err, "%s: compressed writes must cover whole clusters", img->path);
    size_t n = (size_t)((sw->len + csz - 1) / csz);
    struct staged *st = calloc(1, sizeof *st + n * sizeof(struct blob));
    if (!st || !(st->arena = malloc(n * csz))) {
        free(st);
        return ic_error_nomem(err);
    }
    st->n = n;
    uint8_t *tail = NULL;
    for (size_t i = 0; i < n; i++) {
        const uint8_t *in = sw->buf + i * csz;
        uint64_t inlen = sw->len - i * csz < csz ? sw->len - i * csz : csz;
        if (inlen < csz) {
            /* the image's last, partial cluster: compressed whole */
            tail = calloc(1, csz);
            if (!tail) {
                free(st->arena);
                free(st);
                return ic_error_nomem(err);
            }
            memcpy(tail, in, inlen);
            in = tail;
        }
        uint8_t *out = st->arena + i * csz;
        size_t clen;
        int r = qcow2_compress_cluster(s->w, in, csz, out, csz - 1, &clen);
        if (r < 0) {
            int saved = errno;
            free(tail);
            free(st->arena);
            free(st);
            return saved == ENOMEM ? ic_error_nomem(err)
                                   : ic_error_os(err, saved, img->path, "compressing a cluster");
        }
        st->b[i] = r == 0 ? (struct blob){.data = out, .len = clen}
                          : (struct blob){.data = sw->buf + i * csz, .len = inlen, .raw = 1};
    }
    free(tail);
    sw->priv = st;
    return 0;
}

/* ---- zeros in an overlay ------------------------------------------------ */

/* Whether guest range [a, b) of the backing file reads as zeros by block
 * status: holes, zero or unallocated clusters, and anything past its end.
 * Data that merely holds zeros does not count (qemu's is_zero). */
static int backing_reads_zero(struct ic_image *img, uint64_t a, uint64_t b, int *zero,
                              struct ic_error *err)
{
    uint64_t bsize = ic_image_size(img->backing);
    *zero = 1;
    while (a < b && a < bsize) {
        struct ic_extent e;
        uint64_t lim = b < bsize ? b : bsize;
        if (ic_image_block_status(img->backing, a, lim - a, &e, err) < 0)
            return -1;
        if (!(e.flags & IC_EXT_ZERO)) {
            *zero = 0;
            return 0;
        }
        a += e.length;
    }
    return 0;
}

/* Zeros in a new overlay, decided in guest order as qemu's writes decide
 * them: a whole cluster becomes a zero cluster (v3; v2: a fresh cluster,
 * zeros as data).  Part of a cluster: nothing if the cluster reads as
 * zeros already; else a zero cluster when it is not data yet and the rest
 * of it reads as zeros by block status (v3); else the cluster becomes
 * data (the rest copied from the backing file) and the zeros are written
 * at commit: scratch[0] and scratch[1] say where, for the first and the
 * last piece (only they can be partial).  Writer lock held. */
static int place_overlay_zeros(struct ic_image *img, struct ic_staged_write *sw,
                               struct ic_error *err)
{
    struct qcow2_state *s = state(img);
    uint64_t csz = s->h.cluster_size, size = ic_image_size(img);
    uint64_t end = sw->off + sw->len;
    int v3 = s->h.version >= 3;
    for (uint64_t pos = sw->off; pos < end;) {
        uint64_t gc = pos / csz, cs = gc * csz, ce = cs + csz < size ? cs + csz : size;
        uint64_t n = (ce < end ? ce : end) - pos;
        uint64_t *l2 = qcow2_l2_for_update(img, gc, err);
        if (!l2)
            return -1;
        uint64_t *e = &l2[gc % s->l2_entries];
        int whole = pos == cs && pos + n == ce;
        int compressed = (*e & QCOW2_OFLAG_COMPRESSED) != 0;
        int data = !compressed && !(*e & QCOW2_OFLAG_ZERO) && (*e & QCOW2_OFFSET_MASK);
        uint64_t host = 0; /* zeros to write there, at commit */
        if (whole && compressed) {
            qcow2_release_compressed(s, *e);
            *e = 0;
            compressed = 0;
        }
        if (whole && v3) {
            *e = data ? *e | QCOW2_OFLAG_ZERO : QCOW2_OFLAG_ZERO;
        } else if (whole && !data) {
            if (qcow2_ensure_clusters(img, pos, pos + n, err) < 0) /* fresh: reads zeros */
                return -1;
        } else if (data) {
            host = (*e & QCOW2_OFFSET_MASK) + pos % csz;
        } else if (!(*e & QCOW2_OFLAG_ZERO)) {
            int zero = 0;
            if (v3 && !*e &&
                (backing_reads_zero(img, cs, pos, &zero, err) < 0 ||
                 (zero && backing_reads_zero(img, pos + n, ce, &zero, err) < 0)))
                return -1;
            if (zero) {
                *e = QCOW2_OFLAG_ZERO;
            } else {
                if (qcow2_ensure_clusters(img, pos, pos + n, err) < 0)
                    return -1;
                host = (*e & QCOW2_OFFSET_MASK) + pos % csz;
            }
        }
        if (host) {
            if (pos == sw->off)
                sw->scratch[0] = host;
            else if (pos + n == end)
                sw->scratch[1] = host;
            else
                return ic_error_value(err, "%s: zeros in the middle of a write land in part of "
                                      "a cluster", img->path);
        }
        pos += n;
    }
    return 0;
}

/* Zero bytes written as data, from a page of zeros. */
static int write_zero_bytes(struct ic_image *img, uint64_t host, uint64_t len,
                            struct ic_error *err)
{
    static const uint8_t zeros[64 << 10];
    struct qcow2_state *s = state(img);
    for (uint64_t done = 0; done < len;) {
        uint64_t n = len - done < sizeof zeros ? len - done : sizeof zeros;
        if (ic_image_pwrite(s->file, zeros, (size_t)n, host + done, err) < 0)
            return -1;
        done += n;
    }
    return 0;
}

/* The zeros place_overlay_zeros() left to write. */
static int commit_overlay_zeros(struct ic_image *img, const struct ic_staged_write *sw,
                                struct ic_error *err)
{
    uint64_t csz = state(img)->h.cluster_size, end = sw->off + sw->len;
    uint64_t first_end = (sw->off / csz + 1) * csz < end ? (sw->off / csz + 1) * csz : end;
    if (sw->scratch[0] && write_zero_bytes(img, sw->scratch[0], first_end - sw->off, err) < 0)
        return -1;
    uint64_t last_start = (end - 1) / csz * csz;
    if (sw->scratch[1] && write_zero_bytes(img, sw->scratch[1], end - last_start, err) < 0)
        return -1;
    return 0;
}

int qcow2_place(struct ic_image *img, struct ic_staged_write *sw, struct ic_error *err)
{
    struct qcow2_state *s = state(img);
    struct qcow2_writer *w = s->w;
    uint64_t csz = s->h.cluster_size;
    int ret = 0;
    if (!sw->buf && !img->backing) /* zeros without a backing file: at commit */
        return 0;
    pthread_mutex_lock(&s->meta_lock);
    if (!sw->buf) {
        uint64_t first_new = w->host_end;
        ret = place_overlay_zeros(img, sw, err);
        if (ret == 0 && w->host_end > first_new)
            ic_image_allocate(s->file, first_new, w->host_end - first_new);
    } else if (!sw->priv) {
        /* the clusters this write allocates form one run at the end */
        uint64_t first_new = w->host_end;
        ret = qcow2_ensure_clusters(img, sw->off, sw->off + sw->len, err);
        /* New clusters get disk space now, as qemu gives them: the file's
         * allocation then matches its refcounts (else qemu-img map takes
         * the image for a metadata-preallocated one).  They are fresh
         * space past the old end of file, so they read as zeros already,
         * and no other write can touch them before this place() ends. */
        if (ret == 0 && w->host_end > first_new)
            ic_image_allocate(s->file, first_new, w->host_end - first_new);
    } else {
        struct staged *st = sw->priv;
        for (size_t i = 0; i < st->n && ret == 0; i++) {
            uint64_t gc = sw->off / csz + i;
            uint64_t *l2 = qcow2_l2_for_update(img, gc, err);
            if (!l2) {
                ret = -1;
                break;
            }
            if (l2[gc % s->l2_entries]) {
                ret = ic_error_value(err, "%s: cluster %llu written twice", img->path,
                                     (unsigned long long)gc);
                break;
            }
            struct blob *b = &st->b[i];
            if (b->raw) {
                ret = qcow2_alloc_clusters(img, 1, &b->host, err);
                if (ret == 0)
                    b->entry = b->host | QCOW2_OFLAG_COPIED;
                continue;
            }
            ret = qcow2_alloc_bytes(img, b->len, &b->host, err);
            if (ret == 0)
                b->entry = qcow2_compressed_encode(&s->h, b->host, b->len);
        }
    }
    pthread_mutex_unlock(&s->meta_lock);
    ic_cache_forget(img, sw->off, sw->off + sw->len);
    return ret;
}

/* Host offset of guest byte `off` (a placed, uncompressed cluster). */
static uint64_t host_of(struct ic_image *img, uint64_t off)
{
    struct qcow2_state *s = state(img);
    uint64_t csz = s->h.cluster_size, gc = off / csz;
    /* placed: its table stays in memory until finish() */
    pthread_mutex_lock(&s->meta_lock);
    uint64_t e = qcow2_l2_dirty(s, gc / s->l2_entries)[gc % s->l2_entries];
    pthread_mutex_unlock(&s->meta_lock);
    return (e & QCOW2_OFFSET_MASK) + off % csz;
}

int qcow2_commit(struct ic_image *img, struct ic_staged_write *sw, struct ic_error *err)
{
    struct qcow2_state *s = state(img);
    uint64_t csz = s->h.cluster_size;
    struct staged *st = sw->priv;
    int ret = 0;
    if (!sw->buf)
        return img->backing ? commit_overlay_zeros(img, sw, err)
                          : write_zeroes(img, sw->off, sw->len, err);
    if (st) {
        /* each cluster's entry once its bytes are written */
        for (size_t i = 0; i < st->n && ret == 0; i++) {
            struct blob *b = &st->b[i];
            ret = ic_image_pwrite(s->file, b->data, b->len, b->host, err);
            if (ret < 0)
                break;
            uint64_t gc = sw->off / csz + i;
            pthread_mutex_lock(&s->meta_lock);
            uint64_t *l2 = qcow2_l2_for_update(img, gc, err);
            if (!l2) {
                ret = -1;
            } else if (l2[gc % s->l2_entries]) {
                /* another write placed before this one committed: its
                 * space would be lost under ours (unstage gives ours back) */
                ret = ic_error_value(err, "%s: cluster %llu written twice", img->path,
                                     (unsigned long long)gc);
            } else {
                l2[gc % s->l2_entries] = b->entry;
                b->linked = 1;
            }
            pthread_mutex_unlock(&s->meta_lock);
        }
        qcow2_unstage(img, sw);
        ic_cache_forget(img, sw->off, sw->off + sw->len);
        return ret;
    }
    /* runs of host-contiguous clusters go out as one write */
    uint64_t pos = sw->off, end = sw->off + sw->len;
    while (pos < end && ret == 0) {
        uint64_t host = host_of(img, pos);
        uint64_t run = csz - pos % csz < end - pos ? csz - pos % csz : end - pos;
        while (pos + run < end && host_of(img, pos + run) == host + run)
            run += csz < end - pos - run ? csz : end - pos - run;
        ret = ic_image_pwrite(s->file, sw->buf + (pos - sw->off), (size_t)run, host, err);
        pos += run;
    }
    return ret;
}

void qcow2_unstage(struct ic_image *img, struct ic_staged_write *sw)
{
    struct qcow2_state *s = state(img);
    struct staged *st = sw->priv;
    if (st) {
        /* space placed for bytes never written (or never linked) is
         * given back */
        pthread_mutex_lock(&s->meta_lock);
        for (size_t i = 0; i < st->n; i++) {
            const struct blob *b = &st->b[i];
            if (!b->entry || b->linked)
                continue;
            if (b->raw)
                qcow2_release_cluster(s, b->host);
            else
                qcow2_release_compressed(s, b->entry);
        }
        pthread_mutex_unlock(&s->meta_lock);
        free(st->arena);
        free(st);
    }
    sw->priv = NULL;
}

static int write_data(struct ic_image *img, const void *buf, size_t len, uint64_t off,
                struct ic_error *err)
{
    struct ic_staged_write sw = {.off = off, .len = len, .buf = buf};
    if (len == 0)
        return 0;
    if (qcow2_stage(img, &sw, err) < 0)
        return -1;
    if (qcow2_place(img, &sw, err) < 0) {
        qcow2_unstage(img, &sw);
        return -1;
    }
    return qcow2_commit(img, &sw, err);
}

/* Make [off, off+len) read as zeros.  Whole clusters: a v3 zero flag
 * (keeping the host cluster), or for v2 zeros written; compressed ones are
 * released.  Partial clusters get zeros written where they are allocated.
 * Unallocated clusters already read as zeros; an overlay's are decided as
 * a copy decides them (place_overlay_zeros). */
static int write_zeroes(struct ic_image *img, uint64_t off, uint64_t len, struct ic_error *err)
{
    struct qcow2_state *s = state(img);
    if (writable(img, err) < 0)
        return -1;
    if (img->backing) {
        struct ic_staged_write sw = {.off = off, .len = len};
        return qcow2_place(img, &sw, err) < 0 ? -1 : commit_overlay_zeros(img, &sw, err);
    }
    struct qcow2_writer *w = s->w;
    uint64_t csz = s->h.cluster_size;
    int ret = 0;
    for (uint64_t pos = off; pos < off + len && ret == 0;) {
        uint64_t n = csz - pos % csz < off + len - pos ? csz - pos % csz : off + len - pos;
        uint64_t gc = pos / csz;
        int whole = n == csz || (pos % csz == 0 && pos + n >= ic_image_size(img));
        uint64_t zero_host = 0; /* bytes to zero in the host file, if any */
        pthread_mutex_lock(&s->meta_lock);
        uint64_t *l2 = qcow2_l2_for_update(img, gc, err);
        if (!l2) {
            ret = -1;
        } else {
            uint64_t *e = &l2[gc % s->l2_entries];
            uint64_t host = *e & QCOW2_OFFSET_MASK;
            if ((*e & QCOW2_OFLAG_COMPRESSED) && whole) {
                qcow2_release_compressed(s, *e);
                *e = s->h.version >= 3 ? QCOW2_OFLAG_ZERO : 0;
            } else if (*e & QCOW2_OFLAG_COMPRESSED) {
                /* inflated into a cluster of its own, then zeroed in part */
                uint64_t first_new = w->host_end;
                ret = qcow2_ensure_clusters(img, pos, pos + n, err);
                if (ret == 0) {
                    ic_image_allocate(s->file, first_new, w->host_end - first_new);
                    zero_host = (*e & QCOW2_OFFSET_MASK) + pos % csz;
                }
            } else if (host && !(*e & QCOW2_OFLAG_ZERO)) {
                if (whole && s->h.version >= 3)
                    *e |= QCOW2_OFLAG_ZERO;
                else
                    zero_host = host + pos % csz;
            }
        }
        pthread_mutex_unlock(&s->meta_lock);
        if (ret == 0 && zero_host) {
            ret = ic_image_zero(s->file, zero_host, n, 0, err);
        }
        pos += n;
    }
    ic_cache_forget(img, off, off + len);
    return ret;
}

int qcow2_pwrite(struct ic_image *img, const void *buf, size_t len, uint64_t off,
                        struct ic_error *err)
{
    return write_data(img, buf, len, off, err);
}

int qcow2_zero(struct ic_image *img, uint64_t off, uint64_t len, unsigned flags,
                      struct ic_error *err)
{
    (void)flags;
    return write_zeroes(img, off, len, err);
}

int qcow2_flush(struct ic_image *img, struct ic_error *err)
{
    struct qcow2_state *s = state(img);
    return s->w ? ic_image_flush(s->file, err) : 0;
}
