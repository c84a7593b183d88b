/* The qcow2 on-disk header (docs/interop/qcow2.txt in QEMU), parsed and
 * checked without trusting a byte of it.  Pure functions over buffers, so
 * the fuzzer can drive them directly. */
#ifndef IMGCOPY_QCOW2_FORMAT_H
#define IMGCOPY_QCOW2_FORMAT_H

#include <stddef.h>
#include <stdint.h>

#include "../error.h"

#define QCOW2_MAGIC "QFI\xfb"
#define QCOW2_HEADER_V2_LEN 72
#define QCOW2_HEADER_V3_MIN 104
#define QCOW2_HEADER_READ 112 /* v3 up to and with compression_type */
#define QCOW2_HEADER_V3_LEN 112 /* the header imgcopy writes */
#define QCOW2_MIN_CLUSTER_BITS 9
#define QCOW2_MAX_CLUSTER_BITS 21
#define QCOW2_MAX_L1_BYTES (32u << 20)      /* qemu's limit */
#define QCOW2_MAX_REFTABLE_BYTES (8u << 20) /* qemu's limit */
#define QCOW2_MAX_BACKING_NAME 1023
#define QCOW2_MAX_BACKING_FORMAT 15
/* The snapshot table: qemu's limits */
#define QCOW2_MAX_SNAPSHOTS 65536u
#define QCOW2_MAX_SNAPSHOTS_BYTES (64u << 20)
#define QCOW2_MAX_SNAPSHOT_EXTRA 1024u
#define QCOW2_SNAPSHOT_FIXED 40
/* The bitmaps extension and directory: qemu's limits */
#define QCOW2_MAX_BITMAPS 65535u
#define QCOW2_MAX_BITMAP_DIRECTORY (1024u * 65535u)
#define QCOW2_BITMAPS_EXT_LEN 24
#define QCOW2_BITMAP_ENTRY_FIXED 24
#define QCOW2_BITMAP_MAX_TABLE_SIZE 0x8000000u
#define QCOW2_BITMAP_MAX_PHYS_SIZE 0x20000000u /* a table's clusters of bits, in bytes */
#define QCOW2_BITMAP_MIN_GRANULARITY 9
#define QCOW2_BITMAP_MAX_GRANULARITY 31
#define QCOW2_BITMAP_MAX_NAME 1023
#define QCOW2_BITMAP_TYPE_DIRTY 1
/* Reads at or past this offset fail in qemu (INT64_MAX aligned down to 1 GiB) */
#define QCOW2_MAX_OFFSET ((1ull << 63) - (1ull << 30))

#define QCOW2_OFFSET_MASK 0x00fffffffffffe00ull
#define QCOW2_OFLAG_COPIED (1ull << 63)
#define QCOW2_OFLAG_COMPRESSED (1ull << 62)
#define QCOW2_OFLAG_ZERO 1ull

/* Extended L2 entries: each entry's second word, the bitmap of its
 * cluster's subclusters (bit i of the low half: data; of the high half:
 * zeros) */
#define QCOW2_SUBCLUSTERS 32u
#define QCOW2_SUBCLUSTER_DATA(bitmap) ((bitmap) & 0xffffffffull)
#define QCOW2_SUBCLUSTER_ZEROS(bitmap) ((bitmap) >> 32)

enum {
    QCOW2_INCOMPAT_DIRTY = 1u << 0,
    QCOW2_INCOMPAT_CORRUPT = 1u << 1,
    QCOW2_INCOMPAT_DATA_FILE = 1u << 2,
    QCOW2_INCOMPAT_COMPRESSION = 1u << 3,
    QCOW2_INCOMPAT_EXTL2 = 1u << 4,
};

enum { QCOW2_COMPAT_LAZY_REFCOUNTS = 1u << 0 };

/* the header's compression_type */
enum { QCOW2_COMPRESSION_ZLIB = 0, QCOW2_COMPRESSION_ZSTD = 1 };

