/* Compressed clusters: where an L2 entry says their bytes are, and their
 * data both ways (compression.c), as qemu reads them. */
#include <errno.h>
#include <stdlib.h>

#include "compression.h"

#include "qcow2_state.h"

/* The entry's host offset takes the low 62 - (cluster_bits - 8) bits; the
 * bits above count the 512-byte sectors it touches, less one. */
static unsigned offset_bits(const struct qcow2_header *h)
{
    return 62 - (h->cluster_bits - 8);
}

void qcow2_compressed_decode(const struct qcow2_header *h, uint64_t entry, uint64_t *host,
                             uint64_t *len)
{
    unsigned x = offset_bits(h);
    *host = entry & ((1ull << x) - 1);
    uint64_t sectors = ((entry & ~QCOW2_OFLAG_COPIED & ~QCOW2_OFLAG_COMPRESSED) >> x) + 1;
    *len = sectors * 512 - (*host & 511);
}

uint64_t qcow2_compressed_encode(const struct qcow2_header *h, uint64_t host, uint64_t len)
{
    uint64_t more_sectors = (host + len - 1) / 512 - host / 512;
    return QCOW2_OFLAG_COMPRESSED | more_sectors << offset_bits(h) | host;
}

int qcow2_inflate_cluster(struct ic_image *img, uint64_t entry, uint8_t *out,
                          struct ic_error *err)
{
    struct qcow2_state *s = qcow2_state_of(img);
    uint64_t csz = s->h.cluster_size, host, len;
    qcow2_compressed_decode(&s->h, entry, &host, &len);
    if (host < csz)
        return qcow2_corrupt(img, err, "compressed cluster overlaps the header", host);
    /* valid data of one cluster never takes more than two */
    if (len > 2 * csz)
        len = 2 * csz;
    uint8_t *in = malloc(len);
    if (!in)
        return ic_error_nomem(err);
    if (qcow2_read_meta(img, in, len, host, "unreadable compressed cluster", err) < 0) {
        free(in);
        return -1;
    }
    int ret = ic_decompress(qcow2_compression(&s->h), in, len, out, csz);
    int saved = errno;
    free(in);
    if (ret == 0)
        return 0;
    if (saved == ENOMEM)
        return ic_error_nomem(err);
    return qcow2_corrupt(img, err, s->h.compression_type == QCOW2_COMPRESSION_ZSTD
                         ? "compressed cluster is not a zstd frame of one cluster"
                         : "compressed cluster does not inflate to a cluster", host);
}

int qcow2_compress_cluster(const struct qcow2_writer *w, const uint8_t *in, size_t len,
                           uint8_t *out, size_t cap, size_t *out_len)
{
    return ic_compress(w->compression, w->compression_level, in, len, out, cap, out_len);
}
