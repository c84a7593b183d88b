/* The copy journal (csrc/journal.c): records made durable and read back,
 * identities that differ refused field by field, torn tails dropped at
 * every byte, damage in the middle refused, random record sets against a
 * model, a million blocks looked up, a process killed while it appends. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "check.h"
#include "digest.h"
#include "journal.h"

#define BS 4096u
#define DS 32u
#define NBLK 11u
#define SIZE (10u * BS + 100u) /* a short last block */

static char dir[4096];
static char jpath[4200];

static struct ic_journal_identity ident(void)
{
    return (struct ic_journal_identity){
        .source = "raw:/images/src.raw dev=64769,ino=1234,size=41060,mtime=1700000000.5",
        .destination = "raw:/images/dst.raw",
        .size = SIZE,
        .options = "sparse_threshold=4096 format=raw",
        .algorithm = "sha256",
        .block_size = BS,
        .digest_size = DS,
    };
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* CPU time of this process: what a bound on speed can hold to on a
 * machine others share */
static double cpu(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* The digest a test gives block `b` of the record tagged `tag` */
static void digest_of(uint64_t tag, uint64_t b, uint8_t *d, size_t ds)
{
    uint64_t w = 0;
    for (size_t i = 0; i < ds; i++) {
        if (i % 8 == 0)
            w = mix(tag * 1000003u + b * 31u + i / 8);
        d[i] = (uint8_t)(w >> (8 * (i % 8)));
    }
}

static uint64_t rng_state;
static uint64_t rnd(uint64_t n)
{
    rng_state = mix(rng_state);
    return n ? rng_state % n : 0;
}

static uint64_t file_size(const char *p)
{
    struct stat st;
    CHECK(stat(p, &st) == 0, "stat %s: %s", p, strerror(errno));
    return (uint64_t)st.st_size;
}

static uint8_t *read_file(const char *p, size_t *n)
{
    *n = (size_t)file_size(p);
    uint8_t *b = malloc(*n ? *n : 1);
    int fd = open(p, O_RDONLY);
    CHECK(fd >= 0 && b, "open %s", p);
    CHECK(pread(fd, b, *n, 0) == (ssize_t)*n, "read %s", p);
    close(fd);
    return b;
}

static void write_file(const char *p, const uint8_t *b, size_t n)
{
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    CHECK(fd >= 0, "create %s: %s", p, strerror(errno));
    CHECK(n == 0 || write(fd, b, n) == (ssize_t)n, "write %s", p);
    close(fd);
}

/* ---- a model: what each block holds ---- */

struct model {
    size_t nblocks, ds;
    uint64_t size, bs;
    uint8_t *state;  /* 0: not recorded, 1: zero, 2: data */
    uint64_t *tag;   /* data: the record whose digest it holds */
};

static void model_init(struct model *m, const struct ic_journal_identity *id)
{
    m->size = id->size;
    m->bs = id->block_size;
    m->nblocks = (size_t)(id->size / id->block_size + (id->size % id->block_size != 0));
    m->ds = id->digest_size;
    m->state = calloc(m->nblocks, 1);
    m->tag = calloc(m->nblocks, sizeof *m->tag);
}

static void model_copy(struct model *to, const struct model *from)
{
    to->nblocks = from->nblocks;
    to->ds = from->ds;
    to->size = from->size;
    to->bs = from->bs;
    memcpy(to->state, from->state, from->nblocks);
    memcpy(to->tag, from->tag, from->nblocks * sizeof *from->tag);
}

static void model_free(struct model *m)
{
    free(m->state);
    free(m->tag);
}

/* Record ranges r[0..n) in j and m: block b of the record is zero when
 * zero(tag, b) says so; data digests come from digest_of(tag, b). */
static int record(struct ic_journal *j, struct model *m, const struct ic_range *r, size_t n,
                  uint64_t tag, int zero_every, struct ic_error *err)
{
    size_t blocks = 0;
    for (size_t i = 0; i < n; i++)
        blocks += (size_t)(r[i].length / m->bs + (r[i].length % m->bs != 0));
    uint8_t *flags = calloc(blocks + 1, 1);
    uint8_t *dig = calloc(blocks + 1, m->ds ? m->ds : 1);
    size_t k = 0, nd = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t first = r[i].offset / m->bs;
        uint64_t c = r[i].length / m->bs + (r[i].length % m->bs != 0);
        for (uint64_t b = first; b < first + c; b++, k++) {
            flags[k] = zero_every && mix(tag * 7 + b) % (uint64_t)zero_every == 0;
            if (!flags[k] && m->ds)
                digest_of(tag, b, dig + m->ds * nd++, m->ds);
        }
    }
    int ret = ic_journal_record(j, r, n, flags, dig, err);
    if (ret == 0) {
        k = 0;
        for (size_t i = 0; i < n; i++) {
            uint64_t first = r[i].offset / m->bs;
            uint64_t c = r[i].length / m->bs + (r[i].length % m->bs != 0);
            for (uint64_t b = first; b < first + c; b++, k++) {
                m->state[b] = flags[k] ? 1 : 2;
                m->tag[b] = tag;
            }
        }
    }
    free(flags);
    free(dig);
    return ret;
}

/* Record blocks [first, first+count) as one run in j and m: all zero, or
 * data with digests from digest_of(tag, b) */
static int record_run(struct ic_journal *j, struct model *m, uint64_t first, uint64_t count,
                      uint64_t tag, int zero, struct ic_error *err)
{
    uint8_t *dig = NULL;
    if (!zero) {
        dig = calloc(count * (m->ds ? m->ds : 1) + 1, 1);
        for (uint64_t b = 0; m->ds && b < count; b++)
            digest_of(tag, first + b, dig + b * m->ds, m->ds);
    }
    int ret = ic_journal_record_run(j, first, count, dig, err);
    if (ret == 0)
        for (uint64_t b = first; b < first + count; b++) {
            m->state[b] = zero ? 1 : 2;
            m->tag[b] = tag;
        }
    free(dig);
    return ret;
}

static void verify(const struct ic_journal *j, const struct model *m, const char *what)
{
    /* the done ranges: the recorded blocks as bytes, merged */
    size_t n;
    const struct ic_range *done = ic_journal_done(j, &n);
    size_t k = 0;
    for (size_t b = 0; b < m->nblocks;) {
        if (!m->state[b]) {
            b++;
            continue;
        }
        size_t e = b;
        while (e < m->nblocks && m->state[e])
            e++;
        uint64_t off = b * m->bs, end = e * m->bs < m->size ? e * m->bs : m->size;
        CHECK(k < n, "%s: done range %zu missing (%llu..%llu)", what, k,
              (unsigned long long)off, (unsigned long long)end);
        CHECK(done[k].offset == off && done[k].length == end - off,
              "%s: done range %zu is %llu+%llu, expected %llu+%llu", what, k,
              (unsigned long long)done[k].offset, (unsigned long long)done[k].length,
              (unsigned long long)off, (unsigned long long)(end - off));
        k++;
        b = e;
    }
    CHECK(k == n, "%s: %zu done ranges, expected %zu", what, n, k);
    /* every block's digest */
    uint8_t got[IC_DIGEST_MAX], want[IC_DIGEST_MAX];
    for (size_t b = 0; b < m->nblocks; b++) {
        int zero = -1;
        int found = ic_journal_block(j, b, &zero, got);
        if (!m->ds) {
            CHECK(found == 0, "%s: block %zu found without digests", what, b);
            continue;
        }
        CHECK(found == (m->state[b] != 0), "%s: block %zu found %d, state %d", what, b, found,
              m->state[b]);
        if (!found)
            continue;
        CHECK(zero == (m->state[b] == 1), "%s: block %zu zero %d, state %d", what, b, zero,
              m->state[b]);
        if (!zero) {
            digest_of(m->tag[b], b, want, m->ds);
            CHECK(memcmp(got, want, m->ds) == 0, "%s: block %zu digest differs (tag %llu)",
                  what, b, (unsigned long long)m->tag[b]);
        }
    }
    /* the same a run at a time */
    for (uint64_t b = 0; b < m->nblocks;) {
        uint64_t count = 0;
        int zero = -1;
        const uint8_t *d = NULL;
        int found = ic_journal_run(j, b, &count, &zero, &d);
        if (!m->ds) {
            CHECK(found == 0 && count == 0, "%s: a run without digests", what);
            break;
        }
        CHECK(count > 0 && count <= m->nblocks - b, "%s: run at %llu: %llu blocks", what,
              (unsigned long long)b, (unsigned long long)count);
        for (uint64_t x = b; x < b + count; x++) {
            CHECK((m->state[x] != 0) == found, "%s: run at %llu: block %llu found %d", what,
                  (unsigned long long)b, (unsigned long long)x, found);
            if (!found)
                continue;
            CHECK(zero == (m->state[x] == 1), "%s: run at %llu: block %llu zero %d", what,
                  (unsigned long long)b, (unsigned long long)x, zero);
            if (!zero) {
                digest_of(m->tag[x], x, want, m->ds);
                CHECK(memcmp(d + (x - b) * m->ds, want, m->ds) == 0,
                      "%s: run at %llu: block %llu digest", what, (unsigned long long)b,
                      (unsigned long long)x);
            }
        }
        /* a run ends where the state changes (or at a gap's end) */
        if (b + count < m->nblocks && !found)
            CHECK(m->state[b + count] != 0, "%s: a gap ends early", what);
        b += count;
    }
    uint64_t cnt = 1;
    const uint8_t *dp = got;
    CHECK(ic_journal_run(j, m->nblocks, &cnt, &(int){0}, &dp) == 0 && cnt == 0 && !dp,
          "%s: a run past the end", what);
    CHECK(ic_journal_block(j, m->nblocks, &(int){0}, got) == 0, "%s: a block past the end", what);
    CHECK(ic_journal_block(j, UINT64_MAX, &(int){0}, got) == 0, "%s: block UINT64_MAX", what);
}

static struct ic_journal *open_ok(const struct ic_journal_identity *id, int resumed,
                                  const char *what)
{
    struct ic_journal *j = NULL;
    struct ic_error err = {0};
    CHECK(ic_journal_open(jpath, id, &j, &err) == 0, "%s: open: %s", what, err.msg);
    CHECK(ic_journal_resumed(j) == resumed, "%s: resumed %d", what, ic_journal_resumed(j));
    return j;
}

static void sync_ok(struct ic_journal *j, const char *what)
{
    struct ic_error err = {0};
    CHECK(ic_journal_sync(j, &err) == 0, "%s: sync: %s", what, err.msg);
}

static void remove_journal(void)
{
    CHECK(unlink(jpath) == 0 || errno == ENOENT, "unlink: %s", strerror(errno));
}

/* ---- the tests ---- */

static void test_round_trip(void)
{
    remove_journal();
    struct ic_journal_identity id = ident();
    struct model m;
    model_init(&m, &id);
    struct ic_error err = {0};
    struct ic_journal *j = open_ok(&id, 0, "new");
    verify(j, &m, "empty");
    /* blocks 0-2, the short last block, then 4-5 over a zero block */
    struct ic_range a[] = {{0, 3 * BS}, {10 * BS, 100}};
    CHECK(record(j, &m, a, 2, 1, 3, &err) == 0, "record: %s", err.msg);
    verify(j, &m, "recorded");
    sync_ok(j, "first");
    struct ic_range b[] = {{4 * BS, 2 * BS}, {2 * BS, BS}};
    CHECK(record(j, &m, b, 2, 2, 2, &err) == 0, "record: %s", err.msg);
    sync_ok(j, "second");
    verify(j, &m, "synced");
    ic_journal_close(j);

    j = open_ok(&id, 1, "reopened");
    verify(j, &m, "reopened");
    /* a record not synced is lost on close */
    struct model before;
    model_init(&before, &id);
    model_copy(&before, &m);
    struct ic_range c[] = {{6 * BS, BS}};
    CHECK(record(j, &m, c, 1, 3, 0, &err) == 0, "record: %s", err.msg);
    verify(j, &m, "unsynced, still open");
    ic_journal_close(j);
    j = open_ok(&id, 1, "reopened without the last");
    verify(j, &before, "reopened without the last");

    /* ranges that are not whole blocks are refused, the journal unchanged */
    struct ic_range bad[][1] = {{{1, BS}}, {{0, BS + 1}}, {{10 * BS, 99}}, {{10 * BS, 101}},
                                {{SIZE, BS}}, {{UINT64_MAX - BS + 1, BS}}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK(record(j, &before, bad[i], 1, 9, 0, &err) < 0 && err.kind == IC_ERR_VALUE,
              "bad range %zu accepted", i);
        verify(j, &before, "after a refused record");
    }
    /* zero blocks need no digests; a record needs its blocks' kinds */
    struct ic_range zr[] = {{7 * BS, 2 * BS}};
    CHECK(ic_journal_record(j, zr, 1, (uint8_t[2]){1, 1}, NULL, &err) == 0, "zeros: %s",
          err.msg);
    before.state[7] = before.state[8] = 1;
    verify(j, &before, "zero blocks without digests");
    CHECK(ic_journal_record(j, zr, 1, (uint8_t[2]){1, 0}, NULL, &err) < 0 &&
          err.kind == IC_ERR_VALUE, "a data block without its digest");
    CHECK(ic_journal_record(j, zr, 1, NULL, NULL, &err) < 0 && err.kind == IC_ERR_VALUE,
          "blocks without their kinds");
    verify(j, &before, "after refused records");
    /* empty ranges are skipped; nothing at all is no record */
    struct ic_range empty[] = {{0, 0}, {SIZE, 0}};
    uint64_t len = file_size(jpath);
    sync_ok(j, "the zeros");
    len = file_size(jpath);
    CHECK(ic_journal_record(j, empty, 2, NULL, NULL, &err) == 0, "empty: %s", err.msg);
    sync_ok(j, "nothing");
    CHECK(file_size(jpath) == len, "an empty record was written");
    ic_journal_close(j);
    j = open_ok(&id, 1, "reopened with the zeros");
    verify(j, &before, "reopened with the zeros");
    ic_journal_close(j);
    model_free(&before);
    model_free(&m);
    printf("  round trip: ok\n");
}

static void test_no_digests(void)
{
    remove_journal();
    struct ic_journal_identity id = ident();
    id.algorithm = NULL;
    id.digest_size = 0;
    id.block_size = 512;
    struct model m;
    model_init(&m, &id);
    struct ic_error err = {0};
    struct ic_journal *j = open_ok(&id, 0, "no digests");
    struct ic_range a[] = {{512, 1024}, {SIZE - 100, 100}, {0, 512}, {4096, 512}};
    CHECK(ic_journal_record(j, a, 4, NULL, NULL, &err) == 0, "record: %s", err.msg);
    for (size_t i = 0; i < 4; i++)
        for (uint64_t o = a[i].offset; o < a[i].offset + a[i].length; o += 512)
            m.state[o / 512] = 2;
    verify(j, &m, "no digests");
    sync_ok(j, "no digests");
    ic_journal_close(j);
    j = open_ok(&id, 1, "no digests reopened");
    verify(j, &m, "no digests reopened");
    ic_journal_close(j);
    model_free(&m);
    printf("  without digests: ok\n");
}

static void expect_mismatch(const struct ic_journal_identity *id, const char *field,
                            const char *theirs, const char *ours)
{
    struct ic_journal *j = NULL;
    struct ic_error err = {0};
    CHECK(ic_journal_open(jpath, id, &j, &err) < 0 && !j, "%s: a different journal opened",
          field);
    CHECK(err.kind == IC_ERR_VALUE, "%s: kind %d: %s", field, err.kind, err.msg);
    char f[64];
    snprintf(f, sizeof f, "its %s is", field);
    CHECK(strstr(err.msg, f) && strstr(err.msg, theirs) && strstr(err.msg, ours),
          "%s: the message names neither the field nor both values: %s", field, err.msg);
}

static void test_identity(void)
{
    remove_journal();
    struct ic_journal_identity id = ident();
    struct ic_journal *j = open_ok(&id, 0, "identity");
    struct ic_error err = {0};
    struct model m;
    model_init(&m, &id);
    struct ic_range a[] = {{0, BS}};
    CHECK(record(j, &m, a, 1, 1, 0, &err) == 0, "record: %s", err.msg);
    sync_ok(j, "identity");
    ic_journal_close(j);

    struct ic_journal_identity x;
    x = ident();
    x.source = "raw:/images/other.raw";
    expect_mismatch(&x, "source", "src.raw", "other.raw");
    /* a long text that differs at its end: the message shows where */
    char longer[600];
    snprintf(longer, sizeof longer, "raw:/%0400d/src.raw dev=64769,ino=1234,size=41060,"
             "mtime=1700000000.5", 0);
    x.source = longer;
    expect_mismatch(&x, "source", "...", "/src.raw dev=");
    x = ident();
    x.source = "raw:/images/src.raw dev=64769,ino=1234,size=41060,mtime=1700000099.5";
    expect_mismatch(&x, "source", "mtime=1700000000.5", "mtime=1700000099.5");
    x = ident();
    x.destination = "nbd+unix:///?socket=/tmp/s";
    expect_mismatch(&x, "destination", "dst.raw", "nbd+unix");
    x = ident();
    x.options = "sparse_threshold=0 format=raw";
    expect_mismatch(&x, "options", "sparse_threshold=4096", "sparse_threshold=0");
    x = ident();
    x.algorithm = "sha512";
    x.digest_size = 64;
    expect_mismatch(&x, "digest algorithm", "sha256", "sha512");
    x = ident();
    x.algorithm = NULL;
    x.digest_size = 0;
    expect_mismatch(&x, "digest algorithm", "sha256", "none");
    x = ident();
    x.size = SIZE + 1;
    expect_mismatch(&x, "size", "41060", "41061");
    x = ident();
    x.block_size = 2 * BS;
    expect_mismatch(&x, "block size", "4096", "8192");
    x = ident();
    x.algorithm = "sha256";
    x.digest_size = 16;
    expect_mismatch(&x, "digest size", "32", "16");
    /* bytes that cannot be shown are escaped */
    x = ident();
    x.options = "sparse_threshold=4096\nformat=raw";
    expect_mismatch(&x, "options", "4096 format", "4096\\x0aformat");
    /* the refused journal is untouched */
    j = open_ok(&id, 1, "after the refusals");
    verify(j, &m, "after the refusals");
    ic_journal_close(j);

    /* identities that are not valid at all */
    struct ic_journal_identity bad[4];
    for (int i = 0; i < 4; i++)
        bad[i] = ident();
    bad[0].block_size = 0;
    bad[1].digest_size = 0;
    bad[2].algorithm = NULL;
    bad[3].algorithm = "";
    for (int i = 0; i < 4; i++) {
        CHECK(ic_journal_open(jpath, &bad[i], &j, &err) < 0 && err.kind == IC_ERR_VALUE,
              "bad identity %d accepted", i);
    }
    model_free(&m);
    printf("  identities: ok\n");
}

/* A journal of three synced records; boundaries[i]: where record i starts
 * (boundaries[3]: the file's end); models[i]: the state after i records */
static void three_records(uint64_t boundaries[4], struct model models[4])
{
    remove_journal();
    struct ic_journal_identity id = ident();
    for (int i = 0; i < 4; i++)
        model_init(&models[i], &id);
    struct ic_journal *j = open_ok(&id, 0, "three");
    struct ic_error err = {0};
    struct ic_range r[3][2] = {{{0, 4 * BS}, {8 * BS, BS}},
                               {{2 * BS, 4 * BS}, {10 * BS, 100}},
                               {{5 * BS, 3 * BS}, {0, BS}}};
    for (int i = 0; i < 3; i++) {
        boundaries[i] = file_size(jpath);
        CHECK(record(j, &models[3], r[i], 2, (uint64_t)i + 1, 2, &err) == 0, "record: %s",
              err.msg);
        sync_ok(j, "three");
        model_copy(&models[i + 1], &models[3]);
    }
    boundaries[3] = file_size(jpath);
    ic_journal_close(j);
}

static void test_torn_tails(void)
{
    uint64_t at[4];
    struct model models[4];
    three_records(at, models);
    size_t n;
    uint8_t *whole = read_file(jpath, &n);
    struct ic_journal_identity id = ident();
    struct ic_error err = {0};
    /* the last record cut at each byte: the first two remain; appending
     * cuts the tail first */
    for (uint64_t cut = at[2]; cut < at[3]; cut++) {
        write_file(jpath, whole, (size_t)cut);
        struct ic_journal *j = open_ok(&id, 1, "torn");
        verify(j, &models[2], "torn");
        if (cut % 5 == 0 || cut == at[3] - 1) {
            struct model m;
            model_init(&m, &id);
            model_copy(&m, &models[2]);
            struct ic_range r[] = {{3 * BS, 2 * BS}};
            CHECK(record(j, &m, r, 1, 77, 2, &err) == 0, "record: %s", err.msg);
            sync_ok(j, "after a torn tail");
            ic_journal_close(j);
            CHECK(file_size(jpath) > at[2] && file_size(jpath) < at[3] + 200,
                  "the torn tail was not cut: %llu", (unsigned long long)file_size(jpath));
            j = open_ok(&id, 1, "appended after a torn tail");
            verify(j, &m, "appended after a torn tail");
            model_free(&m);
        }
        ic_journal_close(j);
    }
    /* the last record's pages lost: zeros in its place, the size kept */
    uint8_t *b = malloc(n + 8192);
    memcpy(b, whole, n);
    memset(b + at[2] + 20, 0, at[3] - at[2] - 20);
    write_file(jpath, b, n);
    struct ic_journal *j = open_ok(&id, 1, "zeroed last record");
    verify(j, &models[2], "zeroed last record");
    ic_journal_close(j);
    memset(b + at[2], 0, at[3] - at[2]);
    write_file(jpath, b, n);
    j = open_ok(&id, 1, "zeroed last record and header");
    verify(j, &models[2], "zeroed last record and header");
    ic_journal_close(j);
    /* a size that grew before the data: zeros after the last record */
    memcpy(b, whole, n);
    memset(b + n, 0, 8192);
    write_file(jpath, b, n + 8192);
    j = open_ok(&id, 1, "zeros after");
    verify(j, &models[3], "zeros after");
    ic_journal_close(j);
    /* and garbage, with no whole record in it */
    for (size_t i = 0; i < 8192; i++)
        b[n + i] = (uint8_t)mix(i);
    write_file(jpath, b, n + 8192);
    j = open_ok(&id, 1, "garbage after");
    verify(j, &models[3], "garbage after");
    ic_journal_close(j);
    free(b);
    free(whole);
    for (int i = 0; i < 4; i++)
        model_free(&models[i]);
    printf("  torn tails at %llu offsets: ok\n", (unsigned long long)(at[3] - at[2]));
}

static void expect_corrupt(const char *what, const char *needle)
{
    struct ic_journal_identity id = ident();
    struct ic_journal *j = NULL;
    struct ic_error err = {0};
    CHECK(ic_journal_open(jpath, &id, &j, &err) < 0 && !j, "%s: opened", what);
    CHECK(err.kind == IC_ERR_FORMAT, "%s: kind %d: %s", what, err.kind, err.msg);
    CHECK(strstr(err.msg, needle), "%s: '%s' not in: %s", what, needle, err.msg);
}

static void test_middle_damage(void)
{
    uint64_t at[4];
    struct model models[4];
    three_records(at, models);
    size_t n;
    uint8_t *whole = read_file(jpath, &n);
    uint8_t *b = malloc(n);
    /* a bit flipped anywhere in the header or the first two records */
    for (uint64_t i = 0; i < at[2]; i++) {
        memcpy(b, whole, n);
        b[i] ^= (uint8_t)(1u << (i % 8));
        write_file(jpath, b, n);
        char what[64];
        snprintf(what, sizeof what, "byte %llu flipped", (unsigned long long)i);
        expect_corrupt(what, i < 8 ? "not an imgcopy journal" : "corrupt journal");
    }
    /* a record zeroed in the middle */
    memcpy(b, whole, n);
    memset(b + at[1], 0, at[2] - at[1]);
    write_file(jpath, b, n);
    expect_corrupt("middle record zeroed", "records follow it");
    /* an unknown version, the magic gone */
    memcpy(b, whole, n);
    b[8] = 2;
    write_file(jpath, b, n);
    expect_corrupt("version 2", "unsupported version 2");
    write_file(jpath, (const uint8_t *)"just some text that is no journal\n", 35);
    expect_corrupt("text", "not an imgcopy journal");
    free(b);
    free(whole);
    for (int i = 0; i < 4; i++)
        model_free(&models[i]);
    printf("  damage in the middle refused at %llu offsets: ok\n", (unsigned long long)at[2]);
}

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
    put32(p, (uint32_t)v);
    put32(p + 4, (uint32_t)(v >> 32));
}

