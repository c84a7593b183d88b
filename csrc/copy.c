/* The copy engine: one planner thread walks the source's extents in guest
 * order and cuts them into work items; N workers read, find zero runs and
 * write, zero or skip.  Every destination byte is touched at most once.
 *
 * Zero runs inside data are judged as qemu-img convert -S judges them, so
 * that outputs allocate what qemu's do: qemu reads each data extent in
 * 2 MiB requests counted from the extent's start (an extent longer than
 * 2 GiB - 512 is several, as its block-status queries are), and inside a
 * request finds zeros on blocks of the largest power of two not above the
 * threshold, aligned in the guest and clipped at the request's edges.  A
 * run of zero blocks becomes a hole when it is at least sparse_threshold
 * long or touches a request's edge, and is written as data otherwise.
 * Here those requests are "windows", independent of imgcopy's own request
 * size; a run that reaches the edge of a work item inside a window is
 * measured across it by reading ahead or behind, so the verdict never
 * depends on where items were cut. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "image.h"

/* Zero ranges need no buffer: large requests keep the request count low,
 * this bound keeps progress moving. */
#define ZERO_REQUEST_MAX (1ull << 30)
/* qemu-img's read requests (its buffer, which -S does not grow) and its
 * longest block-status answer: zero runs are judged in these windows */
#define SPARSE_WINDOW (2ull << 20)
#define STATUS_MAX ((1ull << 31) - 512)
#define LOOKAROUND_CHUNK (1u << 20)
#define BUFFER_ALIGN 4096u
/* qemu-img's limit too */
#define MAX_SPARSE_THRESHOLD (16u << 20)

/* What a source run asks of the destination. */
enum {
    RUN_ZERO = 0,    /* reads as zeros: zero or skip it                  */
    RUN_DATA = 1,    /* read it, find its zero runs, write the rest      */
    RUN_BACKING = 2, /* the destination's backing file holds it: skip it */
};

struct work_item {
    uint64_t start, end;         /* guest range of this item            */
    uint64_t ext_start, ext_end; /* the source extent it belongs to     */
    uint64_t seq;                /* guest order, for in-order writes    */
    int kind;                    /* RUN_*                               */
};

struct ic_copy {
    struct ic_image *src, *dst;
    struct ic_copy_options opt;
    uint64_t granularity;
    uint64_t write_align; /* the destination writes whole units of this */
    uint8_t *zeros; /* request_size zero bytes, for fully allocated output */

    pthread_mutex_t lock;
    pthread_cond_t changed; /* queue, turn, cancellation or completion */
    struct work_item *queue;
    size_t qcap, qhead, qcount;
    int planner_done;
    uint64_t next_write_seq; /* in-order writes */
    uint64_t next_place_seq; /* host allocation in guest order */
    int ordered_place;
    int dst_overlay; /* the destination reads what it lacks from a backing file */
    uint64_t backing_end; /* overlay: where that file ends (qemu's length) */
    int cancelled;
    int failed;
    struct ic_error error;
    unsigned live_threads;
    int complete;

    pthread_t planner;
    int planner_started;
    pthread_t *workers;
    unsigned nthreads; /* started: planner + workers */

    atomic_int offload_refused;
    atomic_uint_fast64_t bytes_read, bytes_written, bytes_zeroed, bytes_skipped;
    atomic_uint_fast64_t read_requests, write_requests, zero_requests;
    atomic_uint_fast64_t extents, done;
};

/* ---- request log -------------------------------------------------------- */

struct ic_request_log {
    pthread_mutex_t lock;
    struct ic_request *items;
    size_t count, cap;
    int failed;
};

struct ic_request_log *ic_request_log_new(void)
{
    struct ic_request_log *log = calloc(1, sizeof *log);
    if (log)
        pthread_mutex_init(&log->lock, NULL);
    return log;
}

void ic_request_log_free(struct ic_request_log *log)
{
    if (!log)
        return;
    pthread_mutex_destroy(&log->lock);
    free(log->items);
    free(log);
}

