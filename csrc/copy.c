/* The copy engine: one planner thread walks the source's extents in guest
 * order and cuts them into work items; N workers read, find zero runs
 * (sparse.c) and write, zero or skip.  Every destination byte is touched
 * at most once.  Steps that must follow guest order (host allocation in
 * formats that allocate in guest order, the writes of an in-order copy)
 * are turns that each item takes and passes in sequence. */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "blkhash.h"
#include "copy_internal.h"
#include "journal.h"
#include "request_log.h"
#include "sparse.h"

#define LOOKAROUND_CHUNK (1u << 20)
/* Buffers of items in flight to a remote endpoint (nbdcopy: 64 requests
 * of 256 KiB on each of 4 connections) */
#define COPY_BYTES_IN_FLIGHT (64ull << 20)
#define BUFFER_ALIGN 4096u

/* ---- turns -------------------------------------------------------------- */

/* Turns keep a step in guest order across items: host allocation (place)
 * for formats that allocate in guest order, and the writes of an
 * in-order copy.  Every item takes part in each turn that applies, in
 * sequence.  An item whose turn has not come parks, holding no thread,
 * and is resumed by the item that passes the turn to it: a thread never
 * waits for a turn, so items waiting for their reads can never starve
 * the one whose turn it is. */
enum { TURN_PLACE, TURN_WRITE, NTURNS };

struct parked {
    uint64_t seq;
    unsigned slot;
    int set;
};

struct turns {
    uint64_t seq;       /* the item's place in guest order */
    unsigned held;      /* bit per turn: taken, not yet passed */
    unsigned passed;    /* bit per turn: passed */
};

static uint64_t *turn_counter(struct ic_copy *c, int which)
{
    return which == TURN_PLACE ? &c->next_place_seq : &c->next_write_seq;
}

static int turn_applies(const struct ic_copy *c, int which)
{
    return which == TURN_PLACE ? c->ordered_place : !c->opt.out_of_order;
}

/* ---- workers ----------------------------------------------------------- */

/* What a worker does with one piece of its item: write data, or make a
 * hole (skip or zero). */
struct action {
    uint64_t off, len;
    const uint8_t *buf; /* data */
    int data;
    int skip; /* zeros the destination reads already */
    int equal; /* compare mode: the destination holds these bytes already */
    int allocated; /* zeros that stay allocated (fully allocated output) */
    int staged;    /* has a staged write (index in order of staging) */
};

/* Writes whose writeback a worker lets run behind it before it waits for
 * them and drops their pages: deep enough to keep the disk busy, shallow
 * enough that the page cache never fills with the copy. */
#define SETTLE_DEPTH 4

/* The steps of an item, in order; an item leaves a step only forward, and
 * may park between them (I/O in flight, a turn not yet come). */
enum step {
    STEP_START,
    STEP_OFFLOAD, /* data copied in the kernel (holds the write turn) */
    STEP_READ,
    STEP_SPLIT,   /* the read is in: hash it, cut data from holes */
    STEP_STAGE,
    STEP_PLACE,   /* in guest order (TURN_PLACE) */
    STEP_COMMIT,  /* in order when writes are (TURN_WRITE) */
    STEP_WRITTEN, /* asynchronous writes answered */
};

struct worker {
    struct ic_copy *c;
    unsigned slot;
    struct {
        uint64_t off, len;
    } behind[SETTLE_DEPTH]; /* ring of this worker's recent data writes */
    unsigned nbehind, ibehind;
    uint8_t *buf; /* request_size */
    uint8_t *dbuf; /* compare mode: the destination's bytes of the item */
    struct ic_sparse sparse; /* zero runs; its scratch buffer is ours */
    struct action *acts;
    struct ic_staged_write *staged;
    size_t nacts, cap, nstaged, committed;
    struct ic_error err;
    /* the item in progress */
    const struct work_item *it;
    enum step step;
    struct turns t;
    atomic_uint pending;   /* asynchronous requests of the item in flight */
    atomic_int aio_failed; /* one of them failed: */
    struct ic_error aio_err;
};

static void free_worker(struct worker *w)
{
    free(w->buf);
    free(w->dbuf);
    free(w->sparse.scratch);
    free(w->acts);
    free(w->staged);
    free(w);
}

/* Take the item's turn: 0 held (or not applying), IC_JOB_PENDING parked
 * (resumed when it comes), -1 the copy stopped. */
static int take_turn(struct worker *w, int which)
{
    struct ic_copy *c = w->c;
    unsigned bit = 1u << which;
    if (!turn_applies(c, which) || (w->t.held & bit))
        return 0;
    if (w->t.passed & bit) /* a turn comes once: taking it again is a bug */
        return ic_error_value(&w->err, "copy turn %d taken twice", which);
    uint64_t *counter = turn_counter(c, which);
    pthread_mutex_lock(&c->turn_lock);
    int r = 0;
    if (c->stopping) {
        r = -1;
    } else if (*counter != w->t.seq) {
        struct parked *p = &c->parked[which][w->t.seq % c->turn_slots];
        *p = (struct parked){.seq = w->t.seq, .slot = w->slot, .set = 1};
        r = IC_JOB_PENDING;
    }
    pthread_mutex_unlock(&c->turn_lock);
    if (r < 0)
        return ic_error_os(&w->err, ECANCELED, NULL, "copy stopped");
    if (r == 0)
        w->t.held |= bit;
    return r;
}

static void pass_turn(struct worker *w, int which)
{
    struct ic_copy *c = w->c;
    unsigned bit = 1u << which;
    if (!(w->t.held & bit))
        return;
    uint64_t *counter = turn_counter(c, which);
    pthread_mutex_lock(&c->turn_lock);
    (*counter)++;
    struct parked *p = &c->parked[which][*counter % c->turn_slots];
    int wake = p->set && p->seq == *counter;
    unsigned slot = p->slot;
    if (wake)
        p->set = 0;
    pthread_mutex_unlock(&c->turn_lock);
    w->t.held &= ~bit;
    w->t.passed |= bit;
    if (wake)
        ic_job_item_resume(c->job, slot);
}

