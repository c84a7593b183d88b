/* The file protocol: a regular file or a block device.  A raw image is
 * this protocol's image; a format's image reads its host file through it.
 * It also creates destinations (a new file under a temporary name, renamed
 * into place by finish()), takes qemu's image locks and learns the zero
 * methods the kernel accepts. */
#include <errno.h>
#include <stdio.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>
#include <linux/falloc.h>
#include <limits.h>
#include <linux/fs.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "../image.h"
#include "../lock.h"
#include "file.h"
#include "uring.h"

static struct raw_state *state(struct ic_image *img)
{
    return img->drv_state;
}

/* O_DIRECT wants this alignment of offsets, lengths and buffers; 4096
 * satisfies every logical block size in use. */
#define DIRECT_ALIGN 4096u

/* Pages a copy reads from its source are dropped behind it (settle_read),
 * so that copying a cold disk does not push everything else out of the
 * page cache.  A source found already cached keeps them: they were there
 * before the copy, and dropping them costs the copy time and whoever reads
 * the image next a read from the disk.  Sampled where the file has data,
 * by mincore() of a page mapped there: it reads nothing (a read that must
 * not wait still starts readahead) and faults nothing in. */
#define CACHE_SAMPLES 16
static int mostly_cached(int fd, uint64_t size, int can_seek_data)
{
    long page = sysconf(_SC_PAGESIZE);
    if (page <= 0)
        return 0;
    unsigned seen = 0, cached = 0;
    for (unsigned i = 0; i < CACHE_SAMPLES && size >= (uint64_t)page; i++) {
        off_t at = (off_t)(size / CACHE_SAMPLES * i) & ~(off_t)(page - 1);
        if (can_seek_data) {
            off_t data = lseek(fd, at, SEEK_DATA);
            if (data < 0 && errno == ENXIO)
                break; /* no data from here on */
            if (data >= 0)
                at = data & ~(off_t)(page - 1);
            else
                can_seek_data = 0;
        }
        if ((uint64_t)at >= size)
            break;
        void *map = mmap(NULL, (size_t)page, PROT_READ, MAP_SHARED, fd, at);
        if (map == MAP_FAILED)
            return 0; /* cannot tell: dropped, as always */
        unsigned char resident = 0;
        int r = mincore(map, (size_t)page, &resident);
        munmap(map, (size_t)page);
        if (r < 0)
            return 0;
        seen++;
        cached += resident & 1;
    }
    return seen > 0 && cached * 2 > seen;
}

int ic_file_adopt(struct ic_image *img, int fd, struct ic_error *err)
{
    struct stat st;
    if (fstat(fd, &st) < 0)
        return ic_error_os(err, errno, img->path, "fstat");
    struct raw_state *s = calloc(1, sizeof *s);
    if (!s)
        return ic_error_nomem(err);
    s->fd = fd;
    s->fd_direct = -1;
    s->guard_fd = -1;
    s->is_blockdev = S_ISBLK(st.st_mode);
    s->alloc_unit = st.st_blksize > 0 ? (uint64_t)st.st_blksize : 4096;
    s->writeback = (img->open_flags & IC_OPEN_WRITEBACK) != 0;
    atomic_init(&s->no_seek_hole, s->is_blockdev);
    atomic_init(&s->zero_refused, 0);
    atomic_init(&s->no_nowait, 0);
    if (s->is_blockdev) {
        uint64_t bytes;
        if (ioctl(fd, BLKGETSIZE64, &bytes) < 0) {
            int e = errno;
            free(s);
            return ic_error_os(err, e, img->path, "BLKGETSIZE64");
        }
        img->size = bytes;
    } else {
        img->size = (uint64_t)st.st_size;
    }
    if (img->open_flags & IC_OPEN_DIRECT) {
        /* the same file as fd, whatever its name is now (a new image is
         * written under a temporary name) */
        int mode = (img->open_flags & IC_OPEN_RDWR) ? O_RDWR : O_RDONLY;
        char self[64];
        snprintf(self, sizeof self, "/proc/self/fd/%d", fd);
        s->fd_direct = open(self, mode | O_DIRECT | O_CLOEXEC);
        if (s->fd_direct < 0) {
            int e = errno;
            free(s);
            return ic_error_os(err, e, img->path, "open with O_DIRECT");
        }
    }
    s->keep_cache = (img->open_flags & IC_OPEN_SOURCE) && !(img->open_flags & IC_OPEN_DIRECT) &&
                    mostly_cached(fd, img->size, !s->is_blockdev);
    img->drv_state = s;
    return 0;
}

