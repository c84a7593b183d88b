/* The image layer: opening and probing, bounds checks, and the queries
 * built on the extent cache. */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "image.h"
#include "lock.h"
#include "probe.h"

static const struct ic_driver *const drivers[] = {
    &ic_driver_raw,
    &ic_driver_qcow2,
    &ic_driver_null,
};

/* The null image has no file: "null:" names it. */
#define NULL_PATH "null:"

static const struct ic_driver *driver_by_name(const char *name)
{
    for (size_t i = 0; i < sizeof drivers / sizeof drivers[0]; i++)
        if (strcmp(drivers[i]->name, name) == 0)
            return drivers[i];
    return NULL;
}

int ic_format_readable(const char *format)
{
    return driver_by_name(format) != NULL && strcmp(format, "null") != 0;
}

static int read_fully(int fd, uint8_t *buf, size_t len, uint64_t off, size_t *got)
{
    *got = 0;
    while (*got < len) {
        ssize_t n = pread(fd, buf + *got, len - *got, (off_t)(off + *got));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -1;
        if (n == 0)
            break;
        *got += (size_t)n;
    }
    return 0;
}

/* Whether [off, end) of a file reads as zeros without holding data: a
 * hole, or an unwritten extent.  Such a range is never read: reading an
 * unwritten extent leaves zero pages in the page cache, which ext4's
 * SEEK_DATA then reports as data, and probing must not change the map. */
static int reads_as_hole(int fd, off_t off, off_t end)
{
    off_t data = lseek(fd, off, SEEK_DATA);
    if (data < 0)
        return errno == ENXIO; /* EINVAL: no SEEK_DATA here, read it */
    return data >= end;
}

/* The format name the file's first and last bytes look like. */
static int probe_fd(int fd, const char *path, const char **format, struct ic_error *err)
{
    uint8_t head[IC_PROBE_HEAD], tail[IC_PROBE_TAIL];
    size_t hlen = 0, tlen = 0;
    off_t end = lseek(fd, 0, SEEK_END);
    if (end < 0)
        return ic_error_os(err, errno, path, "seek to the end");
    size_t want = (uint64_t)end < sizeof head ? (size_t)end : sizeof head;
    if (reads_as_hole(fd, 0, (off_t)want)) {
        memset(head, 0, want);
        hlen = want;
    } else if (read_fully(fd, head, want, 0, &hlen) < 0) {
        return ic_error_os(err, errno, path, "read header");
    }
    if ((uint64_t)end >= sizeof tail && !reads_as_hole(fd, end - (off_t)sizeof tail, end) &&
        read_fully(fd, tail, sizeof tail, (uint64_t)end - sizeof tail, &tlen) < 0)
        return ic_error_os(err, errno, path, "read the last sector");
    *format = ic_probe_format(head, hlen, tail, tlen);
    return 0;
}

static int probe(int fd, const char *path, const struct ic_driver **out, struct ic_error *err)
{
    const char *name;
    if (probe_fd(fd, path, &name, err) < 0)
        return -1;
    if (!ic_format_readable(name)) {
        /* "qcow" is qcow2's magic with version 1: say so */
        ic_error_format(err, path, "this is a %s image%s, a format imgcopy cannot read yet", name,
                        strcmp(name, "qcow") == 0 ? " (version 1, the format before qcow2)" : "");
        return ic_error_remedy(err, IC_REMEDY_AS_RAW);
    }
    *out = driver_by_name(name);
    return 0;
}

/* Images are regular files or block devices; the descriptor, opened with
 * O_NONBLOCK so that a FIFO could not hang us, blocks again. */
static int disk_or_file(int fd, const struct stat *st, const char *path, struct ic_error *err)
{
    if (!S_ISREG(st->st_mode) && !S_ISBLK(st->st_mode)) {
        close(fd);
        return ic_error_value(err, "%s: not a regular file or block device", path);
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0) {
        int e = errno;
        close(fd);
        return ic_error_os(err, e, path, "fcntl");
    }
    return fd;
}

