/* libFuzzer target for the qcow2 parser and read driver.
 *
 * Each input is a qcow2 file.  It goes through the pure header functions
 * (qcow2_parse_header, qcow2_parse_extensions, qcow2_check_features) and
 * then through the whole driver: ic_image_open, ic_image_map over at most
 * the first and the last 64 MiB of the virtual disk, and a few bounded
 * ic_image_pread calls at offsets derived from the input.  Failing with an
 * error is fine; crashing, leaking, hanging or allocating without bound
 * is not (run with -rss_limit_mb and -timeout).
 *
 * At start-up the harness makes a private directory under $TMPDIR (or
 * /tmp) and opens the input there by its absolute path, so that relative
 * backing file names resolve in that directory and nowhere else (the
 * harness does not chdir: libFuzzer opens its corpus paths later, relative
 * to the caller's directory).  The directory holds:
 *   input.qcow2  the input (a backing file named "input.qcow2" is the
 *                image itself: a loop)
 *   base.qcow2   a second copy of the input, so that a chain
 *                input -> base.qcow2 -> ... is hostile at every level
 *   base.raw     a fixed 1 MiB raw file, partly data, partly holes
 * Inputs are written sparse (4 KiB blocks of zeros become holes) so that
 * the metadata-preallocation detector and host-file block status run.
 * The directory is removed at exit; a crash, a timeout or an OOM exits
 * without that (libFuzzer calls _Exit), so each start also removes the
 * directories of harness processes that no longer run (their names carry
 * the pid).  Nothing is ever written into the source tree. */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "imgcopy.h"
#include "drivers/qcow2_format.h"
#include "probe.h"

#define MAP_WINDOW (64ull << 20)
#define READ_MAX (1u << 20)
#define SPARSE_BLOCK 4096

static char dir_path[4096];
static char input_path[4200], base_qcow2_path[4200], base_raw_path[4200];
static uint8_t read_buf[READ_MAX];
static int verbose; /* IMGCOPY_FUZZ_VERBOSE=1: say what each input did */

static void cleanup(void)
{
    if (!dir_path[0])
        return;
    unlink(input_path);
    unlink(base_qcow2_path);
    unlink(base_raw_path);
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

#define DIR_PREFIX "imgcopy-fuzz-qcow2."

/* Remove what dead harness processes left in `tmp`: DIR_PREFIX<pid>.XXXXXX
 * directories holding our three files. */
static void remove_stale(const char *tmp)
{
    DIR *d = opendir(tmp);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, DIR_PREFIX, strlen(DIR_PREFIX)) != 0)
            continue;
        char *end;
        long pid = strtol(e->d_name + strlen(DIR_PREFIX), &end, 10);
        if (pid <= 0 || *end != '.' || strlen(end) != 7)
            continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH)
            continue;
        static const char *const names[] = {"input.qcow2", "base.qcow2", "base.raw"};
        char p[4400];
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
            snprintf(p, sizeof p, "%s/%s/%s", tmp, e->d_name, names[i]);
            unlink(p);
        }
        snprintf(p, sizeof p, "%s/%s", tmp, e->d_name);
        rmdir(p);
    }
    closedir(d);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    const char *tmp = getenv("TMPDIR");
    if (!tmp || !tmp[0])
        tmp = "/tmp";
    remove_stale(tmp);
    snprintf(dir_path, sizeof dir_path, "%s/" DIR_PREFIX "%ld.XXXXXX", tmp, (long)getpid());
    if (!mkdtemp(dir_path)) {
        dir_path[0] = '\0';
        die("mkdtemp");
    }
    snprintf(input_path, sizeof input_path, "%s/input.qcow2", dir_path);
    snprintf(base_qcow2_path, sizeof base_qcow2_path, "%s/base.qcow2", dir_path);
    snprintf(base_raw_path, sizeof base_raw_path, "%s/base.raw", dir_path);
    atexit(cleanup);
    verbose = getenv("IMGCOPY_FUZZ_VERBOSE") && atoi(getenv("IMGCOPY_FUZZ_VERBOSE")) > 0;
    /* base.raw: 1 MiB, a data block every 64 KiB, holes between */
    static uint8_t raw[1 << 20];
    for (size_t off = 0; off < sizeof raw; off += 65536)
        memset(raw + off, (int)(0x10 + off / 65536), 4096);
    put_file(base_raw_path, raw, sizeof raw);
    return 0;
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

/* The header functions on their own, as the driver calls them; the
 * format probe on the input's first and last bytes; the bitmap directory
 * and snapshot entry parsers on the input's bytes. */
static void parse_only(const uint8_t *data, size_t size)
{
    size_t head = size < IC_PROBE_HEAD ? size : IC_PROBE_HEAD;
    size_t tail = size < IC_PROBE_TAIL ? 0 : IC_PROBE_TAIL;
    (void)ic_probe_format(data, head, data + size - tail, tail);
    struct qcow2_header *h = malloc(sizeof *h);
    struct ic_error err;
    if (!h)
        return;
    size_t n = size < QCOW2_HEADER_READ ? size : QCOW2_HEADER_READ;
    if (qcow2_parse_header(data, n, h, "input", &err) == 0) {
        uint8_t *c0 = calloc(1, h->cluster_size);
        if (c0) {
            memcpy(c0, data, size < h->cluster_size ? size : h->cluster_size);
            if (qcow2_parse_extensions(c0, h->cluster_size, h, "input", &err) == 0) {
                for (int force = 0; force < 2; force++)
                    for (int writable = 0; writable < 2; writable++)
                        (void)qcow2_check_features(h, force, writable, "input", &err);
                /* whatever follows the header, as a directory and entries */
                if (h->has_bitmaps && size > 112)
                    (void)qcow2_check_bitmap_directory(data + 112, size - 112, h, "input",
                                                       &err);
                for (size_t off = 112; off + QCOW2_SNAPSHOT_FIXED <= size && off < 4096;
                     off += QCOW2_SNAPSHOT_FIXED) {
                    struct qcow2_snapshot_entry e;
                    uint64_t len;
                    (void)qcow2_parse_snapshot_entry(data + off, 0, &e, &len, "input", &err);
                }
            }
            free(c0);
        }
    }
    free(h);
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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    parse_only(data, size);

    put_file(input_path, data, size);
    put_file(base_qcow2_path, data, size);

    uint64_t r = mix(data, size, 0);
    unsigned flags = (r & 1) ? IC_OPEN_FORCE : 0;
    struct ic_image *img = NULL;
    struct ic_error err;
    if (ic_image_open(input_path, "qcow2", flags, &img, &err) < 0) {
        if (verbose)
            fprintf(stderr, "  open: %s\n", err.msg);
        return 0;
    }
    if (verbose)
        fprintf(stderr, "  open: size %llu, backing %s\n",
                (unsigned long long)ic_image_size(img),
                ic_image_backing(img) ? ic_image_path(ic_image_backing(img)) : "none");

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
    ic_image_close(img);
    return 0;
}
