/* Two images compared as qemu-img compare compares them.  qemu walks both
 * images in steps whose boundaries come from block status (both images'
 * extents, reads capped at 2 MiB), and reports the first differing 512-byte
 * sector counted from the start of the step it is in, so the walk here
 * cuts exactly the same steps; that makes the offset it prints depend on
 * nothing but the images.  Steps are cut in order under a lock (block
 * status is cached, so cheap) and read by N workers; an outcome (a
 * mismatch, a failure) belongs to its step, and the one of the earliest
 * step wins: nothing after a known outcome is read, nothing before it is
 * skipped. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "image.h"
#include "job.h"

#define STEP_MAX (2u << 20) /* qemu-img's IO_BUF_SIZE */
#define REMOTE_BYTES_IN_FLIGHT (64ull << 20)
#define SECTOR 512u

struct layer;

/* What step a worker is handed. */
enum step_kind { STEP_BOTH, STEP_ONE, STEP_NONE };

struct step {
    uint64_t seq, off, len;
    enum step_kind kind;
    int which;   /* STEP_ONE: the image read and checked for zeros */
    int in_tail; /* past the smaller image: only the larger is read */
};

struct outcome {
    int known;
    uint64_t seq;
    struct ic_compare_result res; /* outcome, offset, in_tail, failure */
    struct ic_error err;
};

struct ic_compare {
    struct ic_image *img[2];
    struct layer *layers[2]; /* each image's chain, top first */
    size_t nlayers[2];
    uint64_t qlen[2]; /* qemu's lengths: raw files rounded up to sectors */
    int strict;

    pthread_mutex_t lock;
    struct ic_job *job;
    uint64_t cursor, next_seq;
    int planning_done;
    struct outcome best;
    uint64_t bytes_read[2];

    /* qemu-img -p's reports, as its float arithmetic makes them, each
     * made after the step `seq` (shown if no outcome came before) */
    int log_progress;
    float current, last_print;
    struct ic_compare_progress *prog;
    uint64_t *prog_seq;
    size_t nprog, prog_cap;
    int prog_failed;
    /* reports handed to options.report as they become final: once every
     * step before theirs is done without an outcome */
    void (*report)(void *ctx, const struct ic_compare_progress *p);
    void *report_ctx;
    size_t prog_emitted;
    /* steps cut that may still have an outcome: queued or being read */
    uint64_t *unfinished;
    size_t nunfinished, unfinished_cap;
    uint8_t *(*buffers)[2]; /* per slot: a step of each image */
    struct pending *pending; /* per slot: its asynchronous reads */
    unsigned nslots;
    int aio; /* an image reads asynchronously: reads wait in no thread */
};

/* A slot's step whose reads went out asynchronously (a remote image): the
 * step is judged once both are in. */
struct pending {
    struct ic_compare *c;
    unsigned slot;
    atomic_uint reads;  /* not answered yet, plus one while submitting */
    atomic_int failed[2];
    struct ic_error err[2];
    struct read_of {
        struct pending *p;
        int which; /* the image */
    } of[2];
};

/* qemu's block status flags, bdrv_block_status_above()'s answer. */
enum {
    Q_DATA = 0x01,
    Q_ZERO = 0x02,
    Q_OFFSET_VALID = 0x04,
    Q_ALLOCATED = 0x10,
    Q_EOF = 0x20,
};

/* How qemu's driver of a layer cuts block status answers (7.2). */
enum layer_kind {
    LAYER_PLAIN, /* as imgcopy's extents: raw files, vpc                    */
    LAYER_QCOW2, /* never across an L2 table; compressed: a cluster a time  */
    LAYER_VMDK,  /* a grain a time                                          */
    LAYER_ALL_DATA, /* no block status in qemu (vhdx): all data, to the end */
};

struct layer {
    struct ic_image *img;
    uint64_t qlen;
    enum layer_kind kind;
    uint64_t cluster; /* qcow2, vmdk: cluster (grain) size; 0: none */
    uint64_t table;   /* qcow2: guest bytes one L2 table maps */
};