/* ---- stopping ---------------------------------------------------------- */

/* The job stopped (failed or cancelled): nobody takes a turn any more,
 * and every parked item is resumed, to end. */
static void interrupt_turns(struct ic_copy *c)
{
    pthread_mutex_lock(&c->turn_lock);
    c->stopping = 1;
    pthread_mutex_unlock(&c->turn_lock);
    for (int which = 0; which < NTURNS; which++) {
        for (size_t i = 0; i < c->turn_slots; i++) {
            pthread_mutex_lock(&c->turn_lock);
            struct parked *p = &c->parked[which][i];
            int wake = p->set;
            unsigned slot = p->slot;
            p->set = 0;
            pthread_mutex_unlock(&c->turn_lock);
            if (wake)
                ic_job_item_resume(c->job, slot);
        }
    }
}

/* A cancelled copy waits for nothing in flight: requests to a slow remote
 * endpoint fail at once (its connections shut down), so that the items,
 * the planner and closing the images return within moments.  A failed
 * one lets what is in flight be answered: a server whose client hangs up
 * on replies it owes may die of it (nbdkit before 1.33.10 asserts). */
static void interrupt_copy(void *ctx)
{
    struct ic_copy *c = ctx;
    interrupt_turns(c);
    if (ic_job_cancelled(c->job)) {
        ic_image_abort(c->src);
        ic_image_abort(c->dst);
    }
}

/* Every item done: make the destination durable (a journalled copy's
 * last checkpoint does, and records all of it). */
static int complete_copy(void *ctx, struct ic_error *err)
{
    struct ic_copy *c = ctx;
    if (c->checkpoint)
        return ic_checkpoint_run(c->checkpoint, err);
    return c->opt.flush ? ic_image_flush(c->dst, err) : 0;
}

static int checkpoint_tick(void *ctx, struct ic_error *err)
{
    struct ic_copy *c = ctx;
    return ic_checkpoint_run(c->checkpoint, err);
}

/* ---- reading and cutting ----------------------------------------------- */

static void count_read(struct ic_copy *c, uint64_t len)
{
    atomic_fetch_add(&c->bytes_read, len);
    atomic_fetch_add(&c->read_requests, 1);
}

static int read_source(struct worker *w, void *buf, uint64_t off, uint64_t len)
{
    if (ic_image_pread(w->c->src, buf, (size_t)len, off, &w->err) < 0)
        return -1;
    count_read(w->c, len);
    return 0;
}

static void add_action(struct worker *w, uint64_t off, uint64_t len, const uint8_t *buf, int data)
{
    if (len == 0)
        return;
    struct action *last = w->nacts ? &w->acts[w->nacts - 1] : NULL;
    if (last && last->data == data && !last->allocated && !last->equal &&
        last->off + last->len == off &&
        (!data || last->buf + last->len == buf)) {
        last->len += len;
        return;
    }
    w->acts[w->nacts++] = (struct action){.off = off, .len = len, .buf = buf, .data = data};
}

/* Fully allocated zeros: a zero request that keeps them allocated where
 * the destination has one, else zeros written as data. */
static void add_allocated_zeros(struct worker *w, uint64_t off, uint64_t len)
{
    if (!w->c->zero_allocates) {
        add_action(w, off, len, w->c->zeros, 1);
        return;
    }
    w->acts[w->nacts++] = (struct action){.off = off, .len = len, .allocated = 1};
}

/* A run that reads as zeros: a hole, or allocated zeros (fully allocated
 * output) */
static void add_zeros(struct worker *w, uint64_t off, uint64_t len)
{
    if (w->c->opt.sparse_threshold == 0)
        add_allocated_zeros(w, off, len);
    else
        add_action(w, off, len, NULL, 0);
}

/* Whether the destination reads zeros at the action's range already. */
static int reads_zeros(const struct ic_copy *c, const struct action *a)
{
    return c->opt.target_is_zero || ic_known_zeros_cover(&c->dst_zeros, a->off, a->len);
}

/* Allocated zeros: where the destination reads zeros already, it only
 * needs the space (a new file: fallocate) */
static int zero_allocated(struct worker *w, const struct action *a)
{
    unsigned flags = reads_zeros(w->c, a) ? IC_ZERO_ALLOCATE : 0;
    return ic_image_zero(w->c->dst, a->off, a->len, flags, &w->err);
}

static int read_for_sparse(void *ctx, void *buf, uint64_t off, uint64_t len)
{
    return read_source(ctx, buf, off, len);
}

struct split {
    struct worker *w;
    uint64_t base; /* the guest offset of w->buf */
};

static void emit_piece(void *ctx, uint64_t off, uint64_t len, int data)
{
    struct split *sp = ctx;
    add_action(sp->w, off, len, data ? sp->w->buf + (off - sp->base) : NULL, data);
}

/* Cut the item's data into data runs and holes: one extent's share, or
 * each run of a read through holes as its own extent. */
static int split_data(struct worker *w)
{
    const struct work_item *it = w->it;
    struct split ctx = {w, it->start};
    if (w->c->opt.sparse_threshold == 0 && !it->nparts) {
        add_action(w, it->start, it->end - it->start, w->buf, 1);
        return 0;
    }
    if (!it->nparts)
        return ic_sparse_split(&w->sparse, w->buf, it->start, it->end, it->ext_start,
                               it->ext_end, emit_piece, &ctx);
    uint64_t pos = it->start;
    for (unsigned i = 0; i < it->nparts; i++) {
        uint64_t end = it->parts[i].end;
        if (!it->parts[i].data)
            add_zeros(w, pos, end - pos);
        else if (w->c->opt.sparse_threshold == 0)
            add_action(w, pos, end - pos, w->buf + (pos - it->start), 1);
        else if (ic_sparse_split(&w->sparse, w->buf + (pos - it->start), pos, end, pos, end,
                                 emit_piece, &ctx) < 0)
            return -1;
        pos = end;
    }
    return 0;
}