/* Open without blocking on a FIFO, then insist on a file or a disk. */
static int open_file(const char *path, unsigned flags, struct ic_error *err)
{
    int mode = (flags & IC_OPEN_RDWR) ? O_RDWR : O_RDONLY;
    int fd = open(path, mode | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0)
        return ic_error_os(err, errno, path, "open");
    struct stat st;
    if (fstat(fd, &st) < 0) {
        int e = errno;
        close(fd);
        return ic_error_os(err, e, path, "fstat");
    }
    if (S_ISDIR(st.st_mode)) {
        close(fd);
        return ic_error_os(err, EISDIR, path, "open");
    }
    return disk_or_file(fd, &st, path, err);
}

static int is_null(const char *path, const char *format)
{
    return (format && strcmp(format, "null") == 0) || strcmp(path, NULL_PATH) == 0;
}

static struct ic_image *new_image(const char *path, const struct ic_driver *drv, unsigned flags,
                                  uint64_t size)
{
    struct ic_image *img = calloc(1, sizeof *img);
    if (!img)
        return NULL;
    if (!(img->path = strdup(path)) || ic_cache_init(img) < 0) {
        free(img->path);
        free(img);
        return NULL;
    }
    img->drv = drv;
    img->open_flags = flags;
    img->size = size;
    img->meta_budget = IC_CHAIN_META_BUDGET;
    img->guard_fd = -1;
    return img;
}

/* ---- locks, as qemu takes them (lock.c) ------------------------------- */

enum {
    CR = IC_PERM_CONSISTENT_READ,
    W = IC_PERM_WRITE,
    WU = IC_PERM_WRITE_UNCHANGED,
    RS = IC_PERM_RESIZE,
};

/* What an image does to its chain: a writer writes and shares only reads
 * (as a VM's disk: qemu cannot write what imgcopy writes); a copy's
 * source reads and lets nobody write (qemu-img convert's source); a
 * reader reads and shares all (qemu-img map).  A backing file is read,
 * and written by others only if the image above lets them. */
static void node_role(unsigned flags, const struct ic_image *above, unsigned *perm,
                      unsigned *shared)
{
    if (above) {
        *perm = above->lock_perm & CR;
        *shared = CR | WU | ((above->lock_shared & W) ? W | RS : 0);
    } else if (flags & IC_OPEN_RDWR) {
        *perm = CR | W;
        *shared = CR | WU;
    } else {
        *perm = CR;
        *shared = (flags & IC_OPEN_SOURCE) ? CR | WU : IC_PERM_ALL;
    }
}

/* Lock the file of an image of format `drv` playing that role: a qcow2
 * file's metadata must not change under its reader, and its writer may
 * grow it; force_share shares everything (readers only). */
static int lock_file(int fd, const struct ic_driver *drv, unsigned flags, unsigned perm,
                     unsigned shared, const char *path, struct ic_error *err)
{
    if (drv == &ic_driver_qcow2) {
        perm |= CR | ((perm & W) ? RS : 0);
        shared &= ~(W | RS);
    }
    if (flags & IC_OPEN_FORCE_SHARE)
        shared = IC_PERM_ALL;
    return ic_lock_image_fd(fd, perm, shared, path, err);
}

static void free_image(struct ic_image *img)
{
    ic_cache_destroy(img);
    if (img->guard_fd >= 0)
        close(img->guard_fd);
    if (img->tmp_path) /* never finished: the copy is incomplete */
        unlink(img->tmp_path);
    free(img->tmp_path);
    free(img->rename_to);
    free(img->path);
    free(img);
}

/* Two names of one disk: the same inode, or device nodes of the same
 * block device. */
static int same_file(dev_t dev, ino_t ino, dev_t rdev, const struct stat *st)
{
    if (S_ISBLK(st->st_mode))
        return rdev && rdev == st->st_rdev;
    return dev == st->st_dev && ino == st->st_ino;
}

/* Open `path` as one link of a backing chain: `below` lists the files
 * already above it, so that a loop is an error, not a recursion. */
