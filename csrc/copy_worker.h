/* A copy worker's state for the item it runs: copy.c makes one per job
 * slot, copy_item.c takes an item through its steps on it. */
#ifndef IMGCOPY_COPY_WORKER_H
#define IMGCOPY_COPY_WORKER_H

#include <stdatomic.h>
#include <stdint.h>

#include "copy_internal.h"
#include "sparse.h"

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
    uint64_t parts_read;   /* bytes of the item's parts read apart (counted once in) */
    unsigned parts_reads;
    atomic_int aio_failed; /* one of them failed: */
    struct ic_error aio_err;
};

/* copy_item.c: the job's item handlers (struct ic_job_ops) */
int ic_copy_run_item(void *ctx, unsigned slot, void *item, struct ic_error *err);
int ic_copy_resume_item(void *ctx, unsigned slot, void *item, struct ic_error *err);
uint64_t ic_copy_item_cost(void *ctx, const void *item);
/* A worker's look-around reads (struct ic_sparse's `read`; ctx: the worker) */
int ic_copy_read_for_sparse(void *ctx, void *buf, uint64_t off, uint64_t len);
/* The job stopped (failed or cancelled): nobody takes a turn any more,
 * and every parked item is resumed, to end. */
void ic_copy_interrupt_turns(struct ic_copy *c);

#endif