/* The checksum of a range the copy does not read, because the
 * destination's backing file holds it: the source's content is hashed
 * all the same, its zeros for free, its data read here. */
static int hash_unread(struct worker *w, const struct work_item *it)
{
    struct ic_copy *c = w->c;
    for (uint64_t pos = it->start; pos < it->end;) {
        struct ic_extent e;
        if (ic_image_block_status(c->src, pos, it->end - pos, &e, &w->err) < 0)
            return -1;
        uint64_t len = e.length < it->end - pos ? e.length : it->end - pos;
        if (len == 0)
            return ic_error_format(&w->err, ic_image_path(c->src), "block status made no "
                                   "progress at offset %llu", (unsigned long long)pos);
        if (!(e.flags & IC_EXT_DATA) || (e.flags & IC_EXT_ZERO)) {
            if (ic_blkhash_zero(c->hash, pos, len, &w->err) < 0)
                return -1;
        } else {
            for (uint64_t p = pos; p < pos + len;) {
                uint64_t n = pos + len - p < c->opt.request_size ? pos + len - p
                                                                 : c->opt.request_size;
                if (read_source(w, w->buf, p, n) < 0 ||
                    ic_blkhash_update(c->hash, p, w->buf, (size_t)n, &w->err) < 0)
                    return -1;
                p += n;
            }
        }
        pos += len;
    }
    return 0;
}

/* ---- asynchronous completions (any thread) ----------------------------- */

static void aio_failed(struct worker *w, const struct ic_error *err)
{
    if (err && !atomic_exchange(&w->aio_failed, 1))
        w->aio_err = *err;
}

static void item_read(struct worker *w)
{
    if (atomic_fetch_sub(&w->pending, 1) == 1)
        ic_job_item_resume(w->c->job, w->slot);
}

static void read_done(void *ctx, const struct ic_error *err)
{
    struct worker *w = ctx;
    aio_failed(w, err);
    if (!err)
        count_read(w->c, w->it->end - w->it->start);
    item_read(w);
}

static void dst_read_done(void *ctx, const struct ic_error *err)
{
    struct worker *w = ctx;
    aio_failed(w, err);
    item_read(w);
}

static void write_done(void *ctx, const struct ic_error *err)
{
    struct worker *w = ctx;
    aio_failed(w, err);
    if (atomic_fetch_sub(&w->pending, 1) == 1)
        ic_job_item_resume(w->c->job, w->slot);
}

/* ---- the steps of an item ---------------------------------------------- */

static int start_item(struct worker *w)
{
    struct ic_copy *c = w->c;
    const struct work_item *it = w->it;
    uint64_t len = it->end - it->start;
    /* the checksum sees what the copy reads, and zeros it knows of */
    if (c->hash && it->kind != RUN_DATA &&
        (it->kind == RUN_BACKING ? hash_unread(w, it)
                                 : ic_blkhash_zero(c->hash, it->start, len, &w->err)) < 0)
        return -1;
    if (it->kind == RUN_BACKING) {
        atomic_fetch_add(&c->bytes_skipped, len);
        ic_request_log_add(c->opt.log, it->start, len, IC_REQ_SKIP);
        w->step = STEP_PLACE; /* nothing to write, turns to pass */
    } else if (it->kind == RUN_ZERO && c->compare) {
        w->step = STEP_READ; /* the destination's, to compare */
    } else if (it->kind == RUN_ZERO) {
        add_zeros(w, it->start, len);
        w->step = STEP_STAGE;
    } else if (c->opt.offload && !c->ordered_place && !atomic_load(&c->offload_refused)) {
        w->step = STEP_OFFLOAD;
    } else {
        w->step = STEP_READ;
    }
    return 0;
}

/* Kernel copy of a whole data item (raw files: no turn of placement);
 * the kernel refusing, the item reads as usual, keeping its write turn. */
static int offload_item(struct worker *w)
{
    struct ic_copy *c = w->c;
    const struct work_item *it = w->it;
    uint64_t len = it->end - it->start;
    int r = take_turn(w, TURN_WRITE);
    if (r)
        return r;
    if (ic_image_copy_range(c->src, c->dst, it->start, len, &w->err) == 0) {
        ic_request_log_add(c->opt.log, it->start, len, IC_REQ_WRITE);
        count_read(c, len);
        atomic_fetch_add(&c->bytes_written, len);
        atomic_fetch_add(&c->write_requests, 1);
        pass_turn(w, TURN_WRITE);
        w->step = STEP_WRITTEN;
        return 0;
    }
    if (w->err.errnum != ENOTSUP)
        return -1;
    atomic_store(&c->offload_refused, 1);
    w->step = STEP_READ;
    return 0;
}

/* One read of the item's range into `buf`: asynchronously where `img`
 * can (1: out, counted in w->pending), else at once (0); -1 failed. */
static int start_read(struct worker *w, struct ic_image *img, int async, uint8_t *buf,
                      ic_aio_done_fn *done)
{
    const struct work_item *it = w->it;
    uint64_t len = it->end - it->start;
    if (async) {
        atomic_fetch_add(&w->pending, 1);
        int r = ic_image_aio_pread(img, buf, (size_t)len, it->start, done, w, &w->err);
        if (r > 0)
            return 1;
        atomic_fetch_sub(&w->pending, 1);
        if (r < 0)
            return -1;
    }
    if (ic_image_pread(img, buf, (size_t)len, it->start, &w->err) < 0)
        return -1;
    if (img == w->c->src)
        count_read(w->c, len);
    return 0;
}

