/* Loading libnbd at run time. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "../error.h"
#include "../runtime_lib.h"
#include "nbd_lib.h"

#define LIBNBD_SONAME "libnbd.so.0"

static struct nbd_lib lib;
static const char *(*get_version)(struct nbd_handle *h); /* 1.4 and later */
static pthread_once_t loaded = PTHREAD_ONCE_INIT;

static const char *const libnbd_sonames[] = {LIBNBD_SONAME, NULL};
static struct ic_runtime_lib libnbd = {
    .env = "IMGCOPY_LIBNBD", /* another build (or none: a machine without it) */
    .sonames = libnbd_sonames,
    .needs = "libnbd 1.14 or later",
};

static void load(void)
{
    /* name -> slot of `lib`, every one in libnbd 1.14 */
    const struct ic_runtime_symbol symbols[] = {
#define SYMBOL(name) {"nbd_" #name, NULL, (void **)&lib.name, 1}
        SYMBOL(create), SYMBOL(close), SYMBOL(get_error), SYMBOL(get_errno),
        SYMBOL(supports_uri), SYMBOL(set_uri_allow_local_file), SYMBOL(add_meta_context),
        SYMBOL(connect_uri), SYMBOL(shutdown), SYMBOL(get_size), SYMBOL(is_read_only),
        SYMBOL(can_flush), SYMBOL(can_zero), SYMBOL(can_fast_zero), SYMBOL(can_multi_conn),
        SYMBOL(can_meta_context), SYMBOL(get_block_size), SYMBOL(aio_pread),
        SYMBOL(aio_pwrite), SYMBOL(aio_zero), SYMBOL(aio_flush), SYMBOL(aio_block_status),
        SYMBOL(aio_get_fd), SYMBOL(aio_get_direction), SYMBOL(aio_notify_read),
        SYMBOL(aio_notify_write), SYMBOL(aio_in_flight), SYMBOL(aio_is_dead),
        SYMBOL(aio_is_closed), SYMBOL(aio_disconnect),
#undef SYMBOL
        {"nbd_get_version", NULL, (void **)&get_version, 0}, /* 1.4 and later */
        {"nbd_set_opt_mode", NULL, (void **)&lib.set_opt_mode, 0},
        {"nbd_opt_list_meta_context", NULL, (void **)&lib.opt_list_meta_context, 0},
        {"nbd_opt_abort", NULL, (void **)&lib.opt_abort, 0},
        {"nbd_set_pread_initialize", NULL, (void **)&lib.set_pread_initialize, 0},
    };
    ic_runtime_lib_load(&libnbd, symbols, sizeof symbols / sizeof symbols[0], NULL);
}

const struct nbd_lib *ic_nbd_lib(const char *uri, struct ic_error *err)
{
    pthread_once(&loaded, load);
    if (!libnbd.missing)
        return &lib;
    ic_error_os(err, ENOSYS, uri,
                "NBD needs libnbd: install libnbd0 (Debian, Ubuntu) or libnbd (Fedora): %s",
                libnbd.detail);
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
    if (libnbd.missing)
        return NULL;
    pthread_once(&versioned, find_version);
    return version;
}

int ic_nbd_prepare_handle(const struct nbd_lib *calls, struct nbd_handle *h)
{
    /* the URI is the caller's own: its files (tls-psk-file, tls-certificates)
     * may be read, as qemu-img and nbdcopy read them */
    if (calls->set_uri_allow_local_file(h, 1) < 0)
        return -1;
    /* a read's buffer is used only once the read succeeded, and libnbd
     * fails a read whose reply does not cover it: zeroing it first would
     * cost a pass over every byte read */
    if (calls->set_pread_initialize && calls->set_pread_initialize(h, 0) < 0)
        return -1;
    return 0;
}
