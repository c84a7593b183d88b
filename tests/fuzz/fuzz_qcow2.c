/* libFuzzer target for the qcow2 parser and read driver.
 *
 * Each input is a qcow2 file.  It goes through the pure header functions
 * (qcow2_parse_header, qcow2_parse_extensions, qcow2_check_features,
 * qcow2_parse_bitmap_directory) and then through the whole driver:
 * ic_image_open, the bitmaps it lists and describes, ic_image_map over at most
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
        free(bitmaps);
    }
    fuzz_exercise(img, data, size);
    ic_image_close(img);
    return 0;
}
