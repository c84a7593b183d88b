/* Checksums of images: one planner thread walks the extent map (zero
 * ranges go to the hash at once, without reading), worker threads read
 * the data in requests and hash it (blkhash.c folds the blocks in order,
 * whoever finishes first). */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "blkhash.h"
#include "imgcopy.h"

#define DEFAULT_THREADS 4
#define DEFAULT_REQUEST (2u << 20)
#define MAX_THREADS 128
#define MAX_REQUEST (64u << 20)
#define BUFFER_ALIGN 4096u

struct item {
    uint64_t start, end;
};

struct ic_checksum {
    struct ic_image *img;
    struct ic_blkhash *hash;
    uint64_t end, request_size;

    pthread_mutex_t lock;
    pthread_cond_t changed;  /* an item in or out, the planner done, cancelled */
    pthread_cond_t finished; /* complete (CLOCK_MONOTONIC waits) */
    struct item *queue;
    size_t qcap, qhead, qcount;
    int planner_done, cancelled, failed, complete;
    struct ic_error error;
    unsigned live;

    pthread_t planner;
    int planner_started;
    pthread_t *workers;
    unsigned nworkers;
    atomic_uint_fast64_t done;
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

static void fail(struct ic_checksum *job, const struct ic_error *err)
{
    pthread_mutex_lock(&job->lock);
    if (!job->failed) {
        job->failed = 1;
        job->error = *err;
    }
    job->cancelled = 1;
    pthread_cond_broadcast(&job->changed);
    pthread_mutex_unlock(&job->lock);
}

static int cancelled(struct ic_checksum *job)
{
    pthread_mutex_lock(&job->lock);
    int c = job->cancelled;
    pthread_mutex_unlock(&job->lock);
    return c;
}

static void thread_exit(struct ic_checksum *job)
{
    pthread_mutex_lock(&job->lock);
    if (--job->live == 0) {
        job->complete = 1;
        pthread_cond_broadcast(&job->finished);
    }
    pthread_mutex_unlock(&job->lock);
}

static int push(struct ic_checksum *job, uint64_t start, uint64_t end)
{
    pthread_mutex_lock(&job->lock);
    while (job->qcount == job->qcap && !job->cancelled)
        pthread_cond_wait(&job->changed, &job->lock);
    int ok = !job->cancelled;
    if (ok) {
        job->queue[(job->qhead + job->qcount) % job->qcap] = (struct item){start, end};
        job->qcount++;
        pthread_cond_broadcast(&job->changed);
    }
    pthread_mutex_unlock(&job->lock);
    return ok ? 0 : -1;
}

static int pop(struct ic_checksum *job, struct item *it)
{
    pthread_mutex_lock(&job->lock);
    while (job->qcount == 0 && !job->planner_done && !job->cancelled)
        pthread_cond_wait(&job->changed, &job->lock);
    int ok = !job->cancelled && job->qcount > 0;
    if (ok) {
        *it = job->queue[job->qhead];
        job->qhead = (job->qhead + 1) % job->qcap;
        job->qcount--;
        pthread_cond_broadcast(&job->changed);
    }
    pthread_mutex_unlock(&job->lock);
    return ok;
}

/* Data ranges are cut at multiples of the request size (itself a whole
 * number of hash blocks when it can be), so that most requests hash
 * whole blocks. */
static void *planner_main(void *arg)
{
    struct ic_checksum *job = arg;
    struct ic_error err = {0};
    for (uint64_t pos = 0; pos < job->end && !cancelled(job);) {
        struct ic_extent e;
        if (ic_image_block_status(job->img, pos, job->end - pos, &e, &err) < 0) {
            fail(job, &err);
            break;
        }
        uint64_t len = e.length < job->end - pos ? e.length : job->end - pos;
        if (len == 0) {
            ic_error_format(&err, ic_image_path(job->img), "block status made no progress at "
                            "offset %llu", (unsigned long long)pos);
            fail(job, &err);
            break;
        }
        if (!(e.flags & IC_EXT_DATA) || (e.flags & IC_EXT_ZERO)) {
            if (ic_blkhash_zero(job->hash, pos, len, &err) < 0) {
                fail(job, &err);
                break;
            }
            atomic_fetch_add(&job->done, len);
        } else {
            uint64_t step = job->request_size, stop = pos + len;
            for (uint64_t p = pos; p < stop;) {
                uint64_t next = (p / step + 1) * step;
                if (next > stop)
                    next = stop;
                if (push(job, p, next) < 0)
                    break;
                p = next;
            }
        }
        pos += len;
    }
    pthread_mutex_lock(&job->lock);
    job->planner_done = 1;
    pthread_cond_broadcast(&job->changed);
    pthread_mutex_unlock(&job->lock);
    thread_exit(job);
    return NULL;
}

static void *worker_main(void *arg)
{
    struct ic_checksum *job = arg;
    struct ic_error err = {0};
    uint8_t *buf = NULL;
    if (posix_memalign((void **)&buf, BUFFER_ALIGN, job->request_size)) {
        ic_error_nomem(&err);
        fail(job, &err);
    }
    struct item it;
    while (buf && pop(job, &it)) {
        size_t len = (size_t)(it.end - it.start);
        if (ic_image_pread(job->img, buf, len, it.start, &err) < 0 ||
            ic_blkhash_update(job->hash, it.start, buf, len, &err) < 0) {
            fail(job, &err);
            break;
        }
        atomic_fetch_add(&job->done, len);
    }
    free(buf);
    thread_exit(job);
    return NULL;
}

static void free_job(struct ic_checksum *job)
{
    pthread_cond_destroy(&job->changed);
    pthread_cond_destroy(&job->finished);
    pthread_mutex_destroy(&job->lock);
    ic_blkhash_free(job->hash);
    free(job->queue);
    free(job->workers);
    free(job);
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
    struct ic_checksum *job = calloc(1, sizeof *job);
    if (!job) {
        ic_blkhash_free(hash);
        return ic_error_nomem(err);
    }
    job->img = img;
    job->hash = hash;
    job->end = end;
    job->request_size = request;
    job->qcap = 2 * (size_t)threads;
    job->queue = calloc(job->qcap, sizeof *job->queue);
    job->workers = calloc(threads, sizeof *job->workers);
    pthread_condattr_t monotonic;
    int sync_ok = pthread_mutex_init(&job->lock, NULL) == 0;
    if (sync_ok && (pthread_condattr_init(&monotonic) ||
                    pthread_condattr_setclock(&monotonic, CLOCK_MONOTONIC) ||
                    pthread_cond_init(&job->finished, &monotonic) ||
                    pthread_cond_init(&job->changed, NULL)))
        sync_ok = 0; /* none of these fails on Linux but for lack of memory */
    if (sync_ok)
        pthread_condattr_destroy(&monotonic);
    if (!sync_ok || !job->queue || !job->workers) {
        ic_blkhash_free(hash);
        free(job->queue);
        free(job->workers);
        free(job);
        return ic_error_nomem(err);
    }
    atomic_init(&job->done, 0);
    /* the planner counts as live from the start: no worker can see the
     * job complete before every thread is started */
    job->live = 1;
    for (unsigned i = 0; i < threads; i++) {
        pthread_mutex_lock(&job->lock);
        job->live++;
        pthread_mutex_unlock(&job->lock);
        int e = pthread_create(&job->workers[i], NULL, worker_main, job);
        if (e) {
            pthread_mutex_lock(&job->lock);
            job->live--;
            pthread_mutex_unlock(&job->lock);
            struct ic_error e2 = {0};
            ic_error_os(&e2, e, NULL, "start checksum thread");
            fail(job, &e2);
            break;
        }
        job->nworkers++;
    }
    int e = pthread_create(&job->planner, NULL, planner_main, job);
    if (e) {
        struct ic_error e2 = {0};
        ic_error_os(&e2, e, NULL, "start checksum thread");
        fail(job, &e2);
        pthread_mutex_lock(&job->lock);
        job->planner_done = 1;
        pthread_mutex_unlock(&job->lock);
        thread_exit(job);
    } else {
        job->planner_started = 1;
    }
    *out = job;
    return 0;
}

int ic_checksum_wait(struct ic_checksum *job, unsigned timeout_ms)
{
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    deadline.tv_sec += timeout_ms / 1000;
    deadline.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec++;
        deadline.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&job->lock);
    while (!job->complete)
        if (pthread_cond_timedwait(&job->finished, &job->lock, &deadline) == ETIMEDOUT)
            break;
    int done = job->complete;
    pthread_mutex_unlock(&job->lock);
    return done;
}

void ic_checksum_progress(struct ic_checksum *job, uint64_t *done, uint64_t *total)
{
    *done = atomic_load(&job->done);
    *total = job->end;
}

void ic_checksum_cancel(struct ic_checksum *job)
{
    pthread_mutex_lock(&job->lock);
    if (!job->complete)
        job->cancelled = 1;
    pthread_cond_broadcast(&job->changed);
    pthread_mutex_unlock(&job->lock);
}

int ic_checksum_finish(struct ic_checksum *job, char *hex, struct ic_error *err)
{
    for (unsigned i = 0; i < job->nworkers; i++)
        pthread_join(job->workers[i], NULL);
    if (job->planner_started)
        pthread_join(job->planner, NULL);
    int ret = -1;
    uint8_t digest[IC_DIGEST_MAX];
    if (job->failed)
        *err = job->error;
    else if (job->cancelled)
        ic_error_os(err, ECANCELED, NULL, "checksum cancelled");
    else
        ret = ic_blkhash_final(job->hash, digest, hex, err);
    free_job(job);
    return ret;
}
