/* Persistent bitmaps a qcow2 writer stores (ic_image_add_bitmap,
 * ic_image_copy_bitmap), read back by the reader (ic_image_bitmaps,
 * ic_image_dirty_map) and checked by ic_image_check (qemu-img check's
 * rules: every cluster of theirs counted, nothing leaked):
 *   - pseudo-random ranges of several granularities, on disks whose
 *     clusters of bits end inside the disk and whose end is no multiple
 *     of the granularity, with 512-byte and 64 KiB clusters, compressed or
 *     not, an overlay;
 *   - a bitmap copied from an image to another;
 *   - what qemu refuses, refused, leaving nothing behind (a failing range
 *     source too);
 *   - a write after the finish that stored them drops them; one added
 *     after a finish is stored with the others by the next;
 *   - a resumed writer: bits written before a crash are no one's, the
 *     bitmap added again is stored. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "image_checks.h"
#include "image.h"
#include "imgcopy.h"

static char dir[] = "/tmp/imgcopy-test-bitmaps-XXXXXX";
static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint64_t next_random(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static void must(int ret, const struct ic_error *err, const char *what)
{
    CHECK(ret == 0, "%s: %s", what, err->msg);
}

/* The file `name` of the test's directory (a string of its own for as
 * long as the name is in use: the names are few). */
static char *path_of(const char *name)
{
    static char buf[16][128];
    static const char *names[16];
    static int k;
    for (int i = 0; i < k; i++)
        if (strcmp(names[i], name) == 0)
            return buf[i];
    CHECK(k < 16, "too many files");
    names[k] = name;
    char *p = buf[k++];
    snprintf(p, sizeof buf[0], "%s/%s", dir, name);
    return p;
}

static struct ic_image *create(const char *path, uint64_t size, uint64_t cluster, int v2,
                               int compress)
{
    struct ic_error err = {0};
    struct ic_create_options o = {.cluster_size = cluster, .compat_v2 = v2,
                                  .compress = compress};
    struct ic_image *img;
    int fresh;
    must(ic_image_create(path, "qcow2", size, 0, &o, &img, &fresh, &err), &err, "create");
    return img;
}

/* Some data, so that the bitmaps' clusters come after data clusters. */
static void write_some(struct ic_image *img, uint64_t cluster)
{
    struct ic_error err = {0};
    uint64_t size = ic_image_size(img);
    uint8_t *buf = malloc(cluster);
    CHECK(buf, "malloc");
    memset(buf, 0x5a, cluster);
    for (uint64_t off = 0; off + cluster <= size; off += 7 * cluster)
        must(ic_image_pwrite(img, buf, cluster, off, &err), &err, "write");
    free(buf);
}

/* qemu-img check's verdict: clean. */
static void check_clean(const char *path, const char *what)
{
    struct ic_error err = {0};
    struct ic_image *img;
    must(ic_image_open(path, "qcow2", 0, &img, &err), &err, what);
    check_image_clean(img, what);
    ic_image_close(img);
}

/* One bitmap as stored, and its bits as a model: a byte per granule. */
struct model {
    const char *name;
    uint64_t granularity;
    unsigned flags;
    uint8_t *granules;
};

static void model_ranges(struct model *m, uint64_t size, const struct ic_range *r, size_t n)
{
    uint64_t count = (size + m->granularity - 1) / m->granularity;
    m->granules = calloc(count ? count : 1, 1);
    CHECK(m->granules, "calloc");
    for (size_t i = 0; i < n; i++)
        if (r[i].length)
            memset(m->granules + r[i].offset / m->granularity, 1,
                   (r[i].offset + r[i].length - 1) / m->granularity - r[i].offset /
                   m->granularity + 1);
}

/* The image lists exactly these bitmaps, in this order, and their dirty
 * maps are the models'. */