static void log_request(struct ic_request_log *log, uint64_t off, uint64_t len, uint32_t kind)
{
    if (!log)
        return;
    pthread_mutex_lock(&log->lock);
    if (log->count == log->cap && !log->failed) {
        size_t nc = log->cap ? log->cap * 2 : 1024;
        struct ic_request *ni = realloc(log->items, nc * sizeof *ni);
        if (ni) {
            log->items = ni;
            log->cap = nc;
        } else {
            log->failed = 1;
        }
    }
    if (log->count < log->cap)
        log->items[log->count++] = (struct ic_request){.offset = off, .length = len, .kind = kind};
    pthread_mutex_unlock(&log->lock);
}

static int by_offset(const void *a, const void *b)
{
    const struct ic_request *x = a, *y = b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

const struct ic_request *ic_request_log_sorted(struct ic_request_log *log, size_t *count)
{
    *count = log->failed ? 0 : log->count;
    if (log->failed || !log->count)
        return NULL;
    qsort(log->items, log->count, sizeof *log->items, by_offset);
    return log->items;
}

/* ---- shared state ------------------------------------------------------ */

static void fail(struct ic_copy *c, const struct ic_error *err)
{
    pthread_mutex_lock(&c->lock);
    if (!c->failed) {
        c->failed = 1;
        c->error = *err;
    }
    c->cancelled = 1;
    pthread_cond_broadcast(&c->changed);
    pthread_mutex_unlock(&c->lock);
}

static int cancelled(struct ic_copy *c)
{
    pthread_mutex_lock(&c->lock);
    int r = c->cancelled;
    pthread_mutex_unlock(&c->lock);
    return r;
}

/* The last thread out makes the destination durable, then reports. */
static void thread_exit(struct ic_copy *c)
{
    pthread_mutex_lock(&c->lock);
    int last = --c->live_threads == 0;
    int flush = last && !c->cancelled && c->opt.flush;
    pthread_mutex_unlock(&c->lock);
    if (flush) {
        struct ic_error err = {0};
        if (ic_image_flush(c->dst, &err) < 0)
            fail(c, &err);
    }
    if (last) {
        pthread_mutex_lock(&c->lock);
        c->complete = 1;
        pthread_cond_broadcast(&c->changed);
        pthread_mutex_unlock(&c->lock);
    }
}

/* ---- planner ----------------------------------------------------------- */

static int push_item(struct ic_copy *c, const struct work_item *item)
{
    pthread_mutex_lock(&c->lock);
    while (c->qcount == c->qcap && !c->cancelled)
        pthread_cond_wait(&c->changed, &c->lock);
    int ok = !c->cancelled;
    if (ok) {
        c->queue[(c->qhead + c->qcount) % c->qcap] = *item;
        c->qcount++;
        pthread_cond_broadcast(&c->changed);
    }
    pthread_mutex_unlock(&c->lock);
    return ok ? 0 : -1;
}

/* Cut one extent into items whose edges fall on multiples of the step; a
 * data extent is first cut where qemu's block-status answers end (unless
 * the destination writes whole clusters: compression). */
static int plan_extent(struct ic_copy *c, uint64_t start, uint64_t end, int kind, uint64_t *seq)
{
    if (kind == RUN_DATA && end - start > STATUS_MAX && c->write_align == 1) {
        for (uint64_t pos = start; pos < end; pos += STATUS_MAX)
            if (plan_extent(c, pos, end - pos > STATUS_MAX ? pos + STATUS_MAX : end, kind,
                            seq) < 0)
                return -1;
        return 0;
    }
    int written_zeros = kind == RUN_ZERO && c->opt.sparse_threshold == 0;
    int skipped = kind == RUN_BACKING || (kind == RUN_ZERO && !written_zeros &&
                                          c->opt.target_is_zero);
    /* a skipped range costs nothing, however long: one item */
    uint64_t step = kind == RUN_DATA || written_zeros ? c->opt.request_size
                    : skipped                         ? UINT64_MAX
                                                      : ZERO_REQUEST_MAX;
    for (uint64_t pos = start; pos < end;) {
        uint64_t next = (pos / step + 1) * step;
        if (next > end || next < pos)
            next = end;
        struct work_item item = {
            .start = pos, .end = next, .ext_start = start, .ext_end = end,
            .seq = (*seq)++, .kind = kind,
        };
        if (push_item(c, &item) < 0)
            return -1;
        pos = next;
    }
    return 0;
}

/* Zero and unallocated ranges read as zeros, whatever DATA says.  For an
 * overlay destination, as qemu-img -B does: what the source's own backing
 * chain holds (depth above 0) is left to the overlay's backing file, and
 * so are zeros past the end of that file (the overlay reads zeros there). */
static int run_kind(const struct ic_copy *c, const struct ic_extent *e, uint64_t pos)
{
    int data = (e->flags & IC_EXT_DATA) && !(e->flags & IC_EXT_ZERO);
    if (c->dst_overlay && (e->depth > 0 || (!data && pos >= c->backing_end)))
        return RUN_BACKING;
    return data ? RUN_DATA : RUN_ZERO;
}

/* Source runs become items; with a destination that writes whole
 * clusters (compression), a zero run keeps only its cluster-aligned inside
 * and its ragged edges join the data around it (they read as zeros). */
struct aligner {
    struct ic_copy *c;
    uint64_t align, size, seq;
    uint64_t data_start, data_end; /* pending data run, not yet planned */
    int have_data;
};

static int flush_data(struct aligner *a)
{
    int r = 0;
    if (a->have_data && a->data_end > a->data_start)
        r = plan_extent(a->c, a->data_start, a->data_end, RUN_DATA, &a->seq);
    a->have_data = 0;
    return r;
}

static void add_data(struct aligner *a, uint64_t start, uint64_t end)
{
    if (!a->have_data) {
        a->data_start = start;
        a->have_data = 1;
    }
    a->data_end = end;
}

static int add_run(struct aligner *a, uint64_t start, uint64_t end, int kind)
{
    atomic_fetch_add(&a->c->extents, 1);
    if (kind == RUN_DATA) {
        add_data(a, start, end);
        return 0;
    }
    uint64_t al = a->align;
    uint64_t zs = start % al ? (start / al + 1) * al : start;
    uint64_t ze = end == a->size ? end : end / al * al;
    if (zs >= ze) {
        add_data(a, start, end);
        return 0;
    }
    if (zs > start)
        add_data(a, start, zs);
    if (flush_data(a) < 0 || plan_extent(a->c, zs, ze, kind, &a->seq) < 0)
        return -1;
    if (end > ze)
        add_data(a, ze, end);
    return 0;
}

static void *planner_main(void *arg)
{
    struct ic_copy *c = arg;
    uint64_t size = ic_image_size(c->src);
    uint64_t run_start = 0, pos = 0;
    int run_kind_now = -1;
    struct ic_error err = {0};
    struct aligner al = {.c = c, .align = c->write_align, .size = size};
    /* neighbours of one kind are one extent: the cache may answer a long
     * extent in pieces, and zero runs at extent edges are judged by it.
     * An overlay's runs also end where its backing file ends, as qemu-img
     * -B cuts them there. */
    uint64_t cut = c->dst_overlay ? c->backing_end : UINT64_MAX;
    uint64_t host_next = UINT64_MAX; /* where a data run's host bytes continue */
    while (pos < size) {
        if (cancelled(c))
            goto out;
        struct ic_extent e;
        if (ic_image_block_status(c->src, pos, size - pos, &e, &err) < 0) {
            fail(c, &err);
            goto out;
        }
        uint64_t len = pos < cut && e.length > cut - pos ? cut - pos : e.length;
        int kind = run_kind(c, &e, pos);
        /* qemu's data extents also end where the host bytes stop being
         * contiguous (another cluster run, another layer, a compressed
         * cluster): its zero runs are judged from there */
        int host_break = kind == RUN_DATA && c->write_align == 1 &&
                         (!(e.flags & IC_EXT_OFFSET_VALID) || e.host_offset != host_next);
        int at_cut = pos == cut;
        if (run_kind_now >= 0 && (kind != run_kind_now || at_cut || host_break)) {
            if (add_run(&al, run_start, pos, run_kind_now) < 0 ||
                ((at_cut || host_break) && flush_data(&al) < 0))
                goto out;
            run_start = pos;
        }
        host_next = (e.flags & IC_EXT_OFFSET_VALID) ? e.host_offset + len : UINT64_MAX;
        run_kind_now = kind;
        pos += len;
    }
    if (run_kind_now >= 0 && add_run(&al, run_start, size, run_kind_now) == 0)
        flush_data(&al);
out:
    pthread_mutex_lock(&c->lock);
    c->planner_done = 1;
    pthread_cond_broadcast(&c->changed);
    pthread_mutex_unlock(&c->lock);
    thread_exit(c);
    return NULL;
}

/* ---- workers ----------------------------------------------------------- */

/* What a worker does with one piece of its item: write data, or make a
 * hole (skip or zero). */
struct action {
    uint64_t off, len;
    const uint8_t *buf; /* data */
    int data;
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
    uint8_t *buf;     /* request_size */
    uint8_t *scratch; /* look-around reads */
    size_t scratch_size;
    struct action *acts;
    struct ic_staged_write *staged;
    size_t nacts, cap;
    struct ic_error err;
};

static int pop_item(struct ic_copy *c, struct work_item *item)
{
    pthread_mutex_lock(&c->lock);
    while (c->qcount == 0 && !c->planner_done && !c->cancelled)
        pthread_cond_wait(&c->changed, &c->lock);
    int ok = !c->cancelled && c->qcount > 0;
    if (ok) {
        *item = c->queue[c->qhead];
        c->qhead = (c->qhead + 1) % c->qcap;
        c->qcount--;
        pthread_cond_broadcast(&c->changed);
    }
    pthread_mutex_unlock(&c->lock);
    return ok;
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
    pthread_mutex_lock(&c->lock);
    while (*counter != t->seq && !c->cancelled)
        pthread_cond_wait(&c->changed, &c->lock);
    int ok = !c->cancelled;
    pthread_mutex_unlock(&c->lock);
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
    pthread_mutex_lock(&c->lock);
    (*counter)++;
    pthread_cond_broadcast(&c->changed);
    pthread_mutex_unlock(&c->lock);
    t->held &= ~bit;
    t->passed |= bit;
}

/* The item is done (or failed, after fail() cancelled the copy): pass
 * every turn it has not passed yet, taking it first if need be. */
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
    if (last && last->data == data && last->off + last->len == off &&
        (!data || last->buf + last->len == buf)) {
        last->len += len;
        return;
    }
    w->acts[w->nacts++] = (struct action){.off = off, .len = len, .buf = buf, .data = data};
}

