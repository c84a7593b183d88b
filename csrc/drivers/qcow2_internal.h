/* Shared by the qcow2 reader (qcow2.c) and writer (qcow2_write.c). */
#ifndef IMGCOPY_QCOW2_INTERNAL_H
#define IMGCOPY_QCOW2_INTERNAL_H

#include <pthread.h>

#include "../image.h"
#include "qcow2_format.h"

/* L2 tables kept in memory, whatever the cluster size. */
#define L2_CACHE_BYTES (32u << 20)
#define L2_CACHE_MIN_SLOTS 4u
#define L2_CACHE_MAX_SLOTS 256u
/* Clusters a block-status walk classifies past the one asked for. */
#define WALK_EXTRA_CLUSTERS 4096u

struct l2_slot {
    uint64_t offset; /* host offset of the table; 0 = empty slot */
    uint64_t used;   /* LRU tick */
    uint64_t *entries;
};

struct qcow2_state {
    struct qcow2_header h;
    struct ic_image *file;    /* the host file: img->file, the image layer's */
    uint64_t *l1;             /* host byte order */
    uint64_t l2_entries;      /* entries per L2 table */

    pthread_mutex_t l2_lock;
    struct l2_slot *slots;
    unsigned nslots;
    uint64_t tick;

    /* qemu asks the host file about holes under data clusters only when
     * the image looks metadata-preallocated; decided on first use */
    pthread_mutex_t prealloc_lock;
    int prealloc_checked;
    int prealloc;

    struct qcow2_writer *w; /* a new image being written, or NULL */

    struct ic_snapshot *snapshots; /* the snapshot table, read at open */
    size_t nsnapshots;
};



static inline struct qcow2_state *qcow2_state_of(struct ic_image *img)
{
    return img->drv_state;
}

/* qcow2.c: metadata of the host file; reads past its end return zeros,
 * as qemu's do. */
int qcow2_read_meta(struct ic_image *img, void *buf, uint64_t len, uint64_t off,
                    const char *what, struct ic_error *err);

/* qcow2_tables.c: the snapshot table and the bitmap directory, read and
 * checked at open as qemu does. */
int qcow2_load_snapshots(struct ic_image *img, struct ic_error *err);
int qcow2_check_bitmaps(struct ic_image *img, struct ic_error *err);
int qcow2_snapshots(struct ic_image *img, const struct ic_snapshot **out, size_t *count);

/* qcow2_write.c */
struct qcow2_writer;
int qcow2_create(struct ic_image *img, int *fresh, struct ic_error *err);
/* In-memory L2 entries of a writable image; returns 0 and sets *found=0
 * when the table was never loaded (the reader then asks the file). */
int qcow2_writer_l2(struct qcow2_state *s, uint64_t gc, uint64_t n, uint64_t *out, int *found);
int qcow2_writer_has_table(struct qcow2_state *s, uint64_t l1_index);
int qcow2_stage(struct ic_image *img, struct ic_staged_write *w, struct ic_error *err);
int qcow2_place(struct ic_image *img, struct ic_staged_write *w, struct ic_error *err);
int qcow2_commit(struct ic_image *img, struct ic_staged_write *w, struct ic_error *err);
void qcow2_unstage(struct ic_image *img, struct ic_staged_write *w);
int qcow2_write(struct ic_image *img, const void *buf, size_t len, uint64_t off,
                struct ic_error *err);
int qcow2_write_zeroes(struct ic_image *img, uint64_t off, uint64_t len, struct ic_error *err);
int qcow2_finish(struct ic_image *img, int sync, struct ic_error *err);
int qcow2_open_writer(struct ic_image *img, struct ic_error *err);
/* qcow2.c: the backing's data of guest cluster gc, into host cluster `host`. */
int qcow2_copy_from_backing(struct ic_image *img, uint64_t gc, uint64_t host,
                            struct ic_error *err);
/* qcow2.c: inflate the compressed cluster `entry` into host cluster `host`. */
int qcow2_copy_compressed(struct ic_image *img, uint64_t entry, uint64_t host,
                          struct ic_error *err);
void qcow2_writer_free(struct qcow2_writer *w, uint64_t l1_size);
uint64_t qcow2_write_alignment(const struct ic_image *img);

#endif
