/* VHD (qemu's "vpc") on-disk structures: the 512-byte footer and the
 * 1024-byte dynamic disk header, parsed by pure functions (fuzzed on their
 * own) into what the driver needs, with qemu 7.2's rules for what it
 * accepts and how large the disk is. */
#ifndef IMGCOPY_VPC_FORMAT_H
#define IMGCOPY_VPC_FORMAT_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"

#define VPC_FOOTER_SIZE 512u
#define VPC_DYN_HEADER_SIZE 1024u
#define VPC_SECTOR 512u
#define VPC_BAT_UNALLOCATED 0xFFFFFFFFu
/* qemu's ceiling: 2040 GiB */
#define VPC_MAX_SECTORS 0xff000000ull

enum vpc_disk_type {
    VPC_TYPE_NONE = 0,
    VPC_TYPE_FIXED = 2,
    VPC_TYPE_DYNAMIC = 3,
    VPC_TYPE_DIFFERENCING = 4,
};

struct vpc_footer {
    uint32_t type;
    uint64_t data_offset;   /* the dynamic header */
    uint64_t current_size;
    uint16_t cyls;
    uint8_t heads, secs_per_cyl;
    char creator_app[5];
    uint64_t size;          /* the virtual size qemu sees, in bytes */
};

struct vpc_dyn_header {
    uint64_t table_offset;
    uint32_t max_table_entries;
    uint32_t block_size;
    uint32_t bitmap_size;   /* the sector bitmap before each block's data */
};

/* "conectix" at the start of f (512 bytes) */
int vpc_footer_magic(const uint8_t *f);
/* one's complement of the byte sum, the checksum field counted as zero
 * (at `skip`, 4 bytes) */
uint32_t vpc_checksum(const uint8_t *p, size_t len, size_t skip);

/* A footer (the copy at 0 or the one ending the file): magic, checksum,
 * the virtual size as qemu computes it (CHS geometry or current_size by
 * the creator application), the 2040 GiB limit.  The disk type is stored,
 * not judged. */
int vpc_parse_footer(const uint8_t *f, struct vpc_footer *out, const char *path,
                     struct ic_error *err);
/* The disk types imgcopy reads (fixed, dynamic); the others are refused by
 * name. */
int vpc_check_type(uint32_t type, const char *path, struct ic_error *err);
/* The dynamic header for a disk of `size` bytes: magic, block size, BAT
 * large enough and small enough. */
int vpc_parse_dyn_header(const uint8_t *h, uint64_t size, struct vpc_dyn_header *out,
                         const char *path, struct ic_error *err);

#endif
