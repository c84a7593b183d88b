/* The job engine (job.h).  One lock per pool guards its jobs' queues and
 * counters; handlers (run, discard, complete) always run without it. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "job.h"

struct ic_pool {
    pthread_mutex_t lock;
    pthread_cond_t work; /* an item may be runnable, or shutting down */
    pthread_t *threads;
    unsigned nthreads;
    uint64_t budget, in_flight; /* bytes */
    unsigned running;           /* items running, all jobs */
    struct ic_job *jobs;        /* round-robin ring start */
    int shutdown;
};

enum { JOB_RUNNING, JOB_ENDING, JOB_FINISHED };

struct ic_job {
    struct ic_pool *pool;
    int own_pool;
    const struct ic_job_ops *ops;
    void *ctx;
    struct ic_job *next, *prev; /* in pool->jobs */

    unsigned concurrency;
    unsigned char *queue; /* ring of qcap items */
    size_t qcap, qhead, qcount;
    unsigned char *slot_items; /* the item each busy slot runs */
    uint64_t *slot_cost;
    unsigned char *slot_busy;
    unsigned char *slot_ready; /* ic_job_item_resume()d, waiting for a thread */
    unsigned running, nready;

    pthread_cond_t space;    /* queue not full, or stopped */
    pthread_cond_t finished; /* CLOCK_MONOTONIC */
    pthread_t planner;
    int planner_started, planner_done;
    pthread_t ticker;
    int ticker_started;
    unsigned tick_ms;
    int ticking, tick_stop, tick_due; /* in a tick; no more ticks; tick now */
    pthread_cond_t tick_wake, tick_idle; /* CLOCK_MONOTONIC; a tick returned */
    int state, stopped, failed, cancelled;
    int interrupting; /* stopped, its interrupt handler not yet returned */
    struct ic_error error;

    uint64_t total;
    atomic_uint_fast64_t done;
};

static int init_monotonic_cond(pthread_cond_t *c)
{
    pthread_condattr_t attr;
    if (pthread_condattr_init(&attr))
        return -1;
    int r = pthread_condattr_setclock(&attr, CLOCK_MONOTONIC) || pthread_cond_init(c, &attr);
    pthread_condattr_destroy(&attr);
    return r ? -1 : 0;
}

/* ---- scheduling (pool lock held) --------------------------------------- */

static int budget_allows(const struct ic_pool *pool, uint64_t cost)
{
    return pool->budget == 0 || pool->in_flight == 0 || pool->in_flight + cost <= pool->budget;
}

static unsigned free_slot(const struct ic_job *job)
{
    for (unsigned s = 0; s < job->concurrency; s++)
        if (!job->slot_busy[s])
            return s;
    return job->concurrency;
}

/* A resumed item of some job, round robin: it goes before new items (it
 * holds buffers and budget already). */
static struct ic_job *take_ready(struct ic_pool *pool, unsigned *slot)
{
    struct ic_job *job = pool->jobs;
    if (!job)
        return NULL;
    do {
        if (job->nready) {
            for (unsigned s = 0; s < job->concurrency; s++) {
                if (job->slot_ready[s]) {
                    job->slot_ready[s] = 0;
                    job->nready--;
                    pool->jobs = job->next;
                    *slot = s;
                    return job;
                }
            }
        }
        job = job->next;
    } while (job != pool->jobs);
    return NULL;
}

/* Take the next runnable item of any job, round robin; its slot is busy
 * from here on. */
static struct ic_job *take_item(struct ic_pool *pool, unsigned *slot)
{
    struct ic_job *job = pool->jobs;
    if (!job)
        return NULL;
    do {
        if (!job->stopped && job->qcount && job->running < job->concurrency) {
            const unsigned char *item = job->queue + job->qhead * job->ops->item_size;
            uint64_t cost = job->ops->item_cost ? job->ops->item_cost(job->ctx, item) : 0;
            if (budget_allows(pool, cost)) {
                unsigned s = free_slot(job);
                memcpy(job->slot_items + (size_t)s * job->ops->item_size, item,
                       job->ops->item_size);
                job->qhead = (job->qhead + 1) % job->qcap;
                job->qcount--;
                job->slot_busy[s] = 1;
                job->slot_cost[s] = cost;
                job->running++;
                pool->running++;
                pool->in_flight += cost;
                pool->jobs = job->next; /* the next job goes first next time */
                pthread_cond_signal(&job->space);
                *slot = s;
                return job;
            }
        }
        job = job->next;
    } while (job != pool->jobs);
    return NULL;
}

