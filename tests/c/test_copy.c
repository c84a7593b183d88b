/* The copy engine with many threads, under the sanitizers (ASan/UBSan by
 * default, TSan with `make tsan`): raw -> raw and raw -> qcow2 (plain and
 * compressed), in and out of order, read back and compared. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "imgcopy.h"
#include "job.h"
#include "journal.h"

#define SIZE (24u << 20)


static void must(int ret, const struct ic_error *err)
{
    CHECK(ret >= 0, "%s (%s) %s", err->msg, strerror(err->errnum), err->path);
}

static uint8_t *expected;

static void make_source(const char *path)
{
    FILE *f = fopen(path, "wb");
    CHECK(f, "fopen");
    CHECK(ftruncate(fileno(f), SIZE) == 0, "ftruncate");
    expected = calloc(1, SIZE);
    srand(3);
    for (uint64_t off = 0; off < SIZE;) {
        uint64_t len = (uint64_t)(1 + rand() % 64) * 4096;
        if (off + len > SIZE)
            len = SIZE - off;
        int kind = rand() % 3; /* hole, data, written zeros */
        if (kind) {
            for (uint64_t i = 0; i < len; i++)
                expected[off + i] = kind == 1 ? (uint8_t)(1 + (off + i) % 251) : 0;
            CHECK(pwrite(fileno(f), expected + off, len, (off_t)off) == (ssize_t)len, "pwrite");
        }
        off += len;
    }
    fclose(f);
}

static void compare(const char *path)
{
    struct ic_error err = {0};
    struct ic_image *img;
    must(ic_image_open(path, NULL, 0, &img, &err), &err);
    CHECK(ic_image_size(img) == SIZE, "size %llu", (unsigned long long)ic_image_size(img));
    uint8_t *buf = malloc(SIZE);
    must(ic_image_pread(img, buf, SIZE, 0, &err), &err);
    CHECK(memcmp(buf, expected, SIZE) == 0, "%s differs from the source", path);
    free(buf);
    ic_image_close(img);
}

static void copy_offload(const char *src, const char *dst, const char *format, int compress,
                         unsigned threads, int out_of_order, uint64_t threshold, int flush,
                         int offload)
{
    struct ic_error err = {0};
    struct ic_image *s, *d;
    int fresh;
    struct ic_create_options co = {.compress = compress, .cluster_size = 65536};
    must(ic_image_open(src, "raw", 0, &s, &err), &err);
    must(ic_image_create(dst, format, SIZE, 0, &co, &d, &fresh, &err), &err);
    struct ic_copy_options o = {
        .sparse_threshold = threshold,
        .request_size = 256 << 10,
        .concurrency = threads,
        .out_of_order = out_of_order,
        .target_is_zero = fresh,
        .flush = flush,
        .offload = offload,
    };
    struct ic_copy *c;
    must(ic_copy_start(s, d, &o, &c, &err), &err);
    while (!ic_job_wait(ic_copy_job(c), 50))
        ;
    struct ic_copy_stats st;
    must(ic_copy_finish(c, &st, &err), &err);
    CHECK(st.bytes_written + st.bytes_zeroed + st.bytes_skipped == SIZE, "accounting");
    must(ic_image_finish(d, flush, &err), &err);
    ic_image_close(d);
    ic_image_close(s);
    if (strcmp(format, "null") != 0)
        compare(dst);
}

/* Copies to raw and qcow2 at once on one pool of two threads, under a
 * budget smaller than their requests in flight. */
static void copy_on_shared_pool(const char *src, const char *dir)
{
    struct ic_error err = {0};
    struct ic_pool *pool;
    must(ic_pool_new(2, 1u << 20, &pool, &err), &err);
    static const char *const formats[] = {"raw", "qcow2", "raw"};
    struct ic_image *s[3], *d[3];
    struct ic_copy *c[3];
    char path[3][96];
    for (int i = 0; i < 3; i++) {
        int fresh;
        snprintf(path[i], sizeof path[i], "%s/pooled%d", dir, i);
        must(ic_image_open(src, "raw", 0, &s[i], &err), &err);
        must(ic_image_create(path[i], formats[i], SIZE, 0, NULL, &d[i], &fresh, &err), &err);
        struct ic_copy_options o = {.sparse_threshold = 4096, .request_size = 512 << 10,
                                    .concurrency = 4, .out_of_order = i == 2,
                                    .target_is_zero = fresh, .pool = pool};
        must(ic_copy_start(s[i], d[i], &o, &c[i], &err), &err);
    }
    for (int i = 0; i < 3; i++) {
        struct ic_copy_stats st;
        must(ic_copy_finish(c[i], &st, &err), &err);
        CHECK(st.done == SIZE && st.total == SIZE, "pooled copy %d: %llu/%llu", i,
              (unsigned long long)st.done, (unsigned long long)st.total);
        must(ic_image_finish(d[i], 0, &err), &err);
        ic_image_close(d[i]);
        ic_image_close(s[i]);
        compare(path[i]);
        unlink(path[i]);
    }
    ic_pool_free(pool);
}

/* A journalled copy with a checksum, checkpoints every millisecond and
 * every 256 KiB from many threads: the journal holds all of it at the end,
 * each block's digest is the one a fresh hash gives, and a second copy
 * resumed from it has nothing left and the same checksum. */
