/* imgcopy core: the plain C API used by the Python glue, the C unit tests
 * and the fuzzers.  No Python here.
 *
 * Conventions: functions return 0 (or a non-negative count) on success and
 * -1 on failure, with details in the caller's struct ic_error. */
#ifndef IMGCOPY_H
#define IMGCOPY_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"

/* Extent flags, qemu-img map's vocabulary. */
enum {
    IC_EXT_DATA = 1u << 0,         /* reads come from this image's storage  */
    IC_EXT_ZERO = 1u << 1,         /* reads return zeros                    */
    IC_EXT_PRESENT = 1u << 2,      /* allocated at `depth` of the chain     */
    IC_EXT_OFFSET_VALID = 1u << 3, /* host_offset means something           */
    IC_EXT_COMPRESSED = 1u << 4,
};

struct ic_extent {
    uint64_t start;
    uint64_t length;
    uint64_t host_offset; /* host offset of `start`, if IC_EXT_OFFSET_VALID */
    uint32_t flags;
    uint32_t depth;
};

struct ic_extent_list {
    struct ic_extent *items;
    size_t count;
    size_t capacity;
};

int ic_extent_list_push(struct ic_extent_list *list, const struct ic_extent *e);
void ic_extent_list_free(struct ic_extent_list *list);

/* Open flags. */
enum {
    IC_OPEN_RDWR = 1u << 0,
};

struct ic_image;

struct ic_cache_stats {
    uint64_t hits;        /* block-status queries answered from memory  */
    uint64_t misses;      /* queries that had to ask the driver         */
    uint64_t lseek_calls; /* SEEK_DATA / SEEK_HOLE system calls made    */
    uint64_t intervals;   /* known intervals currently held             */
};

/* format: NULL probes; otherwise a driver name ("raw"). */
int ic_image_open(const char *path, const char *format, unsigned flags,
                  struct ic_image **out, struct ic_error *err);
void ic_image_close(struct ic_image *img);

uint64_t ic_image_size(const struct ic_image *img);
const char *ic_image_format(const struct ic_image *img);
const char *ic_image_path(const struct ic_image *img);
int ic_image_writable(const struct ic_image *img);

/* The extent starting at `offset`, at most `length` bytes long.
 * offset + length must lie inside the image and length must be > 0. */
int ic_image_block_status(struct ic_image *img, uint64_t offset, uint64_t length,
                          struct ic_extent *out, struct ic_error *err);

/* Extents of [start, end), neighbours merged as qemu-img map merges them. */
int ic_image_map(struct ic_image *img, uint64_t start, uint64_t end,
                 struct ic_extent_list *out, struct ic_error *err);

int ic_image_pread(struct ic_image *img, void *buf, size_t len, uint64_t offset,
                   struct ic_error *err);
int ic_image_pwrite(struct ic_image *img, const void *buf, size_t len, uint64_t offset,
                    struct ic_error *err);

/* Zero flags. */
enum {
    IC_ZERO_MAY_UNMAP = 1u << 0, /* a hole is fine                           */
    IC_ZERO_FAST = 1u << 1,      /* fail with ENOTSUP rather than write zeros */
};
int ic_image_zero(struct ic_image *img, uint64_t offset, uint64_t length, unsigned flags,
                  struct ic_error *err);
int ic_image_flush(struct ic_image *img, struct ic_error *err);

void ic_image_cache_stats(struct ic_image *img, struct ic_cache_stats *out);
void ic_image_drop_cache(struct ic_image *img);

/* qemu-img map output.  `tail_end` > the last extent's end appends qemu's
 * view of a raw file rounded up to 512 bytes (a zero extent past EOF).
 * An empty list prints qemu's zero-length entry at `start`.  The result is
 * malloc'ed and NUL terminated. */
char *ic_format_map_json(const struct ic_extent *ext, size_t n, uint64_t start,
                         uint64_t tail_end, struct ic_error *err);
char *ic_format_map_human(const struct ic_extent *ext, size_t n, uint64_t start,
                          uint64_t tail_end, const char *filename, struct ic_error *err);

/* The two merge rules of qemu-img map. */
int ic_extent_mergeable(const struct ic_extent *cur, const struct ic_extent *next);

#endif
