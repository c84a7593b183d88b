/* libFuzzer target for the copy journal's reader (csrc/journal.c).
 *
 * An input's first byte picks the copy (journal_ids.h) the journal is
 * opened for; the rest is the journal file, written to journal.icj in a
 * private directory under $TMPDIR (see fuzz_common.h).  ic_journal_open
 * may refuse it (a damaged journal, another copy's), but only as a format
 * or value error.  A journal it opens must be consistent: done ranges
 * sorted, apart, on block boundaries, inside the size; with digests, a
 * block is found exactly when a done range holds it.  Then one record from
 * the input's bytes is appended and synced (cutting any torn tail) and the
 * journal opened again: it must hold what it held and the new record, the
 * new digests winning.  Crashing, leaking, hanging or allocating without
 * bound is a failure (run with -rss_limit_mb and -timeout). */
#include "fuzz_common.h"
#include "digest.h"
#include "journal_ids.h"

enum { JOURNAL };
static const char *const names[] = {"journal.icj"};

#define CHECKED_RANGES 256 /* done ranges whose ends are looked up */

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_init_dir("imgcopy-fuzz-journal.", names, sizeof names / sizeof names[0]);
    return 0;
}

NO_COVERAGE static void fail(const char *what, unsigned long long a, unsigned long long b)
{
    fprintf(stderr, "fuzz_journal: %s (%llu, %llu)\n", what, a, b);
    abort();
}

/* Whether byte offset `off` lies in one of the done ranges */
NO_COVERAGE static int in_done(const struct ic_range *d, size_t n, uint64_t off)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (d[mid].offset + d[mid].length <= off)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < n && d[lo].offset <= off;
}

NO_COVERAGE static void check_block(const struct ic_journal *j, const struct ic_journal_identity *id,
                                    const struct ic_range *d, size_t n, uint64_t b)
{
    uint64_t nblocks = id->size / id->block_size + (id->size % id->block_size != 0);
    int zero = -1;
    uint8_t dig[IC_DIGEST_MAX];
    int found = ic_journal_block(j, b, &zero, dig);
    int want = id->algorithm && b < nblocks && in_done(d, n, b * id->block_size);
    if (found != want)
        fail("a block found, not done (or done, not found)", b, (unsigned long long)found);
    if (found && zero != 0 && zero != 1)
        fail("a block's kind unset", b, 0);
}

/* The done ranges and lookups agree */
NO_COVERAGE static void check_journal(const struct ic_journal *j,
                                      const struct ic_journal_identity *id,
                                      const uint8_t *data, size_t size)
{
    size_t n;
    const struct ic_range *d = ic_journal_done(j, &n);
    uint64_t bs = id->block_size;
    for (size_t i = 0; i < n; i++) {
        if (d[i].length == 0 || d[i].offset >= id->size || d[i].length > id->size - d[i].offset)
            fail("a done range outside the size", d[i].offset, d[i].length);
        if (d[i].offset % bs || ((d[i].offset + d[i].length) % bs && d[i].offset + d[i].length !=
                                                                         id->size))
            fail("a done range off the blocks", d[i].offset, d[i].length);
        if (i > 0 && d[i].offset <= d[i - 1].offset + d[i - 1].length)
            fail("done ranges out of order or touching", d[i - 1].offset, d[i].offset);
    }
    for (size_t i = 0; i < n && i < CHECKED_RANGES; i++) {
        uint64_t first = d[i].offset / bs, last = (d[i].offset + d[i].length - 1) / bs;
        check_block(j, id, d, n, first);
        check_block(j, id, d, n, last);
        if (first > 0)
            check_block(j, id, d, n, first - 1);
        check_block(j, id, d, n, last + 1);
    }
    for (uint64_t k = 0; k < 8; k++)
        check_block(j, id, d, n, mix(data, size, 10 + k) % (id->size / bs + 2));
    /* the first runs walked in order agree with the lookups at their ends */
    uint64_t nblocks = id->size / bs + (id->size % bs != 0), at = 0;
    for (int k = 0; k < 64 && at < nblocks; k++) {
        uint64_t count;
        int zero, z = -1;
        const uint8_t *dig;
        uint8_t one[IC_DIGEST_MAX];
        int found = ic_journal_run(j, at, &count, &zero, &dig);
        if (!id->algorithm) {
            if (found || count)
                fail("a run without digests", at, count);
            break;
        }
        if (count == 0 || count > nblocks - at)
            fail("a run's length", at, count);
        uint64_t last = at + count - 1;
        if (ic_journal_block(j, at, &z, one) != found || ic_journal_block(j, last, &z, one) !=
                                                             found)
            fail("a run and the lookups disagree", at, count);
        if (found && (z != zero || (!zero && memcmp(one, dig + (last - at) * id->digest_size,
                                                    id->digest_size) != 0)))
            fail("a run's last digest", at, count);
        at += count;
    }
    check_block(j, id, d, n, UINT64_MAX);
}

