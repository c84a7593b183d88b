/* Whole-buffer compression (csrc/compression.c), as qemu writes and reads
 * qcow2's compressed clusters: round trips at every level, output that
 * does not fit, input with bytes after the data, streams that go on past
 * the cluster, corrupt and truncated data, and threads with contexts of
 * their own.  Built twice: with the optional libraries this machine has,
 * and (test_compression_zlib_only) with zlib alone. */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <zlib.h>

#include "check.h"
#include "compression.h"

#define CLUSTER 65536

static uint64_t rng = 88172645463325252ull;

static uint32_t next_random(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)rng;
}

/* Text-like: words from a small vocabulary, compressible about 4:1. */
static void fill_text(uint8_t *buf, size_t len)
{
    static const char *words[] = {"block ", "cluster ", "image ", "qcow2 ", "extent ",
                                  "zero ", "backing ", "data ", "\n", "offset "};
    size_t i = 0;
    while (i < len) {
        const char *w = words[next_random() % 10];
        for (size_t k = 0; w[k] && i < len; k++)
            buf[i++] = (uint8_t)w[k];
    }
}

static void fill_random(uint8_t *buf, size_t len)
{
    for (size_t i = 0; i < len; i++)
        buf[i] = (uint8_t)next_random();
}

static const enum ic_compression_type TYPES[] = {IC_COMPRESSION_DEFLATE, IC_COMPRESSION_ZSTD};

static void check_round_trips(void)
{
    static uint8_t in[CLUSTER], out[2 * CLUSTER], back[CLUSTER];
    fill_text(in, sizeof in);
    for (size_t t = 0; t < 2; t++) {
        enum ic_compression_type type = TYPES[t];
        if (!ic_compression_available(type))
            continue;
        int max = ic_compression_max_level(type);
        CHECK(max >= 9, "type %d: max level %d", type, max);
        int def = ic_compression_default_level(type);
        CHECK(def >= 1 && def <= max, "type %d: default level %d", type, def);
        CHECK(ic_compression_library(type) != NULL, "type %d names its library", type);
        for (int level = 0; level <= max; level++) {
            size_t n = 0;
            int r = ic_compress(type, level, in, sizeof in, out, CLUSTER - 1, &n);
            CHECK(r == 0 && n > 0 && n < CLUSTER / 2, "type %d level %d: r %d, %zu bytes", type,
                  level, r, n);
            /* a qcow2 cluster is read to the end of its last sector: the
             * bytes after the data are whatever the file holds */
            memset(out + n, 0xa5, sizeof out - n);
            memset(back, 0, sizeof back);
            CHECK(ic_decompress(type, out, n + 511, back, sizeof back) == 0,
                  "type %d level %d decompresses (errno %d)", type, level, errno);
            CHECK(memcmp(in, back, sizeof in) == 0, "type %d level %d: same bytes", type, level);
            CHECK(ic_decompress(type, out, n, back, sizeof back) == 0,
                  "type %d level %d: the exact length too", type, level);
        }
        size_t n;
        errno = 0;
        CHECK(ic_compress(type, max + 1, in, sizeof in, out, CLUSTER - 1, &n) == -1 &&
                  errno == EINVAL, "type %d: level %d refused", type, max + 1);
        errno = 0;
        CHECK(ic_compress(type, -1, in, sizeof in, out, CLUSTER - 1, &n) == -1 && errno == EINVAL,
              "type %d: level -1 refused", type);
    }
}

/* Random data does not compress: "does not fit" (1), never an error, and
 * never a byte written past `cap`. */
static void check_incompressible(void)
{
    static uint8_t in[CLUSTER], out[CLUSTER + 64];
    fill_random(in, sizeof in);
    for (size_t t = 0; t < 2; t++) {
        if (!ic_compression_available(TYPES[t]))
            continue;
        memset(out, 0x5a, sizeof out);
        size_t n = 0;
        int r = ic_compress(TYPES[t], 0, in, sizeof in, out, CLUSTER - 1, &n);
        CHECK(r == 1, "type %d: random data does not fit (r %d)", TYPES[t], r);
        for (size_t i = CLUSTER - 1; i < sizeof out; i++)
            CHECK(out[i] == 0x5a, "type %d: byte %zu past cap written", TYPES[t], i);
    }
}

/* A raw deflate stream of `len` bytes, as zlib writes it. */
static size_t zlib_deflate(const uint8_t *in, size_t len, uint8_t *out, size_t cap)
{
    z_stream z;
    memset(&z, 0, sizeof z);
    CHECK(deflateInit2(&z, 6, Z_DEFLATED, -12, 9, Z_DEFAULT_STRATEGY) == Z_OK, "deflateInit2");
    z.next_in = (uint8_t *)in;
    z.avail_in = (uInt)len;
    z.next_out = out;
    z.avail_out = (uInt)cap;
    CHECK(deflate(&z, Z_FINISH) == Z_STREAM_END, "deflate");
    size_t n = cap - z.avail_out;
    deflateEnd(&z);
    return n;
}

