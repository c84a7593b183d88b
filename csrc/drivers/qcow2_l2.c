/* The L2 tables, one store for reads and writes.  Clean tables are cached
 * in a bounded LRU whatever the image's size; a table a write changes is
 * pinned (dirty) until finish() writes it back where it was, or where the
 * allocator puts a new one.  Tables are named by L1 index, so a reader of
 * an image being written sees its writes. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "qcow2_state.h"

#define FREE_SLOT UINT64_MAX

int qcow2_l2_init(struct ic_image *img, struct ic_error *err)
{
    struct qcow2_state *s = qcow2_state_of(img);
    struct l2_store *st = &s->l2;
    uint64_t n = s->l1_len ? s->l1_len : 1;
    if (ic_image_take_meta_budget(img, n * (sizeof *st->tables + sizeof *st->dirty)) < 0)
        return ic_error_format(err, img->path, "the backing chain's L1 tables need more "
                               "than %u MiB of memory", IC_CHAIN_META_BUDGET >> 20);
    unsigned slots = (unsigned)(L2_CACHE_BYTES / s->h.cluster_size);
    st->nslots = slots < L2_CACHE_MIN_SLOTS   ? L2_CACHE_MIN_SLOTS
                 : slots > L2_CACHE_MAX_SLOTS ? L2_CACHE_MAX_SLOTS
                                              : slots;
    st->tables = calloc(n, sizeof *st->tables);
    st->dirty = calloc(n, sizeof *st->dirty);
    st->slots = malloc(st->nslots * sizeof *st->slots);
    if (!st->tables || !st->dirty || !st->slots)
        return ic_error_nomem(err);
    for (unsigned i = 0; i < st->nslots; i++)
        st->slots[i] = (struct l2_slot){.l1_index = FREE_SLOT};
    return 0;
}

int qcow2_l1_hold_all(struct ic_image *img, struct ic_error *err)
{
    struct qcow2_state *s = qcow2_state_of(img);
    struct l2_store *st = &s->l2;
    uint64_t have = s->l1_len, n = s->h.l1_size;
    if (have >= n)
        return 0;
    if (ic_image_take_meta_budget(img, (n - have) * (sizeof *s->l1 + sizeof *st->tables +
                                                      sizeof *st->dirty)) < 0)
        return ic_error_format(err, img->path, "the backing chain's L1 tables need more "
                               "than %u MiB of memory", IC_CHAIN_META_BUDGET >> 20);
    uint64_t *l1 = realloc(s->l1, n * sizeof *l1);
    if (l1)
        s->l1 = l1;
    uint64_t **tables = realloc(st->tables, n * sizeof *tables);
    if (tables)
        st->tables = tables;
    uint8_t *dirty = realloc(st->dirty, n * sizeof *dirty);
    if (dirty)
        st->dirty = dirty;
    if (!l1 || !tables || !dirty)
        return ic_error_nomem(err);
    memset(l1 + have, 0, (n - have) * sizeof *l1);
    memset(tables + have, 0, (n - have) * sizeof *tables);
    memset(dirty + have, 0, (n - have) * sizeof *dirty);
    s->l1_len = n;
    return 0;
}

void qcow2_l2_free(struct qcow2_state *s)
{
    struct l2_store *st = &s->l2;
    for (uint64_t i = 0; st->tables && i < s->l1_len; i++)
        free(st->tables[i]);
    free(st->tables);
    free(st->dirty);
    free(st->slots);
    memset(st, 0, sizeof *st);
}

static struct l2_slot *slot_of(struct l2_store *st, uint64_t l1_index)
{
    for (unsigned i = 0; i < st->nslots; i++)
        if (st->slots[i].l1_index == l1_index)
            return &st->slots[i];
    return NULL;
}

/* Where table i lies in the host file.  A table to write back in place
 * must lie within the file, or new clusters could be allocated over it. */
static int place_of(struct ic_image *img, uint64_t i, int for_update, uint64_t *at,
                    struct ic_error *err)
{
    struct qcow2_state *s = qcow2_state_of(img);
    uint64_t csz = s->h.cluster_size;
    *at = s->l1[i] & QCOW2_OFFSET_MASK;
    if (*at % csz || *at < csz)
        return qcow2_corrupt(img, err, "misplaced L2 table", *at);
    if (for_update && *at + csz > ic_image_size(s->file))
        return qcow2_corrupt(img, err, "L2 table past the end of the file", *at);
    return 0;
}

/* Table i from the host file (past its end it reads as zeros, as qemu's
 * does). */
static int load(struct ic_image *img, uint64_t i, uint64_t *entries, int for_update,
                struct ic_error *err)
{
    struct qcow2_state *s = qcow2_state_of(img);
    uint64_t at;
    if (place_of(img, i, for_update, &at, err) < 0 ||
        qcow2_read_meta(img, entries, s->h.cluster_size, at, "unreadable L2 table", err) < 0)
        return -1;
    for (uint64_t k = 0; k < s->h.cluster_size / 8; k++)
        entries[k] = qcow2_be64(&entries[k]);
    return 0;
}

/* Table i resident and clean: its slot's LRU tick renewed, the least
 * recently used clean table evicted to make room. */
