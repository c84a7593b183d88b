/* The job engine: every item runs once, slots are exclusive, the first
 * error wins, cancel discards what is queued, pools are shared, budgets
 * hold, and pending items finish from other threads. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "job.h"

#define MAX_ITEMS 5000

struct item {
    unsigned index;
    uint64_t cost;
};

struct counting {
    unsigned nitems;
    unsigned fail_at;        /* item index that fails, or UINT32_MAX */
    int plan_fails_after;    /* -1: never */
    int complete_fails;
    unsigned sleep_us;
    uint64_t cost;
    atomic_uint ran[MAX_ITEMS];
    atomic_uint discarded[MAX_ITEMS];
    atomic_int slot_in_use[IC_JOB_MAX_CONCURRENCY];
    atomic_uint overlaps, completes, interrupts;
    atomic_uint running, max_running;
    atomic_uint_fast64_t in_flight, max_in_flight;
    unsigned pushed;
    struct ic_job *job;
    /* pending: items finished by a completer thread */
    int pending;
    pthread_mutex_t plock;
    pthread_cond_t pcond;
    unsigned pslots[IC_JOB_MAX_CONCURRENCY];
    unsigned npending;
    int pquit;
};

static int plan_items(struct ic_job *job, void *ctx, struct ic_error *err)
{
    struct counting *t = ctx;
    for (unsigned i = 0; i < t->nitems; i++) {
        if (t->plan_fails_after >= 0 && (int)i == t->plan_fails_after)
            return ic_error_value(err, "planner failed at %u", i);
        struct item it = {.index = i, .cost = t->cost};
        if (ic_job_push(job, &it) < 0)
            return 0;
        t->pushed++;
    }
    return 0;
}

static void note_max(atomic_uint *max, unsigned v)
{
    unsigned m = atomic_load(max);
    while (v > m && !atomic_compare_exchange_weak(max, &m, v))
        ;
}

static int run_item(void *ctx, unsigned slot, void *item, struct ic_error *err)
{
    struct counting *t = ctx;
    const struct item *it = item;
    if (atomic_fetch_add(&t->slot_in_use[slot], 1) != 0)
        atomic_fetch_add(&t->overlaps, 1);
    note_max(&t->max_running, atomic_fetch_add(&t->running, 1) + 1);
    uint64_t f = atomic_fetch_add(&t->in_flight, it->cost) + it->cost;
    uint64_t m = atomic_load(&t->max_in_flight);
    while (f > m && !atomic_compare_exchange_weak(&t->max_in_flight, &m, f))
        ;
    atomic_fetch_add(&t->ran[it->index], 1);
    if (t->sleep_us)
        usleep(t->sleep_us);
    atomic_fetch_sub(&t->in_flight, it->cost);
    atomic_fetch_sub(&t->running, 1);
    atomic_fetch_sub(&t->slot_in_use[slot], 1);
    if (it->index == t->fail_at)
        return ic_error_value(err, "item %u failed", it->index);
    if (t->pending) {
        pthread_mutex_lock(&t->plock);
        t->pslots[t->npending++] = slot;
        pthread_cond_signal(&t->pcond);
        pthread_mutex_unlock(&t->plock);
        return IC_JOB_PENDING;
    }
    ic_job_add_progress(t->job, 1);
    return 0;
}

static uint64_t item_cost(void *ctx, const void *item)
{
    (void)ctx;
    return ((const struct item *)item)->cost;
}

static int complete(void *ctx, struct ic_error *err)
{
    struct counting *t = ctx;
    atomic_fetch_add(&t->completes, 1);
    return t->complete_fails ? ic_error_value(err, "complete failed") : 0;
}

static void interrupted(void *ctx)
{
    struct counting *t = ctx;
    atomic_fetch_add(&t->interrupts, 1);
}

static void discard(void *ctx, void *item)
{
    struct counting *t = ctx;
    atomic_fetch_add(&t->discarded[((struct item *)item)->index], 1);
}

