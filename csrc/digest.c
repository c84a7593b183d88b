/* Digests through libcrypto, loaded at run time (digest.h says why). */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "digest.h"
#include "runtime_lib.h"

#define LIBCRYPTO_SONAME "libcrypto.so.3"
#define LIBCRYPTO_FALLBACK "libcrypto.so"
#define XOF_FLAG 0x0002ul /* EVP_MD_FLAG_XOF: shake, which has no fixed size */

/* libcrypto's ABI (openssl/evp.h): opaque handles, stable since 1.1 */
typedef struct evp_md EVP_MD;
typedef struct evp_md_ctx EVP_MD_CTX;

static struct {
    /* 3.0: explicit fetch, so that an init does not look the name up */
    EVP_MD *(*md_fetch)(void *libctx, const char *name, const char *props);
    int (*md_is_a)(const EVP_MD *md, const char *name);
    /* 1.1 and later */
    const EVP_MD *(*get_digestbyname)(const char *name);
    int (*md_size)(const EVP_MD *md);
    unsigned long (*md_flags)(const EVP_MD *md);
    EVP_MD_CTX *(*ctx_new)(void);
    void (*ctx_free)(EVP_MD_CTX *ctx);
    int (*init_ex)(EVP_MD_CTX *ctx, const EVP_MD *type, void *engine);
    int (*update)(EVP_MD_CTX *ctx, const void *d, size_t cnt);
    int (*final_ex)(EVP_MD_CTX *ctx, unsigned char *md, unsigned int *s);
    const char *(*version)(int type); /* OpenSSL_version, 1.1 and later */
} lib;

struct ic_digest {
    const char *name;    /* hashlib's */
    const char *openssl; /* OpenSSL 3's */
    const char *legacy;  /* OpenSSL 1.1's, for get_digestbyname */
    const EVP_MD *md;    /* NULL: this libcrypto lacks it */
    size_t size;
};

/* hashlib's fixed-size algorithms (shake is variable-size: not a block
 * digest); the fetched EVP_MDs live as long as the process */
static struct ic_digest algorithms[] = {
    {"md5", "MD5", "MD5", NULL, 0},
    {"sha1", "SHA1", "SHA1", NULL, 0},
    {"sha224", "SHA2-224", "SHA224", NULL, 0},
    {"sha256", "SHA2-256", "SHA256", NULL, 0},
    {"sha384", "SHA2-384", "SHA384", NULL, 0},
    {"sha512", "SHA2-512", "SHA512", NULL, 0},
    {"sha512_224", "SHA2-512/224", "SHA512-224", NULL, 0},
    {"sha512_256", "SHA2-512/256", "SHA512-256", NULL, 0},
    {"sha3_224", "SHA3-224", "SHA3-224", NULL, 0},
    {"sha3_256", "SHA3-256", "SHA3-256", NULL, 0},
    {"sha3_384", "SHA3-384", "SHA3-384", NULL, 0},
    {"sha3_512", "SHA3-512", "SHA3-512", NULL, 0},
    {"blake2b", "BLAKE2B-512", "BLAKE2b512", NULL, 0},
    {"blake2s", "BLAKE2S-256", "BLAKE2s256", NULL, 0},
    {"sm3", "SM3", "SM3", NULL, 0},
};
#define NALGS (sizeof algorithms / sizeof algorithms[0])

static pthread_once_t loaded = PTHREAD_ONCE_INIT;

static void resolve(struct ic_digest *a)
{
    const EVP_MD *md = lib.md_fetch ? lib.md_fetch(NULL, a->openssl, NULL) : NULL;
    if (!md)
        md = lib.get_digestbyname(a->legacy);
    if (!md)
        return;
    int size = lib.md_size(md);
    if (size <= 0 || size > IC_DIGEST_MAX || (lib.md_flags && (lib.md_flags(md) & XOF_FLAG)))
        return;
    a->md = md;
    a->size = (size_t)size;
}

static const char *const libcrypto_sonames[] = {LIBCRYPTO_SONAME, LIBCRYPTO_FALLBACK, NULL};
static struct ic_runtime_lib libcrypto = {
    .env = "IMGCOPY_LIBCRYPTO", /* another build (or none: a machine without it) */
    .sonames = libcrypto_sonames,
    .needs = "OpenSSL 1.1 or later",
};

static void load(void)
{
    /* alias: the 1.1 name */
    const struct ic_runtime_symbol symbols[] = {
        {"EVP_MD_fetch", NULL, (void **)&lib.md_fetch, 0},
        {"EVP_MD_is_a", NULL, (void **)&lib.md_is_a, 0},
        {"EVP_get_digestbyname", NULL, (void **)&lib.get_digestbyname, 1},
        {"EVP_MD_get_size", "EVP_MD_size", (void **)&lib.md_size, 1},
        {"EVP_MD_get_flags", "EVP_MD_flags", (void **)&lib.md_flags, 0},
        {"EVP_MD_CTX_new", NULL, (void **)&lib.ctx_new, 1},
        {"EVP_MD_CTX_free", NULL, (void **)&lib.ctx_free, 1},
        {"EVP_DigestInit_ex", NULL, (void **)&lib.init_ex, 1},
        {"EVP_DigestUpdate", NULL, (void **)&lib.update, 1},
        {"EVP_DigestFinal_ex", NULL, (void **)&lib.final_ex, 1},
        {"OpenSSL_version", NULL, (void **)&lib.version, 0},
    };
    if (ic_runtime_lib_load(&libcrypto, symbols, sizeof symbols / sizeof symbols[0], NULL) < 0)
        return;
    for (size_t i = 0; i < NALGS; i++)
        resolve(&algorithms[i]);
}

