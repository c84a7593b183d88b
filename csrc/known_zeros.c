/* What a copy's destination reads as zeros before anything is written to
 * it: zero ranges there need no zero request.  Asked once, when the copy
 * starts: asked later, the answer would depend on how far the copy got
 * (a server's allocation unit can take a neighbour's write for data). */
#include <stdlib.h>

#include "copy_internal.h"

int ic_known_zeros_init(struct ic_known_zeros *z, struct ic_image *dst, uint64_t end)
{
    struct ic_extent_list all = {0};
    struct ic_error ignored = {0};
    z->runs = (struct ic_extent_list){0};
    if (end == 0)
        return 0;
    if (ic_image_map(dst, 0, end, &all, &ignored) < 0) {
        ic_extent_list_free(&all);
        return ignored.kind == IC_ERR_NOMEM ? -1 : 0; /* no answer: nothing is known */
    }
    int ret = 0;
    for (size_t i = 0; i < all.count && ret == 0; i++) {
        const struct ic_extent *e = &all.items[i];
        if (!(e->flags & IC_EXT_ZERO))
            continue;
        struct ic_extent *last = z->runs.count ? &z->runs.items[z->runs.count - 1] : NULL;
        if (last && last->start + last->length == e->start)
            last->length += e->length;
        else
            ret = ic_extent_list_push(&z->runs, &(struct ic_extent){.start = e->start,
                                                                      .length = e->length,
                                                                      .flags = IC_EXT_ZERO});
    }
    ic_extent_list_free(&all);
    return ret;
}

int ic_known_zeros_cover(const struct ic_known_zeros *z, uint64_t off, uint64_t len)
{
    size_t lo = 0, hi = z->runs.count;
    while (lo < hi) { /* the last run starting at or before off */
        size_t mid = lo + (hi - lo) / 2;
        if (z->runs.items[mid].start <= off)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0)
        return 0;
    const struct ic_extent *run = &z->runs.items[lo - 1];
    return off + len <= run->start + run->length;
}

void ic_known_zeros_free(struct ic_known_zeros *z)
{
    ic_extent_list_free(&z->runs);
}