static void record_error(struct ic_job *job, const struct ic_error *err)
{
    if (!job->failed && !job->cancelled) {
        job->failed = 1;
        job->error = *err;
    }
}

static void end_if_drained(struct ic_job *job);

/* The job stops: no item starts any more, waits wake (lock held; the
 * interrupt handler runs after the caller unlocks, and the job does not
 * end before it returned: interrupt_done). */
static int stop(struct ic_job *job)
{
    if (job->stopped)
        return 0;
    job->stopped = 1;
    job->interrupting = 1;
    pthread_cond_broadcast(&job->space);
    pthread_cond_broadcast(&job->tick_wake);
    return 1;
}

static void interrupt(struct ic_job *job)
{
    if (job->ops->interrupt)
        job->ops->interrupt(job->ctx);
}

/* When nothing more can run: discard what is queued (a stopped job),
 * complete (one that was not), then finished.  The thread that sees the
 * job drained does this, without the lock for the handlers. */
static int drained(const struct ic_job *job)
{
    return job->state == JOB_RUNNING && job->planner_done && !job->running &&
           !job->interrupting && (job->stopped || !job->qcount);
}

static void end_if_drained(struct ic_job *job)
{
    struct ic_pool *pool = job->pool;
    if (!drained(job))
        return;
    /* no tick alongside complete, nor after the end */
    job->tick_stop = 1;
    pthread_cond_broadcast(&job->tick_wake);
    while (job->ticking)
        pthread_cond_wait(&job->tick_idle, &pool->lock);
    if (!drained(job)) /* a tick failed meanwhile: its stop ends the job */
        return;
    job->state = JOB_ENDING;
    size_t isz = job->ops->item_size;
    unsigned char *item = job->slot_items; /* every slot is free now */
    while (job->qcount) {
        memcpy(item, job->queue + job->qhead * isz, isz);
        job->qhead = (job->qhead + 1) % job->qcap;
        job->qcount--;
        if (job->ops->discard) {
            pthread_mutex_unlock(&pool->lock);
            job->ops->discard(job->ctx, item);
            pthread_mutex_lock(&pool->lock);
        }
    }
    if (!job->stopped && job->ops->complete) {
        struct ic_error err = {0};
        pthread_mutex_unlock(&pool->lock);
        int r = job->ops->complete(job->ctx, &err);
        pthread_mutex_lock(&pool->lock);
        if (r < 0) {
            record_error(job, &err);
            stop(job);
        }
    }
    job->state = JOB_FINISHED;
    pthread_cond_broadcast(&job->finished);
}

static void item_finished(struct ic_job *job, unsigned slot, int failed,
                          const struct ic_error *err)
{
    struct ic_pool *pool = job->pool;
    pthread_mutex_lock(&pool->lock);
    int stopped_now = 0;
    if (failed) {
        record_error(job, err);
        stopped_now = stop(job);
    }
    job->slot_busy[slot] = 0;
    job->running--;
    pool->running--;
    pool->in_flight -= job->slot_cost[slot];
    pthread_cond_broadcast(&pool->work); /* a slot and budget are free */
    if (!stopped_now)
        end_if_drained(job);
    pthread_mutex_unlock(&pool->lock);
    if (stopped_now) {
        interrupt(job);
        pthread_mutex_lock(&pool->lock);
        job->interrupting = 0;
        end_if_drained(job);
        pthread_mutex_unlock(&pool->lock);
    }
}

static void *pool_main(void *arg)
{
    struct ic_pool *pool = arg;
    pthread_mutex_lock(&pool->lock);
    for (;;) {
        unsigned slot;
        int resumed = 1;
        struct ic_job *job = take_ready(pool, &slot);
        if (!job) {
            resumed = 0;
            job = take_item(pool, &slot);
        }
        if (!job) {
            if (pool->shutdown)
                break;
            pthread_cond_wait(&pool->work, &pool->lock);
            continue;
        }
        pthread_mutex_unlock(&pool->lock);
        struct ic_error err = {0};
        void *item = job->slot_items + (size_t)slot * job->ops->item_size;
        int r = resumed ? job->ops->resume(job->ctx, slot, item, &err)
                        : job->ops->run(job->ctx, slot, item, &err);
        if (r != IC_JOB_PENDING)
            item_finished(job, slot, r < 0, &err);
        pthread_mutex_lock(&pool->lock);
    }
    pthread_mutex_unlock(&pool->lock);
    return NULL;
}

/* ---- pools ------------------------------------------------------------- */

