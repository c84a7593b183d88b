/* qcow2, write side: new images only.  Host space is allocated append-only
 * in the order place() is called (the copy engine calls it in guest order),
 * so a sequential copy lays data clusters out in guest order.  L2 tables,
 * the L1 table and refcounts live in memory and are written once, by
 * finish(), after the data: a copy that fails leaves a header marked
 * dirty and corrupt (v3) or without its magic (v2), never an image that
 * looks complete. */
#include <errno.h>
#include <stdio.h>
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
    int existing;         /* writing into an image that was already there */
    uint64_t *l2_host;    /* per L1 index: where a loaded table lives; 0: new */
    uint8_t header[QCOW2_HEADER_READ]; /* existing: the header as found */
    uint64_t ref_start, ref_clusters; /* refcount structures finish() wrote */
    uint64_t host_end;    /* first free byte, a cluster boundary */
    uint64_t file_size;   /* the host file's size, >= host_end */
    uint64_t comp_cursor; /* where the next compressed cluster may go; 0: none */
    uint64_t **l2;        /* per L1 index: entries in host order, or NULL */
    uint16_t *rc;         /* refcount per host cluster */
    uint64_t rc_len;
    int compress;
    int marked; /* the header says incomplete: written to since finish() */
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
    if (ic_image_truncate(s->file, size, err) < 0)
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
    struct qcow2_writer *w = s->w;
    uint64_t i = gc / s->l2_entries;
    if (w->l2[i])
        return w->l2[i];
    uint64_t *t = calloc(s->l2_entries, sizeof(uint64_t));
    if (!t) {
        ic_error_nomem(err);
        return NULL;
    }
    /* an existing table is loaded once and written back in place */
    uint64_t on_disk = w->existing ? s->l1[i] & QCOW2_OFFSET_MASK : 0;
    if (on_disk) {
        if (on_disk % s->h.cluster_size || on_disk < s->h.cluster_size ||
            ic_image_pread(s->file, t, s->h.cluster_size, on_disk, err) < 0) {
            free(t);
            if (err->kind == IC_ERR_NONE || err->kind == IC_ERR_VALUE)
                ic_error_format(err, img->path, "corrupt qcow2 image: L2 table at 0x%llx",
                                (unsigned long long)on_disk);
            return NULL;
        }
        for (uint64_t k = 0; k < s->l2_entries; k++)
            t[k] = qcow2_be64(&t[k]);
        w->l2_host[i] = on_disk;
    }
    w->l2[i] = t;
    return t;
}

/* Drop this image's reference to a compressed cluster's bytes. */
static void release_compressed(struct qcow2_state *s, uint64_t entry)
{
    struct qcow2_writer *w = s->w;
    uint64_t csz = s->h.cluster_size;
    unsigned x = 62 - (s->h.cluster_bits - 8);
    uint64_t host = entry & ((1ull << x) - 1);
    uint64_t sectors = ((entry & ~QCOW2_OFLAG_COPIED & ~QCOW2_OFLAG_COMPRESSED) >> x) + 1;
    uint64_t end = (host & ~511ull) + sectors * 512;
    for (uint64_t cl = host / csz; cl <= (end - 1) / csz && cl < w->rc_len; cl++)
        if (w->rc[cl])
            w->rc[cl]--;
}

/* The clusters under [off, end) get host clusters of their own, which
 * the write may fill: new ones are appended (and zero-filled before data
 * goes in), a zero or compressed one is replaced by a new one. */
