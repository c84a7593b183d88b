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
#define QCOW2_MIN_CLUSTER_BITS 9
#define QCOW2_MAX_CLUSTER_BITS 21
#define QCOW2_MAX_L1_BYTES (32u << 20)      /* qemu's limit */
#define QCOW2_MAX_REFTABLE_BYTES (8u << 20) /* qemu's limit */
#define QCOW2_MAX_BACKING_NAME 1023

#define QCOW2_OFFSET_MASK 0x00fffffffffffe00ull
#define QCOW2_OFLAG_COPIED (1ull << 63)
#define QCOW2_OFLAG_COMPRESSED (1ull << 62)
#define QCOW2_OFLAG_ZERO 1ull

enum {
    QCOW2_INCOMPAT_DIRTY = 1u << 0,
    QCOW2_INCOMPAT_CORRUPT = 1u << 1,
    QCOW2_INCOMPAT_DATA_FILE = 1u << 2,
    QCOW2_INCOMPAT_COMPRESSION = 1u << 3,
    QCOW2_INCOMPAT_EXTL2 = 1u << 4,
};

enum {
    QCOW2_EXT_END = 0,
    QCOW2_EXT_BACKING_FORMAT = 0xe2792acau,
    QCOW2_EXT_FEATURE_TABLE = 0x6803f857u,
    QCOW2_EXT_DATA_FILE = 0x44415441u,
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
    char backing_name[QCOW2_MAX_BACKING_NAME + 1];
    char backing_format[64];
    char incompatible_names[64][47]; /* from the feature name table */
};

uint64_t qcow2_be64(const void *p);
uint32_t qcow2_be32(const void *p);

/* `buf` holds the first `len` bytes of the file (at most QCOW2_HEADER_READ). */
int qcow2_parse_header(const uint8_t *buf, size_t len, struct qcow2_header *h,
                       const char *path, struct ic_error *err);
/* `cluster0` holds the first cluster (zero-padded past the end of file). */
int qcow2_parse_extensions(const uint8_t *cluster0, size_t len, struct qcow2_header *h,
                           const char *path, struct ic_error *err);
/* Refuse what imgcopy cannot read correctly, naming the feature. */
int qcow2_check_features(const struct qcow2_header *h, int force, int writable,
                         const char *path, struct ic_error *err);

#endif
