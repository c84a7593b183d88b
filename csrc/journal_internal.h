/* The journal's parts (format and rules in journal.h), each depending only
 * on the ones listed before it:
 *   journal_index.c   what is recorded, in memory: the done ranges, the
 *                     digests and the runs of blocks, their lookups, and
 *                     the record that waits for the next sync
 *   journal_format.c  the bytes of the file: the header and a record
 *                     encoded, and a file read back, checked as hostile
 *   journal.c         the file's life: open (create, lock, resume),
 *                     record, sync, complete, close
 * The cut follows trust: the index meets records as ranges and blocks,
 * never as bytes, and knows no file; the format is where the file's hostile
 * bytes are checked, and it only reads them; the file is changed by
 * journal.c alone. */
#ifndef IMGCOPY_JOURNAL_INTERNAL_H
#define IMGCOPY_JOURNAL_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "journal.h"

struct run;   /* journal_index.c */
struct piece; /* journal_index.c */

struct ic_journal {
    int fd, dirfd;
    char *name; /* in dirfd */
    char *path; /* for messages */
    uint64_t size, block_size, nblocks;
    size_t digest_size; /* 0: no digests */
    int resumed;

    uint64_t end;     /* end of the last whole record: where the next one goes */
    int cut;          /* a torn tail lies past `end`: cut it before writing */
    int failed;       /* a write or sync failed: `failure` says how */
    struct ic_error failure;

    struct ic_range *done;
    size_t ndone, done_cap;
    struct run *runs;
    size_t nruns, runs_cap;
    uint8_t *dig;
    size_t ndig, dig_cap; /* in digests */

    /* recorded, not yet written: ranges, the blocks' zero bits (the
     * record's bitmap; bits past npbits clear), and the digests of the data
     * blocks, the last pend_data of the arena */
    struct ic_range *pend;
    size_t npend, pend_cap;
    uint8_t *pbits;
    size_t npbits, pbits_cap; /* bits; capacity in bytes */
    size_t pend_data;
};

/* ---- journal_index.c ---- */

/* Grow the array whose pointer is at `pp` (elements of `size` bytes) to
 * hold at least `need`: 0, or -1 (nothing changed) when that does not fit
 * in memory. */
int journal_reserve(void *pp, size_t *cap, size_t need, size_t size);
uint64_t journal_blocks_of(const struct ic_journal *j, uint64_t bytes);
/* Whether range r is one a record may hold: non-empty, inside size, on
 * block boundaries (or ending at size). */
int journal_range_ok(const struct ic_journal *j, struct ic_range r);

/* What the blocks of a record are: zero or data, per block from a byte
 * each (the caller's flags), from a bit each (a record's bitmap), or all
 * alike (a run as blkhash's sink tells it) */
enum kinds_mode { KINDS_BYTES, KINDS_BITS, KINDS_ALL_DATA, KINDS_ALL_ZERO };
struct kinds {
    enum kinds_mode mode;
    const uint8_t *p;
};

/* A copy's record of ranges[0..n) (empty ones skipped) whose blocks are as
 * `k` says: checked, laid over the index and queued for the next sync, or
 * refused with nothing changed. */
int journal_add(struct ic_journal *j, const struct ic_range *ranges, size_t n,
                const struct kinds *k, const uint8_t *digests, struct ic_error *err);
/* The queued record is in the file: queue the next one afresh */
void journal_pending_written(struct ic_journal *j);

/* Opening gathers every record's pieces and resolves them once, at the
 * end: replayed one by one, a hostile file's records could cost quadratic
 * time.  Zeroed to start; `p` is the caller's to free. */
struct journal_pieces {
    struct piece *p;
    size_t n, cap;
    uint64_t seq; /* the next piece's order */
};
/* A whole, checked record read from the file: its n ranges (valid), with
 * digests its zero-block bitmap and its ndata digests */
int journal_add_loaded(struct ic_journal *j, const struct ic_range *ranges, uint32_t n,
                       const uint8_t *bits, const uint8_t *digests, uint64_t ndata,
                       struct journal_pieces *pc, struct ic_error *err);
/* Every record read: the done ranges merged, the pieces resolved into runs */
int journal_settle(struct ic_journal *j, struct journal_pieces *pc, struct ic_error *err);

/* ---- journal_format.c ---- */

/* The header `id` is written with (malloc'd, *len bytes), or NULL */
uint8_t *journal_build_header(const struct ic_journal_identity *id, size_t *len);
/* Read an existing journal of fsize bytes: its header checked against id,
 * its records into the index, a torn tail noted.  0, -1 (err set), or 1:
 * the file is a creation a crash interrupted, to be written anew. */
int journal_load(struct ic_journal *j, const struct ic_journal_identity *id, uint64_t fsize,
                 struct ic_error *err);
/* The queued record as it goes into the file (malloc'd, *len bytes with
 * its header), or NULL when that does not fit in memory */
uint8_t *journal_encode_pending(const struct ic_journal *j, size_t *len);

#endif