static void stop_pool(struct ic_pool *pool)
{
    pthread_mutex_lock(&pool->lock);
    pool->shutdown = 1;
    pthread_cond_broadcast(&pool->work);
    pthread_mutex_unlock(&pool->lock);
    for (unsigned i = 0; i < pool->nthreads; i++)
        pthread_join(pool->threads[i], NULL);
    pthread_cond_destroy(&pool->work);
    pthread_mutex_destroy(&pool->lock);
    free(pool->threads);
    free(pool);
}

int ic_pool_new(unsigned threads, uint64_t budget, struct ic_pool **out, struct ic_error *err)
{
    *out = NULL;
    if (threads < 1 || threads > IC_JOB_MAX_CONCURRENCY)
        return ic_error_value(err, "threads must be from 1 to %u, not %u",
                              IC_JOB_MAX_CONCURRENCY, threads);
    struct ic_pool *pool = calloc(1, sizeof *pool);
    if (!pool)
        return ic_error_nomem(err);
    pool->budget = budget;
    pool->threads = calloc(threads, sizeof *pool->threads);
    if (!pool->threads || pthread_mutex_init(&pool->lock, NULL)) {
        free(pool->threads);
        free(pool);
        return ic_error_nomem(err);
    }
    if (pthread_cond_init(&pool->work, NULL)) {
        pthread_mutex_destroy(&pool->lock);
        free(pool->threads);
        free(pool);
        return ic_error_nomem(err);
    }
    for (; pool->nthreads < threads; pool->nthreads++) {
        int e = pthread_create(&pool->threads[pool->nthreads], NULL, pool_main, pool);
        if (e) {
            stop_pool(pool);
            return ic_error_os(err, e, NULL, "start worker thread");
        }
    }
    *out = pool;
    return 0;
}

void ic_pool_free(struct ic_pool *pool)
{
    if (pool)
        stop_pool(pool);
}

unsigned ic_pool_threads(const struct ic_pool *pool)
{
    return pool->nthreads;
}

uint64_t ic_pool_budget(const struct ic_pool *pool)
{
    return pool->budget;
}

/* ---- jobs -------------------------------------------------------------- */

static void *planner_main(void *arg)
{
    struct ic_job *job = arg;
    struct ic_error err = {0};
    int r = job->ops->plan(job, job->ctx, &err);
    if (r < 0)
        ic_job_fail(job, &err);
    pthread_mutex_lock(&job->pool->lock);
    job->planner_done = 1;
    end_if_drained(job);
    pthread_mutex_unlock(&job->pool->lock);
    return NULL;
}

static void wake_at(struct timespec *t, unsigned ms)
{
    clock_gettime(CLOCK_MONOTONIC, t);
    t->tv_sec += ms / 1000;
    t->tv_nsec += (long)(ms % 1000) * 1000000L;
    if (t->tv_nsec >= 1000000000L) {
        t->tv_sec++;
        t->tv_nsec -= 1000000000L;
    }
}

static void *ticker_main(void *arg)
{
    struct ic_job *job = arg;
    struct ic_pool *pool = job->pool;
    pthread_mutex_lock(&pool->lock);
    for (;;) {
        struct timespec next;
        wake_at(&next, job->tick_ms);
        while (!job->tick_stop && !job->stopped && !job->tick_due)
            if (pthread_cond_timedwait(&job->tick_wake, &pool->lock, &next) == ETIMEDOUT)
                break;
        if (job->tick_stop || job->stopped)
            break;
        job->tick_due = 0;
        job->ticking = 1;
        pthread_mutex_unlock(&pool->lock);
        struct ic_error err = {0};
        int r = job->ops->tick(job->ctx, &err);
        pthread_mutex_lock(&pool->lock);
        job->ticking = 0;
        pthread_cond_broadcast(&job->tick_idle);
        /* a failure stops the job before anyone can complete it */
        if (r < 0 && job->state == JOB_RUNNING) {
            record_error(job, &err);
            if (stop(job)) {
                pthread_mutex_unlock(&pool->lock);
                interrupt(job);
                pthread_mutex_lock(&pool->lock);
                job->interrupting = 0;
                end_if_drained(job);
            }
            break;
        }
    }
    pthread_mutex_unlock(&pool->lock);
    return NULL;
}

static void free_job_memory(struct ic_job *job)
{
    free(job->queue);
    free(job->slot_items);
    free(job->slot_cost);
    free(job->slot_busy);
    free(job->slot_ready);
    free(job);
}

