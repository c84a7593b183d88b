/* A journalled copy's checkpoints (copy_internal.h): what the items
 * finished, and the checksum's block digests as the hash tells them, are
 * gathered here; each checkpoint makes the destination durable first and
 * only then records what was finished before it began, so that nothing
 * the journal names can be lost by a crash.  With digests a block is
 * recorded once it is whole in the destination and its digest is known
 * (a resumed copy's checksum takes it from the journal); without, the
 * finished ranges are recorded as they are. */
#include <stdlib.h>
#include <string.h>

#include "copy_internal.h"
#include "journal.h"

struct told {
    uint64_t first, count;
    uint8_t *digests; /* count of them, or NULL: full zero blocks */
};

struct ic_checkpoint {
    struct ic_image *dst;
    struct ic_journal *journal;
    uint64_t size, block; /* the journal's block: the hash's, or 1 */
    size_t dsize;         /* 0: no digests */
    uint64_t every_bytes; /* a checkpoint once this much more is done (0: by time only) */
    struct ic_job *job; /* under the lock: set once the job started */

    pthread_mutex_t lock; /* guards what follows; never held across I/O */
    struct ic_range *done; /* finished, not recorded: sorted, disjoint, merged */
    size_t ndone, done_cap;
    struct told *told; /* digests told, not recorded, in any order */
    size_t ntold, told_cap;
    uint64_t since; /* bytes finished since the last checkpoint */
};

int ic_checkpoint_new(struct ic_image *dst, struct ic_journal *journal, uint64_t every_bytes,
                      struct ic_checkpoint **out, struct ic_error *err)
{
    struct ic_checkpoint *k = calloc(1, sizeof *k);
    if (!k)
        return ic_error_nomem(err);
    if (pthread_mutex_init(&k->lock, NULL)) {
        free(k);
        return ic_error_nomem(err);
    }
    k->dst = dst;
    k->journal = journal;
    k->size = ic_journal_size(journal);
    k->block = ic_journal_block_size(journal);
    k->dsize = ic_journal_digest_size(journal);
    k->every_bytes = every_bytes;
    *out = k;
    return 0;
}

void ic_checkpoint_set_job(struct ic_checkpoint *k, struct ic_job *job)
{
    pthread_mutex_lock(&k->lock); /* items may be finishing already */
    k->job = job;
    pthread_mutex_unlock(&k->lock);
}

static void free_told(struct told *t, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(t[i].digests);
}

void ic_checkpoint_free(struct ic_checkpoint *k)
{
    if (!k)
        return;
    free(k->done);
    free_told(k->told, k->ntold);
    free(k->told);
    pthread_mutex_destroy(&k->lock);
    free(k);
}

/* The first range of `r` that ends after `off` (n when none). */
static size_t first_ending_after(const struct ic_range *r, size_t n, uint64_t off)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (r[mid].offset + r[mid].length <= off)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* [off, off+len) joins the sorted, merged set (lock held): items finish
 * in about guest order, so mostly it extends the last range. */
static int add_range(struct ic_checkpoint *k, uint64_t off, uint64_t len)
{
    uint64_t end = off + len;
    size_t i = first_ending_after(k->done, k->ndone, off);
    /* i: the first range ending at or after off ... merge all that touch */
    if (i > 0 && k->done[i - 1].offset + k->done[i - 1].length == off)
        i--;
    size_t j = i;
    while (j < k->ndone && k->done[j].offset <= end) {
        uint64_t e = k->done[j].offset + k->done[j].length;
        if (k->done[j].offset < off)
            off = k->done[j].offset;
        if (e > end)
            end = e;
        j++;
    }
    if (j > i) { /* ranges i..j-1 become one */
        k->done[i] = (struct ic_range){off, end - off};
        memmove(k->done + i + 1, k->done + j, (k->ndone - j) * sizeof *k->done);
        k->ndone -= j - i - 1;
        return 0;
    }
    if (k->ndone == k->done_cap) {
        size_t cap = k->done_cap ? 2 * k->done_cap : 64;
        struct ic_range *r = realloc(k->done, cap * sizeof *r);
        if (!r)
            return -1;
        k->done = r;
        k->done_cap = cap;
    }
    memmove(k->done + i + 1, k->done + i, (k->ndone - i) * sizeof *k->done);
    k->done[i] = (struct ic_range){off, len};
    k->ndone++;
    return 0;
}

