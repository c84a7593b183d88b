/* Whole-buffer deflate and zstd, with one set of contexts per thread.
 *
 * Deflate written by libdeflate uses distances up to 32 KiB, where qemu
 * compresses with a 4 KiB window; qemu still reads it back, because it
 * inflates a cluster in one call into the whole cluster, and zlib bounds
 * distances by its window only for output of earlier calls (RFC 1951 has
 * no window field: the 32 KiB maximum is the format's).  The tests check
 * every image imgcopy compresses with qemu-img compare. */
#include "compression.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#ifdef IMGCOPY_HAVE_LIBDEFLATE
#include <libdeflate.h>
#endif
#ifdef IMGCOPY_HAVE_ZSTD
#include <zstd.h>
#include <zstd_errors.h>
#endif

/* qemu's zlib parameters: raw deflate, 4 KiB window, memLevel 9 */
#define QEMU_ZLIB_WINDOW_BITS (-12)
#define QEMU_ZLIB_MEM_LEVEL 9
/* Measured on OS-like, binary and text data (64 KiB clusters): libdeflate
 * level 4 is 2.5-3x as fast as qemu's zlib level 6 and 4-9% smaller;
 * below level 2 it can come out larger. */
#define LIBDEFLATE_DEFAULT_LEVEL 4
#define ZLIB_DEFAULT_LEVEL 6
#define ZLIB_MAX_LEVEL 9
#define LIBDEFLATE_MAX_LEVEL 12
/* qemu's level: a lower one makes text 2-5% larger */
#define ZSTD_DEFAULT_LEVEL 3
/* above 19 zstd's "ultra" levels take hundreds of MiB per context */
#define ZSTD_MAX_LEVEL 19
/* A frame may ask for a window up to 2^27 bytes; a cluster is at most 2 MiB
 * and no honest frame of one needs more: a hostile one must not make
 * every worker thread allocate 128 MiB. */
#define ZSTD_WINDOW_LOG_MAX 24

/* ---- per-thread contexts ------------------------------------------------ */

struct contexts {
    z_stream *zdeflate; /* zlib: deflate stream at zdeflate_level */
    int zdeflate_level;
    z_stream *zinflate;
    z_stream *zstream_inflate; /* RFC 1950 streams */
#ifdef IMGCOPY_HAVE_LIBDEFLATE
    struct libdeflate_compressor *ldc; /* at ldc_level */
    int ldc_level;
    struct libdeflate_decompressor *ldd;
#endif
#ifdef IMGCOPY_HAVE_ZSTD
    ZSTD_CCtx *zc;
    ZSTD_DCtx *zd;
#endif
};

static pthread_key_t contexts_key;
static pthread_once_t contexts_once = PTHREAD_ONCE_INIT;
static int contexts_key_error;

static void free_zdeflate(struct contexts *c)
{
    if (c->zdeflate) {
        deflateEnd(c->zdeflate);
        free(c->zdeflate);
        c->zdeflate = NULL;
    }
}

static void free_contexts(void *p)
{
    struct contexts *c = p;
    free_zdeflate(c);
    if (c->zinflate) {
        inflateEnd(c->zinflate);
        free(c->zinflate);
    }
    if (c->zstream_inflate) {
        inflateEnd(c->zstream_inflate);
        free(c->zstream_inflate);
    }
#ifdef IMGCOPY_HAVE_LIBDEFLATE
    libdeflate_free_compressor(c->ldc);
    libdeflate_free_decompressor(c->ldd);
#endif
#ifdef IMGCOPY_HAVE_ZSTD
    ZSTD_freeCCtx(c->zc);
    ZSTD_freeDCtx(c->zd);
#endif
    free(c);
}

static void make_contexts_key(void)
{
    contexts_key_error = pthread_key_create(&contexts_key, free_contexts);
}

static struct contexts *thread_contexts(void)
{
    pthread_once(&contexts_once, make_contexts_key);
    if (contexts_key_error) {
        errno = contexts_key_error;
        return NULL;
    }
    struct contexts *c = pthread_getspecific(contexts_key);
    if (c)
        return c;
    c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    int r = pthread_setspecific(contexts_key, c);
    if (r) {
        free(c);
        errno = r;
        return NULL;
    }
    return c;
}