int ic_job_start(const struct ic_job_ops *ops, void *ctx, const struct ic_job_params *params,
                 struct ic_job **out, struct ic_error *err)
{
    *out = NULL;
    unsigned n = params->concurrency;
    if (n < 1 || n > IC_JOB_MAX_CONCURRENCY)
        return ic_error_value(err, "concurrency must be from 1 to %u, not %u",
                              IC_JOB_MAX_CONCURRENCY, n);
    if (!ops->plan || !ops->run || ops->item_size == 0)
        return ic_error_value(err, "a job needs a planner, an item handler and an item size");
    unsigned threads = params->threads ? params->threads : n;
    if (threads > IC_JOB_MAX_CONCURRENCY)
        return ic_error_value(err, "threads must be from 1 to %u, not %u",
                              IC_JOB_MAX_CONCURRENCY, threads);
    size_t qcap = params->queue_depth ? params->queue_depth : 4 * (size_t)n;
    if (qcap > (1u << 20))
        return ic_error_value(err, "queue depth %zu is more than %u items", qcap, 1u << 20);
    struct ic_job *job = calloc(1, sizeof *job);
    if (!job)
        return ic_error_nomem(err);
    job->ops = ops;
    job->ctx = ctx;
    job->concurrency = n;
    job->qcap = qcap;
    job->total = params->total;
    atomic_init(&job->done, 0);
    job->queue = calloc(qcap, ops->item_size);
    job->slot_items = calloc(n, ops->item_size);
    job->slot_cost = calloc(n, sizeof *job->slot_cost);
    job->slot_busy = calloc(n, 1);
    job->slot_ready = calloc(n, 1);
    if (!job->queue || !job->slot_items || !job->slot_cost || !job->slot_busy ||
        !job->slot_ready) {
        free_job_memory(job);
        return ic_error_nomem(err);
    }
    if (pthread_cond_init(&job->space, NULL)) {
        free_job_memory(job);
        return ic_error_nomem(err);
    }
    if (init_monotonic_cond(&job->finished) < 0) {
        pthread_cond_destroy(&job->space);
        free_job_memory(job);
        return ic_error_nomem(err);
    }
    if (init_monotonic_cond(&job->tick_wake) < 0) {
        pthread_cond_destroy(&job->space);
        pthread_cond_destroy(&job->finished);
        free_job_memory(job);
        return ic_error_nomem(err);
    }
    if (pthread_cond_init(&job->tick_idle, NULL)) {
        pthread_cond_destroy(&job->space);
        pthread_cond_destroy(&job->finished);
        pthread_cond_destroy(&job->tick_wake);
        free_job_memory(job);
        return ic_error_nomem(err);
    }
    job->tick_ms = ops->tick ? params->tick_ms : 0;
    job->pool = params->pool;
    if (!job->pool) {
        if (ic_pool_new(threads, 0, &job->pool, err) < 0) {
            pthread_cond_destroy(&job->space);
            pthread_cond_destroy(&job->finished);
            pthread_cond_destroy(&job->tick_wake);
            pthread_cond_destroy(&job->tick_idle);
            free_job_memory(job);
            return -1;
        }
        job->own_pool = 1;
    }
    struct ic_pool *pool = job->pool;
    pthread_mutex_lock(&pool->lock);
    if (pool->jobs) {
        job->next = pool->jobs;
        job->prev = pool->jobs->prev;
        job->prev->next = job;
        pool->jobs->prev = job;
    } else {
        job->next = job->prev = job;
        pool->jobs = job;
    }
    pthread_mutex_unlock(&pool->lock);
    *out = job;
    if (job->tick_ms) {
        int te = pthread_create(&job->ticker, NULL, ticker_main, job);
        if (te) {
            struct ic_error e2 = {0};
            ic_error_os(&e2, te, NULL, "start the job's ticker thread");
            ic_job_fail(job, &e2);
        } else {
            job->ticker_started = 1;
        }
    }
    int e = pthread_create(&job->planner, NULL, planner_main, job);
    if (e) {
        struct ic_error e2 = {0};
        ic_error_os(&e2, e, NULL, "start planner thread");
        ic_job_fail(job, &e2);
        pthread_mutex_lock(&pool->lock);
        job->planner_done = 1;
        end_if_drained(job);
        pthread_mutex_unlock(&pool->lock);
    } else {
        job->planner_started = 1;
    }
    return 0;
}

int ic_job_push(struct ic_job *job, const void *item)
{
    struct ic_pool *pool = job->pool;
    pthread_mutex_lock(&pool->lock);
    while (job->qcount == job->qcap && !job->stopped)
        pthread_cond_wait(&job->space, &pool->lock);
    int ok = !job->stopped;
    if (ok) {
        size_t tail = (job->qhead + job->qcount) % job->qcap;
        memcpy(job->queue + tail * job->ops->item_size, item, job->ops->item_size);
        job->qcount++;
        pthread_cond_signal(&pool->work);
    }
    pthread_mutex_unlock(&pool->lock);
    return ok ? 0 : -1;
}

