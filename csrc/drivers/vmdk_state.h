/* VMware's VMDK, read-only, as qemu 7.2 reads it.  The parts, each
 * depending only on the ones before it:
 *   vmdk_descriptor.c  the text descriptor (pure functions, fuzzed)
 *   vmdk_sparse.c      hosted sparse extents ("KDMV"): the header, the
 *                      grain directory, grain tables (a shared bounded
 *                      cache), compressed grains of streamOptimized images
 *   vmdk.c             the driver: open (a descriptor file, or a sparse
 *                      file and its embedded descriptor), the extent list,
 *                      reads and block status routed to extents, describe */
#ifndef IMGCOPY_VMDK_STATE_H
#define IMGCOPY_VMDK_STATE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "../image.h"

#define VMDK_SECTOR 512u
/* qemu reads at most this much of a descriptor file (or the file, if
 * smaller) and stops at the first NUL. */
#define VMDK_DESC_MAX ((1u << 20) - 1)
/* qemu's DESC_SIZE: what it reads of an embedded descriptor for the CIDs */
#define VMDK_EMBEDDED_DESC_MIN (20u * 512u)
/* A 2 TiB disk in 2 GiB extents is 1024; each is an open file. */
#define VMDK_MAX_EXTENTS 1024u
/* qemu's "%511[^\n\r\"]" */
#define VMDK_NAME_MAX 511u
/* qemu's bounds: a grain of at most 1 GiB, a grain table of at most 512
 * entries, a grain directory of at most 32 Mi entries */
#define VMDK_MAX_GRAIN_SECTORS 0x200000u
#define VMDK_MAX_GTES 512u
#define VMDK_MAX_GD_ENTRIES (32u * 1024 * 1024)
/* A compressed grain is inflated into a buffer per read: real ones are
 * 64 KiB; a hostile header must not make each read allocate a gigabyte. */
#define VMDK_MAX_COMPRESSED_GRAIN (16u << 20)
/* Grain tables kept in memory, for all extents together. */
#define VMDK_GT_CACHE_SLOTS 1024u

/* A format error naming the format, whatever the message: the first
 * argument is a string literal. */
#define vmdk_error(err, path, ...) ic_error_format(err, path, "vmdk: " __VA_ARGS__)

/* ---- the descriptor (vmdk_descriptor.c) ---------------------------------- */

enum vmdk_extent_type { VMDK_TYPE_FLAT, VMDK_TYPE_SPARSE, VMDK_TYPE_VMFS };

struct vmdk_desc_extent {
    enum vmdk_extent_type type;
    uint64_t sectors;     /* as the line says (a sparse extent's header rules) */
    uint64_t flat_offset; /* FLAT: in sectors */
    char name[VMDK_NAME_MAX + 1];
};

struct vmdk_desc {
    char create_type[128];
    int has_create_type;
    uint32_t cid, parent_cid;
    int has_cid, has_parent_cid;
    char parent_hint[IC_BACKING_NAME_MAX];
    int has_parent_hint;
    struct vmdk_desc_extent *extents;
    size_t nextents;
};

/* Parse `len` bytes of descriptor text (up to the first NUL).  Keys and
 * extent lines as qemu reads them (`keys_only`: extent lines are ignored,
 * as in the descriptor a sparse file embeds); `path` names the file in
 * errors. */
int vmdk_parse_descriptor(const char *text, size_t len, int keys_only, struct vmdk_desc *d,
                          const char *path, struct ic_error *err);
void vmdk_desc_free(struct vmdk_desc *d);
/* The createTypes qemu opens from a descriptor file; others are refused,
 * naming the type. */
int vmdk_check_create_type(const struct vmdk_desc *d, const char *path, struct ic_error *err);
const char *vmdk_type_name(enum vmdk_extent_type t);

/* ---- sparse extents (vmdk_sparse.c) --------------------------------------- */