/* What qemu accepts and refuses in a deflate cluster. */
static void check_deflate_edges(void)
{
    static uint8_t in[CLUSTER + 4096], out[2 * CLUSTER], back[CLUSTER];
    fill_text(in, sizeof in);
    /* zlib's own streams (what qemu and older imgcopy wrote) */
    size_t n = zlib_deflate(in, CLUSTER, out, sizeof out);
    CHECK(ic_decompress(IC_COMPRESSION_DEFLATE, out, n, back, CLUSTER) == 0 &&
              memcmp(back, in, CLUSTER) == 0, "zlib's stream reads back");
    /* a stream of more than a cluster: qemu takes the cluster's worth */
    n = zlib_deflate(in, sizeof in, out, sizeof out);
    CHECK(ic_decompress(IC_COMPRESSION_DEFLATE, out, n, back, CLUSTER) == 0 &&
              memcmp(back, in, CLUSTER) == 0, "a longer stream fills the cluster");
    /* one that ends short of the cluster is corrupt */
    n = zlib_deflate(in, CLUSTER - 1, out, sizeof out);
    errno = 0;
    CHECK(ic_decompress(IC_COMPRESSION_DEFLATE, out, n, back, CLUSTER) == -1 && errno == EIO,
          "a short stream is refused (errno %d)", errno);
    /* truncated input */
    n = zlib_deflate(in, CLUSTER, out, sizeof out);
    errno = 0;
    CHECK(ic_decompress(IC_COMPRESSION_DEFLATE, out, n / 2, back, CLUSTER) == -1 &&
              errno == EIO, "a truncated stream is refused");
    /* garbage: a block type 3 (reserved) */
    memset(out, 0xff, 512);
    errno = 0;
    CHECK(ic_decompress(IC_COMPRESSION_DEFLATE, out, 512, back, CLUSTER) == -1 && errno == EIO,
          "garbage is refused");
}

/* zlib streams (RFC 1950) as vmdk grains hold them: shorter output is
 * fine, the stream must end within the buffer with its checksum right. */
static void check_zlib_streams(void)
{
    static uint8_t in[CLUSTER], out[2 * CLUSTER], back[CLUSTER];
    fill_text(in, sizeof in);
    uLongf n = sizeof out;
    CHECK(compress2(out, &n, in, CLUSTER, 6) == Z_OK, "compress2");
    size_t made = 0;
    memset(out + n, 0xa5, 512); /* what follows a grain in the file */
    CHECK(ic_zlib_inflate(out, n + 512, back, CLUSTER, &made) == 0 && made == CLUSTER &&
              memcmp(back, in, CLUSTER) == 0, "a grain inflates (made %zu)", made);
    n = sizeof out;
    CHECK(compress2(out, &n, in, 1000, 9) == Z_OK, "compress2 short");
    CHECK(ic_zlib_inflate(out, n, back, CLUSTER, &made) == 0 && made == 1000 &&
              memcmp(back, in, 1000) == 0, "a short grain says how much it made");
    errno = 0;
    CHECK(ic_zlib_inflate(out, n, back, 999, &made) == -1 && errno == EIO,
          "more than the buffer holds is refused");
    errno = 0;
    CHECK(ic_zlib_inflate(out, n / 2, back, CLUSTER, &made) == -1 && errno == EIO,
          "a truncated stream is refused");
    out[n - 1] ^= 0x01; /* the Adler-32 */
    errno = 0;
    CHECK(ic_zlib_inflate(out, n, back, CLUSTER, &made) == -1 && errno == EIO,
          "a wrong checksum is refused");
    /* a raw deflate stream (no zlib header) is not a zlib stream */
    size_t raw = zlib_deflate(in, 1000, out, sizeof out);
    errno = 0;
    CHECK(ic_zlib_inflate(out, raw, back, CLUSTER, &made) == -1 && errno == EIO,
          "a raw deflate stream is refused");
}

