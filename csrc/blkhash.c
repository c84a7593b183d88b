/* blkhash, fed out of order (blkhash.h). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "blkhash.h"
#include "imgcopy.h"

/* Digests of blocks done ahead of `next`, in block order: `digests` holds
 * `count` of them, or is NULL for a run of full zero blocks (Z each). */
struct run {
    uint64_t first, count;
    uint8_t *digests;
};

/* A block being assembled from pieces: which bytes arrived (sorted,
 * disjoint, neighbours merged). */
struct piece {
    uint64_t start, end;
};
struct partial {
    uint64_t block;
    uint8_t *buf;
    size_t len;
    struct piece *pieces;
    size_t npieces, cap;
};

/* Z repeated, so that a long zero run is folded in big updates */
#define ZERO_RUN_DIGESTS 1024

struct ic_blkhash {
    const struct ic_digest *d;
    size_t dsize;
    uint64_t block, size, nblocks;
    uint8_t zero_digest[IC_DIGEST_MAX];      /* Z */
    uint8_t tail_zero_digest[IC_DIGEST_MAX]; /* a short last block of zeros */
    uint8_t *zeros_run;                      /* ZERO_RUN_DIGESTS copies of Z */

    pthread_mutex_t lock;
    struct ic_digest_ctx *outer;
    uint64_t next; /* blocks before it are folded into `outer` */
    struct run *runs;
    size_t nruns, runs_cap;
    struct partial *parts;
    size_t nparts, parts_cap;
    struct ic_digest_ctx **pool; /* idle contexts for the feeders */
    size_t npool, pool_cap;
    int failed;
    struct ic_error error;
    /* told of each run of blocks as it is done (ic_blkhash_set_sink) */
    ic_blkhash_sink_fn *sink;
    void *sink_ctx;
};

static uint64_t block_len(const struct ic_blkhash *h, uint64_t i)
{
    uint64_t start = i * h->block;
    return h->size - start < h->block ? h->size - start : h->block;
}

/* ---- failures ---------------------------------------------------------- */

/* lock held */
static int fail_locked(struct ic_blkhash *h, const struct ic_error *err)
{
    if (!h->failed) {
        h->failed = 1;
        h->error = *err;
    }
    return -1;
}

void ic_blkhash_fail(struct ic_blkhash *h, const struct ic_error *err)
{
    pthread_mutex_lock(&h->lock);
    fail_locked(h, err);
    pthread_mutex_unlock(&h->lock);
}

static int failed(struct ic_blkhash *h, struct ic_error *err)
{
    pthread_mutex_lock(&h->lock);
    int f = h->failed;
    if (f && err)
        *err = h->error;
    pthread_mutex_unlock(&h->lock);
    return f;
}

/* lock held: a byte fed twice is the feeder's bug */
static int fed_twice(struct ic_blkhash *h, uint64_t block, struct ic_error *err)
{
    struct ic_error e = {0};
    ic_error_value(&e, "blkhash: block %llu (offset %llu) was fed twice",
                   (unsigned long long)block, (unsigned long long)(block * h->block));
    fail_locked(h, &e);
    if (err)
        *err = e;
    return -1;
}

/* ---- contexts ---------------------------------------------------------- */

static struct ic_digest_ctx *take_ctx(struct ic_blkhash *h, struct ic_error *err)
{
    pthread_mutex_lock(&h->lock);
    struct ic_digest_ctx *c = h->npool ? h->pool[--h->npool] : NULL;
    pthread_mutex_unlock(&h->lock);
    return c ? c : ic_digest_ctx_new(h->d, err);
}

static void give_ctx(struct ic_blkhash *h, struct ic_digest_ctx *c)
{
    pthread_mutex_lock(&h->lock);
    if (h->npool == h->pool_cap) {
        size_t cap = h->pool_cap ? 2 * h->pool_cap : 8;
        struct ic_digest_ctx **p = realloc(h->pool, cap * sizeof *p);
        if (p) {
            h->pool = p;
            h->pool_cap = cap;
        }
    }
    if (h->npool < h->pool_cap) {
        h->pool[h->npool++] = c;
        c = NULL;
    }
    pthread_mutex_unlock(&h->lock);
    ic_digest_ctx_free(c);
}