static int open_link(const char *path, const char *format, unsigned flags,
                     const struct ic_image *above, struct ic_image **out, struct ic_error *err)
{
    const struct ic_driver *drv = NULL;
    if (format && !(drv = driver_by_name(format)))
        return ic_error_value(err, "unknown image format '%s'", format);
    if (is_null(path, format))
        return ic_error_value(err, "the null image can only be a destination");

    int fd = open_file(path, flags, err);
    if (fd < 0)
        return -1;
    struct stat st;
    if (fstat(fd, &st) < 0) {
        int e = errno;
        close(fd);
        return ic_error_os(err, e, path, "fstat");
    }
    if (above) {
        if (above->chain_len >= IC_CHAIN_MAX) {
            close(fd);
            return ic_error_format(err, path, "backing chain deeper than %d images",
                                   IC_CHAIN_MAX);
        }
        for (unsigned k = 0; k < above->chain_len; k++) {
            if (same_file(above->chain[k].dev, above->chain[k].ino, above->chain[k].rdev, &st)) {
                close(fd);
                return ic_error_format(err, path, "backing chain loops back to %s",
                                       path);
            }
        }
    }
    if (!drv && probe(fd, path, &drv, err) < 0) {
        close(fd);
        return -1;
    }
    /* locked before the driver reads a byte of metadata: an image another
     * process writes reports that, not the state of its header */
    unsigned perm, shared;
    node_role(flags, above, &perm, &shared);
    if (lock_file(fd, drv, flags, perm, shared, path, err) < 0) {
        close(fd);
        return -1;
    }
    struct ic_image *img = new_image(path, drv, flags, 0);
    if (!img) {
        close(fd);
        return ic_error_nomem(err);
    }
    img->meta_budget = above ? above->meta_budget : IC_CHAIN_META_BUDGET;
    img->lock_perm = perm;
    img->lock_shared = shared;
    if (above) {
        memcpy(img->chain, above->chain, above->chain_len * sizeof *img->chain);
        img->chain_len = above->chain_len;
    }
    img->chain[img->chain_len].dev = st.st_dev;
    img->chain[img->chain_len].ino = st.st_ino;
    img->chain[img->chain_len].rdev = S_ISBLK(st.st_mode) ? st.st_rdev : 0;
    img->chain_len++;
    if (drv->open(img, fd, err) < 0) {
        free_image(img);
        return -1;
    }
    *out = img;
    return 0;
}

int ic_image_open(const char *path, const char *format, unsigned flags, struct ic_image **out,
                  struct ic_error *err)
{
    if ((flags & IC_OPEN_FORCE_SHARE) && (flags & IC_OPEN_RDWR))
        return ic_error_value(err, "force_share reads an image others may write: it cannot "
                              "open one for writing");
    return open_link(path, format, flags, NULL, out, err);
}

int ic_image_probe(const char *path, const char **format, struct ic_error *err)
{
    int fd = open_file(path, 0, err);
    if (fd < 0)
        return -1;
    int r = probe_fd(fd, path, format, err);
    close(fd);
    return r;
}

int ic_image_open_backing(const struct ic_image *overlay, const char *path, const char *format,
                          struct ic_image **out, struct ic_error *err)
{
    unsigned flags = overlay->open_flags & (IC_OPEN_DIRECT | IC_OPEN_FORCE | IC_OPEN_FORCE_SHARE);
    /* a backing file named "null:" is a file of that name */
    if (strcmp(path, NULL_PATH) == 0)
        return ic_error_format(err, overlay->path, "backing file '%s' is not an image", path);
    if (open_link(path, format, flags, overlay, out, err) == 0)
        return 0;
    /* the overlay names its backing format: no caller option changes it */
    if (err && err->remedy == IC_REMEDY_AS_RAW)
        err->remedy = IC_REMEDY_NONE;
    /* what the overlay names is part of the overlay's (possibly hostile)
     * content: an unusable backing file is a format error, I/O stays I/O */
    if (err && err->kind == IC_ERR_VALUE) {
        /* "PATH: reason" says PATH once, in our own words */
        const char *reason = err->msg;
        size_t n = strlen(path);
        if (strncmp(reason, path, n) == 0 && strncmp(reason + n, ": ", 2) == 0)
            reason += n + 2;
        ic_error_format(err, overlay->path, "unusable backing file %s: %s", path, reason);
    }
    return -1;
}

