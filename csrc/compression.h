/* Whole-buffer compression as image formats store it (compression.c): each
 * buffer (a qcow2 cluster) is compressed on its own, as a raw deflate
 * stream (RFC 1951, qcow2's "zlib") or as a zstd frame.  Deflate goes
 * through libdeflate where the build found it (about 2.5x zlib's speed,
 * smaller output) and zlib otherwise; zstd needs libzstd.  Each thread
 * keeps its own contexts, freed when it exits. */
#ifndef IC_COMPRESSION_H
#define IC_COMPRESSION_H

#include <stddef.h>

enum ic_compression_type {
    IC_COMPRESSION_DEFLATE = 0, /* qcow2 compression_type 0, "zlib" */
    IC_COMPRESSION_ZSTD = 1,    /* qcow2 compression_type 1 */
};

/* Levels: 0 is the type's default; deflate takes 1 to 12 (libdeflate's
 * scale, which agrees with zlib's from 1 to 9: zlib, when it does the
 * work, caps at 9), zstd 1 to 19. */
#define IC_COMPRESSION_DEFAULT_LEVEL 0

/* Whether this build can compress and decompress `type`. */
int ic_compression_available(enum ic_compression_type type);
/* The library that does `type` and its version ("libdeflate 1.14",
 * "zlib 1.2.13", "libzstd 1.5.4"), or NULL where the build has none. */
const char *ic_compression_library(enum ic_compression_type type);
/* The version of a library this build compresses with: "zlib" (always
 * linked), "libdeflate", "zstd" (libzstd's, at run time); NULL where the
 * build has none. */
const char *ic_compression_lib_version(const char *lib);
/* The highest level `type` takes (0: unavailable). */
int ic_compression_max_level(enum ic_compression_type type);
/* The level 0 stands for: the fastest that still compresses no worse
 * than qemu-img convert -c (zlib level 6, 4 KiB window; zstd level 3). */
int ic_compression_default_level(enum ic_compression_type type);

/* `len` bytes of `in` compressed into at most `cap` bytes of `out`: 0 and
 * the size in *out_len; 1 when they do not fit in `cap`; -1 with errno
 * (ENOMEM, ENOTSUP for a type the build lacks, EINVAL for a level out of
 * range). */
int ic_compress(enum ic_compression_type type, int level, const void *in, size_t len,
                void *out, size_t cap, size_t *out_len);

/* Exactly `out_len` bytes decompressed from the start of `in`, which may
 * hold more bytes than the compressed data (a qcow2 cluster's length is
 * known to the sector): 0, or -1 with errno EIO when `in` does not yield
 * `out_len` bytes as qemu reads them (a deflate stream may go on past
 * them; a zstd frame must end there), ENOMEM, or ENOTSUP. */
int ic_decompress(enum ic_compression_type type, const void *in, size_t len, void *out,
                  size_t out_len);

/* A zlib stream (RFC 1950: header, deflate data, Adler-32; a vmdk grain)
 * from the start of `in`, which may hold bytes past its end, into at most
 * `cap` bytes of `out`: 0 and the bytes made in *made when the stream ends,
 * checksum right, within `cap` bytes; -1 with errno EIO when it does not,
 * or ENOMEM.  libdeflate where the build has it, zlib deciding wherever
 * libdeflate refuses. */
int ic_zlib_inflate(const void *in, size_t len, void *out, size_t cap, size_t *made);

#endif
