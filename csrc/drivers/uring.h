/* Several reads of one descriptor in flight at once through io_uring,
 * spoken with raw system calls (no liburing), for the file protocol's
 * O_DIRECT runs, which no page-cache hint can start early.  Where the
 * kernel has no io_uring (too old, disabled by sysctl, refused by a
 * seccomp filter) it says so once and the caller reads as it did before. */
#ifndef IMGCOPY_URING_H
#define IMGCOPY_URING_H

#include <stddef.h>

#include "../driver.h"

/* Read runs[i] from `fd` at runs[i].off + done[i] for the rest of its
 * length, all at once, adding what each read to done[i].  Returns 0 when
 * every read ended (a run may be short: at the end of the file, or after
 * an error, which the caller's read of the rest meets again), or -1 when
 * io_uring is not available here (nothing was read).  Nothing is in
 * flight into the buffers once it returns. */
int ic_uring_read_runs(int fd, const struct ic_read_run *runs, size_t n, size_t *done);

/* Whether io_uring works here (asks the kernel once). */
int ic_uring_available(void);

#endif
