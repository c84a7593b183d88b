/* blkhash: the published vectors (i14 spec, from libnbd's
 * copy-blkhash-known.sh and blkhash 0.10's blkhash-test.c), and the same
 * content fed in every way a copy may feed it: split anywhere, in any
 * order, zeros as data or as known-zero ranges, by many threads.  A plain
 * block-by-block reference (through the same libcrypto digests) checks the
 * random cases. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blkhash.h"
#include "check.h"

#define KIB 1024u
#define H (32 * KIB)

/* content described as extents: byte value, or '-' for a known-zero range */
struct ext {
    uint64_t len;
    int byte; /* -1: zero range */
};

static uint8_t *build(const struct ext *e, size_t n, uint64_t *size)
{
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += e[i].len;
    uint8_t *buf = calloc(1, total ? total : 1);
    CHECK(buf, "calloc");
    uint64_t pos = 0;
    for (size_t i = 0; i < n; i++) {
        if (e[i].byte > 0)
            memset(buf + pos, e[i].byte, e[i].len);
        pos += e[i].len;
    }
    *size = total;
    return buf;
}

static void hash_exts(const char *alg, uint64_t bs, const struct ext *e, size_t n, char *hex)
{
    uint64_t size;
    uint8_t *buf = build(e, n, &size);
    struct ic_blkhash *h;
    struct ic_error err = {0};
    uint8_t out[IC_DIGEST_MAX];
    CHECK(ic_blkhash_new(alg, bs, size, &h, &err) == 0, "new: %s", err.msg);
    uint64_t pos = 0;
    for (size_t i = 0; i < n; i++) {
        int r = e[i].byte < 0 ? ic_blkhash_zero(h, pos, e[i].len, &err)
                              : ic_blkhash_update(h, pos, buf + pos, e[i].len, &err);
        CHECK(r == 0, "feed: %s", err.msg);
        pos += e[i].len;
    }
    CHECK(ic_blkhash_final(h, out, hex, &err) == 0, "final: %s", err.msg);
    ic_blkhash_free(h);
    free(buf);
}

static void vector(const char *name, const char *alg, uint64_t bs, const struct ext *e, size_t n,
                   const char *want)
{
    char hex[2 * IC_DIGEST_MAX + 1];
    hash_exts(alg, bs, e, n, hex);
    CHECK(strcmp(hex, want) == 0, "%s: got %s want %s", name, hex, want);
}

#define V(name, alg, bs, want, ...)                                                        \
    do {                                                                                   \
        const struct ext e_[] = {__VA_ARGS__};                                             \
        vector(name, alg, bs, e_, sizeof e_ / sizeof e_[0], want);                         \
    } while (0)

