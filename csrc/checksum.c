/* Checksums of images: one planner thread walks the extent map (zero
 * ranges go to the hash at once, without reading), worker threads read
 * the data in requests and hash it (blkhash.c folds the blocks in order,
 * whoever finishes first). */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "blkhash.h"
#include "image.h"
#include "job.h"

#define DEFAULT_THREADS 4
#define DEFAULT_REQUEST (2u << 20)
#define MAX_THREADS 128
#define MAX_REQUEST (64u << 20)
#define BUFFER_ALIGN 4096u
/* Reads in flight from a remote image, at most these bytes of buffers */
#define REMOTE_BYTES_IN_FLIGHT (64ull << 20)

struct item {
    uint64_t start, end;
};

/* A slot: its buffer, and the answer of its asynchronous read */
struct slot {
    struct ic_checksum *c;
    unsigned index;
    uint8_t *buf;
    atomic_int failed;
    struct ic_error err;
};

struct ic_checksum {
    struct ic_image *img;
    struct ic_blkhash *hash;
    uint64_t end, request_size;
    struct slot *slots;
    unsigned nslots;
    int aio; /* the image reads asynchronously: reads wait in no thread */
    struct ic_job *job;
};

int ic_checksum_algorithms(const char **names, size_t cap, struct ic_error *err)
{
    return ic_digest_names(names, cap, err);
}

int ic_checksum_check(const char *algorithm, uint64_t block_size, struct ic_error *err)
{
    struct ic_blkhash *h;
    if (ic_blkhash_new(algorithm, block_size ? block_size : IC_BLKHASH_DEFAULT_BLOCK, 0, &h,
                       err) < 0)
        return -1;
    ic_blkhash_free(h);
    return 0;
}

/* Data ranges are cut at multiples of the request size (itself a whole
 * number of hash blocks when it can be), so that most requests hash
 * whole blocks. */
static int plan(struct ic_job *job, void *ctx, struct ic_error *err)
{
    struct ic_checksum *c = ctx;
    for (uint64_t pos = 0; pos < c->end && !ic_job_stopped(job);) {
        struct ic_extent e;
        if (ic_image_block_status(c->img, pos, c->end - pos, &e, err) < 0)
            return -1;
        uint64_t len = e.length < c->end - pos ? e.length : c->end - pos;
        if (len == 0)
            return ic_error_format(err, ic_image_path(c->img), "block status made no progress "
                                   "at offset %llu", (unsigned long long)pos);
        if (!(e.flags & IC_EXT_DATA) || (e.flags & IC_EXT_ZERO)) {
            if (ic_blkhash_zero(c->hash, pos, len, err) < 0)
                return -1;
            ic_job_add_progress(job, len);
        } else {
            uint64_t step = c->request_size, stop = pos + len;
            for (uint64_t p = pos; p < stop;) {
                uint64_t next = (p / step + 1) * step;
                if (next > stop)
                    next = stop;
                struct item it = {p, next};
                if (ic_job_push(job, &it) < 0)
                    return 0;
                p = next;
            }
        }
        pos += len;
    }
    return 0;
}

static int hash_read(struct ic_checksum *c, struct slot *sl, const struct item *it,
                     struct ic_error *err)
{
    size_t len = (size_t)(it->end - it->start);
    if (ic_blkhash_update(c->hash, it->start, sl->buf, len, err) < 0)
        return -1;
    ic_job_add_progress(c->job, len);
    return 0;
}

static void read_done(void *ctx, const struct ic_error *err)
{
    struct slot *sl = ctx;
    if (err) {
        sl->err = *err;
        atomic_store(&sl->failed, 1);
    }
    ic_job_item_resume(sl->c->job, sl->index);
}

static int hash_item(void *ctx, unsigned slot, void *item, struct ic_error *err)
{
    struct ic_checksum *c = ctx;
    struct slot *sl = &c->slots[slot];
    const struct item *it = item;
    size_t len = (size_t)(it->end - it->start);
    if (c->aio) {
        atomic_store(&sl->failed, 0);
        int r = ic_image_aio_pread(c->img, sl->buf, len, it->start, read_done, sl, err);
        if (r < 0)
            return -1;
        if (r > 0)
            return IC_JOB_PENDING;
    }
    if (ic_image_pread(c->img, sl->buf, len, it->start, err) < 0)
        return -1;
    return hash_read(c, sl, it, err);
}