/* The window (qemu's read request) around `pos`: [*ws, *we). */
static void window_of(const struct work_item *it, uint64_t pos, uint64_t *ws, uint64_t *we)
{
    *ws = it->ext_start + (pos - it->ext_start) / SPARSE_WINDOW * SPARSE_WINDOW;
    *we = it->ext_end - *ws > SPARSE_WINDOW ? *ws + SPARSE_WINDOW : it->ext_end;
}

/* The end of the zero-detection block at `pos`: blocks are aligned in the
 * guest and clipped at windows and at `limit`. */
static uint64_t block_end(const struct ic_copy *c, const struct work_item *it, uint64_t pos,
                          uint64_t limit)
{
    uint64_t ws, we;
    window_of(it, pos, &ws, &we);
    uint64_t next = (pos / c->granularity + 1) * c->granularity;
    if (next > we)
        next = we;
    return next < limit ? next : limit;
}

/* Zero bytes that continue a run from `from` (a block boundary) forward
 * or backward, counted in whole blocks, up to `need` bytes, inside the
 * window [ws, we); *edge is set when the zeros reach its edge. */
static int measure_zeros(struct worker *w, uint64_t ws, uint64_t we, uint64_t from,
                         uint64_t need, int forward, uint64_t *found, int *edge)
{
    struct ic_copy *c = w->c;
    uint64_t g = c->granularity, pos = from;
    *found = 0;
    *edge = 0;
    while (*found < need) {
        uint64_t chunk = (need - *found + g - 1) / g * g;
        if (chunk > w->scratch_size)
            chunk = w->scratch_size;
        uint64_t lo, hi;
        if (forward) {
            lo = pos;
            hi = we - pos < chunk ? we : pos + chunk;
        } else {
            hi = pos;
            lo = pos - ws < chunk ? ws : pos - chunk;
        }
        if (lo == hi) {
            *edge = 1;
            return 0;
        }
        if (read_source(w, w->scratch, lo, hi - lo) < 0)
            return -1;
        for (uint64_t k = 0; k < hi - lo; k += g) {
            /* blocks walk away from `from`; only the last may be partial */
            uint64_t n = hi - lo - k < g ? hi - lo - k : g;
            uint64_t b0 = forward ? lo + k : hi - k - n;
            if (!ic_is_zero(w->scratch + (b0 - lo), (size_t)n))
                return 0;
            *found += n;
            if (*found >= need)
                return 0;
        }
        pos = forward ? hi : lo;
        if (pos == (forward ? we : ws)) {
            *edge = 1;
            return 0;
        }
    }
    return 0;
}