static const struct ic_job_ops ops = {
    .item_size = sizeof(struct item),
    .plan = plan_items,
    .run = run_item,
    .item_cost = item_cost,
    .complete = complete,
    .interrupt = interrupted,
    .discard = discard,
};

static struct counting *new_counting(unsigned nitems)
{
    struct counting *t = calloc(1, sizeof *t);
    CHECK(t, "calloc");
    t->nitems = nitems;
    t->fail_at = UINT32_MAX;
    t->plan_fails_after = -1;
    pthread_mutex_init(&t->plock, NULL);
    pthread_cond_init(&t->pcond, NULL);
    return t;
}

static void free_counting(struct counting *t)
{
    pthread_mutex_destroy(&t->plock);
    pthread_cond_destroy(&t->pcond);
    free(t);
}

static struct ic_job *start(struct counting *t, unsigned conc, struct ic_pool *pool)
{
    struct ic_job_params p = {.concurrency = conc, .total = t->nitems, .pool = pool};
    struct ic_error err = {0};
    /* into the context: items may run before ic_job_start() returns */
    CHECK(ic_job_start(&ops, t, &p, &t->job, &err) == 0, "start: %s", err.msg);
    return t->job;
}

static void test_every_item_once(void)
{
    for (unsigned conc = 1; conc <= 8; conc *= 2) {
        struct counting *t = new_counting(2000);
        struct ic_job *job = start(t, conc, NULL);
        struct ic_error err = {0};
        CHECK(ic_job_finish(job, &err) == 0, "finish: %s", err.msg);
        uint64_t done, total;
        ic_job_progress(job, &done, &total);
        CHECK(done == 2000 && total == 2000, "progress %llu/%llu", (unsigned long long)done,
              (unsigned long long)total);
        for (unsigned i = 0; i < t->nitems; i++)
            CHECK(t->ran[i] == 1, "item %u ran %u times", i, t->ran[i]);
        CHECK(t->overlaps == 0, "a slot ran two items at once");
        CHECK(t->max_running <= conc, "%u running, concurrency %u", t->max_running, conc);
        CHECK(t->completes == 1, "complete ran %u times", t->completes);
        CHECK(ic_job_wait(job, 0) == 1, "finished job not finished");
        ic_job_free(job);
        free_counting(t);
    }
}

static void test_empty_job(void)
{
    struct counting *t = new_counting(0);
    struct ic_job *job = start(t, 3, NULL);
    CHECK(ic_job_wait(job, 5000) == 1, "empty job never finished");
    struct ic_error err = {0};
    CHECK(ic_job_finish(job, &err) == 0, "finish: %s", err.msg);
    CHECK(t->completes == 1, "complete ran %u times", t->completes);
    ic_job_free(job);
    free_counting(t);
}

static void test_first_error_wins(void)
{
    struct counting *t = new_counting(3000);
    t->fail_at = 100;
    struct ic_job *job = start(t, 4, NULL);
    struct ic_error err = {0};
    CHECK(ic_job_finish(job, &err) == -1, "a failed item did not fail the job");
    CHECK(strstr(err.msg, "item 100 failed"), "error: %s", err.msg);
    CHECK(t->completes == 0, "complete ran after a failure");
    CHECK(t->interrupts >= 1, "no interrupt");
    unsigned ran = 0;
    for (unsigned i = 0; i < t->pushed; i++) {
        CHECK(t->ran[i] + t->discarded[i] == 1, "item %u ran %u, discarded %u", i, t->ran[i],
              t->discarded[i]);
        ran += t->ran[i];
    }
    CHECK(ran < 3000, "the job went on after its failure");
    ic_job_free(job);
    free_counting(t);
}

static void test_planner_error(void)
{
    struct counting *t = new_counting(100);
    t->plan_fails_after = 50;
    struct ic_job *job = start(t, 2, NULL);
    struct ic_error err = {0};
    CHECK(ic_job_finish(job, &err) == -1, "planner failure lost");
    CHECK(strstr(err.msg, "planner failed at 50"), "error: %s", err.msg);
    ic_job_free(job);
    free_counting(t);
}

