/* qemu-img check for qcow2, read-only (qemu's qcow2_check_refcounts
 * without repair): every host cluster's references are counted from the
 * structures that point at it (header, L1 and L2 tables of the image and
 * of its snapshots, the snapshot table, the refcount table and blocks, the
 * bitmaps) and compared with the refcounts stored on disk.  The messages,
 * counters and their order are qemu's, so that the output is
 * qemu-img check's.  Tables are read with the driver's reader
 * (qcow2_read_meta: zeros past the end of the file, as qemu reads them). */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "qcow2_check_internal.h"

/* qemu's masks of reserved bits and offsets */
#define L1E_RESERVED 0x7f000000000001ffull
#define L2E_STD_RESERVED 0x3f000000000001feull
#define REFT_RESERVED 0x1ffull
#define REFT_OFFSET_MASK 0xfffffffffffffe00ull
#define BME_OFFSET_MASK 0x00fffffffffffe00ull
/* qemu's limit of an L1 table (snapshots' included) */
#define MAX_L1_ENTRIES (QCOW2_MAX_L1_BYTES / 8)
/* The computed refcounts: one counter per host cluster, at most this much
 * memory (a hostile header may claim a huge sparse file). */
#define COUNTS_MAX_BYTES (1ull << 30)
/* L1 entries read at a time */
#define L1_CHUNK 8192u

#define MSG(c, ...)                                                                          \
    do {                                                                                     \
        if (ic_check_message((c)->r, __VA_ARGS__) < 0)                                       \
            (c)->nomem = 1;                                                                  \
    } while (0)

/* qemu's stop: an internal error ends the check ("Check failed: ...") */
static int stop(struct ck *c, int errnum)
{
    c->r->check_errors++;
    c->r->failed_errno = errnum;
    return -1;
}

/* qcow2_inc_refcounts_imrt: +1 for every host cluster [off, off+len) touches */
static int beyond(const struct ck *c, uint64_t off, uint64_t len)
{
    /* qemu's int64 test: offset + size - file_len >= cluster_size */
    return off > UINT64_MAX - len ||
           (off + len > c->file_len && off + len - c->file_len >= c->csz) ||
           off + len > (uint64_t)INT64_MAX;
}

static void reference(struct ck *c, uint64_t off, uint64_t len)
{
    if (len == 0)
        return;
    if (beyond(c, off, len)) {
        MSG(c, "ERROR: counting reference for region exceeding the end of the file by one "
               "cluster or more: offset 0x%" PRIx64 " size 0x%" PRIx64 "\n", off, len);
        c->r->corruptions++;
        return;
    }
    uint64_t first = off / c->csz, last = (off + len - 1) / c->csz;
    for (uint64_t k = first; k <= last; k++) {
        /* the array covers the file and the cluster past it: always here */
        if (k >= c->ncounts)
            continue;
        if (k >= c->nb_clusters)
            c->nb_clusters = k + 1;
        if (c->counts[k] == c->count_max) {
            MSG(c, "ERROR: overflow cluster offset=0x%" PRIx64 "\n", k * c->csz);
            MSG(c, "Use qemu-img amend to increase the refcount entry width or qemu-img "
                   "convert to create a clean copy if the image cannot be opened for "
                   "writing\n");
            c->r->corruptions++;
            if (c->rec->on)
                qcow2_ck_record(c, k, 1);
            continue;
        }
        c->counts[k]++;
        if (c->rec->on)
            qcow2_ck_record(c, k, 0);
    }
}

/* qcow2_get_refcount: 0, or -errno */
static int stored_refcount(struct ck *c, uint64_t cluster, uint64_t *out)
{
    *out = 0;
    uint64_t ti = cluster / c->per_block;
    if (ti >= c->reftable_live) /* past the end of the file, zeros */
        return 0;
    uint64_t boff = c->reftable[ti] & REFT_OFFSET_MASK;
    if (!boff)
        return 0;
    if (boff % c->csz) {
        /* qemu's qcow2_signal_corruption on an image opened read-only */
        if (!c->signaled)
            MSG(c, "qcow2: Image is corrupt: Refblock offset %#" PRIx64 " unaligned "
                   "(reftable index: %#" PRIx64 "); further non-fatal corruption events "
                   "will be suppressed\n", boff, ti);
        c->signaled = 1;
        return -EIO;
    }
    if (boff != c->block_off) {
        struct ic_error ignored;
        c->block_off = 0;
        if (boff > QCOW2_MAX_OFFSET - c->csz)
            return -EIO;
        if (qcow2_read_meta(c->img, c->block, c->csz, boff, "refcount block", &ignored) < 0)
            return -EIO;
        c->block_off = boff;
    }
    *out = qcow2_refcount_entry(c->block, cluster % c->per_block, c->bits);
    return 0;
}

