/* compare with many threads, under the sanitizers (TSan with `make tsan`):
 * however the threads race, the outcome is the first difference, counted in
 * sectors from the start of the step as qemu counts it. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <pthread.h>

#include "check.h"
#include "job.h"
#include "imgcopy.h"

#define SIZE (20u << 20)

static void must(int ret, const struct ic_error *err)
{
    CHECK(ret >= 0, "%s (%s) %s", err->msg, strerror(err->errnum), err->path);
}

static uint8_t *content;

/* Data runs and holes, seeded; returns the file's length. */
static void write_file(const char *path, const uint8_t *buf, uint64_t size, int sparse)
{
    FILE *f = fopen(path, "wb");
    CHECK(f, "fopen %s", path);
    CHECK(ftruncate(fileno(f), (off_t)size) == 0, "ftruncate");
    for (uint64_t off = 0; off < size; off += 4096) {
        uint64_t n = size - off < 4096 ? size - off : 4096;
        if (sparse && ic_is_zero(buf + off, (size_t)n))
            continue;
        CHECK(pwrite(fileno(f), buf + off, n, (off_t)off) == (ssize_t)n, "pwrite");
    }
    fclose(f);
}

/* Reports handed on as they became final: the same, in the same order, as
 * those the result lists. */
static struct ic_compare_progress reported[4096];
static size_t nreported;

static void on_report(void *ctx, const struct ic_compare_progress *p)
{
    (void)ctx;
    CHECK(nreported < sizeof reported / sizeof reported[0], "too many reports");
    reported[nreported++] = *p;
}

static struct ic_compare_result run(const char *a, const char *b, unsigned threads, int strict)
{
    nreported = 0;
    struct ic_error err = {0};
    struct ic_image *ia, *ib;
    must(ic_image_open(a, "raw", 0, &ia, &err), &err);
    must(ic_image_open(b, "raw", 0, &ib, &err), &err);
    struct ic_compare_options o;
    ic_compare_options_init(&o);
    o.concurrency = threads;
    o.strict = strict;
    o.progress = 1;
    o.report = on_report;
    struct ic_compare_result r;
    must(ic_compare(ia, ib, &o, &r, &err), &err);
    CHECK(nreported == r.nprogress, "%zu reports handed on, %zu listed", nreported, r.nprogress);
    for (size_t i = 0; i < nreported; i++)
        CHECK(reported[i].percent == r.progress[i].percent &&
                  reported[i].in_tail == r.progress[i].in_tail, "report %zu", i);
    ic_compare_result_free(&r);
    ic_image_close(ia);
    ic_image_close(ib);
    return r;
}

/* A job whose one item holds its pool's thread until released. */
struct blocker {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int running, release;
};

static int block_plan(struct ic_job *job, void *ctx, struct ic_error *err)
{
    (void)ctx, (void)err;
    char item = 0;
    ic_job_push(job, &item);
    return 0;
}

static int block_run(void *ctx, unsigned slot, void *item, struct ic_error *err)
{
    (void)slot, (void)item, (void)err;
    struct blocker *b = ctx;
    pthread_mutex_lock(&b->lock);
    b->running = 1;
    pthread_cond_broadcast(&b->cond);
    while (!b->release)
        pthread_cond_wait(&b->cond, &b->lock);
    pthread_mutex_unlock(&b->lock);
    return 0;
}

static const struct ic_job_ops blocker_ops = {.item_size = 1, .plan = block_plan,
                                              .run = block_run};

