/* qemu-img map's two output formats, byte for byte. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "imgcopy.h"

struct strbuf {
    char *s;
    size_t len;
    size_t cap;
    int failed;
};

__attribute__((format(printf, 2, 3))) static void sb_printf(struct strbuf *b, const char *fmt, ...)
{
    if (b->failed)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        size_t room = b->cap - b->len;
        int n = vsnprintf(b->s ? b->s + b->len : NULL, room, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->failed = 1;
            return;
        }
        if ((size_t)n < room) {
            b->len += (size_t)n;
            return;
        }
        size_t nc = b->cap ? b->cap * 2 : 4096;
        while (nc < b->len + (size_t)n + 1)
            nc *= 2;
        char *ns = realloc(b->s, nc);
        if (!ns) {
            b->failed = 1;
            return;
        }
        b->s = ns;
        b->cap = nc;
    }
}

static char *sb_finish(struct strbuf *b, struct ic_error *err)
{
    if (!b->s && !b->failed)
        sb_printf(b, "%s", "");
    if (b->failed) {
        free(b->s);
        ic_error_nomem(err);
        return NULL;
    }
    return b->s;
}

/* Walks the extents, then qemu's zero tail past a raw file's EOF. */
struct walker {
    const struct ic_extent *ext;
    size_t n;
    size_t i;
    uint64_t tail_end;
    struct ic_extent tail;
    int tail_done;
};

static const struct ic_extent *walker_next(struct walker *w)
{
    if (w->i < w->n)
        return &w->ext[w->i++];
    uint64_t end = w->n ? w->ext[w->n - 1].start + w->ext[w->n - 1].length : 0;
    if (!w->tail_done && w->n && w->tail_end > end) {
        w->tail_done = 1;
        w->tail = (struct ic_extent){
            .start = end,
            .length = w->tail_end - end,
            .host_offset = end,
            .flags = IC_EXT_ZERO | IC_EXT_PRESENT | IC_EXT_OFFSET_VALID,
        };
        return &w->tail;
    }
    return NULL;
}

/* The merged entries qemu-img prints, one at a time. */
static int next_entry(struct walker *w, const struct ic_extent **pending, struct ic_extent *out)
{
    if (!*pending)
        return 0;
    *out = **pending;
    while ((*pending = walker_next(w)) && ic_extent_mergeable(out, *pending))
        out->length += (*pending)->length;
    return 1;
}

static const char *tf(uint32_t flags, uint32_t bit)
{
    return (flags & bit) ? "true" : "false";
}

char *ic_format_map_json(const struct ic_extent *ext, size_t n, uint64_t start,
                         uint64_t tail_end, struct ic_error *err)
{
    struct strbuf b = {0};
    struct walker w = {.ext = ext, .n = n, .tail_end = tail_end};
    const struct ic_extent *pending = walker_next(&w);
    struct ic_extent e;
    int first = 1;

    sb_printf(&b, "[");
    if (!pending && tail_end > start) {
        /* a range that starts past EOF but inside qemu's 512-byte rounding */
        w.n = 0;
        w.tail = (struct ic_extent){
            .start = start,
            .length = tail_end - start,
            .host_offset = start,
            .flags = IC_EXT_ZERO | IC_EXT_PRESENT | IC_EXT_OFFSET_VALID,
        };
        w.tail_done = 1;
        pending = &w.tail;
    }
    if (!pending)
        sb_printf(&b, "{ \"start\": %" PRIu64 ", \"length\": 0, \"depth\": 0, \"present\": false,"
                      " \"zero\": false, \"data\": false}",
                  start);
    while (next_entry(&w, &pending, &e)) {
        if (!first)
            sb_printf(&b, ",\n");
        first = 0;
        sb_printf(&b,
                  "{ \"start\": %" PRIu64 ", \"length\": %" PRIu64 ", \"depth\": %" PRIu32
                  ", \"present\": %s, \"zero\": %s, \"data\": %s",
                  e.start, e.length, e.depth, tf(e.flags, IC_EXT_PRESENT),
                  tf(e.flags, IC_EXT_ZERO), tf(e.flags, IC_EXT_DATA));
        if (e.flags & IC_EXT_OFFSET_VALID)
            sb_printf(&b, ", \"offset\": %" PRIu64, e.host_offset);
        sb_printf(&b, "}");
    }
    sb_printf(&b, "]\n");
    return sb_finish(&b, err);
}

