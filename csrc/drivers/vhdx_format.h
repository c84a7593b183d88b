/* VHDX (Microsoft's [MS-VHDX]) on-disk structures, parsed and checked
 * without trusting a byte: pure functions over buffers the driver read,
 * so that the fuzzer can drive them without I/O.  All fields are little
 * endian; GUIDs are compared as their 16 stored bytes. */
#ifndef IMGCOPY_VHDX_FORMAT_H
#define IMGCOPY_VHDX_FORMAT_H

#include <stddef.h>
#include <stdint.h>

#include "../error.h"

#define VHDX_MIB (1ull << 20)
#define VHDX_HEADER_SECTION VHDX_MIB /* file identifier, headers, region tables */
#define VHDX_HEADER_SIZE 4096u       /* a header's checksum covers this much */
#define VHDX_HEADER1_OFFSET 65536u
#define VHDX_HEADER2_OFFSET 131072u
#define VHDX_REGION_TABLE_OFFSET 196608u
#define VHDX_TABLE_SIZE 65536u /* a region table, the metadata table */
#define VHDX_MAX_REGIONS 2047u
#define VHDX_MAX_METADATA_ENTRIES 2047u
#define VHDX_BLOCK_MIN VHDX_MIB
#define VHDX_BLOCK_MAX (256u * VHDX_MIB)
#define VHDX_SECTOR_BITMAP_SIZE VHDX_MIB
/* the spec's largest virtual disk: 64 TiB */
#define VHDX_MAX_DISK_SIZE (64ull << 40)
/* a parent locator larger than this is not a parent locator */
#define VHDX_MAX_LOCATOR (64u * 1024u)
#define VHDX_PATH_MAX 1024

/* BAT entries: state in the low 3 bits, file offset in whole MiB above
 * bit 20 */
#define VHDX_BAT_STATE_MASK 7u
#define VHDX_BAT_OFFSET_MASK 0xfffffffffff00000ull
enum {
    VHDX_PAYLOAD_NOT_PRESENT = 0,
    VHDX_PAYLOAD_UNDEFINED = 1,
    VHDX_PAYLOAD_ZERO = 2,
    VHDX_PAYLOAD_UNMAPPED = 3,
    VHDX_PAYLOAD_UNMAPPED_V095 = 5, /* drafts of the spec; qemu reads it as zeros */
    VHDX_PAYLOAD_FULLY_PRESENT = 6,
    VHDX_PAYLOAD_PARTIALLY_PRESENT = 7,
    VHDX_SB_NOT_PRESENT = 0,
    VHDX_SB_PRESENT = 6,
};

struct vhdx_header {
    uint64_t sequence;
    uint8_t file_write_guid[16];
    uint8_t data_write_guid[16];
    uint8_t log_guid[16];
    uint16_t log_version;
    uint16_t version;
    uint32_t log_length;
    uint64_t log_offset;
};

struct vhdx_range {
    uint64_t offset;
    uint64_t length;
};

/* What the region table says (the BAT and metadata regions), and every
 * region the file holds, for overlap checks of what comes later. */
struct vhdx_regions {
    struct vhdx_range bat;
    struct vhdx_range metadata;
    size_t count;
    struct vhdx_range all[VHDX_MAX_REGIONS + 2]; /* + the header section and the log */
};

/* A metadata item: where it lies inside the metadata region. */
struct vhdx_item {
    int present;
    uint32_t offset;
    uint32_t length;
};

enum { VHDX_ITEM_PARAMS, VHDX_ITEM_DISK_SIZE, VHDX_ITEM_PAGE83, VHDX_ITEM_LOGICAL_SECTOR,
       VHDX_ITEM_PHYSICAL_SECTOR, VHDX_ITEM_PARENT_LOCATOR, VHDX_ITEM_COUNT };

struct vhdx_meta {
    uint32_t block_size;
    int leave_blocks_allocated;
    int has_parent;
    uint64_t disk_size;
    uint32_t logical_sector_size;
    uint32_t physical_sector_size;
    uint8_t page83[16];
};

/* The keys of a VHDX parent locator imgcopy uses, as UTF-8 ("" absent). */
struct vhdx_locator {
    char parent_linkage[80];
    char parent_linkage2[80];
    char relative_path[VHDX_PATH_MAX];
    char volume_path[VHDX_PATH_MAX];
    char absolute_win32_path[VHDX_PATH_MAX];
};

