/* Sparse detection (csrc/sparse.c) against a brute-force statement of
 * qemu-img convert -S's rule, whatever the buffers the extent is cut into:
 * per 2 MiB window counted from the extent's start, zero blocks (aligned in
 * the guest, clipped at the window) form runs; a run is a hole when it is
 * at least the threshold long or touches the window's edge. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "imgcopy.h"
#include "sparse.h"

#define IMAGE (14u << 20)

static uint8_t *image;
static uint8_t *expect_hole, *got_hole; /* per byte */

static int read_image(void *ctx, void *buf, uint64_t off, uint64_t len)
{
    (void)ctx;
    CHECK(off + len <= IMAGE, "look-around read past the image");
    memcpy(buf, image + off, len);
    return 0;
}

static uint64_t cursor; /* pieces must tile the buffer in order */

static void record(void *ctx, uint64_t off, uint64_t len, int data)
{
    (void)ctx;
    CHECK(off == cursor && len > 0, "piece %llu+%llu out of order (at %llu)",
          (unsigned long long)off, (unsigned long long)len, (unsigned long long)cursor);
    memset(got_hole + off, !data, len);
    cursor = off + len;
}

static void reference(uint64_t es, uint64_t ee, uint64_t threshold, uint64_t g)
{
    memset(expect_hole + es, 0, ee - es);
    for (uint64_t ws = es; ws < ee; ws += IC_SPARSE_WINDOW) {
        uint64_t we = ee - ws > IC_SPARSE_WINDOW ? ws + IC_SPARSE_WINDOW : ee;
        uint64_t pos = ws, run = 0;
        while (pos < we) {
            uint64_t b1 = (pos / g + 1) * g;
            if (b1 > we)
                b1 = we;
            int zero = ic_is_zero(image + pos, b1 - pos);
            if (zero && !run)
                run = pos + 1; /* start + 1: 0 means none */
            if (!zero || b1 == we) {
                uint64_t za = run ? run - 1 : 0, zb = zero ? b1 : pos;
                if (run && (zb - za >= threshold || za == ws || zb == we))
                    memset(expect_hole + za, 1, zb - za);
                run = 0;
            }
            pos = b1;
        }
    }
}

static void fill(unsigned seed)
{
    srand(seed);
    for (uint64_t off = 0; off < IMAGE;) {
        uint64_t len = (uint64_t)(1 + rand() % 96) * 512 * (rand() % 7 == 0 ? 64 : 1);
        if (off + len > IMAGE)
            len = IMAGE - off;
        int zero = rand() % 2;
        for (uint64_t i = 0; i < len; i++)
            image[off + i] = zero ? 0 : (uint8_t)(1 + (off + i) % 253);
        off += len;
    }
}

int main(void)
{
    image = malloc(IMAGE);
    expect_hole = malloc(IMAGE);
    got_hole = malloc(IMAGE);
    CHECK(image && expect_hole && got_hole, "malloc");
    static const uint64_t thresholds[] = {512, 4096, 12288, 65536, 1 << 20, 3 << 20, 16 << 20};
    uint8_t *scratch = malloc(16u << 20);
    CHECK(scratch != NULL, "malloc");
    unsigned cases = 0;
    for (unsigned seed = 1; seed <= 12; seed++) {
        fill(seed);
        uint64_t es = (uint64_t)(rand() % 64) * 4096, ee = IMAGE - (uint64_t)(rand() % 64) * 512;
        for (size_t t = 0; t < sizeof thresholds / sizeof thresholds[0]; t++) {
            uint64_t g = ic_sparse_granularity(thresholds[t]);
            /* look-around reads as the engine sizes them: up to 1 MiB of
             * whole blocks, at least one */
            size_t scratch_size = g > (1u << 20) ? g : (1u << 20) / g * g;
            struct ic_sparse sp = {.threshold = thresholds[t], .granularity = g,
                                   .scratch = scratch, .scratch_size = scratch_size,
                                   .read = read_image};
            reference(es, ee, thresholds[t], g);
            /* the buffers: cut on the guest grid of a random multiple of g */
            uint64_t step = g * (uint64_t)(1 + rand() % 8);
            cursor = es;
            for (uint64_t pos = es; pos < ee;) {
                uint64_t next = (pos / step + 1) * step;
                if (next > ee)
                    next = ee;
                CHECK(ic_sparse_split(&sp, image + pos, pos, next, es, ee, record, NULL) == 0,
                      "split");
                pos = next;
            }
            CHECK(cursor == ee, "pieces end at %llu", (unsigned long long)cursor);
            for (uint64_t i = es; i < ee; i++)
                CHECK(got_hole[i] == expect_hole[i], "seed %u threshold %llu step %llu: byte "
                      "%llu is %s, qemu's rule says %s", seed,
                      (unsigned long long)thresholds[t], (unsigned long long)step,
                      (unsigned long long)i, got_hole[i] ? "a hole" : "data",
                      expect_hole[i] ? "a hole" : "data");
            cases++;
        }
    }
    free(scratch);
    free(image);
    free(expect_hole);
    free(got_hole);
    printf("test_sparse: %u cases agree with qemu's rule\n", cases);
    return 0;
}
