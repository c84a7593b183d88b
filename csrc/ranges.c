/* Byte ranges a caller hands in (a warm migration's changed areas, CBT's
 * list): any order, overlapping, hostile.  Normalized once, so that
 * everything after walks them in order, each byte once. */
#include <stdlib.h>

#include "imgcopy.h"

static int by_offset(const void *a, const void *b)
{
    const struct ic_range *x = a, *y = b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

int ic_ranges_normalize(struct ic_range *r, size_t *n, uint64_t size, struct ic_error *err)
{
    for (size_t i = 0; i < *n; i++)
        if (r[i].offset > size || r[i].length > size - r[i].offset)
            return ic_error_value(err, "changed range %llu+%llu is outside the source "
                                  "(%llu bytes)", (unsigned long long)r[i].offset,
                                  (unsigned long long)r[i].length, (unsigned long long)size);
    if (*n > 1) /* r may be NULL when *n is 0: not even qsort may have it */
        qsort(r, *n, sizeof *r, by_offset);
    size_t out = 0;
    for (size_t i = 0; i < *n; i++) {
        if (r[i].length == 0)
            continue;
        if (out && r[i].offset <= r[out - 1].offset + r[out - 1].length) {
            uint64_t end = r[i].offset + r[i].length; /* no overflow: inside `size` */
            if (end > r[out - 1].offset + r[out - 1].length)
                r[out - 1].length = end - r[out - 1].offset;
            continue;
        }
        r[out++] = r[i];
    }
    *n = out;
    return 0;
}