/* The source's data, and in compare mode the destination's bytes */
static int read_item(struct worker *w)
{
    struct ic_copy *c = w->c;
    w->step = STEP_SPLIT;
    atomic_store(&w->aio_failed, 0);
    atomic_store(&w->pending, 1); /* ours, until every read is out */
    int r = 0;
    if (w->it->kind == RUN_DATA)
        r = start_read(w, c->src, c->aio_reads, w->buf, read_done);
    if (r >= 0 && c->compare)
        r = start_read(w, c->dst, ic_image_aio_reads(c->dst), w->dbuf, dst_read_done);
    if (r < 0)
        aio_failed(w, &w->err); /* told once the reads out are in */
    return atomic_fetch_sub(&w->pending, 1) != 1 ? IC_JOB_PENDING : 0;
}

/* Compare mode: each block the destination holds already is left alone;
 * the others are cut as usual (the block an extent of its own), or zeroed
 * where the source reads as zeros. */
static int split_compared(struct worker *w)
{
    struct ic_copy *c = w->c;
    const struct work_item *it = w->it;
    int data = it->kind == RUN_DATA;
    for (uint64_t pos = it->start; pos < it->end;) {
        uint64_t next = (pos / c->compare + 1) * c->compare;
        if (next > it->end)
            next = it->end;
        size_t n = (size_t)(next - pos), at = (size_t)(pos - it->start);
        int equal = data ? memcmp(w->buf + at, w->dbuf + at, n) == 0 : ic_is_zero(w->dbuf + at, n);
        if (equal) {
            w->acts[w->nacts++] = (struct action){.off = pos, .len = n, .equal = 1};
            atomic_fetch_add(&c->bytes_equal, n);
        } else if (!data) {
            add_zeros(w, pos, n);
        } else if (c->opt.sparse_threshold == 0) {
            add_action(w, pos, n, w->buf + at, 1);
        } else if (ic_sparse_split(&w->sparse, w->buf + at, pos, next, pos, next, emit_piece,
                                   &(struct split){w, it->start}) < 0) {
            return -1;
        }
        pos = next;
    }
    atomic_fetch_add(&c->bytes_compared, it->end - it->start);
    return 0;
}

static int split_item(struct worker *w)
{
    struct ic_copy *c = w->c;
    const struct work_item *it = w->it;
    uint64_t len = it->end - it->start;
    if (atomic_load(&w->aio_failed)) {
        w->err = w->aio_err;
        return -1;
    }
    if (it->kind == RUN_DATA && c->hash &&
        ic_blkhash_update(c->hash, it->start, w->buf, (size_t)len, &w->err) < 0)
        return -1;
    if ((c->compare ? split_compared(w) : split_data(w)) < 0)
        return -1;
    w->step = STEP_STAGE;
    return 0;
}

/* Whether the destination reads zeros at an action's range already: in
 * compare mode, as read; else as known before the copy */
static int holds_zeros(const struct worker *w, const struct action *a)
{
    if (!w->c->compare)
        return reads_zeros(w->c, a);
    return ic_is_zero(w->dbuf + (a->off - w->it->start), (size_t)a->len);
}

/* Stage every piece, data and zeros (compression happens here, in
 * parallel); they are placed in guest order next, then committed. */
static int stage_item(struct worker *w)
{
    struct ic_copy *c = w->c;
    for (size_t k = 0; k < w->nacts; k++) {
        struct action *a = &w->acts[k];
        a->skip = a->equal || (!a->data && !a->allocated && holds_zeros(w, a));
        if (a->skip || a->allocated)
            continue; /* done at commit */
        struct ic_staged_write *st = &w->staged[w->nstaged];
        *st = (struct ic_staged_write){.off = a->off, .len = a->len,
                                       .buf = a->data ? a->buf : NULL};
        if (ic_image_stage(c->dst, st, &w->err) < 0)
            return -1;
        a->staged = 1;
        w->nstaged++;
    }
    w->step = STEP_PLACE;
    return 0;
}

/* Host allocation, in guest order (an overlay's zero clusters too). */
static int place_item(struct worker *w)
{
    struct ic_copy *c = w->c;
    int r = take_turn(w, TURN_PLACE);
    if (r)
        return r;
    for (size_t k = 0; c->ordered_place && k < w->nstaged; k++)
        if (ic_image_place(c->dst, &w->staged[k], &w->err) < 0)
            return -1;
    pass_turn(w, TURN_PLACE);
    w->step = STEP_COMMIT;
    return 0;
}

/* One data action written asynchronously (its bytes are the worker's
 * buffer, no copy): 1 submitted, 0 write it synchronously, -1 failed. */
static int commit_async(struct worker *w, const struct action *a)
{
    atomic_fetch_add(&w->pending, 1);
    int r = ic_image_aio_pwrite(w->c->dst, a->buf, (size_t)a->len, a->off, write_done, w,
                                &w->err);
    if (r <= 0)
        atomic_fetch_sub(&w->pending, 1);
    return r;
}