static uint64_t *resident(struct ic_image *img, uint64_t i, struct ic_error *err)
{
    struct qcow2_state *s = qcow2_state_of(img);
    struct l2_store *st = &s->l2;
    if (st->tables[i]) {
        struct l2_slot *slot = st->dirty[i] ? NULL : slot_of(st, i);
        if (slot)
            slot->used = ++st->tick;
        return st->tables[i];
    }
    struct l2_slot *victim = &st->slots[0];
    for (unsigned k = 1; k < st->nslots && victim->l1_index != FREE_SLOT; k++)
        if (st->slots[k].l1_index == FREE_SLOT || st->slots[k].used < victim->used)
            victim = &st->slots[k];
    uint64_t *entries = NULL;
    if (victim->l1_index != FREE_SLOT) {
        entries = st->tables[victim->l1_index];
        st->tables[victim->l1_index] = NULL;
        victim->l1_index = FREE_SLOT;
    }
    if (!entries && !(entries = malloc(s->h.cluster_size))) {
        ic_error_nomem(err);
        return NULL;
    }
    if (load(img, i, entries, 0, err) < 0) {
        free(entries);
        return NULL;
    }
    st->tables[i] = entries;
    *victim = (struct l2_slot){.l1_index = i, .used = ++st->tick};
    return entries;
}

int qcow2_l2_get(struct ic_image *img, uint64_t gc, uint64_t n, uint64_t *out,
                 uint64_t *bitmaps, uint64_t *got, struct ic_error *err)
{
    struct qcow2_state *s = qcow2_state_of(img);
    uint64_t i = gc / s->l2_entries, k = gc % s->l2_entries;
    if (n > s->l2_entries - k)
        n = s->l2_entries - k;
    *got = n;
    int ret = 0;
    pthread_mutex_lock(&s->meta_lock);
    if (i >= s->l1_len || (!s->l2.tables[i] && !(s->l1[i] & QCOW2_OFFSET_MASK))) {
        memset(out, 0, n * sizeof *out);
        if (bitmaps)
            memset(bitmaps, 0, n * sizeof *bitmaps);
    } else {
        const uint64_t *t = resident(img, i, err);
        if (!t)
            ret = -1;
        else if (!s->extl2)
            memcpy(out, t + k, n * sizeof *out);
        else
            for (uint64_t j = 0; j < n; j++) {
                out[j] = t[2 * (k + j)];
                if (bitmaps)
                    bitmaps[j] = t[2 * (k + j) + 1];
            }
    }
    pthread_mutex_unlock(&s->meta_lock);
    return ret;
}

int qcow2_l2_has_table(struct qcow2_state *s, uint64_t i)
{
    if (i >= s->l1_len)
        return 0;
    /* a read-only image's tables never change */
    if (!s->w)
        return (s->l1[i] & QCOW2_OFFSET_MASK) != 0;
    pthread_mutex_lock(&s->meta_lock);
    int r = s->l2.tables[i] != NULL || (s->l1[i] & QCOW2_OFFSET_MASK) != 0;
    pthread_mutex_unlock(&s->meta_lock);
    return r;
}

uint64_t *qcow2_l2_for_update(struct ic_image *img, uint64_t gc, struct ic_error *err)
{
    struct qcow2_state *s = qcow2_state_of(img);
    struct l2_store *st = &s->l2;
    uint64_t i = gc / s->l2_entries;
    if (i >= s->l1_len) { /* a writer holds every entry: past the table */
        ic_error_value(err, "%s: cluster %llu is past the L1 table", img->path,
                       (unsigned long long)gc);
        return NULL;
    }
    if (st->dirty[i]) {
        st->dirty[i] |= L2_CHANGED;
        return st->tables[i];
    }
    struct l2_slot *slot = slot_of(st, i);
    if (slot) {
        /* out of the LRU, pinned */
        uint64_t at;
        if (place_of(img, i, 1, &at, err) < 0)
            return NULL;
        slot->l1_index = FREE_SLOT;
    } else if (s->l1[i] & QCOW2_OFFSET_MASK) {
        uint64_t *t = malloc(s->h.cluster_size);
        if (!t) {
            ic_error_nomem(err);
            return NULL;
        }
        if (load(img, i, t, 1, err) < 0) {
            free(t);
            return NULL;
        }
        st->tables[i] = t;
    } else if (!(st->tables[i] = calloc(s->l2_entries, sizeof(uint64_t)))) {
        ic_error_nomem(err);
        return NULL;
    }
    st->dirty[i] = L2_DIRTY | L2_CHANGED;
    return st->tables[i];
}

const uint64_t *qcow2_l2_dirty(const struct qcow2_state *s, uint64_t i)
{
    return i < s->l1_len && s->l2.dirty[i] ? s->l2.tables[i] : NULL;
}

void qcow2_l2_written(struct qcow2_state *s)
{
    struct l2_store *st = &s->l2;
    /* written tables leave memory; reads load them again as clean ones */
    for (uint64_t i = 0; i < s->l1_len; i++) {
        if (!st->dirty[i])
            continue;
        free(st->tables[i]);
        st->tables[i] = NULL;
        st->dirty[i] = 0;
    }
}
