/* The copy engine: one planner thread walks the source's extents in guest
 * order and cuts them into work items; N workers read, find zero runs
 * (sparse.c) and write, zero or skip.  Every destination byte is touched
 * at most once.  Steps that must follow guest order (host allocation in
 * formats that allocate in guest order, the writes of an in-order copy)
 * are turns that each item takes and passes in sequence. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "blkhash.h"
#include "copy_internal.h"
#include "request_log.h"
#include "sparse.h"

#define LOOKAROUND_CHUNK (1u << 20)
#define BUFFER_ALIGN 4096u

/* ---- stopping ---------------------------------------------------------- */

/* The job stopped (failed or cancelled): wake every item waiting for a turn. */
static void interrupt_turns(void *ctx)
{
    struct ic_copy *c = ctx;
    pthread_mutex_lock(&c->turn_lock);
    c->stopping = 1;
    for (size_t i = 0; i < c->turn_slots; i++)
        pthread_cond_broadcast(&c->turn_changed[i]);
    pthread_mutex_unlock(&c->turn_lock);
}

/* A stopped copy (cancelled, or failed) waits for nothing in flight:
 * requests to a slow remote endpoint fail at once (its connections shut
 * down), so that the items, the planner and closing the images return
 * within moments. */
static void abort_endpoints(struct ic_copy *c)
{
    ic_image_abort(c->src);
    ic_image_abort(c->dst);
}

static void interrupt_copy(void *ctx)
{
    interrupt_turns(ctx);
    abort_endpoints(ctx);
}

/* Every item done: make the destination durable. */
static int complete_copy(void *ctx, struct ic_error *err)
{
    struct ic_copy *c = ctx;
    return c->opt.flush ? ic_image_flush(c->dst, err) : 0;
}

/* ---- workers ----------------------------------------------------------- */

/* What a worker does with one piece of its item: write data, or make a
 * hole (skip or zero). */
struct action {
    uint64_t off, len;
    const uint8_t *buf; /* data */
    int data;
    int skip; /* zeros the destination reads already */
    int allocated; /* zeros that stay allocated (fully allocated output) */
};

/* Writes whose writeback a worker lets run behind it before it waits for
 * them and drops their pages: deep enough to keep the disk busy, shallow
 * enough that the page cache never fills with the copy. */
#define SETTLE_DEPTH 4

struct worker {
    struct ic_copy *c;
    struct {
        uint64_t off, len;
    } behind[SETTLE_DEPTH]; /* ring of this worker's recent data writes */
    unsigned nbehind, ibehind;
    uint8_t *buf; /* request_size */
    struct ic_sparse sparse; /* zero runs; its scratch buffer is ours */
    struct action *acts;
    struct ic_staged_write *staged;
    size_t nacts, cap;
    struct ic_error err;
};

static void free_worker(struct worker *w)
{
    free(w->buf);
    free(w->sparse.scratch);
    free(w->acts);
    free(w->staged);
    free(w);
}

/* Turns keep a step in guest order across workers: host allocation
 * (place) for formats that allocate in guest order, and the writes of an
 * in-order copy.  Every item takes part in each turn that applies, in
 * sequence.  An item records which turns it holds and has passed; its one
 * exit path, end_turns(), passes every turn it has not passed, so no path
 * through an item (fallbacks, errors, skipped ranges) can keep a turn or
 * pass one twice. */
enum { TURN_PLACE, TURN_WRITE, NTURNS };

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

/* Wait for the item's turn (no wait if it holds it already); -1 when
 * the copy is cancelled. */
static int take_turn(struct ic_copy *c, struct turns *t, int which)
{
    unsigned bit = 1u << which;
    if (!turn_applies(c, which) || (t->held & bit))
        return 0;
    if (t->passed & bit) /* a turn comes once: taking it again is a bug */
        return -1;
    uint64_t *counter = turn_counter(c, which);
    pthread_cond_t *mine = &c->turn_changed[t->seq % c->turn_slots];
    pthread_mutex_lock(&c->turn_lock);
    while (*counter != t->seq && !c->stopping)
        pthread_cond_wait(mine, &c->turn_lock);
    int ok = !c->stopping;
    pthread_mutex_unlock(&c->turn_lock);
    if (!ok)
        return -1;
    t->held |= bit;
    return 0;
}

