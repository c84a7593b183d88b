/* What bounds a qcow2 check's work (qcow2_check_internal.h says why): its
 * budgets, and the passes over L2 tables it remembers to replay when a
 * table is named again. */
#include <stdlib.h>
#include <string.h>

#include "qcow2_check_internal.h"

/* One more reference to cluster k in the pass being recorded (an
 * overflow or not); too many clusters, or one that reaches the maximum
 * during the pass, and the pass is not remembered. */
void qcow2_ck_record(struct ck *c, uint64_t k, int overflow)
{
    struct recording *rec = c->rec;
    unsigned h = (unsigned)((k * 0x9e3779b97f4a7c15ull) >> 32) % REC_SLOTS;
    for (;; h = (h + 1) % REC_SLOTS) {
        if (rec->slot_stamp[h] != rec->stamp) {
            /* not referenced before in this pass */
            if (rec->n == REPLAY_MAX_CLUSTERS) {
                rec->on = 0;
                rec->big = 1;
                return;
            }
            rec->slot_stamp[h] = rec->stamp;
            rec->slot_cluster[h] = (uint32_t)k;
            rec->slot_ref[h] = (uint16_t)rec->n;
            rec->refs[rec->n++] = (struct ref_count){(uint32_t)k, !overflow, !!overflow};
            return;
        }
        if (rec->slot_cluster[h] == k) {
            struct ref_count *rc = &rec->refs[rec->slot_ref[h]];
            if (overflow ? rc->n != 0 : rc->over != 0)
                rec->on = 0;
            else if (overflow)
                rc->over++;
            else
                rc->n++;
            return;
        }
    }
}

static uint64_t index_slot(uint64_t key, uint64_t cap)
{
    /* offsets are multiples of 512: the product's high bits mix them */
    return ((key * 0x9e3779b97f4a7c15ull) >> 32) & (cap - 1);
}

uint32_t qcow2_ck_index_get(const struct index *ix, uint64_t key)
{
    if (!ix->cap)
        return NO_RECORD;
    for (uint64_t i = index_slot(key, ix->cap);; i = (i + 1) & (ix->cap - 1)) {
        if (ix->keys[i] == key)
            return ix->vals[i];
        if (ix->keys[i] == EMPTY_KEY)
            return NO_RECORD;
    }
}

/* -1 when full or without memory (the key is then not indexed) */
static int index_put(struct index *ix, uint64_t key, uint32_t val)
{
    if (ix->used >= MEMO_MAX_KEYS && qcow2_ck_index_get(ix, key) == NO_RECORD)
        return -1;
    if ((ix->used + 1) * 2 > ix->cap) {
        uint64_t cap = ix->cap ? ix->cap * 2 : 64;
        uint64_t *keys = malloc(cap * sizeof *keys);
        uint32_t *vals = malloc(cap * sizeof *vals);
        if (!keys || !vals) {
            free(keys);
            free(vals);
            return -1;
        }
        for (uint64_t i = 0; i < cap; i++)
            keys[i] = EMPTY_KEY;
        for (uint64_t i = 0; i < ix->cap; i++) {
            if (ix->keys[i] == EMPTY_KEY)
                continue;
            uint64_t j = index_slot(ix->keys[i], cap);
            while (keys[j] != EMPTY_KEY)
                j = (j + 1) & (cap - 1);
            keys[j] = ix->keys[i];
            vals[j] = ix->vals[i];
        }
        free(ix->keys);
        free(ix->vals);
        ix->keys = keys;
        ix->vals = vals;
        ix->cap = cap;
    }
    uint64_t i = index_slot(key, ix->cap);
    while (ix->keys[i] != EMPTY_KEY && ix->keys[i] != key)
        i = (i + 1) & (ix->cap - 1);
    if (ix->keys[i] == EMPTY_KEY) {
        ix->keys[i] = key;
        ix->used++;
    }
    ix->vals[i] = val;
    return 0;
}

static void index_free(struct index *ix)
{
    free(ix->keys);
    free(ix->vals);
}

/* A growing array `arr` of *cap elements of `size` bytes, with room for
 * `need` of them (at most `most`): the array (moved, perhaps), or NULL
 * when full or without memory (`arr` is then as it was). */
static void *grow(void *arr, uint64_t *cap, uint64_t need, size_t size, uint64_t most)
{
    if (need <= *cap && arr)
        return arr;
    if (need > most)
        return NULL;
    uint64_t n = *cap ? *cap : 64;
    while (n < need)
        n *= 2;
    if (n > most)
        n = most;
    void *grown = realloc(arr, n * size);
    if (grown)
        *cap = n;
    return grown;
}

void qcow2_ck_pass_begin(struct ck *c)
{
    struct recording *rec = c->rec;
    rec->on = 1;
    rec->big = 0;
    rec->n = 0;
    if (++rec->stamp == 0) { /* stamps wrapped: every slot free again */
        memset(rec->slot_stamp, 0, sizeof rec->slot_stamp);
        rec->stamp = 1;
    }
}