int main(void)
{
    char dir[] = "/tmp/imgcopy-test-compare-XXXXXX";
    CHECK(mkdtemp(dir), "mkdtemp");
    char a[64], b[64], c[64];
    snprintf(a, sizeof a, "%s/a.raw", dir);
    snprintf(b, sizeof b, "%s/b.raw", dir);
    snprintf(c, sizeof c, "%s/c.raw", dir);
    content = calloc(1, SIZE);
    srand(7);
    for (uint64_t off = 0; off < SIZE;) {
        uint64_t len = (uint64_t)(1 + rand() % 96) * 4096;
        if (off + len > SIZE)
            len = SIZE - off;
        if (rand() % 2)
            for (uint64_t i = 0; i < len; i++)
                content[off + i] = (uint8_t)(1 + (off + i) % 253);
        off += len;
    }
    write_file(a, content, SIZE, 1);
    write_file(b, content, SIZE, 0);
    for (unsigned t = 1; t <= 8; t++) {
        struct ic_compare_result r = run(a, b, t, 0);
        CHECK(r.identical && r.outcome == IC_COMPARE_IDENTICAL, "threads %u", t);
        r = run(a, b, t, 1);
        CHECK(r.outcome == IC_COMPARE_STATUS, "strict, threads %u: %d", t, r.outcome);
    }
    /* differences late in many steps: the first one wins */
    uint8_t *other = malloc(SIZE);
    memcpy(other, content, SIZE);
    uint64_t first = SIZE;
    for (uint64_t off = SIZE - 1; off > SIZE / 3; off -= 300001) {
        other[off] ^= 0x81;
        first = off;
    }
    write_file(c, other, SIZE, 1);
    for (unsigned t = 1; t <= 8; t++) {
        for (int rep = 0; rep < 3; rep++) {
            struct ic_compare_result r = run(a, c, t, 0);
            CHECK(r.outcome == IC_COMPARE_CONTENT && r.offset == first / 512 * 512,
                  "threads %u: %d at %llu, not %llu", t, r.outcome,
                  (unsigned long long)r.offset, (unsigned long long)(first / 512 * 512));
        }
    }
    /* a size mismatch: a non-zero tail found after the common part */
    write_file(c, content, SIZE - 4096, 1);
    struct ic_compare_result r = run(c, b, 4, 0);
    int tail_zero = ic_is_zero(content + SIZE - 4096, 4096);
    CHECK(r.size_mismatch && r.warned == 1, "warned");
    CHECK(tail_zero ? r.identical : (r.outcome == IC_COMPARE_CONTENT && r.in_tail), "tail");
    r = run(c, b, 4, 1);
    CHECK(r.outcome == IC_COMPARE_SIZE, "strict size");
    /* cancelled: fails with ECANCELED, whatever it found */
    {
        struct ic_error err = {0};
        struct ic_image *ia, *ib;
        must(ic_image_open(a, "raw", 0, &ia, &err), &err);
        must(ic_image_open(b, "raw", 0, &ib, &err), &err);
        /* the pool's one thread is busy: no step is read before the cancel */
        struct ic_pool *pool;
        must(ic_pool_new(1, 0, &pool, &err), &err);
        struct blocker blk = {0};
        pthread_mutex_init(&blk.lock, NULL);
        pthread_cond_init(&blk.cond, NULL);
        struct ic_job *busy;
        struct ic_job_params bp = {.concurrency = 1, .pool = pool};
        must(ic_job_start(&blocker_ops, &blk, &bp, &busy, &err), &err);
        pthread_mutex_lock(&blk.lock);
        while (!blk.running)
            pthread_cond_wait(&blk.cond, &blk.lock);
        pthread_mutex_unlock(&blk.lock);
        struct ic_compare_options o;
        ic_compare_options_init(&o);
        o.pool = pool;
        struct ic_compare *cmp;
        must(ic_compare_start(ia, ib, &o, &cmp, &err), &err);
        ic_job_cancel(ic_compare_job(cmp));
        pthread_mutex_lock(&blk.lock);
        blk.release = 1;
        pthread_cond_broadcast(&blk.cond);
        pthread_mutex_unlock(&blk.lock);
        struct ic_compare_result res;
        CHECK(ic_compare_finish(cmp, &res, &err) < 0 && err.errnum == ECANCELED, "cancel");
        ic_compare_result_free(&res);
        must(ic_job_finish(busy, &err), &err);
        ic_job_free(busy);
        ic_pool_free(pool);
        pthread_cond_destroy(&blk.cond);
        pthread_mutex_destroy(&blk.lock);
        ic_image_close(ia);
        ic_image_close(ib);
    }
    printf("test_compare: %lu checks passed\n", check_count);
    unlink(a);
    unlink(b);
    unlink(c);
    rmdir(dir);
    free(content);
    free(other);
    return 0;
}