static void describe_layer(struct ic_image *img, struct layer *l)
{
    struct ic_image_info info;
    const char *fmt = ic_image_format(img);
    *l = (struct layer){.img = img, .qlen = ic_image_qemu_length(img), .kind = LAYER_PLAIN};
    ic_image_describe(img, &info);
    if (info.qemu_sees_all_data) {
        l->kind = LAYER_ALL_DATA;
        return;
    }
    if (strcmp(fmt, "qcow2") != 0 && strcmp(fmt, "vmdk") != 0)
        return;
    l->cluster = info.cluster_size;
    if (strcmp(fmt, "vmdk") == 0) {
        l->kind = LAYER_VMDK;
        return;
    }
    l->kind = LAYER_QCOW2;
    uint64_t entry = 8;
    for (size_t i = 0; i < info.nfields; i++)
        if (strcmp(info.fields[i].key, "extended-l2") == 0 && info.fields[i].number)
            entry = 16;
    l->table = l->cluster >= entry ? l->cluster / entry * l->cluster : 0;
}

static uint64_t to_boundary(uint64_t off, uint64_t unit)
{
    return unit ? unit - off % unit : UINT64_MAX;
}

/* The status word qemu gives the chain at `off` (layers[0] on top), and how
 * far it holds: bdrv_block_status_above(top, NULL, off, qlen - off).
 * imgcopy's extent says which layer answers and what; qemu's drivers cut
 * the answer shorter (an L2 table, a grain), each layer it asked on the way
 * down limiting the next. */
static int qemu_status(struct ic_compare *c, int which, uint64_t off, uint64_t *len,
                       unsigned *word, struct ic_error *err)
{
    const struct layer *layers = c->layers[which];
    size_t nlayers = c->nlayers[which];
    struct ic_image *img = layers[0].img;
    uint64_t qlen = layers[0].qlen, limit = UINT64_MAX;
    unsigned w;
    if (off >= ic_image_size(img)) {
        /* a raw file's last partial sector: a hole up to qemu's length */
        *len = qlen - off;
        *word = Q_ZERO | Q_OFFSET_VALID | Q_ALLOCATED | Q_EOF;
        return 0;
    }
    struct ic_extent e;
    if (ic_image_block_status(img, off, ic_image_size(img) - off, &e, err) < 0)
        return -1;
    w = ((e.flags & IC_EXT_DATA) ? Q_DATA : 0) | ((e.flags & IC_EXT_ZERO) ? Q_ZERO : 0) |
        ((e.flags & IC_EXT_OFFSET_VALID) ? Q_OFFSET_VALID : 0) |
        ((e.flags & IC_EXT_PRESENT) ? Q_ALLOCATED : 0);
    uint64_t n = e.length;
    /* a hole up to a raw file's end is one up to qemu's length (the file
     * driver answers a trailing hole with the whole request) */
    if (img->drv->kind == IC_PROTOCOL && !(e.flags & IC_EXT_DATA) &&
        off + n == ic_image_size(img))
        n = qlen - off;
    int exhausted = !(e.flags & IC_EXT_PRESENT); /* no layer holds it */
    /* the layers qemu asks: down to the one holding the range, or all */
    size_t last = exhausted ? nlayers - 1 : e.depth;
    for (size_t d = 0; d < nlayers && d <= last; d++) {
        const struct layer *l = &layers[d];
        if (off >= l->qlen) {
            /* past the end of a backing file: zeros "allocated" there */
            w = Q_ZERO | Q_ALLOCATED;
            exhausted = 0;
            break;
        }
        if (l->kind == LAYER_ALL_DATA) {
            w = Q_DATA | Q_ALLOCATED;
            n = l->qlen - off;
            exhausted = 0;
            break;
        }
        uint64_t cut = UINT64_MAX;
        if (l->kind == LAYER_QCOW2) {
            cut = to_boundary(off, l->table);
            if (d == e.depth && (e.flags & IC_EXT_COMPRESSED) && l->cluster)
                cut = to_boundary(off, l->cluster);
        } else if (l->kind == LAYER_VMDK) {
            cut = to_boundary(off, l->cluster);
        }
        if (cut < limit)
            limit = cut;
    }
    *len = n < limit ? n : limit;
    /* EOF: the answer reaches the top's end, or (no layer holding it) the
     * bottom layer's, whose flag qemu passes up */
    if (off + *len == qlen ||
        (exhausted && off + *len == layers[nlayers - 1].qlen))
        w |= Q_EOF;
    *word = w;
    return 0;
}

