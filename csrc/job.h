/* The job engine: the one place outside the protocol drivers that starts
 * threads.  A job is a planner (a thread of its own that cuts the work
 * into items) and items that pool workers run, at most `concurrency` at
 * once, each in a slot of its own (per-slot buffers need no lock).  Jobs
 * share a pool of worker threads and a budget of bytes in flight; a job
 * without a pool gets a private one.  An item may finish asynchronously:
 * its handler returns IC_JOB_PENDING and someone (an I/O completion)
 * calls ic_job_item_done() later, the slot staying busy until then; or
 * calls ic_job_item_resume(), and a pool thread goes on with the item in
 * `resume` (an item waits for I/O or for its turn without a thread: the
 * items in flight are not limited by the threads).
 *
 * Life of a job: start -> planner pushes, workers run (and `tick` runs
 * every tick_ms on a thread of its own) -> when the planner is done and no
 * item is queued or running, the ticks stop and `complete` runs (unless
 * the job stopped) -> finished.  The first error wins and stops the job;
 * cancel stops it with ECANCELED.  Items queued when a job stops are
 * handed to `discard`, never run. */
#ifndef IMGCOPY_JOB_H
#define IMGCOPY_JOB_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"

#define IC_JOB_PENDING 1 /* run(): the item finishes with ic_job_item_done() */
#define IC_JOB_MAX_CONCURRENCY 256u

struct ic_pool;
struct ic_job;

/* threads: 1..IC_JOB_MAX_CONCURRENCY; budget: bytes the running items of
 * all its jobs may hold at once (0: no limit; an item costing more than
 * the whole budget runs alone) */
int ic_pool_new(unsigned threads, uint64_t budget, struct ic_pool **out, struct ic_error *err);
/* every job on it must be freed first */
void ic_pool_free(struct ic_pool *pool);
unsigned ic_pool_threads(const struct ic_pool *pool);
uint64_t ic_pool_budget(const struct ic_pool *pool);

struct ic_job_ops {
    size_t item_size; /* bytes of one item, copied in by ic_job_push() */
    /* the planner, on a thread of its own: ic_job_push() each item (it
     * blocks while the queue is full, -1 once the job stopped: return);
     * -1 with err fails the job */
    int (*plan)(struct ic_job *job, void *ctx, struct ic_error *err);
    /* one item, on a pool thread, in slot `slot` (< concurrency): 0 done,
     * -1 failed (err), IC_JOB_PENDING */
    int (*run)(void *ctx, unsigned slot, void *item, struct ic_error *err);
    /* optional: go on with an item ic_job_item_resume() woke, on a pool
     * thread, in its slot: as run() (also when the job stopped meanwhile:
     * the item ends itself) */
    int (*resume)(void *ctx, unsigned slot, void *item, struct ic_error *err);
    /* optional: the bytes of the pool's budget the item holds while it runs */
    uint64_t (*item_cost)(void *ctx, const void *item);
    /* optional: once, after every item ran, unless the job stopped */
    int (*complete)(void *ctx, struct ic_error *err);
    /* optional: the job stopped; wake whatever run() waits on (called
     * without the engine's lock; may be called more than once) */
    void (*interrupt)(void *ctx);
    /* optional: an item queued but never run because the job stopped */
    void (*discard)(void *ctx, void *item);
    /* optional: every tick_ms (or sooner: ic_job_tick_now) while items run,
     * on a thread of its own, never two at once nor alongside complete
     * (a copy's checkpoints); -1 with err fails the job */
    int (*tick)(void *ctx, struct ic_error *err);
};

struct ic_job_params {
    unsigned concurrency; /* items running at once: 1..IC_JOB_MAX_CONCURRENCY */
    size_t queue_depth;   /* items queued ahead of the workers; 0: 4 per slot */
    uint64_t total;       /* what progress counts up to */
    struct ic_pool *pool; /* NULL: a private pool of `threads` threads */
    unsigned threads;     /* a private pool's threads: 0 = concurrency */
    unsigned tick_ms;     /* ops->tick's period (0: no ticks) */
};

/* *out is set before the planner starts (plan() may be handed the job
 * through ctx); on failure nothing runs and *out is NULL. */
int ic_job_start(const struct ic_job_ops *ops, void *ctx, const struct ic_job_params *params,
                 struct ic_job **out, struct ic_error *err);
int ic_job_push(struct ic_job *job, const void *item);
void ic_job_item_done(struct ic_job *job, unsigned slot, int failed, const struct ic_error *err);
/* Any thread: the PENDING item of `slot` goes on, in ops->resume on a pool
 * thread (before any new item: it holds its share of the budget). */
void ic_job_item_resume(struct ic_job *job, unsigned slot);
void ic_job_fail(struct ic_job *job, const struct ic_error *err);
/* The next tick comes now, not at its time (no-op without ticks) */
void ic_job_tick_now(struct ic_job *job);
void ic_job_cancel(struct ic_job *job);
int ic_job_stopped(struct ic_job *job);
/* stopped by ic_job_cancel() (not by a failure) */
int ic_job_cancelled(struct ic_job *job);
void ic_job_add_progress(struct ic_job *job, uint64_t bytes);
void ic_job_progress(struct ic_job *job, uint64_t *done, uint64_t *total);
/* 1 once finished, 0 after timeout_ms */
int ic_job_wait(struct ic_job *job, unsigned timeout_ms);
/* Wait for the end; 0, or -1 with the first error (ECANCELED when
 * cancelled).  Progress stays readable until ic_job_free(). */
int ic_job_finish(struct ic_job *job, struct ic_error *err);
void ic_job_free(struct ic_job *job);

#endif