/* How many of the n 8-byte entries of a table at `off` hold bytes of the
 * file (the rest read as zeros: they name nothing). */
static uint64_t live_entries(const struct ck *c, uint64_t off, uint64_t n)
{
    return qcow2_entries_in_file(c->file_len, off, n);
}

/* Whether qemu's read (bdrv_pread) of [off, off + len) fails: past the
 * largest offset. */
static int unreadable(uint64_t off, uint64_t len)
{
    return off > QCOW2_MAX_OFFSET || len > QCOW2_MAX_OFFSET - off;
}

/* A table of n entries as qemu reads it (bdrv_pread): -1 stops the check.
 * Only its `*live` first entries are read, those inside the file (the rest
 * are zeros): a hostile header's table far past the end costs nothing. */
static int read_table(struct ck *c, void *buf, uint64_t n, uint64_t off, uint64_t *live,
                      const char *what, const char *message)
{
    *live = live_entries(c, off, n);
    if (unreadable(off, n * 8) || qcow2_read_meta(c->img, buf, *live * 8, off, what, c->err) < 0) {
        MSG(c, "%s", message);
        return stop(c, EIO);
    }
    return 0;
}

/* check_refcounts_l2: `frag` for the active L1 table (the fragmentation
 * counters). */
static int check_l2(struct ck *c, uint64_t l2_offset, int frag)
{
    const struct qcow2_header *h = &c->s->h;
    uint64_t next_contiguous = 0;
    uint64_t key = l2_offset | (frag != 0); /* the offset's low 9 bits are 0 */
    uint32_t id = qcow2_ck_index_get(&c->pass_index, key);
    if (id < SATURATING) {
        if (qcow2_ck_spend(c, c->passes[id].nrefs + 1ull) < 0)
            return -1;
        if (qcow2_ck_replay(c, &c->passes[id]))
            return 0;
    }
    /* scanned: for the first time, or again as a count reaches the
     * maximum, or a table too big to remember (or no index left) */
    uint64_t words = c->s->h.cluster_size / 8; /* extended entries: two words each */
    uint64_t live = live_entries(c, l2_offset, words);
    int first = id != NOT_REMEMBERED && (id != NO_RECORD || c->pass_index.used < MEMO_MAX_KEYS);
    if ((first && qcow2_ck_first_scan(c, live) < 0) || qcow2_ck_spend(c, live + 1) < 0)
        return -1;
    /* L1 entries naming one table again cost no second read */
    if (l2_offset != c->l2_at) {
        c->l2_at = UINT64_MAX;
        if (read_table(c, c->l2, words, l2_offset, &c->l2_live,
                       "unreadable L2 table", "ERROR: I/O error in check_refcounts_l2\n") < 0)
            return -1;
        c->l2_at = l2_offset;
    }
    struct ic_check_result before = *c->r;
    size_t text_from = c->r->messages_len;
    qcow2_ck_pass_begin(c);
    /* the entries past the end of the file are zeros: unallocated */
    const int ext = c->s->extl2;
    for (uint64_t i = 0; i << ext < c->l2_live; i++) {
        uint64_t e = qcow2_be64(&c->l2[i << ext]);
        uint64_t bitmap = ext && 2 * i + 1 < c->l2_live ? qcow2_be64(&c->l2[2 * i + 1]) : 0;
        if (e & QCOW2_OFLAG_COMPRESSED) {
            uint64_t host, len;
            if (e & QCOW2_OFLAG_COPIED) {
                qcow2_compressed_decode(h, e, &host, &len);
                MSG(c, "ERROR: coffset=0x%" PRIx64 ": copied flag must never be set for "
                       "compressed clusters\n", host);
                e &= ~QCOW2_OFLAG_COPIED;
                c->r->corruptions++;
            }
            if (bitmap) {
                MSG(c, "ERROR compressed cluster %d with non-zero subcluster allocation "
                       "bitmap, entry=0x%" PRIx64 "\n", (int)i, e);
                c->r->corruptions++;
                continue;
            }
            qcow2_compressed_decode(h, e, &host, &len);
            reference(c, host, len);
            if (frag) {
                c->r->allocated_clusters++;
                c->r->compressed_clusters++;
                c->r->fragmented_clusters++; /* qemu counts every one */
            }
            continue;
        }
        if (e & L2E_STD_RESERVED) {
            MSG(c, "ERROR found l2 entry with reserved bits set: %" PRIx64 "\n", e);
            c->r->corruptions++;
        }
        uint64_t off = e & QCOW2_OFFSET_MASK;
        if (!off) {
            /* unallocated or a plain zero cluster */
            if (ext && QCOW2_SUBCLUSTER_DATA(bitmap)) {
                MSG(c, "ERROR: Unallocated cluster has non-zero subcluster allocation map\n");
                c->r->corruptions++;
            }
            continue;
        }
        if (ext && (QCOW2_SUBCLUSTER_ZEROS(bitmap) & QCOW2_SUBCLUSTER_DATA(bitmap))) {
            c->r->corruptions++;
            MSG(c, "ERROR offset=%" PRIx64 ": Allocated cluster has corrupted subcluster "
                   "allocation bitmap\n", off);
        }
        if (off % c->csz) {
            c->r->corruptions++;
            /* holding no data: extended entries say it in their bitmap */
            if (ext ? !QCOW2_SUBCLUSTER_DATA(bitmap) : (e & QCOW2_OFLAG_ZERO) != 0)
                MSG(c, "ERROR offset=%" PRIx64 ": Preallocated cluster is not properly "
                       "aligned; L2 entry corrupted.\n", off);
            else
                MSG(c, "ERROR offset=%" PRIx64 ": Data cluster is not properly aligned; "
                       "L2 entry corrupted.\n", off);
        }
        if (frag) {
            c->r->allocated_clusters++;
            if (next_contiguous && off != next_contiguous)
                c->r->fragmented_clusters++;
            next_contiguous = off + c->csz;
        }
        reference(c, off, c->csz);
    }
    qcow2_ck_remember(c, key, &before, text_from);
    return 0;
}