/* Does the zero run [za, zb) of this item become a hole? */
static int is_hole(struct worker *w, const struct work_item *it, uint64_t za, uint64_t zb,
                   int *verdict)
{
    uint64_t threshold = w->c->opt.sparse_threshold;
    uint64_t len = zb - za, found, ws, we;
    int edge;
    *verdict = 1;
    window_of(it, za, &ws, &we);
    /* touching or spanning a window's edge, or long enough */
    if (za == ws || zb >= we || len >= threshold)
        return 0;
    if (za == it->start) {
        if (measure_zeros(w, ws, we, za, threshold - len, 0, &found, &edge) < 0)
            return -1;
        len += found;
        if (edge || len >= threshold)
            return 0;
    }
    if (zb == it->end) {
        if (measure_zeros(w, ws, we, zb, threshold - len, 1, &found, &edge) < 0)
            return -1;
        len += found;
        if (edge || len >= threshold)
            return 0;
    }
    *verdict = 0;
    return 0;
}

/* Cut the item's data into data runs and holes. */
static int plan_sparse(struct worker *w, const struct work_item *it)
{
    struct ic_copy *c = w->c;
    const uint8_t *buf = w->buf;
    uint64_t pending = it->start; /* start of data not yet planned */
    uint64_t pos = it->start;
    while (pos < it->end) {
        uint64_t b1 = block_end(c, it, pos, it->end);
        if (!ic_is_zero(buf + (pos - it->start), (size_t)(b1 - pos))) {
            pos = b1;
            continue;
        }
        uint64_t za = pos;
        pos = b1;
        while (pos < it->end) {
            b1 = block_end(c, it, pos, it->end);
            if (!ic_is_zero(buf + (pos - it->start), (size_t)(b1 - pos)))
                break;
            pos = b1;
        }
        int hole;
        if (is_hole(w, it, za, pos, &hole) < 0)
            return -1;
        if (!hole)
            continue;
        add_action(w, pending, za - pending, buf + (pending - it->start), 1);
        add_action(w, za, pos - za, NULL, 0);
        pending = pos;
    }
    add_action(w, pending, it->end - pending, buf + (pending - it->start), 1);
    return 0;
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
        log_request(c->opt.log, it->start, len, IC_REQ_WRITE);
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
    for (size_t k = 0; k < w->nacts && ret == 0; k++) {
        const struct action *a = &w->acts[k];
        if (!a->data && c->opt.target_is_zero)
            continue; /* skipped at commit */
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
        if (!a->data && c->opt.target_is_zero) {
            atomic_fetch_add(&c->bytes_skipped, a->len);
            log_request(c->opt.log, a->off, a->len, IC_REQ_SKIP);
            continue;
        }
        ret = ic_image_commit(c->dst, &w->staged[committed++], &w->err);
        if (ret < 0)
            break;
        log_request(c->opt.log, a->off, a->len, a->data ? IC_REQ_WRITE : IC_REQ_ZERO);
        atomic_fetch_add(a->data ? &c->bytes_written : &c->bytes_zeroed, a->len);
        atomic_fetch_add(a->data ? &c->write_requests : &c->zero_requests, 1);
    }
    if (ret == 0)
        pass_turn(c, t, TURN_WRITE);
    for (size_t k = committed; k < nstaged; k++)
        ic_image_unstage(c->dst, &w->staged[k]);
    /* a failure of ours was recorded; one caused by cancellation was not */
    return ret < 0 && !cancelled(c) ? -1 : 0;
}

