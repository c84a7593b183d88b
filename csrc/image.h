/* The image object shared by the image layer, the extent cache and the
 * drivers.  Internal: Python and tests use imgcopy.h. */
#ifndef IMGCOPY_IMAGE_H
#define IMGCOPY_IMAGE_H

#include <pthread.h>
#include <stdatomic.h>
#include <sys/types.h>

#include "driver.h"
#include "imgcopy.h"
#include "interval_map.h"

/* Deep enough for any real chain; a loop is caught long before. */
#define IC_CHAIN_MAX 64
/* Metadata a whole backing chain may hold in memory (qcow2 L1 tables). */
#define IC_CHAIN_META_BUDGET (256u << 20)
#define IC_BACKING_NAME_MAX 4096

struct ic_file_id {
    uint64_t dev, ino, rdev; /* rdev: a block device's, else 0 */
};

struct ic_image {
    const struct ic_driver *drv;
    void *drv_state;
    char *path;
    /* the tar member this image is (or whose bytes its format reads) in
     * the archive at `path`, or NULL */
    char *member;
    unsigned open_flags;
    uint64_t size;
    struct ic_image *file;    /* a format's protocol image (owned), or NULL */
    struct ic_image *backing; /* the image below (owned), or NULL */
    /* set by a format's open: its backing file as stored, and its format
     * ("": probe it) */
    char backing_name[IC_BACKING_NAME_MAX];
    char backing_format[32];
    /* the files of the backing chain from the top down to this one */
    struct ic_file_id chain[IC_CHAIN_MAX];
    /* of each: a tar member's data offset in its archive (0: a whole
     * file), as the members of one archive are different disks */
    uint64_t chain_member[IC_CHAIN_MAX];
    unsigned chain_len;
    uint64_t meta_budget; /* left for the images from here down the chain */
    unsigned lock_perm, lock_shared; /* what this image does to its chain (lock.h) */
    const struct ic_create_options *create_opts; /* during create() only */
    /* made by ic_image_create() reading as zeros, and not written since */
    atomic_int fresh;

    /* extent cache (extent_cache.c) */
    pthread_mutex_t cache_lock;
    struct ic_interval_map cache;
    struct ic_extent_list walk; /* scratch for driver answers, under cache_lock */
    atomic_uint_fast64_t cache_hits;
    atomic_uint_fast64_t cache_misses;
    atomic_uint_fast64_t lseek_calls; /* counted by drivers */
};

/* Whether the image still reads as the zeros ic_image_create() made; a
 * write (or a copy into it) makes it not. */
int ic_image_fresh(const struct ic_image *img);
void ic_image_written(struct ic_image *img);

/* Reserve metadata memory from the chain's budget; -1 when it is spent. */
int ic_image_take_meta_budget(struct ic_image *img, uint64_t bytes);

/* For format drivers: guest bytes of [off, off+len) their layer does not
 * hold, from the backing file (zeros past its end, or without one). */
int ic_image_read_below(struct ic_image *img, void *buf, size_t len, uint64_t off,
                        struct ic_error *err);
/* For format drivers: [off, off+len) of `file`, what lies past its end
 * reading as zeros (as qemu reads a protocol past its end). */
int ic_image_pread_padded(struct ic_image *file, void *buf, size_t len, uint64_t off,
                          struct ic_error *err);
/* For format drivers: the host reads of one request, gathered and handed
 * to the protocol together (driver.h: pread_runs) so that scattered
 * clusters are read concurrently, not one after another.  Runs of another
 * file, or more than IC_READ_RUNS_MAX, flush what is gathered first; a run
 * continuing the last one (in the file and in memory) joins it.  Every
 * buffer stays the caller's to fill until ic_read_batch_flush() returned,
 * which the caller calls before using them; ranges are checked there (as
 * ic_image_pread checks them).  _padded: what lies past the end of the
 * file reads as zeros (as ic_image_pread_padded). */
struct ic_read_batch {
    struct ic_image *file;
    size_t n;
    struct ic_read_run runs[IC_READ_RUNS_MAX];
};
void ic_read_batch_init(struct ic_read_batch *b);
int ic_read_batch_add(struct ic_read_batch *b, struct ic_image *file, void *buf, size_t len,
                      uint64_t off, struct ic_error *err);
int ic_read_batch_add_padded(struct ic_read_batch *b, struct ic_image *file, void *buf,
                             size_t len, uint64_t off, struct ic_error *err);
int ic_read_batch_flush(struct ic_read_batch *b, struct ic_error *err);
/* The runs read at once (bounds checked), by the protocol's pread_runs or
 * one after another; the batch's way to its protocol, and a protocol's
 * (a tar member's) to the one below it. */
