/* null: a destination that discards everything and reads as zeros, for
 * measuring how fast a source can be read. */
#include <string.h>
#include <unistd.h>

#include "../image.h"

static int open_null(struct ic_image *img, int fd, struct ic_error *err)
{
    (void)img;
    (void)err;
    if (fd >= 0)
        close(fd);
    return 0;
}

static int create_null(struct ic_image *img, int fd, int *fresh, struct ic_error *err)
{
    *fresh = 1;
    return open_null(img, fd, err);
}

static void close_null(struct ic_image *img)
{
    (void)img;
}

static int null_pread(struct ic_image *img, void *buf, size_t len, uint64_t off,
                      struct ic_error *err)
{
    (void)img;
    (void)off;
    (void)err;
    memset(buf, 0, len);
    return 0;
}

static int null_pwrite(struct ic_image *img, const void *buf, size_t len, uint64_t off,
                       struct ic_error *err)
{
    (void)img;
    (void)buf;
    (void)len;
    (void)off;
    (void)err;
    return 0;
}

static int null_zero(struct ic_image *img, uint64_t off, uint64_t len, unsigned flags,
                     struct ic_error *err)
{
    (void)img;
    (void)off;
    (void)len;
    (void)flags;
    (void)err;
    return 0;
}

static int null_flush(struct ic_image *img, struct ic_error *err)
{
    (void)img;
    (void)err;
    return 0;
}

static int null_block_status(struct ic_image *img, uint64_t start, uint64_t end, uint64_t want,
                             struct ic_extent_list *out, struct ic_error *err)
{
    (void)img;
    (void)want;
    struct ic_extent e = {.start = start, .length = end - start, .flags = IC_EXT_ZERO};
    if (ic_extent_list_push(out, &e) < 0)
        return ic_error_nomem(err);
    return 0;
}

const struct ic_driver ic_driver_null = {
    .name = "null",
    .open = open_null,
    .create = create_null,
    .close = close_null,
    .pread = null_pread,
    .pwrite = null_pwrite,
    .zero = null_zero,
    .flush = null_flush,
    .block_status = null_block_status,
};
