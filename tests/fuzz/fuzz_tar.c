/* libFuzzer target for the tar parser and the tar member protocol.
 *
 * Each input is a tar archive (an OVA).  The harness writes it sparse to
 * input.tar in its private directory and opens members of it with
 * ic_image_open_member, the format probed: a few fixed names the seeds use
 * (a raw disk, a qcow2 disk, a qcow2 overlay whose backing file is another
 * member) and the name in the input's first header, so that mutated names
 * are found too.  A member that opens is mapped and read through the
 * shared exercise (fuzz_common.h).  Errors are fine; crashes, leaks, hangs
 * and unbounded allocations are not. */
#include "fuzz_common.h"

static const char *const names[] = {"input.tar"};
static const char *const members[] = {"disk.raw", "disk.qcow2", "vm/top.qcow2", "a.raw"};

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_init_dir("imgcopy-fuzz-tar.", names, sizeof names / sizeof names[0]);
    return 0;
}

static void try_member(const char *member, const uint8_t *data, size_t size)
{
    struct ic_image *img = NULL;
    struct ic_error err;
    const char *probed;
    (void)ic_image_probe_member(fuzz_path(0), member, &probed, &err);
    /* extent files outside the member's directory stay refused either way */
    unsigned flags = (mix(data, size, 3) & 1) ? IC_OPEN_EXTERNAL_FILES : 0;
    if (ic_image_open_member(fuzz_path(0), member, NULL, flags, &img, &err) < 0) {
        if (verbose)
            fprintf(stderr, "  open %s: %s\n", member, err.msg);
        return;
    }
    if (verbose)
        fprintf(stderr, "  open %s: %s, size %llu\n", member, ic_image_format(img),
                (unsigned long long)ic_image_size(img));
    fuzz_exercise(img, data, size);
    ic_image_close(img);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    put_file(fuzz_path(0), data, size);
    for (size_t i = 0; i < sizeof members / sizeof members[0]; i++)
        try_member(members[i], data, size);
    char first[101] = "";
    if (size >= 100) {
        memcpy(first, data, 100);
        first[100] = '\0';
    }
    if (first[0])
        try_member(first, data, size);
    return 0;
}