static void vectors(void)
{
    /* libnbd copy-blkhash-known.sh */
    vector("empty", "sha256", 65536, NULL, 0,
           "af5570f5a1810b7af78caf4bc70a660f0df51e42baf91d4de5b2328de0e83dfc");
    static const uint8_t hello[] = "hello";
    struct {
        const char *alg;
        uint64_t bs;
        const char *want;
    } hellos[] = {
        {"md5", 65536, "f741ac9ce55f5325906bb14e9c05d467"},
        {"sha256", 65536, "337355feb53a5309d5aba92796223c2c84ffab930e706c01fef573a2722545e6"},
        {"sha512", 65536, "eca04a593cf12ec4132993da709048e25a2f1be3526e132fb521ec9d41f023ec4018b3fd07b014a33e36bb5fa145b36991f431e62f9e1a93bebea6c9565682c1"},
        {"md5", 4, "8262896de34125dec173722c920e8bd0"},
    };
    for (size_t i = 0; i < sizeof hellos / sizeof hellos[0]; i++) {
        struct ic_blkhash *h;
        struct ic_error err = {0};
        uint8_t out[IC_DIGEST_MAX];
        char hex[2 * IC_DIGEST_MAX + 1];
        CHECK(ic_blkhash_new(hellos[i].alg, hellos[i].bs, 5, &h, &err) == 0, "%s", err.msg);
        CHECK(ic_blkhash_update(h, 0, hello, 5, &err) == 0, "%s", err.msg);
        CHECK(ic_blkhash_final(h, out, hex, &err) == 0, "%s", err.msg);
        CHECK(strcmp(hex, hellos[i].want) == 0, "hello %s/%llu: %s", hellos[i].alg,
              (unsigned long long)hellos[i].bs, hex);
        ic_blkhash_free(h);
    }
    /* "hello" @1048576 "goodbye": the gap as a zero range */
    {
        struct ic_blkhash *h;
        struct ic_error err = {0};
        uint8_t out[IC_DIGEST_MAX];
        char hex[2 * IC_DIGEST_MAX + 1];
        CHECK(ic_blkhash_new("sha256", 65536, 1048583, &h, &err) == 0, "%s", err.msg);
        CHECK(ic_blkhash_update(h, 1048576, "goodbye", 7, &err) == 0, "%s", err.msg);
        CHECK(ic_blkhash_zero(h, 5, 1048576 - 5, &err) == 0, "%s", err.msg);
        CHECK(ic_blkhash_update(h, 0, hello, 5, &err) == 0, "%s", err.msg);
        CHECK(ic_blkhash_final(h, out, hex, &err) == 0, "%s", err.msg);
        CHECK(!strcmp(hex, "61b8f3a8cea76e16eeff7ce27f1b7711c1f1e437f5038cec17773772a4bded28"),
              "hello-goodbye: %s", hex);
        ic_blkhash_free(h);
    }
    {
        uint8_t *buf = malloc(1048576);
        CHECK(buf, "malloc");
        for (size_t i = 0; i < 1048576; i++)
            buf[i] = (uint8_t)('1' + i % 8);
        struct {
            const char *alg;
            uint64_t bs;
            const char *want;
        } c[] = {
            {"md5", 65536, "84fc21ac2f49ac283ff399378d834d1a"},
            {"sha256", 65536, "cbb388edd25e567b85f504c7b345497f9fb4f6bbf4e39768809184b9f9e678f8"},
            {"sha512", 524288, "379f7eb1628058c7abbc4c96941ac972074815ea9ef4aca95eefb2b4f9c29f64023fff8d966e9fddf08d07bdba548e75298917f10268fdf9ba636c2321a2214e"},
        };
        for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
            struct ic_blkhash *h;
            struct ic_error err = {0};
            uint8_t out[IC_DIGEST_MAX];
            char hex[2 * IC_DIGEST_MAX + 1];
            CHECK(ic_blkhash_new(c[i].alg, c[i].bs, 1048576, &h, &err) == 0, "%s", err.msg);
            CHECK(ic_blkhash_update(h, 0, buf, 1048576, &err) == 0, "%s", err.msg);
            CHECK(ic_blkhash_final(h, out, hex, &err) == 0, "%s", err.msg);
            CHECK(!strcmp(hex, c[i].want), "12345678 %s: %s", c[i].alg, hex);
            ic_blkhash_free(h);
        }
        free(buf);
    }
    /* blkhash 0.10 blkhash-test.c (sha256, 64 KiB blocks) */
    const char *B64 = "2e3a5f57d5e726ee5de62db1a85ff816f4fa6ea4627807d9a51bdc4c883e165e";
    V("block_data", "sha256", 65536, B64, {65536, 'A'});
    const char *Z64 = "8ab067ab7939a3d4f40cbb118956c07c06aeae2d075d6e0a2ebbb94bd42832af";
    V("block_data_zero", "sha256", 65536, Z64, {65536, 0});
    V("block_zero", "sha256", 65536, Z64, {65536, -1});
    V("partial_block_data", "sha256", 65536,
      "9467334d6d7668a2f06898185b5cddc78cdfbd962f50c6bf250101f03a0e54dc", {H, 'A'});
    const char *PZ = "842d185f0ff348b0d689e184bddc47f69a19032a6934c89b879479f1e86f9d56";
    V("partial_block_data_zero", "sha256", 65536, PZ, {H, 0});
    V("partial_block_zero", "sha256", 65536, PZ, {H, -1});
    const char *S8 = "722ac11a3a81034edf196aa3ee68d1a2e345cd0838b0c78c2ce2fb015d4d817d";
    V("sparse", "sha256", 65536, S8, {8 * 65536, -1});
    V("zero", "sha256", 65536, S8, {8 * 65536, 0});
    V("sparse_large", "sha256", 65536,
      "c6d6562c3074a2caa0ceea3e1f460f3af678c792ed05e64157eb51e68ae5260d", {1ull << 30, -1});
    const char *SU = "e623a5702b1feb08fbb3d18e35bbb7ec10146b8cd1bcff811200a3948c78c55c";
    V("sparse_unaligned", "sha256", 65536, SU, {8 * 65536 + H, -1});
    V("zero_unaligned", "sha256", 65536, SU, {8 * 65536 + H, 0});
    V("full", "sha256", 65536, "4ab1586084326f5beb911621282e9557cd26856105eff7f78cace5986af4738b",
      {H, 'A'}, {H, 'B'}, {H, 'C'}, {H, 'D'}, {H, 'E'}, {H, 'F'});
    V("full_unaligned", "sha256", 65536,
      "2cad558b3a2a8d87435e80fe7bae69fa664d92eaa1b9411f573b9fbb412a4d43", {H, 'A'}, {H, 'B'},
      {H, 'C'}, {H, 'D'}, {H, 'E'});
    V("mix", "sha256", 65536, "4b2b5acd96f8105f4fb26abaf35c7c5756338ef9ccce19ffe7714c9ad94b4398",
      {H, 'A'}, {H, -1}, {H, -1}, {H, 0}, {H, 'E'}, {H, -1}, {H, -1}, {H, 0});
    V("mix_unaligned", "sha256", 65536,
      "2510ac29c7103f2e68c672d728cbd43db4ed3dc809a24cde96e62dc5862a0f57", {H, 'A'}, {H, -1},
      {H, -1}, {H, 0}, {H, 'E'}, {H, -1}, {H, -1});
}