/* check_refcounts_l1.  The table is read from disk (in chunks: a
 * snapshot's may be 32 MiB), up to the end of the file: past it, its
 * entries are zeros (unallocated), and only whether qemu could read them
 * matters. */
static int check_l1(struct ck *c, uint64_t l1_offset, uint64_t l1_size, int frag)
{
    if (!l1_size)
        return 0;
    reference(c, l1_offset, l1_size * 8);
    uint64_t in_file = live_entries(c, l1_offset, l1_size);
    if (in_file) {
        c->l1_walked += in_file;
        if (c->l1_walked > c->l1_allowed)
            return ic_error_format(c->err, c->img->path, "corrupt qcow2 image: its L1 tables "
                                   "hold more than %llu entries in a file of %llu bytes "
                                   "(snapshots naming the same L1 table over and over?)",
                                   (unsigned long long)c->l1_allowed,
                                   (unsigned long long)c->file_len);
        qcow2_ck_allow_walk(c, in_file);
    }
    uint64_t chunk[L1_CHUNK];
    for (uint64_t first = 0; first < l1_size; first += L1_CHUNK) {
        uint64_t n = l1_size - first < L1_CHUNK ? l1_size - first : L1_CHUNK, live;
        uint64_t off = l1_offset + first * 8;
        if (!unreadable(off, n * 8) && !live_entries(c, off, n)) {
            /* this chunk and every one after it: zeros, or qemu's error
             * (for the first chunk past QCOW2_MAX_OFFSET) */
            if (!unreadable(off, (l1_size - first) * 8))
                break;
            first += (QCOW2_MAX_OFFSET - off) / 8 / L1_CHUNK * L1_CHUNK;
            n = l1_size - first < L1_CHUNK ? l1_size - first : L1_CHUNK;
            off = l1_offset + first * 8;
        }
        if (read_table(c, chunk, n, off, &live, "unreadable L1 table",
                       "ERROR: I/O error in check_refcounts_l1\n") < 0)
            return -1;
        for (uint64_t i = 0; i < live; i++) {
            uint64_t e = qcow2_be64(&chunk[i]);
            if (!e)
                continue;
            if (e & L1E_RESERVED) {
                MSG(c, "ERROR found L1 entry with reserved bits set: %" PRIx64 "\n", e);
                c->r->corruptions++;
            }
            uint64_t l2_offset = e & QCOW2_OFFSET_MASK;
            reference(c, l2_offset, c->csz);
            if (l2_offset % c->csz) {
                MSG(c, "ERROR l2_offset=%" PRIx64 ": Table is not cluster aligned; L1 entry "
                       "corrupted\n", l2_offset);
                c->r->corruptions++;
            }
            if (check_l2(c, l2_offset, frag) < 0)
                return -1;
        }
    }
    return 0;
}

