/* The file protocol's state, shared by file.c (I/O, block status, locks),
 * file_create.c (new destinations) and file_beneath.c (files an image
 * names, confined to its directory). */
#ifndef IMGCOPY_FILE_H
#define IMGCOPY_FILE_H

#include <stdatomic.h>
#include <stdint.h>
#include <sys/stat.h>

#include "../image.h"

/* Zero methods, learnt at run time; a set bit means the kernel refused. */
enum {
    NO_PUNCH_HOLE = 1u << 0,
    NO_ZERO_RANGE = 1u << 1,
    NO_BLKZEROOUT = 1u << 2,
    NO_ALLOCATE = 1u << 3, /* fallocate mode 0 */
};

struct raw_state {
    int fd;
    int fd_direct;       /* O_DIRECT twin of fd, or -1 */
    int writeback;       /* start writeback behind each write */
    int is_blockdev;
    uint64_t alloc_unit; /* st_blksize: the granularity of SEEK_DATA answers */
    atomic_int no_seek_hole;
    atomic_int no_nowait; /* preadv2 refused RWF_NOWAIT here */
    atomic_uint zero_refused;
    int keep_cache; /* a copy's source found in the page cache: its pages stay */
    /* IC_CREATE_ATOMIC: written under tmp_path until finish() renames it
     * over rename_to (`path`, through symlinks); the file it replaces stays
     * locked as written meanwhile (guard_fd) */
    char *tmp_path;
    char *rename_to;
    int guard_fd;
};

/* Make `fd` the image's (it becomes the driver's on success). */
int ic_file_adopt(struct ic_image *img, int fd, struct ic_error *err);
/* Keep regular files and block devices (blocking again); close anything
 * else with an error. */
int ic_file_disk_or_file(int fd, const struct stat *st, const char *path, struct ic_error *err);
/* file_beneath.c.  Open `name` (relative) beneath the directory `dirfd`: every step of the
 * way, symbolic links included, stays inside it (openat2 RESOLVE_BENEATH;
 * without openat2, or with use_openat2 0, a walk that follows no link and
 * never goes up).  The descriptor, or -errno: -EXDEV for a way out,
 * -ELOOP for a link the walk will not follow. */
int ic_open_beneath(int dirfd, const char *name, int flags, int use_openat2);
/* Make `img` (ic_protocol_file's, not opened) the file `name` beneath the
 * directory `dir`, a regular file read as open_protocol would: a way out
 * of the directory, or a device node, is a format error of `owner`, the
 * image naming the file, `what` the file ("extent file"). */
int ic_file_open_beneath(struct ic_image *img, const char *owner, const char *what,
                         const char *dir, const char *name, struct ic_error *err);
/* file_create.c */
int ic_file_create(struct ic_image *img, const char *path, int *fresh, struct ic_error *err);
int ic_file_finish(struct ic_image *img, int sync, struct ic_error *err);

#endif
