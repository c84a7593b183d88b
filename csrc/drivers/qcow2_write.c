/* qcow2, write side: new images only.  Host space is allocated append-only
 * in the order place() is called (the copy engine calls it in guest order),
 * so a sequential copy lays data clusters out in guest order.  L2 tables,
 * the L1 table and refcounts live in memory and are written once, by
 * finish(), after the data: a copy that fails leaves a header marked
 * dirty and corrupt (v3) or without its magic (v2), never an image that
 * looks complete. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "qcow2_internal.h"

/* The host file grows in steps, not one ftruncate per cluster. */
#define GROW_STEP (64ull << 20)
#define REFCOUNT_ORDER 4 /* 16-bit refcounts, as qemu writes them */
#define REFCOUNT_MAX 0xffffu
#define HEADER_V3_LEN 112

struct qcow2_writer {
    pthread_mutex_t lock;
    uint64_t host_end;    /* first free byte, a cluster boundary */
    uint64_t file_size;   /* the host file's size, >= host_end */
    uint64_t comp_cursor; /* where the next compressed cluster may go; 0: none */
    uint64_t **l2;        /* per L1 index: entries in host order, or NULL */
    uint16_t *rc;         /* refcount per host cluster */
    uint64_t rc_len;
    int compress;
    int finished;
};