static void test_complete_error(void)
{
    struct counting *t = new_counting(10);
    t->complete_fails = 1;
    struct ic_job *job = start(t, 2, NULL);
    struct ic_error err = {0};
    CHECK(ic_job_finish(job, &err) == -1 && strstr(err.msg, "complete failed"), "error: %s",
          err.msg);
    ic_job_free(job);
    free_counting(t);
}

static void test_cancel(void)
{
    struct counting *t = new_counting(MAX_ITEMS);
    t->sleep_us = 200;
    struct ic_job *job = start(t, 2, NULL);
    usleep(5000);
    ic_job_cancel(job);
    ic_job_cancel(job); /* twice is harmless */
    struct ic_error err = {0};
    CHECK(ic_job_finish(job, &err) == -1 && err.errnum == ECANCELED, "cancel: %d %s",
          err.errnum, err.msg);
    CHECK(t->completes == 0, "complete ran after cancel");
    for (unsigned i = 0; i < t->pushed; i++)
        CHECK(t->ran[i] + t->discarded[i] == 1, "item %u ran %u, discarded %u", i, t->ran[i],
              t->discarded[i]);
    CHECK(t->pushed < MAX_ITEMS, "the planner was not stopped");
    ic_job_free(job);
    free_counting(t);
}

static void test_cancel_after_end(void)
{
    struct counting *t = new_counting(10);
    struct ic_job *job = start(t, 2, NULL);
    CHECK(ic_job_wait(job, 5000) == 1, "never finished");
    ic_job_cancel(job);
    struct ic_error err = {0};
    CHECK(ic_job_finish(job, &err) == 0, "a cancel after the end changed it: %s", err.msg);
    ic_job_free(job);
    free_counting(t);
}

static void test_shared_pool(void)
{
    struct ic_pool *pool;
    struct ic_error err = {0};
    CHECK(ic_pool_new(3, 0, &pool, &err) == 0, "pool: %s", err.msg);
    CHECK(ic_pool_threads(pool) == 3, "threads");
    struct counting *t[5];
    struct ic_job *jobs[5];
    for (int j = 0; j < 5; j++) {
        t[j] = new_counting(500 + 100 * j);
        t[j]->fail_at = j == 2 ? 10 : UINT32_MAX; /* one job fails, the others go on */
        jobs[j] = start(t[j], 1 + j % 3, pool);
    }
    for (int j = 0; j < 5; j++) {
        int r = ic_job_finish(jobs[j], &err);
        CHECK(j == 2 ? r == -1 : r == 0, "job %d: %d %s", j, r, err.msg);
        if (j != 2)
            for (unsigned i = 0; i < t[j]->nitems; i++)
                CHECK(t[j]->ran[i] == 1, "job %d item %u ran %u times", j, i, t[j]->ran[i]);
        CHECK(t[j]->overlaps == 0, "job %d: slot overlap", j);
        CHECK(t[j]->max_running <= 1 + (unsigned)j % 3, "job %d concurrency", j);
        ic_job_free(jobs[j]);
        free_counting(t[j]);
    }
    ic_pool_free(pool);
}

static void test_budget(void)
{
    struct ic_pool *pool;
    struct ic_error err = {0};
    CHECK(ic_pool_new(4, 1000, &pool, &err) == 0, "pool: %s", err.msg);
    struct counting *a = new_counting(200), *b = new_counting(200), *big = new_counting(5);
    a->cost = 300;
    b->cost = 250;
    big->cost = 5000; /* more than the budget: runs alone */
    a->sleep_us = b->sleep_us = big->sleep_us = 100;
    struct ic_job *ja = start(a, 4, pool), *jb = start(b, 4, pool), *jbig = start(big, 2, pool);
    CHECK(ic_job_finish(ja, &err) == 0 && ic_job_finish(jb, &err) == 0 &&
          ic_job_finish(jbig, &err) == 0, "finish: %s", err.msg);
    /* each job sees its own in-flight bytes; the pool's bound covers all */
    CHECK(a->max_in_flight <= 900, "a: %llu bytes in flight",
          (unsigned long long)a->max_in_flight);
    CHECK(b->max_in_flight <= 1000, "b: %llu bytes in flight",
          (unsigned long long)b->max_in_flight);
    CHECK(big->max_in_flight == 5000, "big: %llu", (unsigned long long)big->max_in_flight);
    for (unsigned i = 0; i < 5; i++)
        CHECK(big->ran[i] == 1, "big item %u", i);
    ic_job_free(ja);
    ic_job_free(jb);
    ic_job_free(jbig);
    free_counting(a);
    free_counting(b);
    free_counting(big);
    ic_pool_free(pool);
}