/* The file: the header of an empty journal, then one record of `payload`
 * (written here, its checksums right) */
static void craft(const uint8_t *payload, size_t len, const char *what)
{
    remove_journal();
    struct ic_journal_identity id = ident();
    struct ic_journal *j = open_ok(&id, 0, what);
    ic_journal_close(j);
    size_t h;
    uint8_t *head = read_file(jpath, &h);
    uint8_t *b = malloc(h + 16 + len);
    memcpy(b, head, h);
    put64(b + h, len);
    put32(b + h + 8, (uint32_t)crc32(0, payload, (uInt)len));
    put32(b + h + 12, (uint32_t)crc32(0, b + h, 12));
    memcpy(b + h + 16, payload, len);
    write_file(jpath, b, h + 16 + len);
    free(b);
    free(head);
}

static void hostile(const uint8_t *payload, size_t len, const char *what, const char *needle)
{
    craft(payload, len, what);
    expect_corrupt(what, needle);
}

static void test_hostile_records(void)
{
    uint8_t p[256];
    /* one range: offset, length, then 1 bitmap byte and digests */
#define RANGE(off, len)                                                                    \
    do {                                                                                   \
        memset(p, 0, sizeof p);                                                            \
        put32(p, 1);                                                                       \
        put64(p + 8, off);                                                                 \
        put64(p + 16, len);                                                                \
    } while (0)
    RANGE(0, BS);
    p[24] = 1; /* a zero block: nothing else */
    craft(p, 25, "a valid record");
    struct ic_journal_identity id = ident();
    struct ic_journal *j = NULL;
    struct ic_error err = {0};
    CHECK(ic_journal_open(jpath, &id, &j, &err) == 0, "the valid hand-made record: %s", err.msg);
    int zero = 0;
    uint8_t d[DS];
    CHECK(ic_journal_block(j, 0, &zero, d) == 1 && zero == 1, "hand-made zero block");
    ic_journal_close(j);

    RANGE(0, BS);
    p[24] = 1;
    put32(p + 4, 1);
    hostile(p, 25, "flags", "unknown flags");
    RANGE(0, BS);
    put32(p, 0);
    hostile(p, 25, "no ranges", "0 ranges");
    RANGE(0, BS);
    put32(p, 0x10000000);
    hostile(p, 25, "many ranges", "ranges in");
    RANGE(1, BS);
    p[24] = 1;
    hostile(p, 25, "misaligned", "range 1+4096");
    RANGE(0, 0);
    hostile(p, 25, "empty range", "range 0+0");
    RANGE(SIZE - 100, 200);
    p[24] = 1;
    hostile(p, 25, "past the end", "range");
    RANGE(UINT64_MAX - BS + 1, BS);
    p[24] = 1;
    hostile(p, 25, "overflowing", "range");
    RANGE(0, 3 * BS);
    p[24] = 0x0f; /* bit 3: past the record's 3 blocks */
    hostile(p, 25, "bits past", "bits set past");
    RANGE(0, BS);
    hostile(p, 25 + DS - 1, "a digest cut short", "digest bytes");
    RANGE(0, BS);
    hostile(p, 25 + DS + 1, "a digest too long", "digest bytes");
    RANGE(0, 10 * BS);
    hostile(p, 24, "no bitmap", "more blocks");
    RANGE(0, 10 * BS);
    p[24] = 0xff;
    hostile(p, 25, "bitmap cut", "more blocks");
    printf("  hostile records refused: ok\n");
#undef RANGE
}