/* One guest cluster of a compressed write. */
struct blob {
    const uint8_t *data;
    size_t len;
    int raw; /* did not shrink: stored as a normal cluster */
    uint64_t host;
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

static void put_be64(uint8_t *p, uint64_t v)
{
    for (int i = 7; i >= 0; i--, v >>= 8)
        p[i] = (uint8_t)v;
}

static void put_be32(uint8_t *p, uint32_t v)
{
    for (int i = 3; i >= 0; i--, v >>= 8)
        p[i] = (uint8_t)v;
}

/* ---- allocation (writer lock held) ------------------------------------ */

static int grow_refcounts(struct qcow2_writer *w, uint64_t clusters)
{
    if (clusters <= w->rc_len)
        return 0;
    uint64_t n = w->rc_len ? w->rc_len : 1024;
    while (n < clusters)
        n *= 2;
    uint16_t *rc = realloc(w->rc, n * sizeof *rc);
    if (!rc)
        return -1;
    memset(rc + w->rc_len, 0, (n - w->rc_len) * sizeof *rc);
    w->rc = rc;
    w->rc_len = n;
    return 0;
}

/* Make the host file cover `end`, in big steps. */
static int cover(struct ic_image *img, uint64_t end, struct ic_error *err)
{
    struct qcow2_state *s = state(img);
    struct qcow2_writer *w = s->w;
    uint64_t csz = s->h.cluster_size;
    if (grow_refcounts(w, end / csz + 1) < 0)
        return ic_error_nomem(err);
    if (end <= w->file_size)
        return 0;
    uint64_t size = end + GROW_STEP;
    if (ic_raw_resize(s->file, size, err) < 0)
        return -1;
    w->file_size = size;
    return 0;
}

/* `n` whole clusters at the end of the file. */
static int alloc_clusters(struct ic_image *img, uint64_t n, uint64_t *host, struct ic_error *err)
{
    struct qcow2_state *s = state(img);
    struct qcow2_writer *w = s->w;
    uint64_t csz = s->h.cluster_size;
    if (cover(img, w->host_end + n * csz, err) < 0)
        return -1;
    *host = w->host_end;
    for (uint64_t i = 0; i < n; i++)
        w->rc[w->host_end / csz + i] = 1;
    w->host_end += n * csz;
    w->comp_cursor = 0;
    return 0;
}

/* `len` bytes for a compressed cluster, packed after the previous one and
 * free to run on into fresh clusters (qemu's alloc_bytes). */
static int alloc_bytes(struct ic_image *img, uint64_t len, uint64_t *host, struct ic_error *err)
{
    struct qcow2_state *s = state(img);
    struct qcow2_writer *w = s->w;
    uint64_t csz = s->h.cluster_size;
    uint64_t start = w->comp_cursor;
    if (!start || w->rc[start / csz] == REFCOUNT_MAX)
        start = w->host_end;
    uint64_t end = start + len;
    uint64_t new_end = (end + csz - 1) / csz * csz;
    if (new_end > w->host_end) {
        if (cover(img, new_end, err) < 0)
            return -1;
        w->host_end = new_end;
    }
    for (uint64_t cl = start / csz; cl <= (end - 1) / csz; cl++)
        w->rc[cl]++;
    w->comp_cursor = end % csz ? end : 0;
    *host = start;
    return 0;
}

static uint64_t *l2_table(struct ic_image *img, uint64_t gc, struct ic_error *err)
{
    struct qcow2_state *s = state(img);
    uint64_t i = gc / s->l2_entries;
    if (!s->w->l2[i] && !(s->w->l2[i] = calloc(s->l2_entries, sizeof(uint64_t)))) {
        ic_error_nomem(err);
        return NULL;
    }
    return s->w->l2[i];
}

/* Guest clusters [first, last] get host clusters where they have none. */
static int ensure_clusters(struct ic_image *img, uint64_t first, uint64_t last,
                           struct ic_error *err)
{
    struct qcow2_state *s = state(img);
    for (uint64_t gc = first; gc <= last; gc++) {
        uint64_t *l2 = l2_table(img, gc, err);
        if (!l2)
            return -1;
        uint64_t *e = &l2[gc % s->l2_entries];
        if ((*e & QCOW2_OFFSET_MASK) && !(*e & QCOW2_OFLAG_COMPRESSED)) {
            *e &= ~QCOW2_OFLAG_ZERO;
            continue;
        }
        if (*e & QCOW2_OFLAG_COMPRESSED)
            return ic_error_value(err, "%s: cannot overwrite a compressed cluster", img->path);
        uint64_t host;
        if (alloc_clusters(img, 1, &host, err) < 0)
            return -1;
        *e = host | QCOW2_OFLAG_COPIED;
    }
    return 0;
}

/* ---- creating ----------------------------------------------------------- */

static void header_bytes(const struct qcow2_state *s, int complete, uint8_t *h, size_t *len)
{
    const struct qcow2_header *q = &s->h;
    int v2 = q->version == 2;
    *len = v2 ? QCOW2_HEADER_V2_LEN : HEADER_V3_LEN;
    memset(h, 0, *len);
    /* an incomplete v2 image has no magic: nothing takes it for qcow2 */
    if (complete || !v2)
        memcpy(h, QCOW2_MAGIC, 4);
    put_be32(h + 4, q->version);
    put_be32(h + 20, q->cluster_bits);
    put_be64(h + 24, q->size);
    put_be32(h + 36, q->l1_size);
    put_be64(h + 40, q->l1_table_offset);
    put_be64(h + 48, q->refcount_table_offset);
    put_be32(h + 56, q->refcount_table_clusters);
    if (!v2) {
        put_be64(h + 72, complete ? 0 : QCOW2_INCOMPAT_DIRTY | QCOW2_INCOMPAT_CORRUPT);
        put_be32(h + 96, REFCOUNT_ORDER);
        put_be32(h + 100, HEADER_V3_LEN);
    }
}

static int write_header(struct ic_image *img, int complete, struct ic_error *err)
{
    uint8_t h[HEADER_V3_LEN];
    size_t len;
    header_bytes(state(img), complete, h, &len);
    return ic_image_pwrite(state(img)->file, h, len, 0, err);
}

static int valid_cluster_size(uint64_t c)
{
    return c >= 512 && c <= (2u << 20) && (c & (c - 1)) == 0;
}

/* Every cluster allocated now, in guest order, L2 tables first in each
 * range; the data clusters stay unwritten holes of the host file. */
static int preallocate(struct ic_image *img, struct ic_error *err)
{
    struct qcow2_state *s = state(img);
    uint64_t csz = s->h.cluster_size;
    uint64_t clusters = (s->h.size + csz - 1) / csz;
    for (uint64_t gc = 0; gc < clusters; gc++)
        if (ensure_clusters(img, gc, gc, err) < 0)
            return -1;
    return 0;
}

int qcow2_create(struct ic_image *img, int fd, int *fresh, struct ic_error *err)
{
    const struct ic_create_options *o = img->create_opts;
    uint64_t csz = o->cluster_size ? o->cluster_size : 65536;
    if (!valid_cluster_size(csz)) {
        close(fd);
        return ic_error_value(err, "cluster_size must be a power of two from 512 to 2 MiB");
    }
    struct qcow2_state *s = calloc(1, sizeof *s);
    struct qcow2_writer *w = calloc(1, sizeof *w);
    if (!s || !w) {
        free(s);
        free(w);
        close(fd);
        return ic_error_nomem(err);
    }
    pthread_mutex_init(&s->l2_lock, NULL);
    pthread_mutex_init(&s->prealloc_lock, NULL);
    pthread_mutex_init(&w->lock, NULL);
    s->w = w;
    img->drv_state = s;
    if (ic_image_wrap_fd(img, fd, &s->file, err) < 0)
        goto fail;

    struct qcow2_header *h = &s->h;
    h->version = o->compat_v2 ? 2 : 3;
    h->cluster_size = csz;
    for (h->cluster_bits = 9; (1ull << h->cluster_bits) < csz; h->cluster_bits++)
        ;
    h->size = img->size;
    h->refcount_order = REFCOUNT_ORDER;
    s->l2_entries = csz / 8;
    uint64_t clusters = (h->size + csz - 1) / csz;
    uint64_t l1 = (clusters + s->l2_entries - 1) / s->l2_entries;
    if (l1 * 8 > QCOW2_MAX_L1_BYTES) {
        ic_error_value(err, "%s: %llu bytes need an L1 table larger than 32 MiB; use a larger "
                       "cluster_size", img->path, (unsigned long long)h->size);
        goto fail;
    }
    h->l1_size = (uint32_t)l1;
    w->compress = o->compress;
    w->l2 = calloc(l1 ? l1 : 1, sizeof *w->l2);
    s->l1 = calloc(l1 ? l1 : 1, sizeof *s->l1);
    if (!w->l2 || !s->l1) {
        ic_error_nomem(err);
        goto fail;
    }
    /* header cluster, then the L1 table; everything else is appended */
    uint64_t l1_clusters = (l1 * 8 + csz - 1) / csz;
    if (l1_clusters == 0)
        l1_clusters = 1;
    if (ic_raw_resize(s->file, 0, err) < 0 || cover(img, (1 + l1_clusters) * csz, err) < 0)
        goto fail;
    w->rc[0] = 1;
    for (uint64_t i = 0; i < l1_clusters; i++)
        w->rc[1 + i] = 1;
    w->host_end = (1 + l1_clusters) * csz;
    h->l1_table_offset = csz;
    if (o->prealloc_metadata && preallocate(img, err) < 0)
        goto fail;
    if (write_header(img, 0, err) < 0)
        goto fail;
    *fresh = 1;
    return 0;
fail:
    qcow2_writer_free(w, s->h.l1_size);
    s->w = NULL;
    if (s->file)
        ic_image_close(s->file);
    else
        close(fd);
    free(s->l1);
    pthread_mutex_destroy(&s->l2_lock);
    pthread_mutex_destroy(&s->prealloc_lock);
    free(s);
    img->drv_state = NULL;
    return -1;
}

void qcow2_writer_free(struct qcow2_writer *w, uint64_t l1_size)
{
    if (!w)
        return;
    for (uint64_t i = 0; w->l2 && i < l1_size; i++)
        free(w->l2[i]);
    pthread_mutex_destroy(&w->lock);
    free(w->rc);
    free(w->l2);
    free(w);
}

int qcow2_writer_l2(struct qcow2_state *s, uint64_t gc, uint64_t n, uint64_t *out, int *found)
{
    struct qcow2_writer *w = s->w;
    *found = w != NULL;
    if (!w)
        return 0;
    pthread_mutex_lock(&w->lock);
    uint64_t i = gc / s->l2_entries;
    if (i < s->h.l1_size && w->l2[i])
        memcpy(out, &w->l2[i][gc % s->l2_entries], n * sizeof *out);
    else
        memset(out, 0, n * sizeof *out);
    pthread_mutex_unlock(&w->lock);
    return 0;
}

int qcow2_writer_has_table(struct qcow2_state *s, uint64_t l1_index)
{
    pthread_mutex_lock(&s->w->lock);
    int r = l1_index < s->h.l1_size && s->w->l2[l1_index] != NULL;
    pthread_mutex_unlock(&s->w->lock);
    return r;
}

uint64_t qcow2_write_alignment(const struct ic_image *img)
{
    const struct qcow2_state *s = img->drv_state;
    return s->w && s->w->compress ? s->h.cluster_size : 1;
}

/* ---- staged writes ------------------------------------------------------ */

static int writable(struct ic_image *img, struct ic_error *err)
{
    struct qcow2_state *s = state(img);
    if (!s->w || s->w->finished)
        return ic_error_format(err, img->path, "writing into existing qcow2 images is not "
                               "supported yet");
    return 0;
}

/* Deflate one cluster the way qemu does (raw deflate, 4 KiB window); a
 * cluster that does not shrink is stored as it is. */
static int deflate_cluster(const uint8_t *in, size_t len, uint8_t *out, size_t cap,
                           size_t *out_len)
{
    z_stream z;
    memset(&z, 0, sizeof z);
    if (deflateInit2(&z, Z_DEFAULT_COMPRESSION, Z_DEFLATED, -12, 9, Z_DEFAULT_STRATEGY) != Z_OK)
        return -1;
    z.next_in = (Bytef *)in;
    z.avail_in = (uInt)len;
    z.next_out = out;
    z.avail_out = (uInt)cap;
    int r = deflate(&z, Z_FINISH);
    *out_len = cap - z.avail_out;
    deflateEnd(&z);
    return r == Z_STREAM_END ? 0 : 1;
}

int qcow2_stage(struct ic_image *img, struct ic_staged_write *sw, struct ic_error *err)
{
    struct qcow2_state *s = state(img);
    if (writable(img, err) < 0)
        return -1;
    if (!s->w->compress)
        return 0;
    uint64_t csz = s->h.cluster_size;
    if (sw->off % csz || (sw->len % csz && sw->off + sw->len != s->h.size))
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
        int r = deflate_cluster(in, csz, out, csz - 1, &clen);
        if (r < 0) {
            free(tail);
            free(st->arena);
            free(st);
            return ic_error_nomem(err);
        }
        st->b[i] = r == 0 ? (struct blob){.data = out, .len = clen}
                          : (struct blob){.data = sw->buf + i * csz, .len = inlen, .raw = 1};
    }
    free(tail);
    sw->priv = st;
    return 0;
}

