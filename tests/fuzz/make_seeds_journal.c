/* Seeds for fuzz_journal: journals written through the journal's own API
 * for each copy of journal_ids.h, prefixed with that copy's index (the
 * harness's first byte).  Usage: make_seeds_journal SCRATCH_DIR OUT_DIR */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "digest.h"
#include "journal_ids.h"

static const char *scratch, *outdir;
static char jpath[4200];

static void die(const char *what, const char *why)
{
    fprintf(stderr, "make_seeds_journal: %s: %s\n", what, why);
    exit(1);
}

/* The journal file, cut to `keep` bytes (0: all), as seed NAME */
static void save(size_t id, const char *name, size_t keep)
{
    FILE *in = fopen(jpath, "rb");
    if (!in)
        die(jpath, "cannot open");
    static unsigned char buf[1 << 20];
    size_t n = fread(buf, 1, sizeof buf, in);
    fclose(in);
    if (keep && keep < n)
        n = keep;
    char out[4400];
    snprintf(out, sizeof out, "%s/id%zu-%s.bin", outdir, id, name);
    FILE *f = fopen(out, "wb");
    unsigned char sel = (unsigned char)id;
    if (!f || fwrite(&sel, 1, 1, f) != 1 || fwrite(buf, 1, n, f) != n || fclose(f) != 0)
        die(out, "cannot write");
}

static size_t file_size(void)
{
    struct stat st;
    if (stat(jpath, &st) < 0)
        die(jpath, "cannot stat");
    return (size_t)st.st_size;
}

/* Record ranges (in blocks: first, count; clipped to the size), block b
 * zero when (b + salt) % 3 == 0, digests from the salt */
static void put(struct ic_journal *j, const struct ic_journal_identity *id, const uint64_t *blk,
                size_t n, unsigned salt)
{
    struct ic_range r[8];
    static uint8_t zero[4096], dig[4096 * IC_DIGEST_MAX];
    size_t k = 0, nd = 0;
    uint64_t nblocks = id->size / id->block_size + (id->size % id->block_size != 0);
    for (size_t i = 0; i < n; i++) {
        uint64_t first = blk[2 * i] % nblocks, count = blk[2 * i + 1];
        if (count > nblocks - first)
            count = nblocks - first;
        uint64_t end = (first + count) * id->block_size;
        if (first + count == nblocks)
            end = id->size;
        r[i] = (struct ic_range){first * id->block_size, end - first * id->block_size};
        for (uint64_t b = first; b < first + count; b++, k++) {
            zero[k] = (b + salt) % 3 == 0;
            if (!zero[k])
                for (size_t x = 0; x < id->digest_size; x++)
                    dig[nd * id->digest_size + x] = (uint8_t)(b * 7 + x + salt);
            nd += !zero[k];
        }
    }
    struct ic_error err;
    if (ic_journal_record(j, r, n, zero, dig, &err) < 0 || ic_journal_sync(j, &err) < 0)
        die("record", err.msg);
}

int main(int argc, char **argv)
{
    if (argc != 3)
        die("usage", "make_seeds_journal SCRATCH_DIR OUT_DIR");
    scratch = argv[1];
    outdir = argv[2];
    snprintf(jpath, sizeof jpath, "%s/journal.icj", scratch);
    for (size_t id = 0; id < JOURNAL_IDS; id++) {
        const struct ic_journal_identity *ident = &journal_ids[id];
        struct ic_journal *j;
        struct ic_error err;
        unlink(jpath);
        if (ic_journal_open(jpath, ident, &j, &err) < 0)
            die("open", err.msg);
        ic_journal_close(j);
        save(id, "empty", 0);
        save(id, "creation-cut", 40);
        if (ic_journal_open(jpath, ident, &j, &err) < 0)
            die("open", err.msg);
        /* in order, then over what was recorded, then the last block */
        uint64_t a[] = {0, 3, 3, 2};
        put(j, ident, a, 2, 1);
        uint64_t b[] = {1, 3, 8, 1, 0, 1};
        put(j, ident, b, 3, 2);
        uint64_t c[] = {UINT64_MAX, 1};
        c[0] = ident->size / ident->block_size - (ident->size % ident->block_size == 0);
        put(j, ident, c, 1, 3);
        size_t before_last = file_size();
        uint64_t d[] = {5, 40, 2, 2};
        put(j, ident, d, 2, 4);
        ic_journal_close(j);
        save(id, "records", 0);
        save(id, "torn-tail", before_last + (file_size() - before_last) / 2);
    }
    unlink(jpath);
    return 0;
}
