/* qcow2 writers: a new image laid out (header cluster, L1 table, then
 * whatever is appended), or an existing one opened for writing (its
 * refcounts loaded, or rebuilt when a crash left it incomplete:
 * qcow2_resume.c; its tables as they are touched). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qcow2_state.h"

static int valid_cluster_size(uint64_t c)
{
    return c >= 512 && c <= (2u << 20) && (c & (c - 1)) == 0;
}

/* A new overlay names its backing file (the image layer opened it) as the
 * caller wrote it, within the header cluster. */
static int name_backing(struct ic_image *img, const struct ic_create_options *o,
                        struct ic_error *err)
{
    struct qcow2_state *s = qcow2_state_of(img);
    size_t nlen = strlen(o->backing_file);
    snprintf(s->h.backing_name, sizeof s->h.backing_name, "%s", o->backing_file);
    snprintf(s->h.backing_format, sizeof s->h.backing_format, "%s",
             ic_image_format(img->backing));
    size_t need = QCOW2_HEADER_V3_LEN + 8 + 64 + 8 + nlen;
    if (need > s->h.cluster_size)
        return ic_error_value(err, "backing file name too long for %llu-byte clusters",
                              (unsigned long long)s->h.cluster_size);
    return 0;
}

/* Every cluster allocated now, in guest order, L2 tables first in each
 * range; the data clusters stay unwritten holes of the host file. */
static int preallocate(struct ic_image *img, struct ic_error *err)
{
    struct qcow2_state *s = qcow2_state_of(img);
    uint64_t csz = s->h.cluster_size;
    uint64_t clusters = (s->h.size + csz - 1) / csz;
    int ret = 0;
    pthread_mutex_lock(&s->meta_lock);
    for (uint64_t gc = 0; gc < clusters && ret == 0; gc++)
        ret = qcow2_ensure_clusters(img, gc * csz, (gc + 1) * csz, err);
    pthread_mutex_unlock(&s->meta_lock);
    return ret;
}

int qcow2_create_new(struct ic_image *img, int *fresh, struct ic_error *err)
{
    struct qcow2_state *s = qcow2_state_of(img);
    const struct ic_create_options *o = img->create_opts;
    uint64_t csz = o->cluster_size ? o->cluster_size : 65536;
    if (!valid_cluster_size(csz))
        return ic_error_value(err, "cluster_size must be a power of two from 512 to 2 MiB");
    struct qcow2_writer *w = s->w = calloc(1, sizeof *w);
    if (!w)
        return ic_error_nomem(err);

    struct qcow2_header *h = &s->h;
    h->version = o->compat_v2 ? 2 : 3;
    h->cluster_size = csz;
    for (h->cluster_bits = 9; (1ull << h->cluster_bits) < csz; h->cluster_bits++)
        ;
    s->l2_entries = csz / 8;
    s->unit_size = csz;
    /* the L1 table's 32 MiB (qemu's limit) bound the virtual size */
    uint64_t most = (uint64_t)(QCOW2_MAX_L1_BYTES / 8) * s->l2_entries * csz;
    if (img->size > most)
        return ic_error_value(err, "%s: a qcow2 image with %llu KiB clusters holds at most "
                              "%llu bytes, not %llu%s", img->path,
                              (unsigned long long)(csz >> 10), (unsigned long long)most,
                              (unsigned long long)img->size,
                              csz < (2u << 20) ? " (larger clusters hold more: "
                                                 "cluster_size=2M holds 2 EiB)" : "");
    /* qemu reads a qcow2 size in whole sectors: round up, as qemu-img
     * convert does (the tail past the source reads as zeros) */
    h->size = (img->size + 511) / 512 * 512;
    img->size = h->size;
    h->refcount_order = QCOW2_WRITE_REFCOUNT_ORDER;
    uint64_t clusters = (h->size + csz - 1) / csz;
    uint64_t l1 = (clusters + s->l2_entries - 1) / s->l2_entries;
    h->l1_size = (uint32_t)l1;
    w->compress = o->compress;
    h->compression_type = o->compression_zstd ? QCOW2_COMPRESSION_ZSTD : QCOW2_COMPRESSION_ZLIB;
    w->compression = qcow2_compression(h);
    w->compression_level = (int)o->compression_level;
    if (!(s->l1 = calloc(l1 ? l1 : 1, sizeof *s->l1)))
        return ic_error_nomem(err);
    s->l1_len = l1;
    if (qcow2_l2_init(img, err) < 0)
        return -1;
    /* header cluster, then the L1 table; everything else is appended */
    uint64_t l1_clusters = (l1 * 8 + csz - 1) / csz, first;
    if (ic_image_truncate(s->file, 0, err) < 0 ||
        qcow2_alloc_clusters(img, 1 + l1_clusters, &first, err) < 0)
        return -1;
    h->l1_table_offset = l1 ? csz : 0;
    /* metadata clusters own their whole disk space, as qemu's do: qemu-img
     * takes an image whose file holds fewer blocks than its refcounts say
     * for a metadata-preallocated one, and maps it differently */
    ic_image_allocate(s->file, 0, w->host_end);
    if (img->backing && name_backing(img, o, err) < 0)
        return -1;
    if (o->prealloc_metadata && preallocate(img, err) < 0)
        return -1;
    if (qcow2_write_header(img, 0, err) < 0)
        return -1;
    w->marked = 1;
    *fresh = img->backing == NULL; /* an overlay reads its backing file */
    return 0;
}

/* Writing into an image that exists: its refcounts come into memory (and
 * its old refcount structures are freed: finish() writes new ones at the
 * end), its L2 tables as they are touched; new space is appended. */
int qcow2_open_writer(struct ic_image *img, struct ic_error *err)
{
    struct qcow2_state *s = qcow2_state_of(img);
    const struct qcow2_header *h = &s->h;
    /* an image imgcopy's writer left incomplete, written on as it was
     * (an overlay too: the image layer opens its backing file) */
    int resume = (img->open_flags & IC_OPEN_RESUME) && h->incomplete;
    if (h->backing_name[0] && !resume)
        return ic_error_format(err, img->path, "writing into a qcow2 image with a backing "
                               "file is not supported yet");
    if (h->nb_snapshots)
        return ic_error_format(err, img->path, "writing into a qcow2 image with internal "
                               "snapshots is not supported");
    if (h->refcount_order != QCOW2_WRITE_REFCOUNT_ORDER)
        return ic_error_format(err, img->path, "writing into a qcow2 image with %u-bit "
                               "refcounts is not supported", 1u << h->refcount_order);
    uint64_t fsize = ic_image_size(s->file);
    struct qcow2_writer *w = s->w = calloc(1, sizeof *w);
    if (!w)
        return ic_error_nomem(err);
    w->existing = 1;
    w->compression = qcow2_compression(h);
    if (ic_image_pread(s->file, w->header, sizeof w->header < fsize ? sizeof w->header : fsize,
                       0, err) < 0)
        return -1;
    if (qcow2_l1_hold_all(img, err) < 0)
        return -1;
    w->resumed = resume;
    if (resume)
        return qcow2_resume_rebuild(img, err); /* marked incomplete already */
    return qcow2_alloc_load(img, err); /* marked incomplete at the first write */
}