/* Each snapshot's L1 table (its L2 tables do not count as fragmentation),
 * then the snapshot table itself, whose length qemu takes as read: up to
 * the end of the last entry's name. */
static int check_snapshots(struct ck *c)
{
    struct qcow2_state *s = c->s;
    uint64_t off = s->h.snapshots_offset, end = off;
    for (size_t i = 0; i < s->nsnapshots; i++) {
        uint8_t fixed[QCOW2_SNAPSHOT_FIXED];
        struct qcow2_snapshot_entry e;
        uint64_t entry_len;
        off = (off + 7) / 8 * 8;
        if (off >= c->file_len) {
            /* this entry and every one after it read as zeros (open read
             * them all): 40 bytes each, naming no L1 table */
            end = off + (uint64_t)QCOW2_SNAPSHOT_FIXED * (s->nsnapshots - i);
            break;
        }
        if (qcow2_read_meta(c->img, fixed, sizeof fixed, off, "unreadable snapshot table",
                            c->err) < 0 ||
            qcow2_parse_snapshot_entry(fixed, (uint32_t)i, &e, &entry_len, c->img->path,
                                       c->err) < 0)
            return -1;
        end = off + QCOW2_SNAPSHOT_FIXED + e.extra_data_size + e.id_str_size + e.name_size;
        off += entry_len;
        const struct ic_snapshot *sn = &s->snapshots[i];
        if (e.l1_table_offset % c->csz) {
            MSG(c, "ERROR snapshot %s (%s) l1_offset=%#" PRIx64 ": L1 table is not cluster "
                   "aligned; snapshot table entry corrupted\n", sn->id, sn->name,
                e.l1_table_offset);
            c->r->corruptions++;
            continue;
        }
        if (e.l1_size > MAX_L1_ENTRIES) {
            MSG(c, "ERROR snapshot %s (%s) l1_size=%#" PRIx32 ": L1 table is too large; "
                   "snapshot table entry corrupted\n", sn->id, sn->name, e.l1_size);
            c->r->corruptions++;
            continue;
        }
        if (check_l1(c, e.l1_table_offset, e.l1_size, 0) < 0)
            return -1;
    }
    reference(c, s->h.snapshots_offset, end - s->h.snapshots_offset);
    return 0;
}

/* qcow2_check_bitmaps_refcounts: the directory, each bitmap's table and
 * the clusters it names (bitmaps in use included). */