int qcow2_place(struct ic_image *img, struct ic_staged_write *sw, struct ic_error *err)
{
    struct qcow2_state *s = state(img);
    struct qcow2_writer *w = s->w;
    uint64_t csz = s->h.cluster_size;
    int ret = 0;
    pthread_mutex_lock(&w->lock);
    if (!sw->priv) {
        /* the clusters this write allocates form one run at the end */
        sw->scratch[0] = w->host_end;
        ret = ensure_clusters(img, sw->off / csz, (sw->off + sw->len - 1) / csz, err);
        sw->scratch[1] = w->host_end;
    } else {
        struct staged *st = sw->priv;
        unsigned x = 62 - (s->h.cluster_bits - 8);
        for (size_t i = 0; i < st->n && ret == 0; i++) {
            uint64_t gc = sw->off / csz + i;
            uint64_t *l2 = l2_table(img, gc, err);
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
                ret = alloc_clusters(img, 1, &b->host, err);
                if (ret == 0)
                    l2[gc % s->l2_entries] = b->host | QCOW2_OFLAG_COPIED;
                continue;
            }
            ret = alloc_bytes(img, b->len, &b->host, err);
            uint64_t sectors = (b->host + b->len - 1) / 512 - b->host / 512;
            if (ret == 0)
                l2[gc % s->l2_entries] = QCOW2_OFLAG_COMPRESSED | sectors << x | b->host;
        }
    }
    pthread_mutex_unlock(&w->lock);
    ic_cache_forget(img, sw->off, sw->off + sw->len);
    return ret;
}