static void test_creation(void)
{
    struct ic_journal_identity id = ident();
    /* a creation a crash interrupted: any part of our header, or zeros */
    remove_journal();
    struct ic_journal *j = open_ok(&id, 0, "header");
    ic_journal_close(j);
    size_t h;
    uint8_t *head = read_file(jpath, &h);
    for (size_t cut = 0; cut < h; cut++) {
        write_file(jpath, head, cut);
        j = open_ok(&id, 0, "torn creation");
        ic_journal_close(j);
        CHECK(file_size(jpath) == h, "torn creation at %zu not rewritten", cut);
    }
    uint8_t *z = calloc(1, h);
    memcpy(z, head, 30);
    write_file(jpath, z, h);
    j = open_ok(&id, 0, "header then zeros");
    ic_journal_close(j);
    memset(z, 0, h);
    write_file(jpath, z, 100);
    j = open_ok(&id, 0, "zeros");
    ic_journal_close(j);
    /* a part of another copy's header: refused, not written over */
    write_file(jpath, head, h - 10);
    struct ic_journal_identity other = ident();
    other.options = "sparse_threshold=0";
    struct ic_error err = {0};
    CHECK(ic_journal_open(jpath, &other, &j, &err) < 0 && err.kind == IC_ERR_FORMAT,
          "another copy's torn header: %s", err.msg);
    CHECK(file_size(jpath) == h - 10, "another copy's torn header written over");
    /* a header whose length field is damaged, records after it */
    uint64_t at[4];
    struct model models[4];
    three_records(at, models);
    size_t n;
    uint8_t *whole = read_file(jpath, &n);
    put32(whole + 12, (uint32_t)n + 100);
    write_file(jpath, whole, n);
    expect_corrupt("header length past the end", "corrupt journal header");
    CHECK(file_size(jpath) == n, "a damaged header was written over");
    /* not a regular file, a missing directory, a name that is none */
    snprintf(jpath, sizeof jpath, "%s/sub", dir);
    CHECK(mkdir(jpath, 0755) == 0, "mkdir");
    CHECK(ic_journal_open(jpath, &id, &j, &err) < 0, "a directory opened as a journal");
    CHECK(rmdir(jpath) == 0, "rmdir");
    snprintf(jpath, sizeof jpath, "%s/missing/journal", dir);
    CHECK(ic_journal_open(jpath, &id, &j, &err) < 0 && err.kind == IC_ERR_OS &&
          err.errnum == ENOENT, "a journal in a missing directory: %s", err.msg);
    CHECK(ic_journal_open("/tmp/", &id, &j, &err) < 0 && err.kind == IC_ERR_VALUE,
          "a path ending in /");
    snprintf(jpath, sizeof jpath, "%s/journal", dir);
    free(whole);
    free(z);
    free(head);
    for (int i = 0; i < 4; i++)
        model_free(&models[i]);
    printf("  creation: ok\n");
}