/* Images are regular files or block devices; the descriptor, opened with
 * O_NONBLOCK so that a FIFO could not hang us, blocks again. */
int ic_file_disk_or_file(int fd, const struct stat *st, const char *path, struct ic_error *err)
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

static int open_file(struct ic_image *img, const char *path, struct ic_error *err)
{
    int mode = (img->open_flags & IC_OPEN_RDWR) ? O_RDWR : O_RDONLY;
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
    if ((fd = ic_file_disk_or_file(fd, &st, path, err)) < 0)
        return -1;
    if (ic_file_adopt(img, fd, err) < 0) {
        close(fd);
        return -1;
    }
    return 0;
}

static void close_raw(struct ic_image *img);

static void file_allocate(struct ic_image *img, uint64_t off, uint64_t len)
{
    /* mode 0: never changes what the range reads */
    (void)fallocate(state(img)->fd, FALLOC_FL_KEEP_SIZE, (off_t)off, (off_t)len);
    ic_cache_forget(img, off, off + len);
}

static int file_truncate(struct ic_image *img, uint64_t size, struct ic_error *err)
{
    if (ftruncate(state(img)->fd, (off_t)size) < 0)
        return ic_error_os(err, errno, img->path, "resize to %llu bytes",
                           (unsigned long long)size);
    img->size = size;
    return 0;
}

static uint64_t file_allocated_bytes(struct ic_image *img)
{
    struct stat st;
    return fstat(state(img)->fd, &st) < 0 ? 0 : (uint64_t)st.st_blocks * 512;
}

static int file_identity(struct ic_image *img, uint64_t *dev, uint64_t *ino, uint64_t *rdev)
{
    struct stat st;
    if (fstat(state(img)->fd, &st) < 0)
        return 0;
    *dev = st.st_dev;
    *ino = st.st_ino;
    *rdev = S_ISBLK(st.st_mode) ? st.st_rdev : 0;
    return 1;
}

static int file_lock(struct ic_image *img, unsigned perm, unsigned shared, struct ic_error *err)
{
    return ic_lock_image_fd(state(img)->fd, perm, shared, img->path, err);
}

/* Whether [off, end) reads as zeros without holding data: a hole, or an
 * unwritten extent.  Probing never reads such a range: reading an unwritten
 * extent leaves zero pages in the page cache, which ext4's SEEK_DATA then
 * reports as data, and probing must not change the map. */
static int file_reads_as_hole(struct ic_image *img, uint64_t off, uint64_t len)
{
    off_t data = lseek(state(img)->fd, (off_t)off, SEEK_DATA);
    if (data < 0)
        return errno == ENXIO; /* EINVAL: no SEEK_DATA here, read it */
    return (uint64_t)data >= off + len;
}

static void close_raw(struct ic_image *img)
{
    struct raw_state *s = state(img);
    if (s) {
        close(s->fd);
        if (s->fd_direct >= 0)
            close(s->fd_direct);
        if (s->tmp_path) /* never finished: the copy is incomplete */
            unlink(s->tmp_path);
        if (s->guard_fd >= 0)
            close(s->guard_fd);
        free(s->tmp_path);
        free(s->rename_to);
        free(s);
        img->drv_state = NULL;
    }
}