/* Write, zero or skip every action, in order when writes are. */
static int commit_item(struct worker *w)
{
    struct ic_copy *c = w->c;
    int r = take_turn(w, TURN_WRITE);
    if (r)
        return r;
    atomic_store(&w->pending, 1); /* ours, until every request is out */
    atomic_store(&w->aio_failed, 0);
    int ret = 0;
    size_t staged = 0;
    for (size_t k = 0; k < w->nacts && ret == 0; k++) {
        const struct action *a = &w->acts[k];
        if (a->skip) {
            atomic_fetch_add(&c->bytes_skipped, a->len);
            if (!c->opt.target_is_zero && !a->equal)
                atomic_fetch_add(&c->bytes_already_zero, a->len);
            ic_request_log_add(c->opt.log, a->off, a->len, IC_REQ_SKIP);
            continue;
        }
        struct ic_staged_write *st = a->staged ? &w->staged[staged++] : NULL;
        if (a->allocated) {
            ret = zero_allocated(w, a);
        } else {
            int sent = a->data && c->aio_writes ? commit_async(w, a) : 0;
            ret = sent < 0 ? -1 : sent ? 0 : ic_image_commit(c->dst, st, &w->err);
        }
        if (ret < 0)
            break;
        if (st)
            w->committed = staged;
        ic_request_log_add(c->opt.log, a->off, a->len, a->data ? IC_REQ_WRITE : IC_REQ_ZERO);
        atomic_fetch_add(a->data ? &c->bytes_written : &c->bytes_zeroed, a->len);
        atomic_fetch_add(a->data ? &c->write_requests : &c->zero_requests, 1);
    }
    if (ret == 0)
        pass_turn(w, TURN_WRITE);
    w->step = STEP_WRITTEN;
    /* the requests out are answered (even after a failure: the buffer is
     * theirs until then) */
    if (atomic_fetch_sub(&w->pending, 1) != 1)
        return ret < 0 ? (aio_failed(w, &w->err), IC_JOB_PENDING) : IC_JOB_PENDING;
    return ret;
}

/* Go through the item's steps from where it stands: 0 done, -1 failed
 * (w->err), IC_JOB_PENDING parked (resumed by I/O or a turn). */
static int advance(struct worker *w)
{
    for (;;) {
        int r = 0;
        switch (w->step) {
        case STEP_START:
            r = start_item(w);
            break;
        case STEP_OFFLOAD:
            r = offload_item(w);
            break;
        case STEP_READ:
            r = read_item(w);
            break;
        case STEP_SPLIT:
            r = split_item(w);
            break;
        case STEP_STAGE:
            r = stage_item(w);
            break;
        case STEP_PLACE:
            r = place_item(w);
            break;
        case STEP_COMMIT:
            r = commit_item(w);
            break;
        case STEP_WRITTEN:
            if (atomic_load(&w->aio_failed)) {
                w->err = w->aio_err;
                return -1;
            }
            return 0;
        }
        if (r)
            return r;
    }
}

/* Remember a written range; settle the oldest when the ring is full. */
static void write_behind(struct worker *w, uint64_t off, uint64_t len)
{
    struct ic_copy *c = w->c;
    if (!c->opt.flush)
        return;
    unsigned slot = (w->ibehind + w->nbehind) % SETTLE_DEPTH;
    if (w->nbehind == SETTLE_DEPTH) {
        ic_image_settle_written(c->dst, w->behind[w->ibehind].off, w->behind[w->ibehind].len);
        w->ibehind = (w->ibehind + 1) % SETTLE_DEPTH;
        slot = (w->ibehind + w->nbehind - 1) % SETTLE_DEPTH;
    } else {
        w->nbehind++;
    }
    w->behind[slot].off = off;
    w->behind[slot].len = len;
}

/* The item ended: staged writes never committed are dropped; a failure
 * stops the job (which resumes every parked item, to end). */
static int end_item(struct worker *w, int r, struct ic_error *err)
{
    struct ic_copy *c = w->c;
    const struct work_item *it = w->it;
    for (size_t k = w->committed; k < w->nstaged; k++)
        ic_image_unstage(c->dst, &w->staged[k]);
    w->nstaged = w->committed = 0;
    if (r < 0) {
        *err = w->err;
        ic_job_fail(c->job, err);
        return -1;
    }
    if (it->kind == RUN_DATA) {
        ic_image_settle_read(c->src, it->start, it->end - it->start);
        write_behind(w, it->start, it->end - it->start);
    }
    if (c->checkpoint)
        ic_checkpoint_done(c->checkpoint, it->start, it->end - it->start);
    ic_job_add_progress(c->job, it->end - it->start);
    return 0;
}

static int continue_item(struct worker *w, struct ic_error *err)
{
    int r = advance(w);
    return r == IC_JOB_PENDING ? r : end_item(w, r, err);
}

/* One work item, in the job's slot `slot` (its worker state is ours). */
static int run_item(void *ctx, unsigned slot, void *item, struct ic_error *err)
{
    struct ic_copy *c = ctx;
    struct worker *w = c->workers[slot];
    w->it = item;
    w->step = STEP_START;
    w->t = (struct turns){.seq = w->it->seq};
    w->nacts = w->nstaged = w->committed = 0;
    atomic_store(&w->pending, 0);
    atomic_store(&w->aio_failed, 0);
    ic_error_clear(&w->err);
    return continue_item(w, err);
}

static int resume_item(void *ctx, unsigned slot, void *item, struct ic_error *err)
{
    struct ic_copy *c = ctx;
    struct worker *w = c->workers[slot];
    (void)item;
    return continue_item(w, err);
}

/* Bytes a running item holds: its read buffer's share. */
static uint64_t item_cost(void *ctx, const void *item)
{
    (void)ctx;
    const struct work_item *it = item;
    return it->kind == RUN_DATA ? it->end - it->start : 0;
}

static const struct ic_job_ops copy_ops = {
    .item_size = sizeof(struct work_item),
    .plan = ic_copy_plan,
    .run = run_item,
    .resume = resume_item,
    .item_cost = item_cost,
    .complete = complete_copy,
    .interrupt = interrupt_copy,
    .tick = checkpoint_tick, /* with a journal only: params.tick_ms */
};

/* ---- life cycle -------------------------------------------------------- */