static void test_complete_and_lock(void)
{
    remove_journal();
    struct ic_journal_identity id = ident();
    struct ic_journal *j = open_ok(&id, 0, "complete");
    struct ic_error err = {0};
    /* one journal, one user: a second open (another file description) waits for nobody */
    struct ic_journal *k = NULL;
    CHECK(ic_journal_open(jpath, &id, &k, &err) < 0 && err.kind == IC_ERR_OS &&
          err.errnum == EAGAIN && strstr(err.msg, "in use"), "a second open: %s", err.msg);
    CHECK(access(jpath, F_OK) == 0, "the refused open removed the journal");
    struct model m;
    model_init(&m, &id);
    struct ic_range a[] = {{0, BS}};
    CHECK(record(j, &m, a, 1, 1, 0, &err) == 0, "record: %s", err.msg);
    sync_ok(j, "complete");
    /* a relative path, resolved once: a chdir after opening changes nothing */
    char cwd[4096];
    CHECK(getcwd(cwd, sizeof cwd) != NULL, "getcwd");
    CHECK(ic_journal_complete(j, &err) == 0, "complete: %s", err.msg);
    CHECK(access(jpath, F_OK) < 0 && errno == ENOENT, "the completed journal remains");

    CHECK(chdir(dir) == 0, "chdir");
    struct ic_journal_identity id2 = ident();
    CHECK(ic_journal_open("journal", &id2, &j, &err) == 0, "relative: %s", err.msg);
    CHECK(chdir("/") == 0, "chdir /");
    CHECK(ic_journal_complete(j, &err) == 0, "complete: %s", err.msg);
    CHECK(access(jpath, F_OK) < 0, "the relative journal remains");
    CHECK(chdir(cwd) == 0, "chdir back");
    ic_journal_close(NULL);
    model_free(&m);
    printf("  completion and lock: ok\n");
}

