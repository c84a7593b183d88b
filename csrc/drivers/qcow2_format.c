#include "qcow2_format.h"

#include <string.h>

uint64_t qcow2_be64(const void *p)
{
    const uint8_t *b = p;
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | b[i];
    return v;
}

uint32_t qcow2_be32(const void *p)
{
    const uint8_t *b = p;
    return (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | b[3];
}

static int bad(const char *path, struct ic_error *err, const char *what,
               unsigned long long value)
{
    return ic_error_format(err, path, "corrupt qcow2 header: %s (%llu)", what, value);
}

int qcow2_parse_header(const uint8_t *buf, size_t len, struct qcow2_header *h,
                       const char *path, struct ic_error *err)
{
    memset(h, 0, sizeof *h);
    if (len < QCOW2_HEADER_V2_LEN || memcmp(buf, QCOW2_MAGIC, 4) != 0)
        return ic_error_format(err, path, "not a qcow2 image (truncated header or bad magic)");
    h->version = qcow2_be32(buf + 4);
    h->backing_file_offset = qcow2_be64(buf + 8);
    h->backing_file_size = qcow2_be32(buf + 16);
    h->cluster_bits = qcow2_be32(buf + 20);
    h->size = qcow2_be64(buf + 24);
    h->crypt_method = qcow2_be32(buf + 32);
    h->l1_size = qcow2_be32(buf + 36);
    h->l1_table_offset = qcow2_be64(buf + 40);
    h->refcount_table_offset = qcow2_be64(buf + 48);
    h->refcount_table_clusters = qcow2_be32(buf + 56);
    h->nb_snapshots = qcow2_be32(buf + 60);
    h->snapshots_offset = qcow2_be64(buf + 64);

    if (h->version != 2 && h->version != 3)
        return ic_error_format(err, path, "qcow2 version %u is not supported", h->version);
    if (h->cluster_bits < QCOW2_MIN_CLUSTER_BITS || h->cluster_bits > QCOW2_MAX_CLUSTER_BITS)
        return bad(path, err, "cluster_bits out of range", h->cluster_bits);
    h->cluster_size = 1ull << h->cluster_bits;

    if (h->version == 2) {
        h->refcount_order = 4;
        h->header_length = QCOW2_HEADER_V2_LEN;
    } else {
        if (len < QCOW2_HEADER_V3_MIN)
            return ic_error_format(err, path, "truncated qcow2 v3 header");
        h->incompatible = qcow2_be64(buf + 72);
        h->compatible = qcow2_be64(buf + 80);
        h->autoclear = qcow2_be64(buf + 88);
        h->refcount_order = qcow2_be32(buf + 96);
        h->header_length = qcow2_be32(buf + 100);
        if (h->header_length < QCOW2_HEADER_V3_MIN || h->header_length % 8 ||
            h->header_length > h->cluster_size)
            return bad(path, err, "header_length", h->header_length);
        if (h->header_length > 104 && len > 104)
            h->compression_type = buf[104];
    }
    if (h->refcount_order > 6)
        return bad(path, err, "refcount_order above 6", h->refcount_order);

    /* the L1 table must map the whole virtual disk, within qemu's cap */
    uint64_t l2_entries = h->cluster_size / 8;
    uint64_t clusters = h->size / h->cluster_size + (h->size % h->cluster_size != 0);
    uint64_t needed = clusters / l2_entries + (clusters % l2_entries != 0);
    if ((uint64_t)h->l1_size * 8 > QCOW2_MAX_L1_BYTES)
        return bad(path, err, "L1 table larger than 32 MiB", h->l1_size);
    if (h->l1_size < needed)
        return bad(path, err, "L1 table too small for the virtual size", h->l1_size);
    if (h->refcount_table_offset % h->cluster_size)
        return bad(path, err, "misaligned refcount table", h->refcount_table_offset);
    if ((uint64_t)h->refcount_table_clusters * h->cluster_size > QCOW2_MAX_REFTABLE_BYTES)
        return bad(path, err, "refcount table larger than 8 MiB", h->refcount_table_clusters);
    if (h->backing_file_offset) {
        if (h->backing_file_size > QCOW2_MAX_BACKING_NAME)
            return bad(path, err, "backing file name longer than 1023 bytes",
                       h->backing_file_size);
        if (h->backing_file_offset > h->cluster_size ||
            h->backing_file_size > h->cluster_size - h->backing_file_offset)
            return bad(path, err, "backing file name outside the header cluster",
                       h->backing_file_offset);
    }
    return 0;
}

int qcow2_parse_extensions(const uint8_t *cluster0, size_t len, struct qcow2_header *h,
                           const char *path, struct ic_error *err)
{
    size_t end = len;
    if (h->backing_file_offset && h->backing_file_offset < end)
        end = (size_t)h->backing_file_offset;
    size_t off = h->header_length;
    while (off + 8 <= end) {
        uint32_t type = qcow2_be32(cluster0 + off);
        uint32_t elen = qcow2_be32(cluster0 + off + 4);
        off += 8;
        if (type == QCOW2_EXT_END)
            break;
        if (elen > end - off)
            return bad(path, err, "header extension runs past the header", type);
        const uint8_t *data = cluster0 + off;
        if (type == QCOW2_EXT_BACKING_FORMAT) {
            if (elen >= sizeof h->backing_format)
                return bad(path, err, "backing format name too long", elen);
            memcpy(h->backing_format, data, elen);
            h->backing_format[elen] = '\0';
            if (strlen(h->backing_format) != elen)
                return bad(path, err, "backing format name holds a NUL", elen);
        } else if (type == QCOW2_EXT_FEATURE_TABLE) {
            for (uint32_t k = 0; k + 48 <= elen; k += 48) {
                if (data[k] == 0 && data[k + 1] < 64) {
                    memcpy(h->incompatible_names[data[k + 1]], data + k + 2, 46);
                    h->incompatible_names[data[k + 1]][46] = '\0';
                }
            }
        }
        off += ((size_t)elen + 7) / 8 * 8;
    }
    if (h->backing_file_offset) {
        memcpy(h->backing_name, cluster0 + h->backing_file_offset, h->backing_file_size);
        h->backing_name[h->backing_file_size] = '\0';
        if (strlen(h->backing_name) != h->backing_file_size || h->backing_file_size == 0)
            return bad(path, err, "backing file name is empty or holds a NUL",
                       h->backing_file_size);
    }
    return 0;
}

int qcow2_check_features(const struct qcow2_header *h, int force, int writable,
                         const char *path, struct ic_error *err)
{
    if (h->crypt_method)
        return ic_error_format(err, path, "encrypted qcow2 images are not supported "
                               "(crypt_method %u)", h->crypt_method);
    uint64_t in = h->incompatible;
    /* read-only, the caller may read such an image anyway */
    enum ic_remedy remedy = writable ? IC_REMEDY_NONE : IC_REMEDY_FORCE;
    if (in & QCOW2_INCOMPAT_CORRUPT && (!force || writable)) {
        ic_error_format(err, path, "the image is marked corrupt");
        return ic_error_remedy(err, remedy);
    }
    if (in & QCOW2_INCOMPAT_DIRTY && (!force || writable)) {
        ic_error_format(err, path, "the image is marked dirty (not closed cleanly); "
                        "qemu-img check -r all repairs it");
        return ic_error_remedy(err, remedy);
    }
    if (in & QCOW2_INCOMPAT_DATA_FILE)
        return ic_error_format(err, path, "qcow2 external data files are not supported");
    if (in & QCOW2_INCOMPAT_EXTL2)
        return ic_error_format(err, path, "qcow2 extended L2 entries (subclusters) are not "
                               "supported");
    if (in & QCOW2_INCOMPAT_COMPRESSION) {
        if (h->compression_type == 1)
            return ic_error_format(err, path, "zstd-compressed qcow2 images are not supported "
                                   "(this build has no libzstd)");
        return ic_error_format(err, path, "unknown qcow2 compression type %u",
                               h->compression_type);
    }
    if (h->compression_type)
        return bad(path, err, "compression type set without its feature bit",
                   h->compression_type);
    uint64_t known = QCOW2_INCOMPAT_DIRTY | QCOW2_INCOMPAT_CORRUPT | QCOW2_INCOMPAT_DATA_FILE |
                     QCOW2_INCOMPAT_COMPRESSION | QCOW2_INCOMPAT_EXTL2;
    for (unsigned bit = 0; bit < 64; bit++) {
        if ((in & ~known) >> bit & 1) {
            const char *name = h->incompatible_names[bit];
            return ic_error_format(err, path, "unsupported qcow2 incompatible feature %s%s%s"
                                   "(bit %u)", name[0] ? "'" : "", name, name[0] ? "' " : "",
                                   bit);
        }
    }
    return 0;
}
