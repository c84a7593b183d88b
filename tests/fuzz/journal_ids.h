/* The copies the journal harness (fuzz_journal.c) opens its inputs as: an
 * input's first byte picks one (modulo their number), the rest is the
 * journal file.  make_seeds_journal.c writes seeds for each and
 * hostile_journal.py knows the first; keep the three in step. */
#ifndef IMGCOPY_FUZZ_JOURNAL_IDS_H
#define IMGCOPY_FUZZ_JOURNAL_IDS_H

#include <stdint.h>

#include "journal.h"

static const struct ic_journal_identity journal_ids[] = {
    /* blkhash's defaults shrunk: sha256-sized digests, a short last block */
    {"raw:/src.raw dev=2049,ino=12,size=1048676,mtime=1700000000.0", "raw:/dst.raw",
     (1u << 20) + 100, "sparse_threshold=4096 format=raw", "sha256", 4096, 32},
    /* no digests: ranges in 512-byte units */
    {"nbd+unix:///disk?socket=/run/src.sock", "raw:/dst.raw", 1u << 20,
     "sparse_threshold=0 format=raw", NULL, 512, 0},
    /* tiny blocks and digests: many blocks per byte of input */
    {"raw:/tiny", "raw:/tiny.out", 101, "", "t", 2, 1},
    /* a huge disk: block counts near what 64 bits hold */
    {"raw:/huge", "nbd://host/huge", (1ull << 62) + 3, "format=qcow2", "blake2b", 1u << 16, 64},
    /* byte units up to the largest size */
    {"raw:/max", "raw:/max.out", UINT64_MAX, "o", NULL, 1, 0},
};

#define JOURNAL_IDS (sizeof journal_ids / sizeof journal_ids[0])

#endif
