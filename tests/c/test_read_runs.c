/* Vectored reads of scattered runs (driver.h: pread_runs): the batch a
 * format gathers its host reads in hands them to the protocol together
 * (a recording protocol counts the calls), and the file protocol reads
 * them right, from the page cache, from the disk, and with O_DIRECT
 * (io_uring where the kernel has it, one after another where not). */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "drivers/uring.h"
#include "image.h"

#define CL 65536u
#define NCL 64u

static void must(int ret, const struct ic_error *err)
{
    CHECK(ret >= 0, "%s (%s)", err->msg, strerror(err->errnum));
}

/* ---- a protocol that records what it is asked -------------------------- */

static struct {
    unsigned calls;          /* pread_runs calls */
    size_t runs[16];         /* runs in each call */
    unsigned preads;         /* single preads */
    struct ic_read_run last[IC_READ_RUNS_MAX];
} rec;

/* every byte of the recording image is its offset's low byte, xor 0x5a */
static void fill(void *buf, size_t len, uint64_t off)
{
    for (size_t i = 0; i < len; i++)
        ((uint8_t *)buf)[i] = (uint8_t)((off + i) ^ 0x5a);
}

static int rec_pread(struct ic_image *img, void *buf, size_t len, uint64_t off,
                     struct ic_error *err)
{
    (void)img;
    (void)err;
    rec.preads++;
    fill(buf, len, off);
    return 0;
}

static int rec_pread_runs(struct ic_image *img, const struct ic_read_run *runs, size_t n,
                          struct ic_error *err)
{
    (void)img;
    (void)err;
    if (rec.calls < 16)
        rec.runs[rec.calls] = n;
    rec.calls++;
    memcpy(rec.last, runs, n * sizeof *runs);
    for (size_t i = 0; i < n; i++)
        fill(runs[i].buf, runs[i].len, runs[i].off);
    return 0;
}

static void rec_close(struct ic_image *img)
{
    (void)img;
}

static int rec_block_status(struct ic_image *img, uint64_t start, uint64_t end, uint64_t want,
                            struct ic_extent_list *out, struct ic_error *err)
{
    (void)img;
    (void)want;
    struct ic_extent e = {.start = start, .length = end - start,
                          .flags = IC_EXT_DATA | IC_EXT_PRESENT};
    return ic_extent_list_add(out, &e, err);
}

static const struct ic_driver recording = {
    .name = "recording",
    .kind = IC_PROTOCOL,
    .close = rec_close,
    .pread = rec_pread,
    .pread_runs = rec_pread_runs,
    .block_status = rec_block_status,
};

static int expect_filled(const uint8_t *buf, size_t len, uint64_t off)
{
    for (size_t i = 0; i < len; i++)
        if (buf[i] != (uint8_t)((off + i) ^ 0x5a))
            return 0;
    return 1;
}

