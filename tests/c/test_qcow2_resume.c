/* qcow2 checkpoints and resumed writing, crashed at every step.
 *
 * A child process creates a qcow2 image and writes a list of steps (data
 * and zeros, some overlapping), calling ic_image_checkpoint() every few
 * steps and telling the parent, through a pipe, how many steps had
 * completed before each checkpoint that returned; then it finishes the
 * image.  The child crashes at its N-th change of the host file (a write,
 * a resize, a hole punched, a flush), for every N until it runs to the
 * end.  How the file looks after the crash is modelled here: this test
 * defines pwrite, ftruncate, fallocate and fsync (the core's calls
 * resolve to them), recording each 512-byte sector's content as of the
 * last fsync; the crash then keeps every change (a killed process: the
 * page cache has them), loses every change since the last fsync (a power
 * cut), or keeps a pseudo-random choice of sectors and size (writeback
 * in any order, torn writes).
 *
 * The parent then does what a resumed copy does: it opens the image with
 * IC_OPEN_RESUME, checks that every step recorded is there, writes every
 * step from the first one not recorded on, finishes, and checks the
 * result: it opens as a complete image, ic_image_check (qemu-img check's
 * rules) finds no corruption and no leak, and it reads as the steps say.
 * When no checkpoint returned before the crash, the image may be beyond
 * opening (its header was never durable): a format error then.
 *
 * Last, without crashes, writer threads write while another thread takes
 * checkpoints (run under ThreadSanitizer by `make tsan`). */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "image_checks.h"
#include "imgcopy.h"

#ifdef __SANITIZE_THREAD__
#define CRASH_STRIDE 9 /* ThreadSanitizer is slow: every 9th crash point */
#else
#define CRASH_STRIDE 1
#endif

/* ---- the host file's durability, modelled ------------------------------ */

enum crash_kind { KEEP_ALL, LOSE_ALL, LOSE_SOME, NKINDS };
static const char *const kind_names[] = {"kill", "power cut", "torn writeback"};

#define SECTOR 512u
#define MAX_SECTORS (1u << 20) /* files up to 512 MiB */

static dev_t target_dev;
static ino_t target_ino;
static long crash_at; /* crash at this change of the file (0: never) */
static long changes;
static enum crash_kind crash_kind;
static uint64_t rng;
static uint8_t *durable[MAX_SECTORS]; /* content as of the last fsync, if changed since */
static uint32_t *touched;             /* the sectors durable[] holds */
static size_t ntouched, touched_cap;
static off_t durable_size;