/* ---- random feeding against a block-by-block reference ----------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static void reference(const char *alg, uint64_t bs, const uint8_t *buf, uint64_t size, char *hex)
{
    struct ic_error err = {0};
    const struct ic_digest *d = ic_digest_lookup(alg, &err);
    CHECK(d, "%s", err.msg);
    struct ic_digest_ctx *inner = ic_digest_ctx_new(d, &err), *outer = ic_digest_ctx_new(d, &err);
    CHECK(inner && outer, "ctx");
    CHECK(ic_digest_begin(outer, &err) == 0, "begin");
    uint8_t dig[IC_DIGEST_MAX];
    for (uint64_t pos = 0; pos < size; pos += bs) {
        uint64_t len = size - pos < bs ? size - pos : bs;
        CHECK(ic_digest_once(inner, buf + pos, len, dig, &err) == 0, "once");
        CHECK(ic_digest_add(outer, dig, ic_digest_size(d), &err) == 0, "add");
    }
    uint8_t le[8];
    for (int k = 0; k < 8; k++)
        le[k] = (uint8_t)(size >> (8 * k));
    CHECK(ic_digest_add(outer, le, 8, &err) == 0, "add");
    CHECK(ic_digest_end(outer, dig, &err) == 0, "end");
    ic_digest_hex(dig, ic_digest_size(d), hex);
    ic_digest_ctx_free(inner);
    ic_digest_ctx_free(outer);
}

/* A piece of the stream, fed as data or (when all zeros) maybe as a zero range. */
struct chunk {
    uint64_t off, len;
    int as_zero;
};

struct feeder {
    struct ic_blkhash *h;
    const uint8_t *buf;
    struct chunk *chunks;
    size_t n, first, step; /* this thread feeds chunks first, first+step, ... */
    int ok;
};

static void *feed_thread(void *arg)
{
    struct feeder *f = arg;
    struct ic_error err = {0};
    f->ok = 1;
    for (size_t k = f->first; k < f->n; k += f->step) {
        const struct chunk *c = &f->chunks[k];
        int r = c->as_zero ? ic_blkhash_zero(f->h, c->off, c->len, &err)
                           : ic_blkhash_update(f->h, c->off, f->buf + c->off, c->len, &err);
        if (r < 0)
            f->ok = 0;
    }
    return NULL;
}

