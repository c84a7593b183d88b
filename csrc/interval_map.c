#include "interval_map.h"

#include <stdlib.h>
#include <string.h>

#include "imgcopy.h"

void ic_imap_init(struct ic_interval_map *m)
{
    m->v = NULL;
    m->n = 0;
    m->cap = 0;
}

void ic_imap_free(struct ic_interval_map *m)
{
    free(m->v);
    ic_imap_init(m);
}

void ic_imap_clear(struct ic_interval_map *m)
{
    m->n = 0;
}

/* Index of the first interval whose end is > off (m->n if none). */
static size_t first_ending_after(const struct ic_interval_map *m, uint64_t off)
{
    size_t lo = 0, hi = m->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (m->v[mid].end > off)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

const struct ic_interval *ic_imap_find(const struct ic_interval_map *m, uint64_t off)
{
    size_t i = first_ending_after(m, off);
    if (i < m->n && m->v[i].start <= off)
        return &m->v[i];
    return NULL;
}

void ic_imap_gap(const struct ic_interval_map *m, uint64_t off, uint64_t limit,
                 uint64_t *gap_start, uint64_t *gap_end)
{
    size_t i = first_ending_after(m, off);
    *gap_start = i > 0 ? m->v[i - 1].end : 0;
    *gap_end = i < m->n && m->v[i].start < limit ? m->v[i].start : limit;
}

int ic_interval_mergeable(const struct ic_interval *a, const struct ic_interval *b)
{
    if (a->end != b->start || a->flags != b->flags || a->depth != b->depth)
        return 0;
    if (a->flags & IC_EXT_OFFSET_VALID)
        return a->host + (a->end - a->start) == b->host;
    return 1;
}

/* `iv` cut down to [start, end). */
static struct ic_interval slice(const struct ic_interval *iv, uint64_t start, uint64_t end)
{
    struct ic_interval s = *iv;
    if (s.flags & IC_EXT_OFFSET_VALID)
        s.host += start - iv->start;
    s.start = start;
    s.end = end;
    return s;
}

enum splice_mode { SPLICE_ASSIGN, SPLICE_UPDATE_KNOWN, SPLICE_FORGET };

/* Rewrite the intervals touching [iv->start, iv->end) in one pass: build the
 * replacement pieces (merged with their neighbours) in a scratch array, then
 * move the tail once.  One memmove per call keeps batch inserts cheap. */
static int splice(struct ic_interval_map *m, const struct ic_interval *iv, size_t niv,
                  enum splice_mode mode)
{
    /* ASSIGN takes niv contiguous intervals; the others one range */
    uint64_t a = iv[0].start, b = iv[niv - 1].end;
    if (a >= b)
        return 0;
    size_t i = first_ending_after(m, a);
    size_t j = i;
    while (j < m->n && m->v[j].start < b)
        j++;
    /* widen by one neighbour each side so that merges happen here */
    size_t lo = i > 0 ? i - 1 : 0;
    size_t hi = j < m->n ? j + 1 : j;

    size_t cap = (hi - lo) + 2 + niv;
    struct ic_interval *piece = malloc(cap * sizeof *piece);
    if (!piece)
        return -1;
    size_t np = 0;

#define EMIT(x)                                                                        \
    do {                                                                               \
        struct ic_interval e_ = (x);                                                   \
        if (e_.start < e_.end) {                                                       \
            if (np > 0 && ic_interval_mergeable(&piece[np - 1], &e_))                  \
                piece[np - 1].end = e_.end;                                            \
            else                                                                       \
                piece[np++] = e_;                                                      \
        }                                                                              \
    } while (0)

    for (size_t k = lo; k < i; k++)
        EMIT(m->v[k]);
    if (i < j && m->v[i].start < a)
        EMIT(slice(&m->v[i], m->v[i].start, a));
    if (mode == SPLICE_ASSIGN)
        for (size_t k = 0; k < niv; k++)
            EMIT(iv[k]);
    if (mode == SPLICE_UPDATE_KNOWN) {
        for (size_t k = i; k < j; k++) {
            uint64_t s = m->v[k].start > a ? m->v[k].start : a;
            uint64_t e = m->v[k].end < b ? m->v[k].end : b;
            EMIT(slice(iv, s, e));
        }
    }
    if (i < j && m->v[j - 1].end > b)
        EMIT(slice(&m->v[j - 1], b, m->v[j - 1].end));
    for (size_t k = j; k < hi; k++)
        EMIT(m->v[k]);
#undef EMIT

    size_t old = hi - lo;
    size_t newn = m->n - old + np;
    if (old == 0 && np == 0) {
        free(piece);
        return 0;
    }
    if (newn > m->cap) {
        size_t nc = m->cap ? m->cap * 2 : 64;
        while (nc < newn)
            nc *= 2;
        struct ic_interval *nv = realloc(m->v, nc * sizeof *nv);
        if (!nv) {
            free(piece);
            return -1;
        }
        m->v = nv;
        m->cap = nc;
    }
    if (m->n > hi)
        memmove(&m->v[lo + np], &m->v[hi], (m->n - hi) * sizeof *m->v);
    if (np)
        memcpy(&m->v[lo], piece, np * sizeof *piece);
    m->n = newn;
    free(piece);
    return 0;
}

int ic_imap_assign(struct ic_interval_map *m, const struct ic_interval *iv)
{
    return splice(m, iv, 1, SPLICE_ASSIGN);
}

int ic_imap_assign_run(struct ic_interval_map *m, const struct ic_interval *ivs, size_t n)
{
    return n ? splice(m, ivs, n, SPLICE_ASSIGN) : 0;
}

int ic_imap_update_known(struct ic_interval_map *m, const struct ic_interval *iv)
{
    return splice(m, iv, 1, SPLICE_UPDATE_KNOWN);
}

int ic_imap_forget(struct ic_interval_map *m, uint64_t start, uint64_t end)
{
    struct ic_interval iv = {.start = start, .end = end};
    return splice(m, &iv, 1, SPLICE_FORGET);
}