static void pass_turn(struct ic_copy *c, struct turns *t, int which)
{
    unsigned bit = 1u << which;
    if (!(t->held & bit))
        return;
    uint64_t *counter = turn_counter(c, which);
    pthread_mutex_lock(&c->turn_lock);
    (*counter)++;
    /* only the item whose turn it is now waits on this slot (and perhaps
     * one waiting for the other kind of turn with the same number) */
    pthread_cond_broadcast(&c->turn_changed[*counter % c->turn_slots]);
    pthread_mutex_unlock(&c->turn_lock);
    t->held &= ~bit;
    t->passed |= bit;
}

/* The item is done (or failed: the job stops first, so nobody waits):
 * pass every turn it has not passed yet, taking it first if need be. */
static void end_turns(struct ic_copy *c, struct turns *t)
{
    for (int which = 0; which < NTURNS; which++) {
        if (!turn_applies(c, which) || (t->passed & (1u << which)))
            continue;
        if (take_turn(c, t, which) == 0)
            pass_turn(c, t, which);
    }
}

static int read_source(struct worker *w, void *buf, uint64_t off, uint64_t len)
{
    struct ic_copy *c = w->c;
    if (ic_image_pread(c->src, buf, (size_t)len, off, &w->err) < 0)
        return -1;
    atomic_fetch_add(&c->bytes_read, len);
    atomic_fetch_add(&c->read_requests, 1);
    return 0;
}