/* Record an outcome of step `seq` unless an earlier step has one (lock held). */
static void settle(struct ic_compare *c, uint64_t seq, const struct ic_compare_result *res,
                   const struct ic_error *err)
{
    if (c->best.known && c->best.seq <= seq)
        return;
    c->best.known = 1;
    c->best.seq = seq;
    c->best.res = *res;
    if (err)
        c->best.err = *err;
    else
        ic_error_clear(&c->best.err);
}

static void fail_at(struct ic_compare *c, uint64_t seq, int which, int step_kind, uint64_t off,
                    int in_tail, const struct ic_error *err)
{
    struct ic_compare_result r = {.outcome = IC_COMPARE_FAILED, .offset = off,
                                  .in_tail = in_tail, .failed_image = which,
                                  .failed_step = step_kind};
    settle(c, seq, &r, err);
}

/* qemu_progress_print(chunk / total * 100, 100) after step `seq`, with
 * qemu-img's min_skip of 2 (lock held). */
static void account_progress(struct ic_compare *c, uint64_t seq, uint64_t len, uint64_t total,
                             int in_tail)
{
    if (!c->log_progress)
        return;
    float delta = ((float)len / (float)total) * 100;
    float current = c->current + delta / 100 * 100;
    if (current > 100)
        current = 100;
    c->current = current;
    if (!(current > c->last_print + 2.0f || current == 100 || current == 0))
        return;
    c->last_print = current;
    if (c->nprog == c->prog_cap) {
        size_t cap = c->prog_cap ? 2 * c->prog_cap : 64;
        struct ic_compare_progress *p = realloc(c->prog, cap * sizeof *p);
        if (p)
            c->prog = p;
        uint64_t *q = p ? realloc(c->prog_seq, cap * sizeof *q) : NULL;
        if (q)
            c->prog_seq = q;
        if (!p || !q) {
            c->prog_failed = 1;
            return;
        }
        c->prog_cap = cap;
    }
    c->prog[c->nprog] = (struct ic_compare_progress){.percent = current, .in_tail = in_tail};
    c->prog_seq[c->nprog++] = seq;
}

/* Cut the next step that needs reading (steps that need none are passed
 * here), or settle the outcome planning finds: a strict status mismatch,
 * a block-status failure, or the end.  Lock held.  0: a step, 1: none. */