void ic_checkpoint_done(struct ic_checkpoint *k, uint64_t off, uint64_t len)
{
    if (!len)
        return;
    pthread_mutex_lock(&k->lock);
    /* without memory the range is not kept: it costs its work again after
     * a failure, nothing else */
    (void)add_range(k, off, len);
    k->since += len;
    struct ic_job *due = k->every_bytes && k->since >= k->every_bytes ? k->job : NULL;
    if (due)
        k->since = 0;
    pthread_mutex_unlock(&k->lock);
    if (due)
        ic_job_tick_now(due);
}

void ic_checkpoint_sink(void *ctx, uint64_t first, uint64_t count, const uint8_t *digests)
{
    struct ic_checkpoint *k = ctx;
    if (!k->dsize || !count)
        return;
    uint8_t *copy = NULL;
    if (digests && (copy = malloc(count * k->dsize)))
        memcpy(copy, digests, count * k->dsize);
    pthread_mutex_lock(&k->lock);
    if (k->ntold == k->told_cap) {
        size_t cap = k->told_cap ? 2 * k->told_cap : 64;
        struct told *t = realloc(k->told, cap * sizeof *t);
        if (t) {
            k->told = t;
            k->told_cap = cap;
        }
    }
    /* without memory the blocks are not kept: never recorded, only copied
     * again after a failure */
    if (k->ntold < k->told_cap && (!digests || copy)) {
        k->told[k->ntold++] = (struct told){first, count, copy};
        copy = NULL;
    }
    pthread_mutex_unlock(&k->lock);
    free(copy);
}

/* Whether block b lies wholly inside the sorted ranges. */
static int block_inside(const struct ic_checkpoint *k, const struct ic_range *r, size_t n,
                        uint64_t b)
{
    uint64_t start = b * k->block;
    uint64_t end = start + k->block < k->size ? start + k->block : k->size;
    size_t i = first_ending_after(r, n, start);
    return i < n && r[i].offset <= start && r[i].offset + r[i].length >= end;
}

static int by_first(const void *a, const void *b)
{
    const struct told *x = a, *y = b;
    return x->first < y->first ? -1 : x->first > y->first;
}

/* What was recorded leaves the finished set (lock held): an interval
 * difference, the recorded ranges sorted and disjoint. */
static int subtract(struct ic_checkpoint *k, const struct ic_range *rec, size_t nrec)
{
    if (!nrec)
        return 0;
    size_t cap = k->ndone + nrec + 1, n = 0;
    struct ic_range *out = malloc(cap * sizeof *out);
    if (!out)
        return -1;
    size_t j = 0;
    for (size_t i = 0; i < k->ndone; i++) {
        uint64_t off = k->done[i].offset, end = off + k->done[i].length;
        while (j < nrec && rec[j].offset + rec[j].length <= off)
            j++;
        for (size_t m = j; m < nrec && rec[m].offset < end; m++) {
            if (rec[m].offset > off)
                out[n++] = (struct ic_range){off, rec[m].offset - off};
            uint64_t re = rec[m].offset + rec[m].length;
            if (re > off)
                off = re < end ? re : end;
        }
        if (off < end)
            out[n++] = (struct ic_range){off, end - off};
    }
    free(k->done);
    k->done = out;
    k->ndone = n;
    k->done_cap = cap;
    return 0;
}

/* Record the told blocks wholly inside `snap` (digest mode); what is not
 * recorded goes to *left.  The recorded ranges land in *rec. */
static int record_blocks(struct ic_checkpoint *k, const struct ic_range *snap, size_t nsnap,
                         struct told *told, size_t ntold, struct told **left, size_t *nleft,
                         struct ic_range **rec, size_t *nrec, struct ic_error *err)
{
    size_t lcap = 0, rcap = 0;
    if (ntold)
        qsort(told, ntold, sizeof *told, by_first);
    for (size_t t = 0; t < ntold; t++) {
        const struct told *r = &told[t];
        uint64_t b = r->first, end = r->first + r->count;
        while (b < end) {
            int in = block_inside(k, snap, nsnap, b);
            uint64_t e = b + 1;
            while (e < end && block_inside(k, snap, nsnap, e) == in)
                e++;
            const uint8_t *dig = r->digests ? r->digests + (b - r->first) * k->dsize : NULL;
            if (in) {
                if (ic_journal_record_run(k->journal, b, e - b, dig, err) < 0)
                    return -1;
                uint64_t off = b * k->block;
                uint64_t stop = e * k->block < k->size ? e * k->block : k->size;
                if (*nrec && (*rec)[*nrec - 1].offset + (*rec)[*nrec - 1].length == off) {
                    (*rec)[*nrec - 1].length += stop - off;
                } else {
                    if (*nrec == rcap) {
                        rcap = rcap ? 2 * rcap : 64;
                        struct ic_range *g = realloc(*rec, rcap * sizeof *g);
                        if (!g)
                            return ic_error_nomem(err);
                        *rec = g;
                    }
                    (*rec)[(*nrec)++] = (struct ic_range){off, stop - off};
                }
            } else {
                if (*nleft == lcap) {
                    lcap = lcap ? 2 * lcap : 64;
                    struct told *g = realloc(*left, lcap * sizeof *g);
                    if (!g)
                        return ic_error_nomem(err);
                    *left = g;
                }
                uint8_t *copy = NULL;
                if (dig && !(copy = malloc((e - b) * k->dsize)))
                    return ic_error_nomem(err);
                if (copy)
                    memcpy(copy, dig, (e - b) * k->dsize);
                (*left)[(*nleft)++] = (struct told){b, e - b, copy};
            }
            b = e;
        }
    }
    /* told runs of one record may overlap none, but recorded ranges of
     * different runs may interleave: sort and merge for subtract() */
    return ic_ranges_normalize(*rec, nrec, k->size, err);
}

