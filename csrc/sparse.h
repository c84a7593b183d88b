/* Sparse detection: which zero runs inside data become holes (sparse.c).
 * Pure, apart from the look-around reads it asks its caller for, so that
 * it is unit-tested on its own (tests/c/test_sparse.c). */
#ifndef IMGCOPY_SPARSE_H
#define IMGCOPY_SPARSE_H

#include <stddef.h>
#include <stdint.h>

/* qemu-img's read requests (its buffer, which -S does not grow), inside
 * which it judges zero runs; and its longest block-status answer, where a
 * data extent ends as far as zero runs are concerned */
#define IC_SPARSE_WINDOW (2ull << 20)
#define IC_SPARSE_STATUS_MAX ((1ull << 31) - 512)

struct ic_sparse {
    uint64_t threshold;   /* zero runs this long become holes (> 0) */
    uint64_t granularity; /* zeros are found on blocks of this size */
    uint8_t *scratch;     /* look-around reads, scratch_size bytes */
    size_t scratch_size;  /* a whole number of blocks */
    /* bytes [off, off+len) of the source, for runs that cross the buffer */
    int (*read)(void *ctx, void *buf, uint64_t off, uint64_t len);
    void *ctx;
};

/* The largest power of two not above the threshold (>= 512); 4096 for 0. */
uint64_t ic_sparse_granularity(uint64_t threshold);

/* Cut `buf`, the source's bytes [start, end) of the data extent [ext_start,
 * ext_end) (start and end multiples of the granularity or the extent's
 * edges), into pieces: emit(emit_ctx, off, len, data) in order, data
 * pieces to write and holes.  A run of zero blocks (aligned in the guest,
 * clipped at windows of IC_SPARSE_WINDOW counted from ext_start) is a hole
 * when it is at least `threshold` long or touches a window's edge, as
 * qemu-img convert -S decides; a run reaching start or end inside a window
 * is measured across it with sp->read.  -1 when a read fails. */
int ic_sparse_split(const struct ic_sparse *sp, const uint8_t *buf, uint64_t start, uint64_t end,
                    uint64_t ext_start, uint64_t ext_end,
                    void (*emit)(void *emit_ctx, uint64_t off, uint64_t len, int data),
                    void *emit_ctx);

#endif