/* ---- what this build has ------------------------------------------------ */

int ic_compression_available(enum ic_compression_type type)
{
    switch (type) {
    case IC_COMPRESSION_DEFLATE:
        return 1;
    case IC_COMPRESSION_ZSTD:
#ifdef IMGCOPY_HAVE_ZSTD
        return 1;
#else
        return 0;
#endif
    }
    return 0;
}

const char *ic_compression_library(enum ic_compression_type type)
{
    static char deflate_name[48], zstd_name[48];
    switch (type) {
    case IC_COMPRESSION_DEFLATE:
#ifdef IMGCOPY_HAVE_LIBDEFLATE
        snprintf(deflate_name, sizeof deflate_name, "libdeflate %s", LIBDEFLATE_VERSION_STRING);
#else
        snprintf(deflate_name, sizeof deflate_name, "zlib %s", zlibVersion());
#endif
        return deflate_name;
    case IC_COMPRESSION_ZSTD:
#ifdef IMGCOPY_HAVE_ZSTD
        snprintf(zstd_name, sizeof zstd_name, "libzstd %s", ZSTD_versionString());
        return zstd_name;
#else
        (void)zstd_name;
        return NULL;
#endif
    }
    return NULL;
}

const char *ic_compression_lib_version(const char *lib)
{
    if (strcmp(lib, "zlib") == 0)
        return zlibVersion();
#ifdef IMGCOPY_HAVE_LIBDEFLATE
    if (strcmp(lib, "libdeflate") == 0)
        return LIBDEFLATE_VERSION_STRING;
#endif
#ifdef IMGCOPY_HAVE_ZSTD
    if (strcmp(lib, "zstd") == 0)
        return ZSTD_versionString();
#endif
    return NULL;
}

int ic_compression_max_level(enum ic_compression_type type)
{
    if (!ic_compression_available(type))
        return 0;
    if (type == IC_COMPRESSION_ZSTD)
        return ZSTD_MAX_LEVEL;
#ifdef IMGCOPY_HAVE_LIBDEFLATE
    return LIBDEFLATE_MAX_LEVEL;
#else
    return ZLIB_MAX_LEVEL;
#endif
}

int ic_compression_default_level(enum ic_compression_type type)
{
    if (type == IC_COMPRESSION_ZSTD)
        return ZSTD_DEFAULT_LEVEL;
#ifdef IMGCOPY_HAVE_LIBDEFLATE
    return LIBDEFLATE_DEFAULT_LEVEL;
#else
    return ZLIB_DEFAULT_LEVEL;
#endif
}

/* ---- deflate ------------------------------------------------------------ */

#ifdef IMGCOPY_HAVE_LIBDEFLATE
static int libdeflate_compress(struct contexts *c, int level, const void *in, size_t len,
                               void *out, size_t cap, size_t *out_len)
{
    if (c->ldc && c->ldc_level != level) {
        libdeflate_free_compressor(c->ldc);
        c->ldc = NULL;
    }
    if (!c->ldc) {
        if (!(c->ldc = libdeflate_alloc_compressor(level))) {
            errno = ENOMEM;
            return -1;
        }
        c->ldc_level = level;
    }
    size_t n = libdeflate_deflate_compress(c->ldc, in, len, out, cap);
    if (n == 0)
        return 1;
    *out_len = n;
    return 0;
}
#else
static int zlib_compress(struct contexts *c, int level, const void *in, size_t len, void *out,
                         size_t cap, size_t *out_len)
{
    if (len > UINT_MAX || cap > UINT_MAX) {
        errno = EINVAL;
        return -1;
    }
    if (c->zdeflate && c->zdeflate_level != level)
        free_zdeflate(c);
    if (!c->zdeflate) {
        if (!(c->zdeflate = calloc(1, sizeof *c->zdeflate)))
            return -1;
        if (deflateInit2(c->zdeflate, level, Z_DEFLATED, QEMU_ZLIB_WINDOW_BITS,
                         QEMU_ZLIB_MEM_LEVEL, Z_DEFAULT_STRATEGY) != Z_OK) {
            free(c->zdeflate);
            c->zdeflate = NULL;
            errno = ENOMEM;
            return -1;
        }
        c->zdeflate_level = level;
    } else if (deflateReset(c->zdeflate) != Z_OK) {
        free_zdeflate(c);
        errno = EIO;
        return -1;
    }
    z_stream *z = c->zdeflate;
    z->next_in = (Bytef *)in;
    z->avail_in = (uInt)len;
    z->next_out = out;
    z->avail_out = (uInt)cap;
    int r = deflate(z, Z_FINISH);
    if (r == Z_STREAM_END) {
        *out_len = cap - z->avail_out;
        return 0;
    }
    if (r == Z_OK || r == Z_BUF_ERROR) /* out of room */
        return 1;
    errno = EIO;
    return -1;
}
#endif

