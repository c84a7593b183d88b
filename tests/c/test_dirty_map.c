/* Dirty maps without an image: an extent map with a dirty map laid over
 * it (ic_extents_mark_dirty), the outputs of a dirty map (JSON and human),
 * and the size of a bitmap table qemu can read. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "drivers/qcow2_format.h"
#include "imgcopy.h"

#define DATA (IC_EXT_DATA | IC_EXT_PRESENT | IC_EXT_OFFSET_VALID)
#define HOLE 0u
#define D IC_EXT_DIRTY

static void expect_text(const char *what, char *got, const char *want)
{
    CHECK(got && strcmp(got, want) == 0, "%s:\n got: %s\nwant: %s", what,
          got ? got : "(null)", want);
    free(got);
}

/* The pieces ic_extents_mark_dirty made, as (start, length, flags, host) */
static void expect_pieces(const char *what, const struct ic_extent_list *l,
                          const struct ic_extent *want, size_t n)
{
    CHECK(l->count == n, "%s: %zu pieces, want %zu", what, l->count, n);
    for (size_t i = 0; i < n; i++) {
        const struct ic_extent *g = &l->items[i], *w = &want[i];
        CHECK(g->start == w->start && g->length == w->length && g->flags == w->flags &&
                  g->depth == w->depth &&
                  (!(w->flags & IC_EXT_OFFSET_VALID) || g->host_offset == w->host_offset),
              "%s: piece %zu is %llu+%llu flags %#x host %llu, want %llu+%llu flags %#x host "
              "%llu", what, i, (unsigned long long)g->start, (unsigned long long)g->length,
              g->flags, (unsigned long long)g->host_offset, (unsigned long long)w->start,
              (unsigned long long)w->length, w->flags, (unsigned long long)w->host_offset);
    }
}

static void mark_dirty(void)
{
    struct ic_error err = {0};
    /* data [0, 64k) at host 1M, a hole [64k, 192k), data [192k, 256k) at depth 1 */
    const struct ic_extent map[] = {
        {.start = 0, .length = 65536, .host_offset = 1 << 20, .flags = DATA},
        {.start = 65536, .length = 131072, .flags = HOLE},
        {.start = 196608, .length = 65536, .host_offset = 4 << 20, .flags = DATA, .depth = 1},
    };
    /* dirty [4k, 8k), [60k, 200k); clean elsewhere */
    const struct ic_extent dirty[] = {
        {.start = 0, .length = 4096},
        {.start = 4096, .length = 4096, .flags = D},
        {.start = 8192, .length = 53248},
        {.start = 61440, .length = 143360, .flags = D},
        {.start = 204800, .length = 57344},
    };
    const struct ic_extent want[] = {
        {.start = 0, .length = 4096, .host_offset = 1 << 20, .flags = DATA},
        {.start = 4096, .length = 4096, .host_offset = (1 << 20) + 4096, .flags = DATA | D},
        {.start = 8192, .length = 53248, .host_offset = (1 << 20) + 8192, .flags = DATA},
        {.start = 61440, .length = 4096, .host_offset = (1 << 20) + 61440, .flags = DATA | D},
        {.start = 65536, .length = 131072, .flags = HOLE | D},
        {.start = 196608, .length = 8192, .host_offset = 4 << 20, .flags = DATA | D,
         .depth = 1},
        {.start = 204800, .length = 57344, .host_offset = (4 << 20) + 8192, .flags = DATA,
         .depth = 1},
    };
    struct ic_extent_list out = {0};
    CHECK(ic_extents_mark_dirty(map, 3, dirty, 5, &out, &err) == 0, "%s", err.msg);
    expect_pieces("cut and flagged", &out, want, sizeof want / sizeof want[0]);
    struct ic_extent_totals t;
    ic_extent_totals(out.items, out.count, &t);
    CHECK(t.dirty == 4096 + 4096 + 131072 + 8192, "dirty bytes %llu",
          (unsigned long long)t.dirty);

    /* a dirty map of part of the range only: the rest is clean; dirty
     * neighbours in the map that lay over one extent stay one piece */
    const struct ic_extent part[] = {
        {.start = 65536, .length = 4096, .flags = D},
        {.start = 69632, .length = 4096, .flags = D},
    };
    const struct ic_extent want_part[] = {
        map[0],
        {.start = 65536, .length = 8192, .flags = HOLE | D},
        {.start = 73728, .length = 122880, .flags = HOLE},
        map[2],
    };
    out.count = 0;
    CHECK(ic_extents_mark_dirty(map, 3, part, 2, &out, &err) == 0, "%s", err.msg);
    expect_pieces("partial dirty map", &out, want_part, 4);

    /* no dirty map: the extent map as it was, merged as qemu-img map merges */
    out.count = 0;
    CHECK(ic_extents_mark_dirty(map, 3, NULL, 0, &out, &err) == 0, "%s", err.msg);
    expect_pieces("no dirty map", &out, map, 3);
    /* and flags IC_EXT_DIRTY that were set before are cleared where clean */
    struct ic_extent stale = {.start = 0, .length = 512, .flags = DATA | D};
    out.count = 0;
    CHECK(ic_extents_mark_dirty(&stale, 1, NULL, 0, &out, &err) == 0, "%s", err.msg);
    CHECK(out.count == 1 && out.items[0].flags == DATA, "stale dirty flag kept");
    ic_extent_list_free(&out);
}

