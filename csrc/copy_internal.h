/* The copy engine's shared state: copy.c runs the copy as a job (job.c),
 * copy_item.c each work item (copy_worker.h), planner.c cuts the source
 * into work items. */
#ifndef IMGCOPY_COPY_INTERNAL_H
#define IMGCOPY_COPY_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "blkhash.h"
#include "image.h"
#include "job.h"

/* What a source run asks of the destination. */
enum {
    RUN_ZERO = 0,    /* reads as zeros: zero or skip it                  */
    RUN_DATA = 1,    /* read it, find its zero runs, write the rest      */
    RUN_BACKING = 2, /* the destination's backing file holds it: skip it */
};

/* Runs one item may cover (planner.c): data runs whose host bytes are not
 * contiguous (a fragmented qcow2: 32 clusters of 64 KiB fill a 2 MiB
 * request, which the format reads at once), a costly source's short
 * holes, read through rather than asked around (a serialising server's
 * 16 MiB requests hold a hundred runs of a busy disk), and the runs of a
 * parallel source, read apart */
#define ITEM_PARTS 128

struct work_item {
    uint64_t start, end;         /* guest range of this item            */
    uint64_t ext_start, ext_end; /* the source extent it belongs to     */
    uint64_t seq;                /* guest order, for in-order writes    */
    int kind;                    /* RUN_*                               */
    /* RUN_DATA read in one request across several whole source runs:
     * each part ends where the next begins (the first at `start`);
     * data parts are cut as extents of their own, zero parts are holes.
     * 0: one run, [start, end) of the extent [ext_start, ext_end). */
    unsigned nparts;
    struct {
        uint32_t end; /* from `start` (an item is at most 1 GiB long) */
        uint32_t data;
    } parts[ITEM_PARTS];
};

/* known_zeros.c: the destination's zero ranges before the copy wrote */
struct ic_known_zeros {
    struct ic_extent_list runs; /* sorted, disjoint, neighbours merged */
};
int ic_known_zeros_init(struct ic_known_zeros *z, struct ic_image *dst, uint64_t end);
int ic_known_zeros_cover(const struct ic_known_zeros *z, uint64_t off, uint64_t len);
void ic_known_zeros_free(struct ic_known_zeros *z);

struct worker;
struct parked;

struct ic_copy {
    struct ic_image *src, *dst;
    struct ic_known_zeros dst_zeros; /* ranges that need no zero request */
    struct ic_copy_options opt;
    uint64_t write_align; /* the destination writes whole units of this */
    uint64_t zero_limit;  /* the longest zero request the destination takes */
    /* fully allocated output: zero requests keep ranges allocated (else
     * zeros are written as data, from `zeros`: request_size bytes) */
    int zero_allocates;
    uint8_t *zeros;

    struct ic_job *job;       /* job.c runs the planner and the items */
    struct worker **workers;  /* per slot: buffers, staged writes */
    unsigned nworkers;
    int aio_reads, aio_writes; /* the source reads, the destination writes asynchronously */
    int may_merge;      /* neighbouring runs may share a read; holes */
    uint64_t merge_gap; /* up to this long join a read (0: none; the planner's) */
    /* items carry several runs, a shared read's data parts go out as
     * reads of their own and its holes are not read: a source that answers
     * requests in parallel (where a request costs little and every byte
     * read costs the CPU), or any but a serialising one into a destination
     * that writes asynchronously (the items in flight then bound the
     * writes in flight, not the runs' count).  Else the holes are read
     * through, one request for the whole item. */
    int read_parts;
    /* read_parts: holes up to this long are read through (the planner's,
     * read by the workers as each item's reads go out) */
    atomic_uint_fast64_t read_through;
    /* what to copy: the changed ranges (sorted, merged, whole units of the
     * destination's writes), or, has_spans 0, the whole source */
    struct ic_range *spans;
    size_t nspans;
    int has_spans;
    uint64_t bytes_changed;
    uint64_t compare; /* compare mode: the block; 0: off */

    /* turns: steps that follow guest order across items (copy.c); an
     * item whose turn has not come parks (by turn seq % turn_slots) and
     * is resumed when it comes */
    pthread_mutex_t turn_lock;
    struct parked *parked[2]; /* per turn */
    size_t turn_slots;
    uint64_t next_write_seq; /* in-order writes */
    uint64_t next_place_seq; /* host allocation in guest order */
    int stopping;            /* the job stopped: nobody waits for a turn */
    int ordered_place;
    int dst_overlay; /* the destination reads what it lacks from a backing file */
    uint64_t backing_end; /* overlay: where that file ends (qemu's length) */

    struct ic_blkhash *hash; /* the source's checksum, if asked for */
    struct ic_checkpoint *checkpoint; /* a journalled copy's */
    int shard_hash;          /* of one range's blocks only: no whole checksum */

    atomic_int offload_refused;
    atomic_uint_fast64_t bytes_read, bytes_written, bytes_zeroed, bytes_skipped;
    atomic_uint_fast64_t bytes_already_zero; /* skipped: the destination read zeros */
    atomic_uint_fast64_t read_requests, write_requests, zero_requests;
    atomic_uint_fast64_t extents;
    atomic_uint_fast64_t bytes_compared, bytes_equal;
};

/* copy_checkpoint.c: a journalled copy's checkpoints.  Items tell what
 * they finished, the hash (through the sink) its block digests; each
 * checkpoint (the job's tick, and once more at the end) makes the
 * destination durable, then records in the journal what was finished
 * before it began.  every_bytes: ask for a tick once that much more is
 * finished (0: by time only; the job set later, before any item runs). */
struct ic_checkpoint;
struct ic_journal;
int ic_checkpoint_new(struct ic_image *dst, struct ic_journal *journal, uint64_t every_bytes,
                      struct ic_checkpoint **out, struct ic_error *err);
void ic_checkpoint_set_job(struct ic_checkpoint *k, struct ic_job *job);
void ic_checkpoint_done(struct ic_checkpoint *k, uint64_t off, uint64_t len);
ic_blkhash_sink_fn ic_checkpoint_sink;
int ic_checkpoint_run(struct ic_checkpoint *k, struct ic_error *err);
void ic_checkpoint_free(struct ic_checkpoint *k);
/* A resumed copy's checksum: the journal's recorded blocks handed in */
int ic_checkpoint_preset(struct ic_journal *journal, struct ic_blkhash *hash,
                         struct ic_error *err);

/* planner.c: the job's planner */
int ic_copy_plan(struct ic_job *job, void *copy, struct ic_error *err);

#endif