int ic_image_take_meta_budget(struct ic_image *img, uint64_t bytes)
{
    if (bytes > img->meta_budget)
        return -1;
    img->meta_budget -= bytes;
    return 0;
}

int ic_image_wrap_fd(const struct ic_image *owner, int fd, struct ic_image **out,
                     struct ic_error *err)
{
    struct ic_image *img = new_image(owner->path, &ic_driver_raw, owner->open_flags, 0);
    if (!img) {
        close(fd);
        return ic_error_nomem(err);
    }
    if (ic_driver_raw.open(img, fd, err) < 0) {
        free_image(img);
        return -1;
    }
    *out = img;
    return 0;
}

/* A temporary file beside `path` (same directory, so the final rename
 * stays in one file system and relative backing names resolve alike):
 * ".NAME.imgcopy-XXXXXX", created exclusively; *tmp gets its name. */
static int create_temporary(const char *path, mode_t mode, char **tmp, struct ic_error *err)
{
    const char *slash = strrchr(path, '/');
    int dirlen = slash ? (int)(slash - path + 1) : 0;
    const char *base = slash ? slash + 1 : path;
    size_t cap = strlen(path) + 32;
    char *name = malloc(cap);
    if (!name)
        return ic_error_nomem(err);
    static atomic_uint counter;
    for (int attempt = 0; attempt < 100; attempt++) {
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        unsigned long salt = ((unsigned long)now.tv_nsec ^ ((unsigned long)getpid() << 20) ^
                              atomic_fetch_add(&counter, 1) * 2654435761u) % 1000000ul;
        snprintf(name, cap, "%.*s.%s.imgcopy-%06lu", dirlen, path, base, salt);
        int fd = open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOCTTY, mode);
        if (fd >= 0) {
            *tmp = name;
            return fd;
        }
        if (errno != EEXIST) {
            int e = errno;
            free(name);
            return ic_error_os(err, e, path, "create a temporary file beside it");
        }
    }
    free(name);
    return ic_error_os(err, EEXIST, path, "create a temporary file beside it");
}

/* Open the destination of a new image.  A block device is used as it is
 * and never replaced by a file.  A regular file is written under a
 * temporary name when `atomic` (the old file, if any, stays whole until
 * the rename; its permissions carry over), else emptied in place (its old
 * blocks must not show through). */
/* The file a new image will replace stays locked as written from before
 * the copy to the rename, as qemu's image creation locks it: nobody may
 * be using it, and nobody can start while the copy runs. */
static int guard_replaced(const char *path, int *guard, struct ic_error *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0)
        return ic_error_os(err, errno, path, "open");
    if (ic_lock_image_fd(fd, W | RS, IC_PERM_ALL & ~(W | RS), path, err) < 0) {
        close(fd);
        return -1;
    }
    *guard = fd;
    return 0;
}

