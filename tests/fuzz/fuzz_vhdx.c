/* libFuzzer target for the VHDX parser and read driver.
 *
 * A VHDX file is at least a few MiB and mostly zeros, so an input is a
 * list of segments: an 8-byte record (u32 offset in 512-byte units, u32
 * length, little endian) followed by that many bytes (fewer if the input
 * ends), placed at that offset of a sparse file; the file ends at the
 * furthest segment's end (an empty segment sets the size).  Files are
 * capped at FILE_MAX so that a run never fills the disk.
 * tests/fuzz/hostile_vhdx.py's to_segments() writes images this way.
 *
 * Each input goes through the pure functions of vhdx_format.c (every
 * segment's bytes as a header, a region table, a metadata table and a
 * parent locator) and then through the whole driver, as fuzz_common.h's
 * fuzz_exercise does (open, map, reads).  The private directory holds
 *   input.vhdx  the input (a parent named "input.vhdx" is a loop)
 *   base.vhdx   a second copy, so a chain input -> base.vhdx -> ... is
 *               hostile at every level. */
#include "fuzz_common.h"
#include "drivers/vhdx_format.h"

#define FILE_MAX (256ull << 20)

enum { INPUT, BASE };
static const char *const names[] = {"input.vhdx", "base.vhdx"};

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_init_dir("imgcopy-fuzz-vhdx.", names, sizeof names / sizeof names[0]);
    (void)put_file; /* inputs are segments here (put_segments) */
    return 0;
}

struct segment {
    uint64_t offset;
    const uint8_t *data;
    size_t len;
};

/* Up to `cap` segments of the input; the file's size in *fsize. */
NO_COVERAGE static size_t segments(const uint8_t *data, size_t size, struct segment *seg,
                                   size_t cap, uint64_t *fsize)
{
    size_t n = 0, pos = 0;
    *fsize = 0;
    while (pos + 8 <= size && n < cap) {
        uint64_t off = (uint64_t)(data[pos] | data[pos + 1] << 8 | data[pos + 2] << 16 |
                                  (uint32_t)data[pos + 3] << 24) * 512;
        size_t len = (size_t)(data[pos + 4] | data[pos + 5] << 8 | data[pos + 6] << 16 |
                              (uint32_t)data[pos + 7] << 24);
        pos += 8;
        if (len > size - pos)
            len = size - pos;
        if (off <= FILE_MAX && len <= FILE_MAX - off) {
            seg[n].offset = off;
            seg[n].data = data + pos;
            seg[n].len = len;
            if (off + len > *fsize)
                *fsize = off + len;
            n++;
        }
        pos += len;
    }
    return n;
}

NO_COVERAGE static void put_segments(const char *name, const struct segment *seg, size_t n,
                                     uint64_t fsize)
{
    int fd = open(name, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0)
        die(name);
    struct stat st;
    if (fstat(fd, &st) < 0)
        die("fstat");
    /* zeros everywhere first (a hole), then the segments */
    if (st.st_size > 0 && fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0,
                                    st.st_size) < 0) {
        if (ftruncate(fd, 0) < 0)
            die("ftruncate");
    }
    if (ftruncate(fd, (off_t)fsize) < 0)
        die("ftruncate");
    for (size_t i = 0; i < n; i++)
        if (seg[i].len && write_all(fd, seg[i].data, seg[i].len, (off_t)seg[i].offset) < 0)
            die("pwrite");
    close(fd);
}

/* The pure functions on a buffer of at least `need` bytes (zero padded). */
static void parse_only(const uint8_t *p, size_t len)
{
    static uint8_t buf[VHDX_TABLE_SIZE];
    static struct vhdx_regions regions;
    struct ic_error err;
    memset(buf, 0, sizeof buf);
    memcpy(buf, p, len < sizeof buf ? len : sizeof buf);
    struct vhdx_header h;
    (void)vhdx_pick_header(buf, buf + VHDX_HEADER_SIZE, &h, "input", &err);
    if (vhdx_pick_header(buf, buf, &h, "input", &err) == 0)
        (void)vhdx_check_log(&h, FILE_MAX, "input", &err);
    memset(&h, 0, sizeof h);
    h.log_offset = VHDX_MIB;
    h.log_length = VHDX_MIB;
    (void)vhdx_parse_regions(buf, &h, FILE_MAX, &regions, "input", &err);
    struct vhdx_item items[VHDX_ITEM_COUNT];
    if (vhdx_parse_metadata_table(buf, sizeof buf, VHDX_MIB, items, "input", &err) == 0) {
        /* the items' values from the same buffer, where they fit */
        const uint8_t *bufs[VHDX_ITEM_COUNT] = {0};
        for (int k = 0; k < VHDX_ITEM_COUNT; k++)
            if (items[k].present && items[k].offset % sizeof buf + 16 <= sizeof buf)
                bufs[k] = buf + items[k].offset % sizeof buf;
        struct vhdx_meta m;
        if (vhdx_parse_meta_values(items, bufs, &m, "input", &err) == 0) {
            struct vhdx_geometry g;
            (void)vhdx_geometry(&m, (uint64_t)vhdx_le32(buf + 4) << 8, &g, "input", &err);
        }
    }
    struct vhdx_locator *loc = malloc(sizeof *loc);
    if (loc) {
        if (vhdx_parse_locator(p, len, loc, "input", &err) == 0) {
            char out[VHDX_PATH_MAX];
            (void)vhdx_host_path(loc->relative_path, out, sizeof out);
            (void)vhdx_host_path(loc->absolute_win32_path, out, sizeof out);
            (void)vhdx_host_path(loc->volume_path, out, sizeof out);
        }
        free(loc);
    }
    (void)vhdx_crc32c(0xffffffffu, p, len);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct segment seg[4096];
    uint64_t fsize;
    size_t n = segments(data, size, seg, sizeof seg / sizeof seg[0], &fsize);
    for (size_t i = 0; i < n && i < 16; i++)
        parse_only(seg[i].data, seg[i].len);

    put_segments(fuzz_path(INPUT), seg, n, fsize);
    put_segments(fuzz_path(BASE), seg, n, fsize);

    struct ic_image *img = NULL;
    struct ic_error err;
    if (ic_image_open(fuzz_path(INPUT), "vhdx", 0, &img, &err) < 0) {
        if (verbose)
            fprintf(stderr, "  open: %s\n", err.msg);
        return 0;
    }
    if (verbose)
        fprintf(stderr, "  open: size %llu, backing %s\n",
                (unsigned long long)ic_image_size(img),
                ic_image_backing(img) ? ic_image_path(ic_image_backing(img)) : "none");
    fuzz_exercise(img, data, size);
    ic_image_close(img);
    return 0;
}