/* An I/O thread finishes items the handler left pending. */
static void *completer(void *arg)
{
    struct counting *t = arg;
    pthread_mutex_lock(&t->plock);
    for (;;) {
        while (!t->npending && !t->pquit)
            pthread_cond_wait(&t->pcond, &t->plock);
        if (!t->npending)
            break;
        unsigned slot = t->pslots[--t->npending];
        pthread_mutex_unlock(&t->plock);
        ic_job_add_progress(t->job, 1);
        ic_job_item_done(t->job, slot, 0, NULL);
        pthread_mutex_lock(&t->plock);
    }
    pthread_mutex_unlock(&t->plock);
    return NULL;
}

static void test_pending_items(void)
{
    struct counting *t = new_counting(1000);
    t->pending = 1;
    struct ic_job *job = start(t, 4, NULL);
    pthread_t tid;
    CHECK(pthread_create(&tid, NULL, completer, t) == 0, "completer");
    struct ic_error err = {0};
    CHECK(ic_job_finish(job, &err) == 0, "finish: %s", err.msg);
    pthread_mutex_lock(&t->plock);
    t->pquit = 1;
    pthread_cond_signal(&t->pcond);
    pthread_mutex_unlock(&t->plock);
    pthread_join(tid, NULL);
    uint64_t done, total;
    ic_job_progress(job, &done, &total);
    CHECK(done == 1000, "done %llu", (unsigned long long)done);
    for (unsigned i = 0; i < t->nitems; i++)
        CHECK(t->ran[i] == 1, "item %u ran %u times", i, t->ran[i]);
    ic_job_free(job);
    free_counting(t);
}

/* Items that wait without a thread: run() leaves each pending, an I/O
 * thread resumes it, resume() ends it on a pool thread.  Far more items
 * are in flight than the pool has threads. */
struct resumed {
    struct ic_job *job;
    pthread_t io;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    unsigned waiting[IC_JOB_MAX_CONCURRENCY], nwaiting, max_waiting;
    int quit;
    atomic_uint resumed[MAX_ITEMS], on_io_thread;
};

static int resumed_plan(struct ic_job *job, void *ctx, struct ic_error *err)
{
    (void)ctx;
    (void)err;
    for (unsigned i = 0; i < 2000; i++)
        if (ic_job_push(job, &(struct item){.index = i}) < 0)
            return 0;
    return 0;
}

static int resumed_run(void *ctx, unsigned slot, void *item, struct ic_error *err)
{
    (void)item;
    (void)err;
    struct resumed *r = ctx;
    pthread_mutex_lock(&r->lock);
    r->waiting[r->nwaiting++] = slot;
    if (r->nwaiting > r->max_waiting)
        r->max_waiting = r->nwaiting;
    /* let a good number gather before the I/O thread answers */
    if (r->nwaiting >= 24)
        pthread_cond_signal(&r->cond);
    pthread_mutex_unlock(&r->lock);
    return IC_JOB_PENDING;
}

static int resumed_end(void *ctx, unsigned slot, void *item, struct ic_error *err)
{
    (void)slot;
    (void)err;
    struct resumed *r = ctx;
    const struct item *it = item;
    if (pthread_equal(pthread_self(), r->io))
        atomic_fetch_add(&r->on_io_thread, 1);
    atomic_fetch_add(&r->resumed[it->index], 1);
    ic_job_add_progress(r->job, 1);
    return 0;
}