static void free_copy(struct ic_copy *c)
{
    ic_job_free(c->job);
    for (unsigned i = 0; i < c->nworkers; i++)
        free_worker(c->workers[i]);
    free(c->workers);
    free(c->parked[0]);
    free(c->parked[1]);
    free(c->spans);
    pthread_mutex_destroy(&c->turn_lock);
    free(c->zeros);
    ic_known_zeros_free(&c->dst_zeros);
    ic_blkhash_free(c->hash);
    ic_checkpoint_free(c->checkpoint);
    free(c);
}

static struct worker *new_worker(struct ic_copy *c, unsigned slot)
{
    struct worker *w = calloc(1, sizeof *w);
    if (!w)
        return NULL;
    w->c = c;
    w->slot = slot;
    atomic_init(&w->pending, 0);
    atomic_init(&w->aio_failed, 0);
    uint64_t g = ic_sparse_granularity(c->opt.sparse_threshold);
    /* look-around reads: a whole number of blocks, at least one */
    uint64_t want = c->opt.sparse_threshold < LOOKAROUND_CHUNK ? c->opt.sparse_threshold
                                                               : LOOKAROUND_CHUNK;
    size_t scratch_size = want / g * g < g ? g : want / g * g;
    w->sparse = (struct ic_sparse){.threshold = c->opt.sparse_threshold, .granularity = g,
                                   .scratch_size = scratch_size, .read = read_for_sparse,
                                   .ctx = w};
    /* at most a data run and a hole per block (windows cut some), merged
     * neighbours aside */
    w->cap = (size_t)(c->opt.request_size / g) * 2 + 4;
    /* compare mode: a piece per equal block, or the cuts of a differing one */
    if (c->compare && c->opt.request_size / c->compare * 2 + 4 > w->cap)
        w->cap = (size_t)(c->opt.request_size / c->compare) * 2 + 4;
    w->acts = calloc(w->cap, sizeof *w->acts);
    w->staged = calloc(w->cap, sizeof *w->staged);
    if (!w->acts || !w->staged ||
        posix_memalign((void **)&w->buf, BUFFER_ALIGN, c->opt.request_size) ||
        (c->compare && posix_memalign((void **)&w->dbuf, BUFFER_ALIGN, c->opt.request_size)) ||
        posix_memalign((void **)&w->sparse.scratch, BUFFER_ALIGN, scratch_size)) {
        free_worker(w);
        return NULL;
    }
    return w;
}

/* What to copy: the changed ranges asked for, sorted and merged, widened
 * to whole units of the destination's writes (a compressed cluster is
 * written whole, from the source); or the whole source. */
static int take_spans(struct ic_copy *c, struct ic_error *err)
{
    uint64_t size = ic_image_size(c->src);
    c->bytes_changed = size;
    if (!c->opt.has_changed)
        return 0;
    size_t n = c->opt.nchanged;
    c->spans = malloc((n ? n : 1) * sizeof *c->spans);
    if (!c->spans)
        return ic_error_nomem(err);
    memcpy(c->spans, c->opt.changed, n * sizeof *c->spans);
    if (ic_ranges_normalize(c->spans, &n, size, err) < 0)
        goto fail;
    uint64_t unit = c->write_align;
    for (size_t i = 0; unit > 1 && i < n; i++) {
        uint64_t start = c->spans[i].offset / unit * unit;
        uint64_t end = c->spans[i].offset + c->spans[i].length;
        end = end % unit && size - end >= unit - end % unit ? end + (unit - end % unit)
              : end % unit                                  ? size
                                                            : end;
        c->spans[i] = (struct ic_range){start, end - start};
    }
    if (unit > 1 && ic_ranges_normalize(c->spans, &n, size, err) < 0)
        goto fail;
    c->nspans = n;
    c->has_spans = 1;
    c->bytes_changed = 0;
    for (size_t i = 0; i < n; i++)
        c->bytes_changed += c->spans[i].length;
    c->opt.changed = NULL; /* the caller's: not kept */
    return 0;
fail:
    free(c->spans);
    c->spans = NULL;
    return -1;
}

/* The source's checksum: of the whole source; with changed ranges, the
 * blocks outside them handed in (a resumed copy), or those of one range
 * only (a shard: its digests go to the sink, no whole checksum). */
static int start_hash(struct ic_copy *c, struct ic_error *err)
{
    const struct ic_copy_options *opt = &c->opt;
    uint64_t block = opt->checksum_block_size ? opt->checksum_block_size
                                              : IC_BLKHASH_DEFAULT_BLOCK;
    uint64_t size = ic_image_size(c->src);
    if (ic_blkhash_new(opt->checksum, block, size, &c->hash, err) < 0)
        return -1;
    if (opt->journal) {
        struct ic_journal *j = opt->journal;
        if (ic_journal_digest_size(j) != ic_blkhash_size(c->hash) ||
            ic_journal_block_size(j) != block)
            return ic_error_value(err, "the journal keeps %zu-byte digests of %llu-byte "
                                  "blocks, the checksum is of %zu-byte digests of %llu-byte "
                                  "blocks", ic_journal_digest_size(j),
                                  (unsigned long long)ic_journal_block_size(j),
                                  ic_blkhash_size(c->hash), (unsigned long long)block);
        /* the recorded blocks first: the sink hears only this copy's */
        if (ic_journal_resumed(j) && ic_checkpoint_preset(j, c->hash, err) < 0)
            return -1;
        ic_blkhash_set_sink(c->hash, ic_checkpoint_sink, c->checkpoint);
        return 0;
    }
    if (opt->block_sink)
        ic_blkhash_set_sink(c->hash, opt->block_sink, opt->block_sink_ctx);
    if (!c->has_spans)
        return 0;
    if (opt->preset_digests)
        return opt->preset_digests(opt->preset_ctx, c, err);
    uint64_t start = c->nspans ? c->spans[0].offset : 0;
    uint64_t end = c->nspans ? start + c->spans[0].length : 0;
    if (c->nspans > 1 || start % block || (end % block && end != size))
        return ic_error_value(err, "a checksum of a copy of some ranges needs one range of "
                              "whole %llu-byte blocks (a shard), not %zu range%s",
                              (unsigned long long)block, c->nspans, c->nspans == 1 ? "" : "s");
    c->shard_hash = 1;
    return ic_blkhash_start_at(c->hash, start / block, err);
}