static void test_batch(void)
{
    struct ic_error err = {0};
    uint64_t size = (uint64_t)NCL * 4 * CL;
    struct ic_image *a = ic_image_new("a", &recording, 0, size);
    struct ic_image *b = ic_image_new("b", &recording, 0, size);
    CHECK(a && b, "ic_image_new");
    uint8_t *buf = malloc((size_t)(2 * IC_READ_RUNS_MAX + 8) * 4096);
    CHECK(buf, "malloc");

    /* 32 clusters of a request, last to first in the file: one call of
     * 32 runs, nothing read before the flush */
    struct ic_read_batch batch;
    memset(&rec, 0, sizeof rec);
    ic_read_batch_init(&batch);
    uint8_t *big = malloc((size_t)32 * CL);
    CHECK(big, "malloc");
    for (unsigned i = 0; i < 32; i++)
        must(ic_read_batch_add(&batch, a, big + (size_t)i * CL, CL, (uint64_t)(100 - i) * CL,
                               &err), &err);
    CHECK(rec.calls == 0 && rec.preads == 0, "read before the flush: %u calls", rec.calls);
    must(ic_read_batch_flush(&batch, &err), &err);
    CHECK(rec.calls == 1 && rec.runs[0] == 32 && rec.preads == 0, "calls %u runs %zu preads %u",
          rec.calls, rec.runs[0], rec.preads);
    for (unsigned i = 0; i < 32; i++)
        CHECK(expect_filled(big + (size_t)i * CL, CL, (uint64_t)(100 - i) * CL), "cluster %u", i);
    free(big);

    /* a run continuing the last one (in the file and in memory) joins it;
     * one continuing only in the file does not */
    memset(&rec, 0, sizeof rec);
    must(ic_read_batch_add(&batch, a, buf, 4096, 8192, &err), &err);
    must(ic_read_batch_add(&batch, a, buf + 4096, 4096, 12288, &err), &err);
    must(ic_read_batch_add(&batch, a, buf + 3 * 4096, 4096, 16384, &err), &err);
    must(ic_read_batch_flush(&batch, &err), &err);
    CHECK(rec.calls == 1 && rec.runs[0] == 2, "joined: %zu runs", rec.runs[0]);
    CHECK(rec.last[0].len == 8192 && rec.last[0].off == 8192, "joined run %zu at %llu",
          rec.last[0].len, (unsigned long long)rec.last[0].off);

    /* more than IC_READ_RUNS_MAX: a full batch goes, the rest follows */
    memset(&rec, 0, sizeof rec);
    for (unsigned i = 0; i < IC_READ_RUNS_MAX + 5; i++)
        must(ic_read_batch_add(&batch, a, buf + (size_t)i * 4096, 4096,
                               (uint64_t)(2 * i + 1) * 4096, &err), &err);
    CHECK(rec.calls == 1 && rec.runs[0] == IC_READ_RUNS_MAX, "full batch: %u calls",
          rec.calls);
    must(ic_read_batch_flush(&batch, &err), &err);
    CHECK(rec.calls == 2 && rec.runs[1] == 5, "rest: %u calls, %zu runs", rec.calls,
          rec.runs[1]);

    /* another file flushes what was gathered for the first */
    memset(&rec, 0, sizeof rec);
    must(ic_read_batch_add(&batch, a, buf, 4096, 0, &err), &err);
    must(ic_read_batch_add(&batch, a, buf + 2 * 4096, 4096, 3 * 4096, &err), &err);
    must(ic_read_batch_add(&batch, b, buf + 4 * 4096, 4096, 0, &err), &err);
    CHECK(rec.calls == 1 && rec.runs[0] == 2, "file change: %u calls", rec.calls);
    must(ic_read_batch_flush(&batch, &err), &err);
    CHECK(rec.calls == 1 && rec.preads == 1, "one run alone is a pread: %u, %u", rec.calls,
          rec.preads);

    /* padded: past the end reads as zeros and is never asked for */
    memset(&rec, 0, sizeof rec);
    memset(buf, 0xee, 3 * 4096);
    must(ic_read_batch_add_padded(&batch, a, buf, 2 * 4096, size - 4096, &err), &err);
    must(ic_read_batch_add_padded(&batch, a, buf + 2 * 4096, 4096, size + 4096, &err), &err);
    must(ic_read_batch_flush(&batch, &err), &err);
    CHECK(expect_filled(buf, 4096, size - 4096), "inside the file");
    for (size_t i = 4096; i < 3 * 4096; i++)
        CHECK(buf[i] == 0, "past the end at %zu: %u", i, buf[i]);
    CHECK(rec.preads == 1 && rec.calls == 0, "past the end was asked for");

    /* unpadded: a range outside the file fails at the flush, as a pread */
    must(ic_read_batch_add(&batch, a, buf, 4096, 0, &err), &err);
    must(ic_read_batch_add(&batch, a, buf + 4096, 8192, size - 4096, &err), &err);
    CHECK(ic_read_batch_flush(&batch, &err) < 0, "a run past the end was read");
    CHECK(batch.n == 0, "a failed flush leaves %zu runs", batch.n);
    struct ic_read_run too_many[IC_READ_RUNS_MAX + 1];
    for (unsigned i = 0; i <= IC_READ_RUNS_MAX; i++)
        too_many[i] = (struct ic_read_run){buf, 1, i};
    CHECK(ic_image_pread_runs(a, too_many, IC_READ_RUNS_MAX + 1, &err) < 0, "too many runs");

    free(buf);
    ic_image_free(a);
    ic_image_free(b);
}