static void add_action(struct worker *w, uint64_t off, uint64_t len, const uint8_t *buf, int data)
{
    if (len == 0)
        return;
    struct action *last = w->nacts ? &w->acts[w->nacts - 1] : NULL;
    if (last && last->data == data && !last->allocated && last->off + last->len == off &&
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
    const struct work_item *it;
};

static void emit_piece(void *ctx, uint64_t off, uint64_t len, int data)
{
    struct split *sp = ctx;
    add_action(sp->w, off, len, data ? sp->w->buf + (off - sp->it->start) : NULL, data);
}

/* Cut the item's data into data runs and holes. */
static int plan_sparse(struct worker *w, const struct work_item *it)
{
    struct split ctx = {w, it};
    return ic_sparse_split(&w->sparse, w->buf, it->start, it->end, it->ext_start, it->ext_end,
                           emit_piece, &ctx);
}

/* Kernel copy for a whole data item; 1 when the kernel refused (the item
 * keeps its write turn for the ordinary copy that follows). */
static int offload_item(struct worker *w, const struct work_item *it, struct turns *t)
{
    struct ic_copy *c = w->c;
    uint64_t len = it->end - it->start;
    if (take_turn(c, t, TURN_WRITE) < 0)
        return 0;
    if (ic_image_copy_range(c->src, c->dst, it->start, len, &w->err) == 0) {
        ic_request_log_add(c->opt.log, it->start, len, IC_REQ_WRITE);
        atomic_fetch_add(&c->bytes_read, len);
        atomic_fetch_add(&c->read_requests, 1);
        atomic_fetch_add(&c->bytes_written, len);
        atomic_fetch_add(&c->write_requests, 1);
        pass_turn(c, t, TURN_WRITE);
        return 0;
    }
    if (w->err.errnum != ENOTSUP)
        return -1;
    atomic_store(&c->offload_refused, 1);
    return 1;
}

/* Stage every piece, data and zeros (compression happens here, in
 * parallel), place them in guest order (host allocation; an overlay's
 * zero clusters), then commit them. */
static int execute(struct worker *w, struct turns *t)
{
    struct ic_copy *c = w->c;
    size_t nstaged = 0;
    int ret = 0;
    for (size_t k = 0; k < w->nacts; k++) {
        struct action *a = &w->acts[k];
        a->skip = !a->data && !a->allocated && reads_zeros(c, a);
    }
    for (size_t k = 0; k < w->nacts && ret == 0; k++) {
        const struct action *a = &w->acts[k];
        if (a->skip || a->allocated)
            continue; /* done at commit */
        struct ic_staged_write *st = &w->staged[nstaged];
        *st = (struct ic_staged_write){.off = a->off, .len = a->len,
                                       .buf = a->data ? a->buf : NULL};
        if (ic_image_stage(c->dst, st, &w->err) < 0)
            ret = -1;
        else
            nstaged++;
    }
    if (ret == 0 && c->ordered_place) {
        if (take_turn(c, t, TURN_PLACE) < 0) {
            ret = -1;
        } else {
            for (size_t k = 0; k < nstaged && ret == 0; k++)
                ret = ic_image_place(c->dst, &w->staged[k], &w->err);
            if (ret == 0)
                pass_turn(c, t, TURN_PLACE);
        }
    }
    if (ret == 0 && take_turn(c, t, TURN_WRITE) < 0)
        ret = -1;
    size_t committed = 0;
    for (size_t k = 0; k < w->nacts && ret == 0; k++) {
        const struct action *a = &w->acts[k];
        if (a->skip) {
            atomic_fetch_add(&c->bytes_skipped, a->len);
            if (!c->opt.target_is_zero)
                atomic_fetch_add(&c->bytes_already_zero, a->len);
            ic_request_log_add(c->opt.log, a->off, a->len, IC_REQ_SKIP);
            continue;
        }
        ret = a->allocated ? zero_allocated(w, a)
                           : ic_image_commit(c->dst, &w->staged[committed++], &w->err);
        if (ret < 0)
            break;
        ic_request_log_add(c->opt.log, a->off, a->len, a->data ? IC_REQ_WRITE : IC_REQ_ZERO);
        atomic_fetch_add(a->data ? &c->bytes_written : &c->bytes_zeroed, a->len);
        atomic_fetch_add(a->data ? &c->write_requests : &c->zero_requests, 1);
    }
    if (ret == 0)
        pass_turn(c, t, TURN_WRITE);
    for (size_t k = committed; k < nstaged; k++)
        ic_image_unstage(c->dst, &w->staged[k]);
    /* a failure after the job stopped (a turn refused) is not recorded */
    return ret;
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

static int copy_item(struct worker *w, const struct work_item *it, struct turns *t)
{
    struct ic_copy *c = w->c;
    uint64_t len = it->end - it->start;
    w->nacts = 0;
    /* the checksum sees what the copy reads, and zeros it knows of */
    if (c->hash && it->kind != RUN_DATA &&
        (it->kind == RUN_BACKING ? hash_unread(w, it)
                                 : ic_blkhash_zero(c->hash, it->start, len, &w->err)) < 0)
        return -1;
    if (it->kind == RUN_BACKING) {
        atomic_fetch_add(&c->bytes_skipped, len);
        ic_request_log_add(c->opt.log, it->start, len, IC_REQ_SKIP);
        return 0;
    }
    if (it->kind == RUN_ZERO) {
        if (c->opt.sparse_threshold == 0) /* fully allocated */
            add_allocated_zeros(w, it->start, len);
        else
            add_action(w, it->start, len, NULL, 0);
        return execute(w, t);
    }
    if (c->opt.offload && !atomic_load(&c->offload_refused)) {
        int r = offload_item(w, it, t);
        if (r <= 0)
            return r;
    }
    if (read_source(w, w->buf, it->start, len) < 0 ||
        (c->hash && ic_blkhash_update(c->hash, it->start, w->buf, (size_t)len, &w->err) < 0))
        return -1;
    if (c->opt.sparse_threshold == 0)
        add_action(w, it->start, len, w->buf, 1);
    else if (plan_sparse(w, it) < 0)
        return -1;
    return execute(w, t);
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

/* One work item, in the job's slot `slot` (its worker state is ours). */
static int run_item(void *ctx, unsigned slot, void *item, struct ic_error *err)
{
    struct ic_copy *c = ctx;
    struct worker *w = c->workers[slot];
    const struct work_item *it = item;
    struct turns t = {.seq = it->seq};
    ic_error_clear(&w->err);
    int r = copy_item(w, it, &t);
    if (r < 0) {
        *err = w->err;
        ic_job_fail(c->job, err); /* stops first: end_turns waits for nobody */
    }
    end_turns(c, &t);
    if (r < 0)
        return -1;
    if (it->kind == RUN_DATA) {
        ic_image_settle_read(c->src, it->start, it->end - it->start);
        write_behind(w, it->start, it->end - it->start);
    }
    ic_job_add_progress(c->job, it->end - it->start);
    return 0;
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
    .item_cost = item_cost,
    .complete = complete_copy,
    .interrupt = interrupt_copy,
};

/* ---- life cycle -------------------------------------------------------- */

static void free_copy(struct ic_copy *c)
{
    ic_job_free(c->job);
    for (unsigned i = 0; i < c->nworkers; i++)
        free_worker(c->workers[i]);
    free(c->workers);
    for (size_t i = 0; c->turn_changed && i < c->turn_slots; i++)
        pthread_cond_destroy(&c->turn_changed[i]);
    free(c->turn_changed);
    pthread_mutex_destroy(&c->turn_lock);
    free(c->zeros);
    ic_known_zeros_free(&c->dst_zeros);
    ic_blkhash_free(c->hash);
    free(c);
}

static struct worker *new_worker(struct ic_copy *c)
{
    struct worker *w = calloc(1, sizeof *w);
    if (!w)
        return NULL;
    w->c = c;
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
    w->acts = calloc(w->cap, sizeof *w->acts);
    w->staged = calloc(w->cap, sizeof *w->staged);
    if (!w->acts || !w->staged ||
        posix_memalign((void **)&w->buf, BUFFER_ALIGN, c->opt.request_size) ||
        posix_memalign((void **)&w->sparse.scratch, BUFFER_ALIGN, scratch_size)) {
        free_worker(w);
        return NULL;
    }
    return w;
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
    size_t queue_depth = 4 * (size_t)opt->concurrency;
    c->workers = calloc(opt->concurrency, sizeof *c->workers);
    int written_zeros = opt->sparse_threshold == 0 && !c->zero_allocates;
    if (written_zeros)
        c->zeros = calloc(1, c->opt.request_size);
    /* items in flight: those queued and one per slot; twice that many
     * turn slots keep any two waiting items on different ones */
    c->turn_slots = 2 * (queue_depth + opt->concurrency);
    c->turn_changed = calloc(c->turn_slots, sizeof *c->turn_changed);
    if (pthread_mutex_init(&c->turn_lock, NULL)) {
        free(c->workers);
        free(c->zeros);
        free(c->turn_changed);
        free(c);
        return ic_error_nomem(err);
    }
    for (size_t i = 0; c->turn_changed && i < c->turn_slots; i++)
        pthread_cond_init(&c->turn_changed[i], NULL);
    for (; c->workers && c->nworkers < opt->concurrency; c->nworkers++)
        if (!(c->workers[c->nworkers] = new_worker(c)))
            break;
    if (!c->workers || c->nworkers < opt->concurrency || !c->turn_changed ||
        (written_zeros && !c->zeros)) {
        free_copy(c);
        return ic_error_nomem(err);
    }
    atomic_init(&c->offload_refused, 0);
    if (opt->checksum) {
        if (ic_blkhash_new(opt->checksum, opt->checksum_block_size ? opt->checksum_block_size
                                                                   : IC_BLKHASH_DEFAULT_BLOCK,
                           ic_image_size(src), &c->hash, err) < 0) {
            free_copy(c);
            return -1;
        }
    }
    c->ordered_place = ic_image_places_in_order(dst);
    c->dst_overlay = ic_image_has_backing_file(dst);
    if (c->dst_overlay)
        c->backing_end = ic_image_qemu_length(ic_image_backing(dst));
    /* Ask the destination what it reads as zeros already (a file's holes,
     * an NBD export's zero extents).  Not an overlay: zeros its backing
     * file gives (past its end) would change with that file, so they are
     * written, as qemu-img -B does. */
    if (!c->opt.target_is_zero && !c->dst_overlay && c->opt.sparse_threshold &&
        ic_known_zeros_init(&c->dst_zeros, dst, ic_image_size(src)) < 0) {
        free_copy(c);
        return ic_error_nomem(err);
    }

    struct ic_job_params params = {.concurrency = opt->concurrency, .queue_depth = queue_depth,
                                   .total = ic_image_size(src), .pool = opt->pool};
    if (ic_job_start(&copy_ops, c, &params, &c->job, err) < 0) {
        free_copy(c);
        return -1;
    }
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
    ic_job_progress(c->job, &out->done, &out->total);
}

int ic_copy_finish(struct ic_copy *c, struct ic_copy_stats *out, struct ic_error *err)
{
    struct ic_error failure = {0};
    int ret = ic_job_finish(c->job, &failure);
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
    } else if (c->hash) {
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