static void random_case(int round)
{
    static const char *algs[] = {"sha256", "sha1", "md5", "blake2b", "sha512", "sha3_256"};
    const char *alg = algs[round % 6];
    uint64_t bs = (uint64_t)2 << (rnd() % 17); /* 2 B .. 128 KiB */
    if (round % 5 == 0)
        bs = 6 * 1024 + 2 * (rnd() % 100); /* not a power of two */
    uint64_t size = rnd() % (1u << 20);
    if (bs < 512)
        size %= 64 * KIB; /* tiny blocks: many of them, a small image */
    if (round % 7 == 0)
        size = (size / bs) * bs; /* whole blocks */
    uint8_t *buf = calloc(1, size ? size : 1);
    CHECK(buf, "calloc");
    /* data islands in zeros */
    for (uint64_t pos = 0; pos < size;) {
        uint64_t len = 1 + rnd() % (200 * 1024);
        if (len > size - pos)
            len = size - pos;
        if (rnd() % 2)
            for (uint64_t k = 0; k < len; k++)
                buf[pos + k] = (uint8_t)(rnd() % 4 ? rnd() : 0);
        pos += len;
    }
    char want[2 * IC_DIGEST_MAX + 1], got[2 * IC_DIGEST_MAX + 1];
    reference(alg, bs, buf, size, want);

    /* random chunks; zero-only chunks fed as zero ranges half the time */
    size_t cap = 16, n = 0;
    struct chunk *chunks = malloc(cap * sizeof *chunks);
    CHECK(chunks, "malloc");
    for (uint64_t pos = 0; pos < size;) {
        uint64_t span = rnd() % 2 ? 3 * bs : 300 * 1024; /* sequenced: reproducible */
        uint64_t len = 1 + rnd() % span;
        if (len > size - pos)
            len = size - pos;
        if (n == cap) {
            cap *= 2;
            chunks = realloc(chunks, cap * sizeof *chunks);
            CHECK(chunks, "realloc");
        }
        int zero = 1;
        for (uint64_t k = 0; k < len && zero; k++)
            zero = buf[pos + k] == 0;
        chunks[n++] = (struct chunk){pos, len, zero && rnd() % 2};
        pos += len;
    }
    /* shuffle, unless a round keeps the order */
    if (round % 3)
        for (size_t k = n; k > 1; k--) {
            size_t j = rnd() % k;
            struct chunk t = chunks[k - 1];
            chunks[k - 1] = chunks[j];
            chunks[j] = t;
        }
    struct ic_blkhash *h;
    struct ic_error err = {0};
    uint8_t out[IC_DIGEST_MAX];
    CHECK(ic_blkhash_new(alg, bs, size, &h, &err) == 0, "new: %s", err.msg);
    size_t nthreads = 1 + round % 4;
    pthread_t th[4];
    struct feeder f[4];
    for (size_t t = 0; t < nthreads; t++) {
        f[t] = (struct feeder){h, buf, chunks, n, t, nthreads, 0};
        CHECK(pthread_create(&th[t], NULL, feed_thread, &f[t]) == 0, "pthread_create");
    }
    for (size_t t = 0; t < nthreads; t++) {
        pthread_join(th[t], NULL);
        CHECK(f[t].ok, "round %d: feeding failed", round);
    }
    CHECK(ic_blkhash_final(h, out, got, &err) == 0, "round %d final: %s", round, err.msg);
    CHECK(!strcmp(got, want), "round %d (%s, block %llu, size %llu, %zu chunks, %zu threads): "
          "got %s want %s", round, alg, (unsigned long long)bs, (unsigned long long)size, n,
          nthreads, got, want);
    ic_blkhash_free(h);
    free(chunks);
    free(buf);
}

/* ---- block digests out (the sink) and in (put_digests, start_at) ------- */

struct collected {
    uint8_t *digests; /* per block */
    unsigned char *seen;
    size_t dsize;
    const uint8_t *zero; /* Z */
};