/* Runs as blkhash's sink tells them: refusals, the short last block, and
 * a zero run of 32M blocks (a 2 TiB sparse disk) that costs a bit a block */
static void test_runs(void)
{
    remove_journal();
    struct ic_journal_identity id = ident();
    struct model m;
    model_init(&m, &id);
    struct ic_error err = {0};
    struct ic_journal *j = open_ok(&id, 0, "runs");
    CHECK(record_run(j, &m, 9, 2, 5, 0, &err) == 0, "the last two blocks: %s", err.msg);
    CHECK(record_run(j, &m, 0, 3, 6, 1, &err) == 0, "zeros: %s", err.msg);
    CHECK(record_run(j, &m, 2, 0, 7, 0, &err) == 0, "nothing: %s", err.msg);
    CHECK(ic_journal_record_run(j, NBLK, 1, NULL, &err) < 0 && err.kind == IC_ERR_VALUE,
          "a block past the end");
    CHECK(ic_journal_record_run(j, 5, NBLK, NULL, &err) < 0 && err.kind == IC_ERR_VALUE,
          "a run past the end");
    CHECK(ic_journal_record_run(j, 1, UINT64_MAX, NULL, &err) < 0, "a run that wraps");
    verify(j, &m, "runs");
    sync_ok(j, "runs");
    ic_journal_close(j);
    j = open_ok(&id, 1, "runs reopened");
    verify(j, &m, "runs reopened");
    ic_journal_close(j);
    model_free(&m);

    remove_journal();
    id.size = (uint64_t)1 << 41;
    id.block_size = 64 << 10;
    uint64_t nb = id.size / id.block_size;
    j = open_ok(&id, 0, "2 TiB");
    double c0 = cpu();
    CHECK(ic_journal_record_run(j, 0, nb - 1, NULL, &err) == 0, "a zero run: %s", err.msg);
    uint8_t d[DS];
    digest_of(1, nb - 1, d, DS);
    CHECK(ic_journal_record_run(j, nb - 1, 1, d, &err) == 0, "the last block: %s", err.msg);
    sync_ok(j, "2 TiB");
    ic_journal_close(j);
    uint64_t fsize = file_size(jpath);
    CHECK(fsize < (nb / 8) + 4096, "%llu bytes for a zero run of %llu blocks",
          (unsigned long long)fsize, (unsigned long long)nb);
    j = open_ok(&id, 1, "2 TiB reopened");
    uint64_t count;
    int zero;
    const uint8_t *dp;
    CHECK(ic_journal_run(j, 0, &count, &zero, &dp) == 1 && zero && count == nb - 1,
          "the zero run: %llu blocks", (unsigned long long)count);
    CHECK(ic_journal_run(j, 12345, &count, &zero, &dp) == 1 && zero && count == nb - 1 - 12345,
          "inside the zero run");
    CHECK(ic_journal_run(j, nb - 1, &count, &zero, &dp) == 1 && !zero && count == 1 &&
          memcmp(dp, d, DS) == 0, "the last block");
    double c1 = cpu();
    ic_journal_close(j);
    printf("  runs; a 2 TiB zero run in a %llu-byte journal, recorded and read back in %.2f s "
           "CPU: ok\n", (unsigned long long)fsize, c1 - c0);
}

