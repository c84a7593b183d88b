/* qemu-compatible image locks (lock.c). */
#ifndef IMGCOPY_LOCK_H
#define IMGCOPY_LOCK_H

#include "error.h"

/* qemu's permission bits (BLK_PERM_*), in the same order */
enum {
    IC_PERM_CONSISTENT_READ = 1u << 0,
    IC_PERM_WRITE = 1u << 1,
    IC_PERM_WRITE_UNCHANGED = 1u << 2,
    IC_PERM_RESIZE = 1u << 3,
    IC_PERM_ALL = 0xfu,
};
#define IC_PERM_BITS 4

/* Mark `fd`'s file as used with permissions `perm`, sharing `shared` with
 * others, and check nobody else conflicts: -1 with errnum EAGAIN and the
 * permission in the message when someone does.  The locks last as long
 * as the open file description. */
int ic_lock_image_fd(int fd, unsigned perm, unsigned shared, const char *path,
                     struct ic_error *err);

#endif