static void collect(void *ctx, uint64_t first, uint64_t count, const uint8_t *digests)
{
    struct collected *c = ctx;
    for (uint64_t i = 0; i < count; i++) {
        memcpy(c->digests + (first + i) * c->dsize, digests ? digests + i * c->dsize : c->zero,
               c->dsize);
        c->seen[first + i]++;
    }
}

static void digests_round(int round)
{
    uint64_t bs = 4096 << (round % 4), size = 1 + rnd() % (3u << 20);
    uint64_t nblocks = (size + bs - 1) / bs;
    uint8_t *buf = calloc(1, size);
    CHECK(buf, "calloc");
    for (uint64_t pos = 0; pos < size; pos += 1 + rnd() % (2 * bs))
        buf[pos] = (uint8_t)(1 + rnd() % 255);
    char want[2 * IC_DIGEST_MAX + 1], got[2 * IC_DIGEST_MAX + 1];
    reference("sha256", bs, buf, size, want);
    struct ic_error err = {0};
    struct ic_blkhash *h;
    uint8_t out[IC_DIGEST_MAX];
    CHECK(ic_blkhash_new("sha256", bs, size, &h, &err) == 0, "%s", err.msg);
    struct collected all = {calloc(nblocks, 32), calloc(nblocks, 1), 32,
                            ic_blkhash_zero_digest(h)};
    CHECK(all.digests && all.seen, "calloc");
    ic_blkhash_set_sink(h, collect, &all);
    /* zeros fed as zero ranges where a whole block is zero */
    for (uint64_t b = 0; b < nblocks; b++) {
        uint64_t off = b * bs, len = size - off < bs ? size - off : bs;
        int zero = 1;
        for (uint64_t k = 0; k < len && zero; k++)
            zero = buf[off + k] == 0;
        CHECK((zero ? ic_blkhash_zero(h, off, len, &err)
                    : ic_blkhash_update(h, off, buf + off, len, &err)) == 0, "%s", err.msg);
    }
    CHECK(ic_blkhash_final(h, out, got, &err) == 0 && !strcmp(got, want), "round %d: sink run",
          round);
    for (uint64_t b = 0; b < nblocks; b++)
        CHECK(all.seen[b] == 1, "round %d: block %llu told %u times", round,
              (unsigned long long)b, all.seen[b]);
    ic_blkhash_free(h);

    /* a resume: the first blocks' digests handed in, the rest fed */
    uint64_t split = nblocks ? rnd() % nblocks : 0;
    CHECK(ic_blkhash_new("sha256", bs, size, &h, &err) == 0, "%s", err.msg);
    CHECK(ic_blkhash_put_digests(h, 0, split, all.digests, &err) == 0, "%s", err.msg);
    CHECK(ic_blkhash_update(h, split * bs, buf + split * bs, size - split * bs, &err) == 0,
          "%s", err.msg);
    CHECK(ic_blkhash_final(h, out, got, &err) == 0 && !strcmp(got, want),
          "round %d: resumed at block %llu: %s", round, (unsigned long long)split, got);
    ic_blkhash_free(h);
    CHECK(ic_blkhash_new("sha256", bs, size, &h, &err) == 0, "%s", err.msg);
    CHECK(ic_blkhash_put_digests(h, 0, nblocks + 1, all.digests, &err) < 0, "past the end");
    ic_blkhash_free(h);

    /* a shard: blocks from `split` on, their digests as the whole's */
    struct collected part = {calloc(nblocks + 1, 32), calloc(nblocks + 1, 1), 32, NULL};
    CHECK(ic_blkhash_new("sha256", bs, size, &h, &err) == 0, "%s", err.msg);
    part.zero = ic_blkhash_zero_digest(h);
    ic_blkhash_set_sink(h, collect, &part);
    CHECK(ic_blkhash_start_at(h, split, &err) == 0, "%s", err.msg);
    CHECK(ic_blkhash_update(h, split * bs, buf + split * bs, size - split * bs, &err) == 0,
          "%s", err.msg);
    for (uint64_t b = 0; b < nblocks; b++)
        CHECK(b < split ? part.seen[b] == 0
                        : part.seen[b] == 1 && !memcmp(part.digests + b * 32,
                                                       all.digests + b * 32, 32),
              "round %d: shard block %llu", round, (unsigned long long)b);
    CHECK(ic_blkhash_start_at(h, 0, &err) < 0, "start_at after feeding");
    ic_blkhash_free(h);
    free(part.digests);
    free(part.seen);
    free(all.digests);
    free(all.seen);
    free(buf);
}

