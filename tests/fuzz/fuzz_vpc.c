/* libFuzzer target for the VHD (vpc) parser and read driver.
 *
 * Each input is a VHD file.  It goes through the pure functions
 * (vpc_parse_footer on the first and the last 512 bytes, vpc_check_type,
 * vpc_parse_dyn_header on the 1024 bytes the footer points to) and then
 * through the whole driver: ic_image_open, ic_image_map over at most the
 * first and the last 64 MiB of the virtual disk, and a few bounded
 * ic_image_pread calls at offsets derived from the input (fuzz_exercise).
 * Failing with an error is fine; crashing, leaking, hanging or allocating
 * without bound is not (run with -rss_limit_mb and -timeout).
 *
 * The input is written, sparse, to input.vhd in a private directory under
 * $TMPDIR (see fuzz_common.h); VHD has no backing files imgcopy follows,
 * so nothing else lives there. */
#include "fuzz_common.h"
#include "drivers/vpc_format.h"
#include "probe.h"

enum { INPUT };
static const char *const names[] = {"input.vhd"};

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_init_dir("imgcopy-fuzz-vpc.", names, sizeof names / sizeof names[0]);
    return 0;
}

static void parse_only(const uint8_t *data, size_t size)
{
    size_t head = size < IC_PROBE_HEAD ? size : IC_PROBE_HEAD;
    size_t tail = size < IC_PROBE_TAIL ? 0 : IC_PROBE_TAIL;
    (void)ic_probe_format(data, head, data + size - tail, tail);
    if (size < VPC_FOOTER_SIZE)
        return;
    struct ic_error err;
    struct vpc_footer f;
    const uint8_t *footers[] = {data, data + size - VPC_FOOTER_SIZE};
    for (int i = 0; i < 2; i++) {
        if (vpc_parse_footer(footers[i], &f, "input", &err) < 0)
            continue;
        (void)vpc_check_type(f.type, "input", &err);
        if (f.data_offset < size && size - f.data_offset >= VPC_DYN_HEADER_SIZE) {
            struct vpc_dyn_header d;
            (void)vpc_parse_dyn_header(data + f.data_offset, f.size, &d, "input", &err);
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    parse_only(data, size);

    put_file(fuzz_path(INPUT), data, size);
    struct ic_image *img = NULL;
    struct ic_error err;
    if (ic_image_open(fuzz_path(INPUT), "vpc", 0, &img, &err) < 0) {
        if (verbose)
            fprintf(stderr, "  open: %s\n", err.msg);
        return 0;
    }
    if (verbose)
        fprintf(stderr, "  open: size %llu\n", (unsigned long long)ic_image_size(img));
    fuzz_exercise(img, data, size);
    ic_image_close(img);
    return 0;
}