/* The descriptor for this request: O_DIRECT when it is aligned. */
static int fd_for(struct raw_state *s, const void *buf, size_t len, uint64_t off)
{
    if (s->fd_direct >= 0 && ((uintptr_t)buf | len | off) % DIRECT_ALIGN == 0)
        return s->fd_direct;
    return s->fd;
}

static int raw_pread(struct ic_image *img, void *buf, size_t len, uint64_t off,
                     struct ic_error *err)
{
    char *p = buf;
    while (len > 0) {
        ssize_t n = pread(fd_for(state(img), p, len, off), p, len, (off_t)off);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return ic_error_os(err, errno, img->path, "read at offset %llu",
                               (unsigned long long)off);
        }
        if (n == 0) /* the file shrank under us */
            return ic_error_os(err, EIO, img->path, "unexpected end of file at offset %llu",
                               (unsigned long long)off);
        p += n;
        off += (uint64_t)n;
        len -= (size_t)n;
    }
    return 0;
}

/* ---- several runs at once (pread_runs) ----------------------------------- */

/* Runs that follow each other in the file, wherever they are in memory
 * (a fragmented qcow2's clusters, written last to first, are a stretch
 * read backwards): one vectored read of `len` bytes at `off`, of which
 * `done` are read; runs order[first .. first+count) in file order. */
struct stretch {
    uint64_t off;
    size_t len, done;
    unsigned first, count;
    int direct; /* every run suits the O_DIRECT descriptor */
};

/* The buffers of what is left of `st` into iov (room for st->count). */
static int stretch_iov(const struct ic_read_run *runs, const unsigned *order,
                       const struct stretch *st, struct iovec *iov)
{
    size_t skip = st->done;
    int k = 0;
    for (unsigned j = 0; j < st->count; j++) {
        const struct ic_read_run *r = &runs[order[st->first + j]];
        if (skip >= r->len) {
            skip -= r->len;
            continue;
        }
        iov[k].iov_base = (uint8_t *)r->buf + skip;
        iov[k].iov_len = r->len - skip;
        k++;
        skip = 0;
    }
    return k;
}

/* The rest of a stretch, waiting for it (O_DIRECT while what is left is
 * still aligned). */
static int read_stretch(struct ic_image *img, const struct ic_read_run *runs,
                        const unsigned *order, struct stretch *st, struct ic_error *err)
{
    struct raw_state *s = state(img);
    struct iovec iov[IC_READ_RUNS_MAX];
    while (st->done < st->len) {
        int cnt = stretch_iov(runs, order, st, iov);
        int fd = st->direct && st->done % DIRECT_ALIGN == 0 ? s->fd_direct : s->fd;
        uint64_t at = st->off + st->done;
        ssize_t n = preadv(fd, iov, cnt, (off_t)at);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return ic_error_os(err, errno, img->path, "read at offset %llu",
                               (unsigned long long)at);
        }
        if (n == 0) /* the file shrank under us */
            return ic_error_os(err, EIO, img->path, "unexpected end of file at offset %llu",
                               (unsigned long long)at);
        st->done += (size_t)n;
    }
    return 0;
}

/* Several runs of the file, read as concurrently as the file allows.
 * Runs that follow each other in the file are one stretch, one vectored
 * read, however they lie in memory: the disk sees one long read, not
 * many short ones in a row.  Of the stretches, what the page cache holds
 * already is copied out at once (RWF_NOWAIT, so a warm file costs one
 * call per stretch); the kernel is told of every stretch still missing
 * (WILLNEED: they go to the disk together) before the first is waited
 * for.  One read after another would leave one request in the disk's
 * queue per thread, and a fragmented image is where the disk's latency,
 * not its bandwidth, is what a copy waits for.  Stretches the O_DIRECT
 * descriptor takes skip the page cache, where no hint starts them early:
 * they go to io_uring together (uring.h; measured on a fragmented qcow2
 * read with -T none: faster than in turn, where for buffered reads it did
 * no better than the hints, which need no ring), or, without it, one
 * after another. */