static int check_bitmaps(struct ck *c)
{
    const struct qcow2_header *h = &c->s->h;
    if (!h->has_bitmaps || h->nb_bitmaps == 0)
        return 0;
    reference(c, h->bitmap_directory_offset, h->bitmap_directory_size);
    /* open checked the directory and the tables, and listed the bitmaps */
    uint64_t *table = malloc(c->csz);
    int ret = table ? 0 : ic_error_nomem(c->err);
    /* entries past the end of the file read as zeros (nothing to count);
     * tables overlapping each other are refused past what the file holds,
     * as open refuses them */
    uint64_t allowed = qcow2_bitmap_entries_allowed(c->file_len);
    for (size_t i = 0; ret == 0 && i < c->s->nbitmaps; i++) {
        uint64_t toff = c->s->bitmaps[i].table_offset;
        uint64_t entries = c->s->bitmaps[i].table_size;
        reference(c, toff, entries * 8);
        uint64_t per = c->csz / 8, live = live_entries(c, toff, entries);
        if (live > allowed) {
            ret = ic_error_format(c->err, c->img->path, "corrupt qcow2 image: the bitmaps' "
                                  "tables hold more than %llu entries in a file of %llu bytes "
                                  "(tables overlapping?)",
                                  (unsigned long long)qcow2_bitmap_entries_allowed(c->file_len),
                                  (unsigned long long)c->file_len);
            break;
        }
        allowed -= live;
        for (uint64_t k = 0; ret == 0 && k < live; k += per) {
            uint64_t n = live - k < per ? live - k : per;
            ret = qcow2_read_meta(c->img, table, n * 8, toff + k * 8, "unreadable bitmap "
                                  "table", c->err);
            for (uint64_t j = 0; ret == 0 && j < n; j++) {
                uint64_t be = qcow2_be64(&table[j]);
                if (!qcow2_bitmap_table_entry_ok(be, c->csz)) {
                    c->r->corruptions++;
                    ret = stop(c, EINVAL);
                } else if (be & BME_OFFSET_MASK) {
                    reference(c, be & BME_OFFSET_MASK, c->csz);
                }
            }
        }
        /* the zeros after them, unless qemu cannot read them at all: from
         * QCOW2_MAX_OFFSET on (where a chunk starts: tables are cluster
         * aligned) */
        if (ret == 0 && unreadable(toff, entries * 8))
            ret = qcow2_corrupt(c->img, c->err, "unreadable bitmap table",
                                toff > QCOW2_MAX_OFFSET ? toff : QCOW2_MAX_OFFSET);
    }
    free(table);
    return ret;
}

/* check_refblocks: each refcount block is referenced once. */
static void check_refblocks(struct ck *c)
{
    /* the entries past the end of the file are zeros: no block */
    for (uint64_t i = 0; i < c->reftable_live; i++) {
        uint64_t e = c->reftable[i], off = e & REFT_OFFSET_MASK;
        if (e & REFT_RESERVED) {
            MSG(c, "ERROR refcount table entry %" PRIu64 " has reserved bits set\n", i);
            c->r->corruptions++;
            continue;
        }
        if (off % c->csz) {
            MSG(c, "ERROR refcount block %" PRIu64 " is not cluster aligned; refcount table "
                   "entry corrupted\n", i);
            c->r->corruptions++;
            continue;
        }
        if (off / c->csz >= c->nb_clusters) {
            MSG(c, "ERROR refcount block %" PRIu64 " is outside image\n", i);
            c->r->corruptions++;
            continue;
        }
        if (off) {
            reference(c, off, c->csz);
            uint64_t n = c->counts[off / c->csz];
            if (n != 1) {
                MSG(c, "ERROR refcount block %" PRIu64 " refcount=%" PRIu64 "\n", i, n);
                c->r->corruptions++;
            }
        }
    }
}

/* What compare() leaves in counts[] for the COPIED pass: each cluster's
 * stored refcount, or one of these. */
#define STORED_UNREADABLE UINT32_MAX
#define STORED_LARGE (UINT32_MAX - 1) /* at least that: read it again */

/* compare_refcounts: the stored refcount of every host cluster against the
 * references found; returns the highest cluster in use.  The stored
 * refcounts replace the references in counts[] (no longer needed): the
 * COPIED pass asks for them again. */
static uint64_t compare(struct ck *c)
{
    uint64_t highest = 0;
    for (uint64_t i = 0; i < c->nb_clusters; i++) {
        uint64_t r1, r2 = c->counts[i];
        int ret = stored_refcount(c, i, &r1);
        c->counts[i] = ret < 0 ? STORED_UNREADABLE
                       : r1 >= STORED_LARGE ? STORED_LARGE
                                            : (uint32_t)r1;
        c->stored_n = i + 1;
        if (ret < 0) {
            MSG(c, "Can't get refcount for cluster %" PRIu64 ": %s\n", i, strerror(-ret));
            c->r->check_errors++;
            continue;
        }
        if (r1 || r2)
            highest = i;
        if (r1 != r2) {
            MSG(c, "%s cluster %" PRIu64 " refcount=%" PRIu64 " reference=%" PRIu64 "\n",
                r1 < r2 ? "ERROR" : "Leaked", i, r1, r2);
            if (r1 < r2)
                c->r->corruptions++;
            else
                c->r->leaks++;
        }
    }
    return highest;
}