static void *resumer(void *arg)
{
    struct resumed *r = arg;
    pthread_mutex_lock(&r->lock);
    for (;;) {
        struct timespec t;
        clock_gettime(CLOCK_REALTIME, &t);
        t.tv_nsec += 2000000;
        if (t.tv_nsec >= 1000000000) {
            t.tv_sec++;
            t.tv_nsec -= 1000000000;
        }
        while (r->nwaiting < 24 && !r->quit)
            if (pthread_cond_timedwait(&r->cond, &r->lock, &t) == ETIMEDOUT)
                break; /* the tail: fewer than 24 left */
        if (r->quit && !r->nwaiting)
            break;
        while (r->nwaiting)
            ic_job_item_resume(r->job, r->waiting[--r->nwaiting]);
    }
    pthread_mutex_unlock(&r->lock);
    return NULL;
}

static void test_resumed_items(void)
{
    static struct resumed r;
    memset(&r, 0, sizeof r);
    pthread_mutex_init(&r.lock, NULL);
    pthread_cond_init(&r.cond, NULL);
    static const struct ic_job_ops rops = {
        .item_size = sizeof(struct item), .plan = resumed_plan, .run = resumed_run,
        .resume = resumed_end,
    };
    struct ic_job_params p = {.concurrency = 32, .threads = 2, .total = 2000};
    struct ic_error err = {0};
    CHECK(pthread_create(&r.io, NULL, resumer, &r) == 0, "resumer");
    CHECK(ic_job_start(&rops, &r, &p, &r.job, &err) == 0, "start: %s", err.msg);
    CHECK(ic_job_finish(r.job, &err) == 0, "finish: %s", err.msg);
    pthread_mutex_lock(&r.lock);
    r.quit = 1;
    pthread_cond_signal(&r.cond);
    pthread_mutex_unlock(&r.lock);
    pthread_join(r.io, NULL);
    for (unsigned i = 0; i < 2000; i++)
        CHECK(r.resumed[i] == 1, "item %u resumed %u times", i, r.resumed[i]);
    CHECK(r.max_waiting >= 24, "only %u items waited at once on 2 threads", r.max_waiting);
    CHECK(r.on_io_thread == 0, "resume ran on the I/O thread");
    uint64_t done, total;
    ic_job_progress(r.job, &done, &total);
    CHECK(done == 2000, "done %llu", (unsigned long long)done);
    ic_job_free(r.job);
    pthread_cond_destroy(&r.cond);
    pthread_mutex_destroy(&r.lock);
}

static void test_bad_params(void)
{
    struct counting *t = new_counting(1);
    struct ic_error err = {0};
    struct ic_job *job = (struct ic_job *)1;
    struct ic_job_params p = {.concurrency = 0};
    CHECK(ic_job_start(&ops, t, &p, &job, &err) == -1 && job == NULL, "concurrency 0");
    p.concurrency = IC_JOB_MAX_CONCURRENCY + 1;
    CHECK(ic_job_start(&ops, t, &p, &job, &err) == -1, "concurrency too high");
    struct ic_job_ops no_run = {.item_size = 4, .plan = plan_items};
    p.concurrency = 1;
    CHECK(ic_job_start(&no_run, t, &p, &job, &err) == -1, "no run handler");
    struct ic_pool *pool;
    CHECK(ic_pool_new(0, 0, &pool, &err) == -1 && pool == NULL, "pool of 0 threads");
    free_counting(t);
}

/* Ticks: run on their own thread while items run, never two at once nor
 * alongside complete (which comes after the last); tick_now brings one
 * sooner; a failing tick fails the job. */
struct ticking {
    atomic_uint ticks, in_tick, overlaps, ticks_after_complete, completes;
    int fail_at_tick; /* 0: never */
    unsigned items;
    unsigned sleep_us;
    struct ic_job *job;
};

static int tick_plan(struct ic_job *job, void *ctx, struct ic_error *err)
{
    (void)err;
    struct ticking *t = ctx;
    for (unsigned i = 0; i < t->items; i++) {
        struct item it = {.index = i};
        if (ic_job_push(job, &it) < 0)
            return 0;
    }
    return 0;
}

