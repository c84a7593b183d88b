/* What a journal holds in memory (journal_internal.h): `done`, the byte
 * ranges recorded (sorted, merged); with digests, `dig`, an append-only
 * arena of every data block digest read or recorded, and `runs`, the
 * blocks recorded as sorted, disjoint runs, each all zero blocks or data
 * blocks whose digests lie one after another in the arena.  Opening
 * collects every record's runs with their order and resolves overlaps in
 * one sweep (a heap of the runs covering each point, latest on top):
 * O(R log R) for R runs however the records overlap, where replaying
 * records one by one could be quadratic on a hostile file.  A record while
 * copying is laid over the index by merging (the runs before it are not
 * touched: a copy records mostly ahead of what it recorded before).
 *
 * A copy's record is queued here for the next sync as well: the index and
 * the queue change together or not at all, so that a refused record leaves
 * nothing behind in either. */
#include <stdlib.h>
#include <string.h>

#include "journal_internal.h"

#define ZERO_RUN UINT64_MAX /* a run of zero blocks: no digests */

struct run {
    uint64_t first, count;
    uint64_t digest; /* index in the arena of the digest of `first`, or ZERO_RUN */
};

/* A run as a record states it, before overlaps are resolved */
struct piece {
    uint64_t first, end, digest;
    uint64_t seq; /* its order: a later piece wins */
};

/* The pointer at `pp` is read and written through memcpy: it is the
 * array's own pointer type (struct ic_range *, uint8_t *, ...), not a
 * void *. */
int journal_reserve(void *pp, size_t *cap, size_t need, size_t size)
{
    if (need <= *cap)
        return 0;
    size_t c = *cap ? *cap : 16;
    while (c < need)
        c = c > SIZE_MAX / 2 ? need : c * 2;
    if (c > SIZE_MAX / size)
        return -1;
    void *v;
    memcpy(&v, pp, sizeof v);
    void *p = realloc(v, c * size);
    if (!p)
        return -1;
    memcpy(pp, &p, sizeof p);
    *cap = c;
    return 0;
}

uint64_t journal_blocks_of(const struct ic_journal *j, uint64_t bytes)
{
    return bytes / j->block_size + (bytes % j->block_size != 0);
}

static void push_run(struct run *out, size_t *n, struct run r)
{
    if (*n > 0) {
        struct run *p = &out[*n - 1];
        if (p->first + p->count == r.first &&
            ((p->digest == ZERO_RUN && r.digest == ZERO_RUN) ||
             (p->digest != ZERO_RUN && r.digest != ZERO_RUN && p->digest + p->count == r.digest))) {
            p->count += r.count;
            return;
        }
    }
    out[(*n)++] = r;
}