/* A journalled copy: its checkpoints, checked against the copy first */
static int start_checkpoints(struct ic_copy *c, struct ic_error *err)
{
    const struct ic_copy_options *opt = &c->opt;
    struct ic_journal *j = opt->journal;
    uint64_t size = ic_image_size(c->src);
    if (ic_journal_size(j) != size)
        return ic_error_value(err, "the journal is of a %llu-byte copy, the source has %llu "
                              "bytes", (unsigned long long)ic_journal_size(j),
                              (unsigned long long)size);
    if (opt->compare_block_size || opt->block_sink || opt->preset_digests)
        return ic_error_value(err, "a journal records a copy: not a comparison's, nor a "
                              "shard's digests");
    if (ic_journal_digest_size(j) && !opt->checksum)
        return ic_error_value(err, "the journal keeps the checksum's block digests: the copy "
                              "needs its checksum");
    if (!ic_journal_digest_size(j) && opt->checksum)
        return ic_error_value(err, "the journal keeps no block digests: a copy with a "
                              "checksum needs a journal that does");
    return ic_checkpoint_new(c->dst, j, opt->journal_interval_bytes, &c->checkpoint, err);
}

int ic_copy_put_digests(struct ic_copy *c, uint64_t first, uint64_t count,
                        const uint8_t *digests, struct ic_error *err)
{
    return ic_blkhash_put_digests(c->hash, first, count, digests, err);
}

/* Items in flight: one per thread, or, where an endpoint's requests go
 * out asynchronously, as many as its connections take (each item one
 * read or a few writes), within COPY_BYTES_IN_FLIGHT of buffers. */
static unsigned copy_slots(const struct ic_copy *c, const struct ic_copy_options *opt)
{
    unsigned want = opt->concurrency;
    unsigned remote = 0;
    if (c->aio_reads)
        remote = ic_image_requests_in_flight(c->src);
    if (c->aio_writes) {
        unsigned w = ic_image_requests_in_flight(c->dst);
        remote = w > remote ? w : remote;
    }
    uint64_t by_memory = COPY_BYTES_IN_FLIGHT / opt->request_size;
    if (remote > by_memory)
        remote = (unsigned)(by_memory ? by_memory : 1);
    if (remote > want)
        want = remote;
    /* a memory limit: as many items as its buffers allow, at least one */
    uint64_t per_item = opt->request_size * (c->compare ? 2 : 1);
    if (opt->buffer_limit && want > opt->buffer_limit / per_item)
        want = opt->buffer_limit / per_item ? (unsigned)(opt->buffer_limit / per_item) : 1;
    return want < IC_JOB_MAX_CONCURRENCY ? want : IC_JOB_MAX_CONCURRENCY;
}

void ic_copy_facts_of(const struct ic_image *src, const struct ic_image *dst,
                      struct ic_copy_facts *out)
{
    (void)src; /* no rule reads the source yet */
    *out = (struct ic_copy_facts){
        .dst_preferred = ic_image_preferred_size(dst),
        .dst_write_align = ic_image_write_alignment(dst),
        .dst_places_in_order = ic_image_places_in_order(dst),
        .dst_fresh = ic_image_fresh(dst),
        .dst_discards = strcmp(ic_image_format(dst), "null") == 0,
    };
}

void ic_copy_options_used(const struct ic_copy *c, struct ic_copy_options *out)
{
    *out = c->opt;
}