static int raw_pread_runs(struct ic_image *img, const struct ic_read_run *runs, size_t n,
                          struct ic_error *err)
{
    struct raw_state *s = state(img);
    unsigned order[IC_READ_RUNS_MAX];
    struct stretch st[IC_READ_RUNS_MAX];
    size_t nst = 0;
    /* runs in file order (few: insertion sort) */
    for (unsigned i = 0; i < n; i++) {
        unsigned j = i;
        for (; j > 0 && runs[order[j - 1]].off > runs[i].off; j--)
            order[j] = order[j - 1];
        order[j] = i;
    }
    for (unsigned k = 0; k < n; k++) {
        const struct ic_read_run *r = &runs[order[k]];
        int direct = fd_for(s, r->buf, r->len, r->off) != s->fd;
        struct stretch *last = nst ? &st[nst - 1] : NULL;
        if (last && last->off + last->len == r->off && last->direct == direct) {
            last->len += r->len;
            last->count++;
            continue;
        }
        st[nst++] = (struct stretch){.off = r->off, .len = r->len, .first = k, .count = 1,
                                     .direct = direct};
    }

    struct iovec iov[IC_READ_RUNS_MAX]; /* a stretch's at iov + first */
    struct ic_uring_read direct[IC_READ_RUNS_MAX];
    size_t missing = 0, ndirect = 0, direct_at[IC_READ_RUNS_MAX];
    for (size_t i = 0; i < nst; i++) {
        int cnt = stretch_iov(runs, order, &st[i], iov + st[i].first);
        if (st[i].direct) {
            direct[ndirect] = (struct ic_uring_read){.iov = iov + st[i].first, .iovcnt = cnt,
                                                     .off = st[i].off, .len = st[i].len};
            direct_at[ndirect++] = i;
            continue;
        }
        if (!atomic_load(&s->no_nowait)) {
            ssize_t r = preadv2(s->fd, iov + st[i].first, cnt, (off_t)st[i].off, RWF_NOWAIT);
            if (r > 0)
                st[i].done = (size_t)r;
            else if (r < 0 && (errno == EOPNOTSUPP || errno == EINVAL || errno == ENOSYS))
                atomic_store(&s->no_nowait, 1); /* an old kernel, or a file system without it */
            /* else EAGAIN (not cached), EINTR, an error or the end of the
             * file: the waiting read below tells which */
        }
        missing += st[i].done < st[i].len;
    }
    if (missing > 1)
        for (size_t i = 0; i < nst; i++)
            if (!st[i].direct && st[i].done < st[i].len)
                /* a hint: when the kernel refuses it, the reads below only
                 * wait one after another, as without it */
                (void)posix_fadvise(s->fd, (off_t)(st[i].off + st[i].done),
                                    (off_t)(st[i].len - st[i].done), POSIX_FADV_WILLNEED);
    if (ndirect > 1 && ic_uring_readv(s->fd_direct, direct, ndirect) == 0)
        for (size_t k = 0; k < ndirect; k++)
            st[direct_at[k]].done = direct[k].done;
    /* what is left (everything, without io_uring or hints; a short or
     * failed read) is read here, and its errors reported */
    for (size_t i = 0; i < nst; i++)
        if (read_stretch(img, runs, order, &st[i], err) < 0)
            return -1;
    return 0;
}

static uint64_t align_down(uint64_t x, uint64_t a)
{
    return x / a * a;
}

static uint64_t align_up(uint64_t x, uint64_t a)
{
    return (x + a - 1) / a * a;
}

