/* The journal of a copy: format and rules in journal.h.
 *
 * In memory the journal keeps three things: `done`, the byte ranges
 * recorded (sorted, merged); with digests, `dig`, an append-only arena of
 * every data block digest read or recorded, and `runs`, the blocks
 * recorded as sorted, disjoint runs, each all zero blocks or data blocks
 * whose digests lie one after another in the arena.  Opening collects every
 * record's runs with their order and resolves overlaps in one sweep (a heap
 * of the runs covering each point, latest on top): O(R log R) for R runs
 * however the records overlap, where replaying records one by one could be
 * quadratic on a hostile file.  A record while copying is laid over the
 * index by merging (the runs before it are not touched: a copy records
 * mostly ahead of what it recorded before).
 *
 * Records wait in memory until ic_journal_sync writes them as a single
 * record: a crash then damages at most the last record, which is what lets
 * opening tell a torn tail from damage in the middle. */
#include "journal.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "digest.h"

static const uint8_t MAGIC[8] = {'I', 'C', 'J', 'R', 'N', 'L', '\r', '\n'};
#define FIXED 52u      /* the header before its texts */
#define REC_HEADER 16u /* a record's length and checksums */
#define PAYLOAD_MIN 8u /* count and flags */
/* Damage in the middle is found by looking for a whole record after it;
 * a hostile file could make each offset look like a record header: give up
 * (and refuse) after this many that fail their payload's checksum. */
#define SCAN_CANDIDATES 64
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

struct ic_journal {
    int fd, dirfd;
    char *name; /* in dirfd */
    char *path; /* for messages */
    uint64_t size, block_size, nblocks;
    size_t digest_size; /* 0: no digests */
    int resumed;

    uint64_t end;     /* end of the last whole record: where the next one goes */
    int cut;          /* a torn tail lies past `end`: cut it before writing */
    int failed;       /* a write or sync failed: `failure` says how */
    struct ic_error failure;

    struct ic_range *done;
    size_t ndone, done_cap;
    struct run *runs;
    size_t nruns, runs_cap;
    uint8_t *dig;
    size_t ndig, dig_cap; /* in digests */

    /* recorded, not yet written: ranges, the blocks' zero bits (the
     * record's bitmap; bits past npbits clear), and the digests of the data
     * blocks, the last pend_data of the arena */
    struct ic_range *pend;
    size_t npend, pend_cap;
    uint8_t *pbits;
    size_t npbits, pbits_cap; /* bits; capacity in bytes */
    size_t pend_data;
};

/* ---- little helpers ---- */

static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get64(const uint8_t *p)
{
    return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32;
}

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
    put32(p, (uint32_t)v);
    put32(p + 4, (uint32_t)(v >> 32));
}

/* zlib's crc32 takes an unsigned int length: feed it in pieces */
static uint32_t crc_add(uint32_t crc, const uint8_t *p, size_t n)
{
    uLong c = crc;
    while (n > 0) {
        uInt k = n > (1u << 30) ? (1u << 30) : (uInt)n;
        c = crc32(c, p, k);
        p += k;
        n -= k;
    }
    return (uint32_t)c;
}

static uint32_t crc(const uint8_t *p, size_t n)
{
    return crc_add((uint32_t)crc32(0L, Z_NULL, 0), p, n);
}

static int all_zero(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i])
            return 0;
    return 1;
}

/* Grow the array whose pointer is at `pp` (elements of `size` bytes) to
 * hold at least `need`: 0, or -1 (nothing changed) when that does not fit
 * in memory.  The pointer is read and written through memcpy: it is a
 * struct ic_range * or a uint8_t *, not a void *. */
static int reserve(void *pp, size_t *cap, size_t need, size_t size)
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

/* Read up to n bytes at off: how many (fewer only at the end of the file), or -1 */
static ssize_t read_at(int fd, uint8_t *p, size_t n, uint64_t off)
{
    size_t got = 0;
    while (got < n) {
        size_t k = n - got > (1u << 30) ? (1u << 30) : n - got;
        ssize_t r = pread(fd, p + got, k, (off_t)(off + got));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -1;
        if (r == 0)
            break;
        got += (size_t)r;
    }
    return (ssize_t)got;
}