static int plan_step(struct ic_compare *c, struct step *s)
{
    uint64_t common = c->qlen[0] < c->qlen[1] ? c->qlen[0] : c->qlen[1];
    uint64_t total = c->qlen[0] < c->qlen[1] ? c->qlen[1] : c->qlen[0];
    int larger = c->qlen[0] < c->qlen[1];
    while (!c->planning_done) {
        uint64_t off = c->cursor, seq = c->next_seq++;
        struct ic_error err = {0};
        if (c->best.known && c->best.seq < seq) {
            c->planning_done = 1;
            break;
        }
        if (off >= total) {
            struct ic_compare_result r = {.outcome = IC_COMPARE_IDENTICAL};
            settle(c, seq, &r, NULL);
            c->planning_done = 1;
            break;
        }
        *s = (struct step){.seq = seq, .off = off, .kind = STEP_NONE};
        if (off < common) {
            uint64_t len[2];
            unsigned w[2];
            for (int i = 0; i < 2; i++) {
                if (qemu_status(c, i, off, &len[i], &w[i], &err) < 0) {
                    fail_at(c, seq, i, IC_COMPARE_FAIL_STATUS, off, 0, &err);
                    c->planning_done = 1;
                    return 1;
                }
            }
            s->len = len[0] < len[1] ? len[0] : len[1];
            if (c->strict && w[0] != w[1]) {
                struct ic_compare_result r = {.outcome = IC_COMPARE_STATUS, .offset = off};
                settle(c, seq, &r, NULL);
                c->planning_done = 1;
                return 1;
            }
            int a0 = (w[0] & Q_ALLOCATED) != 0, a1 = (w[1] & Q_ALLOCATED) != 0;
            if ((w[0] & w[1] & Q_ZERO) || (a0 == a1 && !a0)) {
                s->kind = STEP_NONE;
            } else if (a0 == a1) {
                /* both read in qemu; a side that is zero need not be */
                if (w[0] & Q_ZERO)
                    *s = (struct step){seq, off, s->len, STEP_ONE, 1, 0};
                else if (w[1] & Q_ZERO)
                    *s = (struct step){seq, off, s->len, STEP_ONE, 0, 0};
                else
                    s->kind = STEP_BOTH;
            } else {
                s->kind = STEP_ONE;
                s->which = a0 ? 0 : 1;
            }
        } else {
            uint64_t len;
            unsigned w;
            s->in_tail = 1;
            if (qemu_status(c, larger, off, &len, &w, &err) < 0) {
                fail_at(c, seq, larger, IC_COMPARE_FAIL_STATUS, off, 1, &err);
                c->planning_done = 1;
                return 1;
            }
            s->len = len;
            if ((w & Q_ALLOCATED) && !(w & Q_ZERO)) {
                s->kind = STEP_ONE;
                s->which = larger;
            }
        }
        if (s->kind != STEP_NONE && s->len > STEP_MAX)
            s->len = STEP_MAX;
        c->cursor = off + s->len;
        account_progress(c, seq, s->len, total, s->in_tail);
        if (s->kind != STEP_NONE)
            return 0;
    }
    return 1;
}

/* Reads as qemu reads: past a raw file's end, up to its length rounded to
 * sectors, zeros. */
static int read_q(struct ic_compare *c, int which, uint8_t *buf, uint64_t off, uint64_t len,
                  struct ic_error *err)
{
    uint64_t size = ic_image_size(c->img[which]);
    uint64_t n = off >= size ? 0 : (size - off < len ? size - off : len);
    if (n && ic_image_pread(c->img[which], buf, (size_t)n, off, err) < 0)
        return -1;
    memset(buf + n, 0, (size_t)(len - n));
    return 0;
}

/* The first 512-byte sector (from the step's start) where a and b differ,
 * or that holds a non-zero byte when b is NULL; `len` when none. */
static uint64_t first_difference(const uint8_t *a, const uint8_t *b, uint64_t len)
{
    if (b ? memcmp(a, b, (size_t)len) == 0 : ic_is_zero(a, (size_t)len))
        return len;
    for (uint64_t i = 0; i < len; i += SECTOR) {
        size_t n = (size_t)(len - i < SECTOR ? len - i : SECTOR);
        if (b ? memcmp(a + i, b + i, n) != 0 : !ic_is_zero(a + i, n))
            return i;
    }
    return len;
}

/* Hand on the reports of steps before `limit` (lock held). */
static void emit_reports(struct ic_compare *c, uint64_t limit)
{
    if (!c->report)
        return;
    while (c->prog_emitted < c->nprog && c->prog_seq[c->prog_emitted] < limit)
        c->report(c->report_ctx, &c->prog[c->prog_emitted++]);
}

