/* Changed ranges as callers hand them in: any order, overlapping,
 * touching, empty, out of range, near UINT64_MAX. */
#include <stdint.h>
#include <stdlib.h>

#include "check.h"
#include "imgcopy.h"

static void test_merges_and_sorts(void)
{
    struct ic_range r[] = {{100, 10}, {0, 5}, {5, 5}, {105, 20}, {50, 0}, {200, 1}, {0, 1}};
    size_t n = sizeof r / sizeof *r;
    struct ic_error err = {0};
    CHECK(ic_ranges_normalize(r, &n, 1000, &err) == 0, "normalize: %s", err.msg);
    CHECK(n == 3, "%zu ranges", n);
    CHECK(r[0].offset == 0 && r[0].length == 10, "first %llu+%llu",
          (unsigned long long)r[0].offset, (unsigned long long)r[0].length);
    CHECK(r[1].offset == 100 && r[1].length == 25, "second");
    CHECK(r[2].offset == 200 && r[2].length == 1, "third");
}

static void test_refuses_outside(void)
{
    struct ic_error err = {0};
    struct ic_range a[] = {{0, 1}, {999, 2}};
    size_t n = 2;
    CHECK(ic_ranges_normalize(a, &n, 1000, &err) == -1 && err.kind == IC_ERR_VALUE, "past end");
    struct ic_range b[] = {{UINT64_MAX, 2}};
    n = 1;
    CHECK(ic_ranges_normalize(b, &n, UINT64_MAX, &err) == -1, "overflow");
    struct ic_range c[] = {{1001, 0}};
    n = 1;
    CHECK(ic_ranges_normalize(c, &n, 1000, &err) == -1, "empty past end");
    struct ic_range d[] = {{1000, 0}, {0, 1000}};
    n = 2;
    CHECK(ic_ranges_normalize(d, &n, 1000, &err) == 0 && n == 1, "the whole, and nothing at the end");
}

static void test_random(void)
{
    enum { N = 500, SIZE = 4096 };
    srand(7);
    for (int round = 0; round < 200; round++) {
        struct ic_range r[N];
        unsigned char want[SIZE] = {0}, got[SIZE] = {0};
        size_t n = (size_t)(rand() % N);
        for (size_t i = 0; i < n; i++) {
            uint64_t off = (uint64_t)(rand() % SIZE), len = (uint64_t)(rand() % 64);
            if (off + len > SIZE)
                len = SIZE - off;
            r[i] = (struct ic_range){off, len};
            for (uint64_t k = off; k < off + len; k++)
                want[k] = 1;
        }
        struct ic_error err = {0};
        CHECK(ic_ranges_normalize(r, &n, SIZE, &err) == 0, "round %d: %s", round, err.msg);
        for (size_t i = 0; i < n; i++) {
            CHECK(r[i].length > 0, "empty range kept");
            CHECK(i == 0 || r[i].offset > r[i - 1].offset + r[i - 1].length,
                  "round %d: ranges %zu and %zu touch or overlap", round, i - 1, i);
            for (uint64_t k = r[i].offset; k < r[i].offset + r[i].length; k++)
                got[k] = 1;
        }
        for (int k = 0; k < SIZE; k++)
            CHECK(got[k] == want[k], "round %d: byte %d", round, k);
    }
}

int main(void)
{
    test_merges_and_sorts();
    test_refuses_outside();
    test_random();
    printf("test_ranges: %lu checks passed\n", check_count);
    return 0;
}