/* The BAT's shape for a disk: payload blocks, chunk ratio, entries. */
struct vhdx_geometry {
    uint64_t blocks;       /* payload blocks covering the disk */
    uint64_t chunk_ratio;  /* payload blocks per sector bitmap block */
    uint64_t bat_entries;  /* payload and sector bitmap entries */
    uint64_t sectors_per_block;
};

uint32_t vhdx_crc32c(uint32_t crc, const void *buf, size_t len);
/* CRC-32C of `buf` with its 4-byte checksum field at `crc_off` read as
 * zeros equals that field */
int vhdx_checksum_ok(const uint8_t *buf, size_t len, size_t crc_off);

/* The active header of the two 4 KiB header blocks h1, h2 (qemu's rule:
 * the valid one, or the one with the higher sequence number; equal
 * numbers only when both are identical). */
int vhdx_pick_header(const uint8_t *h1, const uint8_t *h2, struct vhdx_header *out,
                     const char *path, struct ic_error *err);
/* The header's log: -1 with err if misplaced, 0 if there is none to
 * look at (no log GUID, or no log), 1 if it must be searched for entries
 * of this GUID (vhdx_log_entry_length), as qemu searches it: an image
 * owes a replay only when one is there. */
int vhdx_check_log(const struct vhdx_header *h, uint64_t file_size, const char *path,
                   struct ic_error *err);
#define VHDX_LOG_SECTOR 4096u
/* The length an entry starting in this 4 KiB log sector claims, if it is
 * one of the header's log (signature, GUID, a whole number of sectors
 * within the log); 0 if not.  Its checksum is the caller's to check over
 * that length (vhdx_checksum_ok at 4; the log wraps around). */
uint32_t vhdx_log_entry_length(const uint8_t *sector, const struct vhdx_header *h);
/* The error for an image whose log holds an entry to replay */
int vhdx_log_needs_replay(const char *path, struct ic_error *err);
/* The region table (VHDX_TABLE_SIZE bytes at VHDX_REGION_TABLE_OFFSET):
 * BAT and metadata regions, no overlaps with each other, the header
 * section or the log, none past `file_size`; an unknown required region
 * is refused. */
int vhdx_parse_regions(const uint8_t *table, const struct vhdx_header *h, uint64_t file_size,
                       struct vhdx_regions *out, const char *path, struct ic_error *err);
/* Whether [off, off+len) overlaps a region. */
int vhdx_overlaps_region(const struct vhdx_regions *r, uint64_t off, uint64_t len);
/* The metadata table (its first `len` bytes, at most VHDX_TABLE_SIZE):
 * the known items, each inside a region of `region_len` bytes, no two
 * overlapping, none twice; an unknown required item is refused. */
int vhdx_parse_metadata_table(const uint8_t *table, size_t len, uint64_t region_len,
                              struct vhdx_item items[VHDX_ITEM_COUNT], const char *path,
                              struct ic_error *err);
/* The fixed-size items' values, each given as `items` says (bufs[i] holds
 * items[i].length bytes, or is NULL for an absent item). */
int vhdx_parse_meta_values(const struct vhdx_item items[VHDX_ITEM_COUNT],
                           const uint8_t *const bufs[VHDX_ITEM_COUNT], struct vhdx_meta *out,
                           const char *path, struct ic_error *err);
/* A parent locator item of `len` bytes: a VHDX parent's, its keys unique. */
int vhdx_parse_locator(const uint8_t *buf, size_t len, struct vhdx_locator *out,
                       const char *path, struct ic_error *err);
/* A GUID as the locator spells it: "{xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx}"
 * (out: at least 39 bytes). */
void vhdx_guid_text(const uint8_t g[16], char *out);
/* Whether `text` names the GUID `g` (braces optional, any case). */
int vhdx_guid_matches(const char *text, const uint8_t g[16]);
/* The BAT's shape for `m`; refused when it needs more than
 * `bat_region_len` bytes. */
int vhdx_geometry(const struct vhdx_meta *m, uint64_t bat_region_len, struct vhdx_geometry *out,
                  const char *path, struct ic_error *err);
/* A locator path in the host's terms: '\' -> '/', a drive letter or a
 * "\\?\Volume{..}" prefix dropped (absolute then); 0, or -1 when empty. */
int vhdx_host_path(const char *win, char *out, size_t cap);

static inline uint16_t vhdx_le16(const uint8_t *p)
{
    return (uint16_t)(p[0] | p[1] << 8);
}

static inline uint32_t vhdx_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline uint64_t vhdx_le64(const uint8_t *p)
{
    return (uint64_t)vhdx_le32(p) | (uint64_t)vhdx_le32(p + 4) << 32;
}

#endif
