/* Block status of an NBD export: base:allocation (hole, zero) and
 * qemu:allocation-depth (where in the server's backing chain), merged into
 * extents.
 *
 * A server may answer less than was asked (nbdkit's blocksize filter cuts
 * answers at maxlen; VDDK's queries are bounded): a walk of the disk would
 * then cost a round trip per answer, one after another, and stall the copy
 * behind it.  Once an answer comes back short, the next ranges of the same
 * length are asked ahead, STATUS_AHEAD queries in flight, and the walk
 * takes their answers as it reaches them. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "nbd_state.h"

/* As qemu reports a protocol's extents: the host offset is the guest's */
static int push(struct ic_extent_list *out, uint64_t start, uint64_t len, unsigned flags,
                uint32_t depth, struct ic_error *err)
{
    struct ic_extent e = {.start = start, .length = len, .flags = flags | IC_EXT_OFFSET_VALID,
                          .host_offset = start, .depth = depth};
    return ic_extent_list_push(out, &e) < 0 ? ic_error_nomem(err) : 0;
}

/* qemu:allocation-depth says where in the server's backing chain a range
 * is allocated (n: the n-th image, 0: nowhere).  Without it, everything is
 * the export's own, as for a file. */
static unsigned chain_flags(int known, uint32_t depth)
{
    return !known || depth > 0 ? IC_EXT_PRESENT : 0;
}

/* A range allocated nowhere has the depth of the chain's last image, as
 * qemu-img map of the image says; the export does not tell its chain's
 * length, so the deepest allocation seen stands for it. */
static uint32_t chain_depth(struct nbd_state *st, int known, uint32_t depth)
{
    if (!known)
        return 0;
    if (depth > 0) {
        uint32_t seen = atomic_load(&st->deepest);
        while (depth > seen && !atomic_compare_exchange_weak(&st->deepest, &seen, depth))
            ;
        return depth - 1;
    }
    uint32_t deepest = atomic_load(&st->deepest);
    return deepest > 0 ? deepest - 1 : 0;
}

/* The answer to query `r` as extents from r->off: how far it goes, or 0
 * (with err) when memory runs out.  A failed or empty answer degrades to
 * "data", as nbdcopy does. */
static uint64_t parse_answer(struct nbd_state *st, const struct nbd_request *r,
                             struct ic_extent_list *out, struct ic_error *err)
{
    uint64_t start = r->off, limit = r->off + r->len;
    if (r->error || (!r->nalloc && !r->ndepth))
        return push(out, start, r->len, IC_EXT_DATA | IC_EXT_PRESENT, 0, err) < 0 ? 0 : limit;
    uint64_t pos = start;
    size_t ia = 0, id = 0;
    uint64_t a_end = start, d_end = start;
    uint32_t a_flags = 0, depth = 1;
    while (pos < limit) {
        if (r->nalloc && pos >= a_end) {
            if (ia >= r->nalloc)
                break;
            a_end = pos + r->alloc[ia];
            a_flags = r->alloc[ia + 1];
            ia += 2;
        }
        if (r->ndepth && pos >= d_end) {
            if (id >= r->ndepth)
                break;
            d_end = pos + r->depth[id];
            depth = r->depth[id + 1];
            id += 2;
        }
        uint64_t next = limit;
        if (r->nalloc && a_end < next)
            next = a_end;
        if (r->ndepth && d_end < next)
            next = d_end;
        if (next <= pos)
            break; /* a zero-length entry: a broken answer, stop here */
        unsigned flags = 0;
        if (!r->nalloc || !(a_flags & NBD_STATE_HOLE))
            flags |= IC_EXT_DATA;
        if (r->nalloc && (a_flags & NBD_STATE_ZERO))
            flags |= IC_EXT_ZERO;
        if (push(out, pos, next - pos, flags | chain_flags(r->ndepth != 0, depth),
                 chain_depth(st, r->ndepth != 0, depth), err) < 0)
            return 0;
        pos = next;
    }
    if (pos == start) /* nothing usable */
        return push(out, start, r->len, IC_EXT_DATA | IC_EXT_PRESENT, 0, err) < 0 ? 0 : limit;
    return pos;
}

static void reset_query(struct nbd_request *r)
{
    free(r->alloc);
    free(r->depth);
    memset(r, 0, sizeof *r);
}

/* ---- queries ahead ------------------------------------------------------ */

/* A lane goes on asking while it holds fewer answers than this */
#define LANE_MAX_EXTENTS 4096u
/* A lane's region: this many answers of the length that came back short */
#define LANE_ANSWERS 16u

static void lane_ask(struct nbd_state *st, struct status_lane *l)
{
    uint64_t len = l->end - l->next < NBD_MAX_STATUS ? l->end - l->next : NBD_MAX_STATUS;
    l->query = (struct nbd_request){.op = OP_STATUS, .off = l->next, .len = len};
    l->sent = 1;
    nbd_submit_waited(st, &l->query, NULL); /* aborted: answered "cancelled" */
}

static void lane_free(struct status_lane *l)
{
    reset_query(&l->query);
    ic_extent_list_free(&l->answer);
    memset(l, 0, sizeof *l);
}

/* Take in a lane's answer (waiting for it if `wait`), then ask on: 0, or
 * -1 when memory runs out. */
static int lane_pump(struct nbd_state *st, struct status_lane *l, int wait,
                     struct ic_error *err)
{
    if (!l->sent)
        return 0;
    if (wait)
        nbd_wait(st, &l->query);
    pthread_mutex_lock(&st->lock);
    int done = l->query.done;
    pthread_mutex_unlock(&st->lock);
    if (!done)
        return 0;
    if (l->answer.count == 0)
        l->from = l->to = l->query.off;
    uint64_t got = parse_answer(st, &l->query, &l->answer, err);
    reset_query(&l->query);
    l->sent = 0;
    if (got == 0)
        return -1;
    l->to = l->next = got;
    if (l->next < l->end && l->answer.count < LANE_MAX_EXTENTS)
        lane_ask(st, l);
    return 0;
}

