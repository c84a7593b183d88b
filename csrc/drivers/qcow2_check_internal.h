/* The state of a qcow2 check (qcow2_check.c) and what bounds its work
 * (qcow2_check_work.c: budgets, remembered passes over L2 tables). */
#ifndef IMGCOPY_QCOW2_CHECK_INTERNAL_H
#define IMGCOPY_QCOW2_CHECK_INTERNAL_H

#include "../check_messages.h"
#include "qcow2_state.h"

/* The work of one check is bounded by what its file holds.  In an image
 * qemu wrote, tables never overlap: its L1 tables together hold at most
 * the file's size in entries, so do its distinct L2 tables, and one walk
 * of an L1 table visits at most its own entries and the file's L2 entries.
 * A hostile image may name the same tables over and over, or tables that
 * overlap: passes over an L2 table are remembered and replayed (below), so
 * that naming one again costs what it references, not what it holds; and
 * past twice what an image qemu wrote may need (plus a floor), the check
 * stops.  Three budgets, in 8-byte entries:
 *   - the L1 entries walked (the active table's and the snapshots');
 *   - the entries of distinct L2 tables scanned, by each of the three
 *     passes that scan them (the active table's walk, the snapshots', the
 *     COPIED pass);
 *   - all the work of the L2 passes (scans, replays: one step per entry
 *     and per reference replayed), each L1 walk allowing what it may need.
 * A file of 256 KiB thus costs at most a few million steps. */
#define L1_ENTRIES_FLOOR (1ull << 16)
#define FIRST_SCAN_FLOOR (1ull << 16)
#define WORK_FLOOR (1ull << 20)
/* the distinct tables indexed at most (past it, each visit of a table not
 * indexed is paid as work, not as a first scan) */
#define MEMO_MAX_KEYS (1u << 20)

/* L2 passes are remembered when they reference at most this many host
 * clusters inside the file; all remembered passes hold at most
 * MEMO_MAX_REFS references and MEMO_MAX_PASSES passes (beyond, tables are
 * scanned again: what an image without repetitions costs anyway). */
#define REPLAY_MAX_CLUSTERS 256u
#define MEMO_MAX_REFS (1u << 21)
#define MEMO_MAX_PASSES (1u << 18)
/* What the index says of an L2 table besides a pass's number: */
#define NO_RECORD UINT32_MAX /* never scanned (or the index is full) */
/* scanned, its pass not remembered: it references too many clusters, or
 * the memory for remembered passes is spent; scanning it again is work */
#define NOT_REMEMBERED (UINT32_MAX - 1)
/* scanned, a count reached the maximum during its pass (or a pass
 * remembered no longer replays: a count reached it since): scanning it
 * again is paid as a first scan (each cluster reaches the maximum once) */
#define SATURATING (UINT32_MAX - 2)

/* A host cluster and the references one L2 table's pass made to it: n
 * raised its count, `over` found it at the maximum (qemu's overflow). */
struct ref_count {
    uint32_t cluster, n, over;
};

/* What one L2 table's pass did (check_l2, with fragmentation counted or
 * not): its messages, a run of the message buffer, the references it made
 * per cluster (refs[refs_at ...]) and its counter deltas.  A pass is
 * remembered only when each cluster it references was either at the
 * maximum count all along (every reference an overflow: its messages are
 * the same while the count stays there, and it does forever) or never
 * reached it; then the messages depend on nothing but the table. */
struct pass {
    uint32_t nrefs;
    uint64_t refs_at;
    size_t text_from, text_to;
    uint64_t d_corruptions, d_allocated, d_fragmented, d_compressed;
};

/* What the COPIED pass over one L2 table found: its messages and
 * corruptions (the stored refcounts do not change during a check). */
struct copied_pass {
    size_t text_from, text_to;
    uint64_t found;
};

/* Record numbers by key (an L2 table's offset, its low bit the pass's
 * kind): open addressing, grown at half full. */
struct index {
    uint64_t *keys; /* EMPTY_KEY: free */
    uint32_t *vals;
    uint64_t cap, used;
};
#define EMPTY_KEY UINT64_MAX

/* The pass being recorded: the clusters it referenced, found again
 * through a small hash table stamped per pass (no clearing between
 * passes). */
