/* The journal of a copy: which ranges of the destination are written and
 * flushed, with the blkhash digests of their blocks, so that a copy that
 * failed (an exception, SIGKILL, a power cut) copies only what is missing
 * when run again, and its checksum combines the recorded digests with the
 * new ones without reading back what an earlier run wrote (issue 27).
 *
 * The file is append-only: a header naming the copy, then one record per
 * ic_journal_sync.  A record is durable once ic_journal_sync returns; a
 * crash can only damage the record being written, the last one.
 *
 * On disk, every integer little-endian:
 *
 *   header
 *     0    8  magic "ICJRNL\r\n"
 *     8    4  version: 1
 *     12   4  H, the header's length (52 + the four texts + 4), at most
 *             IC_JOURNAL_HEADER_MAX
 *     16   8  size: the bytes to copy
 *     24   8  block size (>= 1): blkhash's block with digests, else the unit
 *             ranges are recorded in
 *     32   4  digest size: 0 without an algorithm, else 1..IC_DIGEST_MAX
 *     36   4  length of the algorithm's name (0: no digests)
 *     40   4  length of the source's identity
 *     44   4  length of the destination's identity
 *     48   4  length of the options
 *     52      the algorithm, source, destination and options, in that
 *             order, each at most IC_JOURNAL_TEXT_MAX bytes, no terminators
 *     H-4  4  crc32 (zlib's) of bytes [0, H-4)
 *
 *   records, one after another to the end of the file
 *     0    8  L, the payload's length
 *     8    4  crc32 of the payload
 *     12   4  crc32 of bytes [0, 12): a damaged length is told from one cut short
 *     16   L  payload:
 *               4  N, the number of ranges (>= 1)
 *               4  flags: 0 (anything else is refused)
 *               N x (8 offset, 8 length): byte ranges, each non-empty, inside
 *                  size, starting on a block boundary and ending on one or
 *                  at size; they may overlap each other and earlier records
 *             with an algorithm, B being the blocks of the N ranges in order
 *             (a block counted once per range it is in):
 *               ceil(B / 8) bytes: bit i (bit i % 8 of byte i / 8) set when
 *                  block i is a zero block; the bits past B clear
 *               one digest (digest size bytes) per data block, in order
 *
 * What a block holds is what the last record naming it says (later records
 * win, and within a record later ranges).
 *
 * Damage: a record is whole when its header checksum, its length (inside
 * the file) and its payload checksum hold.  The first record that is not
 * whole ends the journal when no whole record follows it anywhere in the
 * file: that is the torn tail a crash leaves (cut short, or pages that never
 * reached the disk), dropped silently, and cut off (ftruncate) before the
 * next record is written.  When a whole record does follow, the damage is in
 * the middle of the journal: refused.  A whole record whose contents break
 * the rules above is refused too: no crash writes one.  A file that holds a
 * part of the header this copy writes, maybe followed by zeros, is a
 * creation a crash interrupted (an empty file too): it recorded nothing and
 * is written anew; a part of another header is refused like a damaged one.
 *
 * Memory: the ranges recorded (16 bytes each, merged), the digests of the
 * data blocks recorded, and an index of runs of blocks (24 bytes a run of
 * zero blocks or of data blocks recorded together); opening reads the file
 * record by record.  Lookups are a binary search.
 *
 * A journal is used by one thread at a time (ic_journal_block may be called
 * from several threads at once while nothing records).  Two processes
 * cannot hold one journal: it is locked (flock) while open. */
#ifndef IMGCOPY_JOURNAL_H
#define IMGCOPY_JOURNAL_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "imgcopy.h"

#define IC_JOURNAL_VERSION 1
#define IC_JOURNAL_TEXT_MAX (64u << 10)
#define IC_JOURNAL_HEADER_MAX (52u + 4u * IC_JOURNAL_TEXT_MAX + 4u)

struct ic_journal;

struct ic_journal_identity {
    /* what the source is: e.g. "raw:/abs/path dev=..,ino=..,size=..,mtime=.."
     * or an NBD URI; free text, compared byte for byte (NULL: "") */
    const char *source;
    const char *destination; /* likewise */
    uint64_t size;           /* bytes to copy (the source's size) */
    /* the options that change the output, canonical text
     * ("sparse_threshold=4096 format=raw ..."), compared byte for byte */
    const char *options;
    const char *algorithm;   /* blkhash digest algorithm, or NULL: no digests */
    uint64_t block_size;     /* blkhash block size (with digests), else the unit of ranges; >= 1 */
    size_t digest_size;      /* bytes of one block digest: 0 without an algorithm */
};

