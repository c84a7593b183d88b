/* Files an image names (vmdk extents, backing files where asked),
 * confined to the image's directory: openat2 RESOLVE_BENEATH, or a walk
 * that follows no link and never goes up where openat2 is missing. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/openat2.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "../image.h"
#include "file.h"

/* The safe walk for kernels without openat2 (or a seccomp filter refusing
 * it): one component at a time, never following a symbolic link, never
 * going up. */
static int walk_beneath(int dirfd, const char *name, int flags)
{
    int cur = dirfd;
    const char *p = name;
    if (name[0] == '/')
        return -EXDEV;
    for (;;) {
        while (*p == '/')
            p++;
        const char *end = strchr(p, '/');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        const char *rest = p + n;
        while (*rest == '/')
            rest++;
        int last = *rest == '\0';
        char comp[NAME_MAX + 1];
        if (n > NAME_MAX) {
            if (cur != dirfd)
                close(cur);
            return -ENAMETOOLONG;
        }
        memcpy(comp, p, n);
        comp[n] = '\0';
        if (n == 2 && comp[0] == '.' && comp[1] == '.') {
            if (cur != dirfd)
                close(cur);
            return -EXDEV;
        }
        int fd;
        if (last) {
            fd = openat(cur, n ? comp : ".", flags | O_NOFOLLOW);
        } else if (n == 0 || (n == 1 && comp[0] == '.')) {
            p = rest;
            continue;
        } else {
            fd = openat(cur, comp, O_PATH | O_NOFOLLOW | O_CLOEXEC);
            struct stat st;
            if (fd >= 0 && fstat(fd, &st) < 0) {
                int e = errno;
                close(fd);
                errno = e;
                fd = -1;
            } else if (fd >= 0 && !S_ISDIR(st.st_mode)) {
                close(fd);
                errno = S_ISLNK(st.st_mode) ? ELOOP : ENOTDIR;
                fd = -1;
            }
        }
        int e = errno;
        if (cur != dirfd)
            close(cur);
        if (fd < 0)
            return -e;
        if (last)
            return fd;
        cur = fd;
        p = rest;
    }
}

int ic_open_beneath(int dirfd, const char *name, int flags, int use_openat2)
{
    struct open_how how = {
        .flags = (uint64_t)flags,
        .resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS,
    };
    for (int tries = 0; use_openat2 && tries < 16; tries++) {
        long fd = syscall(SYS_openat2, dirfd, name, &how, sizeof how);
        if (fd >= 0)
            return (int)fd;
        if (errno == ENOSYS || errno == EPERM) /* EPERM: a seccomp filter's answer */
            break;
        if (errno != EAGAIN && errno != EINTR) /* EAGAIN: a rename raced the lookup */
            return -errno;
    }
    return walk_beneath(dirfd, name, flags);
}

int ic_file_open_beneath(struct ic_image *img, const char *owner, const char *what,
                         const char *dir, const char *name, struct ic_error *err)
{
    int dirfd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (dirfd < 0)
        return ic_error_os(err, errno, dir, "open");
    int mode = (img->open_flags & IC_OPEN_RDWR) ? O_RDWR : O_RDONLY;
    int fd = ic_open_beneath(dirfd, name, mode | O_CLOEXEC | O_NONBLOCK | O_NOCTTY, 1);
    close(dirfd);
    if (fd == -EXDEV)
        return ic_error_format(err, owner, "%s '%s' leads outside the image's directory "
                               "through a symbolic link (allow it with external_files=True)",
                               what, name);
    if (fd == -ELOOP)
        return ic_error_format(err, owner, "%s '%s' goes through a symbolic link this "
                               "system cannot follow safely (no openat2), or too many of them "
                               "(allow it with external_files=True)", what, name);
    if (fd < 0)
        return ic_error_os(err, -fd, img->path, "open");
    struct stat st;
    if (fstat(fd, &st) < 0) {
        int e = errno;
        close(fd);
        return ic_error_os(err, e, img->path, "fstat");
    }
    if (S_ISDIR(st.st_mode)) {
        close(fd);
        return ic_error_os(err, EISDIR, img->path, "open");
    }
    /* a device node in an image's directory is the host's disk, not the
     * image's */
    if (S_ISBLK(st.st_mode) || S_ISCHR(st.st_mode)) {
        close(fd);
        return ic_error_format(err, owner, "%s '%s' is a device, not a file of the image "
                               "(allow it with external_files=True)", what, name);
    }
    if ((fd = ic_file_disk_or_file(fd, &st, img->path, err)) < 0)
        return -1;
    if (ic_file_adopt(img, fd, err) < 0) {
        close(fd);
        return -1;
    }
    return 0;
}