static int open_for_create(const char *path, int atomic, char **tmp, char **target,
                           int *guard, struct ic_error *err)
{
    *tmp = *target = NULL;
    *guard = -1;
    struct stat old;
    int exists = stat(path, &old) == 0;
    if (!exists && errno != ENOENT)
        return ic_error_os(err, errno, path, "create");
    if (exists && S_ISDIR(old.st_mode))
        return ic_error_os(err, EISDIR, path, "create");
    if (atomic && (!exists || S_ISREG(old.st_mode))) {
        /* through a symbolic link, the file it names is replaced */
        *target = exists ? realpath(path, NULL) : strdup(path);
        if (!*target)
            return exists ? ic_error_os(err, errno, path, "resolve") : ic_error_nomem(err);
        if (exists && guard_replaced(*target, guard, err) < 0) {
            free(*target);
            *target = NULL;
            return -1;
        }
        int fd = create_temporary(*target, exists ? old.st_mode & 07777 : 0644, tmp, err);
        int e = fd >= 0 && exists && fchmod(fd, old.st_mode & 07777) < 0 ? errno : 0;
        if (fd < 0 || e) {
            if (fd >= 0) {
                close(fd);
                unlink(*tmp);
            }
            if (*guard >= 0)
                close(*guard);
            free(*tmp);
            free(*target);
            *tmp = *target = NULL;
            *guard = -1;
            return e ? ic_error_os(err, e, path, "copy the permissions of the old file") : -1;
        }
        return fd;
    }
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOCTTY | O_NONBLOCK, 0644);
    if (fd < 0)
        return ic_error_os(err, errno, path, "create");
    struct stat st;
    int e = 0;
    if (fstat(fd, &st) < 0)
        e = errno;
    else if (S_ISREG(st.st_mode) && ftruncate(fd, 0) < 0)
        e = errno;
    if (e) {
        close(fd);
        return ic_error_os(err, e, path, "create");
    }
    return disk_or_file(fd, &st, path, err);
}

int ic_image_create(const char *path, const char *format, uint64_t size, unsigned flags,
                    const struct ic_create_options *opts, struct ic_image **out, int *fresh,
                    struct ic_error *err)
{
    const struct ic_driver *drv = is_null(path, format) ? &ic_driver_null
                                  : driver_by_name(format ? format : "raw");
    if (!drv)
        return ic_error_value(err, "unknown image format '%s'", format);
    if (!drv->create)
        return ic_error_value(err, "cannot write %s images", drv->name);
    /* refuse bad options before the destination is touched */
    if (opts) {
        uint64_t c = opts->cluster_size;
        if (c && (c < 512 || c > (2u << 20) || (c & (c - 1))))
            return ic_error_value(err, "cluster_size must be a power of two from 512 to 2 MiB");
        if (opts->compress && opts->prealloc_metadata)
            return ic_error_value(err, "compression and preallocation exclude each other");
    }
    char *tmp = NULL, *target = NULL;
    int fd = -1, guard = -1;
    if (drv != &ic_driver_null &&
        (fd = open_for_create(path, (flags & IC_CREATE_ATOMIC) != 0, &tmp, &target, &guard,
                              err)) < 0)
        return -1;
    unsigned perm = CR | W, shared = CR | WU; /* a writer */
    struct ic_image *img = NULL;
    if (fd >= 0 && lock_file(fd, drv, 0, perm, shared, path, err) < 0)
        goto fail;
    img = new_image(path, drv, (flags & ~IC_CREATE_ATOMIC) | IC_OPEN_RDWR, size);
    if (!img) {
        ic_error_nomem(err);
        goto fail;
    }
    img->tmp_path = tmp;
    img->rename_to = target;
    img->guard_fd = guard;
    img->lock_perm = perm;
    img->lock_shared = shared;
    static const struct ic_create_options defaults = {0};
    img->create_opts = opts ? opts : &defaults;
    int r = drv->create(img, fd, fresh, err);
    img->create_opts = NULL;
    if (r < 0) {
        free_image(img);
        return -1;
    }
    *out = img;
    return 0;
fail:
    if (fd >= 0)
        close(fd);
    if (tmp)
        unlink(tmp);
    if (guard >= 0)
        close(guard);
    free(tmp);
    free(target);
    return -1;
}