static int copy_item(struct worker *w, const struct work_item *it, struct turns *t)
{
    struct ic_copy *c = w->c;
    uint64_t len = it->end - it->start;
    w->nacts = 0;
    if (it->kind == RUN_BACKING) {
        atomic_fetch_add(&c->bytes_skipped, len);
        log_request(c->opt.log, it->start, len, IC_REQ_SKIP);
        return 0;
    }
    if (it->kind == RUN_ZERO) {
        if (c->opt.sparse_threshold == 0) /* fully allocated: zeros are data */
            add_action(w, it->start, len, c->zeros, 1);
        else
            add_action(w, it->start, len, NULL, 0);
        return execute(w, t);
    }
    if (c->opt.offload && !atomic_load(&c->offload_refused)) {
        int r = offload_item(w, it, t);
        if (r <= 0)
            return r;
    }
    if (read_source(w, w->buf, it->start, len) < 0)
        return cancelled(c) ? 0 : -1;
    if (c->opt.sparse_threshold == 0)
        add_action(w, it->start, len, w->buf, 1);
    else if (plan_sparse(w, it) < 0)
        return cancelled(c) ? 0 : -1;
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

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    struct ic_copy *c = w->c;
    struct work_item it;
    while (pop_item(c, &it)) {
        struct turns t = {.seq = it.seq};
        int r = copy_item(w, &it, &t);
        if (r < 0)
            fail(c, &w->err); /* cancels first: end_turns waits for nobody */
        end_turns(c, &t);
        if (r < 0)
            break;
        if (it.kind == RUN_DATA) {
            ic_image_settle_read(c->src, it.start, it.end - it.start);
            write_behind(w, it.start, it.end - it.start);
        }
        atomic_fetch_add(&c->done, it.end - it.start);
    }
    free(w->buf);
    free(w->scratch);
    free(w->acts);
    free(w->staged);
    free(w);
    thread_exit(c);
    return NULL;
}