/* ---- folding digests in block order ------------------------------------ */

/* lock held */
static int fold(struct ic_blkhash *h, const struct run *r, struct ic_error *err)
{
    if (r->digests)
        return ic_digest_add(h->outer, r->digests, r->count * h->dsize, err);
    for (uint64_t left = r->count; left;) {
        uint64_t n = left < ZERO_RUN_DIGESTS ? left : ZERO_RUN_DIGESTS;
        if (ic_digest_add(h->outer, h->zeros_run, n * h->dsize, err) < 0)
            return -1;
        left -= n;
    }
    return 0;
}

/* lock held: fold the runs that continue `next` */
static int drain(struct ic_blkhash *h, struct ic_error *err)
{
    size_t k = 0;
    int ret = 0;
    for (; k < h->nruns && h->runs[k].first == h->next; k++) {
        if (ret == 0 && fold(h, &h->runs[k], err) < 0)
            ret = fail_locked(h, err);
        h->next += h->runs[k].count;
        free(h->runs[k].digests);
    }
    if (k) {
        memmove(h->runs, h->runs + k, (h->nruns - k) * sizeof *h->runs);
        h->nruns -= k;
    }
    return ret;
}

/* lock held: whether block `i` is waiting in the partial table */
static struct partial *find_partial(struct ic_blkhash *h, uint64_t i)
{
    for (size_t k = 0; k < h->nparts; k++)
        if (h->parts[k].block == i)
            return &h->parts[k];
    return NULL;
}

/* Blocks [first, first+count) are done; `digests` (owned from here on)
 * holds their digests, or NULL for full zero blocks. */
static int push_run(struct ic_blkhash *h, uint64_t first, uint64_t count, uint8_t *digests,
                    struct ic_error *err)
{
    struct run r = {first, count, digests};
    pthread_mutex_lock(&h->lock);
    int ret = -1;
    if (h->failed) {
        *err = h->error;
        goto out;
    }
    if (first < h->next) {
        fed_twice(h, first, err);
        goto out;
    }
    if (h->sink)
        h->sink(h->sink_ctx, first, count, digests);
    for (size_t k = 0; k < h->nparts; k++)
        if (h->parts[k].block >= first && h->parts[k].block - first < count) {
            fed_twice(h, h->parts[k].block, err);
            goto out;
        }
    if (first == h->next) {
        ret = fold(h, &r, err) < 0 ? fail_locked(h, err) : 0;
        h->next += count;
        if (ret == 0)
            ret = drain(h, err);
        goto out;
    }
    /* ahead of a gap: keep it, in order */
    size_t lo = 0, hi = h->nruns;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (h->runs[mid].first < first)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo > 0 && h->runs[lo - 1].first + h->runs[lo - 1].count > first) {
        fed_twice(h, first, err);
        goto out;
    }
    if (lo < h->nruns && first + count > h->runs[lo].first) {
        fed_twice(h, h->runs[lo].first, err);
        goto out;
    }
    if (h->nruns == h->runs_cap) {
        size_t cap = h->runs_cap ? 2 * h->runs_cap : 64;
        struct run *p = realloc(h->runs, cap * sizeof *p);
        if (!p) {
            ic_error_nomem(err);
            fail_locked(h, err);
            goto out;
        }
        h->runs = p;
        h->runs_cap = cap;
    }
    memmove(h->runs + lo + 1, h->runs + lo, (h->nruns - lo) * sizeof *h->runs);
    h->runs[lo] = r;
    h->nruns++;
    r.digests = NULL; /* kept */
    ret = 0;
out:
    pthread_mutex_unlock(&h->lock);
    free(r.digests);
    return ret;
}