/* Open `path`: created when it does not exist (O_EXCL; the header written
 * and made durable, the directory fsynced), else read and checked against
 * `id`: a difference is refused with ic_error_value naming the field and
 * both values (shortened), a damaged journal with ic_error_format ("corrupt
 * journal ...", see above), one another process holds with ic_error_os
 * (EAGAIN). */
int ic_journal_open(const char *path, const struct ic_journal_identity *id,
                    struct ic_journal **out, struct ic_error *err);
/* Whether the journal existed (a resume) */
int ic_journal_resumed(const struct ic_journal *j);
/* Its identity's block size and digest size (0: no digests), and size */
uint64_t ic_journal_block_size(const struct ic_journal *j);
size_t ic_journal_digest_size(const struct ic_journal *j);
uint64_t ic_journal_size(const struct ic_journal *j);
/* The ranges recorded done, sorted, merged (touching ones too), owned by
 * the journal: valid until the next ic_journal_record (NULL when none). */
const struct ic_range *ic_journal_done(const struct ic_journal *j, size_t *count);
/* The recorded digest of block `index` (blocks of block_size from 0): 1 when
 * recorded, with *is_zero set for a zero block (the caller uses its zero
 * digest; `digest` untouched) or cleared and the digest copied into
 * `digest` (digest_size bytes); 0 when not recorded, or without digests. */
int ic_journal_block(const struct ic_journal *j, uint64_t index, int *is_zero, uint8_t *digest);
/* The same for walking blocks in order, a run at a time (one search per
 * run, not per block): 1 when block `index` is recorded, with *count the
 * blocks from index on recorded alike (all zero blocks: *is_zero set; or
 * data blocks whose digests lie one after another from *digests,
 * digest_size bytes each, valid until the next ic_journal_record); 0 when
 * it is not, with *count the blocks up to the next recorded one or the end
 * (0 past the end, and without digests). */
int ic_journal_run(const struct ic_journal *j, uint64_t index, uint64_t *count, int *is_zero,
                   const uint8_t **digests);
/* Append one record: `n` ranges (bytes; each starts on a block boundary and
 * ends on one or at size; empty ones are skipped) now written AND flushed
 * to the destination.  With an algorithm, for each block of the ranges in
 * order (a block in two ranges counted twice): zero_flags[i] non-zero when
 * block i is a zero block, and `digests` the digests of the data blocks
 * only, one after another (digest_size bytes each; NULL when every block
 * is zero).  Without an algorithm both are ignored (may be NULL).  Buffered: not durable until
 * ic_journal_sync, but ic_journal_done and ic_journal_block see it at once.
 * A failure leaves the journal as it was. */
int ic_journal_record(struct ic_journal *j, const struct ic_range *ranges, size_t n,
                      const uint8_t *zero_flags, const uint8_t *digests, struct ic_error *err);
/* The same for blocks [first, first+count) written and flushed, as
 * blkhash's sink tells them (blkhash.h): `digests` their count digests
 * one after another, or NULL when they are zero blocks (count 0: nothing).
 * The last block may be the short one; without an algorithm `digests` is
 * ignored. */
int ic_journal_record_run(struct ic_journal *j, uint64_t first, uint64_t count,
                          const uint8_t *digests, struct ic_error *err);
/* Make everything recorded durable: one record written, then fdatasync
 * (the caller flushed the destination first).  A failure sticks: every
 * later record or sync returns it (after a failed fdatasync nothing says
 * what reached the disk); the next open keeps what is whole. */
int ic_journal_sync(struct ic_journal *j, struct ic_error *err);
/* The copy completed: unlink the journal and fsync its directory, then free
 * it (also when that fails). */
int ic_journal_complete(struct ic_journal *j, struct ic_error *err);
/* Close and keep the file (a failure: the next run resumes); what was
 * recorded since the last sync is lost.  NULL is fine. */
void ic_journal_close(struct ic_journal *j);

#endif