/* The thread's inflate stream in *zp, made (with window_bits: raw or
 * zlib-wrapped) or reset, set to read `len` bytes of `in` into `cap` bytes
 * of `out`; NULL with errno. */
static z_stream *inflate_stream(z_stream **zp, int window_bits, const void *in, size_t len,
                                void *out, size_t cap)
{
    if (len > UINT_MAX || cap > UINT_MAX) {
        errno = EIO;
        return NULL;
    }
    if (!*zp) {
        if (!(*zp = calloc(1, sizeof **zp)))
            return NULL;
        if (inflateInit2(*zp, window_bits) != Z_OK) {
            free(*zp);
            *zp = NULL;
            errno = ENOMEM;
            return NULL;
        }
    } else if (inflateReset(*zp) != Z_OK) {
        errno = EIO;
        return NULL;
    }
    z_stream *z = *zp;
    z->next_in = (Bytef *)in;
    z->avail_in = (uInt)len;
    z->next_out = out;
    z->avail_out = (uInt)cap;
    return z;
}

/* qemu's reading: the output filled, the stream ended there or not; the
 * input may hold bytes past the stream's end. */
static int zlib_inflate(struct contexts *c, const void *in, size_t len, void *out,
                        size_t out_len)
{
    z_stream *z = inflate_stream(&c->zinflate, QEMU_ZLIB_WINDOW_BITS, in, len, out, out_len);
    if (!z)
        return -1;
    int r = inflate(z, Z_FINISH);
    if (z->avail_out == 0 && (r == Z_STREAM_END || r == Z_BUF_ERROR || r == Z_OK))
        return 0;
    errno = EIO;
    return -1;
}

static int deflate_decompress(struct contexts *c, const void *in, size_t len, void *out,
                              size_t out_len)
{
#ifdef IMGCOPY_HAVE_LIBDEFLATE
    if (!c->ldd && !(c->ldd = libdeflate_alloc_decompressor())) {
        errno = ENOMEM;
        return -1;
    }
    size_t got;
    if (libdeflate_deflate_decompress_ex(c->ldd, in, len, out, out_len, NULL, &got) ==
            LIBDEFLATE_SUCCESS && got == out_len)
        return 0;
    /* a stream that goes on past the cluster, or ends short, or is bad:
     * zlib decides, as it does for qemu */
#endif
    return zlib_inflate(c, in, len, out, out_len);
}

/* ---- zstd --------------------------------------------------------------- */

#ifdef IMGCOPY_HAVE_ZSTD
static int zstd_compress(struct contexts *c, int level, const void *in, size_t len, void *out,
                         size_t cap, size_t *out_len)
{
    if (!c->zc && !(c->zc = ZSTD_createCCtx())) {
        errno = ENOMEM;
        return -1;
    }
    size_t n = ZSTD_compressCCtx(c->zc, out, cap, in, len, level);
    if (!ZSTD_isError(n)) {
        *out_len = n;
        return 0;
    }
    if (ZSTD_getErrorCode(n) == ZSTD_error_dstSize_tooSmall)
        return 1;
    errno = ZSTD_getErrorCode(n) == ZSTD_error_memory_allocation ? ENOMEM : EIO;
    return -1;
}

/* qemu's reading: frames decoded until the output is full, the last one
 * ending exactly there; what follows it in `in` is not looked at. */
