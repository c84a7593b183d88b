/* What every format's libFuzzer harness shares: a private directory under
 * $TMPDIR (or /tmp) holding the files an input becomes (removed at exit;
 * each start also removes the directories of harness processes that no
 * longer run, whose names carry the pid), sparse writes of inputs, and the
 * driver exercise: map the first and the last 64 MiB of the virtual disk
 * (checking that extents tile the range) and read at offsets derived from
 * the input.  Header-only: each harness is one translation unit. */
#ifndef IMGCOPY_FUZZ_COMMON_H
#define IMGCOPY_FUZZ_COMMON_H

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "imgcopy.h"

#define MAP_WINDOW (64ull << 20)
#define READ_MAX (1u << 20)
#define SPARSE_BLOCK 4096
#define FUZZ_FILES_MAX 8

static char dir_path[4096];
static const char *dir_prefix;
static const char *const *file_names;
static size_t file_count;
static char file_paths[FUZZ_FILES_MAX][4200];
static uint8_t read_buf[READ_MAX];
static int verbose; /* IMGCOPY_FUZZ_VERBOSE=1: say what each input did */

static void cleanup(void)
{
    if (!dir_path[0])
        return;
    for (size_t i = 0; i < file_count; i++)
        unlink(file_paths[i]);
    rmdir(dir_path);
    dir_path[0] = '\0';
}

static void die(const char *what)
{
    perror(what);
    cleanup();
    abort();
}

static int write_all(int fd, const uint8_t *p, size_t n, off_t off)
{
    while (n > 0) {
        ssize_t w = pwrite(fd, p, n, off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
        off += w;
    }
    return 0;
}

/* The harness's own loops are not what is being fuzzed: no coverage
 * feedback (it would also make them the slowest part of a run). */
#if defined(__clang__) && __clang_major__ >= 13
#define NO_COVERAGE __attribute__((no_sanitize("coverage")))
#else
#define NO_COVERAGE
#endif

NO_COVERAGE static int all_zero(const uint8_t *p, size_t n)
{
    uint8_t acc = 0;
    for (size_t i = 0; i < n; i++)
        acc |= p[i];
    return acc == 0;
}

/* Replace the file's contents with data, leaving holes for zero blocks.
 * No truncation to 0: ext4 flushes a file truncated to 0 and rewritten on
 * close (auto_da_alloc), which would make every run wait for the disk. */
NO_COVERAGE static void put_file(const char *name, const uint8_t *data, size_t size)
{
    int fd = open(name, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0)
        die(name);
    if (ftruncate(fd, (off_t)size) < 0)
        die("ftruncate");
    for (size_t off = 0; off < size; off += SPARSE_BLOCK) {
        size_t n = size - off < SPARSE_BLOCK ? size - off : SPARSE_BLOCK;
        if (!all_zero(data + off, n)) {
            if (write_all(fd, data + off, n, (off_t)off) < 0)
                die("pwrite");
        } else if (fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)off,
                             (off_t)n) < 0 && write_all(fd, data + off, n, (off_t)off) < 0) {
            die("pwrite");
        }
    }
    close(fd);
}

/* Remove what dead harness processes left in `tmp`: <prefix><pid>.XXXXXX
 * directories holding our files. */
static void remove_stale(const char *tmp)
{
    DIR *d = opendir(tmp);
    if (!d)
        return;
    struct dirent *e;
    size_t plen = strlen(dir_prefix);
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, dir_prefix, plen) != 0)
            continue;
        char *end;
        long pid = strtol(e->d_name + plen, &end, 10);
        if (pid <= 0 || *end != '.' || strlen(end) != 7)
            continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH)
            continue;
        char p[4400];
        for (size_t i = 0; i < file_count; i++) {
            snprintf(p, sizeof p, "%s/%s/%s", tmp, e->d_name, file_names[i]);
            unlink(p);
        }
        snprintf(p, sizeof p, "%s/%s", tmp, e->d_name);
        rmdir(p);
    }
    closedir(d);
}

/* Make the private directory "<prefix><pid>.XXXXXX" for files `names`
 * (at most FUZZ_FILES_MAX); fuzz_path(i) is where names[i] lives. */