/* The first step that may still have an outcome (lock held). */
static uint64_t watermark(const struct ic_compare *c)
{
    uint64_t m = c->next_seq;
    for (size_t i = 0; i < c->nunfinished; i++)
        if (c->unfinished[i] < m)
            m = c->unfinished[i];
    if (c->best.known && c->best.seq < m)
        m = c->best.seq;
    return m;
}

/* Read a step and find its first differing sector.  The step is read in
 * pieces, each compared while it is still in the CPU's cache; what qemu
 * reads whole (the first image, then the second) is still read to the end
 * after a difference, so that a read error is reported where qemu's
 * would be.  Returns the image that failed, or -1. */
#define PIECE (256u << 10)
static int read_step(struct ic_compare *c, uint8_t *const buf[2], const struct step *s,
                     uint64_t *diff, struct ic_error *err)
{
    int both = s->kind == STEP_BOTH;
    int first = both ? 0 : s->which, second = both ? 1 : -1;
    int failed[2] = {0, 0};
    struct ic_error err2 = {0};
    *diff = s->len;
    for (uint64_t pos = 0; pos < s->len; pos += PIECE) {
        uint64_t n = s->len - pos < PIECE ? s->len - pos : PIECE;
        if (!failed[0] && read_q(c, first, buf[0] + pos, s->off + pos, n, err) < 0)
            failed[0] = 1;
        if (both && !failed[1] && read_q(c, second, buf[1] + pos, s->off + pos, n, &err2) < 0)
            failed[1] = 1;
        if (failed[0] || failed[1] || *diff < s->len)
            continue;
        uint64_t d = first_difference(buf[0] + pos, both ? buf[1] + pos : NULL, n);
        if (d < n)
            *diff = pos + d;
    }
    if (failed[0])
        return first;
    if (failed[1]) {
        *err = err2;
        return second;
    }
    return -1;
}

/* A step is done: it can have no outcome any more (lock held). */
static void step_finished(struct ic_compare *c, uint64_t seq)
{
    for (size_t i = 0; i < c->nunfinished; i++)
        if (c->unfinished[i] == seq) {
            c->unfinished[i] = c->unfinished[--c->nunfinished];
            break;
        }
    emit_reports(c, watermark(c));
}

/* The job's planner: steps in order, until an outcome is known. */
static int plan_steps(struct ic_job *job, void *ctx, struct ic_error *err)
{
    (void)err; /* a block-status failure is an outcome of its step */
    struct ic_compare *c = ctx;
    while (!ic_job_stopped(job)) {
        struct step s;
        pthread_mutex_lock(&c->lock);
        int none = plan_step(c, &s);
        if (!none)
            c->unfinished[c->nunfinished++] = s.seq;
        emit_reports(c, watermark(c));
        pthread_mutex_unlock(&c->lock);
        if (none)
            break;
        if (ic_job_push(job, &s) < 0) {
            pthread_mutex_lock(&c->lock);
            step_finished(c, s.seq);
            pthread_mutex_unlock(&c->lock);
            break;
        }
    }
    return 0;
}

/* The step's outcome, once read (`failed`: the image whose read failed,
 * or -1; `diff`: its first differing sector, or its length). */
static void judge_step(struct ic_compare *c, const struct step *s, int moot, int failed,
                       uint64_t diff, const struct ic_error *err)
{
    pthread_mutex_lock(&c->lock);
    if (moot) {
        /* nothing read */
    } else if (s->kind == STEP_BOTH) {
        c->bytes_read[0] += failed == 0 ? 0 : s->len;
        c->bytes_read[1] += failed < 0 ? s->len : 0;
    } else if (failed < 0) {
        c->bytes_read[s->which] += s->len;
    }
    if (failed >= 0) {
        fail_at(c, s->seq, failed, IC_COMPARE_FAIL_READ, s->off, s->in_tail, err);
    } else if (diff < s->len) {
        struct ic_compare_result r = {.outcome = IC_COMPARE_CONTENT, .offset = s->off + diff,
                                      .in_tail = s->in_tail};
        settle(c, s->seq, &r, NULL);
    }
    step_finished(c, s->seq);
    pthread_mutex_unlock(&c->lock);
    ic_job_add_progress(c->job, s->len);
}