void ic_job_item_done(struct ic_job *job, unsigned slot, int failed, const struct ic_error *err)
{
    item_finished(job, slot, failed, err);
}

void ic_job_item_resume(struct ic_job *job, unsigned slot)
{
    struct ic_pool *pool = job->pool;
    pthread_mutex_lock(&pool->lock);
    if (!job->slot_ready[slot]) {
        job->slot_ready[slot] = 1;
        job->nready++;
        pthread_cond_signal(&pool->work);
    }
    pthread_mutex_unlock(&pool->lock);
}

static void stop_with(struct ic_job *job, const struct ic_error *err)
{
    pthread_mutex_lock(&job->pool->lock);
    int stopped_now = 0;
    if (job->state == JOB_RUNNING) {
        if (err)
            record_error(job, err);
        else if (!job->failed)
            job->cancelled = 1;
        stopped_now = stop(job);
    }
    pthread_mutex_unlock(&job->pool->lock);
    if (stopped_now) {
        interrupt(job);
        pthread_mutex_lock(&job->pool->lock);
        job->interrupting = 0;
        end_if_drained(job);
        pthread_mutex_unlock(&job->pool->lock);
    }
}

void ic_job_fail(struct ic_job *job, const struct ic_error *err)
{
    stop_with(job, err);
}

void ic_job_tick_now(struct ic_job *job)
{
    pthread_mutex_lock(&job->pool->lock);
    job->tick_due = 1;
    pthread_cond_broadcast(&job->tick_wake);
    pthread_mutex_unlock(&job->pool->lock);
}

void ic_job_cancel(struct ic_job *job)
{
    stop_with(job, NULL);
}

int ic_job_stopped(struct ic_job *job)
{
    pthread_mutex_lock(&job->pool->lock);
    int s = job->stopped;
    pthread_mutex_unlock(&job->pool->lock);
    return s;
}

int ic_job_cancelled(struct ic_job *job)
{
    pthread_mutex_lock(&job->pool->lock);
    int c = job->cancelled;
    pthread_mutex_unlock(&job->pool->lock);
    return c;
}

void ic_job_add_progress(struct ic_job *job, uint64_t bytes)
{
    atomic_fetch_add(&job->done, bytes);
}

void ic_job_progress(struct ic_job *job, uint64_t *done, uint64_t *total)
{
    *done = atomic_load(&job->done);
    *total = job->total;
}

int ic_job_wait(struct ic_job *job, unsigned timeout_ms)
{
    struct timespec deadline;
    wake_at(&deadline, timeout_ms);
    pthread_mutex_lock(&job->pool->lock);
    while (job->state != JOB_FINISHED)
        if (pthread_cond_timedwait(&job->finished, &job->pool->lock, &deadline) == ETIMEDOUT)
            break;
    int done = job->state == JOB_FINISHED;
    pthread_mutex_unlock(&job->pool->lock);
    return done;
}

int ic_job_finish(struct ic_job *job, struct ic_error *err)
{
    struct ic_pool *pool = job->pool;
    pthread_mutex_lock(&pool->lock);
    while (job->state != JOB_FINISHED)
        pthread_cond_wait(&job->finished, &pool->lock);
    pthread_mutex_unlock(&pool->lock);
    if (job->planner_started) {
        pthread_join(job->planner, NULL);
        job->planner_started = 0;
    }
    if (job->ticker_started) { /* finished: tick_stop or stopped is set */
        pthread_join(job->ticker, NULL);
        job->ticker_started = 0;
    }
    if (job->failed) {
        if (err)
            *err = job->error;
        return -1;
    }
    if (job->cancelled) {
        if (err)
            ic_error_os(err, ECANCELED, NULL, "cancelled");
        return -1;
    }
    return 0;
}

void ic_job_free(struct ic_job *job)
{
    if (!job)
        return;
    ic_job_cancel(job);
    ic_job_finish(job, NULL);
    struct ic_pool *pool = job->pool;
    pthread_mutex_lock(&pool->lock);
    if (job->next == job) {
        pool->jobs = NULL;
    } else {
        job->prev->next = job->next;
        job->next->prev = job->prev;
        if (pool->jobs == job)
            pool->jobs = job->next;
    }
    pthread_mutex_unlock(&pool->lock);
    if (job->own_pool)
        ic_pool_free(pool);
    pthread_cond_destroy(&job->space);
    pthread_cond_destroy(&job->finished);
    pthread_cond_destroy(&job->tick_wake);
    pthread_cond_destroy(&job->tick_idle);
    free_job_memory(job);
}