enum {
    QCOW2_AUTOCLEAR_BITMAPS = 1u << 0,
    QCOW2_AUTOCLEAR_DATA_FILE_RAW = 1u << 1,
};

enum {
    QCOW2_EXT_END = 0,
    QCOW2_EXT_BACKING_FORMAT = 0xe2792acau,
    QCOW2_EXT_FEATURE_TABLE = 0x6803f857u,
    QCOW2_EXT_DATA_FILE = 0x44415441u,
    QCOW2_EXT_CRYPTO = 0x0537be77u,
    QCOW2_EXT_BITMAPS = 0x23852875u,
};

struct qcow2_header {
    uint32_t version;
    uint32_t cluster_bits;
    uint64_t cluster_size;
    uint64_t backing_file_offset;
    uint32_t backing_file_size;
    uint64_t size;
    uint32_t crypt_method;
    uint32_t l1_size;
    uint64_t l1_table_offset;
    uint64_t refcount_table_offset;
    uint32_t refcount_table_clusters;
    uint32_t nb_snapshots;
    uint64_t snapshots_offset;
    uint64_t incompatible;
    uint64_t compatible;
    uint64_t autoclear;
    uint32_t refcount_order;
    uint32_t header_length;
    uint8_t compression_type;
    char backing_name[QCOW2_MAX_BACKING_NAME + 1]; /* "": no backing file */
    char backing_format[QCOW2_MAX_BACKING_FORMAT + 1];
    char incompatible_names[64][47]; /* from the feature name table */
    /* marked as imgcopy's writer marks an image it has not finished: dirty
     * and corrupt (v3), or (v2, parsed with QCOW2_PARSE_INCOMPLETE) no
     * magic */
    int incomplete;
    /* the bitmaps extension, when its auto-clear bit says it is valid */
    int has_bitmaps;
    uint32_t nb_bitmaps;
    uint64_t bitmap_directory_size;
    uint64_t bitmap_directory_offset;
};

/* The fixed part of a snapshot table entry, and what its extra data says. */
struct qcow2_snapshot_entry {
    uint64_t l1_table_offset;
    uint32_t l1_size;
    uint16_t id_str_size;
    uint16_t name_size;
    uint32_t date_sec;
    uint32_t date_nsec;
    uint64_t vm_clock_nsec;
    uint32_t vm_state_size; /* superseded by the 64-bit one in extra data */
    uint32_t extra_data_size;
};

uint64_t qcow2_be64(const void *p);
uint32_t qcow2_be32(const void *p);
void qcow2_put_be64(uint8_t *p, uint64_t v);
void qcow2_put_be32(uint8_t *p, uint32_t v);
/* Entry `idx` of a refcount block of `bits`-bit entries (1 to 64, a power
 * of two; below 8 bits the first entry is the lowest bits of a byte). */
uint64_t qcow2_refcount_entry(const uint8_t *block, uint64_t idx, unsigned bits);

/* Every check qemu makes of a header on opening it, the error naming the
 * field as docs/interop/qcow2.txt spells it.  `buf` holds the first `len`
 * bytes of the file (at most QCOW2_HEADER_READ). */
int qcow2_parse_header(const uint8_t *buf, size_t len, struct qcow2_header *h,
                       const char *path, struct ic_error *err);
/* The same, and with QCOW2_PARSE_INCOMPLETE what imgcopy's writer leaves
 * while it writes (to resume writing it): a v2 header without its magic,
 * an incomplete header without refcount table (h->incomplete says so). */
enum { QCOW2_PARSE_INCOMPLETE = 1u << 0 };
int qcow2_parse_header_as(const uint8_t *buf, size_t len, unsigned how,
                          struct qcow2_header *h, const char *path, struct ic_error *err);
/* The header extensions and the backing file name.  `cluster0` holds the
 * first cluster (zero-padded past the end of file). */
int qcow2_parse_extensions(const uint8_t *cluster0, size_t len, struct qcow2_header *h,
                           const char *path, struct ic_error *err);