/* ---- misuse ------------------------------------------------------------ */

static void misuse(void)
{
    struct ic_blkhash *h;
    struct ic_error err = {0};
    uint8_t out[IC_DIGEST_MAX], data[100000] = {1};
    CHECK(ic_blkhash_new("nonesuch", 65536, 10, &h, &err) < 0 && err.kind == IC_ERR_VALUE &&
          strstr(err.msg, "sha256") && strstr(err.msg, "blake2b"), "unknown: %s", err.msg);
    CHECK(ic_blkhash_new("sha256", 3, 10, &h, &err) < 0 && err.kind == IC_ERR_VALUE, "odd");
    CHECK(ic_blkhash_new("sha256", 0, 10, &h, &err) < 0, "zero block");
    /* OpenSSL's names work too */
    CHECK(ic_blkhash_new("SHA2-256", 65536, 0, &h, &err) == 0, "%s", err.msg);
    CHECK(!strcmp(ic_blkhash_algorithm(h), "sha256"), "name");
    ic_blkhash_free(h);
    CHECK(ic_blkhash_new("BLAKE2b512", 65536, 0, &h, &err) == 0, "%s", err.msg);
    CHECK(!strcmp(ic_blkhash_algorithm(h), "blake2b") && ic_blkhash_size(h) == 64, "blake2b");
    ic_blkhash_free(h);

    /* a byte fed twice: whole blocks, pieces, and pieces of folded blocks */
    const struct {
        uint64_t off1, len1, off2, len2;
    } twice[] = {
        {0, 65536, 0, 65536},     {0, 65536, 100, 10},   {65536, 34464, 70000, 10},
        {100, 10, 105, 10},       {100, 10, 0, 65536},   {65536 + 5, 10, 65536, 34464},
        {0, 100000, 99999, 1},
    };
    for (size_t i = 0; i < sizeof twice / sizeof twice[0]; i++) {
        CHECK(ic_blkhash_new("sha256", 65536, 100000, &h, &err) == 0, "%s", err.msg);
        CHECK(ic_blkhash_update(h, twice[i].off1, data, twice[i].len1, &err) == 0, "%s",
              err.msg);
        CHECK(ic_blkhash_update(h, twice[i].off2, data, twice[i].len2, &err) < 0 &&
              strstr(err.msg, "twice"), "case %zu: fed twice unnoticed", i);
        CHECK(ic_blkhash_final(h, out, NULL, &err) < 0 && strstr(err.msg, "twice"), "sticky");
        ic_blkhash_free(h);
    }
    /* a gap */
    CHECK(ic_blkhash_new("sha256", 65536, 100000, &h, &err) == 0, "%s", err.msg);
    CHECK(ic_blkhash_update(h, 0, data, 1000, &err) == 0, "%s", err.msg);
    CHECK(ic_blkhash_update(h, 2000, data, 98000, &err) == 0, "%s", err.msg);
    CHECK(ic_blkhash_final(h, out, NULL, &err) < 0 && strstr(err.msg, "never fed"), "gap");
    ic_blkhash_free(h);
    /* beyond the end */
    CHECK(ic_blkhash_new("sha256", 65536, 100000, &h, &err) == 0, "%s", err.msg);
    CHECK(ic_blkhash_zero(h, 99999, 2, &err) < 0 && strstr(err.msg, "beyond"), "beyond");
    ic_blkhash_free(h);
}

int main(void)
{
    vectors();
    misuse();
    for (int round = 0; round < 100; round++)
        random_case(round);
    for (int round = 0; round < 40; round++)
        digests_round(round);
    printf("test_blkhash: %lu checks passed\n", check_count);
    return 0;
}
