/* libFuzzer target for the qcow2 parser and read driver.
 *
 * Each input is a qcow2 file.  It goes through the pure header functions
 * (qcow2_parse_header, qcow2_parse_extensions, qcow2_check_features,
 * qcow2_parse_bitmap_directory) and then through the whole driver:
 * ic_image_open, the bitmaps it lists and describes, ic_image_map over at most
 * the first and the last 64 MiB of the virtual disk, and a few bounded
 * ic_image_pread calls at offsets derived from the input; then the dirty
 * maps of (at most 8 of) its bitmaps over the same windows, which must be
 * tiled by extents flagged dirty or clean, neighbours differing, and one
 * ic_image_dirty_status from an offset derived from the input.  Failing with an
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
#include "fuzz_common.h"
#include "drivers/qcow2_format.h"
#include "probe.h"

enum { INPUT, BASE_QCOW2, BASE_RAW };
static const char *const names[] = {"input.qcow2", "base.qcow2", "base.raw"};

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_init_dir("imgcopy-fuzz-qcow2.", names, sizeof names / sizeof names[0]);
    /* base.raw: 1 MiB, a data block every 64 KiB, holes between */
    static uint8_t raw[1 << 20];
    for (size_t off = 0; off < sizeof raw; off += 65536)
        memset(raw + off, (int)(0x10 + off / 65536), 4096);
    put_file(fuzz_path(BASE_RAW), raw, sizeof raw);
    return 0;
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
                /* whatever follows the header, as a directory and entries:
                 * checked, then listed (every name copied, every entry read) */
                if (h->has_bitmaps && size > 112) {
                    size_t len = size - 112;
                    struct qcow2_bitmap *list = calloc(h->nb_bitmaps, sizeof *list);
                    char *names = malloc(len);
                    (void)qcow2_parse_bitmap_directory(data + 112, len, h, NULL, NULL, "input",
                                                       &err);
                    if (list && names &&
                        qcow2_parse_bitmap_directory(data + 112, len, h, list, names, "input",
                                                     &err) == 0) {
                        size_t sum = 0;
                        for (uint32_t i = 0; i < h->nb_bitmaps; i++)
                            sum += strlen(list[i].name) + list[i].granularity_bits +
                                   list[i].table_size;
                        if (verbose)
                            fprintf(stderr, "  bitmap directory: %u entries (%zu)\n",
                                    h->nb_bitmaps, sum);
                    }
                    free(list);
                    free(names);
                }
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

/* The dirty map of [start, end) of bitmap `name`: when it is read, its
 * extents tile the range, flagged IC_EXT_DIRTY or not at all, neighbours
 * differing. */
static void dirty_range(struct ic_image *img, const char *name, uint64_t start, uint64_t end)
{
    struct ic_extent_list list = {0};
    struct ic_error err;
    int ret = ic_image_dirty_map(img, name, start, end - start, &list, &err);
    if (verbose)
        fprintf(stderr, "  dirty map %s %llu..%llu: %s%zu extents\n", name,
                (unsigned long long)start, (unsigned long long)end, ret < 0 ? err.msg : "",
                list.count);
    uint64_t pos = start;
    for (size_t i = 0; ret == 0 && i < list.count; i++) {
        const struct ic_extent *e = &list.items[i];
        if (e->start != pos || e->length == 0 || (e->flags & ~(uint32_t)IC_EXT_DIRTY) ||
            (i && e->flags == list.items[i - 1].flags)) {
            fprintf(stderr, "dirty map: extent %zu (%llu+%llu, flags %#x) after %llu\n", i,
                    (unsigned long long)e->start, (unsigned long long)e->length, e->flags,
                    (unsigned long long)pos);
            abort();
        }
        pos += e->length;
    }
    if (ret == 0 && pos != end) {
        fprintf(stderr, "dirty map: extents end at %llu, expected %llu\n",
                (unsigned long long)pos, (unsigned long long)end);
        abort();
    }
    ic_extent_list_free(&list);
}

static void exercise_dirty(struct ic_image *img, const struct ic_bitmap *bitmaps, size_t n,
                           const uint8_t *data, size_t size)
{
    uint64_t vsize = ic_image_size(img);
    uint64_t head_end = vsize < MAP_WINDOW ? vsize : MAP_WINDOW;
    uint64_t tail = vsize > MAP_WINDOW && vsize - MAP_WINDOW > head_end ? vsize - MAP_WINDOW
                                                                         : head_end;
    for (size_t i = 0; i < n && i < 8; i++) {
        dirty_range(img, bitmaps[i].name, 0, head_end);
        if (vsize > tail)
            dirty_range(img, bitmaps[i].name, tail, vsize);
        if (vsize) {
            struct ic_extent_list list = {0};
            struct ic_error err;
            uint64_t off = mix(data, size, 3 + i) % vsize;
            if (ic_image_dirty_status(img, bitmaps[i].name, off, vsize, &list, &err) == 0 &&
                (list.count == 0 || list.items[0].start != off)) {
                fprintf(stderr, "dirty status at %llu: nothing there\n",
                        (unsigned long long)off);
                abort();
            }
            ic_extent_list_free(&list);
        }
    }
    /* a name it does not have (or, hostile, has): an error or a map */
    dirty_range(img, "imgcopy-fuzz", 0, head_end);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    parse_only(data, size);

    put_file(fuzz_path(INPUT), data, size);
    put_file(fuzz_path(BASE_QCOW2), data, size);

    uint64_t r = mix(data, size, 0);
    unsigned flags = (r & 1) ? IC_OPEN_FORCE : 0;
    struct ic_image *img = NULL;
    struct ic_error err;
    if (ic_image_open(fuzz_path(INPUT), "qcow2", flags, &img, &err) < 0) {
        if (verbose)
            fprintf(stderr, "  open: %s\n", err.msg);
        return 0;
    }
    if (verbose)
        fprintf(stderr, "  open: size %llu, backing %s\n",
                (unsigned long long)ic_image_size(img),
                ic_image_backing(img) ? ic_image_path(ic_image_backing(img)) : "none");
    /* what info lists: the bitmaps the driver loaded, their names read */
    struct ic_image_info info;
    ic_image_describe(img, &info);
    size_t nbitmaps = ic_image_bitmaps(img, NULL, 0);
    struct ic_bitmap *bitmaps = calloc(nbitmaps ? nbitmaps : 1, sizeof *bitmaps);
    if (bitmaps) {
        size_t got = ic_image_bitmaps(img, bitmaps, nbitmaps);
        size_t sum = 0;
        for (size_t i = 0; i < got; i++)
            sum += strlen(bitmaps[i].name) + (size_t)(bitmaps[i].granularity & 1);
        if (verbose)
            fprintf(stderr, "  bitmaps: %zu (%zu), info fields %zu\n", got, sum, info.nfields);
    }
    fuzz_exercise(img, data, size);
    if (bitmaps)
        exercise_dirty(img, bitmaps, nbitmaps, data, size);
    free(bitmaps);
    ic_image_close(img);
    return 0;
}
