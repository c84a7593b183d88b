/* A copy's work items, step by step: read (or offload to the kernel),
 * find zero runs, stage, place and commit each piece, and the turns that
 * keep placing and in-order writes in guest order.  Every destination
 * byte is touched at most once. */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "blkhash.h"
#include "copy_worker.h"
#include "request_log.h"

/* ---- turns -------------------------------------------------------------- */

static uint64_t *turn_counter(struct ic_copy *c, int which)
{
    return which == TURN_PLACE ? &c->next_place_seq : &c->next_write_seq;
}

static int turn_applies(const struct ic_copy *c, int which)
{
    return which == TURN_PLACE ? c->ordered_place : !c->opt.out_of_order;
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

void ic_copy_interrupt_turns(struct ic_copy *c)
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



/* ---- reading and cutting ----------------------------------------------- */

/* Where part i of a shared read ends, in the guest */
static uint64_t item_part_end(const struct work_item *it, unsigned i)
{
    return it->start + it->parts[i].end;
}

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

int ic_copy_read_for_sparse(void *ctx, void *buf, uint64_t off, uint64_t len)
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
        uint64_t end = item_part_end(it, i);
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

/* A read counted elsewhere: the destination's (compare mode), or a part
 * of a shared read (counted once all are in) */
static void uncounted_read_done(void *ctx, const struct ic_error *err)
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

/* One read of [off, off + len) into `buf`: asynchronously where `img`
 * can (1: out, counted in w->pending), else at once (0); -1 failed. */
static int start_read(struct worker *w, struct ic_image *img, int async, uint8_t *buf,
                      uint64_t off, uint64_t len, ic_aio_done_fn *done)
{
    if (async) {
        atomic_fetch_add(&w->pending, 1);
        int r = ic_image_aio_pread(img, buf, (size_t)len, off, done, w, &w->err);
        if (r > 0)
            return 1;
        atomic_fetch_sub(&w->pending, 1);
        if (r < 0)
            return -1;
    }
    if (ic_image_pread(img, buf, (size_t)len, off, &w->err) < 0)
        return -1;
    if (img == w->c->src)
        count_read(w->c, len);
    return 0;
}

static int has_holes(const struct work_item *it)
{
    for (unsigned i = 0; i < it->nparts; i++)
        if (!it->parts[i].data)
            return 1;
    return 0;
}

/* A shared read's data parts, read apart: a hole between two goes unread
 * unless it is short enough that its bytes cost less than a request
 * (c->read_through); unread holes are zeroed in the buffer only where the
 * whole buffer is used (a checksum hashes it, compare mode compares it). */
static int start_part_reads(struct worker *w)
{
    struct ic_copy *c = w->c;
    const struct work_item *it = w->it;
    int whole_buffer = c->hash || c->compare;
    uint64_t read_through = atomic_load_explicit(&c->read_through, memory_order_relaxed);
    w->parts_read = 0;
    uint64_t pos = it->start;
    for (unsigned i = 0; i < it->nparts;) {
        uint64_t end = item_part_end(it, i);
        if (!it->parts[i].data) {
            if (whole_buffer)
                memset(w->buf + (pos - it->start), 0, (size_t)(end - pos));
            pos = end;
            i++;
            continue;
        }
        /* a data part, and the short holes and data parts after it */
        unsigned last = i;
        for (unsigned j = i + 1; j < it->nparts; j++) {
            if (it->parts[j].data)
                last = j;
            else if (it->parts[j].end - it->parts[j - 1].end > read_through)
                break;
        }
        end = item_part_end(it, last);
        int r = start_read(w, c->src, 1, w->buf + (pos - it->start), pos, end - pos,
                           uncounted_read_done);
        if (r < 0)
            return -1;
        if (r > 0) { /* a read done at once counted itself */
            w->parts_read += end - pos;
            w->parts_reads++;
        }
        pos = end;
        i = last + 1;
    }
    return 0;
}

/* The source's data, and in compare mode the destination's bytes */
static int read_item(struct worker *w)
{
    struct ic_copy *c = w->c;
    w->step = STEP_SPLIT;
    atomic_store(&w->aio_failed, 0);
    atomic_store(&w->pending, 1); /* ours, until every read is out */
    const struct work_item *it = w->it;
    int r = 0;
    w->parts_reads = 0;
    if (it->kind == RUN_DATA && c->read_parts && has_holes(it))
        r = start_part_reads(w);
    else if (it->kind == RUN_DATA)
        r = start_read(w, c->src, c->aio_reads, w->buf, it->start, it->end - it->start,
                       read_done);
    if (r >= 0 && c->compare)
        r = start_read(w, c->dst, ic_image_aio_reads(c->dst), w->dbuf, it->start,
                       it->end - it->start, uncounted_read_done);
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
    if (w->parts_reads) {
        atomic_fetch_add(&c->bytes_read, w->parts_read);
        atomic_fetch_add(&c->read_requests, w->parts_reads);
        w->parts_reads = 0;
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
int ic_copy_run_item(void *ctx, unsigned slot, void *item, struct ic_error *err)
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

int ic_copy_resume_item(void *ctx, unsigned slot, void *item, struct ic_error *err)
{
    struct ic_copy *c = ctx;
    struct worker *w = c->workers[slot];
    (void)item;
    return continue_item(w, err);
}

/* Bytes a running item holds: its read buffer's share. */
uint64_t ic_copy_item_cost(void *ctx, const void *item)
{
    (void)ctx;
    const struct work_item *it = item;
    return it->kind == RUN_DATA ? it->end - it->start : 0;
}