/* ---- the file protocol -------------------------------------------------- */

static uint8_t *content;

static void evict(const char *path)
{
    int fd = open(path, O_RDONLY);
    CHECK(fd >= 0, "open %s: %s", path, strerror(errno));
    CHECK(fdatasync(fd) == 0, "fdatasync: %s", strerror(errno));
    int e = posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    CHECK(e == 0, "fadvise: %s", strerror(e));
    close(fd);
}

/* The clusters of a request, last to first in the file, every `stride`th
 * (1: back to back, one stretch read backwards into memory), each
 * `len` long (less than a cluster: O_DIRECT refuses the unaligned length,
 * the page cache reads them); `skew`: every other buffer starts 512 bytes
 * late, so O_DIRECT takes only half the runs of a stretch. */
static void read_backwards(struct ic_image *img, unsigned stride, size_t len, int skew)
{
    struct ic_error err = {0};
    uint8_t *buf;
    size_t step = CL + 4096;
    CHECK(posix_memalign((void **)&buf, 4096, 32 * step) == 0, "posix_memalign");
    memset(buf, 0, 32 * step);
    struct ic_read_run runs[32];
    for (unsigned i = 0; i < 32; i++)
        runs[i] = (struct ic_read_run){buf + i * step + (skew && i % 2 ? 512 : 0), len,
                                       (uint64_t)(NCL - 1 - stride * i) * CL};
    must(ic_image_pread_runs(img, runs, 32, &err), &err);
    for (unsigned i = 0; i < 32; i++)
        CHECK(memcmp(runs[i].buf, content + runs[i].off, len) == 0,
              "run %u (stride %u, len %zu, skew %d)", i, stride, len, skew);
    free(buf);
}

static void read_all_ways(struct ic_image *img, const char *path)
{
    for (unsigned stride = 1; stride <= 2; stride++) {
        evict(path);
        read_backwards(img, stride, CL, 0); /* from the disk */
        read_backwards(img, stride, CL, 0); /* from the page cache */
        evict(path);
        read_backwards(img, stride, CL - 512 - 17, 0);
        evict(path);
        read_backwards(img, stride, CL, 1);
        /* some cached, some not */
        evict(path);
        struct ic_error err = {0};
        uint8_t *one = malloc(CL);
        CHECK(one, "malloc");
        for (unsigned i = 0; i < NCL; i += 3)
            must(ic_image_pread(img, one, CL, (uint64_t)i * CL, &err), &err);
        free(one);
        read_backwards(img, stride, CL, 0);
    }
}

