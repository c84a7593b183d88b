/* Resuming a qcow2 image imgcopy's writer left incomplete (IC_OPEN_RESUME:
 * a copy a crash interrupted).  Its L1 and L2 tables are what checkpoints
 * made durable (qcow2_write.c: an L1 entry names only a table written
 * before it, a table's entries only clusters inside the file); its
 * refcounts were never written, or are stale.  They are made again here
 * from what the metadata references: the header cluster, the L1 table,
 * each L2 table, the data clusters and the bytes of compressed ones.
 * Every entry is hostile input and checked: a cluster used twice (but
 * compressed bytes, which share clusters), a reference past the end of
 * the file, reserved bits, a shared cluster (COPIED missing: not written
 * by this writer) are refused, never repaired.  What lies after the last
 * referenced cluster (tables of a checkpoint a crash cut short, the
 * file's growth in advance) is cut off, so that new clusters read as
 * zeros as a new image's do; clusters nothing references inside the file
 * stay free (finish() may put the refcounts there). */
#include <stdlib.h>

#include "qcow2_state.h"

/* qemu's masks of reserved bits (the COPIED bit of an L1 entry is none) */
#define L1E_RESERVED 0x7f000000000001ffull
#define L2E_STD_RESERVED 0x3f000000000001feull

struct rebuild {
    struct ic_image *img;
    struct ic_error *err;
    uint64_t csz;
    uint64_t nclusters; /* the file's (its last one perhaps in part) */
    uint16_t *rc;       /* nclusters + 1 */
    uint8_t *owned;     /* a bit per cluster: a structure's own (not compressed bytes) */
    uint64_t end;       /* clusters up to the last one referenced */
};

static int refuse(struct rebuild *r, const char *what, uint64_t value)
{
    return ic_error_format(r->err, r->img->path, "cannot resume writing this qcow2 image: "
                           "%s (0x%llx)", what, (unsigned long long)value);
}

/* The cluster at `off` belongs to one structure (a table, a data cluster)
 * and nothing else. */
static int claim(struct rebuild *r, uint64_t off, const char *past_end, const char *twice)
{
    uint64_t k = off / r->csz;
    if (k >= r->nclusters)
        return refuse(r, past_end, off);
    if (r->rc[k])
        return refuse(r, twice, off);
    r->rc[k] = 1;
    r->owned[k / 8] |= (uint8_t)(1u << (k % 8));
    if (k + 1 > r->end)
        r->end = k + 1;
    return 0;
}

/* The bytes of a compressed cluster: one reference to each cluster they
 * touch, which only other compressed bytes may share. */
static int share(struct rebuild *r, uint64_t host, uint64_t len)
{
    if (host < r->csz)
        return refuse(r, "a compressed cluster overlaps the header", host);
    uint64_t first = host / r->csz, last = (host + len - 1) / r->csz;
    if (last >= r->nclusters)
        return refuse(r, "a compressed cluster lies past the end of the file", host);
    for (uint64_t k = first; k <= last; k++) {
        if (r->owned[k / 8] & (1u << (k % 8)))
            return refuse(r, "a compressed cluster overlaps metadata or a data cluster", host);
        if (r->rc[k] == QCOW2_REFCOUNT_MAX)
            return refuse(r, "a cluster holds more compressed clusters than refcounts count",
                          k * r->csz);
        r->rc[k]++;
        if (k + 1 > r->end)
            r->end = k + 1;
    }
    return 0;
}

