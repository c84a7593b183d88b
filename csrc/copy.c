/* The copy engine: one planner thread walks the source's extents in guest
 * order and cuts them into work items; N workers read, find zero runs
 * (sparse.c) and write, zero or skip.  Every destination byte is touched
 * at most once.  Steps that must follow guest order (host allocation in
 * formats that allocate in guest order, the writes of an in-order copy)
 * are turns that each item takes and passes in sequence.  This file:
 * the copy's life cycle (options, workers, start, finish); copy_item.c
 * takes each item through its steps. */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "blkhash.h"
#include "copy_worker.h"
#include "journal.h"
#include "request_log.h"
#include "sparse.h"

#define LOOKAROUND_CHUNK (1u << 20)
/* Buffers of items in flight to a remote endpoint (nbdcopy: 64 requests
 * of 256 KiB on each of 4 connections) */
#define COPY_BYTES_IN_FLIGHT (64ull << 20)
#define BUFFER_ALIGN 4096u

static void free_worker(struct worker *w)
{
    free(w->buf);
    free(w->dbuf);
    free(w->sparse.scratch);
    free(w->acts);
    free(w->staged);
    free(w);
}

/* ---- stopping ---------------------------------------------------------- */

/* A cancelled copy waits for nothing in flight: requests to a slow remote
 * endpoint fail at once (its connections shut down), so that the items,
 * the planner and closing the images return within moments.  A failed
 * one lets what is in flight be answered: a server whose client hangs up
 * on replies it owes may die of it (nbdkit before 1.33.10 asserts). */
static void interrupt_copy(void *ctx)
{
    struct ic_copy *c = ctx;
    ic_copy_interrupt_turns(c);
    if (ic_job_cancelled(c->job)) {
        ic_image_abort(c->src);
        ic_image_abort(c->dst);
    }
}

/* qemu sees a file that does not end on a 512-byte boundary as that much
 * longer, reading zeros there, and makes its copy that long: in an
 * overlay those bytes would read its backing file's (the rest of the last
 * cluster comes from there), so they are zeroed, as qemu-img -B's copy of
 * them is.  Any other destination's bytes past the source are left as
 * they are.  Not for a copy of some ranges only (a shard, changed ranges)
 * nor compare mode (which leaves what it finds alone). */
static int zero_past_source(struct ic_copy *c, struct ic_error *err)
{
    uint64_t end = ic_image_size(c->src), qemu_end = ic_image_qemu_length(c->src);
    uint64_t dst_size = ic_image_size(c->dst);
    if (qemu_end > dst_size)
        qemu_end = dst_size;
    if (qemu_end <= end || !c->dst_overlay || c->has_spans || c->compare)
        return 0;
    return ic_image_zero(c->dst, end, qemu_end - end, 0, err);
}

/* Every item done: make the destination durable (a journalled copy's
 * last checkpoint does, and records all of it). */
static int complete_copy(void *ctx, struct ic_error *err)
{
    struct ic_copy *c = ctx;
    if (zero_past_source(c, err) < 0)
        return -1;
    if (c->checkpoint)
        return ic_checkpoint_run(c->checkpoint, err);
    return c->opt.flush ? ic_image_flush(c->dst, err) : 0;
}

static int checkpoint_tick(void *ctx, struct ic_error *err)
{
    struct ic_copy *c = ctx;
    return ic_checkpoint_run(c->checkpoint, err);
}

static const struct ic_job_ops copy_ops = {
    .item_size = sizeof(struct work_item),
    .plan = ic_copy_plan,
    .run = ic_copy_run_item,
    .resume = ic_copy_resume_item,
    .item_cost = ic_copy_item_cost,
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
                                   .scratch_size = scratch_size, .read = ic_copy_read_for_sparse,
                                   .ctx = w};
    /* at most a data run and a hole per block (windows cut some); an
     * item of parts splits each part apart, and a part's edges may cut a
     * block (parts of 512 B in turn zeros and data: a piece each, more
     * than the request's blocks) */
    w->cap = (size_t)(c->opt.request_size / g) * 2 + 4 + 2 * ITEM_PARTS;
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
    if (n) /* changed=[]: opt.changed may be NULL */
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
    *out = (struct ic_copy_facts){
        .src_serial_cost = ic_image_request_cost(src),
        .dst_preferred = ic_image_preferred_size(dst),
        .dst_write_align = ic_image_write_alignment(dst),
        .dst_places_in_order = ic_image_places_in_order(dst),
        .dst_fresh = ic_image_fresh(dst),
        .dst_discards = strcmp(ic_image_format(dst), "null") == 0,
    };
    if (!ic_image_serialises(src)) /* asked after the cost, which measures it */
        out->src_serial_cost = 0;
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
    /* neighbouring runs may share one read: data runs whose host bytes
     * break (a fragmented qcow2's clusters, read together by the format),
     * and holes a round trip is worth (the planner asks what one costs
     * once it has made one); not into whole clusters, nor for an overlay,
     * whose runs are cut by layer */
    c->may_merge = c->write_align == 1 && !ic_image_has_backing_file(dst);
    c->read_parts = (c->aio_reads || c->aio_writes) && !ic_image_serialises(src);
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
