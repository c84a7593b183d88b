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
#include <stdlib.h>
#include <string.h>

#include "image.h"

#define STEP_MAX (2u << 20) /* qemu-img's IO_BUF_SIZE */
#define SECTOR 512u

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

struct compare {
    struct ic_image *img[2];
    uint64_t qlen[2]; /* qemu's lengths: raw files rounded up to sectors */
    int strict;

    pthread_mutex_t lock;
    uint64_t cursor, next_seq;
    int planning_done;
    struct outcome best;
    uint64_t bytes_read[2];
};

/* qemu's block status flags, bdrv_block_status_above()'s answer. */
enum {
    Q_DATA = 0x01,
    Q_ZERO = 0x02,
    Q_OFFSET_VALID = 0x04,
    Q_ALLOCATED = 0x10,
    Q_EOF = 0x20,
};

/* Past the end of a backing file qemu synthesises zeros "allocated" in that
 * layer; ranges no layer holds, with no backing file below, are just zero. */
static int past_some_backing_end(const struct ic_image *img, uint64_t off)
{
    for (const struct ic_image *i = img; i->backing; i = i->backing)
        if (off >= ic_image_qemu_length(i->backing))
            return 1;
    return 0;
}

/* The status word qemu gives `img` at `off` over the whole chain, and how
 * far it holds (as bdrv_block_status_above(bs, NULL, off, qlen - off)). */
static int qemu_status(struct compare *c, int which, uint64_t off, uint64_t *len,
                       unsigned *word, struct ic_error *err)
{
    struct ic_image *img = c->img[which];
    uint64_t qlen = c->qlen[which];
    unsigned w;
    if (off >= ic_image_size(img)) {
        /* a raw file's last partial sector: a hole up to qemu's length */
        w = Q_ZERO | Q_OFFSET_VALID | Q_ALLOCATED;
        *len = qlen - off;
    } else {
        struct ic_extent e;
        if (ic_image_block_status(img, off, ic_image_size(img) - off, &e, err) < 0)
            return -1;
        w = ((e.flags & IC_EXT_DATA) ? Q_DATA : 0) | ((e.flags & IC_EXT_ZERO) ? Q_ZERO : 0) |
            ((e.flags & IC_EXT_OFFSET_VALID) ? Q_OFFSET_VALID : 0) |
            ((e.flags & IC_EXT_PRESENT) ? Q_ALLOCATED : 0);
        if (!(w & Q_ALLOCATED) && (w & Q_ZERO) && e.depth > 0 &&
            past_some_backing_end(img, off))
            w |= Q_ALLOCATED;
        *len = e.length;
    }
    if (off + *len == qlen)
        w |= Q_EOF;
    *word = w;
    return 0;
}

/* Record an outcome of step `seq` unless an earlier step has one (lock held). */
static void settle(struct compare *c, uint64_t seq, const struct ic_compare_result *res,
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

static void fail_at(struct compare *c, uint64_t seq, int which, int step_kind, uint64_t off,
                    int in_tail, const struct ic_error *err)
{
    struct ic_compare_result r = {.outcome = IC_COMPARE_FAILED, .offset = off,
                                  .in_tail = in_tail, .failed_image = which,
                                  .failed_step = step_kind};
    settle(c, seq, &r, err);
}

/* Cut the next step that needs reading (steps that need none are passed
 * here), or settle the outcome planning finds: a strict status mismatch,
 * a block-status failure, or the end.  Lock held.  0: a step, 1: none. */
static int plan_step(struct compare *c, struct step *s)
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
        if (s->kind != STEP_NONE)
            return 0;
    }
    return 1;
}

/* Reads as qemu reads: past a raw file's end, up to its length rounded to
 * sectors, zeros. */
