/* The journal file's life (format and rules in journal.h, its parts in
 * journal_internal.h): open (create, lock, resume), record, sync,
 * complete, close.
 *
 * Records wait in memory until ic_journal_sync writes them as a single
 * record: a crash then damages at most the last record, which is what lets
 * opening tell a torn tail from damage in the middle. */
#include "journal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "digest.h"
#include "journal_internal.h"

static int write_at(int fd, const uint8_t *p, size_t n, uint64_t off)
{
    while (n > 0) {
        size_t k = n > (1u << 30) ? (1u << 30) : n;
        ssize_t w = pwrite(fd, p, k, (off_t)off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return -1;
        if (w == 0) {
            errno = EIO; /* no progress and no reason: do not spin */
            return -1;
        }
        p += w;
        n -= (size_t)w;
        off += (uint64_t)w;
    }
    return 0;
}

static int datasync(int fd)
{
    int r;
    while ((r = fdatasync(fd)) < 0 && errno == EINTR)
        ;
    return r;
}

/* The directory entry made or removed durable.  Some filesystems cannot
 * sync a directory (EINVAL): their entries are as durable as they get. */
static int sync_dir(struct ic_journal *j, struct ic_error *err)
{
    int r;
    while ((r = fsync(j->dirfd)) < 0 && errno == EINTR)
        ;
    if (r < 0 && errno != EINVAL && errno != ENOTSUP)
        return ic_error_os(err, errno, j->path, "cannot sync the journal's directory");
    return 0;
}

/* A new header at 0 of an empty file, durable, its name too */
static int write_header(struct ic_journal *j, const struct ic_journal_identity *id,
                        struct ic_error *err)
{
    size_t h;
    uint8_t *b = journal_build_header(id, &h);
    if (!b)
        return ic_error_nomem(err);
    int r = write_at(j->fd, b, h, 0);
    free(b);
    if (r < 0)
        return ic_error_os(err, errno, j->path, "cannot write the journal");
    if (datasync(j->fd) < 0)
        return ic_error_os(err, errno, j->path, "cannot sync the journal");
    j->end = h;
    return sync_dir(j, err);
}

static void free_journal(struct ic_journal *j)
{
    if (j->fd >= 0)
        close(j->fd);
    if (j->dirfd >= 0)
        close(j->dirfd);
    free(j->name);
    free(j->path);
    free(j->done);
    free(j->runs);
    free(j->dig);
    free(j->pend);
    free(j->pbits);
    free(j);
}

static int check_id(const struct ic_journal_identity *id, struct ic_error *err)
{
    if (id->block_size == 0)
        return ic_error_value(err, "journal: the block size must be at least 1");
    if (id->algorithm && !id->algorithm[0])
        return ic_error_value(err, "journal: an empty algorithm name (NULL: no digests)");
    if (id->algorithm ? id->digest_size == 0 || id->digest_size > IC_DIGEST_MAX
                      : id->digest_size != 0)
        return ic_error_value(err, "journal: digest size %zu with %s", id->digest_size,
                              id->algorithm ? "an algorithm" : "no algorithm");
    const char *text[4] = {id->algorithm, id->source, id->destination, id->options};
    for (int i = 0; i < 4; i++)
        if (text[i] && strlen(text[i]) > IC_JOURNAL_TEXT_MAX)
            return ic_error_value(err, "journal: an identity text of %zu bytes (at most %u)",
                                  strlen(text[i]), IC_JOURNAL_TEXT_MAX);
    return 0;
}

/* path into the directory to open and the name in it */
static int split_path(struct ic_journal *j, const char *path, char **dir, struct ic_error *err)
{
    const char *slash = strrchr(path, '/');
    const char *name = slash ? slash + 1 : path;
    if (!name[0] || strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
        return ic_error_value(err, "journal %s: not a file name", path);
    j->name = strdup(name);
    if (!slash)
        *dir = strdup(".");
    else if (slash == path)
        *dir = strdup("/");
    else
        *dir = strndup(path, (size_t)(slash - path));
    if (!j->name || !*dir)
        return ic_error_nomem(err);
    return 0;
}

int ic_journal_open(const char *path, const struct ic_journal_identity *id,
                    struct ic_journal **out, struct ic_error *err)
{
    *out = NULL;
    if (!path || !path[0])
        return ic_error_value(err, "journal: no path");
    if (check_id(id, err) < 0)
        return -1;
    struct ic_journal *j = calloc(1, sizeof *j);
    if (!j)
        return ic_error_nomem(err);
    j->fd = j->dirfd = -1;
    j->size = id->size;
    j->block_size = id->block_size;
    j->nblocks = id->size / id->block_size + (id->size % id->block_size != 0);
    j->digest_size = id->algorithm ? id->digest_size : 0;
    char *dir = NULL;
    int ret = -1, created = 0;
    if (!(j->path = strdup(path))) {
        ic_error_nomem(err);
        goto fail;
    }
    if (split_path(j, path, &dir, err) < 0)
        goto fail;
    /* the name is resolved once, in a directory held open: a rename of the
     * directory or a chdir does not make complete() remove another file */
    j->dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (j->dirfd < 0) {
        ic_error_os(err, errno, dir, "cannot open the journal's directory");
        goto fail;
    }
    for (int tries = 0;; tries++) {
        j->fd = openat(j->dirfd, j->name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (j->fd >= 0) {
            created = 1;
            break;
        }
        if (errno != EEXIST) {
            ic_error_os(err, errno, path, "cannot create the journal");
            goto fail;
        }
        j->fd = openat(j->dirfd, j->name, O_RDWR | O_CLOEXEC);
        if (j->fd >= 0)
            break;
        /* removed between the two: another copy completed; try again */
        if (errno != ENOENT || tries >= 8) {
            ic_error_os(err, errno, path, "cannot open the journal");
            goto fail;
        }
    }
    int r;
    while ((r = flock(j->fd, LOCK_EX | LOCK_NB)) < 0 && errno == EINTR)
        ;
    if (r < 0 && errno == EWOULDBLOCK) {
        created = 0; /* the other process's file */
        ic_error_os(err, EAGAIN, path, "the journal is in use by another copy");
        goto fail;
    }
    /* a filesystem without locks: the lock only guards against running one
     * command twice at once, which the user can avoid */
    if (r < 0 && errno != ENOLCK && errno != EOPNOTSUPP && errno != ENOSYS) {
        ic_error_os(err, errno, path, "cannot lock the journal");
        goto fail;
    }
    struct stat st;
    if (fstat(j->fd, &st) < 0) {
        ic_error_os(err, errno, path, "cannot stat the journal");
        goto fail;
    }
    if (!S_ISREG(st.st_mode)) {
        created = 0;
        ic_error_value(err, "journal %s is not a regular file", path);
        goto fail;
    }
    if (created) {
        ret = write_header(j, id, err);
    } else if ((ret = journal_load(j, id, (uint64_t)st.st_size, err)) > 0) {
        /* a creation a crash interrupted: it recorded nothing */
        if (ftruncate(j->fd, 0) < 0)
            ret = ic_error_os(err, errno, j->path, "cannot truncate the journal");
        else
            ret = write_header(j, id, err);
    }
    if (ret < 0)
        goto fail;
    free(dir);
    *out = j;
    return 0;
fail:
    /* a journal made here that never got its header recorded nothing */
    if (created && unlinkat(j->dirfd, j->name, 0) == 0)
        (void)fsync(j->dirfd); /* best effort: the error already said what failed */
    free(dir);
    free_journal(j);
    return -1;
}

int ic_journal_resumed(const struct ic_journal *j)
{
    return j->resumed;
}

uint64_t ic_journal_block_size(const struct ic_journal *j)
{
    return j->block_size;
}

size_t ic_journal_digest_size(const struct ic_journal *j)
{
    return j->digest_size;
}

uint64_t ic_journal_size(const struct ic_journal *j)
{
    return j->size;
}

/* A failure sticks: every later record or sync returns it */
static int failed(const struct ic_journal *j, struct ic_error *err)
{
    if (!j->failed)
        return 0;
    if (err)
        *err = j->failure;
    return -1;
}

static int record(struct ic_journal *j, const struct ic_range *ranges, size_t n,
                  const struct kinds *k, const uint8_t *digests, struct ic_error *err)
{
    if (failed(j, err))
        return -1;
    return journal_add(j, ranges, n, k, digests, err);
}

int ic_journal_record(struct ic_journal *j, const struct ic_range *ranges, size_t n,
                      const uint8_t *zero_flags, const uint8_t *digests, struct ic_error *err)
{
    struct kinds k = {KINDS_BYTES, zero_flags};
    return record(j, ranges, n, &k, digests, err);
}

int ic_journal_record_run(struct ic_journal *j, uint64_t first, uint64_t count,
                          const uint8_t *digests, struct ic_error *err)
{
    if (count == 0)
        return record(j, NULL, 0, NULL, NULL, err); /* nothing, but a failure sticks */
    if (first >= j->nblocks || count > j->nblocks - first)
        return ic_error_value(err, "journal: blocks %llu+%llu are not among its %llu",
                              (unsigned long long)first, (unsigned long long)count,
                              (unsigned long long)j->nblocks);
    uint64_t off = first * j->block_size;
    struct ic_range r = {off, first + count == j->nblocks ? j->size - off
                                                           : count * j->block_size};
    struct kinds k = {digests ? KINDS_ALL_DATA : KINDS_ALL_ZERO, NULL};
    return record(j, &r, 1, &k, digests, err);
}

static int sticky(struct ic_journal *j, int errnum, const char *what, struct ic_error *err)
{
    ic_error_os(&j->failure, errnum, j->path, "%s", what);
    j->failed = 1;
    if (err)
        *err = j->failure;
    return -1;
}

int ic_journal_sync(struct ic_journal *j, struct ic_error *err)
{
    if (failed(j, err))
        return -1;
    if (j->npend == 0)
        return 0;
    size_t n;
    uint8_t *b = journal_encode_pending(j, &n);
    if (!b)
        return ic_error_nomem(err);
    int ret = 0;
    if (j->cut && ftruncate(j->fd, (off_t)j->end) < 0)
        ret = sticky(j, errno, "cannot cut the journal's torn tail", err);
    else if (write_at(j->fd, b, n, j->end) < 0)
        ret = sticky(j, errno, "cannot write the journal", err);
    else if (datasync(j->fd) < 0)
        ret = sticky(j, errno, "cannot sync the journal", err);
    free(b);
    if (ret)
        return ret;
    j->cut = 0;
    j->end += n;
    journal_pending_written(j);
    return 0;
}

int ic_journal_complete(struct ic_journal *j, struct ic_error *err)
{
    int ret = 0;
    if (unlinkat(j->dirfd, j->name, 0) < 0)
        ret = ic_error_os(err, errno, j->path, "cannot remove the journal");
    else
        ret = sync_dir(j, err);
    free_journal(j);
    return ret;
}

void ic_journal_close(struct ic_journal *j)
{
    if (j)
        free_journal(j);
}
