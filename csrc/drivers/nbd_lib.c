/* Loading libnbd at run time. */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "../error.h"
#include "nbd_lib.h"

#define LIBNBD_SONAME "libnbd.so.0"

static struct nbd_lib lib;
static const char *(*get_version)(struct nbd_handle *h); /* 1.4 and later */
static const char *missing; /* what failed to load, or NULL */
static char missing_detail[256];
static pthread_once_t loaded = PTHREAD_ONCE_INIT;

/* IMGCOPY_LIBNBD names another build of libnbd (or none, to see what a
 * machine without it does) */
static void load(void)
{
    const char *name = getenv("IMGCOPY_LIBNBD");
    if (!name || !name[0])
        name = LIBNBD_SONAME;
    void *so = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!so) {
        const char *why = dlerror();
        snprintf(missing_detail, sizeof missing_detail, "%s", why ? why : name);
        missing = name;
        return;
    }
    /* name -> slot of `lib`, every one in libnbd 1.14 */
    const struct {
        const char *name;
        void **slot;
    } symbols[] = {
#define SYMBOL(name) {"nbd_" #name, (void **)&lib.name}
        SYMBOL(create), SYMBOL(close), SYMBOL(get_error), SYMBOL(get_errno),
        SYMBOL(supports_uri), SYMBOL(set_uri_allow_local_file), SYMBOL(add_meta_context), SYMBOL(connect_uri), SYMBOL(shutdown),
        SYMBOL(get_size), SYMBOL(is_read_only), SYMBOL(can_flush), SYMBOL(can_zero),
        SYMBOL(can_fast_zero), SYMBOL(can_multi_conn), SYMBOL(can_meta_context),
        SYMBOL(get_block_size), SYMBOL(aio_pread), SYMBOL(aio_pwrite), SYMBOL(aio_zero),
        SYMBOL(aio_flush), SYMBOL(aio_block_status), SYMBOL(aio_get_fd),
        SYMBOL(aio_get_direction), SYMBOL(aio_notify_read), SYMBOL(aio_notify_write),
        SYMBOL(aio_in_flight), SYMBOL(aio_is_dead), SYMBOL(aio_is_closed),
#undef SYMBOL
    };
    for (size_t i = 0; i < sizeof symbols / sizeof symbols[0]; i++) {
        /* POSIX: a function pointer travels through void * */
        *symbols[i].slot = dlsym(so, symbols[i].name);
        if (!*symbols[i].slot) {
            snprintf(missing_detail, sizeof missing_detail, "%s lacks %s (libnbd 1.14 or later "
                     "is needed)", LIBNBD_SONAME, symbols[i].name);
            missing = symbols[i].name;
            return;
        }
    }
    *(void **)&get_version = dlsym(so, "nbd_get_version");
}

const struct nbd_lib *ic_nbd_lib(const char *uri, struct ic_error *err)
{
    pthread_once(&loaded, load);
    if (!missing)
        return &lib;
    ic_error_os(err, ENOSYS, uri,
                "NBD needs libnbd: install libnbd0 (Debian, Ubuntu) or libnbd (Fedora): %s",
                missing_detail);
    return NULL;
}

static char version[64];
static pthread_once_t versioned = PTHREAD_ONCE_INIT;

/* libnbd tells its version through a handle: a fresh one, never connected */
static void find_version(void)
{
    struct nbd_handle *h = lib.create();
    const char *v = h && get_version ? get_version(h) : NULL;
    snprintf(version, sizeof version, "%s", v ? v : "(version unknown)");
    if (h)
        lib.close(h);
}

const char *ic_nbd_lib_version(void)
{
    pthread_once(&loaded, load);
    if (missing)
        return NULL;
    pthread_once(&versioned, find_version);
    return version;
}