#define VMDK4_MAGIC "KDMV"
#define VMDK3_MAGIC "COWD"
#define VMDK4_HEADER_LEN 79 /* after the 4-byte magic: 75 bytes, with it 79 */
#define VMDK4_FLAG_RGD (1u << 1)
#define VMDK4_FLAG_ZERO_GRAIN (1u << 2)
#define VMDK4_FLAG_COMPRESS (1u << 16)
#define VMDK4_FLAG_MARKER (1u << 17)
#define VMDK4_COMPRESSION_DEFLATE 1
#define VMDK4_GD_AT_END UINT64_MAX
#define VMDK_GTE_ZEROED 1u
#define VMDK_MARKER_EOS 0
#define VMDK_MARKER_GT 1
#define VMDK_MARKER_GD 2
#define VMDK_MARKER_FOOTER 3

struct vmdk_sparse_header {
    uint32_t version, flags;
    uint64_t capacity, granularity; /* sectors */
    uint64_t desc_offset, desc_size; /* sectors */
    uint32_t gtes;                   /* entries per grain table */
    uint64_t rgd_offset, gd_offset, grain_offset;
    uint16_t compress;
};

/* The header after the magic at buf[0..4) (at least VMDK4_HEADER_LEN
 * bytes): fields only, no checks. */
void vmdk_sparse_decode(const uint8_t *buf, struct vmdk_sparse_header *h);
/* qemu's checks of a header, for a file of `file_size` bytes. */
int vmdk_sparse_check(const struct vmdk_sparse_header *h, uint64_t file_size, const char *path,
                      struct ic_error *err);

struct vmdk_extent {
    struct ic_image *file; /* the extent's file */
    int owned;             /* opened by us (not img->file) */
    enum vmdk_extent_type type;
    int flat;
    uint64_t start, end;   /* guest bytes [start, end) */
    uint64_t flat_offset;  /* FLAT: bytes */
    uint64_t file_size;
    /* sparse */
    uint32_t version;
    int compressed, has_marker, zero_grain;
    uint64_t grain;        /* bytes */
    uint32_t gtes;
    uint64_t gd_entries;   /* the grain directory's, as the header sizes it */
    /* Entries held in gd: those inside the file; past them every entry
     * reads as 0 (no grain table), as qemu reads the directory (zeros past
     * the end of the file).  vmdk_gd_entry() reads one. */
    uint64_t gd_len;
    uint32_t *gd;          /* grain table sectors, host order */
};

static inline uint32_t vmdk_gd_entry(const struct vmdk_extent *e, uint64_t i)
{
    return i < e->gd_len ? e->gd[i] : 0;
}

enum vmdk_grain_kind { VMDK_UNALLOC, VMDK_ZEROED, VMDK_DATA, VMDK_COMPRESSED };

struct vmdk_gt_slot {
    size_t ext;
    uint64_t gd_index;
    int valid;
    uint32_t *table;
};

struct vmdk_state {
    struct vmdk_extent *ext;
    size_t next;
    char create_type[128];
    uint32_t cid, parent_cid;
    atomic_int parent_checked;
    pthread_mutex_t gt_lock;
    struct vmdk_gt_slot slots[VMDK_GT_CACHE_SLOTS];
};

static inline struct vmdk_state *vmdk_state_of(struct ic_image *img)
{
    return img->drv_state;
}

/* Open the sparse extent in `e->file` (e->start set): header, footer,
 * grain directory.  `top`: img->file itself (a monolithic sparse or
 * stream image), whose embedded descriptor the caller reads. */
int vmdk_sparse_open(struct ic_image *img, struct vmdk_extent *e, struct vmdk_sparse_header *h,
                     struct ic_error *err);
/* Grain table entries of grains first.. of extent `xi`, from one grain
 * table: at least one, at most `max`. */
int vmdk_sparse_entries(struct ic_image *img, size_t xi, uint64_t first, uint64_t max,
                        uint32_t *out, uint64_t *got, struct ic_error *err);
enum vmdk_grain_kind vmdk_sparse_kind(const struct vmdk_extent *e, uint32_t entry);
/* Inflate the compressed grain at host sector `entry` of e into `out`
 * (e->grain bytes); `need` bytes at least must come out. */
int vmdk_sparse_inflate(struct ic_image *img, const struct vmdk_extent *e, uint32_t entry,
                        uint8_t *out, uint64_t need, struct ic_error *err);
void vmdk_cache_free(struct vmdk_state *s);

static inline uint32_t vmdk_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline uint64_t vmdk_le64(const uint8_t *p)
{
    return (uint64_t)vmdk_le32(p) | (uint64_t)vmdk_le32(p + 4) << 32;
}

#endif