/* The stored refcount of a cluster, for the COPIED pass: compare() read
 * those of the clusters it compared (a hostile image's L2 entries may
 * name clusters of many refcount blocks in turn). */
static int stored_again(struct ck *c, uint64_t cluster, uint64_t *out)
{
    if (cluster < c->stored_n && c->counts[cluster] != STORED_LARGE) {
        *out = c->counts[cluster];
        return c->counts[cluster] == STORED_UNREADABLE ? -EIO : 0;
    }
    return stored_refcount(c, cluster, out);
}

/* check_oflag_copied: the COPIED flag of active L1 and L2 entries says
 * whether the stored refcount is exactly 1. */
static int check_copied(struct ck *c)
{
    struct qcow2_state *s = c->s;
    qcow2_ck_allow_walk(c, s->l1_len);
    /* the entries past the end of the file are zeros (open held none) */
    for (uint64_t i = 0; i < s->l1_len; i++) {
        uint64_t e = s->l1[i], l2_offset = e & QCOW2_OFFSET_MASK, rc;
        if (!l2_offset)
            continue;
        if (stored_again(c, l2_offset / c->csz, &rc) < 0)
            continue; /* reported by compare() */
        if ((rc == 1) != ((e & QCOW2_OFLAG_COPIED) != 0)) {
            c->r->corruptions++;
            MSG(c, "ERROR OFLAG_COPIED L2 cluster: l1_index=%d l1_entry=%" PRIx64
                   " refcount=%" PRIu64 "\n", (int)i, e, rc);
        }
        /* a table seen before: the same findings */
        uint32_t id = qcow2_ck_index_get(&c->copied_index, l2_offset);
        if (id != NO_RECORD) {
            struct copied_pass *cp = &c->copied[id];
            if (ic_check_repeat(c->r, cp->text_from, cp->text_to) < 0)
                c->nomem = 1;
            c->r->corruptions += cp->found;
            if (qcow2_ck_spend(c, 1) < 0)
                return -1;
            continue;
        }
        c->l2_at = UINT64_MAX;
        uint64_t live = live_entries(c, l2_offset, s->h.cluster_size / 8);
        if ((c->copied_index.used < MEMO_MAX_KEYS && qcow2_ck_first_scan(c, live) < 0) ||
            qcow2_ck_spend(c, live + 1) < 0)
            return -1;
        if (l2_offset > QCOW2_MAX_OFFSET - c->csz ||
            qcow2_read_meta(c->img, c->l2, live * 8, l2_offset, "unreadable L2 table",
                            c->err) < 0) {
            MSG(c, "ERROR: Could not read L2 table: %s\n", strerror(EIO));
            return stop(c, EIO);
        }
        uint64_t corruptions = c->r->corruptions;
        int signaled = c->signaled;
        size_t text_from = c->r->messages_len;
        /* the entries past the end of the file are zeros: unallocated */
        for (uint64_t j = 0; j << s->extl2 < live; j++) {
            uint64_t l2e = qcow2_be64(&c->l2[j << s->extl2]), off = l2e & QCOW2_OFFSET_MASK;
            if ((l2e & QCOW2_OFLAG_COMPRESSED) || !off)
                continue;
            if (stored_again(c, off / c->csz, &rc) < 0)
                continue;
            if ((rc == 1) != ((l2e & QCOW2_OFLAG_COPIED) != 0)) {
                c->r->corruptions++;
                MSG(c, "ERROR OFLAG_COPIED data cluster: l2_entry=%" PRIx64 " refcount=%" PRIu64
                       "\n", l2e, rc);
            }
        }
        /* qemu's one-time message is not repeated: such a pass is not
         * remembered (there is one at most) */
        if (signaled == c->signaled)
            qcow2_ck_remember_copied(c, l2_offset, text_from, c->r->corruptions - corruptions);
    }
    return 0;
}

