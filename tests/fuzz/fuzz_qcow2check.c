/* libFuzzer target for the qcow2 consistency check (qemu-img check's
 * twin, csrc/drivers/qcow2_check.c).
 *
 * Each input is a qcow2 file, opened as `imgcopy check` opens it
 * (read-only, dirty or corrupt-flagged images too) and checked.  The check
 * reads every table the image names, at any offset, and counts references
 * per host cluster: it may find anything, or fail with an error; it must
 * not crash, leak, hang or allocate without bound.  Seeds and regressions
 * are qcow2's (seeds/qcow2check and regressions/qcow2check link there).
 * The files live in a private directory under $TMPDIR, as for fuzz_qcow2
 * (fuzz_common.h): base.qcow2, a copy of the input, makes chains hostile
 * at every level. */
#include "fuzz_common.h"

enum { INPUT, BASE_QCOW2 };
static const char *const names[] = {"input.qcow2", "base.qcow2"};

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    (void)fuzz_exercise; /* fuzz_qcow2 reads and maps; this one checks */
    fuzz_init_dir("imgcopy-fuzz-qcow2check.", names, sizeof names / sizeof names[0]);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    put_file(fuzz_path(INPUT), data, size);
    put_file(fuzz_path(BASE_QCOW2), data, size);
    struct ic_image *img = NULL;
    struct ic_error err;
    if (ic_image_open(fuzz_path(INPUT), "qcow2", IC_OPEN_FORCE, &img, &err) < 0) {
        if (verbose)
            fprintf(stderr, "  open: %s\n", err.msg);
        return 0;
    }
    struct ic_check_result r;
    if (ic_image_check(img, &r, &err) < 0) {
        if (verbose)
            fprintf(stderr, "  check: %s\n", err.msg);
    } else {
        if (verbose)
            fprintf(stderr, "  check: %llu corruptions, %llu leaks, %llu errors, end %llu\n",
                    (unsigned long long)r.corruptions, (unsigned long long)r.leaks,
                    (unsigned long long)r.check_errors,
                    (unsigned long long)r.image_end_offset);
        ic_check_result_free(&r);
    }
    ic_image_close(img);
    return 0;
}