static uint64_t next_random(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static int is_target_file(int fd)
{
    struct stat st;
    return fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_dev == target_dev &&
           st.st_ino == target_ino;
}

/* a change of the file the model follows: in a writer that crashes */
static int is_target(int fd)
{
    return crash_at && is_target_file(fd);
}

static off_t size_of(int fd)
{
    struct stat st;
    CHECK(fstat(fd, &st) == 0, "fstat: %s", strerror(errno));
    return st.st_size;
}

/* The sectors [off, off+len) will change: their durable content, if not
 * kept yet (past the end of the file: zeros). */
static void note(int fd, uint64_t off, uint64_t len)
{
    if (!len)
        return;
    for (uint64_t s = off / SECTOR; s <= (off + len - 1) / SECTOR; s++) {
        CHECK(s < MAX_SECTORS, "sector %llu past the model", (unsigned long long)s);
        if (durable[s])
            continue;
        uint8_t *old = calloc(1, SECTOR);
        CHECK(old, "calloc");
        ssize_t n = pread(fd, old, SECTOR, (off_t)(s * SECTOR));
        CHECK(n >= 0, "pread: %s", strerror(errno));
        durable[s] = old;
        if (ntouched == touched_cap) {
            touched_cap = touched_cap ? touched_cap * 2 : 1024;
            touched = realloc(touched, touched_cap * sizeof *touched);
            CHECK(touched, "realloc");
        }
        touched[ntouched++] = (uint32_t)s;
    }
}

static void forget_all(void)
{
    for (size_t i = 0; i < ntouched; i++) {
        free(durable[touched[i]]);
        durable[touched[i]] = NULL;
    }
    ntouched = 0;
}

/* The crash: the file as the crash kind leaves it, then SIGKILL. */
static void crash(int fd)
{
    if (crash_kind != KEEP_ALL) {
        for (size_t i = 0; i < ntouched; i++) {
            uint32_t s = touched[i];
            if (crash_kind == LOSE_SOME && next_random() % 2)
                continue;
            CHECK(syscall(SYS_pwrite64, fd, durable[s], SECTOR, (off_t)s * SECTOR) == SECTOR,
                  "restoring a sector");
        }
        if (crash_kind == LOSE_ALL || next_random() % 2)
            CHECK(syscall(SYS_ftruncate, fd, durable_size) == 0, "restoring the size");
    }
    kill(getpid(), SIGKILL);
    abort();
}

/* One more change of the file, before (`after` 0) and after it is made:
 * the crash when it is the one.  A killed process never made it; a power
 * cut may lose it, or part of it. */
enum { BEFORE, AFTER, INSTEAD };
static void crash_point(int fd, int when)
{
    if (when != AFTER)
        changes++;
    if (changes == crash_at && (when != BEFORE || crash_kind == KEEP_ALL))
        crash(fd);
}

ssize_t pwrite(int fd, const void *buf, size_t len, off_t off)
{
    if (!is_target(fd))
        return syscall(SYS_pwrite64, fd, buf, len, off);
    crash_point(fd, BEFORE);
    note(fd, (uint64_t)off, len);
    ssize_t n = syscall(SYS_pwrite64, fd, buf, len, off);
    crash_point(fd, AFTER); /* power cut: torn, or lost */
    return n;
}

int ftruncate(int fd, off_t size)
{
    if (!is_target(fd))
        return (int)syscall(SYS_ftruncate, fd, size);
    crash_point(fd, BEFORE);
    off_t old = size_of(fd);
    if (size < old && size % SECTOR) /* the tail of the last sector becomes zeros */
        note(fd, (uint64_t)size, SECTOR - size % SECTOR);
    int r = (int)syscall(SYS_ftruncate, fd, size);
    crash_point(fd, AFTER);
    return r;
}

int fallocate(int fd, int mode, off_t off, off_t len)
{
    int changes_bytes = (mode & (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE)) != 0;
    if (!is_target(fd) || !changes_bytes)
        return (int)syscall(SYS_fallocate, fd, mode, off, len);
    crash_point(fd, BEFORE);
    off_t size = size_of(fd);
    if (off < size)
        note(fd, (uint64_t)off, (uint64_t)(off + len < size ? len : size - off));
    int r = (int)syscall(SYS_fallocate, fd, mode, off, len);
    crash_point(fd, AFTER);
    return r;
}

static int flushed(int fd)
{
    if (!is_target_file(fd))
        return (int)syscall(SYS_fsync, fd);
    if (crash_at) {
        crash_point(fd, INSTEAD); /* what it would make durable lost, or not */
        forget_all();
        durable_size = size_of(fd);
    }
    return 0; /* modelled: the real one only costs time */
}

int fsync(int fd)
{
    return flushed(fd);
}

int fdatasync(int fd)
{
    return flushed(fd);
}

/* ---- the workload ------------------------------------------------------- */

struct step {
    uint64_t off, len;
    int zero;
};

struct config {
    const char *name;
    uint64_t cluster_size, size;
    int compat_v2, compress;
    unsigned nsteps, every; /* a checkpoint every `every` steps */
};

/* Step i's byte at guest offset o: runs of equal bytes (compressible), or
 * for every fourth step noise (stored as it is when compressed). */
static uint8_t content(unsigned i, uint64_t o)
{
    if (i % 4 == 3) {
        uint64_t x = (o + 1) * 0x9e3779b97f4a7c15ull ^ (i + 1) * 0xbf58476d1ce4e5b9ull;
        x ^= x >> 29;
        x *= 0x94d049bb133111ebull;
        return (uint8_t)(x >> 32);
    }
    return (uint8_t)((o / 64) * 13 + i * 29 + 1);
}

static uint64_t rand_below(uint64_t *state, uint64_t n)
{
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return *state % n;
}

/* Steps of data and zeros.  Uncompressed: anywhere, overlapping.
 * Compressed: data steps on disjoint runs of whole clusters (a compressed
 * cluster is written once), in shuffled order; zero steps anywhere inside
 * runs already written. */
static struct step *make_steps(const struct config *c)
{
    struct step *steps = calloc(c->nsteps, sizeof *steps);
    CHECK(steps, "calloc");
    uint64_t r = 0x1234567 + c->cluster_size + c->size + (uint64_t)c->compress * 77;
    uint64_t cs = c->cluster_size, clusters = c->size / cs;
    uint64_t *runs = calloc(clusters, sizeof *runs), nruns = 0;
    CHECK(runs, "calloc");
    for (uint64_t k = 0; k < clusters;) {
        uint64_t n = 1 + rand_below(&r, 3);
        if (n > clusters - k)
            n = clusters - k;
        runs[nruns++] = k << 8 | n;
        k += n;
    }
    for (uint64_t k = nruns; k > 1; k--) {
        uint64_t j = rand_below(&r, k), t = runs[k - 1];
        runs[k - 1] = runs[j];
        runs[j] = t;
    }
    uint64_t used = 0;
    for (unsigned i = 0; i < c->nsteps; i++) {
        struct step *s = &steps[i];
        s->zero = i % 5 == 4;
        if (c->compress && !s->zero) {
            CHECK(used < nruns, "too many steps for %s", c->name);
            s->off = (runs[used] >> 8) * cs;
            s->len = (runs[used] & 0xff) * cs;
            used++;
        } else if (c->compress) {
            uint64_t run = runs[rand_below(&r, used)];
            uint64_t start = (run >> 8) * cs, len = (run & 0xff) * cs;
            s->off = start + rand_below(&r, len);
            s->len = 1 + rand_below(&r, start + len - s->off);
        } else {
            s->off = rand_below(&r, c->size);
            s->len = 1 + rand_below(&r, 3 * cs < c->size - s->off ? 3 * cs : c->size - s->off);
        }
    }
    free(runs);
    return steps;
}

static void apply(uint8_t *disk, const struct step *s, unsigned i)
{
    for (uint64_t o = s->off; o < s->off + s->len; o++)
        disk[o] = s->zero ? 0 : content(i, o);
}

static void must(int ret, const struct ic_error *err, const char *what)
{
    CHECK(ret >= 0, "%s: %s (%s)", what, err->msg, strerror(err->errnum));
}

/* must() for any thread (CHECK counts its checks in a plain global) */
static void must_any(int ret, const struct ic_error *err, const char *what)
{
    if (ret < 0) {
        fprintf(stderr, "%s: %s (%s)\n", what, err->msg, strerror(err->errnum));
        exit(1);
    }
}

static void write_step(struct ic_image *img, const struct step *s, unsigned i)
{
    struct ic_error err = {0};
    if (s->zero) {
        must_any(ic_image_zero(img, s->off, s->len, IC_ZERO_MAY_UNMAP, &err), &err, "zero");
        return;
    }
    uint8_t *buf = malloc(s->len);
    if (!buf)
        abort();
    for (uint64_t o = 0; o < s->len; o++)
        buf[o] = content(i, s->off + o);
    must_any(ic_image_pwrite(img, buf, s->len, s->off, &err), &err, "write");
    free(buf);
}

static void create_options(const struct config *c, struct ic_create_options *o)
{
    memset(o, 0, sizeof *o);
    o->cluster_size = c->cluster_size;
    o->compat_v2 = c->compat_v2;
    o->compress = c->compress;
}

/* The child: every step, a checkpoint every `every` steps (reporting how
 * many steps were done before it began), a last one, then finish. */
static void writer(const struct config *c, const struct step *steps, const char *path, int fd)
{
    struct ic_error err = {0};
    struct ic_create_options o;
    struct ic_image *img;
    int fresh;
    create_options(c, &o);
    must(ic_image_create(path, "qcow2", c->size, 0, &o, &img, &fresh, &err), &err, "create");
    for (unsigned i = 0; i <= c->nsteps; i++) {
        if (i % c->every == 0 || i == c->nsteps) {
            uint32_t done = i;
            must(ic_image_checkpoint(img, &err), &err, "checkpoint");
            CHECK(write(fd, &done, sizeof done) == sizeof done, "report");
        }
        if (i < c->nsteps)
            write_step(img, &steps[i], i);
    }
    must(ic_image_finish(img, 1, &err), &err, "finish");
    ic_image_close(img);
}

/* The parent's part: resume after a crash that `done` steps were recorded
 * before. */
static void resume(const struct config *c, const struct step *steps, const char *path,
                   uint32_t done, const uint8_t *expected, uint8_t *scratch, const char *what)
{
    struct ic_error err = {0};
    struct ic_image *img;
    crash_at = 0;
    if (ic_image_open(path, "qcow2", IC_OPEN_RDWR | IC_OPEN_RESUME, &img, &err) < 0) {
        CHECK(done == 0, "%s: resuming after %u steps recorded: %s", what, done, err.msg);
        CHECK(err.kind == IC_ERR_FORMAT, "%s: %s", what, err.msg);
        return;
    }
    /* what was recorded is there, where no later step may have changed it */
    memset(scratch, 0, c->size);
    for (unsigned i = 0; i < done; i++)
        apply(scratch, &steps[i], i);
    uint8_t *now = malloc(c->size), *later = calloc(1, c->size);
    CHECK(now && later, "malloc");
    for (unsigned i = done; i < c->nsteps; i++)
        memset(later + steps[i].off, 1, steps[i].len);
    must(ic_image_pread(img, now, c->size, 0, &err), &err, "read the resumed image");
    for (uint64_t o = 0; o < c->size; o++)
        CHECK(later[o] || now[o] == scratch[o], "%s: %u steps recorded, byte %llu is %u, not %u",
              what, done, (unsigned long long)o, now[o], scratch[o]);
    free(later);
    for (unsigned i = done; i < c->nsteps; i++)
        write_step(img, &steps[i], i);
    must(ic_image_finish(img, 1, &err), &err, "finish the resumed image");
    ic_image_close(img);

    /* complete, consistent, and what the steps wrote */
    must(ic_image_open(path, "qcow2", 0, &img, &err), &err, "open the finished image");
    check_image_clean(img, what);
    must(ic_image_pread(img, now, c->size, 0, &err), &err, "read the finished image");
    for (uint64_t o = 0; o < c->size; o++)
        CHECK(now[o] == expected[o], "%s: byte %llu is %u, not %u", what,
              (unsigned long long)o, now[o], expected[o]);
    free(now);
    ic_image_close(img);
}

/* Crash the writer at each of its changes of the file, each way. */
static unsigned crash_everywhere(const struct config *c, const char *path)
{
    struct step *steps = make_steps(c);
    uint8_t *expected = calloc(1, c->size), *scratch = malloc(c->size);
    CHECK(expected && scratch, "calloc");
    for (unsigned i = 0; i < c->nsteps; i++)
        apply(expected, &steps[i], i);
    unsigned runs = 0;
    for (long n = 1;; n += CRASH_STRIDE) {
        int completed = 0;
        for (int kind = 0; kind < NKINDS; kind++) {
            /* a kill at every change; a power cut, whole or torn, in turn
             * (both at every change with IMGCOPY_THOROUGH set) */
            if (kind != KEEP_ALL && kind != LOSE_ALL + n % 2 && !getenv("IMGCOPY_THOROUGH"))
                continue;
            int pipefd[2];
            CHECK(truncate(path, 0) == 0, "truncate: %s", strerror(errno)); /* a new file */
            CHECK(pipe(pipefd) == 0, "pipe");
            fflush(NULL);
            pid_t pid = fork();
            CHECK(pid >= 0, "fork");
            if (pid == 0) {
                close(pipefd[0]);
                crash_at = n;
                crash_kind = (enum crash_kind)kind;
                rng = 0x2545f4914f6cdd1dull * (uint64_t)n + (uint64_t)kind;
                changes = 0;
                durable_size = 0;
                writer(c, steps, path, pipefd[1]);
                _exit(0);
            }
            close(pipefd[1]);
            uint32_t done = 0, v;
            while (read(pipefd[0], &v, sizeof v) == sizeof v)
                done = v;
            close(pipefd[0]);
            int status;
            CHECK(waitpid(pid, &status, 0) == pid, "waitpid");
            CHECK((WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) ||
                      (WIFEXITED(status) && WEXITSTATUS(status) == 0),
                  "%s: the writer failed (status %#x) at change %ld", c->name, status, n);
            completed = WIFEXITED(status);
            char what[160];
            snprintf(what, sizeof what, "%s, %s at change %ld", c->name, kind_names[kind], n);
            resume(c, steps, path, done, expected, scratch, what);
            runs++;
            if (completed)
                break; /* past the last change: every kind is the same */
        }
        if (completed)
            break;
    }
    free(steps);
    free(expected);
    free(scratch);
    return runs;
}

/* ---- writes and checkpoints in threads ------------------------------------ */

struct shared {
    struct ic_image *img;
    const struct step *steps;
    unsigned nsteps, nthreads;
    atomic_uint next;
    atomic_int writing;
};

static void *write_thread(void *arg)
{
    struct shared *sh = arg;
    for (unsigned i; (i = atomic_fetch_add(&sh->next, 1)) < sh->nsteps;)
        write_step(sh->img, &sh->steps[i], i);
    atomic_fetch_sub(&sh->writing, 1);
    return NULL;
}

static void *checkpoint_thread(void *arg)
{
    struct shared *sh = arg;
    struct ic_error err = {0};
    while (atomic_load(&sh->writing) > 0)
        must_any(ic_image_checkpoint(sh->img, &err), &err, "checkpoint");
    return NULL;
}

static void threaded(const char *path, int compress)
{
    const uint64_t cs = 4096, size = 8u << 20;
    const unsigned nsteps = 256, nthreads = 4;
    struct step *steps = calloc(nsteps, sizeof *steps);
    uint8_t *expected = calloc(1, size), *now = malloc(size);
    CHECK(steps && expected && now, "calloc");
    /* disjoint: the threads write them in any order */
    for (unsigned i = 0; i < nsteps; i++) {
        steps[i].off = (uint64_t)i * (size / nsteps);
        steps[i].len = compress ? 3 * cs : 3 * cs + 100 + i;
        apply(expected, &steps[i], i);
    }
    struct ic_error err = {0};
    struct ic_create_options o = {.cluster_size = cs, .compress = compress};
    int fresh;
    struct shared sh = {.steps = steps, .nsteps = nsteps, .nthreads = nthreads};
    atomic_init(&sh.next, 0);
    atomic_init(&sh.writing, (int)nthreads);
    must(ic_image_create(path, "qcow2", size, 0, &o, &sh.img, &fresh, &err), &err, "create");
    pthread_t t[8];
    for (unsigned k = 0; k < nthreads; k++)
        CHECK(pthread_create(&t[k], NULL, write_thread, &sh) == 0, "pthread_create");
    pthread_t ck;
    CHECK(pthread_create(&ck, NULL, checkpoint_thread, &sh) == 0, "pthread_create");
    for (unsigned k = 0; k < nthreads; k++)
        pthread_join(t[k], NULL);
    pthread_join(ck, NULL);
    must(ic_image_checkpoint(sh.img, &err), &err, "checkpoint");
    ic_image_close(sh.img); /* unfinished, as a crash leaves it after a checkpoint */

    struct ic_image *img;
    must(ic_image_open(path, "qcow2", IC_OPEN_RDWR | IC_OPEN_RESUME, &img, &err), &err,
         "resume");
    must(ic_image_pread(img, now, size, 0, &err), &err, "read");
    CHECK(memcmp(now, expected, size) == 0, "threaded writes with checkpoints: content");
    must(ic_image_finish(img, 1, &err), &err, "finish");
    struct ic_check_result r;
    must(ic_image_check(img, &r, &err), &err, "check");
    CHECK(r.corruptions == 0 && r.leaks == 0, "threaded: %llu corruptions, %llu leaks:\n%s",
          (unsigned long long)r.corruptions, (unsigned long long)r.leaks,
          r.messages ? r.messages : "");
    ic_check_result_free(&r);
    ic_image_close(img);
    free(steps);
    free(expected);
    free(now);
}

int main(void)
{
    char dir[] = "/tmp/imgcopy-test-resume-XXXXXX";
    CHECK(mkdtemp(dir), "mkdtemp: %s", strerror(errno));
    char path[sizeof dir + 16];
    snprintf(path, sizeof path, "%s/d.qcow2", dir);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
    CHECK(fd >= 0, "open: %s", strerror(errno));
    struct stat st;
    CHECK(fstat(fd, &st) == 0, "fstat");
    close(fd);
    target_dev = st.st_dev;
    target_ino = st.st_ino;

    static const struct config configs[] = {
        /* 512-byte clusters: an L2 table covers 32 KiB, the disk 8 of them */
        {"v3, 512 B clusters", 512, 256u << 10, 0, 0, 15, 3},
        {"v2, 512 B clusters", 512, 256u << 10, 1, 0, 12, 4},
        {"v3, 64 KiB clusters, compressed", 65536, 2u << 20, 0, 1, 10, 2},
        {"v2, 4 KiB clusters, compressed", 4096, 1u << 20, 1, 1, 12, 3},
    };
    unsigned runs = 0;
    for (size_t i = 0; i < sizeof configs / sizeof configs[0]; i++) {
        unsigned n = crash_everywhere(&configs[i], path);
        if (getenv("IMGCOPY_THOROUGH"))
            printf("%s: %u crashes\n", configs[i].name, n);
        runs += n;
    }
    threaded(path, 0);
    threaded(path, 1);
    unlink(path);
    rmdir(dir);
    printf("test_qcow2_resume: %u crashes resumed, threaded checkpoints passed\n", runs);
    return 0;
}