/* ---- feeding ----------------------------------------------------------- */

static int check_range(struct ic_blkhash *h, uint64_t off, uint64_t len, struct ic_error *err)
{
    if (off > h->size || len > h->size - off)
        return ic_error_value(err, "blkhash: bytes %llu-%llu lie beyond the end (%llu bytes)",
                              (unsigned long long)off, (unsigned long long)(off + len),
                              (unsigned long long)h->size);
    return failed(h, err) ? -1 : 0;
}

/* Digest of whole blocks [first, first+count) at `buf`. */
static int hash_blocks(struct ic_blkhash *h, uint64_t first, uint64_t count, const uint8_t *buf,
                       struct ic_error *err)
{
    uint8_t *digests = malloc(count * h->dsize);
    if (!digests)
        return ic_error_nomem(err);
    struct ic_digest_ctx *ctx = take_ctx(h, err);
    if (!ctx) {
        free(digests);
        return -1;
    }
    for (uint64_t k = 0; k < count; k++) {
        uint64_t len = block_len(h, first + k);
        uint8_t *out = digests + k * h->dsize;
        if (len == h->block && ic_is_zero(buf, (size_t)len)) {
            memcpy(out, h->zero_digest, h->dsize);
        } else if (ic_digest_once(ctx, buf, (size_t)len, out, err) < 0) {
            give_ctx(h, ctx);
            free(digests);
            return -1;
        }
        buf += len;
    }
    give_ctx(h, ctx);
    return push_run(h, first, count, digests, err);
}

/* A zero run of whole blocks: a short last block of zeros is hashed over
 * its own length, never replaced by Z. */
static int zero_blocks(struct ic_blkhash *h, uint64_t first, uint64_t count, struct ic_error *err)
{
    uint64_t full = count;
    if (first + count == h->nblocks && block_len(h, h->nblocks - 1) != h->block)
        full--;
    if (full && push_run(h, first, full, NULL, err) < 0)
        return -1;
    if (full == count)
        return 0;
    uint8_t *d = malloc(h->dsize);
    if (!d)
        return ic_error_nomem(err);
    memcpy(d, h->tail_zero_digest, h->dsize);
    return push_run(h, first + full, 1, d, err);
}

/* lock held: record bytes [start, end) of a partial block; -1 on overlap */
static int add_piece_range(struct partial *p, uint64_t start, uint64_t end)
{
    size_t k = 0;
    while (k < p->npieces && p->pieces[k].end <= start)
        k++;
    if (k < p->npieces && p->pieces[k].start < end)
        return -1;
    int join_prev = k > 0 && p->pieces[k - 1].end == start;
    int join_next = k < p->npieces && p->pieces[k].start == end;
    if (join_prev && join_next) {
        p->pieces[k - 1].end = p->pieces[k].end;
        memmove(p->pieces + k, p->pieces + k + 1, (p->npieces - k - 1) * sizeof *p->pieces);
        p->npieces--;
    } else if (join_prev) {
        p->pieces[k - 1].end = end;
    } else if (join_next) {
        p->pieces[k].start = start;
    } else {
        if (p->npieces == p->cap) {
            size_t cap = p->cap ? 2 * p->cap : 4;
            struct piece *n = realloc(p->pieces, cap * sizeof *n);
            if (!n)
                return -2;
            p->pieces = n;
            p->cap = cap;
        }
        memmove(p->pieces + k + 1, p->pieces + k, (p->npieces - k) * sizeof *p->pieces);
        p->pieces[k] = (struct piece){start, end};
        p->npieces++;
    }
    return 0;
}