/* ---- life cycle -------------------------------------------------------- */

static void free_copy(struct ic_copy *c)
{
    pthread_cond_destroy(&c->changed);
    pthread_mutex_destroy(&c->lock);
    free(c->queue);
    free(c->workers);
    free(c->zeros);
    free(c);
}

static int check_options(const struct ic_copy_options *o, struct ic_error *err)
{
    if (o->concurrency < 1 || o->concurrency > 1024)
        return ic_error_value(err, "concurrency must be between 1 and 1024");
    if (o->request_size < 4096 || o->request_size > (1u << 30) || o->request_size % 4096)
        return ic_error_value(err, "request_size must be a multiple of 4096 between 4 KiB "
                                   "and 1 GiB");
    if (o->sparse_threshold % 512 || o->sparse_threshold > MAX_SPARSE_THRESHOLD)
        return ic_error_value(err, "sparse_threshold must be a multiple of 512 up to 16 MiB");
    return 0;
}

/* Zero runs are found on blocks aligned to the largest power of two not
 * above the threshold, as qemu-img convert -S aligns them. */
static uint64_t zero_granularity(uint64_t threshold)
{
    if (threshold == 0)
        return 4096;
    uint64_t g = 512;
    while (g * 2 <= threshold)
        g *= 2;
    return g;
}

