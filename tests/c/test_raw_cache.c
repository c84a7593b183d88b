/* The raw driver's extent cache on a real sparse file: answers in every
 * query order, lseek counts, and cache updates after writes and zeroing. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "imgcopy.h"

#define BLK 4096u
#define NBLK 4000u


static unsigned char layout[NBLK]; /* 1 = data block */

static void must(int ret, const struct ic_error *err)
{
    CHECK(ret >= 0, "%s (%s)", err->msg, strerror(err->errnum));
}

/* Every block's status, asked in the given order of blocks. */
static void check_order(const char *path, const unsigned *order, unsigned extents)
{
    struct ic_error err = {0};
    struct ic_image *img;
    must(ic_image_open(path, "raw", 0, &img, &err), &err);
    for (unsigned k = 0; k < NBLK; k++) {
        unsigned b = order[k];
        struct ic_extent e;
        must(ic_image_block_status(img, (uint64_t)b * BLK, BLK, &e, &err), &err);
        CHECK(!!(e.flags & IC_EXT_DATA) == layout[b], "block %u", b);
        CHECK(!!(e.flags & IC_EXT_ZERO) == !layout[b], "block %u", b);
        CHECK(e.host_offset == (uint64_t)b * BLK, "block %u host", b);
    }
    struct ic_cache_stats st;
    ic_image_cache_stats(img, &st);
    CHECK(st.lseek_calls <= 2u * extents + 4, "lseeks %llu for %u extents",
          (unsigned long long)st.lseek_calls, extents);
    ic_image_close(img);
}

static void map_of(struct ic_image *img, struct ic_extent_list *out)
{
    struct ic_error err = {0};
    out->count = 0;
    must(ic_image_map(img, 0, ic_image_size(img), out, &err), &err);
}

int main(void)
{
    char path[] = "/tmp/imgcopy-test-raw-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp: %s", strerror(errno));
    CHECK(ftruncate(fd, (off_t)NBLK * BLK) == 0, "ftruncate");
    srand(7);
    unsigned extents = 1;
    char buf[BLK];
    memset(buf, 0xab, sizeof buf);
    for (unsigned b = 0; b < NBLK; b++) {
        /* runs of 1..8 blocks */
        if (b == 0 || rand() % 4 == 0)
            layout[b] = b == 0 ? 0 : !layout[b - 1];
        else
            layout[b] = layout[b - 1];
        if (b > 0 && layout[b] != layout[b - 1])
            extents++;
        if (layout[b])
            CHECK(pwrite(fd, buf, BLK, (off_t)b * BLK) == BLK, "pwrite");
    }
    CHECK(fsync(fd) == 0, "fsync");
    close(fd);

    unsigned order[NBLK];
    for (unsigned k = 0; k < NBLK; k++)
        order[k] = k;
    check_order(path, order, extents);
    for (unsigned k = 0; k < NBLK; k++)
        order[k] = NBLK - 1 - k;
    check_order(path, order, extents);
    for (unsigned k = NBLK - 1; k > 0; k--) {
        unsigned j = (unsigned)rand() % (k + 1), t = order[k];
        order[k] = order[j];
        order[j] = t;
    }
    check_order(path, order, extents);

    /* writes and zeroes through the image keep the cache true */
    struct ic_error err = {0};
    struct ic_image *img;
    must(ic_image_open(path, NULL, IC_OPEN_RDWR, &img, &err), &err);
    struct ic_extent_list cached = {0}, fresh = {0};
    map_of(img, &cached);
    for (int step = 0; step < 300; step++) {
        uint64_t off = (uint64_t)(rand() % (NBLK * BLK));
        uint64_t len = 1 + (uint64_t)(rand() % (6 * BLK));
        if (off + len > (uint64_t)NBLK * BLK)
            len = (uint64_t)NBLK * BLK - off;
        if (rand() % 2) {
            static char data[6 * BLK];
            memset(data, 0x5a, sizeof data);
            must(ic_image_pwrite(img, data, len, off, &err), &err);
        } else {
            must(ic_image_zero(img, off, len, rand() % 2 ? IC_ZERO_MAY_UNMAP : 0, &err), &err);
        }
        map_of(img, &cached);
        ic_image_drop_cache(img);
        map_of(img, &fresh);
        CHECK(cached.count == fresh.count, "step %d: %zu extents cached, %zu fresh", step,
              cached.count, fresh.count);
        CHECK(memcmp(cached.items, fresh.items, cached.count * sizeof *cached.items) == 0,
              "step %d: cached map differs from a fresh one", step);
    }
    /* bounds */
    struct ic_extent e;
    CHECK(ic_image_block_status(img, (uint64_t)NBLK * BLK, 1, &e, &err) < 0 &&
              err.kind == IC_ERR_VALUE, "block status past the end");
    CHECK(ic_image_pwrite(img, buf, 2, (uint64_t)NBLK * BLK - 1, &err) < 0 &&
              err.kind == IC_ERR_VALUE, "write past the end");
    ic_extent_list_free(&cached);
    ic_extent_list_free(&fresh);
    ic_image_close(img);
    unlink(path);
    printf("test_raw_cache: %u extents, all orders passed\n", extents);
    return 0;
}