/* lock held: the table entry of block i, made if need be */
static struct partial *get_partial(struct ic_blkhash *h, uint64_t i, struct ic_error *err)
{
    struct partial *p = find_partial(h, i);
    if (p)
        return p;
    if (h->nparts == h->parts_cap) {
        size_t cap = h->parts_cap ? 2 * h->parts_cap : 8;
        struct partial *n = realloc(h->parts, cap * sizeof *n);
        if (!n) {
            ic_error_nomem(err);
            return NULL;
        }
        h->parts = n;
        h->parts_cap = cap;
    }
    size_t len = (size_t)block_len(h, i);
    uint8_t *buf = malloc(len);
    if (!buf) {
        ic_error_nomem(err);
        return NULL;
    }
    p = &h->parts[h->nparts++];
    *p = (struct partial){.block = i, .buf = buf, .len = len};
    return p;
}

/* Bytes [start, end) of block i (not all of it): into the table; the
 * feeder that completes the block hashes it. */
static int add_piece(struct ic_blkhash *h, uint64_t i, uint64_t start, uint64_t end,
                     const uint8_t *data, struct ic_error *err)
{
    pthread_mutex_lock(&h->lock);
    if (h->failed) {
        *err = h->error;
        pthread_mutex_unlock(&h->lock);
        return -1;
    }
    int pending = i < h->next;
    for (size_t k = 0; !pending && k < h->nruns; k++)
        pending = i >= h->runs[k].first && i - h->runs[k].first < h->runs[k].count;
    if (pending) {
        fed_twice(h, i, err);
        pthread_mutex_unlock(&h->lock);
        return -1;
    }
    struct partial *p = get_partial(h, i, err);
    int r = p ? add_piece_range(p, start, end) : -2;
    if (r == -1) {
        fed_twice(h, i, err);
        pthread_mutex_unlock(&h->lock);
        return -1;
    }
    if (r < 0) {
        if (p)
            ic_error_nomem(err);
        fail_locked(h, err);
        pthread_mutex_unlock(&h->lock);
        return -1;
    }
    if (data)
        memcpy(p->buf + start, data, (size_t)(end - start));
    else
        memset(p->buf + start, 0, (size_t)(end - start));
    struct partial done = {0};
    if (p->npieces == 1 && p->pieces[0].start == 0 && p->pieces[0].end == p->len) {
        done = *p;
        *p = h->parts[--h->nparts];
    }
    pthread_mutex_unlock(&h->lock);
    if (!done.buf)
        return 0;
    int ret = hash_blocks(h, i, 1, done.buf, err);
    free(done.buf);
    free(done.pieces);
    return ret;
}

static int feed(struct ic_blkhash *h, uint64_t off, const uint8_t *buf, uint64_t len,
                struct ic_error *err)
{
    if (check_range(h, off, len, err) < 0)
        return -1;
    uint64_t end = off + len, pos = off;
    while (pos < end) {
        uint64_t i = pos / h->block, bs = i * h->block;
        uint64_t be = bs + block_len(h, i);
        const uint8_t *at = buf ? buf + (pos - off) : NULL;
        if (pos == bs && end >= be) {
            /* whole blocks from here; the short last one counts when reached */
            uint64_t n = (end - bs) / h->block;
            if (end == h->size && bs + n * h->block < end)
                n++;
            int r = buf ? hash_blocks(h, i, n, at, err) : zero_blocks(h, i, n, err);
            if (r < 0)
                return r;
            pos = bs + n * h->block < end ? bs + n * h->block : end;
        } else {
            uint64_t pe = end < be ? end : be;
            if (add_piece(h, i, pos - bs, pe - bs, at, err) < 0)
                return -1;
            pos = pe;
        }
    }
    return 0;
}

int ic_blkhash_update(struct ic_blkhash *h, uint64_t off, const void *buf, size_t len,
                      struct ic_error *err)
{
    return feed(h, off, buf, len, err);
}

int ic_blkhash_zero(struct ic_blkhash *h, uint64_t off, uint64_t len, struct ic_error *err)
{
    return feed(h, off, NULL, len, err);
}

/* ---- digests from elsewhere, digests to elsewhere ---------------------- */

void ic_blkhash_set_sink(struct ic_blkhash *h, ic_blkhash_sink_fn *sink, void *ctx)
{
    pthread_mutex_lock(&h->lock);
    h->sink = sink;
    h->sink_ctx = ctx;
    pthread_mutex_unlock(&h->lock);
}