int ic_checkpoint_run(struct ic_checkpoint *k, struct ic_error *err)
{
    pthread_mutex_lock(&k->lock);
    size_t nsnap = k->ndone, ntold = k->ntold;
    struct ic_range *snap = nsnap ? malloc(nsnap * sizeof *snap) : NULL;
    struct told *told = k->told;
    if (nsnap && !snap) {
        pthread_mutex_unlock(&k->lock);
        return ic_error_nomem(err);
    }
    if (nsnap)
        memcpy(snap, k->done, nsnap * sizeof *snap);
    k->told = NULL;
    k->ntold = k->told_cap = 0;
    k->since = 0;
    pthread_mutex_unlock(&k->lock);

    struct told *left = NULL;
    size_t nleft = 0, nrec = 0;
    struct ic_range *rec = NULL;
    int ret = 0;
    if (nsnap == 0 && ntold == 0)
        goto out; /* nothing finished since the last one */
    /* durable before it is named: the destination first (a qcow2 one with
     * its tables, in an order a crash leaves resumable) */
    ret = ic_image_checkpoint(k->dst, err);
    if (ret == 0 && k->dsize) {
        ret = record_blocks(k, snap, nsnap, told, ntold, &left, &nleft, &rec, &nrec, err);
    } else if (ret == 0 && nsnap) {
        ret = ic_journal_record(k->journal, snap, nsnap, NULL, NULL, err);
        if (ret == 0) {
            rec = snap;
            nrec = nsnap;
            snap = NULL;
        }
    }
    if (ret == 0)
        ret = ic_journal_sync(k->journal, err);
out:
    pthread_mutex_lock(&k->lock);
    if (ret == 0 && subtract(k, rec, nrec) < 0)
        ret = ic_error_nomem(err);
    if (ret < 0) { /* every told digest waits for the next try */
        free_told(left, nleft);
        free(left);
        left = told;
        nleft = ntold;
        told = NULL;
        ntold = 0;
    }
    /* the blocks not recorded wait, with those told meanwhile */
    if (nleft) {
        size_t need = nleft + k->ntold;
        struct told *all = realloc(left, need * sizeof *all);
        if (all) {
            if (k->ntold)
                memcpy(all + nleft, k->told, k->ntold * sizeof *all);
            free(k->told);
            k->told = all;
            k->ntold = k->told_cap = need;
            left = NULL;
        } else { /* not kept: those blocks are copied again after a failure */
            free_told(left, nleft);
        }
    }
    pthread_mutex_unlock(&k->lock);
    free(left);
    free_told(told, ntold);
    free(told);
    free(snap);
    free(rec);
    return ret;
}

int ic_checkpoint_preset(struct ic_journal *journal, struct ic_blkhash *hash,
                         struct ic_error *err)
{
    uint64_t block = ic_journal_block_size(journal), size = ic_journal_size(journal);
    uint64_t nblocks = (size + block - 1) / block;
    for (uint64_t b = 0; b < nblocks;) {
        uint64_t count = 0;
        int zero = 0;
        const uint8_t *digests = NULL;
        if (ic_journal_run(journal, b, &count, &zero, &digests) &&
            ic_blkhash_put_digests(hash, b, count, zero ? NULL : digests, err) < 0)
            return -1;
        if (count == 0)
            break;
        b += count;
    }
    return 0;
}