#define REC_SLOTS 512u /* > 2 * REPLAY_MAX_CLUSTERS */
struct recording {
    int on; /* 0: nothing recorded, or the pass cannot be remembered */
    int big; /* it references more than REPLAY_MAX_CLUSTERS clusters */
    uint32_t n;
    struct ref_count refs[REPLAY_MAX_CLUSTERS];
    uint32_t stamp; /* the pass's; slots with another are free */
    uint32_t slot_stamp[REC_SLOTS];
    uint32_t slot_cluster[REC_SLOTS];
    uint16_t slot_ref[REC_SLOTS];
};

struct ck {
    struct ic_image *img;
    struct qcow2_state *s;
    struct ic_check_result *r;
    struct ic_error *err;
    uint64_t csz, file_len;
    /* computed references per host cluster; once compare() has read the
     * stored refcounts, those (STORED_*: see there) */
    uint32_t *counts;
    uint64_t ncounts; /* entries allocated */
    uint64_t nb_clusters; /* qemu's refcount array size: grows with references */
    uint64_t stored_n;    /* clusters whose stored refcount counts[] holds */
    uint64_t count_max;
    uint64_t *l2;      /* one L2 table */
    uint64_t l2_at;    /* where it was read from; UINT64_MAX: nowhere */
    uint64_t l2_live;  /* its entries inside the file; the rest are zeros */
    /* work done and allowed (see L1_ENTRIES_FLOOR) */
    uint64_t l1_walked, l1_allowed;
    uint64_t first_scanned, first_allowed;
    uint64_t work, work_allowed;
    /* the stored refcounts */
    uint64_t *reftable;
    uint64_t reftable_entries; /* the table's, as the header sizes it */
    uint64_t reftable_live;    /* those inside the file: the rest are zeros */
    uint8_t *block;
    uint64_t block_off; /* what `block` holds; 0: nothing */
    unsigned bits;
    uint64_t per_block;
    int nomem;
    int signaled; /* qemu's corruption message was given (once per open) */
    /* Passes over L2 tables, replayed when an L1 entry names a table
     * again (a hostile image may name a few tables thousands of times). */
    struct index pass_index; /* key: offset | frag */
    struct pass *passes;
    uint64_t npasses, passes_cap;
    struct ref_count *refs; /* the remembered passes' references */
    uint64_t nrefs, refs_cap;
    struct recording *rec;
    struct index copied_index; /* key: offset */
    struct copied_pass *copied;
    uint64_t ncopied, copied_cap;
};

/* ---- qcow2_check_work.c ------------------------------------------------ */

/* One more reference to cluster k in the pass being recorded (an
 * overflow or not). */
void qcow2_ck_record(struct ck *c, uint64_t k, int overflow);
/* A pass over an L2 table begins: nothing recorded yet. */
void qcow2_ck_pass_begin(struct ck *c);
/* The pass just recorded becomes table `key`'s (key: the offset, its low
 * bit the pass's kind), or the index says why not. */
void qcow2_ck_remember(struct ck *c, uint64_t key, const struct ic_check_result *before,
                       size_t text_from);
/* The record number of `key` in an index, or NO_RECORD, NOT_REMEMBERED,
 * SATURATING. */
uint32_t qcow2_ck_index_get(const struct index *ix, uint64_t key);
/* A remembered pass again, when it does the same: 1, else 0 (the table is
 * scanned again). */
int qcow2_ck_replay(struct ck *c, const struct pass *p);
/* The COPIED pass over the table at l2_offset found `found` corruptions,
 * its messages from text_from on: remembered. */
void qcow2_ck_remember_copied(struct ck *c, uint64_t l2_offset, size_t text_from,
                              uint64_t found);
/* Budgets (see L1_ENTRIES_FLOOR): a first scan of `live` entries, a walk
 * of an L1 table with `n` entries in the file, `units` steps of L2 work;
 * -1 with the error set past what the file justifies. */
int qcow2_ck_first_scan(struct ck *c, uint64_t live);
void qcow2_ck_allow_walk(struct ck *c, uint64_t n);
int qcow2_ck_spend(struct ck *c, uint64_t units);
/* What the remembered passes hold, freed. */
void qcow2_ck_free(struct ck *c);

#endif