int ic_blkhash_put_digests(struct ic_blkhash *h, uint64_t first, uint64_t count,
                           const uint8_t *digests, struct ic_error *err)
{
    if (count == 0)
        return 0;
    if (first > h->nblocks || count > h->nblocks - first)
        return ic_error_value(err, "blkhash: blocks %llu+%llu are outside the image",
                              (unsigned long long)first, (unsigned long long)count);
    if (!digests)
        return zero_blocks(h, first, count, err);
    uint8_t *copy = malloc((size_t)(count * h->dsize));
    if (!copy)
        return ic_error_nomem(err);
    memcpy(copy, digests, (size_t)(count * h->dsize));
    return push_run(h, first, count, copy, err);
}

int ic_blkhash_start_at(struct ic_blkhash *h, uint64_t block, struct ic_error *err)
{
    pthread_mutex_lock(&h->lock);
    int ret = 0;
    if (h->next || h->nruns || h->nparts || block > h->nblocks)
        ret = ic_error_value(err, "blkhash: cannot start at block %llu",
                             (unsigned long long)block);
    else
        h->next = block;
    pthread_mutex_unlock(&h->lock);
    return ret;
}

uint64_t ic_blkhash_block_size(const struct ic_blkhash *h)
{
    return h->block;
}

const uint8_t *ic_blkhash_zero_digest(const struct ic_blkhash *h)
{
    return h->zero_digest;
}

/* ---- a range's digests gathered ---------------------------------------- */

int ic_block_digests_init(struct ic_block_digests *b, const char *algorithm,
                          uint64_t block_size, uint64_t first, uint64_t count,
                          struct ic_error *err)
{
    memset(b, 0, sizeof *b);
    const struct ic_digest *d = ic_digest_lookup(algorithm ? algorithm : "sha256", err);
    if (!d)
        return -1;
    if (block_size < 2 || block_size > IC_BLKHASH_MAX_BLOCK)
        return ic_error_value(err, "checksum block size %llu", (unsigned long long)block_size);
    b->first = first;
    b->count = b->missing = count;
    b->dsize = ic_digest_size(d);
    if (count > SIZE_MAX / b->dsize)
        return ic_error_nomem(err);
    b->digests = calloc(count ? (size_t)count : 1, b->dsize);
    b->told = calloc(count ? (size_t)count : 1, 1);
    uint8_t *zeros = calloc(1, (size_t)block_size);
    struct ic_digest_ctx *ctx = ic_digest_ctx_new(d, err);
    int ret = -1;
    if (!b->digests || !b->told || !zeros)
        ic_error_nomem(err);
    else if (ctx && ic_digest_once(ctx, zeros, (size_t)block_size, b->zero, err) == 0)
        ret = 0;
    free(zeros);
    ic_digest_ctx_free(ctx);
    if (ret < 0)
        ic_block_digests_free(b);
    return ret;
}

void ic_block_digests_sink(void *ctx, uint64_t first, uint64_t count, const uint8_t *digests)
{
    struct ic_block_digests *b = ctx;
    for (uint64_t i = 0; i < count; i++) {
        uint64_t block = first + i;
        if (block < b->first || block - b->first >= b->count)
            continue; /* not of this range */
        uint64_t k = block - b->first;
        memcpy(b->digests + k * b->dsize, digests ? digests + i * b->dsize : b->zero, b->dsize);
        if (!b->told[k]) {
            b->told[k] = 1;
            b->missing--;
        }
    }
}

void ic_block_digests_free(struct ic_block_digests *b)
{
    free(b->digests);
    free(b->told);
    b->digests = b->told = NULL;
}

/* ---- life cycle -------------------------------------------------------- */