static int piece_by_first(const void *a, const void *b)
{
    const struct piece *x = a, *y = b;
    if (x->first != y->first)
        return x->first < y->first ? -1 : 1;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

static int u64_cmp(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* The max-heap of the pieces covering the sweep's point, by seq */
static void heap_push(size_t *heap, size_t *n, const struct piece *p, size_t v)
{
    size_t i = (*n)++;
    while (i > 0 && p[heap[(i - 1) / 2]].seq < p[v].seq) {
        heap[i] = heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    heap[i] = v;
}

static void heap_pop(size_t *heap, size_t *n, const struct piece *p)
{
    size_t v = heap[--(*n)], i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n)
            break;
        if (c + 1 < *n && p[heap[c + 1]].seq > p[heap[c]].seq)
            c++;
        if (p[heap[c]].seq <= p[v].seq)
            break;
        heap[i] = heap[c];
        i = c;
    }
    if (*n > 0)
        heap[i] = v;
}

/* Pieces (reordered here) into sorted, disjoint, merged runs, the latest
 * piece winning where they overlap: *out (malloc'd, up to 2n runs). */
static int resolve(struct piece *p, size_t n, struct run **out, size_t *nout)
{
    *out = NULL;
    *nout = 0;
    if (n == 0)
        return 0;
    if (n > SIZE_MAX / (2 * sizeof(struct run)))
        return -1;
    struct run *runs = malloc(2 * n * sizeof *runs);
    if (!runs)
        return -1;
    uint64_t *bound = NULL;
    size_t *heap = NULL;
    /* pieces in order and apart, as a copy mostly records them: nothing
     * hides anything, no sort (seq order is then block order) */
    size_t nr = 0, i;
    for (i = 1; i < n && p[i].first >= p[i - 1].end; i++)
        ;
    if (i >= n) {
        for (i = 0; i < n; i++)
            push_run(runs, &nr, (struct run){p[i].first, p[i].end - p[i].first, p[i].digest});
        goto done;
    }
    bound = malloc(2 * n * sizeof *bound);
    heap = malloc(n * sizeof *heap);
    if (!bound || !heap) {
        free(bound);
        free(heap);
        free(runs);
        return -1;
    }
    for (i = 0; i < n; i++) {
        bound[2 * i] = p[i].first;
        bound[2 * i + 1] = p[i].end;
    }
    qsort(bound, 2 * n, sizeof *bound, u64_cmp);
    size_t nb = 0;
    for (i = 0; i < 2 * n; i++)
        if (nb == 0 || bound[nb - 1] != bound[i])
            bound[nb++] = bound[i];
    qsort(p, n, sizeof *p, piece_by_first);
    size_t hn = 0, next = 0;
    for (i = 0; i + 1 < nb; i++) {
        uint64_t at = bound[i];
        while (next < n && p[next].first == at)
            heap_push(heap, &hn, p, next++);
        /* pieces that ended are dropped when they come on top: below the
         * top they hide nothing */
        while (hn > 0 && p[heap[0]].end <= at)
            heap_pop(heap, &hn, p);
        if (hn == 0)
            continue;
        const struct piece *w = &p[heap[0]];
        struct run r = {at, bound[i + 1] - at,
                        w->digest == ZERO_RUN ? ZERO_RUN : w->digest + (at - w->first)};
        push_run(runs, &nr, r);
    }
done:
    free(bound);
    free(heap);
    /* overlapping records leave far fewer runs than pieces: give the rest
     * back (a failure to shrink keeps the larger block, which works) */
    struct run *fit = nr ? realloc(runs, nr * sizeof *runs) : NULL;
    if (fit || !nr) {
        if (!nr)
            free(runs);
        runs = fit;
    }
    *out = runs;
    *nout = nr;
    return 0;
}

/* The first run of `runs` that ends after block `b` */
static size_t runs_after(const struct run *runs, size_t n, uint64_t b)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (runs[mid].first + runs[mid].count <= b)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static struct run clip_front(struct run r, uint64_t at)
{
    uint64_t skip = at - r.first;
    r.first = at;
    r.count -= skip;
    if (r.digest != ZERO_RUN)
        r.digest += skip;
    return r;
}

/* `top` (sorted, disjoint) laid over the journal's runs, from run k (the
 * first that ends after top's start) on, into tmp (room for
 * nruns - k + 2 * ntop runs); returns how many tmp holds. */
static size_t overlay(const struct ic_journal *j, size_t k, const struct run *top, size_t ntop,
                      struct run *tmp)
{
    size_t n = 0, i = k;
    struct run cur = {0, 0, 0};
    int have = 0; /* cur: the rest of runs[i] not yet placed */
    for (size_t t = 0; t < ntop; t++) {
        uint64_t tend = top[t].first + top[t].count;
        for (;;) {
            if (!have) {
                if (i >= j->nruns)
                    break;
                cur = j->runs[i++];
                have = 1;
            }
            uint64_t cend = cur.first + cur.count;
            if (cur.first >= tend)
                break; /* after this top run: kept for the next */
            if (cur.first < top[t].first) {
                struct run head = cur;
                head.count = (cend < top[t].first ? cend : top[t].first) - cur.first;
                push_run(tmp, &n, head);
            }
            if (cend <= tend) {
                have = 0; /* all of it placed or hidden */
                continue;
            }
            cur = clip_front(cur, tend > cur.first ? tend : cur.first);
            break;
        }
        push_run(tmp, &n, top[t]);
    }
    if (have)
        push_run(tmp, &n, cur);
    while (i < j->nruns)
        push_run(tmp, &n, j->runs[i++]);
    return n;
}

/* Sorted, merged ranges `add` united with the journal's done ranges from
 * index k (the first that ends at or after add's start) on, into tmp (room
 * for ndone - k + nadd); returns how many tmp holds. */
static size_t unite(const struct ic_journal *j, size_t k, const struct ic_range *add, size_t nadd,
                    struct ic_range *tmp)
{
    size_t n = 0, i = k, a = 0;
    while (i < j->ndone || a < nadd) {
        struct ic_range r;
        if (a >= nadd || (i < j->ndone && j->done[i].offset < add[a].offset))
            r = j->done[i++];
        else
            r = add[a++];
        if (n > 0 && r.offset <= tmp[n - 1].offset + tmp[n - 1].length) {
            uint64_t e = r.offset + r.length;
            if (e > tmp[n - 1].offset + tmp[n - 1].length)
                tmp[n - 1].length = e - tmp[n - 1].offset;
        } else {
            tmp[n++] = r;
        }
    }
    return n;
}

static int range_by_offset(const void *a, const void *b)
{
    const struct ic_range *x = a, *y = b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* Sort and merge (touching too) in place; returns the new count */
static size_t merge_ranges(struct ic_range *r, size_t n)
{
    if (n == 0)
        return 0; /* r may be NULL: not even qsort may have it */
    qsort(r, n, sizeof *r, range_by_offset);
    size_t out = 0;
    for (size_t i = 0; i < n; i++) {
        if (out > 0 && r[i].offset <= r[out - 1].offset + r[out - 1].length) {
            uint64_t e = r[i].offset + r[i].length;
            if (e > r[out - 1].offset + r[out - 1].length)
                r[out - 1].length = e - r[out - 1].offset;
        } else {
            r[out++] = r[i];
        }
    }
    return out;
}

int journal_range_ok(const struct ic_journal *j, struct ic_range r)
{
    if (r.length == 0 || r.offset >= j->size || r.length > j->size - r.offset)
        return 0;
    uint64_t e = r.offset + r.length;
    return r.offset % j->block_size == 0 && (e % j->block_size == 0 || e == j->size);
}

static int kind_at(const struct kinds *k, uint64_t i)
{
    switch (k->mode) {
    case KINDS_BYTES:
        return k->p[i] != 0;
    case KINDS_BITS:
        return (k->p[i / 8] >> (i % 8)) & 1;
    case KINDS_ALL_ZERO:
        return 1;
    default:
        return 0;
    }
}

/* The pieces of ranges r[0..n) (all valid), data digests numbered from
 * `dig0`, seq from *seq on; appended to p (room reserved by the caller:
 * count_pieces).  `p` NULL: only count them. */
static size_t make_pieces(const struct ic_journal *j, const struct ic_range *r, size_t n,
                          const struct kinds *k, uint64_t dig0, uint64_t *seq, struct piece *p)
{
    size_t np = 0;
    uint64_t blk = 0, dig = dig0;
    for (size_t i = 0; i < n; i++) {
        uint64_t first = r[i].offset / j->block_size, count = journal_blocks_of(j, r[i].length);
        uint64_t b = 0;
        while (b < count) {
            int zero = kind_at(k, blk + b);
            uint64_t e = b + 1;
            if (k->mode == KINDS_ALL_DATA || k->mode == KINDS_ALL_ZERO)
                e = count; /* one piece, not a look at each block */
            while (e < count && kind_at(k, blk + e) == zero)
                e++;
            if (p)
                p[np] = (struct piece){first + b, first + e, zero ? ZERO_RUN : dig, (*seq)++};
            np++;
            if (!zero)
                dig += e - b;
            b = e;
        }
        blk += count;
    }
    return np;
}

static size_t count_pieces(const struct ic_journal *j, const struct ic_range *r, size_t n,
                           const struct kinds *k)
{
    return make_pieces(j, r, n, k, 0, NULL, NULL);
}

/* Set bits [from, from+count) of a bitmap */
static void set_bits(uint8_t *bits, uint64_t from, uint64_t count)
{
    while (count > 0 && from % 8) {
        bits[from / 8] |= (uint8_t)(1u << (from % 8));
        from++;
        count--;
    }
    memset(bits + from / 8, 0xff, count / 8);
    from += count / 8 * 8;
    for (count %= 8; count > 0; count--, from++)
        bits[from / 8] |= (uint8_t)(1u << (from % 8));
}

/* Grow the arena to hold `more` digests more */
static int reserve_digests(struct ic_journal *j, uint64_t more)
{
    if (more > SIZE_MAX - j->ndig)
        return -1;
    size_t need = j->ndig + (size_t)more;
    if (need > SIZE_MAX / j->digest_size)
        return -1;
    return journal_reserve(&j->dig, &j->dig_cap, need, j->digest_size);
}

int journal_add_loaded(struct ic_journal *j, const struct ic_range *ranges, uint32_t n,
                       const uint8_t *bits, const uint8_t *digests, uint64_t ndata,
                       struct journal_pieces *pc, struct ic_error *err)
{
    if (journal_reserve(&j->done, &j->done_cap, j->ndone + n, sizeof *j->done) < 0)
        return ic_error_nomem(err);
    if (n)
        memcpy(j->done + j->ndone, ranges, n * sizeof *ranges);
    j->ndone += n;
    if (!j->digest_size)
        return 0;
    struct kinds k = {KINDS_BITS, bits};
    size_t np = count_pieces(j, ranges, n, &k);
    if (reserve_digests(j, ndata) < 0 ||
        journal_reserve(&pc->p, &pc->cap, pc->n + np, sizeof *pc->p) < 0)
        return ic_error_nomem(err);
    pc->n += make_pieces(j, ranges, n, &k, j->ndig, &pc->seq, pc->p + pc->n);
    if (ndata) /* an arena not yet allocated is NULL: no memcpy there */
        memcpy(j->dig + j->ndig * j->digest_size, digests, ndata * j->digest_size);
    j->ndig += ndata;
    return 0;
}

int journal_settle(struct ic_journal *j, struct journal_pieces *pc, struct ic_error *err)
{
    j->ndone = merge_ranges(j->done, j->ndone);
    if (!j->digest_size)
        return 0;
    int ret = 0;
    free(j->runs);
    j->runs = NULL;
    if (resolve(pc->p, pc->n, &j->runs, &j->nruns) < 0)
        ret = ic_error_nomem(err);
    j->runs_cap = j->nruns;
    return ret;
}

const struct ic_range *ic_journal_done(const struct ic_journal *j, size_t *count)
{
    *count = j->ndone;
    return j->done;
}

int ic_journal_block(const struct ic_journal *j, uint64_t index, int *is_zero, uint8_t *digest)
{
    if (!j->digest_size)
        return 0;
    size_t i = runs_after(j->runs, j->nruns, index);
    if (i >= j->nruns || j->runs[i].first > index)
        return 0;
    const struct run *r = &j->runs[i];
    *is_zero = r->digest == ZERO_RUN;
    if (!*is_zero)
        memcpy(digest, j->dig + (r->digest + (index - r->first)) * j->digest_size,
               j->digest_size);
    return 1;
}

int ic_journal_run(const struct ic_journal *j, uint64_t index, uint64_t *count, int *is_zero,
                   const uint8_t **digests)
{
    *count = 0;
    *is_zero = 0;
    *digests = NULL;
    if (!j->digest_size || index >= j->nblocks)
        return 0;
    size_t i = runs_after(j->runs, j->nruns, index);
    if (i >= j->nruns || j->runs[i].first > index) {
        /* a gap: up to the next run, or the end */
        *count = (i < j->nruns ? j->runs[i].first : j->nblocks) - index;
        return 0;
    }
    const struct run *r = &j->runs[i];
    *count = r->first + r->count - index;
    *is_zero = r->digest == ZERO_RUN;
    if (!*is_zero)
        *digests = j->dig + (r->digest + (index - r->first)) * j->digest_size;
    return 1;
}

int journal_add(struct ic_journal *j, const struct ic_range *ranges, size_t n,
                const struct kinds *k, const uint8_t *digests, struct ic_error *err)
{
    /* check everything before changing anything */
    size_t used = 0;
    uint64_t blocks = 0, ndata = 0;
    for (size_t i = 0; i < n; i++) {
        if (ranges[i].length == 0)
            continue;
        if (!journal_range_ok(j, ranges[i]))
            return ic_error_value(err, "journal: range %llu+%llu is not whole blocks of %llu "
                                  "inside %llu bytes", (unsigned long long)ranges[i].offset,
                                  (unsigned long long)ranges[i].length,
                                  (unsigned long long)j->block_size,
                                  (unsigned long long)j->size);
        uint64_t c = journal_blocks_of(j, ranges[i].length);
        if (c > SIZE_MAX - blocks)
            return ic_error_nomem(err);
        blocks += c;
        used++;
    }
    if (used == 0)
        return 0;
    if (j->digest_size) {
        if (k->mode == KINDS_BYTES && !k->p)
            return ic_error_value(err, "journal: a record without its blocks' kinds");
        if (k->mode == KINDS_ALL_DATA)
            ndata = blocks;
        else if (k->mode == KINDS_BYTES)
            for (uint64_t b = 0; b < blocks; b++)
                ndata += k->p[b] == 0;
        if (ndata > 0 && !digests)
            return ic_error_value(err, "journal: a record without its blocks' digests");
    }
    /* a record and its ranges must fit a record header: payload length
     * counts up to 2^64, the range count 2^32 */
    if (j->npend + used > UINT32_MAX)
        return ic_error_value(err, "journal: more than %u ranges recorded between syncs",
                              UINT32_MAX);

    struct ic_range *add = malloc(used * sizeof *add);
    struct piece *pieces = NULL;
    struct run *top = NULL, *tmp = NULL;
    struct ic_range *dtmp = NULL;
    size_t ntop = 0, np = 0;
    int ret = -1;
    if (!add)
        goto nomem;
    used = 0;
    for (size_t i = 0; i < n; i++)
        if (ranges[i].length)
            add[used++] = ranges[i];
    if (journal_reserve(&j->pend, &j->pend_cap, j->npend + used, sizeof *j->pend) < 0)
        goto nomem;
    size_t old_bytes = j->npbits / 8 + (j->npbits % 8 != 0);
    if (j->digest_size) {
        np = count_pieces(j, add, used, k);
        pieces = malloc(np * sizeof *pieces);
        if (!pieces || reserve_digests(j, ndata) < 0 ||
            blocks > SIZE_MAX - 8 - j->npbits ||
            journal_reserve(&j->pbits, &j->pbits_cap, (j->npbits + blocks + 7) / 8, 1) < 0)
            goto nomem;
        uint64_t seq = 0;
        make_pieces(j, add, used, k, j->ndig, &seq, pieces);
        if (resolve(pieces, np, &top, &ntop) < 0)
            goto nomem;
    }
    size_t at = 0;
    if (ntop) {
        at = runs_after(j->runs, j->nruns, top[0].first);
        if (j->nruns - at > SIZE_MAX / sizeof *tmp - 2 * ntop ||
            !(tmp = malloc((j->nruns - at + 2 * ntop) * sizeof *tmp)) ||
            journal_reserve(&j->runs, &j->runs_cap, j->nruns + 2 * ntop, sizeof *j->runs) < 0)
            goto nomem;
    }
    /* the done ranges: united from the first that reaches the new ones */
    memcpy(j->pend + j->npend, add, used * sizeof *add); /* pend is past npend: unused */
    size_t nadd = merge_ranges(add, used);
    size_t dk;
    {
        size_t lo = 0, hi = j->ndone;
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            if (j->done[mid].offset + j->done[mid].length < add[0].offset)
                lo = mid + 1;
            else
                hi = mid;
        }
        dk = lo;
    }
    if (!(dtmp = malloc((j->ndone - dk + nadd) * sizeof *dtmp)) ||
        journal_reserve(&j->done, &j->done_cap, j->ndone + nadd, sizeof *j->done) < 0)
        goto nomem;

    /* commit: nothing fails from here */
    j->npend += used;
    size_t nd = unite(j, dk, add, nadd, dtmp);
    memcpy(j->done + dk, dtmp, nd * sizeof *dtmp);
    j->ndone = dk + nd;
    if (j->digest_size) {
        size_t nt = overlay(j, at, top, ntop, tmp);
        j->nruns = at;
        for (size_t i = 0; i < nt; i++) /* merging with run at-1 where they join */
            push_run(j->runs, &j->nruns, tmp[i]);
        if (ndata)
            memcpy(j->dig + j->ndig * j->digest_size, digests, ndata * j->digest_size);
        j->ndig += ndata;
        j->pend_data += ndata;
        /* the new bitmap bytes start clear, the zero blocks' bits set */
        size_t new_bytes = (j->npbits + blocks + 7) / 8;
        memset(j->pbits + old_bytes, 0, new_bytes - old_bytes);
        if (k->mode == KINDS_ALL_ZERO)
            set_bits(j->pbits, j->npbits, blocks);
        else if (k->mode == KINDS_BYTES)
            for (uint64_t b = 0; b < blocks; b++)
                if (k->p[b])
                    set_bits(j->pbits, j->npbits + b, 1);
        j->npbits += blocks;
    }
    ret = 0;
    goto out;
nomem:
    ret = ic_error_nomem(err);
out:
    free(add);
    free(pieces);
    free(top);
    free(tmp);
    free(dtmp);
    return ret;
}

void journal_pending_written(struct ic_journal *j)
{
    size_t bm = j->digest_size ? j->npbits / 8 + (j->npbits % 8 != 0) : 0;
    if (bm) /* bits past npbits stay clear for the next record */
        memset(j->pbits, 0, bm);
    j->npend = j->npbits = j->pend_data = 0;
}
