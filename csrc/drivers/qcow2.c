/* qcow2 (docs/interop/qcow2.txt in QEMU): the driver's state from open or
 * create to close, and its table of operations.  The parts, by data
 * structure, are listed in qcow2_state.h. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qcow2_state.h"

static struct qcow2_state *state_new(struct ic_image *img, struct ic_error *err)
{
    struct qcow2_state *s = calloc(1, sizeof *s);
    if (!s) {
        ic_error_nomem(err);
        return NULL;
    }
    pthread_mutex_init(&s->meta_lock, NULL);
    pthread_mutex_init(&s->prealloc_lock, NULL);
    pthread_mutex_init(&s->dirty_lock, NULL);
    pthread_mutex_init(&s->checkpoint_lock, NULL);
    s->file = img->file;
    img->drv_state = s;
    return s;
}

static void qcow2_close(struct ic_image *img)
{
    struct qcow2_state *s = qcow2_state_of(img);
    if (!s)
        return;
    qcow2_l2_free(s);
    if (s->w) {
        qcow2_alloc_free(s->w);
        qcow2_new_bitmaps_free(s->w);
        free(s->w);
    }
    free(s->l1);
    free(s->snapshots);
    free(s->bitmaps);
    free(s->bitmap_names);
    free(s->snapshot_extra);
    qcow2_dirty_free(s);
    pthread_mutex_destroy(&s->meta_lock);
    pthread_mutex_destroy(&s->prealloc_lock);
    pthread_mutex_destroy(&s->dirty_lock);
    pthread_mutex_destroy(&s->checkpoint_lock);
    free(s);
    img->drv_state = NULL;
}

/* The L1 table, read as qemu reads it at open: the whole table, zeros past
 * the end of the file, an error past the largest offset qemu reads.  Only
 * its entries inside the file are held (s->l1_len): the others are zeros,
 * so that a table of 4 M entries claimed by a file of a few KiB costs what
 * the file holds. */
static int load_l1(struct ic_image *img, struct qcow2_state *s, uint64_t fsize,
                   struct ic_error *err)
{
    uint64_t off = s->h.l1_table_offset, n = s->h.l1_size;
    if (!n)
        return 0;
    if (off > QCOW2_MAX_OFFSET || n * 8 > QCOW2_MAX_OFFSET - off)
        return qcow2_corrupt(img, err, "unreadable L1 table", off);
    s->l1_len = qcow2_entries_in_file(fsize, off, n);
    if (!s->l1_len)
        return 0;
    if (ic_image_take_meta_budget(img, s->l1_len * 8) < 0)
        return ic_error_format(err, img->path, "the backing chain's L1 tables need more "
                               "than %u MiB of memory", IC_CHAIN_META_BUDGET >> 20);
    s->l1 = malloc(s->l1_len * 8);
    if (!s->l1)
        return ic_error_nomem(err);
    if (qcow2_read_meta(img, s->l1, s->l1_len * 8, off, "unreadable L1 table", err) < 0)
        return -1;
    for (uint64_t i = 0; i < s->l1_len; i++)
        s->l1[i] = qcow2_be64(&s->l1[i]);
    return 0;
}

static int load(struct ic_image *img, struct qcow2_state *s, struct ic_error *err)
{
    uint8_t *cluster0 = NULL;
    uint64_t fsize = ic_image_size(s->file);
    uint8_t head[QCOW2_HEADER_READ];
    memset(head, 0, sizeof head);
    uint64_t nhead = fsize < sizeof head ? fsize : sizeof head;
    if (nhead < QCOW2_HEADER_V2_LEN)
        return ic_error_format(err, img->path, "truncated qcow2 header (%llu bytes)",
                               (unsigned long long)fsize);
    if (ic_image_pread(s->file, head, (size_t)nhead, 0, err) < 0)
        return -1;
    int resume = (img->open_flags & IC_OPEN_RESUME) && (img->open_flags & IC_OPEN_RDWR);
    if (qcow2_parse_header_as(head, nhead, resume ? QCOW2_PARSE_INCOMPLETE : 0, &s->h,
                              img->path, err) < 0)
        return -1;

    /* the header cluster: extensions and the backing file name live there */
    uint64_t n0 = fsize < s->h.cluster_size ? fsize : s->h.cluster_size;
    cluster0 = calloc(1, s->h.cluster_size);
    if (!cluster0)
        return ic_error_nomem(err);
    if (ic_image_pread(s->file, cluster0, (size_t)n0, 0, err) < 0 ||
        qcow2_parse_extensions(cluster0, s->h.cluster_size, &s->h, img->path, err) < 0) {
        free(cluster0);
        return -1;
    }
    free(cluster0);
    /* the marks of an image imgcopy's writer left incomplete are what a
     * resumed writer expects (it rebuilds the refcounts, then finishes) */
    uint64_t incompatible = s->h.incompatible;
    if (resume && s->h.incomplete)
        s->h.incompatible &= ~(uint64_t)(QCOW2_INCOMPAT_DIRTY | QCOW2_INCOMPAT_CORRUPT);
    int features = qcow2_check_features(&s->h, (img->open_flags & IC_OPEN_FORCE) != 0,
                                        (img->open_flags & IC_OPEN_RDWR) != 0, img->path, err);
    s->h.incompatible = incompatible;
    if (features < 0)
        return -1;

    /* qemu sees whole 512-byte sectors of the virtual size */
    img->size = s->h.size / 512 * 512;
    s->extl2 = (s->h.incompatible & QCOW2_INCOMPAT_EXTL2) != 0;
    s->l2_entries = s->h.cluster_size / (s->extl2 ? 16 : 8);
    s->unit_size = s->extl2 ? s->h.cluster_size / QCOW2_SUBCLUSTERS : s->h.cluster_size;
    if (load_l1(img, s, fsize, err) < 0 || qcow2_load_snapshots(img, err) < 0 ||
        qcow2_load_bitmaps(img, err) < 0)
        return -1;

    if (qcow2_l2_init(img, err) < 0)
        return -1;

    /* the image layer opens the backing file this image names */
    snprintf(img->backing_name, sizeof img->backing_name, "%s", s->h.backing_name);
    snprintf(img->backing_format, sizeof img->backing_format, "%s", s->h.backing_format);
    return 0;
}