static void check_zstd_edges(void)
{
    if (!ic_compression_available(IC_COMPRESSION_ZSTD)) {
        size_t n;
        uint8_t b[16] = {0}, o[16];
        errno = 0;
        CHECK(ic_compress(IC_COMPRESSION_ZSTD, 0, b, sizeof b, o, sizeof o, &n) == -1 &&
                  errno == ENOTSUP, "no libzstd: compress refused");
        errno = 0;
        CHECK(ic_decompress(IC_COMPRESSION_ZSTD, b, sizeof b, o, sizeof o) == -1 &&
                  errno == ENOTSUP, "no libzstd: decompress refused");
        CHECK(ic_compression_library(IC_COMPRESSION_ZSTD) == NULL, "no library named");
        CHECK(ic_compression_max_level(IC_COMPRESSION_ZSTD) == 0, "no levels");
        return;
    }
    static uint8_t in[2 * CLUSTER], out[4 * CLUSTER], back[CLUSTER];
    fill_text(in, sizeof in);
    size_t half, rest;
    /* two frames making one cluster: qemu reads on into the next frame */
    CHECK(ic_compress(IC_COMPRESSION_ZSTD, 0, in, CLUSTER / 2, out, sizeof out, &half) == 0,
          "first half");
    CHECK(ic_compress(IC_COMPRESSION_ZSTD, 0, in + CLUSTER / 2, CLUSTER / 2, out + half,
                      sizeof out - half, &rest) == 0, "second half");
    CHECK(ic_decompress(IC_COMPRESSION_ZSTD, out, half + rest, back, CLUSTER) == 0 &&
              memcmp(back, in, CLUSTER) == 0, "two frames fill a cluster");
    /* one frame short of the cluster, nothing after it */
    errno = 0;
    CHECK(ic_decompress(IC_COMPRESSION_ZSTD, out, half, back, CLUSTER) == -1 && errno == EIO,
          "a short frame is refused");
    /* a frame longer than the cluster: it does not end there */
    size_t n;
    CHECK(ic_compress(IC_COMPRESSION_ZSTD, 0, in, sizeof in, out, sizeof out, &n) == 0, "long");
    errno = 0;
    CHECK(ic_decompress(IC_COMPRESSION_ZSTD, out, n, back, CLUSTER) == -1 && errno == EIO,
          "a frame of two clusters is refused");
    /* truncated, and garbage */
    CHECK(ic_compress(IC_COMPRESSION_ZSTD, 0, in, CLUSTER, out, sizeof out, &n) == 0, "one");
    errno = 0;
    CHECK(ic_decompress(IC_COMPRESSION_ZSTD, out, n / 2, back, CLUSTER) == -1 && errno == EIO,
          "a truncated frame is refused");
    out[n / 2] ^= 0x55;
    CHECK(ic_decompress(IC_COMPRESSION_ZSTD, out, n, back, CLUSTER) == -1, "a flipped byte");
    memset(out, 0, 512);
    errno = 0;
    CHECK(ic_decompress(IC_COMPRESSION_ZSTD, out, 512, back, CLUSTER) == -1 && errno == EIO,
          "zeros are no frame");
}

/* Threads each with their own contexts, levels changing under them.  A
 * worker returns what failed (CHECK counts in a global: main thread only). */
static void *worker(void *arg)
{
    unsigned id = (unsigned)(uintptr_t)arg;
    static const size_t sizes[] = {512, 4096, CLUSTER};
    uint8_t *in = malloc(CLUSTER), *out = malloc(CLUSTER), *back = malloc(CLUSTER);
    const char *failed = NULL;
    if (!in || !out || !back)
        failed = "memory";
    for (unsigned i = 0; i < 60 && !failed; i++) {
        size_t len = sizes[(i + id) % 3];
        memset(in, 0, len);
        for (size_t k = 0; k < len; k += 7)
            in[k] = (uint8_t)(k * (id + 1) + i);
        enum ic_compression_type type = TYPES[i % 2];
        if (!ic_compression_available(type))
            type = IC_COMPRESSION_DEFLATE;
        size_t n;
        if (ic_compress(type, 1 + (int)(i % 5), in, len, out, len - 1, &n) != 0)
            failed = "compress";
        else if (ic_decompress(type, out, n, back, len) != 0 || memcmp(in, back, len) != 0)
            failed = "read back";
    }
    free(in);
    free(out);
    free(back);
    return (void *)failed;
}

static void check_threads(void)
{
    pthread_t t[4];
    for (uintptr_t i = 0; i < 4; i++)
        CHECK(pthread_create(&t[i], NULL, worker, (void *)i) == 0, "pthread_create");
    for (int i = 0; i < 4; i++) {
        void *failed;
        CHECK(pthread_join(t[i], &failed) == 0, "pthread_join");
        CHECK(failed == NULL, "thread %d: %s", i, (const char *)failed);
    }
}

int main(void)
{
    check_round_trips();
    check_incompressible();
    check_deflate_edges();
    check_zlib_streams();
    check_zstd_edges();
    check_threads();
    printf("test_compression (%s%s%s): %lu checks passed\n",
           ic_compression_library(IC_COMPRESSION_DEFLATE),
           ic_compression_available(IC_COMPRESSION_ZSTD) ? ", " : "",
           ic_compression_available(IC_COMPRESSION_ZSTD)
               ? ic_compression_library(IC_COMPRESSION_ZSTD) : "",
           check_count);
    return 0;
}