/* One record from the input's bytes: 1 to 4 blocks somewhere */
static void append(struct ic_journal *j, const struct ic_journal_identity *id, const uint8_t *data,
                   size_t size, struct ic_range *r, uint8_t *zero, uint8_t *dig, size_t *nblk)
{
    uint64_t bs = id->block_size, nblocks = id->size / bs + (id->size % bs != 0);
    uint64_t h = mix(data, size, 3);
    uint64_t first = h % nblocks, count = 1 + (h >> 50) % 4;
    if (count > nblocks - first)
        count = nblocks - first;
    uint64_t end = (first + count) * bs;
    if (end / bs != first + count || end > id->size)
        end = id->size;
    *r = (struct ic_range){first * bs, end - first * bs};
    *nblk = (size_t)count;
    size_t nd = 0;
    for (size_t i = 0; i < count; i++) {
        zero[i] = (h >> (40 + i)) & 1;
        if (!zero[i])
            for (size_t k = 0; k < id->digest_size; k++)
                dig[nd * id->digest_size + k] = (uint8_t)(h >> (k % 8) * 8) ^ (uint8_t)i;
        nd += !zero[i];
    }
    struct ic_error err;
    int ret;
    if ((h >> 60) & 1) {
        /* as blkhash's sink tells a run: all zero, or all data */
        int z = (h >> 61) & 1;
        for (size_t i = 0; i < count; i++) {
            zero[i] = (uint8_t)z;
            for (size_t k = 0; k < id->digest_size; k++)
                dig[i * id->digest_size + k] = (uint8_t)(h >> (k % 8) * 8) ^ (uint8_t)i;
        }
        ret = ic_journal_record_run(j, first, count, z ? NULL : dig, &err);
    } else {
        ret = ic_journal_record(j, r, 1, zero, dig, &err);
    }
    if (ret < 0)
        fail("a record the journal should take", r->offset, r->length);
    if (ic_journal_sync(j, &err) < 0) {
        fprintf(stderr, "sync: %s\n", err.msg);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const struct ic_journal_identity *id = &journal_ids[data[0] % JOURNAL_IDS];
    put_file(fuzz_path(JOURNAL), data + 1, size - 1);
    struct ic_journal *j = NULL;
    struct ic_error err;
    if (ic_journal_open(fuzz_path(JOURNAL), id, &j, &err) < 0) {
        if (verbose)
            fprintf(stderr, "  open: %s\n", err.msg);
        if (err.kind != IC_ERR_FORMAT && err.kind != IC_ERR_VALUE) {
            fprintf(stderr, "a journal refused with neither a format nor a value error: %s\n",
                    err.msg);
            abort();
        }
        return 0;
    }
    size_t n;
    const struct ic_range *d = ic_journal_done(j, &n);
    if (verbose)
        fprintf(stderr, "  open: resumed %d, %zu done ranges\n", ic_journal_resumed(j), n);
    check_journal(j, id, data, size);

    /* what it held, to compare after the record */
    struct ic_range *before = malloc((n ? n : 1) * sizeof *before);
    if (!before)
        abort();
    if (n)
        memcpy(before, d, n * sizeof *d);
    size_t nbefore = n;
    struct ic_range r;
    uint8_t zero[4], dig[4 * IC_DIGEST_MAX];
    size_t nblk;
    append(j, id, data, size, &r, zero, dig, &nblk);
    ic_journal_close(j);

    if (ic_journal_open(fuzz_path(JOURNAL), id, &j, &err) < 0) {
        fprintf(stderr, "reopening after a record: %s\n", err.msg);
        abort();
    }
    if (!ic_journal_resumed(j))
        fail("a journal with a record is no resume", 0, 0);
    check_journal(j, id, data, size);
    d = ic_journal_done(j, &n);
    /* the old ranges and the new one, merged, nothing else */
    struct ic_range *want = malloc((nbefore + 1) * sizeof *want);
    if (!want)
        abort();
    size_t nw = 0, i = 0;
    for (int placed = 0; i < nbefore || !placed;) {
        struct ic_range x;
        if (!placed && (i >= nbefore || r.offset < before[i].offset)) {
            x = r;
            placed = 1;
        } else {
            x = before[i++];
        }
        if (nw > 0 && x.offset <= want[nw - 1].offset + want[nw - 1].length) {
            uint64_t e = x.offset + x.length;
            if (e > want[nw - 1].offset + want[nw - 1].length)
                want[nw - 1].length = e - want[nw - 1].offset;
        } else {
            want[nw++] = x;
        }
    }
    if (nw != n)
        fail("done ranges after a record: count", n, nw);
    for (i = 0; i < n; i++)
        if (d[i].offset != want[i].offset || d[i].length != want[i].length)
            fail("done ranges after a record: a range differs", d[i].offset, want[i].offset);
    free(want);
    /* the new record's blocks, as recorded */
    size_t nd = 0;
    for (size_t i = 0; id->algorithm && i < nblk; i++) {
        int z = -1;
        uint8_t got[IC_DIGEST_MAX];
        if (ic_journal_block(j, r.offset / id->block_size + i, &z, got) != 1 || z != zero[i])
            fail("a new block not as recorded", r.offset / id->block_size + i, (unsigned)z);
        if (!z && memcmp(got, dig + nd++ * id->digest_size, id->digest_size) != 0)
            fail("a new block's digest differs", r.offset / id->block_size + i, 0);
    }
    ic_journal_close(j);
    free(before);
    return 0;
}