int ic_copy_start(struct ic_image *src, struct ic_image *dst, const struct ic_copy_options *asked,
                  struct ic_copy **out, struct ic_error *err)
{
    struct ic_copy_facts facts;
    ic_copy_facts_of(src, dst, &facts);
    struct ic_copy_options effective;
    if (ic_copy_options_effective(asked, &facts, &effective, err) < 0)
        return -1;
    const struct ic_copy_options *opt = &effective;
    if (!ic_image_writable(dst))
        return ic_error_readonly(err, ic_image_path(dst));
    if (ic_image_size(dst) < ic_image_size(src))
        return ic_error_value(err, "the destination (%llu bytes) is smaller than the source "
                              "(%llu bytes)", (unsigned long long)ic_image_size(dst),
                              (unsigned long long)ic_image_size(src));
    if (ic_image_tune(src, opt->connections, opt->requests_in_flight, err) < 0 ||
        ic_image_tune(dst, opt->connections, opt->requests_in_flight, err) < 0)
        return -1;
    ic_image_set_retries(src, opt->retries, opt->retry_delay_ms);
    ic_image_set_retries(dst, opt->retries, opt->retry_delay_ms);
    struct ic_copy *c = calloc(1, sizeof *c);
    if (!c)
        return ic_error_nomem(err);
    c->src = src;
    c->dst = dst;
    c->opt = *opt;
    c->write_align = facts.dst_write_align;
    c->zero_limit = ic_image_zero_limit(dst);
    c->zero_allocates = ic_image_zero_allocates(dst);
    ic_image_written(dst); /* no longer known to read as zeros */
    c->compare = opt->compare_block_size;
    if (take_spans(c, err) < 0) {
        free(c);
        return -1;
    }
    c->aio_reads = ic_image_aio_reads(src);
    c->aio_writes = ic_image_aio_writes(dst);
    /* holes a round trip is worth may be read through (the planner asks
     * what one costs once it has made one), not into whole clusters, nor
     * for an overlay, whose runs are cut by layer */
    c->may_merge = c->write_align == 1 && !ic_image_has_backing_file(dst);
    unsigned slots = copy_slots(c, opt);
    size_t queue_depth = 4 * (size_t)slots;
    c->workers = calloc(slots, sizeof *c->workers);
    int written_zeros = opt->sparse_threshold == 0 && !c->zero_allocates;
    if (written_zeros)
        c->zeros = calloc(1, c->opt.request_size);
    /* the items that may park for a turn are consecutive in guest order
     * and at most one per slot: twice as many places never collide */
    c->turn_slots = 2 * (size_t)slots;
    c->parked[0] = calloc(c->turn_slots, sizeof *c->parked[0]);
    c->parked[1] = calloc(c->turn_slots, sizeof *c->parked[1]);
    if (pthread_mutex_init(&c->turn_lock, NULL)) {
        free(c->workers);
        free(c->zeros);
        free(c->parked[0]);
        free(c->parked[1]);
        free(c->spans);
        free(c);
        return ic_error_nomem(err);
    }
    for (; c->workers && c->nworkers < slots; c->nworkers++)
        if (!(c->workers[c->nworkers] = new_worker(c, c->nworkers)))
            break;
    if (!c->workers || c->nworkers < slots || !c->parked[0] || !c->parked[1] ||
        (written_zeros && !c->zeros)) {
        free_copy(c);
        return ic_error_nomem(err);
    }
    atomic_init(&c->offload_refused, 0);
    if (opt->journal && start_checkpoints(c, err) < 0) {
        free_copy(c);
        return -1;
    }
    if (opt->checksum && start_hash(c, err) < 0) {
        free_copy(c);
        return -1;
    }
    c->ordered_place = ic_image_places_in_order(dst);
    c->dst_overlay = ic_image_has_backing_file(dst);
    if (c->dst_overlay)
        c->backing_end = ic_image_qemu_length(ic_image_backing(dst));
    /* Ask the destination what it reads as zeros already (a file's holes,
     * an NBD export's zero extents).  Not an overlay: zeros its backing
     * file gives (past its end) would change with that file, so they are
     * written, as qemu-img -B does. */
    if (!c->opt.target_is_zero && !c->dst_overlay && c->opt.sparse_threshold && !c->compare &&
        ic_known_zeros_init(&c->dst_zeros, dst, ic_image_size(src)) < 0) {
        free_copy(c);
        return ic_error_nomem(err);
    }

    struct ic_job_params params = {.concurrency = slots, .queue_depth = queue_depth,
                                   .total = c->bytes_changed, .pool = opt->pool,
                                   .threads = opt->concurrency < slots ? opt->concurrency : slots};
    if (c->checkpoint) {
        uint64_t ms = opt->journal_interval_ms ? opt->journal_interval_ms : 5000;
        params.tick_ms = ms > UINT_MAX ? UINT_MAX : (unsigned)ms;
    }
    if (ic_job_start(&copy_ops, c, &params, &c->job, err) < 0) {
        free_copy(c);
        return -1;
    }
    if (c->checkpoint)
        ic_checkpoint_set_job(c->checkpoint, c->job);
    *out = c;
    return 0;
}

struct ic_job *ic_copy_job(struct ic_copy *c)
{
    return c->job;
}

void ic_copy_progress(struct ic_copy *c, struct ic_copy_stats *out)
{
    out->bytes_read = atomic_load(&c->bytes_read);
    out->bytes_written = atomic_load(&c->bytes_written);
    out->bytes_zeroed = atomic_load(&c->bytes_zeroed);
    out->bytes_skipped = atomic_load(&c->bytes_skipped);
    out->bytes_already_zero = atomic_load(&c->bytes_already_zero);
    out->read_requests = atomic_load(&c->read_requests);
    out->write_requests = atomic_load(&c->write_requests);
    out->zero_requests = atomic_load(&c->zero_requests);
    out->extents = atomic_load(&c->extents);
    out->bytes_changed = c->bytes_changed;
    out->bytes_compared = atomic_load(&c->bytes_compared);
    out->bytes_equal = atomic_load(&c->bytes_equal);
    ic_job_progress(c->job, &out->done, &out->total);
}

int ic_copy_finish(struct ic_copy *c, struct ic_copy_stats *out, struct ic_error *err)
{
    struct ic_error failure = {0};
    int ret = ic_job_finish(c->job, &failure);
    if (ret < 0 && c->checkpoint) {
        /* failed or cancelled: what the items finished is kept if it can
         * be (a Ctrl-C loses nothing; a dead destination refuses) */
        struct ic_error ignored = {0};
        (void)ic_checkpoint_run(c->checkpoint, &ignored);
    }
    if (out) {
        ic_copy_progress(c, out);
        out->checksum[0] = '\0';
    }
    if (ret == 0 && ic_request_log_failed(c->opt.log)) {
        ic_error_nomem(&failure);
        ret = -1;
    }
    if (ret < 0) {
        if (failure.errnum == ECANCELED && failure.kind == IC_ERR_OS)
            ic_error_os(&failure, ECANCELED, NULL, "copy cancelled");
        if (err)
            *err = failure;
    } else if (c->hash && !c->shard_hash) {
        uint8_t digest[IC_DIGEST_MAX];
        char hex[IC_CHECKSUM_HEX_MAX];
        struct ic_error e = {0};
        if (ic_blkhash_final(c->hash, digest, hex, &e) < 0) {
            if (err)
                *err = e;
            ret = -1;
        } else if (out) {
            memcpy(out->checksum, hex, sizeof hex);
        }
    }
    free_copy(c);
    return ret;
}