/* A write allocates every filesystem block it touches. */
static void note_allocated(struct ic_image *img, uint64_t off, uint64_t len)
{
    struct raw_state *s = state(img);
    if (s->is_blockdev)
        return;
    uint64_t start = align_down(off, s->alloc_unit);
    uint64_t end = align_up(off + len, s->alloc_unit);
    if (end > img->size)
        end = img->size;
    struct ic_extent e = {
        .start = start,
        .length = end - start,
        .host_offset = start,
        .flags = IC_EXT_DATA | IC_EXT_PRESENT | IC_EXT_OFFSET_VALID,
    };
    ic_cache_note_if_known(img, &e);
}

static int write_all(struct ic_image *img, const void *buf, size_t len, uint64_t off,
                     struct ic_error *err)
{
    const char *p = buf;
    while (len > 0) {
        ssize_t n = pwrite(fd_for(state(img), p, len, off), p, len, (off_t)off);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return ic_error_os(err, errno, img->path, "write at offset %llu",
                               (unsigned long long)off);
        }
        p += n;
        off += (uint64_t)n;
        len -= (size_t)n;
    }
    return 0;
}

static int raw_pwrite(struct ic_image *img, const void *buf, size_t len, uint64_t off,
                      struct ic_error *err)
{
    struct raw_state *s = state(img);
    int ret = write_all(img, buf, len, off, err);
    note_allocated(img, off, len); /* even a partial write may have allocated */
    /* Start writeback now, so that the final flush finds little to do and
     * dirty pages never pile up; failures here only cost that overlap. */
    if (ret == 0 && s->writeback && len > 0)
        (void)sync_file_range(s->fd, (off_t)off, (off_t)len, SYNC_FILE_RANGE_WRITE);
    return ret;
}

static int unsupported(int e)
{
    return e == EOPNOTSUPP || e == ENOTSUP || e == ENOSYS || e == EINVAL || e == ENOTTY;
}

static int write_zero_buffers(struct ic_image *img, uint64_t off, uint64_t len,
                              struct ic_error *err)
{
    enum { CHUNK = 1 << 20 };
    void *zeros = calloc(1, CHUNK);
    if (!zeros)
        return ic_error_nomem(err);
    int ret = 0;
    while (len > 0 && ret == 0) {
        size_t n = len < CHUNK ? (size_t)len : CHUNK;
        ret = raw_pwrite(img, zeros, n, off, err);
        off += n;
        len -= n;
    }
    free(zeros);
    return ret;
}

static int punch_hole(struct ic_image *img, uint64_t off, uint64_t len)
{
    struct raw_state *s = state(img);
    if (fallocate(s->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)off, (off_t)len) < 0)
        return -errno;
    if (!s->is_blockdev) {
        /* whole blocks inside the range are holes now; partial ones hold
         * zeros where they were; the last block of a file is fs-specific */
        uint64_t start = align_up(off, s->alloc_unit);
        uint64_t end = align_down(off + len, s->alloc_unit);
        if (end > start) {
            struct ic_extent e = {
                .start = start,
                .length = end - start,
                .host_offset = start,
                .flags = IC_EXT_ZERO | IC_EXT_PRESENT | IC_EXT_OFFSET_VALID,
            };
            ic_cache_note(img, &e);
        }
        if (off + len == img->size && end < img->size)
            ic_cache_forget(img, end, img->size);
    }
    return 0;
}

static int zero_range(struct ic_image *img, uint64_t off, uint64_t len)
{
    struct raw_state *s = state(img);
    if (fallocate(s->fd, FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE, (off_t)off, (off_t)len) < 0)
        return -errno;
    /* unwritten extents: whether SEEK_DATA calls them data is fs-specific,
     * and the partial blocks at the edges are written */
    uint64_t end = align_up(off + len, s->alloc_unit);
    ic_cache_forget(img, align_down(off, s->alloc_unit), end < img->size ? end : img->size);
    return 0;
}

/* Disk space for a range that reads as zeros already (mode 0: never
 * changes what it reads) */