/* The finished image takes the place of `path`. */
static int rename_into_place(struct ic_image *img, int sync, struct ic_error *err)
{
    const char *target = img->rename_to;
    /* the file guarded since the start is the one replaced */
    struct stat was, now;
    if (img->guard_fd >= 0 &&
        (fstat(img->guard_fd, &was) < 0 || stat(target, &now) < 0 || was.st_dev != now.st_dev ||
         was.st_ino != now.st_ino))
        return ic_error_os(err, EBUSY, img->path, "the destination was replaced by another "
                           "file during the copy");
    if (rename(img->tmp_path, target) < 0)
        return ic_error_os(err, errno, img->path, "rename %s over it", img->tmp_path);
    if (img->guard_fd >= 0) {
        close(img->guard_fd);
        img->guard_fd = -1;
    }
    free(img->tmp_path);
    img->tmp_path = NULL;
    if (!sync)
        return 0;
    /* the rename is durable once the directory is */
    const char *slash = strrchr(target, '/');
    char *dir = slash ? strndup(target, slash == target ? 1 : (size_t)(slash - target))
                      : strdup(".");
    if (!dir)
        return ic_error_nomem(err);
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int e = fd < 0 || fsync(fd) < 0 ? errno : 0;
    if (fd >= 0)
        close(fd);
    free(dir);
    /* some file systems cannot sync a directory: the rename stands */
    if (e && e != EINVAL && e != EBADF)
        return ic_error_os(err, e, img->path, "sync its directory");
    return 0;
}

void ic_image_close(struct ic_image *img)
{
    if (!img)
        return;
    img->drv->close(img);
    free_image(img);
}

uint64_t ic_image_size(const struct ic_image *img)
{
    return img->size;
}

const char *ic_image_format(const struct ic_image *img)
{
    return img->drv->name;
}

const char *ic_image_path(const struct ic_image *img)
{
    return img->path;
}

struct ic_image *ic_image_backing(const struct ic_image *img)
{
    return img->backing;
}

const char *ic_image_reads_file(const struct ic_image *img, const char *path)
{
    struct stat st;
    if (stat(path, &st) < 0)
        return NULL; /* nothing there yet: nothing to overwrite */
    for (const struct ic_image *i = img; i; i = i->backing) {
        if (i->chain_len == 0) /* "null:" and other file-less images */
            continue;
        unsigned k = i->chain_len - 1;
        if (same_file(i->chain[k].dev, i->chain[k].ino, i->chain[k].rdev, &st))
            return i->path;
    }
    return NULL;
}

uint64_t ic_image_qemu_length(const struct ic_image *img)
{
    return img->drv == &ic_driver_raw ? (img->size + 511) / 512 * 512 : img->size;
}

int ic_image_snapshots(struct ic_image *img, const struct ic_snapshot **out, size_t *count)
{
    if (img->drv->snapshots)
        return img->drv->snapshots(img, out, count);
    *out = NULL;
    *count = 0;
    return 0;
}

int ic_image_has_backing_file(const struct ic_image *img)
{
    return img->backing != NULL;
}

int ic_image_writable(const struct ic_image *img)
{
    return (img->open_flags & IC_OPEN_RDWR) != 0;
}

static int check_range(const struct ic_image *img, uint64_t offset, uint64_t length,
                       struct ic_error *err)
{
    if (offset > img->size || length > img->size - offset)
        return ic_error_value(err,
                              "range %llu+%llu is outside the image (size %llu)",
                              (unsigned long long)offset, (unsigned long long)length,
                              (unsigned long long)img->size);
    return 0;
}

int ic_image_block_status(struct ic_image *img, uint64_t offset, uint64_t length,
                          struct ic_extent *out, struct ic_error *err)
{
    if (length == 0)
        return ic_error_value(err, "block status of an empty range");
    if (check_range(img, offset, length, err) < 0)
        return -1;
    return ic_cache_block_status(img, offset, length, out, err);
}

int ic_image_map(struct ic_image *img, uint64_t start, uint64_t end,
                 struct ic_extent_list *out, struct ic_error *err)
{
    if (start > end || check_range(img, start, end - start, err) < 0)
        return ic_error_value(err, "map range %llu..%llu is outside the image (size %llu)",
                              (unsigned long long)start, (unsigned long long)end,
                              (unsigned long long)img->size);
    uint64_t pos = start;
    while (pos < end) {
        struct ic_extent e;
        if (ic_cache_block_status(img, pos, end - pos, &e, err) < 0)
            return -1;
        if (out->count > 0 && ic_extent_mergeable(&out->items[out->count - 1], &e))
            out->items[out->count - 1].length += e.length;
        else if (ic_extent_list_push(out, &e) < 0)
            return ic_error_nomem(err);
        pos += e.length;
    }
    return 0;
}