/* What the L2 table at `off` references. */
static int walk_l2(struct rebuild *r, const struct qcow2_state *s, uint64_t off, uint64_t *table)
{
    if (qcow2_read_meta(r->img, table, r->csz, off, "unreadable L2 table", r->err) < 0)
        return -1;
    for (uint64_t k = 0; k < s->l2_entries; k++) {
        uint64_t e = qcow2_be64(&table[k]);
        if (!e)
            continue;
        if (e & QCOW2_OFLAG_COMPRESSED) {
            if (e & QCOW2_OFLAG_COPIED)
                return refuse(r, "a compressed cluster's L2 entry has the copied flag", e);
            uint64_t host, len;
            qcow2_compressed_decode(&s->h, e, &host, &len);
            if (share(r, host, len) < 0)
                return -1;
            continue;
        }
        if (e & L2E_STD_RESERVED)
            return refuse(r, "an L2 entry has reserved bits set", e);
        if ((e & QCOW2_OFLAG_ZERO) && s->h.version < 3)
            return refuse(r, "a zero cluster in a version 2 image", e);
        uint64_t host = e & QCOW2_OFFSET_MASK;
        if (!host) {
            if ((e & QCOW2_OFLAG_COPIED) && !(e & QCOW2_OFLAG_ZERO))
                return refuse(r, "a data cluster at offset 0", e);
            continue; /* a zero cluster */
        }
        if (host % r->csz)
            return refuse(r, "a data cluster is not cluster aligned", host);
        if (!(e & QCOW2_OFLAG_COPIED))
            return refuse(r, "a data cluster is shared (its copied flag is clear)", host);
        if (claim(r, host, "a data cluster lies past the end of the file",
                  "a data cluster overlaps metadata or another cluster") < 0)
            return -1;
    }
    return 0;
}

static int walk(struct rebuild *r, struct qcow2_state *s)
{
    const struct qcow2_header *h = &s->h;
    /* the header cluster */
    if (claim(r, 0, "the file ends inside the header", "the header is used twice") < 0)
        return -1;
    /* the L1 table (held whole: qcow2_l1_hold_all) */
    if (h->l1_size) {
        uint64_t off = h->l1_table_offset, bytes = (uint64_t)h->l1_size * 8;
        if (off < r->csz)
            return refuse(r, "the L1 table overlaps the header", off);
        for (uint64_t c = off; c < off + bytes; c += r->csz)
            if (claim(r, c, "the L1 table lies past the end of the file",
                      "the L1 table overlaps other metadata") < 0)
                return -1;
    }
    uint64_t *table = malloc(r->csz);
    if (!table)
        return ic_error_nomem(r->err);
    int ret = 0;
    for (uint64_t i = 0; i < s->l1_len && ret == 0; i++) {
        uint64_t e = s->l1[i], off = e & QCOW2_OFFSET_MASK;
        if (!e)
            continue;
        if (e & L1E_RESERVED)
            ret = refuse(r, "an L1 entry has reserved bits set", e);
        else if (!off)
            ret = refuse(r, "an L1 entry names the header as an L2 table", e);
        else if (off % r->csz)
            ret = refuse(r, "an L2 table is not cluster aligned", e);
        else if (!(e & QCOW2_OFLAG_COPIED))
            ret = refuse(r, "an L2 table is shared (its copied flag is clear)", off);
        else if (claim(r, off, "an L2 table lies past the end of the file",
                       "an L2 table overlaps other metadata or data") == 0)
            ret = walk_l2(r, s, off, table);
        else
            ret = -1;
    }
    free(table);
    return ret;
}

int qcow2_resume_rebuild(struct ic_image *img, struct ic_error *err)
{
    struct qcow2_state *s = qcow2_state_of(img);
    if (s->h.has_bitmaps)
        return ic_error_format(err, img->path, "cannot resume writing this qcow2 image: it "
                               "has persistent bitmaps (imgcopy's writer leaves none)");
    uint64_t csz = s->h.cluster_size, fsize = ic_image_size(s->file);
    struct rebuild r = {.img = img, .err = err, .csz = csz};
    r.nclusters = fsize / csz + (fsize % csz != 0);
    r.rc = calloc(r.nclusters + 1, sizeof *r.rc);
    r.owned = calloc(r.nclusters / 8 + 1, 1);
    int ret = r.rc && r.owned ? walk(&r, s) : ic_error_nomem(err);
    free(r.owned);
    if (ret < 0) {
        free(r.rc);
        return -1;
    }
    /* the refcounts the header names, if any, are stale: finish() writes
     * new ones; until then the header names none, as a new image's */
    s->h.refcount_table_offset = 0;
    s->h.refcount_table_clusters = 0;
    /* finish() completes the image even when nothing is left to write */
    s->w->marked = 1;
    return qcow2_alloc_adopt(img, r.rc, r.nclusters + 1, r.end * csz, err);
}