static int allocate_range(struct ic_image *img, uint64_t off, uint64_t len)
{
    struct raw_state *s = state(img);
    if (fallocate(s->fd, FALLOC_FL_KEEP_SIZE, (off_t)off, (off_t)len) < 0)
        return -errno;
    ic_cache_forget(img, off, off + len); /* unwritten extents: fs-specific */
    return 0;
}

static int blkzeroout(struct ic_image *img, uint64_t off, uint64_t len)
{
    uint64_t range[2] = {off, len};
    if (ioctl(state(img)->fd, BLKZEROOUT, range) < 0)
        return -errno;
    return 0;
}

/* Try one zeroing method unless the kernel refused it before; remember a
 * refusal so that the next request goes straight to the next method. */
static int try_method(struct ic_image *img, unsigned bit,
                      int (*method)(struct ic_image *, uint64_t, uint64_t), uint64_t off,
                      uint64_t len)
{
    struct raw_state *s = state(img);
    if (atomic_load(&s->zero_refused) & bit)
        return -ENOTSUP;
    int r = method(img, off, len);
    if (r < 0 && unsupported(-r)) {
        atomic_fetch_or(&s->zero_refused, bit);
        return -ENOTSUP;
    }
    return r;
}

static int raw_zero(struct ic_image *img, uint64_t off, uint64_t len, unsigned flags,
                    struct ic_error *err)
{
    struct raw_state *s = state(img);
    int r = -ENOTSUP;
    if (flags & IC_ZERO_MAY_UNMAP)
        r = try_method(img, NO_PUNCH_HOLE, punch_hole, off, len);
    else if ((flags & IC_ZERO_ALLOCATE) && !s->is_blockdev)
        r = try_method(img, NO_ALLOCATE, allocate_range, off, len);
    if (r == -ENOTSUP && !s->is_blockdev)
        r = try_method(img, NO_ZERO_RANGE, zero_range, off, len);
    if (r == -ENOTSUP && s->is_blockdev)
        r = try_method(img, NO_BLKZEROOUT, blkzeroout, off, len);
    if (r == 0)
        return 0;
    if (r != -ENOTSUP)
        return ic_error_os(err, -r, img->path, "zero %llu bytes at offset %llu",
                           (unsigned long long)len, (unsigned long long)off);
    if (flags & IC_ZERO_FAST)
        return ic_error_os(err, ENOTSUP, img->path, "no fast way to zero");
    return write_zero_buffers(img, off, len, err);
}

static int raw_flush(struct ic_image *img, struct ic_error *err)
{
    if (fsync(state(img)->fd) < 0)
        return ic_error_os(err, errno, img->path, "fsync");
    return 0;
}

static void raw_settle_written(struct ic_image *img, uint64_t off, uint64_t len)
{
    struct raw_state *s = state(img);
    if (!s->writeback)
        return;
    (void)sync_file_range(s->fd, (off_t)off, (off_t)len,
                          SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE |
                              SYNC_FILE_RANGE_WAIT_AFTER);
    (void)posix_fadvise(s->fd, (off_t)off, (off_t)len, POSIX_FADV_DONTNEED);
}

static void raw_settle_read(struct ic_image *img, uint64_t off, uint64_t len)
{
    if (state(img)->keep_cache)
        return;
    (void)posix_fadvise(state(img)->fd, (off_t)off, (off_t)len, POSIX_FADV_DONTNEED);
}

static int raw_copy_range(struct ic_image *src, struct ic_image *dst, uint64_t off, uint64_t len,
                          struct ic_error *err)
{
    int in = state(src)->fd, out = state(dst)->fd;
    loff_t src_off = (loff_t)off, dst_off = (loff_t)off;
    while (len > 0) {
        ssize_t n = copy_file_range(in, &src_off, out, &dst_off, len, 0);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            int e = errno;
            if (unsupported(e) || e == EXDEV)
                return ic_error_os(err, ENOTSUP, dst->path, "copy_file_range");
            return ic_error_os(err, e, dst->path, "copy_file_range at offset %llu",
                               (unsigned long long)dst_off);
        }
        if (n == 0)
            return ic_error_os(err, EIO, src->path, "unexpected end of file at offset %llu",
                               (unsigned long long)src_off);
        note_allocated(dst, (uint64_t)dst_off - (uint64_t)n, (uint64_t)n);
        len -= (uint64_t)n;
    }
    return 0;
}

