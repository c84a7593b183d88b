/* The null protocol ("null:"): a destination that discards everything and
 * reads as zeros, for measuring how fast a source can be read. */
#include <string.h>

#include "../image.h"

static int null_create(struct ic_image *img, const char *path, int *fresh,
                       struct ic_error *err)
{
    (void)img;
    (void)path;
    (void)err;
    *fresh = 1;
    return 0;
}

static void null_close(struct ic_image *img)
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
    (void)flags;
    return null_pwrite(img, NULL, (size_t)len, off, err);
}

static int null_block_status(struct ic_image *img, uint64_t start, uint64_t end, uint64_t want,
                             struct ic_extent_list *out, struct ic_error *err)
{
    (void)img;
    (void)want;
    /* a sink claims nothing about its content: a copy into it (plan())
     * does what it would do to a destination it knows nothing of */
    struct ic_extent e = {.start = start, .length = end - start,
                          .flags = IC_EXT_DATA | IC_EXT_PRESENT};
    return ic_extent_list_add(out, &e, err);
}

const struct ic_driver ic_protocol_null = {
    .name = "null",
    .kind = IC_PROTOCOL,
    .format_name = "null",
    .create_protocol = null_create,
    .close = null_close,
    .pread = null_pread,
    .pwrite = null_pwrite,
    .zero = null_zero,
    .zero_allocates = 1, /* as the new file it stands for (plan()) */
    .block_status = null_block_status,
    .random_access_status = 1,
};