static int read_q(struct compare *c, int which, uint8_t *buf, uint64_t off, uint64_t len,
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

struct worker_ctx {
    struct compare *c;
    uint8_t *buf[2];
};

static void *worker_main(void *arg)
{
    struct worker_ctx *w = arg;
    struct compare *c = w->c;
    struct step s;
    for (;;) {
        pthread_mutex_lock(&c->lock);
        int none = plan_step(c, &s);
        pthread_mutex_unlock(&c->lock);
        if (none)
            break;
        struct ic_error err = {0};
        uint64_t diff;
        int failed = -1;
        if (s.kind == STEP_BOTH) {
            if (read_q(c, 0, w->buf[0], s.off, s.len, &err) < 0)
                failed = 0;
            else if (read_q(c, 1, w->buf[1], s.off, s.len, &err) < 0)
                failed = 1;
            diff = failed < 0 ? first_difference(w->buf[0], w->buf[1], s.len) : 0;
        } else {
            if (read_q(c, s.which, w->buf[0], s.off, s.len, &err) < 0)
                failed = s.which;
            diff = failed < 0 ? first_difference(w->buf[0], NULL, s.len) : 0;
        }
        pthread_mutex_lock(&c->lock);
        if (s.kind == STEP_BOTH) {
            c->bytes_read[0] += failed == 0 ? 0 : s.len;
            c->bytes_read[1] += failed < 0 ? s.len : 0;
        } else if (failed < 0) {
            c->bytes_read[s.which] += s.len;
        }
        if (failed >= 0) {
            fail_at(c, s.seq, failed, IC_COMPARE_FAIL_READ, s.off, s.in_tail, &err);
        } else if (diff < s.len) {
            struct ic_compare_result r = {.outcome = IC_COMPARE_CONTENT, .offset = s.off + diff,
                                          .in_tail = s.in_tail};
            settle(c, s.seq, &r, NULL);
        }
        pthread_mutex_unlock(&c->lock);
    }
    return NULL;
}

void ic_compare_options_init(struct ic_compare_options *o)
{
    memset(o, 0, sizeof *o);
    o->concurrency = 4;
}

int ic_compare(struct ic_image *a, struct ic_image *b, const struct ic_compare_options *opt,
               struct ic_compare_result *out, struct ic_error *err)
{
    memset(out, 0, sizeof *out);
    if (opt->concurrency < 1 || opt->concurrency > 64)
        return ic_error_value(err, "concurrency must be 1 to 64, not %u", opt->concurrency);
    struct compare *c = calloc(1, sizeof *c);
    if (!c)
        return ic_error_nomem(err);
    c->img[0] = a;
    c->img[1] = b;
    c->qlen[0] = ic_image_qemu_length(a);
    c->qlen[1] = ic_image_qemu_length(b);
    c->strict = opt->strict;
    out->size_a = c->qlen[0];
    out->size_b = c->qlen[1];
    out->size_mismatch = c->qlen[0] != c->qlen[1];
    if (c->strict && out->size_mismatch) {
        free(c);
        out->outcome = IC_COMPARE_SIZE;
        return 0;
    }
    if (pthread_mutex_init(&c->lock, NULL)) {
        free(c);
        return ic_error_nomem(err);
    }
    unsigned n = opt->concurrency;
    struct worker_ctx *ws = calloc(n, sizeof *ws);
    pthread_t *tids = calloc(n, sizeof *tids);
    unsigned started = 0, ready = 0;
    int ret = 0;
    for (unsigned i = 0; ws && tids && i < n; i++, ready++) {
        ws[i].c = c;
        ws[i].buf[0] = malloc(STEP_MAX);
        ws[i].buf[1] = malloc(STEP_MAX);
        if (!ws[i].buf[0] || !ws[i].buf[1])
            break;
    }
    if (ready < n)
        ret = ic_error_nomem(err);
    /* the calling thread is the last worker */
    for (unsigned i = 0; ret == 0 && i + 1 < n; i++) {
        int e = pthread_create(&tids[i], NULL, worker_main, &ws[i]);
        if (e)
            ret = ic_error_os(err, e, NULL, "start compare thread");
        else
            started++;
    }
    if (ret == 0) {
        worker_main(&ws[n - 1]);
    } else {
        pthread_mutex_lock(&c->lock);
        c->planning_done = 1;
        pthread_mutex_unlock(&c->lock);
    }
    for (unsigned i = 0; i < started; i++)
        pthread_join(tids[i], NULL);
    if (ret == 0) {
        int size_mismatch = out->size_mismatch;
        *out = c->best.res;
        out->size_a = c->qlen[0];
        out->size_b = c->qlen[1];
        out->size_mismatch = size_mismatch;
        out->warned = size_mismatch && (out->outcome == IC_COMPARE_IDENTICAL || out->in_tail);
        out->identical = out->outcome == IC_COMPARE_IDENTICAL;
        out->bytes_read_a = c->bytes_read[0];
        out->bytes_read_b = c->bytes_read[1];
        if (out->outcome == IC_COMPARE_FAILED) {
            *err = c->best.err;
            ret = -1;
        }
    }
    for (unsigned i = 0; ws && i < n && i <= ready; i++) {
        free(ws[i].buf[0]);
        free(ws[i].buf[1]);
    }
    free(ws);
    free(tids);
    pthread_mutex_destroy(&c->lock);
    free(c);
    return ret;
}