static void expect_bitmaps(const char *path, const struct model *m, size_t n, const char *what)
{
    struct ic_error err = {0};
    struct ic_image *img;
    must(ic_image_open(path, "qcow2", 0, &img, &err), &err, what);
    uint64_t size = ic_image_size(img);
    struct ic_bitmap got[16];
    size_t count = ic_image_bitmaps(img, got, 16);
    CHECK(count == n, "%s: %zu bitmaps, want %zu", what, count, n);
    for (size_t i = 0; i < n; i++) {
        CHECK(strcmp(got[i].name, m[i].name) == 0 && got[i].granularity == m[i].granularity &&
                  got[i].flags == m[i].flags,
              "%s: bitmap %zu is '%s' of %llu flags %u, want '%s' of %llu flags %u", what, i,
              got[i].name, (unsigned long long)got[i].granularity, got[i].flags, m[i].name,
              (unsigned long long)m[i].granularity, m[i].flags);
        struct ic_extent_list l = {0};
        must(ic_image_dirty_map(img, m[i].name, 0, size, &l, &err), &err, "dirty map");
        uint64_t pos = 0;
        for (size_t k = 0; k < l.count; k++) {
            const struct ic_extent *e = &l.items[k];
            CHECK(e->start == pos, "%s: '%s': extents not contiguous", what, m[i].name);
            int dirty = (e->flags & IC_EXT_DIRTY) != 0;
            for (uint64_t g = e->start / m[i].granularity;
                 g <= (e->start + e->length - 1) / m[i].granularity; g++)
                CHECK(m[i].granules[g] == dirty, "%s: '%s': granule %llu (offset %llu) is "
                      "%s, want %s", what, m[i].name, (unsigned long long)g,
                      (unsigned long long)(g * m[i].granularity), dirty ? "dirty" : "clean",
                      dirty ? "clean" : "dirty");
            pos += e->length;
        }
        CHECK(pos == size, "%s: '%s': the map ends at %llu", what, m[i].name,
              (unsigned long long)pos);
        ic_extent_list_free(&l);
    }
    ic_image_close(img);
}

static void free_models(struct model *m, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(m[i].granules);
}

/* Pseudo-random ranges: short ones, long ones across clusters of bits,
 * one at the end of the disk. */
static size_t random_ranges(struct ic_range *r, size_t cap, uint64_t size)
{
    size_t n = 0;
    for (; n + 1 < cap; n++) {
        uint64_t off = next_random() % size;
        uint64_t most = size - off, len = next_random() % 4 == 0 ? next_random() % most + 1
                                                                 : next_random() % 5000 + 1;
        r[n] = (struct ic_range){off, len < most ? len : most};
    }
    r[n++] = (struct ic_range){size - 1, 1};
    return n;
}