/* Random records (overlapping, any order, some not synced before a
 * reopen) against the model, with and without digests */
static void test_random(void)
{
    for (int variant = 0; variant < 3; variant++) {
        struct ic_journal_identity id = ident();
        if (variant == 1) {
            id.algorithm = NULL;
            id.digest_size = 0;
        } else if (variant == 2) {
            id.algorithm = "tiny";
            id.digest_size = 1;
            id.block_size = 2;
            id.size = 601;
        }
        for (int round = 0; round < 40; round++) {
            rng_state = (uint64_t)round * 1000 + (uint64_t)variant;
            remove_journal();
            struct model m, durable;
            model_init(&m, &id);
            model_init(&durable, &id);
            struct ic_error err = {0};
            struct ic_journal *j = open_ok(&id, 0, "random");
            int nrec = 1 + (int)rnd(30);
            for (int r = 0; r < nrec; r++) {
                struct ic_range rs[6];
                size_t n = 1 + (size_t)rnd(6);
                for (size_t i = 0; i < n; i++) {
                    uint64_t b0 = rnd(m.nblocks), c = 1 + rnd(m.nblocks - b0 < 12 ? m.nblocks - b0 : 12);
                    uint64_t end = (b0 + c) * m.bs < m.size ? (b0 + c) * m.bs : m.size;
                    rs[i] = (struct ic_range){b0 * m.bs, end - b0 * m.bs};
                }
                uint64_t tag = (uint64_t)(round * 100 + r + 1);
                if (rnd(3) == 0) { /* a run as blkhash's sink tells it */
                    uint64_t b0 = rnd(m.nblocks), c = 1 + rnd(m.nblocks - b0);
                    CHECK(record_run(j, &m, b0, c, tag, (int)rnd(2), &err) == 0,
                          "record_run: %s", err.msg);
                } else {
                    CHECK(record(j, &m, rs, n, tag, (int)rnd(4), &err) == 0, "record: %s",
                          err.msg);
                }
                verify(j, &m, "random, recorded");
                switch (rnd(4)) {
                case 0:
                    sync_ok(j, "random");
                    model_copy(&durable, &m);
                    break;
                case 1: /* closed without a sync: back to what was durable */
                    ic_journal_close(j);
                    j = open_ok(&id, 1, "random, reopened");
                    model_copy(&m, &durable);
                    verify(j, &m, "random, reopened");
                    break;
                default:
                    break;
                }
            }
            sync_ok(j, "random, last");
            ic_journal_close(j);
            j = open_ok(&id, 1, "random, at the end");
            verify(j, &m, "random, at the end");
            ic_journal_close(j);
            model_free(&m);
            model_free(&durable);
        }
    }
    printf("  random records against the model: ok\n");
}

