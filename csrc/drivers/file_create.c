/* New destinations of the file protocol.  A regular file is written under
 * a temporary name in its directory and renamed over `path` only when the
 * image is finished (so `path` never holds an incomplete copy), the file
 * it replaces locked meanwhile as qemu's image creation locks it; without
 * IC_CREATE_ATOMIC it is emptied in place.  A block device is used as it
 * is, never replaced by a file. */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../lock.h"
#include "file.h"

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
    if (ic_lock_image_fd(fd, IC_PERM_WRITE | IC_PERM_RESIZE,
                         IC_PERM_ALL & ~(IC_PERM_WRITE | IC_PERM_RESIZE), path, err) < 0) {
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
    return ic_file_disk_or_file(fd, &st, path, err);
}

int ic_file_create(struct ic_image *img, const char *path, int *fresh, struct ic_error *err)
{
    char *tmp, *target;
    int guard;
    int fd = open_for_create(path, (img->open_flags & IC_CREATE_ATOMIC) != 0, &tmp, &target,
                             &guard, err);
    if (fd < 0)
        return -1;
    uint64_t want = img->size;
    struct stat st;
    int e = fstat(fd, &st) < 0 || (S_ISREG(st.st_mode) && ftruncate(fd, (off_t)want) < 0)
                ? errno
                : 0;
    if (e || ic_file_adopt(img, fd, err) < 0) {
        close(fd);
        if (tmp)
            unlink(tmp);
        if (guard >= 0)
            close(guard);
        free(tmp);
        free(target);
        return e ? ic_error_os(err, e, path, "resize to %llu bytes", (unsigned long long)want)
                 : -1;
    }
    struct raw_state *s = img->drv_state;
    s->tmp_path = tmp;
    s->rename_to = target;
    s->guard_fd = guard;
    if (img->size < want)
        return ic_error_value(err, "%s: the device holds %llu bytes, %llu are needed", path,
                              (unsigned long long)img->size, (unsigned long long)want);
    /* a disk keeps what it held; an emptied file reads as zeros */
    *fresh = S_ISREG(st.st_mode);
    return 0;
}

/* A new file takes the place of `path` once its image is complete. */
int ic_file_finish(struct ic_image *img, int sync, struct ic_error *err)
{
    struct raw_state *s = img->drv_state;
    if (!s->tmp_path)
        return 0;
    const char *target = s->rename_to;
    /* the file guarded since the start is the one replaced */
    struct stat was, now;
    if (s->guard_fd >= 0 &&
        (fstat(s->guard_fd, &was) < 0 || stat(target, &now) < 0 || was.st_dev != now.st_dev ||
         was.st_ino != now.st_ino))
        return ic_error_os(err, EBUSY, img->path, "the destination was replaced by another "
                           "file during the copy");
    if (rename(s->tmp_path, target) < 0)
        return ic_error_os(err, errno, img->path, "rename %s over it", s->tmp_path);
    if (s->guard_fd >= 0) {
        close(s->guard_fd);
        s->guard_fd = -1;
    }
    free(s->tmp_path);
    s->tmp_path = NULL;
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