static void stores(const char *what, uint64_t size, uint64_t cluster, int compress,
                   int overlay)
{
    struct ic_error err = {0};
    const char *path = path_of("stores.qcow2");
    struct ic_image *img;
    if (overlay) {
        struct ic_image *base = create(path_of("base.qcow2"), size, cluster, 0, 0);
        write_some(base, cluster);
        must(ic_image_finish(base, 0, &err), &err, "finish the base");
        ic_image_close(base);
        struct ic_create_options o = {.cluster_size = cluster, .backing_file = "base.qcow2",
                                      .backing_format = "qcow2"};
        int fresh;
        must(ic_image_create(path, "qcow2", size, 0, &o, &img, &fresh, &err), &err, "overlay");
    } else {
        img = create(path, size, cluster, 0, compress);
    }
    if (!compress)
        write_some(img, cluster);
    static const uint64_t granularities[] = {512, 4096, 65536, 2u << 20, 1u << 31};
    struct model m[8];
    static const char *names[] = {"g512", "g4k", "g64k", "g2M", "g2G", "empty", "all", "e\xc3\xa9"};
    size_t n = 0;
    struct ic_range r[64];
    for (; n < 5; n++) {
        m[n] = (struct model){names[n], granularities[n], n % 2 ? 0 : IC_BITMAP_AUTO, NULL};
        size_t nr = random_ranges(r, 1 + next_random() % 60, size);
        model_ranges(&m[n], size, r, nr);
        must(ic_image_add_bitmap(img, m[n].name, m[n].granularity, m[n].flags, r, nr, &err),
             &err, names[n]);
    }
    /* no range at all; the whole disk (clusters of ones); a non-ASCII name */
    m[n] = (struct model){names[n], 65536, IC_BITMAP_AUTO, NULL};
    model_ranges(&m[n], size, NULL, 0);
    must(ic_image_add_bitmap(img, names[n], 65536, IC_BITMAP_AUTO, NULL, 0, &err), &err, "empty");
    n++;
    struct ic_range all = {0, size};
    m[n] = (struct model){names[n], 512, 0, NULL};
    model_ranges(&m[n], size, &all, 1);
    must(ic_image_add_bitmap(img, names[n], 512, 0, &all, 1, &err), &err, "all");
    n++;
    m[n] = (struct model){names[n], 1u << 20, IC_BITMAP_AUTO, NULL};
    model_ranges(&m[n], size, r, 3);
    must(ic_image_add_bitmap(img, names[n], 1u << 20, IC_BITMAP_AUTO, r, 3, &err), &err,
         "utf-8 name");
    n++;
    /* until finish, the writer lists no bitmap */
    CHECK(ic_image_bitmaps(img, NULL, 0) == 0, "%s: the writer lists bitmaps", what);
    must(ic_image_finish(img, 1, &err), &err, "finish");
    ic_image_close(img);
    expect_bitmaps(path, m, n, what);
    check_clean(path, what);
    free_models(m, n);
}

/* ic_image_copy_bitmap: from the image stores() made to a new one. */
static void copies(void)
{
    struct ic_error err = {0};
    uint64_t size = (5u << 20) + 3 * 512;
    const char *src_path = path_of("copy-src.qcow2"), *dst_path = path_of("copy-dst.qcow2");
    struct ic_image *src = create(src_path, size, 512, 0, 0);
    struct ic_range r[40];
    size_t nr = random_ranges(r, 40, size);
    struct model m[2] = {{"one", 512, IC_BITMAP_AUTO, NULL}, {"two", 65536, 0, NULL}};
    model_ranges(&m[0], size, r, nr);
    model_ranges(&m[1], size, r, nr / 2);
    must(ic_image_add_bitmap(src, "one", 512, IC_BITMAP_AUTO, r, nr, &err), &err, "one");
    must(ic_image_add_bitmap(src, "two", 65536, 0, r, nr / 2, &err), &err, "two");
    must(ic_image_finish(src, 0, &err), &err, "finish");
    ic_image_close(src);
    must(ic_image_open(src_path, "qcow2", 0, &src, &err), &err, "open the source");
    struct ic_image *dst = create(dst_path, size, 65536, 0, 0);
    must(ic_image_copy_bitmap(dst, src, "two", &err), &err, "copy two");
    must(ic_image_copy_bitmap(dst, src, "one", &err), &err, "copy one");
    CHECK(ic_image_copy_bitmap(dst, src, "three", &err) < 0 && err.kind == IC_ERR_VALUE,
          "a missing bitmap copied");
    CHECK(ic_image_copy_bitmap(dst, src, "one", &err) < 0 && err.kind == IC_ERR_VALUE &&
              strstr(err.msg, "already exists"), "a bitmap copied twice: %s", err.msg);
    must(ic_image_finish(dst, 0, &err), &err, "finish the copy");
    ic_image_close(dst);
    ic_image_close(src);
    struct model want[2] = {m[1], m[0]};
    expect_bitmaps(dst_path, want, 2, "copied");
    check_clean(dst_path, "copied");
    free_models(m, 2);
}