static void test_million_blocks(void)
{
    remove_journal();
    struct ic_journal_identity id = ident();
    const uint64_t nblocks = 1u << 20;
    id.size = nblocks * BS;
    struct ic_error err = {0};
    struct ic_journal *j = open_ok(&id, 0, "million");
    enum { PER = 1000 };
    uint8_t *flags = malloc(PER);
    uint8_t *dig = malloc((size_t)PER * DS);
    double t0 = now();
    /* in order of a copy with a few threads: records a little out of order */
    uint64_t nrec = (nblocks + PER - 1) / PER;
    for (uint64_t r = 0; r < nrec; r++) {
        uint64_t rr = r ^ 1; /* neighbours swapped */
        if (rr >= nrec)
            rr = r;
        uint64_t first = rr * PER, c = nblocks - first < PER ? nblocks - first : PER;
        size_t nd = 0;
        for (uint64_t b = 0; b < c; b++) {
            flags[b] = mix(first + b) % 4 == 0;
            if (!flags[b])
                digest_of(0, first + b, dig + DS * nd++, DS);
        }
        struct ic_range rg = {first * BS, c * BS};
        CHECK(ic_journal_record(j, &rg, 1, flags, dig, &err) == 0, "record: %s", err.msg);
        if (r % 100 == 99)
            sync_ok(j, "million");
    }
    sync_ok(j, "million");
    double t1 = now();
    ic_journal_close(j);
    double c1 = cpu();
    j = open_ok(&id, 1, "million, reopened");
    double t2 = now(), c2 = cpu();
    size_t nd;
    const struct ic_range *done = ic_journal_done(j, &nd);
    CHECK(nd == 1 && done[0].offset == 0 && done[0].length == id.size, "done: %zu ranges", nd);
    uint8_t got[DS], want[DS];
    /* the lookups alone, timed: in order and at random */
    uint64_t found = 0;
    for (int pass = 0; pass < 2; pass++)
        for (uint64_t i = 0; i < nblocks; i++) {
            int zero;
            found += ic_journal_block(j, pass ? mix(i) % nblocks : i, &zero, got);
        }
    CHECK(found == 2 * nblocks, "%llu found", (unsigned long long)found);
    double t3 = now(), c3 = cpu();
    for (int pass = 0; pass < 2; pass++) {
        for (uint64_t i = 0; i < nblocks; i++) {
            uint64_t b = pass ? mix(i) % nblocks : i;
            int zero = -1;
            CHECK(ic_journal_block(j, b, &zero, got) == 1, "block %llu", (unsigned long long)b);
            CHECK(zero == (mix(b) % 4 == 0), "block %llu zero", (unsigned long long)b);
            if (!zero) {
                digest_of(0, b, want, DS);
                CHECK(memcmp(got, want, DS) == 0, "block %llu digest", (unsigned long long)b);
            }
        }
    }
    ic_journal_close(j);
    printf("  a million blocks: recorded in %.2f s, %llu bytes, reopened in %.2f s "
           "(%.2f s CPU), 2M lookups in %.2f s (%.2f s CPU)\n", t1 - t0,
           (unsigned long long)file_size(jpath), t2 - t1, c2 - c1, t3 - t2, c3 - c2);
    /* generous: ASan (about 0.5 s each without it) */
    CHECK(c3 - c2 < 5 && c2 - c1 < 5, "too slow");
    free(flags);
    free(dig);
}

/* The journal a child writes: record k covers blocks [k*PER, (k+1)*PER)
 * of a large disk, its digests from digest_of(k, b) */
#define CRASH_PER 40000u

static struct ic_journal_identity crash_ident(void)
{
    struct ic_journal_identity id = ident();
    id.size = (uint64_t)CRASH_PER * 4096 * BS;
    return id;
}

static void crash_child(int wfd)
{
    struct ic_journal_identity id = crash_ident();
    struct ic_journal *j;
    struct ic_error err;
    if (ic_journal_open(jpath, &id, &j, &err) < 0)
        _exit(2);
    size_t ndone;
    const struct ic_range *done = ic_journal_done(j, &ndone);
    uint64_t k = ndone ? (done[0].offset + done[0].length) / BS / CRASH_PER : 0;
    uint8_t *flags = calloc(CRASH_PER, 1);
    uint8_t *dig = malloc((size_t)CRASH_PER * DS);
    for (;; k++) {
        for (uint64_t b = 0; b < CRASH_PER; b++)
            digest_of(k, k * CRASH_PER + b, dig + DS * b, DS);
        struct ic_range r = {k * CRASH_PER * BS, (uint64_t)CRASH_PER * BS};
        if (ic_journal_record(j, &r, 1, flags, dig, &err) < 0 || ic_journal_sync(j, &err) < 0)
            _exit(3);
        uint64_t synced = k + 1;
        if (write(wfd, &synced, sizeof synced) != sizeof synced)
            _exit(4);
    }
}