static int tick_item(void *ctx, unsigned slot, void *item, struct ic_error *err)
{
    (void)slot;
    (void)err;
    struct ticking *t = ctx;
    const struct item *it = item;
    usleep(t->sleep_us);
    if (it->index % 50 == 49)
        ic_job_tick_now(t->job);
    return 0;
}

static int tick_tick(void *ctx, struct ic_error *err)
{
    struct ticking *t = ctx;
    if (atomic_fetch_add(&t->in_tick, 1))
        atomic_fetch_add(&t->overlaps, 1);
    if (t->completes)
        atomic_fetch_add(&t->ticks_after_complete, 1);
    usleep(2000);
    unsigned n = atomic_fetch_add(&t->ticks, 1) + 1;
    atomic_fetch_sub(&t->in_tick, 1);
    if (t->fail_at_tick && (int)n == t->fail_at_tick)
        return ic_error_value(err, "tick %u failed", n);
    return 0;
}

static int tick_complete(void *ctx, struct ic_error *err)
{
    (void)err;
    struct ticking *t = ctx;
    if (t->in_tick)
        atomic_fetch_add(&t->overlaps, 1);
    atomic_fetch_add(&t->completes, 1);
    return 0;
}

static void test_ticks(void)
{
    static const struct ic_job_ops tops = {
        .item_size = sizeof(struct item), .plan = tick_plan, .run = tick_item,
        .complete = tick_complete, .tick = tick_tick,
    };
    /* by time (1 ms) and by tick_now (every 50 items, the period 1 h) */
    for (unsigned period = 1; period <= 3600000; period *= 3600000) {
        struct ticking t = {.items = 400, .sleep_us = 200};
        struct ic_job_params p = {.concurrency = 4, .total = 400, .tick_ms = period};
        struct ic_error err = {0};
        CHECK(ic_job_start(&tops, &t, &p, &t.job, &err) == 0, "start: %s", err.msg);
        CHECK(ic_job_finish(t.job, &err) == 0, "finish: %s", err.msg);
        CHECK(t.ticks >= 2, "%u ticks (period %u ms)", t.ticks, period);
        CHECK(t.overlaps == 0, "a tick ran alongside another or complete");
        CHECK(t.ticks_after_complete == 0, "a tick after complete");
        CHECK(t.completes == 1, "complete ran %u times", t.completes);
        ic_job_free(t.job);
    }
    /* a failing tick fails the job: complete never runs */
    struct ticking t = {.items = 2000, .sleep_us = 500, .fail_at_tick = 2};
    struct ic_job_params p = {.concurrency = 2, .total = 2000, .tick_ms = 1};
    struct ic_error err = {0};
    CHECK(ic_job_start(&tops, &t, &p, &t.job, &err) == 0, "start: %s", err.msg);
    CHECK(ic_job_finish(t.job, &err) == -1 && strstr(err.msg, "tick 2 failed"), "error: %s",
          err.msg);
    CHECK(t.completes == 0, "complete ran after a failed tick");
    ic_job_free(t.job);
    /* no period: no ticks, no thread */
    struct ticking none = {.items = 10};
    struct ic_job_params q = {.concurrency = 2, .total = 10};
    CHECK(ic_job_start(&tops, &none, &q, &none.job, &err) == 0, "start: %s", err.msg);
    CHECK(ic_job_finish(none.job, &err) == 0, "finish: %s", err.msg);
    CHECK(none.ticks == 0, "%u ticks without a period", none.ticks);
    ic_job_free(none.job);
}

int main(void)
{
    test_every_item_once();
    test_empty_job();
    test_first_error_wins();
    test_planner_error();
    test_complete_error();
    test_cancel();
    test_cancel_after_end();
    test_shared_pool();
    test_budget();
    test_pending_items();
    test_resumed_items();
    test_bad_params();
    test_ticks();
    printf("test_job: %lu checks passed\n", check_count);
    return 0;
}