/* Ranges a cluster of bits apart; the source fails after `*left`. */
static int failing_source(void *ctx, struct ic_range *out, struct ic_error *err)
{
    int *left = ctx;
    if (*left == 0)
        return ic_error_value(err, "the source failed");
    *out = (struct ic_range){(uint64_t)(6 - --*left) << 21, 512};
    return 1;
}

static int backwards(void *ctx, struct ic_range *out, struct ic_error *err)
{
    (void)err;
    int *left = ctx;
    if (*left == 0)
        return 0;
    *out = (struct ic_range){(uint64_t)(--*left) << 21, 512};
    return 1;
}

#define REFUSED(call, kind_, text)                                                         \
    do {                                                                                   \
        memset(&err, 0, sizeof err);                                                       \
        CHECK((call) < 0 && err.kind == (kind_) && strstr(err.msg, text),                  \
              "%s: kind %d: %s", #call, err.kind, err.msg);                                \
    } while (0)

static void refusals(void)
{
    struct ic_error err = {0};
    uint64_t size = 16u << 20;
    const char *path = path_of("refused.qcow2");
    struct ic_image *img = create(path, size, 512, 0, 0);
    write_some(img, 65536);
    struct ic_range past = {size - 512, 1024}, one = {0, 1};
    static char long_name[1100];
    memset(long_name, 'n', sizeof long_name - 1);
    REFUSED(ic_image_add_bitmap(img, "", 65536, 0, NULL, 0, &err), IC_ERR_VALUE, "name");
    REFUSED(ic_image_add_bitmap(img, NULL, 65536, 0, NULL, 0, &err), IC_ERR_VALUE, "name");
    REFUSED(ic_image_add_bitmap(img, long_name, 65536, 0, NULL, 0, &err), IC_ERR_VALUE,
            "Name length exceeds maximum (1023");
    long_name[1023] = '\0';
    must(ic_image_add_bitmap(img, long_name, 65536, 0, &one, 1, &err), &err, "1023 bytes");
    REFUSED(ic_image_add_bitmap(img, long_name, 512, 0, NULL, 0, &err), IC_ERR_VALUE,
            "already exists");
    REFUSED(ic_image_add_bitmap(img, "g", 256, 0, NULL, 0, &err), IC_ERR_VALUE, "minimum");
    REFUSED(ic_image_add_bitmap(img, "g", 1ull << 32, 0, NULL, 0, &err), IC_ERR_VALUE,
            "maximum");
    REFUSED(ic_image_add_bitmap(img, "g", 3000, 0, NULL, 0, &err), IC_ERR_VALUE,
            "power of two");
    REFUSED(ic_image_add_bitmap(img, "g", 0, 0, NULL, 0, &err), IC_ERR_VALUE, "power of two");
    REFUSED(ic_image_add_bitmap(img, "g", 65536, IC_BITMAP_IN_USE, NULL, 0, &err),
            IC_ERR_VALUE, "consistent");
    REFUSED(ic_image_add_bitmap(img, "g", 65536, 0, &past, 1, &err), IC_ERR_VALUE, "");
    /* the driver's own checks of what its source gives: out of order, or
     * failing half way; the clusters of bits written meanwhile are given
     * back (the check below finds no leak) */
    int left = 4;
    REFUSED(img->drv->add_bitmap(img, "b", 9, 0, backwards, &left, &err), IC_ERR_VALUE,
            "not after the one before");
    left = 5;
    REFUSED(img->drv->add_bitmap(img, "f", 9, 0, failing_source, &left, &err), IC_ERR_VALUE,
            "the source failed");
    must(ic_image_finish(img, 0, &err), &err, "finish");
    ic_image_close(img);
    struct model kept = {long_name, 65536, 0, NULL};
    model_ranges(&kept, size, &one, 1);
    expect_bitmaps(path, &kept, 1, "the one accepted");
    free_models(&kept, 1);
    check_clean(path, "refusals");

    /* too large: 512-byte granules of a 4 TiB disk are 1 GiB of bits
     * (qemu's limit: 512 MiB) */
    img = create(path_of("huge.qcow2"), 1ull << 42, 2u << 20, 0, 0);
    REFUSED(ic_image_add_bitmap(img, "fine", 512, 0, NULL, 0, &err), IC_ERR_VALUE,
            "Use larger granularity");
    must(ic_image_add_bitmap(img, "coarse", 65536, 0, &one, 1, &err), &err, "coarse");
    must(ic_image_finish(img, 0, &err), &err, "finish the huge one");
    ic_image_close(img);
    check_clean(path_of("huge.qcow2"), "huge");
    unlink(path_of("huge.qcow2"));

    /* v2; an empty disk; read-only; an existing image; raw */
    img = create(path_of("v2.qcow2"), size, 65536, 1, 0);
    REFUSED(ic_image_add_bitmap(img, "b", 65536, 0, NULL, 0, &err), IC_ERR_VALUE, "v2");
    ic_image_close(img);
    img = create(path_of("empty.qcow2"), 0, 65536, 0, 0);
    REFUSED(ic_image_add_bitmap(img, "b", 65536, 0, NULL, 0, &err), IC_ERR_VALUE, "0 bytes");
    ic_image_close(img);
    must(ic_image_open(path, "qcow2", 0, &img, &err), &err, "open read-only");
    REFUSED(ic_image_add_bitmap(img, "b", 65536, 0, NULL, 0, &err), IC_ERR_READONLY, "");
    struct ic_image *raw;
    int fresh;
    must(ic_image_create(path_of("raw"), "raw", size, 0, NULL, &raw, &fresh, &err), &err, "raw");
    REFUSED(ic_image_add_bitmap(raw, "b", 65536, 0, NULL, 0, &err), IC_ERR_OS, "raw");
    CHECK(err.errnum == ENOTSUP, "raw: errno %d", err.errnum);
    REFUSED(ic_image_copy_bitmap(img, raw, "b", &err), IC_ERR_VALUE, "Source lacks bitmap");
    ic_image_close(raw);
    ic_image_close(img);
    must(ic_image_open(path, "qcow2", IC_OPEN_RDWR, &img, &err), &err, "open for writing");
    REFUSED(ic_image_add_bitmap(img, "b", 65536, 0, NULL, 0, &err), IC_ERR_OS, "existing");
    CHECK(err.errnum == ENOTSUP, "existing: errno %d", err.errnum);
    ic_image_close(img);
}

/* Finishing more than once: a write after the finish that stored the
 * bitmaps drops them; a bitmap added after a finish is stored with the
 * others by the next one. */
static void finishes(void)
{
    struct ic_error err = {0};
    uint64_t size = 3u << 20;
    struct ic_range r = {70000, 200000};
    uint8_t data[4096] = {1};
    const char *path = path_of("again.qcow2");
    struct ic_image *img = create(path, size, 65536, 0, 0);
    must(ic_image_add_bitmap(img, "a", 65536, IC_BITMAP_AUTO, &r, 1, &err), &err, "a");
    must(ic_image_finish(img, 0, &err), &err, "finish");
    must(ic_image_add_bitmap(img, "b", 512, 0, &r, 1, &err), &err, "b");
    must(ic_image_finish(img, 0, &err), &err, "finish again");
    ic_image_close(img);
    struct model m[2] = {{"a", 65536, IC_BITMAP_AUTO, NULL}, {"b", 512, 0, NULL}};
    model_ranges(&m[0], size, &r, 1);
    model_ranges(&m[1], size, &r, 1);
    expect_bitmaps(path, m, 2, "added after a finish");
    check_clean(path, "added after a finish");
    free_models(m, 2);

    img = create(path, size, 65536, 0, 0);
    must(ic_image_add_bitmap(img, "a", 65536, IC_BITMAP_AUTO, &r, 1, &err), &err, "a");
    must(ic_image_pwrite(img, data, sizeof data, 0, &err), &err, "a write before finish");
    must(ic_image_finish(img, 0, &err), &err, "finish");
    must(ic_image_pwrite(img, data, sizeof data, 1u << 20, &err), &err, "a write after it");
    must(ic_image_finish(img, 0, &err), &err, "finish again");
    ic_image_close(img);
    expect_bitmaps(path, NULL, 0, "written after a finish");
    check_clean(path, "written after a finish");
}

/* A resumed writer: the bits a crash left are no one's; the bitmap added
 * again is stored. */
static void resumes(void)
{
    struct ic_error err = {0};
    uint64_t size = (4u << 20) + 512;
    struct ic_range before = {0, size}, after = {1u << 20, 5000};
    const char *path = path_of("resumed.qcow2");
    uint8_t data[8192];
    memset(data, 7, sizeof data);
    /* 0: no bitmap before the crash; 1: its bits were written (at the end
     * of the file: cut off); 2: data after them (inside the file: free) */
    for (int v = 0; v < 3; v++) {
        struct ic_image *img = create(path, size, 512, 0, 0);
        write_some(img, 4096);
        must(ic_image_checkpoint(img, &err), &err, "checkpoint");
        if (v) /* the crash comes after the bits were written */
            must(ic_image_add_bitmap(img, "x", 512, 0, &before, 1, &err), &err, "x");
        if (v == 2)
            must(ic_image_pwrite(img, data, sizeof data, 2u << 20, &err), &err, "write");
        must(ic_image_checkpoint(img, &err), &err, "checkpoint");
        ic_image_close(img); /* a crash: never finished */
        must(ic_image_open(path, "qcow2", IC_OPEN_RDWR | IC_OPEN_RESUME, &img, &err), &err,
             "resume");
        write_some(img, 4096);
        must(ic_image_add_bitmap(img, "x", 4096, IC_BITMAP_AUTO, &after, 1, &err), &err,
             "x again");
        must(ic_image_finish(img, 1, &err), &err, "finish the resumed image");
        ic_image_close(img);
        struct model m = {"x", 4096, IC_BITMAP_AUTO, NULL};
        model_ranges(&m, size, &after, 1);
        expect_bitmaps(path, &m, 1, v ? "resumed after the bits" : "resumed");
        if (v == 2) {
            uint8_t back[sizeof data];
            must(ic_image_open(path, "qcow2", 0, &img, &err), &err, "open");
            must(ic_image_pread(img, back, sizeof back, 2u << 20, &err), &err, "read");
            CHECK(memcmp(back, data, sizeof data) == 0, "the write after the bits is lost");
            ic_image_close(img);
        }
        check_clean(path, "resumed");
        free_models(&m, 1);
    }
}

int main(void)
{
    CHECK(mkdtemp(dir), "mkdtemp: %s", strerror(errno));
    stores("64 KiB clusters", (10u << 20) + 3 * 512, 65536, 0, 0);
    stores("512 B clusters", (5u << 20) + 512, 512, 0, 0);
    stores("4 KiB clusters, compressed", 7u << 20, 4096, 1, 0);
    stores("an overlay", (3u << 20) + 1024, 65536, 0, 1);
    copies();
    refusals();
    finishes();
    resumes();
    static const char *const files[] = {"stores.qcow2", "base.qcow2", "copy-src.qcow2",
                                        "copy-dst.qcow2", "refused.qcow2", "v2.qcow2",
                                        "empty.qcow2", "raw", "again.qcow2", "resumed.qcow2"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++)
        unlink(path_of(files[i]));
    CHECK(rmdir(dir) == 0, "rmdir %s: %s", dir, strerror(errno));
    printf("test_qcow2_bitmaps: %lu checks passed\n", check_count);
    return 0;
}