int ic_blkhash_new(const char *algorithm, uint64_t block_size, uint64_t size,
                   struct ic_blkhash **out, struct ic_error *err)
{
    const struct ic_digest *d = ic_digest_lookup(algorithm ? algorithm : "sha256", err);
    if (!d)
        return -1;
    if (block_size < 2 || block_size > IC_BLKHASH_MAX_BLOCK || block_size % 2)
        return ic_error_value(err, "checksum block size must be even, from 2 bytes to %u MiB, "
                              "not %llu", IC_BLKHASH_MAX_BLOCK >> 20,
                              (unsigned long long)block_size);
    struct ic_blkhash *h = calloc(1, sizeof *h);
    if (!h)
        return ic_error_nomem(err);
    h->d = d;
    h->dsize = ic_digest_size(d);
    h->block = block_size;
    h->size = size;
    h->nblocks = size / block_size + (size % block_size != 0);
    if (pthread_mutex_init(&h->lock, NULL)) {
        free(h);
        return ic_error_nomem(err);
    }
    uint8_t *zeros = calloc(1, (size_t)block_size);
    h->zeros_run = malloc(ZERO_RUN_DIGESTS * h->dsize);
    struct ic_digest_ctx *ctx = ic_digest_ctx_new(d, err);
    h->outer = ic_digest_ctx_new(d, err);
    int ret = -1;
    if (!zeros || !h->zeros_run) {
        ic_error_nomem(err);
    } else if (ctx && h->outer &&
               ic_digest_once(ctx, zeros, (size_t)block_size, h->zero_digest, err) == 0 &&
               ic_digest_once(ctx, zeros, (size_t)(size % block_size), h->tail_zero_digest,
                              err) == 0 &&
               ic_digest_begin(h->outer, err) == 0) {
        for (size_t k = 0; k < ZERO_RUN_DIGESTS; k++)
            memcpy(h->zeros_run + k * h->dsize, h->zero_digest, h->dsize);
        ret = 0;
    }
    free(zeros);
    ic_digest_ctx_free(ctx);
    if (ret < 0) {
        ic_blkhash_free(h);
        return -1;
    }
    *out = h;
    return 0;
}

void ic_blkhash_free(struct ic_blkhash *h)
{
    if (!h)
        return;
    for (size_t k = 0; k < h->nruns; k++)
        free(h->runs[k].digests);
    for (size_t k = 0; k < h->nparts; k++) {
        free(h->parts[k].buf);
        free(h->parts[k].pieces);
    }
    for (size_t k = 0; k < h->npool; k++)
        ic_digest_ctx_free(h->pool[k]);
    free(h->runs);
    free(h->parts);
    free(h->pool);
    free(h->zeros_run);
    ic_digest_ctx_free(h->outer);
    pthread_mutex_destroy(&h->lock);
    free(h);
}

size_t ic_blkhash_size(const struct ic_blkhash *h)
{
    return h->dsize;
}

const char *ic_blkhash_algorithm(const struct ic_blkhash *h)
{
    return ic_digest_name(h->d);
}

int ic_blkhash_final(struct ic_blkhash *h, uint8_t *out, char *hex, struct ic_error *err)
{
    pthread_mutex_lock(&h->lock);
    int ret = -1;
    if (h->failed) {
        *err = h->error;
    } else if (h->next != h->nblocks || h->nruns || h->nparts) {
        ic_error_value(err, "blkhash: the bytes from offset %llu were never fed",
                       (unsigned long long)(h->next * h->block));
    } else {
        uint8_t le[8];
        for (int k = 0; k < 8; k++)
            le[k] = (uint8_t)(h->size >> (8 * k));
        if (ic_digest_add(h->outer, le, sizeof le, err) == 0 && ic_digest_end(h->outer, out, err) == 0)
            ret = 0;
        if (ret < 0)
            fail_locked(h, err);
        else
            h->failed = 1, ic_error_value(&h->error, "blkhash: final() was called already");
    }
    pthread_mutex_unlock(&h->lock);
    if (ret == 0 && hex)
        ic_digest_hex(out, h->dsize, hex);
    return ret;
}