static int load_reftable(struct ck *c)
{
    const struct qcow2_header *h = &c->s->h;
    uint64_t bytes = (uint64_t)h->refcount_table_clusters * c->csz; /* <= 8 MiB: open */
    c->reftable_entries = bytes / 8;
    /* only the entries inside the file are read: the rest are zeros */
    c->reftable_live = live_entries(c, h->refcount_table_offset, c->reftable_entries);
    c->reftable = malloc(c->reftable_live ? c->reftable_live * 8 : 1);
    c->block = malloc(c->csz);
    if (!c->reftable || !c->block)
        return ic_error_nomem(c->err);
    if (unreadable(h->refcount_table_offset, bytes))
        return qcow2_corrupt(c->img, c->err, "unreadable refcount table",
                             h->refcount_table_offset);
    if (qcow2_read_meta(c->img, c->reftable, c->reftable_live * 8, h->refcount_table_offset,
                        "unreadable refcount table", c->err) < 0)
        return -1;
    for (uint64_t i = 0; i < c->reftable_live; i++)
        c->reftable[i] = qcow2_be64(&c->reftable[i]);
    return 0;
}

/* qcow2_check_read_snapshot_table: a version 3 image's snapshot entries
 * hold at least 16 bytes of extra data (the 64-bit VM state size and the
 * disk size).  qemu says so before it counts references. */
static void check_snapshot_entries(struct ck *c)
{
    const struct qcow2_state *s = c->s;
    if (s->h.version < 3)
        return;
    for (size_t i = 0; i < s->nsnapshots; i++) {
        if (s->snapshot_extra[i] < 16) {
            c->r->corruptions++;
            MSG(c, "ERROR snapshot table entry %d is incomplete\n", (int)i);
        }
    }
}

static int run(struct ck *c)
{
    const struct qcow2_header *h = &c->s->h;
    check_snapshot_entries(c);
    /* header */
    reference(c, 0, c->csz);
    if (check_l1(c, h->l1_table_offset, h->l1_size, 1) < 0 || check_snapshots(c) < 0)
        return -1;
    reference(c, h->refcount_table_offset, c->reftable_entries * 8);
    if (check_bitmaps(c) < 0)
        return -1;
    check_refblocks(c);
    uint64_t highest = compare(c);
    if (check_copied(c) < 0)
        return -1;
    c->r->image_end_offset = (highest + 1) * c->csz;
    return 0;
}

int qcow2_check(struct ic_image *img, struct ic_check_result *out, struct ic_error *err)
{
    struct qcow2_state *s = qcow2_state_of(img);
    struct ck c = {.img = img, .s = s, .r = out, .err = err, .csz = s->h.cluster_size,
                   .l2_at = UINT64_MAX};
    c.file_len = ic_image_size(s->file);
    c.nb_clusters = (c.file_len + c.csz - 1) / c.csz;
    out->total_clusters = (img->size + c.csz - 1) / c.csz;
    if (c.nb_clusters > INT32_MAX) { /* qemu's limit: EFBIG */
        out->check_errors++;
        out->failed_errno = EFBIG;
        return 0;
    }
    c.bits = 1u << s->h.refcount_order;
    c.per_block = c.csz * 8 / c.bits;
    c.count_max = c.bits >= 32 ? UINT32_MAX : (1ull << c.bits) - 1;
    /* references reach at most one cluster past the end of the file */
    c.ncounts = c.nb_clusters + 1;
    if (c.ncounts > COUNTS_MAX_BYTES / sizeof *c.counts)
        return ic_error_format(err, img->path, "the host file has %llu clusters: more than "
                               "imgcopy checks (%llu MiB of reference counts)",
                               (unsigned long long)c.nb_clusters, COUNTS_MAX_BYTES >> 20);
    c.counts = calloc(c.ncounts, sizeof *c.counts);
    c.l2 = malloc(c.csz);
    c.rec = calloc(1, sizeof *c.rec);
    int ret = c.counts && c.l2 && c.rec ? 0 : ic_error_nomem(err);
    c.l1_allowed = L1_ENTRIES_FLOOR + c.file_len / 8 * 2;
    c.first_allowed = FIRST_SCAN_FLOOR + c.file_len / 8 * 3 * 2;
    c.work_allowed = WORK_FLOOR;
    if (ret == 0)
        ret = load_reftable(&c);
    if (ret == 0 && run(&c) < 0 && !out->failed_errno)
        ret = -1; /* not qemu's way to stop: a hostile image or no memory */
    if (ret == 0 && c.nomem)
        ret = ic_error_nomem(err);
    free(c.counts);
    free(c.l2);
    qcow2_ck_free(&c);
    free(c.reftable);
    free(c.block);
    return ret;
}