static int ensure_clusters(struct ic_image *img, uint64_t off, uint64_t end, struct ic_error *err)
{
    struct qcow2_state *s = state(img);
    uint64_t csz = s->h.cluster_size;
    for (uint64_t gc = off / csz; gc <= (end - 1) / csz; gc++) {
        uint64_t *l2 = l2_table(img, gc, err);
        if (!l2)
            return -1;
        uint64_t *e = &l2[gc % s->l2_entries];
        uint64_t host = *e & QCOW2_OFFSET_MASK;
        uint64_t old_entry = *e;
        int whole = off <= gc * csz && (end >= (gc + 1) * csz || end >= ic_image_size(img));
        if (*e & QCOW2_OFLAG_COMPRESSED) {
            release_compressed(s, *e);
        } else if (host && !(*e & QCOW2_OFLAG_ZERO)) {
            if (!(*e & QCOW2_OFLAG_COPIED))
                return ic_error_format(err, img->path, "cluster 0x%llx is shared (internal "
                                       "snapshot?): copy-on-write is not supported",
                                       (unsigned long long)host);
            continue;
        } else if (host && s->w->rc[host / csz]) {
            s->w->rc[host / csz]--; /* a zero cluster's old space: stale data */
        }
        uint64_t fresh;
        if (alloc_clusters(img, 1, &fresh, err) < 0)
            return -1;
        *e = fresh | QCOW2_OFLAG_COPIED;
        /* a compressed cluster written in part keeps the rest of its data:
         * rare enough (writing into an existing compressed image) to do
         * here, before any other write can reach the new cluster */
        if ((old_entry & QCOW2_OFLAG_COMPRESSED) && !whole &&
            qcow2_copy_compressed(img, old_entry, fresh, err) < 0)
            return -1;
        /* an overlay's cluster written in part: the rest from the backing */
        if (!old_entry && !whole && img->backing &&
            qcow2_copy_from_backing(img, gc, fresh, err) < 0)
            return -1;
    }
    return 0;
}

/* ---- creating ----------------------------------------------------------- */

/* Room for the header, a backing format extension, the end marker and
 * a backing file name. */
#define HEADER_MAX (HEADER_V3_LEN + 8 + 64 + 8 + QCOW2_MAX_BACKING_NAME + 1)