int ic_image_pread_runs(struct ic_image *file, const struct ic_read_run *runs, size_t n,
                        struct ic_error *err);
/* For format drivers' describe: one of qemu-img info's "format-specific"
 * fields, appended (`number` for INT and BOOL, `text` for STRING). */
void ic_image_info_add(struct ic_image_info *out, const char *key, enum ic_info_kind kind,
                       int64_t number, const char *text);
/* For format drivers, of their protocol image (img->file): */
/* The extent at guest offset `start`, at most `len` long, of data stored
 * at `host` in `file`: data, and zeros where the file reads as zeros (a
 * hole; past its end, all of `len`), as qemu's BDRV_BLOCK_RECURSE. */
int ic_image_data_status(struct ic_image *file, uint64_t start, uint64_t host, uint64_t len,
                         struct ic_extent *out, struct ic_error *err);
int ic_image_truncate(struct ic_image *file, uint64_t size, struct ic_error *err);
void ic_image_allocate(struct ic_image *file, uint64_t off, uint64_t len);
uint64_t ic_image_allocated_bytes(struct ic_image *file);
int ic_image_reads_as_hole(struct ic_image *file, uint64_t off, uint64_t len);

/* For format drivers whose guest data lives in several files (a vmdk's
 * extents): open `name`, as the image's own file names it (relative to its
 * directory), as a read-only protocol image locked as img->file is.  A
 * name that leaves the image's directory (absolute, with "..", or through
 * a symbolic link), or a device node, is a format error unless the image
 * was opened with IC_OPEN_EXTERNAL_FILES; so, always, is the image's own
 * file.
 * An image that is a tar member finds its extent files as other members
 * of the same archive (relative names only, whatever the flags say).
 * The caller owns *out (ic_image_close). */
int ic_image_open_extent_file(struct ic_image *img, const char *name, struct ic_image **out,
                              struct ic_error *err);

/* Asynchronous reads and writes, where the image's driver has them (an
 * NBD export read or written as raw): 1 submitted (`done` runs once, on
 * any thread, perhaps already), 0 not for this image or range (do it
 * synchronously), -1 with `err` (`done` never runs).  A write's `buf` is
 * the caller's until `done`. */
int ic_image_aio_pread(struct ic_image *img, void *buf, size_t len, uint64_t off,
                       ic_aio_done_fn *done, void *ctx, struct ic_error *err);
int ic_image_aio_pwrite(struct ic_image *img, const void *buf, size_t len, uint64_t off,
                        ic_aio_done_fn *done, void *ctx, struct ic_error *err);
/* Whether the image reads (writes) asynchronously at all */
int ic_image_aio_reads(const struct ic_image *img);
int ic_image_aio_writes(const struct ic_image *img);
/* What a round trip costs, in bytes one could read meanwhile (0: local,
 * requests are cheap): a hole this short is better read than asked
 * around.  And how many requests the image keeps in flight (0: it has
 * no asynchronous I/O). */
uint64_t ic_image_request_cost(const struct ic_image *img);
unsigned ic_image_requests_in_flight(const struct ic_image *img);
/* After ic_image_request_cost(): 1 when the endpoint was seen answering
 * one request after another (a VDDK-like server) */
int ic_image_serialises(const struct ic_image *img);

/* Internal to the image layer (image.c, image_io.c). */
struct ic_image *ic_image_new(const char *path, const struct ic_driver *drv, unsigned flags,
                              uint64_t size);
void ic_image_free(struct ic_image *img);

int ic_cache_init(struct ic_image *img);
void ic_cache_destroy(struct ic_image *img);
/* What a format's layer does not hold (IC_EXT_BELOW), [start, end):
 * extents appended to `out` that cover it (image_io.c asks the backing
 * chain), so that the cache knows nothing of the chain. */
typedef int ic_status_below_fn(struct ic_image *img, uint64_t start, uint64_t end,
                               struct ic_extent_list *out, struct ic_error *err);
/* The extent at `off`, at most `len` long, from memory or the driver (and
 * `below`, for what a format's layer does not hold). */
int ic_cache_block_status(struct ic_image *img, uint64_t off, uint64_t len,
                          ic_status_below_fn *below, struct ic_extent *out,
                          struct ic_error *err);
/* Driver hooks after they changed the image. */
void ic_cache_note(struct ic_image *img, const struct ic_extent *e);        /* now known to be e */
void ic_cache_note_if_known(struct ic_image *img, const struct ic_extent *e);
void ic_cache_forget(struct ic_image *img, uint64_t start, uint64_t end);

#endif
