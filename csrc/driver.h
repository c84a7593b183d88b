/* What a format or protocol driver provides to the image layer.  Every
 * operation returns 0 or -1 with details in `err`; none exits or prints. */
#ifndef IMGCOPY_DRIVER_H
#define IMGCOPY_DRIVER_H

#include <stdint.h>
#include <sys/stat.h>

#include "imgcopy.h"

struct ic_image;

struct ic_driver {
    const char *name; /* probe.c recognises the format's files */
    /* Fill img->drv_state and img->size.  `fd` becomes the driver's, which
     * closes it on failure too. */
    int (*open)(struct ic_image *img, int fd, struct ic_error *err);
    /* Lay out a new image of img->size bytes in `fd` (an empty regular
     * file, or a block device to reuse); set *fresh when it reads as zeros.
     * NULL for formats that cannot be written. */
    int (*create)(struct ic_image *img, int fd, int *fresh, struct ic_error *err);
    void (*close)(struct ic_image *img);
    /* Thread-safe for concurrent calls; ranges are inside the image. */
    int (*pread)(struct ic_image *img, void *buf, size_t len, uint64_t off,
                 struct ic_error *err);
    int (*pwrite)(struct ic_image *img, const void *buf, size_t len, uint64_t off,
                  struct ic_error *err);
    int (*zero)(struct ic_image *img, uint64_t off, uint64_t len, unsigned flags,
                struct ic_error *err);
    int (*flush)(struct ic_image *img, struct ic_error *err);
    /* Optional staged writes (see ic_staged_write); without them commit
     * is one pwrite. */
    int (*stage)(struct ic_image *img, struct ic_staged_write *w, struct ic_error *err);
    int (*place)(struct ic_image *img, struct ic_staged_write *w, struct ic_error *err);
    int (*commit)(struct ic_image *img, struct ic_staged_write *w, struct ic_error *err);
    void (*unstage)(struct ic_image *img, struct ic_staged_write *w);
    /* Optional page-cache hints: `written` = the range was written earlier
     * and writeback was started; wait for it and drop its pages.  `read` =
     * the range will not be read again. */
    void (*settle_written)(struct ic_image *img, uint64_t off, uint64_t len);
    void (*settle_read)(struct ic_image *img, uint64_t off, uint64_t len);
    /* Optional: the internal snapshots found at open. */
    int (*snapshots)(struct ic_image *img, const struct ic_snapshot **out, size_t *count);
    /* Optional: write what is held in memory and mark the image complete. */
    int (*finish)(struct ic_image *img, int sync, struct ic_error *err);
    /* Optional: writes must cover whole units of this size. */
    uint64_t (*write_alignment)(const struct ic_image *img);
    /* Optional: copy in the kernel to another image of the same driver;
     * -1 with errnum ENOTSUP when it cannot. */
    int (*copy_range)(struct ic_image *src, struct ic_image *dst, uint64_t off, uint64_t len,
                      struct ic_error *err);
    /* Append contiguous extents starting exactly at `start`, never past
     * `end`, covering `want` and, cheaply, more after it: the caller holds
     * the cache lock and records everything appended. */
    int (*block_status)(struct ic_image *img, uint64_t start, uint64_t end, uint64_t want,
                        struct ic_extent_list *out, struct ic_error *err);
    /* block_status is as cheap at any offset as after the last answer:
     * the cache asks from the query, not from the start of the gap. */
    int random_access_status;
};

extern const struct ic_driver ic_driver_raw;
extern const struct ic_driver ic_driver_qcow2;
extern const struct ic_driver ic_driver_null;

/* fstat of a raw image's file (qcow2 asks how much of it is allocated). */
int ic_raw_fstat(struct ic_image *img, struct stat *st);
/* Give [off, off+len) of a raw image's file disk space (a hint). */
void ic_raw_allocate(struct ic_image *img, uint64_t off, uint64_t len);
/* Grow or shrink a raw image's file (a qcow2 host file as it fills). */
int ic_raw_resize(struct ic_image *img, uint64_t size, struct ic_error *err);

#endif