static void fuzz_init_dir(const char *prefix, const char *const *names, size_t count)
{
    if (count > FUZZ_FILES_MAX)
        abort();
    dir_prefix = prefix;
    file_names = names;
    file_count = count;
    const char *tmp = getenv("TMPDIR");
    if (!tmp || !tmp[0])
        tmp = "/tmp";
    remove_stale(tmp);
    snprintf(dir_path, sizeof dir_path, "%s/%s%ld.XXXXXX", tmp, prefix, (long)getpid());
    if (!mkdtemp(dir_path)) {
        dir_path[0] = '\0';
        die("mkdtemp");
    }
    for (size_t i = 0; i < count; i++)
        snprintf(file_paths[i], sizeof file_paths[i], "%s/%s", dir_path, names[i]);
    atexit(cleanup);
    verbose = getenv("IMGCOPY_FUZZ_VERBOSE") && atoi(getenv("IMGCOPY_FUZZ_VERBOSE")) > 0;
}

static const char *fuzz_path(size_t i)
{
    return file_paths[i];
}

/* Offsets and lengths for reads, from the input's bytes. */
NO_COVERAGE static uint64_t mix(const uint8_t *data, size_t size, uint64_t seed)
{
    uint64_t h = 0xcbf29ce484222325ull ^ seed;
    size_t step = size > 4096 ? size / 4096 : 1;
    for (size_t i = 0; i < size; i += step)
        h = (h ^ data[i]) * 0x100000001b3ull;
    h ^= size;
    h ^= h >> 31;
    h *= 0x9e3779b97f4a7c15ull;
    return h ^ (h >> 29);
}

static void map_range(struct ic_image *img, uint64_t start, uint64_t end)
{
    struct ic_extent_list list = {0};
    struct ic_error err;
    int ret = ic_image_map(img, start, end, &list, &err);
    if (verbose)
        fprintf(stderr, "  map %llu..%llu: %s%zu extents\n", (unsigned long long)start,
                (unsigned long long)end, ret < 0 ? err.msg : "", list.count);
    if (ret == 0) {
        /* the extents must tile the range */
        uint64_t pos = start;
        for (size_t i = 0; i < list.count; i++) {
            if (list.items[i].start != pos || list.items[i].length == 0) {
                fprintf(stderr, "map: extent %zu starts at %llu, expected %llu\n", i,
                        (unsigned long long)list.items[i].start, (unsigned long long)pos);
                abort();
            }
            pos += list.items[i].length;
        }
        if (pos != end) {
            fprintf(stderr, "map: extents end at %llu, expected %llu\n",
                    (unsigned long long)pos, (unsigned long long)end);
            abort();
        }
    }
    ic_extent_list_free(&list);
}

static void read_at(struct ic_image *img, uint64_t off, uint64_t len)
{
    uint64_t size = ic_image_size(img);
    struct ic_error err;
    if (off >= size)
        return;
    if (len > size - off)
        len = size - off;
    if (len > READ_MAX)
        len = READ_MAX;
    if (len) {
        int ret = ic_image_pread(img, read_buf, (size_t)len, off, &err);
        if (verbose)
            fprintf(stderr, "  read %llu+%llu: %s\n", (unsigned long long)off,
                    (unsigned long long)len, ret < 0 ? err.msg : "ok");
    }
}

/* Map the head and tail windows (in an order picked by the input) and
 * read at a few offsets derived from it.  (Unused by harnesses of what is
 * no image: the journal's.) */
__attribute__((unused)) static void fuzz_exercise(struct ic_image *img, const uint8_t *data, size_t size)
{
    uint64_t r = mix(data, size, 0);
    uint64_t vsize = ic_image_size(img);
    uint64_t head_end = vsize < MAP_WINDOW ? vsize : MAP_WINDOW;
    if (r & 2) {
        map_range(img, 0, head_end);
        if (vsize > head_end)
            map_range(img, vsize - MAP_WINDOW > head_end ? vsize - MAP_WINDOW : head_end, vsize);
    } else {
        /* the tail first: a query far from anything known */
        if (vsize > head_end)
            map_range(img, vsize - MAP_WINDOW > head_end ? vsize - MAP_WINDOW : head_end, vsize);
        map_range(img, 0, head_end);
    }
    if (vsize) {
        uint64_t r1 = mix(data, size, 1), r2 = mix(data, size, 2);
        read_at(img, 0, 1 + r1 % READ_MAX);
        read_at(img, r2 % vsize, 1 + (r2 >> 40) % READ_MAX);
        read_at(img, r1 % head_end, 1 + (r1 >> 44) % 65536);
        read_at(img, vsize - (vsize < 4096 ? vsize : 4096), 4096);
    }
}

#endif