static void copy_journalled(const char *src, const char *dir)
{
    struct ic_error err = {0};
    char path[96], jpath[96];
    snprintf(path, sizeof path, "%s/journalled", dir);
    snprintf(jpath, sizeof jpath, "%s/journal", dir);
    struct ic_journal_identity id = {.source = src, .destination = path, .size = SIZE,
                                     .options = "", .algorithm = "sha256",
                                     .block_size = 64 << 10, .digest_size = 32};
    char sums[2][IC_CHECKSUM_HEX_MAX];
    for (int run = 0; run < 2; run++) {
        struct ic_journal *j;
        must(ic_journal_open(jpath, &id, &j, &err), &err);
        CHECK(ic_journal_resumed(j) == run, "run %d: resumed %d", run, ic_journal_resumed(j));
        size_t ndone;
        const struct ic_range *done = ic_journal_done(j, &ndone);
        struct ic_range left = {0, SIZE};
        if (run == 1) {
            CHECK(ndone == 1 && done[0].offset == 0 && done[0].length == SIZE,
                  "the journal holds %zu ranges", ndone);
            left.length = 0;
        }
        struct ic_image *s, *d;
        int fresh;
        must(ic_image_open(src, "raw", 0, &s, &err), &err);
        if (run == 0)
            must(ic_image_create(path, "raw", SIZE, 0, NULL, &d, &fresh, &err), &err);
        else
            must(ic_image_open(path, "raw", IC_OPEN_RDWR, &d, &err), &err);
        struct ic_copy_options o = {.sparse_threshold = 4096, .request_size = 128 << 10,
                                    .concurrency = 8, .out_of_order = 1,
                                    .checksum = "sha256", .journal = j,
                                    .journal_interval_ms = 1,
                                    .journal_interval_bytes = 256 << 10,
                                    .changed = &left, .nchanged = 1, .has_changed = 1};
        struct ic_copy *c;
        must(ic_copy_start(s, d, &o, &c, &err), &err);
        struct ic_copy_stats st;
        must(ic_copy_finish(c, &st, &err), &err);
        memcpy(sums[run], st.checksum, sizeof sums[run]);
        CHECK(st.bytes_changed == left.length, "run %d copied %llu", run,
              (unsigned long long)st.bytes_changed);
        must(ic_image_finish(d, 1, &err), &err);
        ic_image_close(d);
        ic_image_close(s);
        done = ic_journal_done(j, &ndone);
        CHECK(ndone == 1 && done[0].length == SIZE, "run %d: %zu ranges done", run, ndone);
        ic_journal_close(j);
    }
    CHECK(strcmp(sums[0], sums[1]) == 0 && sums[0][0], "checksums %s and %s", sums[0], sums[1]);
    compare(path);
    unlink(path);
    unlink(jpath);
}

static void copy(const char *src, const char *dst, const char *format, int compress,
                 unsigned threads, int out_of_order, uint64_t threshold, int flush)
{
    copy_offload(src, dst, format, compress, threads, out_of_order, threshold, flush, 0);
}

int main(void)
{
    char dir[] = "/tmp/imgcopy-test-copy-XXXXXX";
    CHECK(mkdtemp(dir), "mkdtemp");
    char src[64], dst[64];
    snprintf(src, sizeof src, "%s/src.raw", dir);
    snprintf(dst, sizeof dst, "%s/dst", dir);
    make_source(src);
    for (int ooo = 0; ooo < 2; ooo++) {
        copy(src, dst, "raw", 0, 8, ooo, 4096, ooo);
        copy(src, dst, "raw", 0, 3, ooo, 0, 0);
        copy(src, dst, "qcow2", 0, 8, ooo, 4096, ooo);
        copy(src, dst, "qcow2", 1, 8, ooo, 4096, 0);
    }
    copy_on_shared_pool(src, dir);
    copy_journalled(src, dir);
    /* in-kernel copies, taken or refused (qcow2, null), in and out of
     * order: a refusal must hand the write turn on once, never hang */
    alarm(120);
    static const char *const offload_formats[] = {"raw", "qcow2", "null"};
    for (int ooo = 0; ooo < 2; ooo++)
        for (unsigned f = 0; f < 3; f++)
            for (unsigned threads = 1; threads <= 4; threads += 3)
                copy_offload(src, strcmp(offload_formats[f], "null") ? dst : "null:",
                             offload_formats[f], 0, threads, ooo, 4096, 0, 1);
    alarm(0);
    /* cancellation stops every thread and reports ECANCELED */
    struct ic_error err = {0};
    struct ic_image *s, *d;
    int fresh;
    must(ic_image_open(src, "raw", 0, &s, &err), &err);
    must(ic_image_create(dst, "raw", SIZE, 0, NULL, &d, &fresh, &err), &err);
    struct ic_copy_options o = {.request_size = 4096, .concurrency = 4, .out_of_order = 1,
                                .sparse_threshold = 0};
    struct ic_copy *c;
    must(ic_copy_start(s, d, &o, &c, &err), &err);
    ic_job_cancel(ic_copy_job(c));
    CHECK(ic_copy_finish(c, NULL, &err) < 0 && err.errnum == ECANCELED, "cancel");
    ic_image_close(d);
    ic_image_close(s);
    unlink(src);
    unlink(dst);
    rmdir(dir);
    free(expected);
    printf("test_copy: raw and qcow2 copies passed\n");
    return 0;
}
