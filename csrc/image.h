/* The image object shared by the image layer, the extent cache and the
 * drivers.  Internal: Python and tests use imgcopy.h. */
#ifndef IMGCOPY_IMAGE_H
#define IMGCOPY_IMAGE_H

#include <pthread.h>
#include <sys/types.h>
#include <stdatomic.h>

#include "driver.h"
#include "imgcopy.h"
#include "interval_map.h"

/* Deep enough for any real chain; a loop is caught long before. */
#define IC_CHAIN_MAX 64
/* Metadata a whole backing chain may hold in memory (qcow2 L1 tables). */
#define IC_CHAIN_META_BUDGET (256u << 20)

struct ic_image {
    const struct ic_driver *drv;
    void *drv_state;
    char *path;
    char *tmp_path;  /* IC_CREATE_ATOMIC: written here until finished, */
    char *rename_to; /* then renamed over this (`path`, through symlinks) */
    int guard_fd;    /* the file rename_to names, locked until then, or -1 */
    unsigned lock_perm, lock_shared; /* what this image does to its chain (lock.h) */
    unsigned open_flags;
    uint64_t size;
    /* the files of the backing chain from the top down to this one */
    struct {
        dev_t dev;
        ino_t ino;
        dev_t rdev; /* a block device's, else 0 */
    } chain[IC_CHAIN_MAX];
    unsigned chain_len;
    uint64_t meta_budget; /* left for the images from here down the chain */
    struct ic_image *backing; /* owned by the driver; set by it */
    const struct ic_create_options *create_opts; /* during create() only */

    /* extent cache (extent_cache.c) */
    pthread_mutex_t cache_lock;
    struct ic_interval_map cache;
    struct ic_extent_list walk; /* scratch for driver answers, under cache_lock */
    atomic_uint_fast64_t cache_hits;
    atomic_uint_fast64_t cache_misses;
    atomic_uint_fast64_t lseek_calls; /* counted by drivers */
};

/* For drivers: open a backing file read-only, below `overlay` in its
 * chain; wrap a file descriptor as a raw image (the host file of qcow2). */
int ic_image_open_backing(const struct ic_image *overlay, const char *path, const char *format,
                          struct ic_image **out, struct ic_error *err);
int ic_image_wrap_fd(const struct ic_image *owner, int fd, struct ic_image **out,
                     struct ic_error *err);

/* Reserve metadata memory from the chain's budget; -1 when it is spent. */
int ic_image_take_meta_budget(struct ic_image *img, uint64_t bytes);

int ic_cache_init(struct ic_image *img);
void ic_cache_destroy(struct ic_image *img);
/* The extent at `off`, at most `len` long, from memory or the driver. */
int ic_cache_block_status(struct ic_image *img, uint64_t off, uint64_t len,
                          struct ic_extent *out, struct ic_error *err);
/* Driver hooks after they changed the image. */
void ic_cache_note(struct ic_image *img, const struct ic_extent *e);        /* now known to be e */
void ic_cache_note_if_known(struct ic_image *img, const struct ic_extent *e);
void ic_cache_forget(struct ic_image *img, uint64_t start, uint64_t end);

#endif