static void test_crash(void)
{
    remove_journal();
    struct ic_journal_identity cid = crash_ident();
    ic_journal_close(open_ok(&cid, 0, "crash"));
    uint64_t synced = 0, header = file_size(jpath);
    /* each record: its header, count and flags, one range, the bitmap, the digests */
    const uint64_t rec = 16 + 8 + 16 + CRASH_PER / 8 + (uint64_t)CRASH_PER * DS;
    int torn = 0;
    for (int round = 0; round < 12; round++) {
        int fds[2];
        CHECK(pipe(fds) == 0, "pipe");
        pid_t pid = fork();
        CHECK(pid >= 0, "fork");
        if (pid == 0) {
            close(fds[0]);
            crash_child(fds[1]);
        }
        close(fds[1]);
        /* let it sync a record or two, then kill it: in odd rounds wherever
         * it is, in even ones while the file grows between two records'
         * ends (the write of one under way: the size grows page by page) */
        int wanted = 1 + round % 2;
        for (int i = 0; i < wanted; i++)
            CHECK(read(fds[0], &synced, sizeof synced) == sizeof synced, "child died early");
        if (round % 2) {
            struct timespec ts = {0, (long)(mix((uint64_t)round) % 3000000)};
            nanosleep(&ts, NULL);
        } else {
            double give_up = now() + 5;
            uint64_t fs;
            while (((fs = file_size(jpath)) - header) % rec == 0 && now() < give_up)
                ;
        }
        kill(pid, SIGKILL);
        int status;
        CHECK(waitpid(pid, &status, 0) == pid, "waitpid");
        CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "child ended %#x", status);
        uint64_t more;
        while (read(fds[0], &more, sizeof more) == sizeof more)
            synced = more;
        close(fds[0]);

        struct ic_journal_identity id = crash_ident();
        uint64_t fsize = file_size(jpath);
        struct ic_journal *j = open_ok(&id, 1, "after a kill");
        size_t nd;
        const struct ic_range *done = ic_journal_done(j, &nd);
        CHECK(nd == 1 && done[0].offset == 0, "after a kill: %zu ranges", nd);
        uint64_t recs = done[0].length / BS / CRASH_PER;
        CHECK(done[0].length % ((uint64_t)CRASH_PER * BS) == 0, "a partial record");
        CHECK(recs == synced || recs == synced + 1,
              "%llu records after a kill, %llu reported synced", (unsigned long long)recs,
              (unsigned long long)synced);
        uint8_t got[DS], want[DS];
        for (uint64_t b = 0; b < recs * CRASH_PER; b += 997) {
            int zero = -1;
            CHECK(ic_journal_block(j, b, &zero, got) == 1 && zero == 0, "block %llu",
                  (unsigned long long)b);
            digest_of(b / CRASH_PER, b, want, DS);
            CHECK(memcmp(got, want, DS) == 0, "block %llu digest", (unsigned long long)b);
        }
        ic_journal_close(j);
        CHECK(fsize >= header + recs * rec, "the file is shorter than its records");
        torn += fsize > header + recs * rec;
        synced = recs;
    }
    printf("  12 kills while appending (%d mid-record), %llu records survived: ok\n", torn,
           (unsigned long long)synced);
    CHECK(torn > 0, "no kill landed in the middle of a record");
}

/* A write that fails (the file size limit) sticks, and what was synced
 * before survives */
static void test_write_failure(void)
{
    remove_journal();
    struct ic_journal_identity id = ident();
    struct ic_journal *j = open_ok(&id, 0, "write failure");
    struct ic_error err = {0};
    struct model m;
    model_init(&m, &id);
    struct ic_range a[] = {{0, 2 * BS}};
    CHECK(record(j, &m, a, 1, 1, 0, &err) == 0, "record: %s", err.msg);
    sync_ok(j, "before the failure");
    ic_journal_close(j);
    pid_t pid = fork();
    CHECK(pid >= 0, "fork");
    if (pid == 0) {
        signal(SIGXFSZ, SIG_IGN);
        struct ic_journal *c;
        if (ic_journal_open(jpath, &id, &c, &err) < 0)
            _exit(2);
        struct rlimit rl = {file_size(jpath) + 10, file_size(jpath) + 10};
        if (setrlimit(RLIMIT_FSIZE, &rl) < 0)
            _exit(3);
        struct model mm;
        model_init(&mm, &id);
        struct ic_range b[] = {{4 * BS, 4 * BS}};
        if (record(c, &mm, b, 1, 2, 0, &err) < 0)
            _exit(4);
        if (ic_journal_sync(c, &err) == 0 || err.errnum != EFBIG)
            _exit(5);
        /* it sticks */
        if (ic_journal_record(c, a, 1, (uint8_t[2]){1, 1}, NULL, &err) == 0 ||
            err.errnum != EFBIG || ic_journal_sync(c, &err) == 0 || err.errnum != EFBIG)
            _exit(6);
        ic_journal_close(c);
        model_free(&mm);
        _exit(0);
    }
    int status;
    CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0,
          "the failing child: %#x", status);
    j = open_ok(&id, 1, "after a failed write");
    verify(j, &m, "after a failed write");
    ic_journal_close(j);
    model_free(&m);
    printf("  a failed write sticks, the journal before it survives: ok\n");
}

int main(void)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/imgcopy-journal.XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    CHECK(mkdtemp(dir), "mkdtemp: %s", strerror(errno));
    snprintf(jpath, sizeof jpath, "%s/journal", dir);
    test_round_trip();
    test_no_digests();
    test_identity();
    test_torn_tails();
    test_middle_damage();
    test_hostile_records();
    test_creation();
    test_complete_and_lock();
    test_runs();
    test_random();
    test_million_blocks();
    test_crash();
    test_write_failure();
    remove_journal();
    rmdir(dir);
    printf("test_journal: %lu checks passed\n", check_count);
    return 0;
}
