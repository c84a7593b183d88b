/* libFuzzer target for the vmdk parsers and read driver.
 *
 * Each input goes through the pure functions (vmdk_parse_descriptor on its
 * bytes as a descriptor file and as an embedded one; vmdk_sparse_decode
 * and vmdk_sparse_check on its first sector and on its footer) and then
 * through the whole driver twice:
 *   - input.vmdk, the input itself: a monolithic sparse or stream file, or
 *     a descriptor text naming the files below;
 *   - desc.vmdk, a fixed descriptor naming flat.vmdk (FLAT) and the input
 *     (SPARSE), so that the input is also fuzzed as one extent of several.
 * Each open image is mapped over its first and last 64 MiB and read at a
 * few offsets derived from the input (fuzz_common.h).  Failing with an
 * error is fine; crashing, leaking, hanging or allocating without bound is
 * not (run with -rss_limit_mb and -timeout).
 *
 * The private directory (see fuzz_common.h) holds:
 *   input.vmdk   the input (a parent or extent named "input.vmdk" is the
 *                image itself: a loop)
 *   base.vmdk    a second copy of the input, so that a chain
 *                input -> base.vmdk -> ... is hostile at every level
 *   flat.vmdk    1 MiB of raw data, partly holes
 *   sparse.vmdk  a small valid sparse extent (1 MiB, 4 KiB grains)
 *   desc.vmdk    the fixed two-extent descriptor */
#include "fuzz_common.h"
#include "drivers/vmdk_state.h"
#include "probe.h"

enum { INPUT, BASE, FLAT, SPARSE, DESC };
static const char *const names[] = {"input.vmdk", "base.vmdk", "flat.vmdk", "sparse.vmdk",
                                    "desc.vmdk"};

static void put_le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put_le64(uint8_t *p, uint64_t v)
{
    put_le32(p, (uint32_t)v);
    put_le32(p + 4, (uint32_t)(v >> 32));
}

/* header at 0, descriptor at sector 1, grain directory at 21, one grain
 * table at 22, grains 0, 3 and 17 at sectors 32, 40, 48 */
static void make_sparse(uint8_t *f, size_t size)
{
    memset(f, 0, size);
    memcpy(f, "KDMV", 4);
    put_le32(f + 4, 1);
    put_le32(f + 8, 1);
    put_le64(f + 12, 2048);
    put_le64(f + 20, 8);
    put_le64(f + 28, 1);
    put_le64(f + 36, 20);
    put_le32(f + 44, 512);
    put_le64(f + 56, 21);
    put_le64(f + 64, 32);
    memcpy(f + 73, "\n \r\n", 4);
    static const char desc[] = "# Disk DescriptorFile\nversion=1\nCID=1234abcd\n"
                               "parentCID=ffffffff\ncreateType=\"monolithicSparse\"\n";
    memcpy(f + 512, desc, sizeof desc - 1);
    put_le32(f + 21 * 512, 22);
    static const unsigned grains[] = {0, 3, 17};
    for (unsigned i = 0; i < 3; i++) {
        put_le32(f + 22 * 512 + 4 * grains[i], 32 + 8 * i);
        memset(f + (32 + 8 * i) * 512, 0x40 + (int)i, 4096);
    }
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_init_dir("imgcopy-fuzz-vmdk.", names, sizeof names / sizeof names[0]);
    static uint8_t flat[1 << 20];
    for (size_t off = 0; off < sizeof flat; off += 65536)
        memset(flat + off, (int)(0x10 + off / 65536), 4096);
    put_file(fuzz_path(FLAT), flat, sizeof flat);
    static uint8_t sparse[56 * 512];
    make_sparse(sparse, sizeof sparse);
    put_file(fuzz_path(SPARSE), sparse, sizeof sparse);
    static const char desc[] = "# Disk DescriptorFile\nversion=1\nCID=1\nparentCID=ffffffff\n"
                               "createType=\"twoGbMaxExtentSparse\"\n"
                               "RW 2048 FLAT \"flat.vmdk\" 0\n"
                               "RW 2048 SPARSE \"input.vmdk\"\n"
                               "RW 2048 SPARSE \"sparse.vmdk\"\n";
    put_file(fuzz_path(DESC), (const uint8_t *)desc, sizeof desc - 1);
    return 0;
}

static void parse_only(const uint8_t *data, size_t size)
{
    size_t head = size < IC_PROBE_HEAD ? size : IC_PROBE_HEAD;
    size_t tail = size < IC_PROBE_TAIL ? 0 : IC_PROBE_TAIL;
    (void)ic_probe_format(data, head, data + size - tail, tail);
    struct ic_error err;
    struct vmdk_desc d;
    for (int keys_only = 0; keys_only < 2; keys_only++)
        if (vmdk_parse_descriptor((const char *)data, size, keys_only, &d, "input", &err) == 0) {
            (void)vmdk_check_create_type(&d, "input", &err);
            vmdk_desc_free(&d);
        }
    struct vmdk_sparse_header h;
    if (size >= VMDK4_HEADER_LEN) {
        vmdk_sparse_decode(data, &h);
        (void)vmdk_sparse_check(&h, size, "input", &err);
    }
    if (size >= 1024) {
        vmdk_sparse_decode(data + size - 1024, &h);
        (void)vmdk_sparse_check(&h, size, "input", &err);
    }
}

static void exercise(size_t which, const uint8_t *data, size_t size)
{
    struct ic_image *img = NULL;
    struct ic_error err;
    if (ic_image_open(fuzz_path(which), "vmdk", 0, &img, &err) < 0) {
        if (verbose)
            fprintf(stderr, "  open %s: %s\n", names[which], err.msg);
        return;
    }
    if (verbose)
        fprintf(stderr, "  open %s: size %llu, backing %s\n", names[which],
                (unsigned long long)ic_image_size(img),
                ic_image_backing(img) ? ic_image_path(ic_image_backing(img)) : "none");
    fuzz_exercise(img, data, size);
    ic_image_close(img);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    parse_only(data, size);
    put_file(fuzz_path(INPUT), data, size);
    put_file(fuzz_path(BASE), data, size);
    exercise(INPUT, data, size);
    if (size >= 4 && memcmp(data, "KDMV", 4) == 0)
        exercise(DESC, data, size);
    return 0;
}
