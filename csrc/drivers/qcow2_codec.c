/* Compressed clusters: where an L2 entry says their bytes are, and zlib's
 * raw deflate both ways, as qemu writes and reads them (4 KiB window). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "qcow2_internal.h"

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
    /* a valid stream of one cluster never takes more than two */
    if (len > 2 * csz)
        len = 2 * csz;
    uint8_t *in = malloc(len);
    if (!in)
        return ic_error_nomem(err);
    if (qcow2_read_meta(img, in, len, host, "unreadable compressed cluster", err) < 0) {
        free(in);
        return -1;
    }
    z_stream z;
    memset(&z, 0, sizeof z);
    int ret = inflateInit2(&z, -12);
    if (ret != Z_OK) {
        free(in);
        return ic_error_nomem(err);
    }
    z.next_in = in;
    z.avail_in = (uInt)len;
    z.next_out = out;
    z.avail_out = (uInt)csz;
    ret = inflate(&z, Z_FINISH);
    int full = z.avail_out == 0;
    inflateEnd(&z);
    free(in);
    /* qemu accepts a stream that fills the cluster, ended or not */
    if (!full || (ret != Z_STREAM_END && ret != Z_BUF_ERROR && ret != Z_OK))
        return qcow2_corrupt(img, err, "compressed cluster does not inflate to a cluster", host);
    return 0;
}

/* Each thread keeps one deflate stream: setting one up costs more than
 * compressing a small cluster.  Freed when the thread exits. */
static pthread_key_t deflate_key;
static pthread_once_t deflate_once = PTHREAD_ONCE_INIT;

static void free_deflate(void *p)
{
    deflateEnd(p);
    free(p);
}

static void make_deflate_key(void)
{
    (void)pthread_key_create(&deflate_key, free_deflate);
}

static z_stream *thread_deflate(void)
{
    pthread_once(&deflate_once, make_deflate_key);
    z_stream *z = pthread_getspecific(deflate_key);
    if (z)
        return deflateReset(z) == Z_OK ? z : NULL;
    z = calloc(1, sizeof *z);
    if (!z)
        return NULL;
    if (deflateInit2(z, Z_DEFAULT_COMPRESSION, Z_DEFLATED, -12, 9, Z_DEFAULT_STRATEGY) != Z_OK) {
        free(z);
        return NULL;
    }
    if (pthread_setspecific(deflate_key, z) != 0) {
        free_deflate(z);
        return NULL;
    }
    return z;
}

int qcow2_deflate_cluster(const uint8_t *in, size_t len, uint8_t *out, size_t cap,
                          size_t *out_len)
{
    z_stream *z = thread_deflate();
    if (!z)
        return -1;
    z->next_in = (Bytef *)in;
    z->avail_in = (uInt)len;
    z->next_out = out;
    z->avail_out = (uInt)cap;
    int r = deflate(z, Z_FINISH);
    *out_len = cap - z->avail_out;
    return r == Z_STREAM_END ? 0 : 1;
}