static struct worker *new_worker(struct ic_copy *c)
{
    struct worker *w = calloc(1, sizeof *w);
    if (!w)
        return NULL;
    w->c = c;
    /* look-around reads: a whole number of blocks, at least one */
    uint64_t want = c->opt.sparse_threshold < LOOKAROUND_CHUNK ? c->opt.sparse_threshold
                                                               : LOOKAROUND_CHUNK;
    w->scratch_size = want / c->granularity * c->granularity;
    if (w->scratch_size < c->granularity)
        w->scratch_size = c->granularity;
    /* at most a data run and a hole per block, merged neighbours aside */
    w->cap = (size_t)(c->opt.request_size / c->granularity) + 4;
    w->acts = calloc(w->cap, sizeof *w->acts);
    w->staged = calloc(w->cap, sizeof *w->staged);
    if (!w->acts || !w->staged ||
        posix_memalign((void **)&w->buf, BUFFER_ALIGN, c->opt.request_size) ||
        posix_memalign((void **)&w->scratch, BUFFER_ALIGN, w->scratch_size)) {
        free(w->buf);
        free(w->acts);
        free(w->staged);
        free(w);
        return NULL;
    }
    return w;
}

int ic_copy_start(struct ic_image *src, struct ic_image *dst, const struct ic_copy_options *opt,
                  struct ic_copy **out, struct ic_error *err)
{
    if (check_options(opt, err) < 0)
        return -1;
    if (!ic_image_writable(dst))
        return ic_error_readonly(err, ic_image_path(dst));
    if (ic_image_size(dst) < ic_image_size(src))
        return ic_error_value(err, "the destination (%llu bytes) is smaller than the source "
                              "(%llu bytes)", (unsigned long long)ic_image_size(dst),
                              (unsigned long long)ic_image_size(src));
    struct ic_copy *c = calloc(1, sizeof *c);
    if (!c)
        return ic_error_nomem(err);
    c->src = src;
    c->dst = dst;
    c->opt = *opt;
    c->write_align = ic_image_write_alignment(dst);
    if (c->write_align > 1) {
        /* whole units only: a hole is a unit of zeros, nothing less */
        if (c->opt.request_size % c->write_align)
            c->opt.request_size = (c->opt.request_size / c->write_align + 1) * c->write_align;
        if (c->opt.sparse_threshold)
            c->opt.sparse_threshold = c->write_align;
    }
    c->granularity = zero_granularity(c->opt.sparse_threshold);
    /* blocks tile the requests, so that none straddles two work items and
     * the output never depends on the request size */
    if (c->opt.request_size % c->granularity)
        c->opt.request_size = (c->opt.request_size / c->granularity + 1) * c->granularity;
    c->qcap = 4 * (size_t)opt->concurrency;
    c->queue = calloc(c->qcap, sizeof *c->queue);
    c->workers = calloc(opt->concurrency, sizeof *c->workers);
    if (opt->sparse_threshold == 0)
        c->zeros = calloc(1, c->opt.request_size);
    if (pthread_mutex_init(&c->lock, NULL)) {
        free(c->queue);
        free(c->workers);
        free(c->zeros);
        free(c);
        return ic_error_nomem(err);
    }
    pthread_cond_init(&c->changed, NULL);
    if (!c->queue || !c->workers || (opt->sparse_threshold == 0 && !c->zeros)) {
        free_copy(c);
        return ic_error_nomem(err);
    }
    atomic_init(&c->offload_refused, 0);
    c->ordered_place = ic_image_places_in_order(dst);
    c->dst_overlay = ic_image_has_backing_file(dst);
    if (c->dst_overlay)
        c->backing_end = ic_image_qemu_length(ic_image_backing(dst));

