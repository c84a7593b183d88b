/* The planner: one thread walks the source's extents in guest order and
 * cuts them into work items for the job's workers (copy.c): data to read, zeros
 * to write or skip, ranges an overlay's backing file holds. */
#include <stdlib.h>

#include "copy_internal.h"
#include "sparse.h"

/* Where a data item starting at `pos` ends: as qemu-img reads, at the
 * edges of the zero scan's windows (IC_SPARSE_WINDOW from the extent's
 * start), as many windows as one step holds; a step shorter than a window
 * cuts it at multiples of the step (block edges: request_size is a
 * multiple of the scan's block). */
static uint64_t data_cut(uint64_t start, uint64_t pos, uint64_t step)
{
    uint64_t edge = start + (pos + step - start) / IC_SPARSE_WINDOW * IC_SPARSE_WINDOW;
    if (edge > pos)
        return edge;
    uint64_t next = (pos / step + 1) * step;
    uint64_t window_end = start + ((pos - start) / IC_SPARSE_WINDOW + 1) * IC_SPARSE_WINDOW;
    return next < window_end ? next : window_end;
}

/* Cut one extent into items of at most the step; a data extent is first
 * cut where qemu's block-status answers end (unless the destination
 * writes whole clusters: compression). */
static int plan_extent(struct ic_copy *c, uint64_t start, uint64_t end, int kind, uint64_t *seq)
{
    if (kind == RUN_DATA && end - start > IC_SPARSE_STATUS_MAX && c->write_align == 1) {
        for (uint64_t pos = start; pos < end; pos += IC_SPARSE_STATUS_MAX)
            if (plan_extent(c, pos, end - pos > IC_SPARSE_STATUS_MAX ? pos + IC_SPARSE_STATUS_MAX : end, kind,
                            seq) < 0)
                return -1;
        return 0;
    }
    /* fully allocated zeros: zero requests, or zeros written as data */
    int allocated = kind == RUN_ZERO && c->opt.sparse_threshold == 0;
    int written_zeros = allocated && !c->zero_allocates;
    int skipped = kind == RUN_BACKING || (kind == RUN_ZERO && !allocated &&
                                          c->opt.target_is_zero);
    /* a skipped range costs nothing, however long: one item */
    /* compare mode reads the destination's bytes of a zero run too */
    uint64_t step = kind == RUN_DATA || written_zeros || c->compare ? c->opt.request_size
                    : skipped                         ? UINT64_MAX
                                                      : c->zero_limit;
    for (uint64_t pos = start; pos < end;) {
        uint64_t next = kind == RUN_DATA ? data_cut(start, pos, step) : (pos / step + 1) * step;
        if (next > end || next <= pos)
            next = end;
        struct work_item item = {
            .start = pos, .end = next, .ext_start = start, .ext_end = end,
            .seq = (*seq)++, .kind = kind,
        };
        if (ic_job_push(c->job, &item) < 0)
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

/* Neighbouring runs share one read of at most request_size, each data run
 * cut from the others as its own extent: data runs next to each other
 * (their host bytes break: a fragmented qcow2's clusters, which the format
 * then reads all at once rather than one per item), and, from a costly
 * source, the holes between them no longer than the gap a round trip is
 * worth, read through rather than asked around; what does not fit is
 * planned as it is. */
struct merger {
    struct ic_copy *c;
    uint64_t start;  /* of the group */
    unsigned nparts; /* 0: no group */
    unsigned ndata;  /* parts up to the last data part */
    struct {
        uint64_t start, end;
        int data;
    } parts[ITEM_PARTS];
};

static int flush_group(struct merger *m, uint64_t *seq)
{
    struct ic_copy *c = m->c;
    unsigned n = m->nparts, ndata = m->ndata;
    m->nparts = m->ndata = 0;
    if (n == 0)
        return 0;
    int r = 0;
    if (ndata == 1) {
        r = plan_extent(c, m->parts[0].start, m->parts[0].end, RUN_DATA, seq);
    } else {
        struct work_item item = {
            .start = m->parts[0].start, .end = m->parts[ndata - 1].end,
            .seq = (*seq)++, .kind = RUN_DATA, .nparts = ndata,
        };
        item.ext_start = item.start;
        item.ext_end = item.end;
        for (unsigned i = 0; i < ndata; i++) {
            item.parts[i].end = (uint32_t)(m->parts[i].end - item.start);
            item.parts[i].data = (uint32_t)m->parts[i].data;
        }
        r = ic_job_push(c->job, &item);
    }
    /* the holes after the last data run were read for nothing */
    for (unsigned i = ndata; i < n && r == 0; i++)
        r = plan_extent(c, m->parts[i].start, m->parts[i].end, RUN_ZERO, seq);
    return r;
}

static int merge_run(struct merger *m, uint64_t start, uint64_t end, int kind, uint64_t *seq)
{
    struct ic_copy *c = m->c;
    uint64_t limit = c->opt.request_size;
    int joins = m->nparts > 0 && m->nparts < ITEM_PARTS && end - m->start <= limit &&
                (kind == RUN_DATA || (kind == RUN_ZERO && end - start <= c->merge_gap));
    if (!joins) {
        if (flush_group(m, seq) < 0)
            return -1;
        if (kind != RUN_DATA || end - start > limit / 2)
            return plan_extent(c, start, end, kind, seq);
        m->start = start;
    }
    m->parts[m->nparts].start = start;
    m->parts[m->nparts].end = end;
    m->parts[m->nparts].data = kind == RUN_DATA;
    m->nparts++;
    if (kind == RUN_DATA)
        m->ndata = m->nparts;
    return 0;
}

/* Source runs become items; with a destination that writes whole
 * clusters (compression), a zero run keeps only its cluster-aligned inside
 * and its ragged edges join the data around it (they read as zeros). */
struct aligner {
    struct ic_copy *c;
    uint64_t align, size, seq;
    uint64_t data_start, data_end; /* pending data run, not yet planned */
    int have_data;
    struct merger merge;
};

/* A run as it is, or into a read through holes */
static int plan_run(struct aligner *a, uint64_t start, uint64_t end, int kind)
{
    if (!a->c->may_merge)
        return plan_extent(a->c, start, end, kind, &a->seq);
    return merge_run(&a->merge, start, end, kind, &a->seq);
}

static int flush_data(struct aligner *a)
{
    int r = 0;
    if (a->have_data && a->data_end > a->data_start)
        r = plan_run(a, a->data_start, a->data_end, RUN_DATA);
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
    if (flush_data(a) < 0 || plan_run(a, zs, ze, kind) < 0)
        return -1;
    if (end > ze)
        add_data(a, ze, end);
    return 0;
}

/* Plan [start, end) of the source: its runs, each ended at `end`.  0, or
 * -1 with err; 1 when the job stopped. */
static int plan_span(struct ic_job *job, struct ic_copy *c, struct aligner *al, uint64_t start,
                     uint64_t end, struct ic_error *err)
{
    uint64_t run_start = start, pos = start;
    int run_kind_now = -1;
    /* neighbours of one kind are one extent: the cache may answer a long
     * extent in pieces, and zero runs at extent edges are judged by it.
     * An overlay's runs also end where its backing file ends, as qemu-img
     * -B cuts them there. */
    uint64_t cut = c->dst_overlay ? c->backing_end : UINT64_MAX;
    uint64_t host_next = UINT64_MAX; /* where a data run's host bytes continue */
    while (pos < end) {
        if (ic_job_stopped(job))
            return 1;
        struct ic_extent e;
        if (ic_image_block_status(c->src, pos, end - pos, &e, err) < 0)
            return -1;
        if (c->may_merge) {
            /* what a round trip costs is known once one was made, and
             * better with every answer (the shortest seen: one slowed by a
             * busy machine must not price the whole copy), so it is asked
             * again as the plan goes */
            uint64_t cost = ic_image_request_cost(c->src);
            atomic_store_explicit(&c->read_through, cost, memory_order_relaxed);
            /* holes left unread cost nothing: any joins, and the items
             * in flight each carry several runs */
            if (c->read_parts)
                cost = c->opt.request_size;
            c->merge_gap = cost < c->opt.request_size / 2 ? cost : c->opt.request_size / 2;
        }
        uint64_t len = pos < cut && e.length > cut - pos ? cut - pos : e.length;
        if (len > end - pos)
            len = end - pos;
        int kind = run_kind(c, &e, pos);
        /* qemu's data extents also end where the host bytes stop being
         * contiguous (another cluster run, another layer, a compressed
         * cluster): its zero runs are judged from there */
        int host_break = kind == RUN_DATA && c->write_align == 1 &&
                         (!(e.flags & IC_EXT_OFFSET_VALID) || e.host_offset != host_next);
        /* a destination that writes whole clusters (compression) takes a
         * cut inside a cluster as a run's end only: the data around it is
         * one write, as qemu-img writes the cluster whole */
        int at_cut = pos == cut;
        int flush_at_cut = at_cut && (c->write_align == 1 || cut % c->write_align == 0);
        if (run_kind_now >= 0 && (kind != run_kind_now || at_cut || host_break)) {
            if (add_run(al, run_start, pos, run_kind_now) < 0 ||
                ((flush_at_cut || host_break) && flush_data(al) < 0))
                return 1; /* the job stopped: nothing more is taken */
            run_start = pos;
        }
        host_next = (e.flags & IC_EXT_OFFSET_VALID) ? e.host_offset + len : UINT64_MAX;
        run_kind_now = kind;
        pos += len;
    }
    /* nothing is read or written across the span's end: what lies between
     * spans is not to be touched */
    if (run_kind_now >= 0 && (add_run(al, run_start, end, run_kind_now) < 0 ||
                              flush_data(al) < 0 || flush_group(&al->merge, &al->seq) < 0))
        return 1;
    return 0;
}

int ic_copy_plan(struct ic_job *job, void *ctx, struct ic_error *err)
{
    struct ic_copy *c = ctx;
    uint64_t size = ic_image_size(c->src);
    struct aligner al = {.c = c, .align = c->write_align, .size = size, .merge = {.c = c}};
    if (!c->has_spans)
        return plan_span(job, c, &al, 0, size, err) < 0 ? -1 : 0;
    for (size_t i = 0; i < c->nspans; i++) {
        int r = plan_span(job, c, &al, c->spans[i].offset,
                          c->spans[i].offset + c->spans[i].length, err);
        if (r)
            return r < 0 ? -1 : 0;
    }
    return 0;
}