/* Host offset of guest byte `off` (a placed, uncompressed cluster). */
static uint64_t host_of(struct ic_image *img, uint64_t off)
{
    struct qcow2_state *s = state(img);
    uint64_t csz = s->h.cluster_size, gc = off / csz;
    pthread_mutex_lock(&s->w->lock);
    uint64_t e = s->w->l2[gc / s->l2_entries][gc % s->l2_entries];
    pthread_mutex_unlock(&s->w->lock);
    return (e & QCOW2_OFFSET_MASK) + off % csz;
}

int qcow2_commit(struct ic_image *img, struct ic_staged_write *sw, struct ic_error *err)
{
    struct qcow2_state *s = state(img);
    uint64_t csz = s->h.cluster_size;
    struct staged *st = sw->priv;
    int ret = 0;
    if (st) {
        for (size_t i = 0; i < st->n && ret == 0; i++)
            ret = ic_image_pwrite(s->file, st->b[i].data, st->b[i].len, st->b[i].host, err);
        qcow2_unstage(img, sw);
        return ret;
    }
    /* New clusters are allocated in the host file first, as qemu does:
     * the parts this write leaves alone read as zeros, and the file's
     * allocation matches its refcounts (or qemu-img map would take the
     * image for a metadata-preallocated one). */
    if (sw->scratch[1] > sw->scratch[0] &&
        ic_image_zero(s->file, sw->scratch[0], sw->scratch[1] - sw->scratch[0], 0, err) < 0)
        return -1;
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
    (void)img;
    struct staged *st = sw->priv;
    if (st) {
        free(st->arena);
        free(st);
    }
    sw->priv = NULL;
}