static void header_bytes(const struct qcow2_state *s, int complete, uint8_t *h, size_t *len)
{
    const struct qcow2_header *q = &s->h;
    int v2 = q->version == 2;
    *len = v2 ? QCOW2_HEADER_V2_LEN : HEADER_V3_LEN;
    memset(h, 0, HEADER_MAX);
    if (q->backing_name[0]) {
        size_t flen = strlen(q->backing_format), nlen = strlen(q->backing_name);
        uint8_t *ext = h + *len;
        put_be32(ext, QCOW2_EXT_BACKING_FORMAT);
        put_be32(ext + 4, (uint32_t)flen);
        memcpy(ext + 8, q->backing_format, flen);
        size_t name_off = *len + 8 + (flen + 7) / 8 * 8 + 8; /* after the end marker */
        memcpy(h + name_off, q->backing_name, nlen);
        put_be64(h + 8, name_off);
        put_be32(h + 16, (uint32_t)nlen);
        *len = name_off + nlen;
    }
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

/* An existing image keeps its header and extensions; only the refcount
 * table, the feature bits (our in-progress marks; auto-clear bits, which
 * writers must clear) and, for v2, the magic change. */
static void patch_header(const struct qcow2_state *s, int complete, uint8_t *h, size_t *len)
{
    const struct qcow2_header *q = &s->h;
    *len = q->version == 2 ? QCOW2_HEADER_V2_LEN : QCOW2_HEADER_V3_MIN;
    memcpy(h, s->w->header, *len);
    if (q->version == 2)
        memcpy(h, complete ? QCOW2_MAGIC : "\0\0\0\0", 4);
    put_be64(h + 48, q->refcount_table_offset);
    put_be32(h + 56, q->refcount_table_clusters);
    if (q->version >= 3) {
        uint64_t marks = QCOW2_INCOMPAT_DIRTY | QCOW2_INCOMPAT_CORRUPT;
        uint64_t in = q->incompatible & ~marks;
        put_be64(h + 72, complete ? in : in | marks);
        put_be64(h + 88, 0);
    }
}

static int write_header(struct ic_image *img, int complete, struct ic_error *err)
{
    uint8_t h[HEADER_MAX];
    size_t len;
    if (state(img)->w->existing)
        patch_header(state(img), complete, h, &len);
    else
        header_bytes(state(img), complete, h, &len);
    return ic_image_pwrite(state(img)->file, h, len, 0, err);
}

static int valid_cluster_size(uint64_t c)
{
    return c >= 512 && c <= (2u << 20) && (c & (c - 1)) == 0;
}

/* A new overlay names its backing file (the image layer opened it) as the
 * caller wrote it, within the header cluster. */
static int name_backing(struct ic_image *img, const struct ic_create_options *o,
                        struct ic_error *err)
{
    struct qcow2_state *s = state(img);
    size_t nlen = strlen(o->backing_file);
    snprintf(s->h.backing_name, sizeof s->h.backing_name, "%s", o->backing_file);
    snprintf(s->h.backing_format, sizeof s->h.backing_format, "%s",
             ic_image_format(img->backing));
    size_t need = HEADER_V3_LEN + 8 + 64 + 8 + nlen;
    if (need > s->h.cluster_size)
        return ic_error_value(err, "backing file name too long for %llu-byte clusters",
                              (unsigned long long)s->h.cluster_size);
    return 0;
}

/* Every cluster allocated now, in guest order, L2 tables first in each
 * range; the data clusters stay unwritten holes of the host file. */
static int preallocate(struct ic_image *img, struct ic_error *err)
{
    struct qcow2_state *s = state(img);
    uint64_t csz = s->h.cluster_size;
    uint64_t clusters = (s->h.size + csz - 1) / csz;
    for (uint64_t gc = 0; gc < clusters; gc++)
        if (ensure_clusters(img, gc * csz, (gc + 1) * csz, err) < 0)
            return -1;
    return 0;
}

int qcow2_create(struct ic_image *img, int *fresh, struct ic_error *err)
{
    const struct ic_create_options *o = img->create_opts;
    uint64_t csz = o->cluster_size ? o->cluster_size : 65536;
    if (!valid_cluster_size(csz))
        return ic_error_value(err, "cluster_size must be a power of two from 512 to 2 MiB");
    struct qcow2_state *s = calloc(1, sizeof *s);
    struct qcow2_writer *w = calloc(1, sizeof *w);
    if (!s || !w) {
        free(s);
        free(w);
        return ic_error_nomem(err);
    }
    pthread_mutex_init(&s->l2_lock, NULL);
    pthread_mutex_init(&s->prealloc_lock, NULL);
    pthread_mutex_init(&w->lock, NULL);
    s->w = w;
    s->file = img->file;
    img->drv_state = s;

    struct qcow2_header *h = &s->h;
    h->version = o->compat_v2 ? 2 : 3;
    h->cluster_size = csz;
    for (h->cluster_bits = 9; (1ull << h->cluster_bits) < csz; h->cluster_bits++)
        ;
    /* qemu reads a qcow2 size in whole sectors: round up, as qemu-img
     * convert does (the tail past the source reads as zeros) */
    s->l2_entries = csz / 8;
    /* the L1 table's 32 MiB (qemu's limit) bound the virtual size */
    uint64_t most = (uint64_t)(QCOW2_MAX_L1_BYTES / 8) * s->l2_entries * csz;
    if (img->size > most) {
        ic_error_value(err, "%s: a qcow2 image with %llu KiB clusters holds at most %llu bytes, "
                       "not %llu%s", img->path, (unsigned long long)(csz >> 10),
                       (unsigned long long)most, (unsigned long long)img->size,
                       csz < (2u << 20) ? " (larger clusters hold more: cluster_size=2M "
                                          "holds 2 EiB)" : "");
        goto fail;
    }
    h->size = (img->size + 511) / 512 * 512;
    img->size = h->size;
    h->refcount_order = REFCOUNT_ORDER;
    uint64_t clusters = (h->size + csz - 1) / csz;
    uint64_t l1 = (clusters + s->l2_entries - 1) / s->l2_entries;
    h->l1_size = (uint32_t)l1;
    w->compress = o->compress;
    w->l2 = calloc(l1 ? l1 : 1, sizeof *w->l2);
    w->l2_host = calloc(l1 ? l1 : 1, sizeof *w->l2_host);
    s->l1 = calloc(l1 ? l1 : 1, sizeof *s->l1);
    if (!w->l2 || !w->l2_host || !s->l1) {
        ic_error_nomem(err);
        goto fail;
    }
    /* header cluster, then the L1 table; everything else is appended */
    uint64_t l1_clusters = (l1 * 8 + csz - 1) / csz;
    if (ic_image_truncate(s->file, 0, err) < 0 || cover(img, (1 + l1_clusters) * csz, err) < 0)
        goto fail;
    w->rc[0] = 1;
    for (uint64_t i = 0; i < l1_clusters; i++)
        w->rc[1 + i] = 1;
    w->host_end = (1 + l1_clusters) * csz;
    h->l1_table_offset = l1 ? csz : 0;
    /* metadata clusters own their whole disk space, as qemu's do: qemu-img
     * takes an image whose file holds fewer blocks than its refcounts say
     * for a metadata-preallocated one, and maps it differently */
    ic_image_allocate(s->file, 0, w->host_end);
    if (img->backing && name_backing(img, o, err) < 0)
        goto fail;
    if (o->prealloc_metadata && preallocate(img, err) < 0)
        goto fail;
    if (write_header(img, 0, err) < 0)
        goto fail;
    w->marked = 1;
    *fresh = img->backing == NULL; /* an overlay reads its backing file */
    return 0;
fail:
    qcow2_writer_free(w, s->h.l1_size);
    s->w = NULL;
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
    free(w->l2_host);
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
    else if (w->existing)
        *found = 0; /* the table on disk is still the truth */
    else
        memset(out, 0, n * sizeof *out);
    pthread_mutex_unlock(&w->lock);
    return 0;
}

int qcow2_writer_has_table(struct qcow2_state *s, uint64_t l1_index)
{
    pthread_mutex_lock(&s->w->lock);
    int r = l1_index < s->h.l1_size &&
            (s->w->l2[l1_index] || (s->w->existing && (s->l1[l1_index] & QCOW2_OFFSET_MASK)));
    pthread_mutex_unlock(&s->w->lock);
    return r;
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

/* The first write after opening or after finish() marks the image
 * incomplete until the next finish(). */
static int writable(struct ic_image *img, struct ic_error *err)
{
    struct qcow2_state *s = state(img);
    if (!s->w)
        return ic_error_readonly(err, img->path);
    pthread_mutex_lock(&s->w->lock);
    int ret = 0;
    if (!s->w->marked) {
        ret = write_header(img, 0, err);
        if (ret == 0)
            s->w->marked = 1;
    }
    pthread_mutex_unlock(&s->w->lock);
    return ret;
}

/* Each thread keeps one deflate stream: setting one up costs more than
 * compressing a small cluster.  Freed when the thread exits. */
static pthread_key_t deflate_key;
static pthread_once_t deflate_once = PTHREAD_ONCE_INIT;

static void free_deflate(void *p)
{
    deflateEnd(p);
    free(p);
}

static void make_deflate_key(void)
{
    (void)pthread_key_create(&deflate_key, free_deflate);
}

static z_stream *thread_deflate(void)
{
    pthread_once(&deflate_once, make_deflate_key);
    z_stream *z = pthread_getspecific(deflate_key);
    if (z)
        return deflateReset(z) == Z_OK ? z : NULL;
    z = calloc(1, sizeof *z);
    if (!z)
        return NULL;
    if (deflateInit2(z, Z_DEFAULT_COMPRESSION, Z_DEFLATED, -12, 9, Z_DEFAULT_STRATEGY) != Z_OK) {
        free(z);
        return NULL;
    }
    if (pthread_setspecific(deflate_key, z) != 0) {
        free_deflate(z);
        return NULL;
    }
    return z;
}

/* Deflate one cluster the way qemu does (raw deflate, 4 KiB window); 1
 * when it does not shrink (stored as it is), -1 without memory. */
static int deflate_cluster(const uint8_t *in, size_t len, uint8_t *out, size_t cap,
                           size_t *out_len)
{
    z_stream *z = thread_deflate();
    if (!z)
        return -1;
    z->next_in = (Bytef *)in;
    z->avail_in = (uInt)len;
    z->next_out = out;
    z->avail_out = (uInt)cap;
    int r = deflate(z, Z_FINISH);
    *out_len = cap - z->avail_out;
    return r == Z_STREAM_END ? 0 : 1;
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
        uint64_t *l2 = l2_table(img, gc, err);
        if (!l2)
            return -1;
        uint64_t *e = &l2[gc % s->l2_entries];
        int whole = pos == cs && pos + n == ce;
        int compressed = (*e & QCOW2_OFLAG_COMPRESSED) != 0;
        int data = !compressed && !(*e & QCOW2_OFLAG_ZERO) && (*e & QCOW2_OFFSET_MASK);
        uint64_t host = 0; /* zeros to write there, at commit */
        if (whole && compressed) {
            release_compressed(s, *e);
            *e = 0;
            compressed = 0;
        }
        if (whole && v3) {
            *e = data ? *e | QCOW2_OFLAG_ZERO : QCOW2_OFLAG_ZERO;
        } else if (whole && !data) {
            if (ensure_clusters(img, pos, pos + n, err) < 0) /* fresh: reads zeros */
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
                if (ensure_clusters(img, pos, pos + n, err) < 0)
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
    pthread_mutex_lock(&w->lock);
    if (!sw->buf) {
        uint64_t first_new = w->host_end;
        ret = place_overlay_zeros(img, sw, err);
        if (ret == 0 && w->host_end > first_new)
            ic_image_allocate(s->file, first_new, w->host_end - first_new);
    } else if (!sw->priv) {
        /* the clusters this write allocates form one run at the end */
        uint64_t first_new = w->host_end;
        ret = ensure_clusters(img, sw->off, sw->off + sw->len, err);
        /* New clusters get disk space now, as qemu gives them: the file's
         * allocation then matches its refcounts (else qemu-img map takes
         * the image for a metadata-preallocated one).  They are fresh
         * space past the old end of file, so they read as zeros already,
         * and no other write can touch them before this place() ends. */
        if (ret == 0 && w->host_end > first_new)
            ic_image_allocate(s->file, first_new, w->host_end - first_new);
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
    if (!sw->buf)
        return img->backing ? commit_overlay_zeros(img, sw, err)
                          : qcow2_write_zeroes(img, sw->off, sw->len, err);
    if (st) {
        for (size_t i = 0; i < st->n && ret == 0; i++)
            ret = ic_image_pwrite(s->file, st->b[i].data, st->b[i].len, st->b[i].host, err);
        qcow2_unstage(img, sw);
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

/* Make [off, off+len) read as zeros.  Whole clusters: a v3 zero flag
 * (keeping the host cluster), or for v2 zeros written; compressed ones are
 * released.  Partial clusters get zeros written where they are allocated.
 * Unallocated clusters already read as zeros; an overlay's are decided as
 * a copy decides them (place_overlay_zeros). */
int qcow2_write_zeroes(struct ic_image *img, uint64_t off, uint64_t len, struct ic_error *err)
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
        pthread_mutex_lock(&w->lock);
        uint64_t *l2 = l2_table(img, gc, err);
        if (!l2) {
            ret = -1;
        } else {
            uint64_t *e = &l2[gc % s->l2_entries];
            uint64_t host = *e & QCOW2_OFFSET_MASK;
            if ((*e & QCOW2_OFLAG_COMPRESSED) && whole) {
                release_compressed(s, *e);
                *e = s->h.version >= 3 ? QCOW2_OFLAG_ZERO : 0;
            } else if (*e & QCOW2_OFLAG_COMPRESSED) {
                /* inflated into a cluster of its own, then zeroed in part */
                uint64_t first_new = w->host_end;
                ret = ensure_clusters(img, pos, pos + n, err);
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
        pthread_mutex_unlock(&w->lock);
        if (ret == 0 && zero_host) {
            ret = ic_image_zero(s->file, zero_host, n, 0, err);
        }
        pos += n;
    }
    ic_cache_forget(img, off, off + len);
    return ret;
}

/* Writing into an image that exists: its refcounts come into memory (and
 * its old refcount structures are freed: finish() writes new ones at the
 * end), its L2 tables as they are touched; new space is appended. */
int qcow2_open_writer(struct ic_image *img, struct ic_error *err)
{
    struct qcow2_state *s = state(img);
    const struct qcow2_header *h = &s->h;
    if (h->backing_name[0])
        return ic_error_format(err, img->path, "writing into a qcow2 image with a backing "
                               "file is not supported yet");
    if (h->nb_snapshots)
        return ic_error_format(err, img->path, "writing into a qcow2 image with internal "
                               "snapshots is not supported");
    if (h->refcount_order != REFCOUNT_ORDER)
        return ic_error_format(err, img->path, "writing into a qcow2 image with %u-bit "
                               "refcounts is not supported", 1u << h->refcount_order);
    uint64_t csz = h->cluster_size, fsize = ic_image_size(s->file);
    struct qcow2_writer *w = calloc(1, sizeof *w);
    if (!w)
        return ic_error_nomem(err);
    pthread_mutex_init(&w->lock, NULL);
    w->existing = 1;
    s->w = w;
    uint64_t l1 = h->l1_size ? h->l1_size : 1;
    w->l2 = calloc(l1, sizeof *w->l2);
    w->l2_host = calloc(l1, sizeof *w->l2_host);
    if (!w->l2 || !w->l2_host)
        return ic_error_nomem(err);
    if (ic_image_pread(s->file, w->header, sizeof w->header < fsize ? sizeof w->header : fsize,
                       0, err) < 0)
        return -1;

    uint64_t table_bytes = (uint64_t)h->refcount_table_clusters * csz;
    uint64_t per_block = csz / 2;
    uint64_t file_clusters = (fsize + csz - 1) / csz;
    if (grow_refcounts(w, file_clusters + 1) < 0)
        return ic_error_nomem(err);
    uint8_t *table = malloc(table_bytes ? table_bytes : 1), *block = malloc(csz);
    int ret = table && block ? 0 : ic_error_nomem(err);
    if (ret == 0 && (h->refcount_table_offset % csz || h->refcount_table_offset == 0 ||
                     h->refcount_table_offset > fsize ||
                     table_bytes > fsize - h->refcount_table_offset))
        ret = ic_error_format(err, img->path, "corrupt qcow2 image: refcount table");
    if (ret == 0)
        ret = ic_image_pread(s->file, table, table_bytes, h->refcount_table_offset, err);
    for (uint64_t t = 0; ret == 0 && t < table_bytes / 8; t++) {
        uint64_t boff = qcow2_be64(table + t * 8) & QCOW2_OFFSET_MASK;
        if (!boff)
            continue;
        if (boff % csz || boff > fsize || csz > fsize - boff) {
            ret = ic_error_format(err, img->path, "corrupt qcow2 image: refcount block");
            break;
        }
        ret = ic_image_pread(s->file, block, csz, boff, err);
        for (uint64_t k = 0; ret == 0 && k < per_block; k++) {
            uint64_t cl = t * per_block + k;
            uint16_t v = (uint16_t)(block[k * 2] << 8 | block[k * 2 + 1]);
            if (v && cl >= w->rc_len && grow_refcounts(w, cl + 1) < 0)
                ret = ic_error_nomem(err);
            else if (cl < w->rc_len)
                w->rc[cl] = v;
        }
        if (ret == 0)
            w->rc[boff / csz] = 0; /* this block is replaced at finish() */
    }
    for (uint64_t c = 0; ret == 0 && c < table_bytes / csz; c++)
        w->rc[h->refcount_table_offset / csz + c] = 0;
    free(table);
    free(block);
    if (ret < 0)
        return -1;
    w->host_end = file_clusters * csz;
    w->file_size = fsize; /* grown by the first allocation */
    return 0; /* marked incomplete at the first write */
}

/* ---- finishing ---------------------------------------------------------- */

/* Refcount blocks and table for `clusters` host clusters, counting
 * themselves when `extra` (they are appended). */
static void refcount_size(uint64_t clusters, uint64_t csz, int extra, uint64_t *blocks,
                          uint64_t *table)
{
    uint64_t per_block = csz * 8 / 16;
    *blocks = *table = 0;
    for (;;) {
        uint64_t total = clusters + (extra ? *blocks + *table : 0);
        uint64_t nb = (total + per_block - 1) / per_block;
        uint64_t nt = (nb * 8 + csz - 1) / csz;
        if (nb == *blocks && nt == *table)
            return;
        *blocks = nb;
        *table = nt;
    }
}

/* A run of `n` free clusters inside the file (the refcount structures a
 * previous session freed), first fit; 0 when there is none. */
static uint64_t free_run(struct qcow2_writer *w, uint64_t end_cluster, uint64_t n)
{
    uint64_t run = 0;
    for (uint64_t cl = 1; cl < end_cluster && cl < w->rc_len; cl++) {
        run = w->rc[cl] ? 0 : run + 1;
        if (run == n)
            return cl + 1 - n;
    }
    return 0;
}

/* Refcount blocks and table, counting themselves: in clusters an earlier
 * session freed when they fit (so that a stable workload keeps a stable
 * file size), else at the end. */
static int write_refcounts(struct ic_image *img, struct ic_error *err)
{
    struct qcow2_state *s = state(img);
    struct qcow2_writer *w = s->w;
    uint64_t csz = s->h.cluster_size;
    uint64_t blocks, table, table_off, blocks_off;
    refcount_size(w->host_end / csz, csz, 0, &blocks, &table);
    uint64_t inside = free_run(w, w->host_end / csz, table + blocks);
    if (inside) {
        table_off = inside * csz;
        blocks_off = table_off + table * csz;
        for (uint64_t k = 0; k < table + blocks; k++)
            w->rc[inside + k] = 1;
    } else {
        refcount_size(w->host_end / csz, csz, 1, &blocks, &table);
        if ((uint64_t)table * csz > QCOW2_MAX_REFTABLE_BYTES)
            return ic_error_value(err, "%s: refcount table would exceed 8 MiB", img->path);
        if (alloc_clusters(img, table, &table_off, err) < 0 ||
            alloc_clusters(img, blocks, &blocks_off, err) < 0)
            return -1;
    }
    if ((uint64_t)table * csz > QCOW2_MAX_REFTABLE_BYTES)
        return ic_error_value(err, "%s: refcount table would exceed 8 MiB", img->path);
    w->ref_start = table_off / csz;
    w->ref_clusters = table + blocks;
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
    if (!w || !w->marked)
        return 0; /* nothing written since it was last complete */
    uint64_t csz = s->h.cluster_size;
    int ret = 0;
    pthread_mutex_lock(&w->lock);
    /* the refcounts a previous finish() wrote are replaced */
    for (uint64_t k = 0; k < w->ref_clusters; k++)
        w->rc[w->ref_start + k] = 0;
    w->ref_clusters = 0;
    /* L2 tables go after the data, so data clusters stay contiguous */
    uint8_t *be = malloc(csz);
    if (!be)
        ret = ic_error_nomem(err);
    for (uint64_t i = 0; i < s->h.l1_size && ret == 0; i++) {
        if (!w->l2[i])
            continue;
        uint64_t host = w->l2_host[i];
        if (!host && (ret = alloc_clusters(img, 1, &host, err)) == 0)
            w->l2_host[i] = host;
        for (uint64_t k = 0; k < s->l2_entries && ret == 0; k++)
            put_be64(be + k * 8, w->l2[i][k]);
        if (ret == 0)
            ret = ic_image_pwrite(s->file, be, csz, host, err);
        s->l1[i] = host | QCOW2_OFLAG_COPIED;
    }
    free(be);
    if (ret == 0 && s->h.l1_size) {
        uint8_t *l1 = calloc(1, (s->h.l1_size * 8ull + csz - 1) / csz * csz);
        if (!l1)
            ret = ic_error_nomem(err);
        for (uint64_t i = 0; ret == 0 && i < s->h.l1_size; i++)
            put_be64(l1 + i * 8, s->l1[i]);
        if (ret == 0)
            ret = ic_image_pwrite(s->file, l1, (s->h.l1_size * 8ull + csz - 1) / csz * csz,
                                  s->h.l1_table_offset, err);
        free(l1);
    }
    if (ret == 0)
        ret = write_refcounts(img, err);
    if (ret == 0)
        ret = ic_image_truncate(s->file, w->host_end, err);
    /* the metadata is durable before the header says it is complete */
    if (ret == 0 && sync)
        ret = ic_image_flush(s->file, err);
    if (ret == 0)
        ret = write_header(img, 1, err);
    if (ret == 0 && sync)
        ret = ic_image_flush(s->file, err);
    if (ret == 0)
        w->marked = 0;
    pthread_mutex_unlock(&w->lock);
    return ret;
}
