/* blkhash: the checksum of a disk image that blksum (blkhash >= 0.10) and
 * nbdcopy --blkhash compute, fed out of order by many threads.
 *
 * The image's bytes are cut into blocks of `block_size` (the last may be
 * shorter); each block's digest is H(block), or Z = H(block_size zeros)
 * for a full block of zeros without hashing it; the checksum is
 * H(d_0 || d_1 || ... || d_{n-1} || le64(size)).
 *
 * update() and zero() take any range, in any order, from any thread:
 * whole blocks are hashed at once by the calling thread, pieces of blocks
 * wait in a small table until their block is complete.  Block digests are
 * folded into the outer hash as soon as every earlier block is done, so
 * only the digests of blocks done ahead of a gap are held (memory follows
 * how far the feeders run ahead, not the image's size). */
#ifndef IMGCOPY_BLKHASH_H
#define IMGCOPY_BLKHASH_H

#include <stddef.h>
#include <stdint.h>

#include "digest.h"

#define IC_BLKHASH_DEFAULT_BLOCK (64u << 10)
#define IC_BLKHASH_MAX_BLOCK (64u << 20)

struct ic_blkhash;

/* A checksum of `size` bytes: `algorithm` as ic_digest_lookup() takes it,
 * block_size even, from 2 bytes to IC_BLKHASH_MAX_BLOCK. */
int ic_blkhash_new(const char *algorithm, uint64_t block_size, uint64_t size,
                   struct ic_blkhash **out, struct ic_error *err);
void ic_blkhash_free(struct ic_blkhash *h);

/* Bytes [off, off+len): data, or zeros known without reading them.  Each
 * byte must be fed exactly once; the first failure sticks (later calls and
 * final() return it). */
int ic_blkhash_update(struct ic_blkhash *h, uint64_t off, const void *buf, size_t len,
                      struct ic_error *err);
int ic_blkhash_zero(struct ic_blkhash *h, uint64_t off, uint64_t len, struct ic_error *err);

/* Told of each run of blocks [first, first+count) once their digests are
 * known (`digests`: count of them in order, or NULL for full blocks of
 * zeros, each Z), from the feeding thread, under the hash's lock: quick,
 * and never calling back into the hash.  A journal records them; a range
 * shard hands them to the coordinator. */
typedef void ic_blkhash_sink_fn(void *ctx, uint64_t first, uint64_t count,
                                const uint8_t *digests);
void ic_blkhash_set_sink(struct ic_blkhash *h, ic_blkhash_sink_fn *sink, void *ctx);
/* Blocks [first, first+count) done elsewhere: their digests (NULL: full
 * zero blocks; a short last block of zeros gets its own), as if fed. */
int ic_blkhash_put_digests(struct ic_blkhash *h, uint64_t first, uint64_t count,
                           const uint8_t *digests, struct ic_error *err);
/* A range shard's hash: blocks before `block` will never be fed (final()
 * is then meaningless: the sink collects the digests).  Before any feed. */
int ic_blkhash_start_at(struct ic_blkhash *h, uint64_t block, struct ic_error *err);
uint64_t ic_blkhash_block_size(const struct ic_blkhash *h);
/* Z: the digest of a full block of zeros */
const uint8_t *ic_blkhash_zero_digest(const struct ic_blkhash *h);

/* The digests of blocks [first, first+count), gathered from a sink (a
 * range shard's, handed to whoever combines the shards) */
struct ic_block_digests {
    uint64_t first, count;
    size_t dsize;
    uint8_t *digests; /* count * dsize */
    uint64_t missing; /* blocks not told yet */
    uint8_t *told;    /* per block */
    uint8_t zero[IC_DIGEST_MAX]; /* Z, for full zero blocks */
};
int ic_block_digests_init(struct ic_block_digests *b, const char *algorithm,
                          uint64_t block_size, uint64_t first, uint64_t count,
                          struct ic_error *err);
ic_blkhash_sink_fn ic_block_digests_sink;
void ic_block_digests_free(struct ic_block_digests *b);

/* Record a failure of a feeder: final() returns it. */
void ic_blkhash_fail(struct ic_blkhash *h, const struct ic_error *err);

/* The checksum once every byte was fed: ic_blkhash_size(h) bytes into
 * `out`, and as hex into `hex` (2 * IC_DIGEST_MAX + 1 bytes) if not NULL. */
int ic_blkhash_final(struct ic_blkhash *h, uint8_t *out, char *hex, struct ic_error *err);
size_t ic_blkhash_size(const struct ic_blkhash *h);
const char *ic_blkhash_algorithm(const struct ic_blkhash *h);

#endif