/* Refuse what imgcopy cannot read correctly, naming the feature. */
int qcow2_check_features(const struct qcow2_header *h, int force, int writable,
                         const char *path, struct ic_error *err);
/* A bitmap directory entry's flags */
enum { QCOW2_BITMAP_IN_USE = 1u << 0, QCOW2_BITMAP_AUTO = 1u << 1 };

/* One persistent dirty bitmap of the directory: what info lists, and where
 * its table is for a reader of its dirty ranges. */
struct qcow2_bitmap {
    const char *name;         /* NUL-terminated, cut at a NUL as qemu cuts it */
    uint8_t granularity_bits; /* a bit covers 2^granularity_bits bytes (9..31) */
    uint32_t flags;           /* QCOW2_BITMAP_IN_USE, QCOW2_BITMAP_AUTO */
    uint64_t table_offset;    /* cluster aligned */
    uint32_t table_size;      /* entries of 8 bytes */
};

/* The bitmap directory (`len` bytes, the whole directory) checked as qemu
 * checks it on opening an image with valid bitmaps.  With `out` (room for
 * h->nb_bitmaps entries) and `names` (room for `len` bytes: every name and
 * its NUL fit in the entries holding them), its entries in directory
 * order, their names copied into `names`; without them, only checked. */
int qcow2_parse_bitmap_directory(const uint8_t *dir, size_t len, const struct qcow2_header *h,
                                 struct qcow2_bitmap *out, char *names, const char *path,
                                 struct ic_error *err);
/* A bitmap table entry: the host offset of a cluster of the bitmap's
 * bits, or 0 and bit 0 saying whether all its bits are set. */
#define QCOW2_BITMAP_OFFSET_MASK 0x00fffffffffffe00ull
#define QCOW2_BITMAP_ALL_ONES 1ull
/* A bitmap table entry as qemu accepts it (reserved bits clear, aligned). */
int qcow2_bitmap_table_entry_ok(uint64_t entry, uint64_t cluster_size);
/* The entries a bitmap's table has when qemu can read it: one per cluster
 * of its bits for a disk of `disk_len` bytes (whole sectors), as qemu's
 * load_bitmap_data counts them (0 for an empty disk, whose bitmaps qemu
 * cannot read). */
uint64_t qcow2_bitmap_table_needed(uint64_t disk_len, unsigned granularity_bits,
                                   uint64_t cluster_size);
/* The fixed part of snapshot table entry `index`; checks its extra data
 * size.  *entry_len: the whole entry's bytes, padded to 8. */
int qcow2_parse_snapshot_entry(const uint8_t fixed[QCOW2_SNAPSHOT_FIXED], uint32_t index,
                               struct qcow2_snapshot_entry *e, uint64_t *entry_len,
                               const char *path, struct ic_error *err);

/* Room for a header imgcopy writes: the v3 header, a backing format
 * extension, the bitmaps extension, the end marker and a backing file
 * name. */
#define QCOW2_HEADER_MAX                                                                   \
    (QCOW2_HEADER_V3_LEN + 8 + 64 + 8 + QCOW2_BITMAPS_EXT_LEN + 8 + QCOW2_MAX_BACKING_NAME + 1)
/* A new image's header (`h`: QCOW2_HEADER_MAX bytes): incomplete, it is
 * marked dirty and corrupt (v3) or has no magic (v2).  Complete, with
 * q->has_bitmaps (v3), it has the bitmaps extension q's bitmap fields
 * describe, and auto-clear bit 0 says it is valid. */
void qcow2_encode_header(const struct qcow2_header *q, int complete, uint8_t *h, size_t *len);
/* An existing image keeps its header (`found`) and extensions; only the
 * refcount table, the feature bits (the in-progress marks; auto-clear
 * bits, which writers must clear) and, for v2, the magic change. */
void qcow2_patch_header(const uint8_t *found, const struct qcow2_header *q, int complete,
                        uint8_t *h, size_t *len);

#endif