/* The asynchronous read is in */
static int hash_resumed(void *ctx, unsigned slot, void *item, struct ic_error *err)
{
    struct ic_checksum *c = ctx;
    struct slot *sl = &c->slots[slot];
    if (atomic_load(&sl->failed)) {
        *err = sl->err;
        return -1;
    }
    return hash_read(c, sl, item, err);
}

static uint64_t item_cost(void *ctx, const void *item)
{
    (void)ctx;
    const struct item *it = item;
    return it->end - it->start;
}

static const struct ic_job_ops checksum_ops = {
    .item_size = sizeof(struct item),
    .plan = plan,
    .run = hash_item,
    .resume = hash_resumed,
    .item_cost = item_cost,
};

static void free_checksum(struct ic_checksum *c)
{
    ic_job_free(c->job);
    for (unsigned i = 0; c->slots && i < c->nslots; i++)
        free(c->slots[i].buf);
    free(c->slots);
    ic_blkhash_free(c->hash);
    free(c);
}

int ic_checksum_start(struct ic_image *img, const struct ic_checksum_options *opt,
                      struct ic_checksum **out, struct ic_error *err)
{
    uint64_t size = ic_image_size(img);
    uint64_t block = opt->block_size ? opt->block_size : IC_BLKHASH_DEFAULT_BLOCK;
    unsigned threads = opt->threads ? opt->threads : DEFAULT_THREADS;
    uint64_t request = opt->request_size ? opt->request_size : DEFAULT_REQUEST;
    if (threads > MAX_THREADS)
        return ic_error_value(err, "threads must be from 1 to %u, not %u", MAX_THREADS, threads);
    if (request > MAX_REQUEST || request < 512)
        return ic_error_value(err, "request_size must be from 512 bytes to %u MiB",
                              MAX_REQUEST >> 20);
    if (opt->length > size)
        return ic_error_value(err, "length %llu is beyond the end of the image (%llu bytes)",
                              (unsigned long long)opt->length, (unsigned long long)size);
    struct ic_blkhash *hash;
    uint64_t end = opt->length ? opt->length : size;
    if (ic_blkhash_new(opt->algorithm, block, end, &hash, err) < 0)
        return -1;
    if (block <= request && request % block)
        request = (request / block + 1) * block;
    struct ic_checksum *c = calloc(1, sizeof *c);
    if (!c) {
        ic_blkhash_free(hash);
        return ic_error_nomem(err);
    }
    c->img = img;
    c->hash = hash;
    c->end = end;
    c->request_size = request;
    /* a remote image's reads are in flight by the connections' measure,
     * not the threads' */
    c->aio = ic_image_aio_reads(img);
    unsigned slots = threads;
    if (c->aio) {
        uint64_t remote = ic_image_requests_in_flight(img);
        uint64_t by_memory = REMOTE_BYTES_IN_FLIGHT / request;
        if (remote > by_memory)
            remote = by_memory;
        if (remote > slots)
            slots = remote < IC_JOB_MAX_CONCURRENCY ? (unsigned)remote : IC_JOB_MAX_CONCURRENCY;
    }
    c->slots = calloc(slots, sizeof *c->slots);
    for (; c->slots && c->nslots < slots; c->nslots++) {
        struct slot *sl = &c->slots[c->nslots];
        sl->c = c;
        sl->index = c->nslots;
        atomic_init(&sl->failed, 0);
        if (posix_memalign((void **)&sl->buf, BUFFER_ALIGN, request))
            break;
    }
    if (c->nslots < slots) {
        free_checksum(c);
        return ic_error_nomem(err);
    }
    struct ic_job_params params = {.concurrency = slots, .queue_depth = 2 * (size_t)slots,
                                   .total = end, .pool = opt->pool, .threads = threads};
    if (ic_job_start(&checksum_ops, c, &params, &c->job, err) < 0) {
        free_checksum(c);
        return -1;
    }
    *out = c;
    return 0;
}

struct ic_job *ic_checksum_job(struct ic_checksum *c)
{
    return c->job;
}

int ic_checksum_finish(struct ic_checksum *c, char *hex, struct ic_error *err)
{
    uint8_t digest[IC_DIGEST_MAX];
    int ret = ic_job_finish(c->job, err);
    if (ret == 0)
        ret = ic_blkhash_final(c->hash, digest, hex, err);
    else if (err && err->errnum == ECANCELED)
        ic_error_os(err, ECANCELED, NULL, "checksum cancelled");
    free_checksum(c);
    return ret;
}