int qcow2_write(struct ic_image *img, const void *buf, size_t len, uint64_t off,
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

/* New images read as zeros where nothing was written; clusters already
 * written get zeros written over the range (v3 could flag whole clusters,
 * but the copy engine never zeroes what it wrote). */
int qcow2_write_zeroes(struct ic_image *img, uint64_t off, uint64_t len, struct ic_error *err)
{
    struct qcow2_state *s = state(img);
    if (writable(img, err) < 0)
        return -1;
    uint64_t csz = s->h.cluster_size;
    uint8_t *zeros = NULL;
    int ret = 0;
    for (uint64_t pos = off; pos < off + len && ret == 0;) {
        uint64_t n = csz - pos % csz < off + len - pos ? csz - pos % csz : off + len - pos;
        uint64_t gc = pos / csz, e = 0;
        pthread_mutex_lock(&s->w->lock);
        if (s->w->l2[gc / s->l2_entries])
            e = s->w->l2[gc / s->l2_entries][gc % s->l2_entries];
        pthread_mutex_unlock(&s->w->lock);
        if (e & QCOW2_OFLAG_COMPRESSED) {
            ret = ic_error_value(err, "%s: cannot zero part of a compressed cluster", img->path);
        } else if (e & QCOW2_OFFSET_MASK) {
            if (!zeros && !(zeros = calloc(1, csz)))
                return ic_error_nomem(err);
            ret = ic_image_pwrite(s->file, zeros, (size_t)n, (e & QCOW2_OFFSET_MASK) + pos % csz,
                                  err);
        }
        pos += n;
    }
    free(zeros);
    ic_cache_forget(img, off, off + len);
    return ret;
}

/* ---- finishing ---------------------------------------------------------- */

/* Refcount blocks and table at the end, counting themselves. */
static int write_refcounts(struct ic_image *img, struct ic_error *err)
{
    struct qcow2_state *s = state(img);
    struct qcow2_writer *w = s->w;
    uint64_t csz = s->h.cluster_size;
    uint64_t per_block = csz * 8 / 16;
    uint64_t base = w->host_end / csz, blocks = 0, table = 0;
    for (;;) {
        uint64_t total = base + blocks + table;
        uint64_t nb = (total + per_block - 1) / per_block;
        uint64_t nt = (nb * 8 + csz - 1) / csz;
        if (nb == blocks && nt == table)
            break;
        blocks = nb;
        table = nt;
    }
    if ((uint64_t)table * csz > QCOW2_MAX_REFTABLE_BYTES)
        return ic_error_value(err, "%s: refcount table would exceed 8 MiB", img->path);
    uint64_t table_off, blocks_off;
    if (alloc_clusters(img, table, &table_off, err) < 0 ||
        alloc_clusters(img, blocks, &blocks_off, err) < 0)
        return -1;
    uint8_t *buf = calloc(1, (table + blocks) * csz);
    if (!buf)
        return ic_error_nomem(err);
    uint64_t total = w->host_end / csz;
    for (uint64_t b = 0; b < blocks; b++)
        put_be64(buf + b * 8, blocks_off + b * csz);
    uint8_t *rb = buf + table * csz;
    for (uint64_t cl = 0; cl < total; cl++) {
        rb[cl * 2] = (uint8_t)(w->rc[cl] >> 8);
        rb[cl * 2 + 1] = (uint8_t)w->rc[cl];
    }
    int ret = ic_image_pwrite(s->file, buf, (size_t)((table + blocks) * csz), table_off, err);
    free(buf);
    s->h.refcount_table_offset = table_off;
    s->h.refcount_table_clusters = (uint32_t)table;
    return ret;
}

int qcow2_finish(struct ic_image *img, int sync, struct ic_error *err)
{
    struct qcow2_state *s = state(img);
    struct qcow2_writer *w = s->w;
    if (!w || w->finished)
        return 0;
    uint64_t csz = s->h.cluster_size;
    int ret = 0;
    pthread_mutex_lock(&w->lock);
    /* L2 tables go after the data, so data clusters stay contiguous */
    uint8_t *be = malloc(csz);
    if (!be)
        ret = ic_error_nomem(err);
    for (uint64_t i = 0; i < s->h.l1_size && ret == 0; i++) {
        if (!w->l2[i])
            continue;
        uint64_t host = 0;
        ret = alloc_clusters(img, 1, &host, err);
        for (uint64_t k = 0; k < s->l2_entries && ret == 0; k++)
            put_be64(be + k * 8, w->l2[i][k]);
        if (ret == 0)
            ret = ic_image_pwrite(s->file, be, csz, host, err);
        s->l1[i] = host | QCOW2_OFLAG_COPIED;
    }
    free(be);
    if (ret == 0 && s->h.l1_size) {
        uint8_t *l1 = malloc(s->h.l1_size * 8ull);
        if (!l1)
            ret = ic_error_nomem(err);
        for (uint64_t i = 0; ret == 0 && i < s->h.l1_size; i++)
            put_be64(l1 + i * 8, s->l1[i]);
        if (ret == 0)
            ret = ic_image_pwrite(s->file, l1, s->h.l1_size * 8ull, s->h.l1_table_offset, err);
        free(l1);
    }
    if (ret == 0)
        ret = write_refcounts(img, err);
    if (ret == 0)
        ret = ic_raw_resize(s->file, w->host_end, err);
    /* the metadata is durable before the header says it is complete */
    if (ret == 0 && sync)
        ret = ic_image_flush(s->file, err);
    if (ret == 0)
        ret = write_header(img, 1, err);
    if (ret == 0 && sync)
        ret = ic_image_flush(s->file, err);
    if (ret == 0)
        w->finished = 1;
    pthread_mutex_unlock(&w->lock);
    return ret;
}