static int push(struct ic_extent_list *out, uint64_t start, uint64_t end, int data,
                struct ic_error *err)
{
    struct ic_extent e = {
        .start = start,
        .length = end - start,
        .host_offset = start,
        .flags = (data ? IC_EXT_DATA : IC_EXT_ZERO) | IC_EXT_PRESENT | IC_EXT_OFFSET_VALID,
    };
    return ic_extent_list_add(out, &e, err);
}

/* One lseek; ENXIO (no data/hole after pos) answers `end_of_file`. */
static int seek(struct ic_image *img, uint64_t pos, int whence, uint64_t *result)
{
    atomic_fetch_add(&img->lseek_calls, 1);
    off_t r = lseek(state(img)->fd, (off_t)pos, whence);
    if (r < 0) {
        if (errno == ENXIO) {
            *result = img->size;
            return 0;
        }
        return -errno;
    }
    *result = (uint64_t)r > img->size ? img->size : (uint64_t)r;
    return 0;
}

/* Alternate SEEK_DATA and SEEK_HOLE: after the first call each answer is a
 * new extent boundary. */
static int raw_block_status(struct ic_image *img, uint64_t start, uint64_t end, uint64_t want,
                            struct ic_extent_list *out, struct ic_error *err)
{
    struct raw_state *s = state(img);
    if (atomic_load(&s->no_seek_hole))
        return push(out, start, end, 1, err);

    uint64_t pos = start;
    unsigned extra = 0;
    int in_data = -1; /* unknown */
    while (pos < end && (pos <= want || extra < IC_WALK_EXTRA_EXTENTS)) {
        uint64_t next;
        int r;
        if (in_data != 1) {
            r = seek(img, pos, SEEK_DATA, &next);
            if (r == 0 && next == pos) {
                in_data = 1;
                continue;
            }
            in_data = 0;
        } else {
            r = seek(img, pos, SEEK_HOLE, &next);
            if (r == 0 && next <= pos) /* a racing truncate; say data to EOF */
                next = img->size > pos ? img->size : end;
        }
        if (r == -EINVAL || r == -ENOTSUP || r == -EOPNOTSUPP) {
            /* no SEEK_HOLE here: everything is data */
            atomic_store(&s->no_seek_hole, 1);
            return push(out, pos, end, 1, err);
        }
        if (r < 0)
            return ic_error_os(err, -r, img->path, "lseek at offset %llu",
                               (unsigned long long)pos);
        if (next > end)
            next = end;
        if (push(out, pos, next, in_data, err) < 0)
            return -1;
        if (pos > want)
            extra++;
        pos = next;
        in_data = !in_data;
    }
    return 0;
}

const struct ic_driver ic_protocol_file = {
    .name = "file",
    .kind = IC_PROTOCOL,
    .open_protocol = open_file,
    .create_protocol = ic_file_create,
    .close = close_raw,
    .pread = raw_pread,
    .pread_runs = raw_pread_runs,
    .pwrite = raw_pwrite,
    .zero = raw_zero,
    .zero_allocates = 1,
    .flush = raw_flush,
    .block_status = raw_block_status,
    .finish = ic_file_finish,
    .truncate = file_truncate,
    .allocate = file_allocate,
    .allocated_bytes = file_allocated_bytes,
    .reads_as_hole = file_reads_as_hole,
    .lock = file_lock,
    .identity = file_identity,
    .settle_written = raw_settle_written,
    .settle_read = raw_settle_read,
    .copy_range = raw_copy_range,
    .open_beneath = ic_file_open_beneath,
};
