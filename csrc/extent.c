/* Extent lists, their totals and qemu-img map's rule for merging neighbours. */
#include <stdlib.h>

#include "imgcopy.h"

/* Room for one more item (out of line: pushes are on every walk's path). */
static __attribute__((noinline)) int grow(struct ic_extent_list *list)
{
    size_t nc = list->capacity ? list->capacity * 2 : 256;
    struct ic_extent *ni = realloc(list->items, nc * sizeof *ni);
    if (!ni)
        return -1;
    list->items = ni;
    list->capacity = nc;
    return 0;
}

int ic_extent_list_push(struct ic_extent_list *list, const struct ic_extent *e)
{
    if (list->count == list->capacity && grow(list) < 0)
        return -1;
    list->items[list->count++] = *e;
    return 0;
}

int ic_extent_list_add(struct ic_extent_list *list, const struct ic_extent *e,
                       struct ic_error *err)
{
    if (list->count == list->capacity && grow(list) < 0)
        return ic_error_nomem(err);
    list->items[list->count++] = *e;
    return 0;
}

int ic_extent_list_join(struct ic_extent_list *list, size_t first, const struct ic_extent *e,
                        struct ic_error *err)
{
    if (list->count > first) {
        struct ic_extent *last = &list->items[list->count - 1];
        if (last->flags == e->flags && last->start + last->length == e->start &&
            (!(e->flags & IC_EXT_OFFSET_VALID) ||
             last->host_offset + last->length == e->host_offset)) {
            last->length += e->length;
            return 0;
        }
    }
    return ic_extent_list_add(list, e, err);
}

void ic_extent_list_free(struct ic_extent_list *list)
{
    free(list->items);
    list->items = NULL;
    list->count = 0;
    list->capacity = 0;
}

/* qemu-img.c entry_mergeable(): same flags and depth, host offsets
 * contiguous where they are valid. */
int ic_extent_mergeable(const struct ic_extent *cur, const struct ic_extent *next)
{
    if (cur->length == 0 || cur->flags != next->flags || cur->depth != next->depth)
        return 0;
    if (cur->flags & IC_EXT_OFFSET_VALID)
        return cur->host_offset + cur->length == next->host_offset;
    return 1;
}

void ic_extent_totals(const struct ic_extent *ext, size_t n, struct ic_extent_totals *out)
{
    *out = (struct ic_extent_totals){0};
    for (size_t i = 0; i < n; i++) {
        if (ext[i].flags & IC_EXT_DATA)
            out->data += ext[i].length;
        if (ext[i].flags & IC_EXT_ZERO)
            out->zero += ext[i].length;
        if (ext[i].flags & IC_EXT_PRESENT)
            out->present += ext[i].length;
        if (ext[i].flags & IC_EXT_COMPRESSED)
            out->compressed += ext[i].length;
        if (ext[i].flags & IC_EXT_DIRTY)
            out->dirty += ext[i].length;
    }
}

/* A piece of extent `e`, [start, end), flagged dirty or not. */
static int add_piece(struct ic_extent_list *out, size_t first, const struct ic_extent *e,
                     uint64_t start, uint64_t end, int dirty, struct ic_error *err)
{
    struct ic_extent p = *e;
    p.start = start;
    p.length = end - start;
    if (p.flags & IC_EXT_OFFSET_VALID)
        p.host_offset += start - e->start;
    p.flags = dirty ? p.flags | IC_EXT_DIRTY : p.flags & ~(uint32_t)IC_EXT_DIRTY;
    if (out->count > first && ic_extent_mergeable(&out->items[out->count - 1], &p)) {
        out->items[out->count - 1].length += p.length;
        return 0;
    }
    return ic_extent_list_add(out, &p, err);
}

int ic_extents_mark_dirty(const struct ic_extent *ext, size_t n, const struct ic_extent *dirty,
                          size_t ndirty, struct ic_extent_list *out, struct ic_error *err)
{
    size_t first = out->count, j = 0;
    for (size_t i = 0; i < n; i++) {
        const struct ic_extent *e = &ext[i];
        uint64_t pos = e->start, end = e->start + e->length;
        while (pos < end) {
            /* the first dirty-map extent not wholly before pos */
            while (j < ndirty && dirty[j].start + dirty[j].length <= pos)
                j++;
            uint64_t cut = end;
            int is_dirty = 0;
            if (j < ndirty && dirty[j].start <= pos) {
                is_dirty = (dirty[j].flags & IC_EXT_DIRTY) != 0;
                uint64_t dend = dirty[j].start + dirty[j].length;
                cut = dend < end ? dend : end;
            } else if (j < ndirty && dirty[j].start < end) {
                cut = dirty[j].start; /* clean up to the next extent the map has */
            }
            if (add_piece(out, first, e, pos, cut, is_dirty, err) < 0) {
                out->count = first;
                return -1;
            }
            pos = cut;
        }
    }
    return 0;
}