static int zstd_decompress(struct contexts *c, const void *in, size_t len, void *out,
                           size_t out_len)
{
    if (!c->zd) {
        if (!(c->zd = ZSTD_createDCtx())) {
            errno = ENOMEM;
            return -1;
        }
        if (ZSTD_isError(ZSTD_DCtx_setParameter(c->zd, ZSTD_d_windowLogMax,
                                                ZSTD_WINDOW_LOG_MAX))) {
            errno = EIO;
            return -1;
        }
    }
    if (ZSTD_isError(ZSTD_DCtx_reset(c->zd, ZSTD_reset_session_only))) {
        errno = EIO;
        return -1;
    }
    ZSTD_inBuffer src = {in, len, 0};
    ZSTD_outBuffer dst = {out, out_len, 0};
    size_t r = 0;
    while (dst.pos < dst.size) {
        size_t in_before = src.pos, out_before = dst.pos;
        r = ZSTD_decompressStream(c->zd, &dst, &src);
        if (ZSTD_isError(r)) {
            if (ZSTD_getErrorCode(r) == ZSTD_error_memory_allocation) {
                errno = ENOMEM;
                return -1;
            }
            break;
        }
        if (src.pos == in_before && dst.pos == out_before)
            break; /* no progress: the input ran out */
    }
    if (dst.pos == dst.size && !ZSTD_isError(r) && r == 0)
        return 0;
    errno = EIO;
    return -1;
}
#endif

/* ---- the API ------------------------------------------------------------ */

static int check_level(enum ic_compression_type type, int *level)
{
    if (!ic_compression_available(type)) {
        errno = ENOTSUP;
        return -1;
    }
    if (*level == IC_COMPRESSION_DEFAULT_LEVEL)
        *level = ic_compression_default_level(type);
    if (*level < 1 || *level > ic_compression_max_level(type)) {
        errno = EINVAL;
        return -1;
    }
    return 0;
}

int ic_compress(enum ic_compression_type type, int level, const void *in, size_t len,
                void *out, size_t cap, size_t *out_len)
{
    if (check_level(type, &level) < 0)
        return -1;
    struct contexts *c = thread_contexts();
    if (!c)
        return -1;
    if (type == IC_COMPRESSION_ZSTD) {
#ifdef IMGCOPY_HAVE_ZSTD
        return zstd_compress(c, level, in, len, out, cap, out_len);
#endif
    }
#ifdef IMGCOPY_HAVE_LIBDEFLATE
    return libdeflate_compress(c, level, in, len, out, cap, out_len);
#else
    return zlib_compress(c, level, in, len, out, cap, out_len);
#endif
}

int ic_decompress(enum ic_compression_type type, const void *in, size_t len, void *out,
                  size_t out_len)
{
    if (!ic_compression_available(type)) {
        errno = ENOTSUP;
        return -1;
    }
    struct contexts *c = thread_contexts();
    if (!c)
        return -1;
    if (type == IC_COMPRESSION_ZSTD) {
#ifdef IMGCOPY_HAVE_ZSTD
        return zstd_decompress(c, in, len, out, out_len);
#endif
    }
    return deflate_decompress(c, in, len, out, out_len);
}

/* ---- zlib streams (RFC 1950) -------------------------------------------- */

static int zlib_stream_inflate(struct contexts *c, const void *in, size_t len, void *out,
                               size_t cap, size_t *made)
{
    z_stream *z = inflate_stream(&c->zstream_inflate, MAX_WBITS, in, len, out, cap);
    if (!z)
        return -1;
    if (inflate(z, Z_FINISH) != Z_STREAM_END) {
        errno = EIO;
        return -1;
    }
    *made = cap - z->avail_out;
    return 0;
}

int ic_zlib_inflate(const void *in, size_t len, void *out, size_t cap, size_t *made)
{
    struct contexts *c = thread_contexts();
    if (!c)
        return -1;
#ifdef IMGCOPY_HAVE_LIBDEFLATE
    if (!c->ldd && !(c->ldd = libdeflate_alloc_decompressor())) {
        errno = ENOMEM;
        return -1;
    }
    size_t used;
    if (libdeflate_zlib_decompress_ex(c->ldd, in, len, out, cap, &used, made) ==
            LIBDEFLATE_SUCCESS)
        return 0;
#endif
    return zlib_stream_inflate(c, in, len, out, cap, made);
}
