/* libnbd, loaded at run time (dlopen of libnbd.so.0): building imgcopy
 * needs no libnbd, and without it only NBD URIs fail, with an error that
 * names the package to install.  The declarations are libnbd's stable ABI
 * (libnbd.h, 1.14 and later); calls newer than 1.14 are looked up too and
 * are NULL when the library lacks them. */
#ifndef IMGCOPY_NBD_LIB_H
#define IMGCOPY_NBD_LIB_H

#include <stddef.h>
#include <stdint.h>

#include "../imgcopy.h"

struct nbd_handle;

typedef struct {
    int (*callback)(void *user_data, int *error);
    void *user_data;
    void (*free)(void *user_data);
} nbd_completion_callback;

typedef struct {
    int (*callback)(void *user_data, const char *name);
    void *user_data;
    void (*free)(void *user_data);
} nbd_context_callback;

typedef struct {
    int (*callback)(void *user_data, const char *metacontext, uint64_t offset,
                    uint32_t *entries, size_t nr_entries, int *error);
    void *user_data;
    void (*free)(void *user_data);
} nbd_extent_callback;

enum {
    NBD_FLAG_FUA = 0x01,       /* LIBNBD_CMD_FLAG_FUA */
    NBD_FLAG_NO_HOLE = 0x02,   /* LIBNBD_CMD_FLAG_NO_HOLE */
    NBD_FLAG_REQ_ONE = 0x08,   /* LIBNBD_CMD_FLAG_REQ_ONE */
    NBD_FLAG_FAST_ZERO = 0x10, /* LIBNBD_CMD_FLAG_FAST_ZERO */
    NBD_STATE_HOLE = 1,        /* LIBNBD_STATE_HOLE */
    NBD_STATE_ZERO = 2,        /* LIBNBD_STATE_ZERO */
    NBD_DIRECTION_READ = 1,    /* LIBNBD_AIO_DIRECTION_READ */
    NBD_DIRECTION_WRITE = 2,   /* LIBNBD_AIO_DIRECTION_WRITE */
    NBD_SIZE_MINIMUM = 0,      /* LIBNBD_SIZE_MINIMUM */
    NBD_SIZE_PREFERRED = 1,
    NBD_SIZE_MAXIMUM = 2,
};

struct nbd_lib {
    struct nbd_handle *(*create)(void);
    void (*close)(struct nbd_handle *h);
    const char *(*get_error)(void);
    int (*get_errno)(void);
    int (*supports_uri)(struct nbd_handle *h);
    int (*set_uri_allow_local_file)(struct nbd_handle *h, _Bool allow);
    int (*add_meta_context)(struct nbd_handle *h, const char *name);
    int (*connect_uri)(struct nbd_handle *h, const char *uri);
    int (*shutdown)(struct nbd_handle *h, uint32_t flags);
    int64_t (*get_size)(struct nbd_handle *h);
    int (*is_read_only)(struct nbd_handle *h);
    int (*can_flush)(struct nbd_handle *h);
    int (*can_zero)(struct nbd_handle *h);
    int (*can_fast_zero)(struct nbd_handle *h);
    int (*can_multi_conn)(struct nbd_handle *h);
    int (*can_meta_context)(struct nbd_handle *h, const char *name);
    int64_t (*get_block_size)(struct nbd_handle *h, int size_type);
    int64_t (*aio_pread)(struct nbd_handle *h, void *buf, size_t count, uint64_t offset,
                         nbd_completion_callback cb, uint32_t flags);
    int64_t (*aio_pwrite)(struct nbd_handle *h, const void *buf, size_t count, uint64_t offset,
                          nbd_completion_callback cb, uint32_t flags);
    int64_t (*aio_zero)(struct nbd_handle *h, uint64_t count, uint64_t offset,
                        nbd_completion_callback cb, uint32_t flags);
    int64_t (*aio_flush)(struct nbd_handle *h, nbd_completion_callback cb, uint32_t flags);
    int64_t (*aio_block_status)(struct nbd_handle *h, uint64_t count, uint64_t offset,
                                nbd_extent_callback extent, nbd_completion_callback cb,
                                uint32_t flags);
    int (*aio_get_fd)(struct nbd_handle *h);
    unsigned (*aio_get_direction)(struct nbd_handle *h);
    int (*aio_notify_read)(struct nbd_handle *h);
    int (*aio_notify_write)(struct nbd_handle *h);
    int64_t (*aio_in_flight)(struct nbd_handle *h);
    int (*aio_is_dead)(struct nbd_handle *h);
    int (*aio_is_closed)(struct nbd_handle *h);
    int (*aio_disconnect)(struct nbd_handle *h, uint32_t flags);
    /* option negotiation (libnbd 1.6): listing an export's meta contexts;
     * NULL where the library lacks them */
    int (*set_opt_mode)(struct nbd_handle *h, _Bool enable);
    int (*opt_list_meta_context)(struct nbd_handle *h, nbd_context_callback context);
    int (*opt_abort)(struct nbd_handle *h);
    /* libnbd 1.12: reads into buffers it does not zero first; NULL where
     * the library lacks it */
    int (*set_pread_initialize)(struct nbd_handle *h, _Bool request);
};

/* libnbd's functions, loaded on first use; NULL with `err` set (naming the
 * package to install) when the library or one of its 1.14 calls is
 * missing.  `uri` names what needed it. */
const struct nbd_lib *ic_nbd_lib(const char *uri, struct ic_error *err);
/* A new handle's settings, for a first connection and a remade one: 0,
 * or -1 (libnbd's error set) */
int ic_nbd_prepare_handle(const struct nbd_lib *calls, struct nbd_handle *h);
/* The version of the libnbd loaded ("1.14.2"), loading it; NULL when it
 * is missing or too old for ic_nbd_lib(). */
const char *ic_nbd_lib_version(void);

#endif