static void formats(void)
{
    struct ic_error err = {0};
    expect_text("empty json", ic_format_dirty_json(NULL, 0, 7, &err),
                "[{ \"start\": 7, \"length\": 0, \"dirty\": false}]\n");
    /* neighbours merge by the dirty flag alone */
    const struct ic_extent e[] = {
        {.start = 0, .length = 4096, .flags = DATA},
        {.start = 4096, .length = 4096, .flags = HOLE},
        {.start = 8192, .length = 512, .flags = DATA | D},
        {.start = 8704, .length = 65536, .flags = HOLE | D},
        {.start = 74240, .length = 1024, .flags = HOLE},
    };
    expect_text("json", ic_format_dirty_json(e, 5, 0, &err),
                "[{ \"start\": 0, \"length\": 8192, \"dirty\": false},\n"
                "{ \"start\": 8192, \"length\": 66048, \"dirty\": true},\n"
                "{ \"start\": 74240, \"length\": 1024, \"dirty\": false}]\n");
    expect_text("human", ic_format_dirty_human(e, 5, "disk.qcow2", &err),
                "Offset          Length          File\n"
                "0x2000          0x10200         disk.qcow2\n");
    expect_text("human, nothing dirty", ic_format_dirty_human(e, 2, "d", &err),
                "Offset          Length          File\n");
}

static void table_sizes(void)
{
    /* qemu counts 64-bit words of bits, in whole clusters */
    CHECK(qcow2_bitmap_table_needed(0, 16, 65536) == 0, "empty disk");
    CHECK(qcow2_bitmap_table_needed(512, 16, 65536) == 1, "one sector");
    CHECK(qcow2_bitmap_table_needed(10 << 20, 16, 65536) == 1, "10 MiB, 64k granules");
    /* 1 TiB at 64 KiB: 16 Mi bits, 2 MiB of them: 32 clusters of 64 KiB */
    CHECK(qcow2_bitmap_table_needed(1ull << 40, 16, 65536) == 32, "1 TiB");
    /* 512 B clusters hold 4096 bits; 4097 granules need 4160 bits (65 words) */
    CHECK(qcow2_bitmap_table_needed(4096ull * 512, 9, 512) == 1, "4096 granules");
    CHECK(qcow2_bitmap_table_needed(4097ull * 512, 9, 512) == 2, "4097 granules");
    /* a partial granule counts as one */
    CHECK(qcow2_bitmap_table_needed((4096ull << 21) + 512, 21, 512) == 2, "partial granule");
    CHECK(qcow2_bitmap_table_needed(1ull << 62, 31, 1 << 21) == 128, "huge granules");
}

int main(void)
{
    mark_dirty();
    formats();
    table_sizes();
    printf("test_dirty_map: %lu checks passed\n", check_count);
    return 0;
}
