/* Message digests from OpenSSL's libcrypto, loaded at run time (dlopen of
 * libcrypto.so.3): building imgcopy needs no OpenSSL headers, and without
 * the library only checksums fail, with an error naming the package.
 * libcrypto is what Python's hashlib uses, so it is there wherever hashlib
 * is, has every algorithm hashlib users know, and its SHA is the fastest
 * on x86 (SHA-NI, AVX2).  Everything here is thread-safe; a context is
 * used by one thread at a time. */
#ifndef IMGCOPY_DIGEST_H
#define IMGCOPY_DIGEST_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"

#define IC_DIGEST_MAX 64 /* bytes: sha512, blake2b */

struct ic_digest; /* an algorithm */
struct ic_digest_ctx;

/* The algorithm Python's hashlib calls `name` ("sha256", "blake2b", ...),
 * or one of OpenSSL's names for it ("SHA2-256", "BLAKE2b512").  NULL with
 * ENOSYS when libcrypto is missing, a ValueError listing the supported
 * names when the name is unknown. */
const struct ic_digest *ic_digest_lookup(const char *name, struct ic_error *err);
/* hashlib's name of the algorithm */
const char *ic_digest_name(const struct ic_digest *d);
size_t ic_digest_size(const struct ic_digest *d);
/* hashlib's names of the algorithms this libcrypto provides; returns how
 * many there are (up to `cap` are stored), -1 when libcrypto is missing. */
int ic_digest_names(const char **names, size_t cap, struct ic_error *err);

struct ic_digest_ctx *ic_digest_ctx_new(const struct ic_digest *d, struct ic_error *err);
void ic_digest_ctx_free(struct ic_digest_ctx *ctx);
/* Streaming: begin, add..., end (`out` holds ic_digest_size bytes). */
int ic_digest_begin(struct ic_digest_ctx *ctx, struct ic_error *err);
int ic_digest_add(struct ic_digest_ctx *ctx, const void *buf, size_t len, struct ic_error *err);
int ic_digest_end(struct ic_digest_ctx *ctx, uint8_t *out, struct ic_error *err);
/* All three at once, reusing the context. */
int ic_digest_once(struct ic_digest_ctx *ctx, const void *buf, size_t len, uint8_t *out,
                   struct ic_error *err);

/* The version of the libcrypto loaded ("OpenSSL 3.0.11 19 Sep 2023"),
 * loading it; NULL when it is missing. */
const char *ic_digest_lib_version(void);

/* `len` bytes as lowercase hex into `hex` (2 * len + 1 bytes). */
void ic_digest_hex(const uint8_t *digest, size_t len, char *hex);

#endif