void qcow2_ck_remember(struct ck *c, uint64_t key, const struct ic_check_result *before,
                       size_t text_from)
{
    struct recording *rec = c->rec;
    uint32_t mark = rec->big ? NOT_REMEMBERED : SATURATING;
    int on = rec->on;
    rec->on = 0; /* the pass is over: references from now on are not its */
    if (on) {
        mark = NOT_REMEMBERED;
        struct ref_count *refs = grow(c->refs, &c->refs_cap, c->nrefs + rec->n,
                                      sizeof *refs, MEMO_MAX_REFS);
        if (refs)
            c->refs = refs;
        struct pass *passes = refs ? grow(c->passes, &c->passes_cap, c->npasses + 1,
                                          sizeof *passes, MEMO_MAX_PASSES)
                                   : NULL;
        if (passes)
            c->passes = passes;
        if (passes && index_put(&c->pass_index, key, (uint32_t)c->npasses) == 0) {
            memcpy(c->refs + c->nrefs, rec->refs, rec->n * sizeof *rec->refs);
            c->passes[c->npasses++] = (struct pass){
                .nrefs = rec->n,
                .refs_at = c->nrefs,
                .text_from = text_from,
                .text_to = c->r->messages_len,
                .d_corruptions = c->r->corruptions - before->corruptions,
                .d_allocated = c->r->allocated_clusters - before->allocated_clusters,
                .d_fragmented = c->r->fragmented_clusters - before->fragmented_clusters,
                .d_compressed = c->r->compressed_clusters - before->compressed_clusters,
            };
            c->nrefs += rec->n;
            return;
        }
    }
    (void)index_put(&c->pass_index, key, mark); /* full: not indexed */
}

void qcow2_ck_remember_copied(struct ck *c, uint64_t l2_offset, size_t text_from,
                              uint64_t found)
{
    struct copied_pass *copied = grow(c->copied, &c->copied_cap, c->ncopied + 1,
                                      sizeof *copied, MEMO_MAX_PASSES);
    if (copied)
        c->copied = copied;
    if (copied && index_put(&c->copied_index, l2_offset, (uint32_t)c->ncopied) == 0)
        c->copied[c->ncopied++] = (struct copied_pass){text_from, c->r->messages_len, found};
}

/* A remembered pass again, when it does the same: no count it raises
 * reaches the maximum now, and the counts it found at the maximum are
 * there still.  0 when it cannot (the table is scanned again). */
int qcow2_ck_replay(struct ck *c, const struct pass *p)
{
    const struct ref_count *refs = c->refs + p->refs_at;
    for (uint32_t i = 0; i < p->nrefs; i++) {
        uint64_t have = c->counts[refs[i].cluster];
        if (refs[i].over ? have != c->count_max : c->count_max - have < refs[i].n)
            return 0;
    }
    if (ic_check_repeat(c->r, p->text_from, p->text_to) < 0)
        c->nomem = 1;
    for (uint32_t i = 0; i < p->nrefs; i++) {
        uint64_t k = refs[i].cluster;
        c->counts[k] += refs[i].n;
        if (k >= c->nb_clusters)
            c->nb_clusters = k + 1;
    }
    c->r->corruptions += p->d_corruptions;
    c->r->allocated_clusters += p->d_allocated;
    c->r->fragmented_clusters += p->d_fragmented;
    c->r->compressed_clusters += p->d_compressed;
    return 1;
}

/* A first scan of a table of `live` entries in the file (never scanned by
 * this kind of pass before): -1 past what the file justifies. */
int qcow2_ck_first_scan(struct ck *c, uint64_t live)
{
    c->first_scanned += live + 1;
    if (c->first_scanned <= c->first_allowed)
        return 0;
    ic_error_format(c->err, c->img->path, "corrupt qcow2 image: more than %llu L2 entries "
                    "to scan in a file of %llu bytes (L2 tables overlapping?)",
                    (unsigned long long)c->first_allowed, (unsigned long long)c->file_len);
    return -1;
}

/* What a walk of an L1 table with `n` entries in the file may need: its
 * entries and the file's L2 words, twice over. */
void qcow2_ck_allow_walk(struct ck *c, uint64_t n)
{
    uint64_t words = c->s->h.cluster_size / 8; /* a table's, whatever its entries' size */
    uint64_t l2 = n < c->file_len / 8 / words + 1 ? n * words : c->file_len / 8;
    c->work_allowed += 2 * (n + l2);
}

/* `units` more steps of L2 work; -1 past what the file justifies. */
int qcow2_ck_spend(struct ck *c, uint64_t units)
{
    c->work += units;
    if (c->work <= c->work_allowed)
        return 0;
    ic_error_format(c->err, c->img->path, "corrupt qcow2 image: more than %llu L2 entries "
                    "to check in a file of %llu bytes (L1 tables naming the same L2 tables "
                    "over and over?)", (unsigned long long)c->work_allowed,
                    (unsigned long long)c->file_len);
    return -1;
}

void qcow2_ck_free(struct ck *c)
{
    free(c->rec);
    index_free(&c->pass_index);
    free(c->passes);
    free(c->refs);
    index_free(&c->copied_index);
    free(c->copied);
}