/* The images a step reads, first to last */
static int step_images(const struct step *s, int which[2])
{
    if (s->kind == STEP_BOTH) {
        which[0] = 0;
        which[1] = 1;
        return 2;
    }
    which[0] = s->which;
    return 1;
}

static void read_done(void *ctx, const struct ic_error *err)
{
    struct read_of *of = ctx;
    struct pending *p = of->p;
    if (err) {
        p->err[of->which] = *err;
        atomic_store(&p->failed[of->which], 1);
    }
    if (atomic_fetch_sub(&p->reads, 1) == 1)
        ic_job_item_resume(p->c->job, p->slot);
}

/* Each read of the step, as qemu reads (zeros past a raw file's end):
 * asynchronously where the image can (a remote one), else at once.  1:
 * some are out (read_done resumes the slot once all are in); 0: all are
 * in (a failure in p->failed), judge the step now. */
static int submit_step(struct ic_compare *c, unsigned slot, const struct step *s)
{
    struct pending *p = &c->pending[slot];
    int which[2], n = step_images(s, which);
    atomic_store(&p->reads, 1);
    for (int k = 0; k < n; k++) {
        int i = which[k];
        atomic_store(&p->failed[i], 0);
        uint8_t *buf = c->buffers[slot][k];
        uint64_t size = ic_image_size(c->img[i]);
        uint64_t len = s->off >= size ? 0 : (size - s->off < s->len ? size - s->off : s->len);
        memset(buf + len, 0, (size_t)(s->len - len));
        int r = 0;
        if (len && ic_image_aio_reads(c->img[i])) {
            atomic_fetch_add(&p->reads, 1);
            r = ic_image_aio_pread(c->img[i], buf, (size_t)len, s->off, read_done, &p->of[i],
                                   &p->err[i]);
            if (r <= 0)
                atomic_fetch_sub(&p->reads, 1);
        }
        if (r == 0 && len && ic_image_pread(c->img[i], buf, (size_t)len, s->off, &p->err[i]) < 0)
            r = -1;
        if (r < 0)
            atomic_store(&p->failed[i], 1);
    }
    /* the last answer may have come already: then nobody resumes us */
    return atomic_fetch_sub(&p->reads, 1) != 1;
}

static int read_and_compare(void *ctx, unsigned slot, void *item, struct ic_error *unused)
{
    (void)unused; /* a failure is an outcome of its step, not the job's */
    struct ic_compare *c = ctx;
    const struct step s = *(const struct step *)item;
    pthread_mutex_lock(&c->lock);
    int moot = c->best.known && c->best.seq < s.seq; /* an earlier outcome wins */
    pthread_mutex_unlock(&c->lock);
    if (!moot && c->aio && submit_step(c, slot, &s) > 0)
        return IC_JOB_PENDING;
    struct ic_error err = {0};
    uint64_t diff = s.len;
    int failed = -1;
    if (!moot && c->aio) { /* read at once, synchronously or not */
        int which[2], n = step_images(&s, which);
        for (int k = 0; k < n && failed < 0; k++)
            if (atomic_load(&c->pending[slot].failed[which[k]])) {
                failed = which[k];
                err = c->pending[slot].err[which[k]];
            }
        if (failed < 0)
            diff = first_difference(c->buffers[slot][0],
                                    n == 2 ? c->buffers[slot][1] : NULL, s.len);
    } else if (!moot) {
        failed = read_step(c, c->buffers[slot], &s, &diff, &err);
    }
    judge_step(c, &s, moot, failed, diff, &err);
    return 0;
}

