/* VHD footer and dynamic header parsing (see vpc_format.h).  Every field
 * comes from an untrusted file. */
#include <limits.h>
#include <string.h>

#include "vpc_format.h"

#define CHS_MAX_GEOMETRY (65535ull * 16 * 255)

static uint16_t be16(const uint8_t *p)
{
    return (uint16_t)(p[0] << 8 | p[1]);
}

static uint32_t be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static uint64_t be64(const uint8_t *p)
{
    return (uint64_t)be32(p) << 32 | be32(p + 4);
}

int vpc_footer_magic(const uint8_t *f)
{
    return memcmp(f, "conectix", 8) == 0;
}

uint32_t vpc_checksum(const uint8_t *p, size_t len, size_t skip)
{
    uint32_t sum = 0;
    for (size_t i = 0; i < len; i++)
        if (i < skip || i >= skip + 4)
            sum += p[i];
    return ~sum;
}

/* Virtual PC sizes a disk by its CHS geometry, Hyper-V, disk2vhd, Xen and
 * qemu's force_size by current_size; a maximal geometry means the size
 * did not fit in CHS, so current_size holds it (qemu's vpc_open). */
static int sized_by_current_size(const char app[4], uint64_t chs_sectors)
{
    static const char *const apps[] = {"win ", "qem2", "d2v ", "CTXS"};
    for (size_t i = 0; i < sizeof apps / sizeof apps[0]; i++)
        if (memcmp(app, apps[i], 4) == 0)
            return 1;
    return memcmp(app, "tap\0", 4) == 0 || chs_sectors == CHS_MAX_GEOMETRY;
}

int vpc_parse_footer(const uint8_t *f, struct vpc_footer *out, const char *path,
                     struct ic_error *err)
{
    memset(out, 0, sizeof *out);
    if (!vpc_footer_magic(f))
        return ic_error_format(err, path, "invalid VPC image (no \"conectix\" footer)");
    uint32_t stored = be32(f + 64);
    if (vpc_checksum(f, VPC_FOOTER_SIZE, 64) != stored)
        return ic_error_format(err, path, "incorrect VHD footer checksum (0x%08x stored)",
                               stored);
    out->data_offset = be64(f + 16);
    memcpy(out->creator_app, f + 28, 4);
    out->current_size = be64(f + 48);
    out->cyls = be16(f + 56);
    out->heads = f[58];
    out->secs_per_cyl = f[59];
    out->type = be32(f + 60);

    uint64_t sectors = (uint64_t)out->cyls * out->heads * out->secs_per_cyl;
    if (sized_by_current_size(out->creator_app, sectors))
        sectors = out->current_size / VPC_SECTOR;
    if (sectors > VPC_MAX_SECTORS)
        return ic_error_format(err, path, "VHD disk of %llu sectors is larger than 2040 GiB",
                               (unsigned long long)sectors);
    out->size = sectors * VPC_SECTOR;
    return 0;
}

int vpc_check_type(uint32_t type, const char *path, struct ic_error *err)
{
    switch (type) {
    case VPC_TYPE_FIXED:
    case VPC_TYPE_DYNAMIC:
        return 0;
    case VPC_TYPE_DIFFERENCING:
        return ic_error_format(err, path, "differencing VHD images (disk type 4) are not "
                               "supported");
    default:
        return ic_error_format(err, path, "unknown VHD disk type %u", type);
    }
}

int vpc_parse_dyn_header(const uint8_t *h, uint64_t size, struct vpc_dyn_header *out,
                         const char *path, struct ic_error *err)
{
    memset(out, 0, sizeof *out);
    if (memcmp(h, "cxsparse", 8) != 0)
        return ic_error_format(err, path, "invalid dynamic VHD header magic");
    /* qemu does not verify the header's checksum: neither do we, so that
     * every image qemu reads opens here */
    out->table_offset = be64(h + 16);
    out->max_table_entries = be32(h + 28);
    out->block_size = be32(h + 32);
    uint32_t bs = out->block_size;
    if (bs < VPC_SECTOR || (bs & (bs - 1)) != 0)
        return ic_error_format(err, path, "invalid VHD block size %u", bs);
    /* one bit per sector, in whole sectors */
    out->bitmap_size = (bs / (8 * VPC_SECTOR) + VPC_SECTOR - 1) & ~(VPC_SECTOR - 1);
    if (size / bs > 0xffffffffull)
        return ic_error_format(err, path, "too many VHD blocks");
    if ((uint64_t)out->max_table_entries * bs < size)
        return ic_error_format(err, path, "VHD block allocation table too small "
                               "(%u entries of %u bytes for %llu bytes)",
                               out->max_table_entries, bs, (unsigned long long)size);
    if (out->max_table_entries > INT_MAX / 4)
        return ic_error_format(err, path, "VHD block allocation table too large "
                               "(%u entries)", out->max_table_entries);
    return 0;
}