char *ic_format_map_human(const struct ic_extent *ext, size_t n, uint64_t start,
                          uint64_t tail_end, const char *const *names, size_t nnames,
                          struct ic_error *err)
{
    (void)start; /* the zero tail prints nothing in this format */
    struct strbuf b = {0};
    struct walker w = {.ext = ext, .n = n, .tail_end = tail_end};
    const struct ic_extent *pending = walker_next(&w);
    struct ic_extent e;

    sb_printf(&b, "%-16s%-16s%-16s%s\n", "Offset", "Length", "Mapped to", "File");
    while (next_entry(&w, &pending, &e)) {
        int data = (e.flags & IC_EXT_DATA) != 0;
        if (data && !(e.flags & IC_EXT_OFFSET_VALID)) {
            free(b.s);
            return ic_error_value(err, "File contains external, encrypted or compressed "
                                       "clusters."),
                   NULL;
        }
        if (data && !(e.flags & IC_EXT_ZERO))
            sb_printf(&b, "%#-16" PRIx64 "%#-16" PRIx64 "%#-16" PRIx64 "%s\n", e.start, e.length,
                      e.host_offset, e.depth < nnames ? names[e.depth] : "");
    }
    return sb_finish(&b, err);
}

/* The next range of one state, dirty or clean: neighbours merged whatever
 * their other flags (an extent map with a dirty map laid over it). */
static int next_dirty_range(const struct ic_extent *ext, size_t n, size_t *i, uint64_t *start,
                            uint64_t *length, int *dirty)
{
    if (*i >= n)
        return 0;
    *start = ext[*i].start;
    *length = ext[*i].length;
    *dirty = (ext[*i].flags & IC_EXT_DIRTY) != 0;
    for ((*i)++; *i < n && ((ext[*i].flags & IC_EXT_DIRTY) != 0) == *dirty &&
                 ext[*i].start == *start + *length;
         (*i)++)
        *length += ext[*i].length;
    return 1;
}

char *ic_format_dirty_json(const struct ic_extent *ext, size_t n, uint64_t start,
                           struct ic_error *err)
{
    struct strbuf b = {0};
    uint64_t s, len;
    int dirty;
    size_t i = 0;
    sb_printf(&b, "[");
    if (n == 0) /* as qemu-img map says of an empty range */
        sb_printf(&b, "{ \"start\": %" PRIu64 ", \"length\": 0, \"dirty\": false}", start);
    for (int first = 1; next_dirty_range(ext, n, &i, &s, &len, &dirty); first = 0)
        sb_printf(&b, "%s{ \"start\": %" PRIu64 ", \"length\": %" PRIu64 ", \"dirty\": %s}",
                  first ? "" : ",\n", s, len, dirty ? "true" : "false");
    sb_printf(&b, "]\n");
    return sb_finish(&b, err);
}

char *ic_format_dirty_human(const struct ic_extent *ext, size_t n, const char *file,
                            struct ic_error *err)
{
    struct strbuf b = {0};
    uint64_t s, len;
    int dirty;
    size_t i = 0;
    sb_printf(&b, "%-16s%-16s%s\n", "Offset", "Length", "File");
    while (next_dirty_range(ext, n, &i, &s, &len, &dirty))
        if (dirty)
            sb_printf(&b, "%#-16" PRIx64 "%#-16" PRIx64 "%s\n", s, len, file);
    return sb_finish(&b, err);
}
