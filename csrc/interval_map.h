/* A sorted set of disjoint, non-touching-when-equal intervals [start, end)
 * with block-status values: what an image has learnt about its extents.
 * Gaps are ranges nothing is known about.  Not thread-safe: callers lock. */
#ifndef IMGCOPY_INTERVAL_MAP_H
#define IMGCOPY_INTERVAL_MAP_H

#include <stddef.h>
#include <stdint.h>

struct ic_interval {
    uint64_t start;
    uint64_t end;
    uint64_t host;   /* host offset of `start` when flags has IC_EXT_OFFSET_VALID */
    uint32_t flags;  /* IC_EXT_* */
    uint32_t depth;
};

struct ic_interval_map {
    struct ic_interval *v;
    size_t n;
    size_t cap;
};

void ic_imap_init(struct ic_interval_map *m);
void ic_imap_free(struct ic_interval_map *m);
void ic_imap_clear(struct ic_interval_map *m);

/* The interval containing `off`, or NULL. */
const struct ic_interval *ic_imap_find(const struct ic_interval_map *m, uint64_t off);

/* The unknown range around `off` (which must not be known), clipped to
 * [0, limit): [*gap_start, *gap_end). */
void ic_imap_gap(const struct ic_interval_map *m, uint64_t off, uint64_t limit,
                 uint64_t *gap_start, uint64_t *gap_end);

/* Record `iv` over whatever was known there.  -1 on ENOMEM (map unchanged). */
int ic_imap_assign(struct ic_interval_map *m, const struct ic_interval *iv);
/* Record n contiguous intervals at once (a driver's walk): one move of
 * the map's tail, however many there are. */
int ic_imap_assign_run(struct ic_interval_map *m, const struct ic_interval *ivs, size_t n);
/* Record `iv` only where something is already known; gaps stay gaps. */
int ic_imap_update_known(struct ic_interval_map *m, const struct ic_interval *iv);
/* Forget [start, end). */
int ic_imap_forget(struct ic_interval_map *m, uint64_t start, uint64_t end);

/* Same value, touching, host offsets contiguous. */
int ic_interval_mergeable(const struct ic_interval *a, const struct ic_interval *b);

#endif