/* Every asynchronous read of a slot's step is in */
static int compare_resumed(void *ctx, unsigned slot, void *item, struct ic_error *unused)
{
    (void)unused;
    struct ic_compare *c = ctx;
    const struct step s = *(const struct step *)item;
    struct pending *p = &c->pending[slot];
    int which[2], n = step_images(&s, which);
    int failed = -1;
    struct ic_error err = {0};
    uint64_t diff = s.len;
    for (int k = 0; k < n && failed < 0; k++)
        if (atomic_load(&p->failed[which[k]])) {
            failed = which[k];
            err = p->err[which[k]];
        }
    if (failed < 0)
        diff = first_difference(c->buffers[slot][0], n == 2 ? c->buffers[slot][1] : NULL,
                                s.len);
    judge_step(c, &s, 0, failed, diff, &err);
    return 0;
}

static void drop_step(void *ctx, void *item)
{
    struct ic_compare *c = ctx;
    pthread_mutex_lock(&c->lock);
    step_finished(c, ((const struct step *)item)->seq);
    pthread_mutex_unlock(&c->lock);
}

static const struct ic_job_ops compare_ops = {
    .item_size = sizeof(struct step),
    .plan = plan_steps,
    .run = read_and_compare,
    .resume = compare_resumed,
    .discard = drop_step,
};

void ic_compare_options_init(struct ic_compare_options *o)
{
    memset(o, 0, sizeof *o);
    o->concurrency = 4;
}

static void free_compare(struct ic_compare *c)
{
    ic_job_free(c->job);
    for (unsigned i = 0; c->buffers && i < c->nslots; i++) {
        free(c->buffers[i][0]);
        free(c->buffers[i][1]);
    }
    free(c->buffers);
    free(c->pending);
    pthread_mutex_destroy(&c->lock);
    free(c->prog);
    free(c->prog_seq);
    free(c->layers[0]);
    free(c->layers[1]);
    free(c->unfinished);
    free(c);
}

int ic_compare_start(struct ic_image *a, struct ic_image *b, const struct ic_compare_options *opt,
                     struct ic_compare **out, struct ic_error *err)
{
    *out = NULL;
    if (opt->concurrency < 1 || opt->concurrency > 64)
        return ic_error_value(err, "concurrency must be 1 to 64, not %u", opt->concurrency);
    struct ic_compare *c = calloc(1, sizeof *c);
    if (!c)
        return ic_error_nomem(err);
    if (pthread_mutex_init(&c->lock, NULL)) {
        free(c);
        return ic_error_nomem(err);
    }
    c->img[0] = a;
    c->img[1] = b;
    c->qlen[0] = ic_image_qemu_length(a);
    c->qlen[1] = ic_image_qemu_length(b);
    c->strict = opt->strict;
    c->log_progress = opt->progress;
    c->report = opt->progress ? opt->report : NULL;
    c->report_ctx = opt->report_ctx;
    for (int i = 0; i < 2; i++) {
        size_t n = 0;
        for (struct ic_image *l = c->img[i]; l; l = ic_image_backing(l))
            n++;
        c->layers[i] = calloc(n, sizeof *c->layers[i]);
        if (!c->layers[i]) {
            free_compare(c);
            return ic_error_nomem(err);
        }
        c->nlayers[i] = n;
        n = 0;
        for (struct ic_image *l = c->img[i]; l; l = ic_image_backing(l))
            describe_layer(l, &c->layers[i][n++]);
    }
    if (c->strict && c->qlen[0] != c->qlen[1]) {
        /* decided before anything is read: no job */
        c->best = (struct outcome){.known = 1, .res = {.outcome = IC_COMPARE_SIZE}};
        *out = c;
        return 0;
    }
    /* a remote image's steps are in flight by its connections' measure
     * (two buffers of a step each, within REMOTE_BYTES_IN_FLIGHT), not
     * the threads' */
    unsigned n = opt->concurrency;
    c->aio = ic_image_aio_reads(a) || ic_image_aio_reads(b);
    if (c->aio) {
        unsigned ra = ic_image_requests_in_flight(a), rb = ic_image_requests_in_flight(b);
        uint64_t remote = ra > rb ? ra : rb, by_memory = REMOTE_BYTES_IN_FLIGHT / (2 * STEP_MAX);
        if (remote > by_memory)
            remote = by_memory;
        if (remote > n)
            n = (unsigned)remote;
    }
    size_t depth = 2 * (size_t)n;
    c->unfinished_cap = depth + n + 1;
    c->unfinished = calloc(c->unfinished_cap, sizeof *c->unfinished);
    c->buffers = calloc(n, sizeof *c->buffers);
    for (; c->buffers && c->nslots < n; c->nslots++) {
        c->buffers[c->nslots][0] = malloc(STEP_MAX);
        c->buffers[c->nslots][1] = malloc(STEP_MAX);
        if (!c->buffers[c->nslots][0] || !c->buffers[c->nslots][1]) {
            c->nslots++;
            break;
        }
    }
    c->pending = calloc(n, sizeof *c->pending);
    for (unsigned i = 0; c->pending && i < n; i++) {
        struct pending *p = &c->pending[i];
        p->c = c;
        p->slot = i;
        for (int k = 0; k < 2; k++)
            p->of[k] = (struct read_of){p, k};
    }
    if (!c->unfinished || !c->buffers || !c->pending || !c->buffers[n - 1][1]) {
        free_compare(c);
        return ic_error_nomem(err);
    }
    uint64_t total = c->qlen[0] < c->qlen[1] ? c->qlen[1] : c->qlen[0];
    struct ic_job_params params = {.concurrency = n, .queue_depth = depth, .total = total,
                                   .pool = opt->pool, .threads = opt->concurrency};
    if (ic_job_start(&compare_ops, c, &params, &c->job, err) < 0) {
        free_compare(c);
        return -1;
    }
    *out = c;
    return 0;
}

