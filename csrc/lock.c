/* qemu's image locks, so that imgcopy and qemu (qemu-img, qemu-io,
 * qemu-nbd, a running VM) respect each other (block/file-posix.c in qemu
 * describes the scheme; none of its code is here).
 *
 * Each permission bit i has two one-byte markers in the file: byte 100+i,
 * locked while the opener holds the permission, and byte 200+i, locked
 * while it refuses to share it.  Every marker is a shared (read) lock of
 * the open file description (OFD lock), so markers never block each
 * other; conflicts are found by asking whether a write lock could be
 * taken: on 200+i for each permission wanted (someone refuses to share
 * it), on 100+i for each permission not shared (someone holds it).  An
 * opener publishes its markers before it tests, so of two racing openers
 * at least one sees the other.  Closing the descriptor drops the locks.
 * Without OFD locks nothing is locked, as with qemu's default. */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "lock.h"

#define PERM_BASE 100
#define SHARED_BASE 200

static const char *const perm_names[IC_PERM_BITS] = {
    "consistent read", "write", "write unchanged", "resize",
};

/* 1: OFD locks work here; 0: they do not; -1: not asked yet */
static atomic_int ofd_works = -1;

static int lock_byte(int fd, int cmd, short type, off_t byte, struct flock *out)
{
    struct flock fl = {.l_type = type, .l_whence = SEEK_SET, .l_start = byte, .l_len = 1};
    int r;
    do
        r = fcntl(fd, cmd, &fl);
    while (r < 0 && errno == EINTR);
    if (out)
        *out = fl;
    return r;
}

static int ofd_supported(int fd)
{
    int known = atomic_load(&ofd_works);
    if (known >= 0)
        return known;
    struct flock fl;
    int works = lock_byte(fd, F_OFD_GETLK, F_WRLCK, PERM_BASE, &fl) == 0 || errno != EINVAL;
    atomic_store(&ofd_works, works);
    return works;
}

int ic_lock_image_fd(int fd, unsigned perm, unsigned shared, const char *path,
                     struct ic_error *err)
{
    if (!ofd_supported(fd))
        return 0;
    /* publish: the permissions held, the ones not shared */
    for (unsigned i = 0; i < IC_PERM_BITS; i++) {
        unsigned bit = 1u << i;
        off_t bytes[2] = {(perm & bit) ? (off_t)(PERM_BASE + i) : -1,
                          (shared & bit) ? -1 : (off_t)(SHARED_BASE + i)};
        for (int k = 0; k < 2; k++) {
            if (bytes[k] < 0 || lock_byte(fd, F_OFD_SETLK, F_RDLCK, bytes[k], NULL) == 0)
                continue;
            if (errno == EAGAIN || errno == EACCES)
                return ic_error_os(err, EAGAIN, path, "failed to lock byte %lld: the image "
                                   "is locked by another process", (long long)bytes[k]);
            return ic_error_os(err, errno, path, "lock byte %lld", (long long)bytes[k]);
        }
    }
    /* then look at everyone else's */
    for (int pass = 0; pass < 2; pass++) {
        for (unsigned i = 0; i < IC_PERM_BITS; i++) {
            unsigned bit = 1u << i;
            int wanted = pass == 0 ? (perm & bit) != 0 : !(shared & bit);
            if (!wanted)
                continue;
            off_t byte = (off_t)(pass == 0 ? SHARED_BASE + i : PERM_BASE + i);
            struct flock fl;
            if (lock_byte(fd, F_OFD_GETLK, F_WRLCK, byte, &fl) < 0)
                return ic_error_os(err, errno, path, "test lock byte %lld", (long long)byte);
            if (fl.l_type != F_UNLCK) {
                ic_error_os(err, EAGAIN, path, "Failed to get %s\"%s\" lock: the image is "
                            "locked by another process (a VM, qemu-img, qemu-nbd or imgcopy "
                            "using it)", pass == 0 ? "" : "shared ", perm_names[i]);
                return ic_error_remedy(err, (perm & ~IC_PERM_CONSISTENT_READ) == 0
                                                ? IC_REMEDY_FORCE_SHARE
                                                : IC_REMEDY_NONE);
            }
        }
    }
    return 0;
}
