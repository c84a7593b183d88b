/* Refcounts and host allocation.  A writer keeps one refcount per host
 * cluster in memory and appends: new clusters at the end of the file in
 * the order they are asked for, compressed clusters packed after each
 * other.  finish() writes the refcount structures once, after the data. */
#include <stdlib.h>
#include <string.h>

#include "qcow2_state.h"

/* The host file grows in steps, not one ftruncate per cluster. */
#define GROW_STEP (64ull << 20)

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
    struct qcow2_state *s = qcow2_state_of(img);
    struct qcow2_writer *w = s->w;
    if (grow_refcounts(w, end / s->h.cluster_size + 1) < 0)
        return ic_error_nomem(err);
    if (end <= w->file_size)
        return 0;
    uint64_t size = end + GROW_STEP;
    if (ic_image_truncate(s->file, size, err) < 0)
        return -1;
    w->file_size = size;
    return 0;
}

int qcow2_alloc_load(struct ic_image *img, struct ic_error *err)
{
    struct qcow2_state *s = qcow2_state_of(img);
    struct qcow2_writer *w = s->w;
    const struct qcow2_header *h = &s->h;
    uint64_t csz = h->cluster_size, fsize = ic_image_size(s->file);
    uint64_t table_bytes = (uint64_t)h->refcount_table_clusters * csz;
    uint64_t per_block = csz * 8 / 16;
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
            uint64_t v = qcow2_refcount_entry(block, k, 16);
            if (v && cl >= w->rc_len && grow_refcounts(w, cl + 1) < 0)
                ret = ic_error_nomem(err);
            else if (cl < w->rc_len)
                w->rc[cl] = (uint16_t)v;
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
    return 0;
}

int qcow2_alloc_adopt(struct ic_image *img, uint16_t *rc, uint64_t rc_len, uint64_t end,
                      struct ic_error *err)
{
    struct qcow2_state *s = qcow2_state_of(img);
    struct qcow2_writer *w = s->w;
    free(w->rc);
    w->rc = rc;
    w->rc_len = rc_len;
    w->comp_cursor = 0;
    w->ref_start = w->ref_clusters = 0;
    /* what lies past `end` is no cluster of the image: new clusters there
     * read as zeros, as a new image's do */
    if (ic_image_truncate(s->file, end, err) < 0)
        return -1;
    w->host_end = end;
    w->file_size = end;
    return 0;
}

int qcow2_alloc_clusters(struct ic_image *img, uint64_t n, uint64_t *host, struct ic_error *err)
{
    struct qcow2_state *s = qcow2_state_of(img);
    struct qcow2_writer *w = s->w;
    uint64_t csz = s->h.cluster_size;
    if (cover(img, w->host_end + n * csz, err) < 0)
        return -1;
    *host = w->host_end;
    for (uint64_t i = 0; i < n; i++)
        w->rc[w->host_end / csz + i] = 1;
    w->host_end += n * csz;
    return 0;
}

/* Packed after the previous compressed cluster (qemu's alloc_bytes): in
 * the rest of its host cluster when it fits there, even after whole
 * clusters were allocated since, and running on into fresh clusters only
 * when they follow that one; else from a fresh cluster. */
int qcow2_alloc_bytes(struct ic_image *img, uint64_t len, uint64_t *host, struct ic_error *err)
{
    struct qcow2_state *s = qcow2_state_of(img);
    struct qcow2_writer *w = s->w;
    uint64_t csz = s->h.cluster_size;
    uint64_t start = w->comp_cursor;
    if (start && w->rc[start / csz] == QCOW2_REFCOUNT_MAX)
        start = 0;
    if (start) {
        uint64_t cluster_end = (start / csz + 1) * csz;
        if (len > cluster_end - start && cluster_end != w->host_end)
            start = 0;
    }
    if (!start)
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

void qcow2_release_cluster(struct qcow2_state *s, uint64_t host)
{
    uint64_t cl = host / s->h.cluster_size;
    if (cl < s->w->rc_len && s->w->rc[cl])
        s->w->rc[cl]--;
}

void qcow2_release_compressed(struct qcow2_state *s, uint64_t entry)
{
    uint64_t csz = s->h.cluster_size, host, len;
    qcow2_compressed_decode(&s->h, entry, &host, &len);
    for (uint64_t cl = host / csz; cl <= (host + len - 1) / csz; cl++)
        qcow2_release_cluster(s, cl * csz);
}

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

/* In clusters an earlier session freed when they fit (so that a stable
 * workload keeps a stable file size), else at the end; the structures a
 * previous finish() wrote are replaced. */
int qcow2_write_refcounts(struct ic_image *img, struct ic_error *err)
{
    struct qcow2_state *s = qcow2_state_of(img);
    struct qcow2_writer *w = s->w;
    uint64_t csz = s->h.cluster_size;
    for (uint64_t k = 0; k < w->ref_clusters; k++)
        w->rc[w->ref_start + k] = 0;
    w->ref_clusters = 0;
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
        if (qcow2_alloc_clusters(img, table, &table_off, err) < 0 ||
            qcow2_alloc_clusters(img, blocks, &blocks_off, err) < 0)
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
        qcow2_put_be64(buf + b * 8, blocks_off + b * csz);
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

void qcow2_alloc_free(struct qcow2_writer *w)
{
    free(w->rc);
    w->rc = NULL;
    w->rc_len = 0;
}

/* qemu's qcow2_detect_metadata_preallocation counts refcounted clusters
 * against the blocks the file has allocated. */
int qcow2_count_refcounted(struct ic_image *img, uint64_t end_cluster, uint64_t threshold,
                           uint64_t *count)
{
    struct qcow2_state *s = qcow2_state_of(img);
    struct ic_error err;
    uint64_t csz = s->h.cluster_size;
    unsigned bits = 1u << s->h.refcount_order;
    uint64_t per_block = csz * 8 / bits;
    uint64_t table_bytes = (uint64_t)s->h.refcount_table_clusters * csz;
    if (table_bytes > QCOW2_MAX_REFTABLE_BYTES)
        return -1;
    /* the entries of the first end_cluster clusters, not the whole table
     * (up to 8 MiB, mostly past the end of a small file) */
    uint64_t need = end_cluster / per_block + (end_cluster % per_block != 0);
    uint64_t entries = table_bytes / 8 < need ? table_bytes / 8 : need;
    uint64_t *table = malloc(entries ? entries * 8 : 1);
    uint8_t *block = malloc(csz);
    int ret = -1;
    if (!table || !block ||
        qcow2_read_meta(img, table, entries * 8, s->h.refcount_table_offset, "refcount table",
                        &err))
        goto out;
    *count = 0;
    for (uint64_t i = 0; i < end_cluster && *count < threshold;) {
        uint64_t ti = i / per_block;
        if (ti >= entries)
            break;
        uint64_t boff = qcow2_be64(&table[ti]) & QCOW2_OFFSET_MASK;
        uint64_t first = i, last = (ti + 1) * per_block;
        if (last > end_cluster)
            last = end_cluster;
        i = last;
        if (!boff)
            continue;
        if (qcow2_read_meta(img, block, csz, boff, "refcount block", &err) < 0)
            goto out;
        for (uint64_t k = first; k < last && *count < threshold; k++)
            *count += qcow2_refcount_entry(block, k % per_block, bits) != 0;
    }
    ret = 0;
out:
    free(table);
    free(block);
    return ret;
}