/* Lanes for the regions after `from`, up to `end`, as many as are free
 * (a lane is free once its region was asked and taken). */
static void start_lanes(struct nbd_state *st, uint64_t from, uint64_t end)
{
    struct nbd_status_ahead *a = &st->ahead;
    uint64_t next = from;
    for (unsigned i = 0; i < STATUS_LANES; i++) {
        const struct status_lane *l = &a->lanes[i];
        if ((l->sent || l->answer.count || l->next < l->end) && l->end > next)
            next = l->end;
    }
    for (unsigned i = 0; i < STATUS_LANES && next < end; i++) {
        struct status_lane *l = &a->lanes[i];
        if (l->sent || l->answer.count || l->next < l->end)
            continue;
        l->next = l->from = l->to = next;
        l->end = end - next < a->region ? end : next + a->region;
        lane_ask(st, l);
        next = l->end;
    }
}

/* The lane whose answers hold `start`, or whose question in flight does
 * (its answer waited for), or NULL */
static struct status_lane *lane_at(struct nbd_state *st, uint64_t start, struct ic_error *err,
                                   int *failed)
{
    for (unsigned i = 0; i < STATUS_LANES; i++) {
        struct status_lane *l = &st->ahead.lanes[i];
        if (lane_pump(st, l, 0, err) < 0) {
            *failed = 1;
            return NULL;
        }
    }
    for (unsigned i = 0; i < STATUS_LANES; i++) {
        struct status_lane *l = &st->ahead.lanes[i];
        if (l->answer.count && start >= l->from && start < l->to)
            return l;
        if (l->sent && start >= l->query.off && start < l->query.off + l->query.len &&
            start >= l->to) {
            if (lane_pump(st, l, 1, err) < 0) {
                *failed = 1;
                return NULL;
            }
            if (l->answer.count && start >= l->from && start < l->to)
                return l;
        }
    }
    return NULL;
}

/* Answers before `pos` are in the cache now: the lane lets them go. */
static void lane_consumed(struct status_lane *l, uint64_t pos)
{
    size_t k = 0;
    while (k < l->answer.count && l->answer.items[k].start + l->answer.items[k].length <= pos)
        k++;
    if (k) {
        memmove(l->answer.items, l->answer.items + k,
                (l->answer.count - k) * sizeof *l->answer.items);
        l->answer.count -= k;
        l->from = l->answer.count ? l->answer.items[0].start : l->to;
    }
}

void nbd_status_free(struct nbd_state *st)
{
    for (unsigned i = 0; i < STATUS_LANES; i++)
        lane_free(&st->ahead.lanes[i]);
}

/* ---- the driver's block status ------------------------------------------ */

/* The extents from `start` an answer in a window holds, clipped to `end`:
 * how far they go (start: none there) */
static uint64_t take_answer(const struct ic_extent_list *answer, uint64_t start, uint64_t end,
                            struct ic_extent_list *out, struct ic_error *err, int *failed)
{
    uint64_t pos = start;
    for (size_t i = 0; i < answer->count && pos < end; i++) {
        struct ic_extent e = answer->items[i];
        uint64_t e_end = e.start + e.length;
        if (e_end <= pos)
            continue;
        if (e.start > pos)
            break;
        uint64_t stop = e_end < end ? e_end : end;
        e.host_offset += pos - e.start;
        e.start = pos;
        e.length = stop - pos;
        if (ic_extent_list_push(out, &e) < 0) {
            *failed = ic_error_nomem(err);
            return start;
        }
        pos = stop;
    }
    return pos;
}

int nbd_block_status(struct ic_image *img, uint64_t start, uint64_t end, uint64_t want,
                     struct ic_extent_list *out, struct ic_error *err)
{
    (void)want;
    struct nbd_state *st = nbd_state_of(img);
    if (!st->has_alloc && !st->has_depth)
        return push(out, start, end - start, IC_EXT_DATA | IC_EXT_PRESENT, 0, err);
    int failed = 0;
    struct status_lane *l = lane_at(st, start, err, &failed);
    if (failed)
        return -1;
    if (l) {
        uint64_t got = take_answer(&l->answer, start, end, out, err, &failed);
        if (failed)
            return -1;
        lane_consumed(l, got);
        if (l->answer.count == 0 && !l->sent && l->next < l->end && lane_pump(st, l, 0, err))
            return -1;
        if (l->answer.count == 0 && !l->sent && l->next < l->end)
            lane_ask(st, l); /* it had stopped, full */
        start_lanes(st, got, end);
        if (got > start)
            return 0;
    }
    uint64_t len = end - start < NBD_MAX_STATUS ? end - start : NBD_MAX_STATUS;
    struct nbd_request r = {.op = OP_STATUS, .off = start, .len = len};
    (void)nbd_run_waited(st, &r, NULL); /* a failed answer degrades to "data" */
    uint64_t got = parse_answer(st, &r, out, err);
    int answered = !r.error;
    reset_query(&r);
    if (got == 0)
        return -1;
    /* an answer shorter than asked: more will be; lanes walk the regions
     * after it meanwhile */
    if (got < start + len && answered && !st->ahead.region)
        st->ahead.region = (got - start) * LANE_ANSWERS;
    if (st->ahead.region)
        start_lanes(st, got, end);
    return 0;
}
