/* What the destination reads as zeros before a copy: holes of a file,
 * merged; a range is covered only when it lies inside one run. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "copy_internal.h"

#define MIB (1u << 20)

int main(void)
{
    char path[] = "/tmp/imgcopy-test-known-zeros-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp");
    static char data[64 << 10];
    memset(data, 0x5a, sizeof data);
    /* data at [1 MiB, 1 MiB + 64 KiB) and [3 MiB, 3 MiB + 64 KiB) of 8 MiB */
    CHECK(pwrite(fd, data, sizeof data, MIB) == (ssize_t)sizeof data, "pwrite");
    CHECK(pwrite(fd, data, sizeof data, 3 * MIB) == (ssize_t)sizeof data, "pwrite");
    CHECK(ftruncate(fd, 8 * MIB) == 0, "ftruncate");
    close(fd);

    struct ic_image *img;
    struct ic_error err = {0};
    CHECK(ic_image_open(path, "raw", IC_OPEN_RDWR, &img, &err) == 0, "open: %s", err.msg);
    struct ic_known_zeros z;
    CHECK(ic_known_zeros_init(&z, img, 8 * MIB) == 0, "init");
    const struct {
        uint64_t off, len;
        int covered;
    } cases[] = {
        {0, MIB, 1},                    /* the first hole, whole */
        {4096, 8192, 1},                /* inside it */
        {MIB - 4096, 8192, 0},          /* into the data */
        {MIB, 4096, 0},                 /* data */
        {MIB + (64 << 10), 2 * MIB - (64 << 10), 1}, /* the hole between */
        {2 * MIB, 2 * MIB, 0},          /* across the second data run */
        {3 * MIB + (64 << 10), 5 * MIB - (64 << 10), 1}, /* the tail */
        {8 * MIB - 1, 1, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        CHECK(ic_known_zeros_cover(&z, cases[i].off, cases[i].len) == cases[i].covered,
              "case %zu: [%llu, +%llu)", i, (unsigned long long)cases[i].off,
              (unsigned long long)cases[i].len);
    ic_known_zeros_free(&z);
    /* a copy only as long as the source: nothing past `end` is asked */
    CHECK(ic_known_zeros_init(&z, img, 2 * MIB) == 0, "init");
    CHECK(!ic_known_zeros_cover(&z, 3 * MIB + (64 << 10), 4096), "past end");
    ic_known_zeros_free(&z);
    ic_image_close(img);
    unlink(path);
    printf("test_known_zeros: passed\n");
    return 0;
}
