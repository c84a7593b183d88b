/* Several reads of one descriptor in flight at once through io_uring,
 * spoken with raw system calls (no liburing), for the file protocol's
 * O_DIRECT runs, which no page-cache hint can start early.  Where the
 * kernel has no io_uring (too old, disabled by sysctl, refused by a
 * seccomp filter) it says so once and the caller reads as it did before. */
#ifndef IMGCOPY_URING_H
#define IMGCOPY_URING_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "../driver.h"

/* One vectored read: `len` bytes of the file at `off` into the buffers of
 * `iov` (`iovcnt` of them, `len` bytes in all); `done` counts what was
 * read. */
struct ic_uring_read {
    const struct iovec *iov;
    int iovcnt;
    uint64_t off;
    size_t len, done;
};

/* Start every read of `reads` at once on `fd` and wait for all, adding to
 * each one's `done` what it read.  Returns 0 when every read ended (one
 * may be short: at the end of the file, or after an error, which the
 * caller's read of the rest meets again and reports), or -1 when io_uring
 * is not available here (nothing was read).  Nothing is in flight into
 * the buffers once it returns. */
int ic_uring_readv(int fd, struct ic_uring_read *reads, size_t n);

/* Whether io_uring works here (asks the kernel once). */
int ic_uring_available(void);

#endif