    /* the planner counts as one live thread from the start, so that no
     * worker can see the copy complete before it is fully started */
    c->live_threads = 1;
    for (unsigned i = 0; i < opt->concurrency; i++) {
        struct worker *w = new_worker(c);
        int e = w ? 0 : ENOMEM;
        pthread_mutex_lock(&c->lock);
        c->live_threads++;
        pthread_mutex_unlock(&c->lock);
        if (w)
            e = pthread_create(&c->workers[i], NULL, worker_main, w);
        if (e) {
            if (w) {
                free(w->buf);
                free(w->scratch);
                free(w->acts);
                free(w->staged);
                free(w);
            }
            pthread_mutex_lock(&c->lock);
            c->live_threads--;
            pthread_mutex_unlock(&c->lock);
            struct ic_error e2 = {0};
            ic_error_os(&e2, e, NULL, "start worker thread");
            fail(c, &e2);
            break;
        }
        c->nthreads++;
    }
    int e = pthread_create(&c->planner, NULL, planner_main, c);
    if (e) {
        struct ic_error e2 = {0};
        ic_error_os(&e2, e, NULL, "start planner thread");
        fail(c, &e2);
        pthread_mutex_lock(&c->lock);
        c->planner_done = 1;
        pthread_mutex_unlock(&c->lock);
        thread_exit(c); /* the planner's share */
    } else {
        c->planner_started = 1;
    }
    *out = c;
    return 0;
}

int ic_copy_wait(struct ic_copy *c, unsigned timeout_ms)
{
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += timeout_ms / 1000;
    deadline.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec++;
        deadline.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&c->lock);
    while (!c->complete) {
        if (pthread_cond_timedwait(&c->changed, &c->lock, &deadline) == ETIMEDOUT)
            break;
    }
    int done = c->complete;
    pthread_mutex_unlock(&c->lock);
    return done;
}

void ic_copy_progress(struct ic_copy *c, struct ic_copy_stats *out)
{
    out->bytes_read = atomic_load(&c->bytes_read);
    out->bytes_written = atomic_load(&c->bytes_written);
    out->bytes_zeroed = atomic_load(&c->bytes_zeroed);
    out->bytes_skipped = atomic_load(&c->bytes_skipped);
    out->read_requests = atomic_load(&c->read_requests);
    out->write_requests = atomic_load(&c->write_requests);
    out->zero_requests = atomic_load(&c->zero_requests);
    out->extents = atomic_load(&c->extents);
    out->done = atomic_load(&c->done);
    out->total = ic_image_size(c->src);
}

void ic_copy_cancel(struct ic_copy *c)
{
    pthread_mutex_lock(&c->lock);
    if (!c->complete)
        c->cancelled = 1;
    pthread_cond_broadcast(&c->changed);
    pthread_mutex_unlock(&c->lock);
}

int ic_copy_finish(struct ic_copy *c, struct ic_copy_stats *out, struct ic_error *err)
{
    for (unsigned i = 0; i < c->nthreads; i++)
        pthread_join(c->workers[i], NULL);
    if (c->planner_started)
        pthread_join(c->planner, NULL);
    if (out)
        ic_copy_progress(c, out);
    int ret = 0;
    if (c->opt.log && c->opt.log->failed && !c->failed) {
        ic_error_nomem(&c->error);
        c->failed = 1;
    }
    if (c->failed) {
        if (err)
            *err = c->error;
        ret = -1;
    } else if (c->cancelled) {
        ic_error_os(err, ECANCELED, NULL, "copy cancelled");
        ret = -1;
    }
    free_copy(c);
    return ret;
}