static int qcow2_open(struct ic_image *img, struct ic_error *err)
{
    struct qcow2_state *s = state_new(img, err);
    if (!s)
        return -1;
    if (load(img, s, err) < 0 ||
        ((img->open_flags & IC_OPEN_RDWR) && qcow2_open_writer(img, err) < 0)) {
        qcow2_close(img);
        return -1;
    }
    return 0;
}

static int qcow2_create(struct ic_image *img, int *fresh, struct ic_error *err)
{
    if (!state_new(img, err))
        return -1;
    if (qcow2_create_new(img, fresh, err) < 0) {
        qcow2_close(img);
        return -1;
    }
    return 0;
}

/* qemu-img info's qcow2 "format-specific" (qemu 7.2's keys and order;
 * external data files are not supported, so never reported). */
static void qcow2_describe(struct ic_image *img, struct ic_image_info *out)
{
    const struct qcow2_header *h = &qcow2_state_of(img)->h;
    int v3 = h->version >= 3;
    out->cluster_size = h->cluster_size;
    out->may_hold_compressed = 1;
    out->stores_bitmaps = v3; /* the bitmaps extension is a v3 feature */
    out->dirty = (h->incompatible & QCOW2_INCOMPAT_DIRTY) != 0;
    out->has_backing = h->backing_name[0] != '\0';
    snprintf(out->backing_name, sizeof out->backing_name, "%s", h->backing_name);
    snprintf(out->backing_format, sizeof out->backing_format, "%s", h->backing_format);
    ic_image_info_add(out, "compat", IC_INFO_STRING, 0, v3 ? "1.1" : "0.10");
    ic_image_info_add(out, "compression-type", IC_INFO_STRING, 0,
                      h->compression_type == 1 ? "zstd" : "zlib");
    if (v3)
        ic_image_info_add(out, "lazy-refcounts", IC_INFO_BOOL,
                          (h->compatible & QCOW2_COMPAT_LAZY_REFCOUNTS) != 0, NULL);
    /* qemu lists them only when there are some */
    size_t nbitmaps = qcow2_bitmaps(img, NULL, 0);
    if (nbitmaps)
        ic_image_info_add(out, "bitmaps", IC_INFO_BITMAPS, (int64_t)nbitmaps, NULL);
    ic_image_info_add(out, "refcount-bits", IC_INFO_INT, 1ll << h->refcount_order, NULL);
    if (v3) {
        ic_image_info_add(out, "corrupt", IC_INFO_BOOL,
                          (h->incompatible & QCOW2_INCOMPAT_CORRUPT) != 0, NULL);
        ic_image_info_add(out, "extended-l2", IC_INFO_BOOL,
                          (h->incompatible & QCOW2_INCOMPAT_EXTL2) != 0, NULL);
    }
}

const struct ic_driver ic_format_qcow2 = {
    .name = "qcow2",
    .kind = IC_FORMAT,
    .open = qcow2_open,
    .create = qcow2_create,
    .close = qcow2_close,
    .pread = qcow2_pread,
    .pwrite = qcow2_pwrite,
    .zero = qcow2_zero,
    .flush = qcow2_flush,
    .checkpoint = qcow2_checkpoint,
    .block_status = qcow2_block_status,
    .random_access_status = 1,
    .stage = qcow2_stage,
    .place = qcow2_place,
    .commit = qcow2_commit,
    .unstage = qcow2_unstage,
    .finish = qcow2_finish,
    .snapshots = qcow2_snapshots,
    .bitmaps = qcow2_bitmaps,
    .dirty_status = qcow2_dirty_status,
    .add_bitmap = qcow2_add_bitmap,
    .describe = qcow2_describe,
    .check = qcow2_check,
    .write_alignment = qcow2_write_alignment,
};