int ic_image_pread(struct ic_image *img, void *buf, size_t len, uint64_t offset,
                   struct ic_error *err)
{
    if (check_range(img, offset, len, err) < 0)
        return -1;
    return img->drv->pread(img, buf, len, offset, err);
}

int ic_image_pwrite(struct ic_image *img, const void *buf, size_t len, uint64_t offset,
                    struct ic_error *err)
{
    if (!ic_image_writable(img))
        return ic_error_readonly(err, img->path);
    if (check_range(img, offset, len, err) < 0)
        return -1;
    return img->drv->pwrite(img, buf, len, offset, err);
}

int ic_image_zero(struct ic_image *img, uint64_t offset, uint64_t length, unsigned flags,
                  struct ic_error *err)
{
    if (!ic_image_writable(img))
        return ic_error_readonly(err, img->path);
    if (check_range(img, offset, length, err) < 0)
        return -1;
    if (length == 0)
        return 0;
    return img->drv->zero(img, offset, length, flags, err);
}

int ic_image_flush(struct ic_image *img, struct ic_error *err)
{
    return img->drv->flush(img, err);
}

int ic_image_copy_range(struct ic_image *src, struct ic_image *dst, uint64_t off, uint64_t len,
                        struct ic_error *err)
{
    if (!ic_image_writable(dst))
        return ic_error_readonly(err, dst->path);
    if (check_range(src, off, len, err) < 0 || check_range(dst, off, len, err) < 0)
        return -1;
    if (src->drv != dst->drv || !src->drv->copy_range)
        return ic_error_os(err, ENOTSUP, dst->path, "no in-kernel copy from %s to %s",
                           src->drv->name, dst->drv->name);
    return src->drv->copy_range(src, dst, off, len, err);
}

int ic_image_stage(struct ic_image *img, struct ic_staged_write *w, struct ic_error *err)
{
    w->priv = NULL;
    w->scratch[0] = w->scratch[1] = 0;
    if (!ic_image_writable(img))
        return ic_error_readonly(err, img->path);
    if (check_range(img, w->off, w->len, err) < 0)
        return -1;
    return img->drv->stage ? img->drv->stage(img, w, err) : 0;
}

int ic_image_place(struct ic_image *img, struct ic_staged_write *w, struct ic_error *err)
{
    return img->drv->place ? img->drv->place(img, w, err) : 0;
}

int ic_image_commit(struct ic_image *img, struct ic_staged_write *w, struct ic_error *err)
{
    if (img->drv->commit)
        return img->drv->commit(img, w, err);
    if (!w->buf)
        return w->len ? img->drv->zero(img, w->off, w->len, IC_ZERO_MAY_UNMAP, err) : 0;
    return img->drv->pwrite(img, w->buf, (size_t)w->len, w->off, err);
}

void ic_image_unstage(struct ic_image *img, struct ic_staged_write *w)
{
    if (img->drv->unstage)
        img->drv->unstage(img, w);
    w->priv = NULL;
}

int ic_image_places_in_order(const struct ic_image *img)
{
    return img->drv->place != NULL;
}

uint64_t ic_image_write_alignment(const struct ic_image *img)
{
    return img->drv->write_alignment ? img->drv->write_alignment(img) : 1;
}

int ic_image_finish(struct ic_image *img, int sync, struct ic_error *err)
{
    if (!ic_image_writable(img))
        return 0;
    if (img->drv->finish && img->drv->finish(img, sync, err) < 0)
        return -1;
    return img->tmp_path ? rename_into_place(img, sync, err) : 0;
}

void ic_image_settle_written(struct ic_image *img, uint64_t off, uint64_t len)
{
    if (img->drv->settle_written)
        img->drv->settle_written(img, off, len);
}

void ic_image_settle_read(struct ic_image *img, uint64_t off, uint64_t len)
{
    if (img->drv->settle_read)
        img->drv->settle_read(img, off, len);
}
