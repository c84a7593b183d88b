/* Storing persistent bitmaps, the image layer's part: the checks every
 * format shares, and the dirty ranges handed to the driver one at a time
 * (ic_dirty_next_fn), from an array or from another image's dirty map read
 * a piece at a time (qemu-img convert --bitmaps: a bitmap of any size is
 * copied without holding its ranges). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "image.h"

/* The checks before the driver's: writable, a driver that stores bitmaps,
 * a granularity of 2^k bytes, known flags. */
static int store_ok(struct ic_image *img, const char *name, uint64_t granularity,
                    unsigned flags, unsigned *bits, struct ic_error *err)
{
    if (!ic_image_writable(img))
        return ic_error_readonly(err, img->path);
    if (!img->drv->add_bitmap)
        return ic_error_os(err, ENOTSUP, img->path, "Format driver '%s' does not support "
                           "bitmaps (%s images keep no persistent bitmaps)",
                           ic_image_format(img), ic_image_format(img));
    if (!name)
        return ic_error_value(err, "%s: a bitmap needs a name", img->path);
    if (granularity == 0 || (granularity & (granularity - 1)))
        return ic_error_value(err, "%s: bitmap '%.64s': granularity %llu is not a power of two",
                              img->path, name, (unsigned long long)granularity);
    if (flags & ~(unsigned)IC_BITMAP_AUTO)
        return ic_error_value(err, "%s: bitmap '%.64s': a bitmap is stored consistent, "
                              "enabled (IC_BITMAP_AUTO) or not: flags 0x%x", img->path, name,
                              flags);
    for (*bits = 0; (1ull << *bits) < granularity; ++*bits)
        ;
    return 0;
}

/* ---- from an array of ranges -------------------------------------------- */

struct array_ranges {
    const struct ic_range *r;
    size_t n, next;
};

static int next_in_array(void *ctx, struct ic_range *out, struct ic_error *err)
{
    (void)err;
    struct array_ranges *a = ctx;
    if (a->next == a->n)
        return 0;
    *out = a->r[a->next++];
    return 1;
}

int ic_image_add_bitmap(struct ic_image *img, const char *name, uint64_t granularity,
                        unsigned flags, const struct ic_range *dirty, size_t n,
                        struct ic_error *err)
{
    unsigned bits;
    if (store_ok(img, name, granularity, flags, &bits, err) < 0)
        return -1;
    for (size_t i = 0; i < n; i++)
        if (dirty[i].offset > img->size || dirty[i].length > img->size - dirty[i].offset)
            return ic_error_value(err, "%s: bitmap '%.64s': dirty range %llu+%llu is outside "
                                  "the image (%llu bytes)", img->path, name,
                                  (unsigned long long)dirty[i].offset,
                                  (unsigned long long)dirty[i].length,
                                  (unsigned long long)img->size);
    /* sorted and merged, a copy: the caller's stay as they are */
    struct ic_range *sorted = n ? malloc(n * sizeof *sorted) : NULL;
    if (n && !sorted)
        return ic_error_nomem(err);
    int ret = 0;
    if (n) {
        memcpy(sorted, dirty, n * sizeof *sorted);
        ret = ic_ranges_normalize(sorted, &n, img->size, err);
    }
    struct array_ranges a = {.r = sorted, .n = n};
    if (ret == 0)
        ret = img->drv->add_bitmap(img, name, bits, flags, next_in_array, &a, err);
    free(sorted);
    return ret;
}

/* ---- from another image's dirty map ------------------------------------- */

struct dirty_reader {
    struct ic_image *src;
    const char *name;
    uint64_t pos, end;           /* what is left to read */
    struct ic_extent_list part;  /* an answer of the source's */
    size_t at;                   /* its next extent */
};

/* The next dirty range: dirty extents that follow each other, joined. */
static int next_dirty(void *ctx, struct ic_range *out, struct ic_error *err)
{
    struct dirty_reader *d = ctx;
    int found = 0;
    for (;;) {
        if (d->at == d->part.count) {
            if (d->pos >= d->end)
                return found;
            d->part.count = d->at = 0;
            if (ic_image_dirty_status(d->src, d->name, d->pos, d->end, &d->part, err) < 0)
                return -1;
        }
        const struct ic_extent *e = &d->part.items[d->at];
        if (!(e->flags & IC_EXT_DIRTY)) {
            if (found)
                return 1;
        } else if (found) {
            out->length += e->length;
        } else {
            *out = (struct ic_range){.offset = e->start, .length = e->length};
            found = 1;
        }
        d->pos = e->start + e->length;
        d->at++;
    }
}

int ic_image_copy_bitmap(struct ic_image *dst, struct ic_image *src, const char *name,
                         struct ic_error *err)
{
    if (!name)
        return ic_error_value(err, "a bitmap to copy needs its name");
    if (!src->drv->bitmaps)
        return ic_error_value(err, "%s: Source lacks bitmap support (%s images keep no "
                              "persistent bitmaps)", src->path, ic_image_format(src));
    size_t n = ic_image_bitmaps(src, NULL, 0);
    struct ic_bitmap *list = n ? calloc(n, sizeof *list) : NULL;
    if (n && !list)
        return ic_error_nomem(err);
    n = ic_image_bitmaps(src, list, n);
    size_t i = 0;
    while (i < n && strcmp(list[i].name, name) != 0)
        i++;
    struct ic_bitmap found = i < n ? list[i] : (struct ic_bitmap){0};
    free(list);
    if (i == n)
        return ic_error_value(err, "%s: Bitmap '%.64s' is not found", src->path, name);
    if (found.flags & IC_BITMAP_IN_USE)
        return ic_error_format(err, src->path, "Cannot copy inconsistent bitmap '%.64s' (a "
                               "program had the image open for writing and did not close "
                               "it, so its bits may be stale: 'qemu-img bitmap --remove' "
                               "deletes it)", name);
    if (dst->size < src->size)
        return ic_error_value(err, "%s: bitmap '%.64s' of %s covers %llu bytes, the "
                              "destination only %llu", dst->path, name, src->path,
                              (unsigned long long)src->size, (unsigned long long)dst->size);
    unsigned bits, flags = found.flags & IC_BITMAP_AUTO;
    if (store_ok(dst, name, found.granularity, flags, &bits, err) < 0)
        return -1;
    struct dirty_reader d = {.src = src, .name = name, .end = src->size};
    int ret = dst->drv->add_bitmap(dst, name, bits, flags, next_dirty, &d, err);
    ic_extent_list_free(&d.part);
    return ret;
}