static void test_file(void)
{
    char path[] = "/var/tmp/imgcopy-test-runs-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) {
        strcpy(path, "/tmp/imgcopy-test-runs-XXXXXX");
        fd = mkstemp(path);
    }
    CHECK(fd >= 0, "mkstemp: %s", strerror(errno));
    content = malloc((size_t)NCL * CL);
    CHECK(content, "malloc");
    srand(11);
    for (size_t i = 0; i < (size_t)NCL * CL; i++)
        content[i] = (uint8_t)rand();
    CHECK(write(fd, content, (size_t)NCL * CL) == (ssize_t)NCL * CL, "write");
    close(fd);

    struct ic_error err = {0};
    struct ic_image *img;
    must(ic_image_open(path, "raw", 0, &img, &err), &err);
    read_all_ways(img, path);
    ic_image_close(img);

    /* O_DIRECT: aligned runs go to io_uring together (or one after
     * another without it), unaligned ones through the page cache */
    if (ic_image_open(path, "raw", IC_OPEN_DIRECT, &img, &err) == 0) {
        read_all_ways(img, path);
        ic_image_close(img);
    } else {
        printf("test_read_runs: no O_DIRECT here (%s), skipped\n", strerror(err.errnum));
    }

    /* io_uring itself: reads partly done already continue where they are */
    if (ic_uring_available()) {
        int rfd = open(path, O_RDONLY);
        CHECK(rfd >= 0, "open");
        uint8_t *buf = calloc(4, CL);
        CHECK(buf, "calloc");
        struct iovec iov[5];
        struct ic_uring_read reads[4];
        size_t done[4] = {0, 100, CL, 7};
        for (unsigned i = 0; i < 4; i++) {
            uint64_t off = (uint64_t)(40 - 3 * i) * CL;
            memcpy(buf + (size_t)i * CL, content + off, done[i]);
            iov[i] = (struct iovec){buf + (size_t)i * CL + done[i], CL - done[i]};
            reads[i] = (struct ic_uring_read){&iov[i], 1, off + done[i], CL - done[i], 0};
        }
        CHECK(ic_uring_readv(rfd, reads, 4) == 0, "io_uring read");
        for (unsigned i = 0; i < 4; i++) {
            CHECK(reads[i].done == reads[i].len, "read %u: %zu", i, reads[i].done);
            CHECK(memcmp(buf + (size_t)i * CL, content + (40 - 3 * i) * CL, CL) == 0, "read %u",
                  i);
        }
        /* one read into two buffers, the second before the first in
         * memory; and one past the end of the file: short, not failed */
        iov[0] = (struct iovec){buf + CL, CL};
        iov[1] = (struct iovec){buf, CL};
        iov[2] = (struct iovec){buf + 2 * CL, 2 * CL};
        reads[0] = (struct ic_uring_read){iov, 2, 3 * CL, 2 * CL, 0};
        reads[1] = (struct ic_uring_read){iov + 2, 1, (uint64_t)(NCL - 1) * CL, 2 * CL, 0};
        CHECK(ic_uring_readv(rfd, reads, 2) == 0, "io_uring read");
        CHECK(reads[0].done == 2 * CL && reads[1].done == CL, "done %zu, %zu", reads[0].done,
              reads[1].done);
        CHECK(memcmp(buf + CL, content + 3 * CL, CL) == 0 &&
              memcmp(buf, content + 4 * CL, CL) == 0, "vectored");
        CHECK(memcmp(buf + 2 * CL, content + (size_t)(NCL - 1) * CL, CL) == 0, "short");
        /* a forked child reads through a ring of its own, not the
         * parent's (whose completions it could take) */
        pid_t pid = fork();
        CHECK(pid >= 0, "fork: %s", strerror(errno));
        if (pid == 0) {
            memset(buf, 0, CL);
            iov[0] = (struct iovec){buf, CL};
            reads[0] = (struct ic_uring_read){iov, 1, 5 * CL, CL, 0};
            int ok = ic_uring_readv(rfd, reads, 1) == 0 && reads[0].done == CL &&
                     memcmp(buf, content + 5 * CL, CL) == 0;
            _exit(ok ? 0 : 1);
        }
        int status;
        CHECK(waitpid(pid, &status, 0) == pid, "waitpid: %s", strerror(errno));
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child's read failed");
        iov[0] = (struct iovec){buf, CL};
        reads[0] = (struct ic_uring_read){iov, 1, 9 * CL, CL, 0};
        CHECK(ic_uring_readv(rfd, reads, 1) == 0 && reads[0].done == CL, "after the fork");
        CHECK(memcmp(buf, content + 9 * CL, CL) == 0, "after the fork");
        close(rfd);
        free(buf);
    } else {
        printf("test_read_runs: no io_uring here, its own checks skipped\n");
    }
    unlink(path);
    free(content);
}

int main(void)
{
    test_batch();
    test_file();
    printf("test_read_runs: %lu checks passed\n", check_count);
    return 0;
}