static int available(struct ic_error *err)
{
    pthread_once(&loaded, load);
    if (!libcrypto.missing)
        return 0;
    return ic_error_os(err, ENOSYS, NULL,
                       "checksums need OpenSSL's libcrypto: install libssl3 (Debian, Ubuntu) "
                       "or openssl-libs (Fedora): %s", libcrypto.detail);
}

const char *ic_digest_lib_version(void)
{
    if (available(NULL) < 0)
        return NULL;
    /* 0: OPENSSL_VERSION, "OpenSSL 3.0.11 19 Sep 2023" */
    const char *v = lib.version ? lib.version(0) : NULL;
    return v ? v : "(version unknown)";
}

int ic_digest_names(const char **names, size_t cap, struct ic_error *err)
{
    if (available(err) < 0)
        return -1;
    int n = 0;
    for (size_t i = 0; i < NALGS; i++) {
        if (!algorithms[i].md)
            continue;
        if ((size_t)n < cap)
            names[n] = algorithms[i].name;
        n++;
    }
    return n;
}

static int is_name_of(const struct ic_digest *a, const char *name)
{
    if (!strcasecmp(name, a->name) || !strcasecmp(name, a->openssl) ||
        !strcasecmp(name, a->legacy))
        return 1;
    return lib.md_is_a && lib.md_is_a(a->md, name) == 1;
}

const struct ic_digest *ic_digest_lookup(const char *name, struct ic_error *err)
{
    if (available(err) < 0)
        return NULL;
    for (size_t i = 0; i < NALGS; i++)
        if (algorithms[i].md && is_name_of(&algorithms[i], name))
            return &algorithms[i];
    char list[256] = "";
    size_t used = 0;
    for (size_t i = 0; i < NALGS; i++) {
        if (!algorithms[i].md)
            continue;
        int n = snprintf(list + used, sizeof list - used, "%s%s", used ? ", " : "",
                         algorithms[i].name);
        if (n < 0 || (size_t)n >= sizeof list - used)
            break;
        used += (size_t)n;
    }
    ic_error_value(err, "unknown checksum algorithm '%s' (supported: %s)", name, list);
    return NULL;
}

const char *ic_digest_name(const struct ic_digest *d)
{
    return d->name;
}

size_t ic_digest_size(const struct ic_digest *d)
{
    return d->size;
}

struct ic_digest_ctx {
    const struct ic_digest *d;
    EVP_MD_CTX *ctx;
};

static int crypto_failed(struct ic_error *err, const char *what)
{
    return ic_error_os(err, EIO, NULL, "libcrypto: %s failed", what);
}

struct ic_digest_ctx *ic_digest_ctx_new(const struct ic_digest *d, struct ic_error *err)
{
    struct ic_digest_ctx *c = malloc(sizeof *c);
    if (!c) {
        ic_error_nomem(err);
        return NULL;
    }
    c->d = d;
    c->ctx = lib.ctx_new();
    if (!c->ctx) {
        free(c);
        ic_error_nomem(err);
        return NULL;
    }
    return c;
}

void ic_digest_ctx_free(struct ic_digest_ctx *ctx)
{
    if (!ctx)
        return;
    lib.ctx_free(ctx->ctx);
    free(ctx);
}

int ic_digest_begin(struct ic_digest_ctx *ctx, struct ic_error *err)
{
    return lib.init_ex(ctx->ctx, ctx->d->md, NULL) == 1 ? 0
                                                         : crypto_failed(err, "EVP_DigestInit_ex");
}

int ic_digest_add(struct ic_digest_ctx *ctx, const void *buf, size_t len, struct ic_error *err)
{
    return lib.update(ctx->ctx, buf, len) == 1 ? 0 : crypto_failed(err, "EVP_DigestUpdate");
}

int ic_digest_end(struct ic_digest_ctx *ctx, uint8_t *out, struct ic_error *err)
{
    unsigned int n = 0;
    if (lib.final_ex(ctx->ctx, out, &n) != 1 || n != ctx->d->size)
        return crypto_failed(err, "EVP_DigestFinal_ex");
    return 0;
}

int ic_digest_once(struct ic_digest_ctx *ctx, const void *buf, size_t len, uint8_t *out,
                   struct ic_error *err)
{
    if (ic_digest_begin(ctx, err) < 0 || ic_digest_add(ctx, buf, len, err) < 0)
        return -1;
    return ic_digest_end(ctx, out, err);
}

void ic_digest_hex(const uint8_t *digest, size_t len, char *hex)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < len; i++) {
        hex[2 * i] = digits[digest[i] >> 4];
        hex[2 * i + 1] = digits[digest[i] & 15];
    }
    hex[2 * len] = '\0';
}