static int write_at(int fd, const uint8_t *p, size_t n, uint64_t off)
{
    while (n > 0) {
        size_t k = n > (1u << 30) ? (1u << 30) : n;
        ssize_t w = pwrite(fd, p, k, (off_t)off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return -1;
        if (w == 0) {
            errno = EIO; /* no progress and no reason: do not spin */
            return -1;
        }
        p += w;
        n -= (size_t)w;
        off += (uint64_t)w;
    }
    return 0;
}

static int datasync(int fd)
{
    int r;
    while ((r = fdatasync(fd)) < 0 && errno == EINTR)
        ;
    return r;
}

/* The directory entry made or removed durable.  Some filesystems cannot
 * sync a directory (EINVAL): their entries are as durable as they get. */
static int sync_dir(struct ic_journal *j, struct ic_error *err)
{
    int r;
    while ((r = fsync(j->dirfd)) < 0 && errno == EINTR)
        ;
    if (r < 0 && errno != EINVAL && errno != ENOTSUP)
        return ic_error_os(err, errno, j->path, "cannot sync the journal's directory");
    return 0;
}

/* `text` (n bytes, hostile when from a file) for a message: printable
 * ASCII as is, other bytes escaped; when long, the part around byte `at`
 * (where two values start to differ) with "..." for what is left out. */
static void shorten(const char *text, size_t n, size_t at, char *out, size_t cap)
{
    enum { BEFORE = 24, SHOWN = 72 };
    size_t start = n > SHOWN && at > BEFORE ? at - BEFORE : 0;
    if (n > SHOWN && start > n - SHOWN)
        start = n - SHOWN;
    size_t stop = n - start > SHOWN ? start + SHOWN : n;
    size_t o = 0;
    if (start > 0)
        o += (size_t)snprintf(out + o, cap - o, "...");
    for (size_t i = start; i < stop && o + 5 < cap; i++) {
        unsigned char c = (unsigned char)text[i];
        if (c >= 0x20 && c < 0x7f && c != '\\' && c != '\'')
            out[o++] = (char)c;
        else
            o += (size_t)snprintf(out + o, cap - o, "\\x%02x", c);
    }
    if (stop < n && o + 4 < cap)
        o += (size_t)snprintf(out + o, cap - o, "...");
    out[o < cap ? o : cap - 1] = '\0';
}

/* ---- the index ---- */

static uint64_t blocks_of(const struct ic_journal *j, uint64_t bytes)
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

/* Whether range r is one a record may hold: non-empty, inside size, on
 * block boundaries (or ending at size). */
static int range_ok(const struct ic_journal *j, struct ic_range r)
{
    if (r.length == 0 || r.offset >= j->size || r.length > j->size - r.offset)
        return 0;
    uint64_t e = r.offset + r.length;
    return r.offset % j->block_size == 0 && (e % j->block_size == 0 || e == j->size);
}

/* What the blocks of a record are: zero or data, per block from a byte
 * each (the caller's flags), from a bit each (a record's bitmap), or all
 * alike (a run as blkhash's sink tells it) */
enum kinds_mode { KINDS_BYTES, KINDS_BITS, KINDS_ALL_DATA, KINDS_ALL_ZERO };
struct kinds {
    enum kinds_mode mode;
    const uint8_t *p;
};

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
        uint64_t first = r[i].offset / j->block_size, count = blocks_of(j, r[i].length);
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

/* ---- the file ---- */

static uint8_t *build_header(const struct ic_journal_identity *id, size_t *len)
{
    const char *text[4] = {id->algorithm ? id->algorithm : "", id->source ? id->source : "",
                           id->destination ? id->destination : "",
                           id->options ? id->options : ""};
    size_t tl[4], h = FIXED + 4;
    for (int i = 0; i < 4; i++) {
        tl[i] = strlen(text[i]);
        h += tl[i];
    }
    uint8_t *b = malloc(h);
    if (!b)
        return NULL;
    memcpy(b, MAGIC, 8);
    put32(b + 8, IC_JOURNAL_VERSION);
    put32(b + 12, (uint32_t)h);
    put64(b + 16, id->size);
    put64(b + 24, id->block_size);
    put32(b + 32, (uint32_t)id->digest_size);
    size_t o = FIXED;
    for (int i = 0; i < 4; i++) {
        put32(b + 36 + 4 * i, (uint32_t)tl[i]);
        memcpy(b + o, text[i], tl[i]);
        o += tl[i];
    }
    put32(b + o, crc(b, o));
    *len = h;
    return b;
}

/* A new header at 0 of an empty file, durable, its name too */
static int write_header(struct ic_journal *j, const struct ic_journal_identity *id,
                        struct ic_error *err)
{
    size_t h;
    uint8_t *b = build_header(id, &h);
    if (!b)
        return ic_error_nomem(err);
    int r = write_at(j->fd, b, h, 0);
    free(b);
    if (r < 0)
        return ic_error_os(err, errno, j->path, "cannot write the journal");
    if (datasync(j->fd) < 0)
        return ic_error_os(err, errno, j->path, "cannot sync the journal");
    j->end = h;
    return sync_dir(j, err);
}

/* Whether the file (p[0..n), all of it) is the start of the header `ours`
 * (h bytes) that a crash interrupted: a part of it, maybe followed by
 * zeros (a size that reached the disk before the data), but not all of it.
 * Only our own header: a damaged journal, or one another copy began, is
 * refused rather than written over. */
static int torn_creation(const uint8_t *p, size_t n, const uint8_t *ours, size_t h)
{
    if (n > h)
        return 0;
    size_t same = 0;
    while (same < n && p[same] == ours[same])
        same++;
    return same < h && all_zero(p + same, n - same);
}

#define CORRUPT(...) ic_error_format(err, j->path, "corrupt journal " __VA_ARGS__)

static int check_identity(struct ic_journal *j, const uint8_t *p, uint32_t h,
                          const struct ic_journal_identity *id, struct ic_error *err)
{
    const char *names[4] = {"digest algorithm", "source", "destination", "options"};
    const char *ours[4] = {id->algorithm ? id->algorithm : "", id->source ? id->source : "",
                           id->destination ? id->destination : "",
                           id->options ? id->options : ""};
    const char *theirs[4];
    size_t tl[4];
    uint64_t o = FIXED;
    for (int i = 0; i < 4; i++) {
        tl[i] = get32(p + 36 + 4 * i);
        if (tl[i] > IC_JOURNAL_TEXT_MAX || o + tl[i] > (uint64_t)h - 4)
            return CORRUPT("header: text %d is %zu bytes long", i, tl[i]);
        theirs[i] = (const char *)p + o;
        o += tl[i];
    }
    if (o != (uint64_t)h - 4)
        return CORRUPT("header: %u bytes, its texts end at %llu", h, (unsigned long long)o);
    char where[80], a[180], b[180];
    shorten(j->path, strlen(j->path), strlen(j->path), where, sizeof where);
    /* the texts first: a journal of another copy is told by its source
     * or destination rather than by a size that follows from them */
    static const int order[4] = {1, 2, 3, 0};
    for (int k = 0; k < 4; k++) {
        int i = order[k];
        size_t n = strlen(ours[i]);
        if (n == tl[i] && memcmp(ours[i], theirs[i], n) == 0)
            continue;
        size_t at = 0;
        while (at < n && at < tl[i] && ours[i][at] == theirs[i][at])
            at++;
        if (i == 0) {
            snprintf(a, sizeof a, "%s", tl[0] ? "" : "none");
            snprintf(b, sizeof b, "%s", n ? "" : "none");
        } else {
            a[0] = b[0] = '\0';
        }
        if (!a[0])
            shorten(theirs[i], tl[i], at, a, sizeof a);
        if (!b[0])
            shorten(ours[i], n, at, b, sizeof b);
        return ic_error_value(err, "journal %s belongs to another copy: its %s is '%s', this "
                              "copy's '%s'", where, names[i], a, b);
    }
    const char *nnames[3] = {"size", "block size", "digest size"};
    uint64_t nt[3] = {get64(p + 16), get64(p + 24), get32(p + 32)};
    uint64_t no[3] = {id->size, id->block_size, id->digest_size};
    for (int i = 0; i < 3; i++)
        if (nt[i] != no[i])
            return ic_error_value(err, "journal %s belongs to another copy: its %s is %llu, "
                                  "this copy's %llu", where, nnames[i],
                                  (unsigned long long)nt[i], (unsigned long long)no[i]);
    return 0;
}

/* Whether a whole record starts somewhere in (from, fsize): then what is
 * damaged at `from` is in the middle of the journal, not its torn tail. */
static int whole_record_after(struct ic_journal *j, uint64_t from, uint64_t fsize, int *found,
                              struct ic_error *err)
{
    *found = 0;
    /* a window as long as what is left, at most WINDOW: a torn tail is
     * usually a few bytes */
    enum { WINDOW = 1 << 20 };
    size_t cap = fsize - from < WINDOW ? (size_t)(fsize - from) : WINDOW;
    uint8_t *buf = malloc(cap ? cap : 1);
    if (!buf)
        return ic_error_nomem(err);
    int candidates = 0, ret = 0;
    uint64_t at = from + 1;
    while (at + REC_HEADER <= fsize && !*found && ret == 0) {
        size_t want = fsize - at < cap ? (size_t)(fsize - at) : cap;
        ssize_t got = read_at(j->fd, buf, want, at);
        if (got < 0) {
            ret = ic_error_os(err, errno, j->path, "cannot read the journal");
            break;
        }
        if ((size_t)got < REC_HEADER)
            break;
        size_t i;
        for (i = 0; i + REC_HEADER <= (size_t)got; i++) {
            const uint8_t *hd = buf + i;
            uint64_t len = get64(hd), pos = at + i;
            /* the length first: it rules out most offsets without a checksum */
            if (len < PAYLOAD_MIN || len > fsize - pos - REC_HEADER || crc(hd, 12) != get32(hd + 12))
                continue;
            if (++candidates > SCAN_CANDIDATES) {
                *found = 1; /* no crash writes this many record headers */
                break;
            }
            /* the payload's checksum, read apart (it may be long) */
            uint32_t c = (uint32_t)crc32(0L, Z_NULL, 0);
            uint8_t chunk[65536];
            uint64_t done = 0;
            while (done < len) {
                size_t k = len - done < sizeof chunk ? (size_t)(len - done) : sizeof chunk;
                ssize_t r = read_at(j->fd, chunk, k, pos + REC_HEADER + done);
                if (r != (ssize_t)k) {
                    ret = ic_error_os(err, r < 0 ? errno : EIO, j->path,
                                      "cannot read the journal");
                    break;
                }
                c = crc_add(c, chunk, k);
                done += k;
            }
            if (ret == 0 && c == get32(hd + 8)) {
                *found = 1;
                break;
            }
            if (ret)
                break;
        }
        at += i; /* the window's last header-sized tail is read again */
        if (i == 0)
            break;
    }
    free(buf);
    return ret;
}

/* Grow the arena to hold `more` digests more */
static int reserve_digests(struct ic_journal *j, uint64_t more)
{
    if (more > SIZE_MAX - j->ndig)
        return -1;
    size_t need = j->ndig + (size_t)more;
    if (need > SIZE_MAX / j->digest_size)
        return -1;
    return reserve(&j->dig, &j->dig_cap, need, j->digest_size);
}

/* Check a whole record's payload and add its ranges, pieces and digests */
static int take_record(struct ic_journal *j, uint64_t pos, const uint8_t *p, uint64_t len,
                       struct piece **pieces, size_t *npieces, size_t *pieces_cap,
                       uint64_t *seq, struct ic_error *err)
{
    uint32_t n = get32(p), flags = get32(p + 4);
    if (flags != 0)
        return CORRUPT("record at %llu: unknown flags %#x", (unsigned long long)pos, flags);
    if (n == 0 || n > (len - PAYLOAD_MIN) / 16)
        return CORRUPT("record at %llu: %u ranges in %llu bytes", (unsigned long long)pos, n,
                       (unsigned long long)len);
    uint64_t rest = len - PAYLOAD_MIN - 16ull * n, blocks = 0;
    const uint8_t *rp = p + PAYLOAD_MIN;
    for (uint32_t i = 0; i < n; i++) {
        struct ic_range r = {get64(rp + 16 * i), get64(rp + 16 * i + 8)};
        if (!range_ok(j, r))
            return CORRUPT("record at %llu: range %llu+%llu (size %llu, block size %llu)",
                           (unsigned long long)pos, (unsigned long long)r.offset,
                           (unsigned long long)r.length, (unsigned long long)j->size,
                           (unsigned long long)j->block_size);
        if (j->digest_size) {
            /* the blocks must fit the bitmap the record holds */
            uint64_t c = blocks_of(j, r.length);
            if (rest > UINT64_MAX / 8 || c > rest * 8 - blocks)
                return CORRUPT("record at %llu: more blocks than its %llu bytes describe",
                               (unsigned long long)pos, (unsigned long long)len);
            blocks += c;
        }
    }
    const uint8_t *bits = rp + 16ull * n;
    uint64_t ndata = 0;
    if (j->digest_size) {
        uint64_t bm = blocks / 8 + (blocks % 8 != 0);
        if (bm > rest)
            return CORRUPT("record at %llu: its zero-block bitmap is cut short",
                           (unsigned long long)pos);
        if (blocks % 8 && bits[bm - 1] >> (blocks % 8))
            return CORRUPT("record at %llu: bits set past its %llu blocks",
                           (unsigned long long)pos, (unsigned long long)blocks);
        uint64_t zeros = 0;
        for (uint64_t i = 0; i < bm; i++)
            zeros += (uint64_t)__builtin_popcount(bits[i]);
        ndata = blocks - zeros;
        if (ndata > (rest - bm) / j->digest_size || rest - bm != ndata * j->digest_size)
            return CORRUPT("record at %llu: %llu digest bytes for %llu data blocks",
                           (unsigned long long)pos, (unsigned long long)(rest - bm),
                           (unsigned long long)ndata);
    } else if (rest != 0) {
        return CORRUPT("record at %llu: %llu bytes after its ranges", (unsigned long long)pos,
                       (unsigned long long)rest);
    }

    /* the record holds: add it (its sizes are bounded by its own length,
     * so memory follows the file's size) */
    struct ic_range *ranges = malloc(n * sizeof *ranges);
    if (!ranges)
        return ic_error_nomem(err);
    for (uint32_t i = 0; i < n; i++)
        ranges[i] = (struct ic_range){get64(rp + 16 * i), get64(rp + 16 * i + 8)};
    int ret = 0;
    if (reserve(&j->done, &j->done_cap, j->ndone + n, sizeof *j->done) < 0) {
        ret = ic_error_nomem(err);
    } else {
        memcpy(j->done + j->ndone, ranges, n * sizeof *ranges);
        j->ndone += n;
    }
    if (ret == 0 && j->digest_size) {
        struct kinds k = {KINDS_BITS, bits};
        size_t np = count_pieces(j, ranges, n, &k);
        if (reserve_digests(j, ndata) < 0 ||
            reserve(pieces, pieces_cap, *npieces + np, sizeof **pieces) < 0) {
            ret = ic_error_nomem(err);
        } else {
            *npieces += make_pieces(j, ranges, n, &k, j->ndig, seq, *pieces + *npieces);
            if (ndata) /* an arena not yet allocated is NULL: no memcpy there */
                memcpy(j->dig + j->ndig * j->digest_size,
                       bits + (blocks / 8 + (blocks % 8 != 0)), ndata * j->digest_size);
            j->ndig += ndata;
        }
    }
    free(ranges);
    return ret;
}

/* Read an existing journal: its header checked against id, its records */
static int load(struct ic_journal *j, const struct ic_journal_identity *id, uint64_t fsize,
                struct ic_error *err)
{
    size_t n = fsize < IC_JOURNAL_HEADER_MAX ? (size_t)fsize : IC_JOURNAL_HEADER_MAX;
    uint8_t *head = malloc(n ? n : 1);
    if (!head)
        return ic_error_nomem(err);
    ssize_t got = read_at(j->fd, head, n, 0);
    if (got < 0) {
        free(head);
        return ic_error_os(err, errno, j->path, "cannot read the journal");
    }
    if ((size_t)got < n) /* it shrank since fstat (we hold the lock: not a copy of ours) */
        fsize = n = (size_t)got;
    size_t hours;
    uint8_t *ours = build_header(id, &hours);
    if (!ours) {
        free(head);
        return ic_error_nomem(err);
    }
    int torn = fsize == n && torn_creation(head, n, ours, hours);
    free(ours);
    if (torn) {
        free(head);
        if (ftruncate(j->fd, 0) < 0)
            return ic_error_os(err, errno, j->path, "cannot truncate the journal");
        return write_header(j, id, err);
    }
    int ret = 0;
    uint32_t h = n >= 16 ? get32(head + 12) : 0;
    if (n < 16 || memcmp(head, MAGIC, 8) != 0)
        ret = ic_error_format(err, j->path, "not an imgcopy journal (no magic)");
    else if (get32(head + 8) != IC_JOURNAL_VERSION)
        ret = ic_error_format(err, j->path, "corrupt journal: unsupported version %u",
                              get32(head + 8));
    else if (h < FIXED + 4 || h > n)
        ret = CORRUPT("header: %u bytes long, the file %llu", h, (unsigned long long)fsize);
    else if (get32(head + h - 4) != crc(head, h - 4))
        ret = CORRUPT("header: its checksum fails");
    else
        ret = check_identity(j, head, h, id, err);
    free(head);
    if (ret)
        return ret;
    j->resumed = 1;
    if (fsize == h) {
        j->end = h;
        return 0;
    }

    struct piece *pieces = NULL;
    size_t npieces = 0, pieces_cap = 0;
    uint8_t *payload = NULL;
    size_t payload_cap = 0;
    uint64_t seq = 0, pos = h;
    while (pos < fsize && ret == 0) {
        uint8_t hd[REC_HEADER];
        int whole = 0;
        uint64_t len = 0;
        if (fsize - pos >= REC_HEADER) {
            got = read_at(j->fd, hd, REC_HEADER, pos);
            if (got < 0) {
                ret = ic_error_os(err, errno, j->path, "cannot read the journal");
                break;
            }
            len = get64(hd);
            if (got == REC_HEADER && crc(hd, 12) == get32(hd + 12) && len >= PAYLOAD_MIN &&
                len <= fsize - pos - REC_HEADER) {
                if (len > SIZE_MAX) {
                    ret = ic_error_nomem(err);
                    break;
                }
                if (reserve(&payload, &payload_cap, (size_t)len, 1) < 0) {
                    ret = ic_error_nomem(err);
                    break;
                }
                got = read_at(j->fd, payload, (size_t)len, pos + REC_HEADER);
                if (got < 0) {
                    ret = ic_error_os(err, errno, j->path, "cannot read the journal");
                    break;
                }
                whole = (uint64_t)got == len && crc(payload, (size_t)len) == get32(hd + 8);
            }
        }
        if (!whole) {
            int found;
            ret = whole_record_after(j, pos, fsize, &found, err);
            if (ret == 0 && found)
                ret = CORRUPT("record at %llu: damaged (its checksum fails), and records "
                              "follow it", (unsigned long long)pos);
            break; /* else the torn tail: dropped */
        }
        ret = take_record(j, pos, payload, len, &pieces, &npieces, &pieces_cap, &seq, err);
        pos += REC_HEADER + len;
    }
    free(payload);
    if (ret == 0) {
        j->end = pos;
        j->cut = pos < fsize;
        j->ndone = merge_ranges(j->done, j->ndone);
        if (j->digest_size) {
            free(j->runs);
            j->runs = NULL;
            if (resolve(pieces, npieces, &j->runs, &j->nruns) < 0)
                ret = ic_error_nomem(err);
            j->runs_cap = j->nruns;
        }
    }
    free(pieces);
    return ret;
}

static void free_journal(struct ic_journal *j)
{
    if (j->fd >= 0)
        close(j->fd);
    if (j->dirfd >= 0)
        close(j->dirfd);
    free(j->name);
    free(j->path);
    free(j->done);
    free(j->runs);
    free(j->dig);
    free(j->pend);
    free(j->pbits);
    free(j);
}

static int check_id(const struct ic_journal_identity *id, struct ic_error *err)
{
    if (id->block_size == 0)
        return ic_error_value(err, "journal: the block size must be at least 1");
    if (id->algorithm && !id->algorithm[0])
        return ic_error_value(err, "journal: an empty algorithm name (NULL: no digests)");
    if (id->algorithm ? id->digest_size == 0 || id->digest_size > IC_DIGEST_MAX
                      : id->digest_size != 0)
        return ic_error_value(err, "journal: digest size %zu with %s", id->digest_size,
                              id->algorithm ? "an algorithm" : "no algorithm");
    const char *text[4] = {id->algorithm, id->source, id->destination, id->options};
    for (int i = 0; i < 4; i++)
        if (text[i] && strlen(text[i]) > IC_JOURNAL_TEXT_MAX)
            return ic_error_value(err, "journal: an identity text of %zu bytes (at most %u)",
                                  strlen(text[i]), IC_JOURNAL_TEXT_MAX);
    return 0;
}

/* path into the directory to open and the name in it */
static int split_path(struct ic_journal *j, const char *path, char **dir, struct ic_error *err)
{
    const char *slash = strrchr(path, '/');
    const char *name = slash ? slash + 1 : path;
    if (!name[0] || strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
        return ic_error_value(err, "journal %s: not a file name", path);
    j->name = strdup(name);
    if (!slash)
        *dir = strdup(".");
    else if (slash == path)
        *dir = strdup("/");
    else
        *dir = strndup(path, (size_t)(slash - path));
    if (!j->name || !*dir)
        return ic_error_nomem(err);
    return 0;
}

int ic_journal_open(const char *path, const struct ic_journal_identity *id,
                    struct ic_journal **out, struct ic_error *err)
{
    *out = NULL;
    if (!path || !path[0])
        return ic_error_value(err, "journal: no path");
    if (check_id(id, err) < 0)
        return -1;
    struct ic_journal *j = calloc(1, sizeof *j);
    if (!j)
        return ic_error_nomem(err);
    j->fd = j->dirfd = -1;
    j->size = id->size;
    j->block_size = id->block_size;
    j->nblocks = id->size / id->block_size + (id->size % id->block_size != 0);
    j->digest_size = id->algorithm ? id->digest_size : 0;
    char *dir = NULL;
    int ret = -1, created = 0;
    if (!(j->path = strdup(path))) {
        ic_error_nomem(err);
        goto fail;
    }
    if (split_path(j, path, &dir, err) < 0)
        goto fail;
    /* the name is resolved once, in a directory held open: a rename of the
     * directory or a chdir does not make complete() remove another file */
    j->dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (j->dirfd < 0) {
        ic_error_os(err, errno, dir, "cannot open the journal's directory");
        goto fail;
    }
    for (int tries = 0;; tries++) {
        j->fd = openat(j->dirfd, j->name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (j->fd >= 0) {
            created = 1;
            break;
        }
        if (errno != EEXIST) {
            ic_error_os(err, errno, path, "cannot create the journal");
            goto fail;
        }
        j->fd = openat(j->dirfd, j->name, O_RDWR | O_CLOEXEC);
        if (j->fd >= 0)
            break;
        /* removed between the two: another copy completed; try again */
        if (errno != ENOENT || tries >= 8) {
            ic_error_os(err, errno, path, "cannot open the journal");
            goto fail;
        }
    }
    int r;
    while ((r = flock(j->fd, LOCK_EX | LOCK_NB)) < 0 && errno == EINTR)
        ;
    if (r < 0 && errno == EWOULDBLOCK) {
        created = 0; /* the other process's file */
        ic_error_os(err, EAGAIN, path, "the journal is in use by another copy");
        goto fail;
    }
    /* a filesystem without locks: the lock only guards against running one
     * command twice at once, which the user can avoid */
    if (r < 0 && errno != ENOLCK && errno != EOPNOTSUPP && errno != ENOSYS) {
        ic_error_os(err, errno, path, "cannot lock the journal");
        goto fail;
    }
    struct stat st;
    if (fstat(j->fd, &st) < 0) {
        ic_error_os(err, errno, path, "cannot stat the journal");
        goto fail;
    }
    if (!S_ISREG(st.st_mode)) {
        created = 0;
        ic_error_value(err, "journal %s is not a regular file", path);
        goto fail;
    }
    if (created)
        ret = write_header(j, id, err);
    else
        ret = load(j, id, (uint64_t)st.st_size, err);
    if (ret < 0)
        goto fail;
    free(dir);
    *out = j;
    return 0;
fail:
    /* a journal made here that never got its header recorded nothing */
    if (created && unlinkat(j->dirfd, j->name, 0) == 0)
        (void)fsync(j->dirfd); /* best effort: the error already said what failed */
    free(dir);
    free_journal(j);
    return -1;
}

int ic_journal_resumed(const struct ic_journal *j)
{
    return j->resumed;
}

uint64_t ic_journal_block_size(const struct ic_journal *j)
{
    return j->block_size;
}

size_t ic_journal_digest_size(const struct ic_journal *j)
{
    return j->digest_size;
}

uint64_t ic_journal_size(const struct ic_journal *j)
{
    return j->size;
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

/* Append one record of ranges r[0..n) whose blocks are as `k` says */
static int record(struct ic_journal *j, const struct ic_range *ranges, size_t n,
                  const struct kinds *k, const uint8_t *digests, struct ic_error *err)
{
    if (j->failed) {
        if (err)
            *err = j->failure;
        return -1;
    }
    /* check everything before changing anything */
    size_t used = 0;
    uint64_t blocks = 0, ndata = 0;
    for (size_t i = 0; i < n; i++) {
        if (ranges[i].length == 0)
            continue;
        if (!range_ok(j, ranges[i]))
            return ic_error_value(err, "journal: range %llu+%llu is not whole blocks of %llu "
                                  "inside %llu bytes", (unsigned long long)ranges[i].offset,
                                  (unsigned long long)ranges[i].length,
                                  (unsigned long long)j->block_size,
                                  (unsigned long long)j->size);
        uint64_t c = blocks_of(j, ranges[i].length);
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
    if (reserve(&j->pend, &j->pend_cap, j->npend + used, sizeof *j->pend) < 0)
        goto nomem;
    size_t old_bytes = j->npbits / 8 + (j->npbits % 8 != 0);
    if (j->digest_size) {
        np = count_pieces(j, add, used, k);
        pieces = malloc(np * sizeof *pieces);
        if (!pieces || reserve_digests(j, ndata) < 0 ||
            blocks > SIZE_MAX - 8 - j->npbits ||
            reserve(&j->pbits, &j->pbits_cap, (j->npbits + blocks + 7) / 8, 1) < 0)
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
            reserve(&j->runs, &j->runs_cap, j->nruns + 2 * ntop, sizeof *j->runs) < 0)
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
        reserve(&j->done, &j->done_cap, j->ndone + nadd, sizeof *j->done) < 0)
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

int ic_journal_record(struct ic_journal *j, const struct ic_range *ranges, size_t n,
                      const uint8_t *zero_flags, const uint8_t *digests, struct ic_error *err)
{
    struct kinds k = {KINDS_BYTES, zero_flags};
    return record(j, ranges, n, &k, digests, err);
}

int ic_journal_record_run(struct ic_journal *j, uint64_t first, uint64_t count,
                          const uint8_t *digests, struct ic_error *err)
{
    if (count == 0)
        return record(j, NULL, 0, NULL, NULL, err); /* nothing, but a failure sticks */
    if (first >= j->nblocks || count > j->nblocks - first)
        return ic_error_value(err, "journal: blocks %llu+%llu are not among its %llu",
                              (unsigned long long)first, (unsigned long long)count,
                              (unsigned long long)j->nblocks);
    uint64_t off = first * j->block_size;
    struct ic_range r = {off, first + count == j->nblocks ? j->size - off
                                                           : count * j->block_size};
    struct kinds k = {digests ? KINDS_ALL_DATA : KINDS_ALL_ZERO, NULL};
    return record(j, &r, 1, &k, digests, err);
}

static int sticky(struct ic_journal *j, int errnum, const char *what, struct ic_error *err)
{
    ic_error_os(&j->failure, errnum, j->path, "%s", what);
    j->failed = 1;
    if (err)
        *err = j->failure;
    return -1;
}

int ic_journal_sync(struct ic_journal *j, struct ic_error *err)
{
    if (j->failed) {
        if (err)
            *err = j->failure;
        return -1;
    }
    if (j->npend == 0)
        return 0;
    uint64_t bm = j->digest_size ? j->npbits / 8 + (j->npbits % 8 != 0) : 0;
    uint64_t len = PAYLOAD_MIN + 16ull * j->npend + bm + (uint64_t)j->pend_data * j->digest_size;
    if (len > SIZE_MAX - REC_HEADER)
        return ic_error_nomem(err);
    uint8_t *b = calloc(1, (size_t)len + REC_HEADER);
    if (!b)
        return ic_error_nomem(err);
    uint8_t *p = b + REC_HEADER;
    put32(p, (uint32_t)j->npend);
    put32(p + 4, 0);
    for (size_t i = 0; i < j->npend; i++) {
        put64(p + PAYLOAD_MIN + 16 * i, j->pend[i].offset);
        put64(p + PAYLOAD_MIN + 16 * i + 8, j->pend[i].length);
    }
    if (j->digest_size) {
        uint8_t *bits = p + PAYLOAD_MIN + 16 * j->npend;
        if (bm)
            memcpy(bits, j->pbits, bm);
        if (j->pend_data)
            memcpy(bits + bm, j->dig + (j->ndig - j->pend_data) * j->digest_size,
                   j->pend_data * j->digest_size);
    }
    put64(b, len);
    put32(b + 8, crc(p, (size_t)len));
    put32(b + 12, crc(b, 12));
    int ret = 0;
    if (j->cut && ftruncate(j->fd, (off_t)j->end) < 0)
        ret = sticky(j, errno, "cannot cut the journal's torn tail", err);
    else if (write_at(j->fd, b, (size_t)len + REC_HEADER, j->end) < 0)
        ret = sticky(j, errno, "cannot write the journal", err);
    else if (datasync(j->fd) < 0)
        ret = sticky(j, errno, "cannot sync the journal", err);
    free(b);
    if (ret)
        return ret;
    j->cut = 0;
    j->end += REC_HEADER + len;
    if (bm) /* bits past npbits stay clear for the next record */
        memset(j->pbits, 0, bm);
    j->npend = j->npbits = j->pend_data = 0;
    return 0;
}

int ic_journal_complete(struct ic_journal *j, struct ic_error *err)
{
    int ret = 0;
    if (unlinkat(j->dirfd, j->name, 0) < 0)
        ret = ic_error_os(err, errno, j->path, "cannot remove the journal");
    else
        ret = sync_dir(j, err);
    free_journal(j);
    return ret;
}

void ic_journal_close(struct ic_journal *j)
{
    if (j)
        free_journal(j);
}