struct ic_job *ic_compare_job(struct ic_compare *cmp)
{
    return cmp->job;
}

int ic_compare_finish(struct ic_compare *cmp, struct ic_compare_result *out,
                      struct ic_error *err)
{
    struct ic_compare *c = cmp;
    memset(out, 0, sizeof *out);
    int ret = c->job ? ic_job_finish(c->job, err) : 0;
    if (ret < 0 && err && err->errnum == ECANCELED)
        ic_error_os(err, ECANCELED, NULL, "compare cancelled");
    if (ret == 0) {
        if (c->best.known)
            emit_reports(c, c->best.seq);
        int size_mismatch = c->qlen[0] != c->qlen[1];
        *out = c->best.res;
        out->size_a = c->qlen[0];
        out->size_b = c->qlen[1];
        out->size_mismatch = size_mismatch;
        out->warned = size_mismatch && (out->outcome == IC_COMPARE_IDENTICAL || out->in_tail);
        out->identical = out->outcome == IC_COMPARE_IDENTICAL;
        out->bytes_read_a = c->bytes_read[0];
        out->bytes_read_b = c->bytes_read[1];
        if (c->prog_failed) {
            ret = ic_error_nomem(err);
            out->outcome = 0;
        }
        size_t shown = 0;
        while (shown < c->nprog && c->prog_seq[shown] < c->best.seq)
            shown++;
        if (shown) {
            out->progress = c->prog;
            out->nprogress = shown;
            c->prog = NULL;
        }
        if (ret == 0 && out->outcome == IC_COMPARE_FAILED) {
            *err = c->best.err;
            ret = -1;
        }
    }
    free_compare(c);
    return ret;
}

int ic_compare(struct ic_image *a, struct ic_image *b, const struct ic_compare_options *opt,
               struct ic_compare_result *out, struct ic_error *err)
{
    struct ic_compare *c;
    memset(out, 0, sizeof *out);
    if (ic_compare_start(a, b, opt, &c, err) < 0)
        return -1;
    return ic_compare_finish(c, out, err);
}

void ic_compare_result_free(struct ic_compare_result *r)
{
    free(r->progress);
    r->progress = NULL;
    r->nprogress = 0;
}
