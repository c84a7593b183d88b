/* The qcow2 driver's parts, by data structure, each depending only on the
 * ones listed before it:
 *   qcow2_format.c  the header: parsed, checked, written (pure functions)
 *   qcow2_codec.c   compressed clusters: L2 entry codec, inflate, deflate
 *   qcow2_l2.c      the L2 tables, one store for reading and writing
 *   qcow2_alloc.c   refcounts and host allocation
 *   qcow2_tables.c  the snapshot table and bitmap directory
 *   qcow2_dirty.c   a persistent bitmap's bits, read as a dirty map
 *   qcow2_read.c    reads and block status
 *   qcow2_header_write.c
 *                   the header a writer writes, marked incomplete first
 *   qcow2_bitmaps_write.c
 *                   persistent bitmaps a writer stores
 *   qcow2_write.c   staged writes, zeros (a write after a finish drops
 *                   the bitmaps it stored)
 *   qcow2_finish.c  checkpoints, finishing
 *   qcow2_create.c  new images, and writers of existing ones
 *   qcow2_resume.c  writers of images a crash left incomplete
 *   qcow2_check.c   qemu-img check: refcounts recomputed and compared
 *   qcow2.c         the state's life (open, create, close), the driver table */
#ifndef IMGCOPY_QCOW2_STATE_H
#define IMGCOPY_QCOW2_STATE_H

#include <pthread.h>
#include <string.h>

#include "../compression.h"
#include "../image.h"
#include "qcow2_format.h"

/* Clean L2 tables kept in memory, whatever the cluster size. */
#define L2_CACHE_BYTES (32u << 20)
#define L2_CACHE_MIN_SLOTS 4u
#define L2_CACHE_MAX_SLOTS 256u
/* Clusters a block-status walk classifies past the one asked for. */
#define WALK_EXTRA_CLUSTERS 4096u
/* imgcopy writes 16-bit refcounts, as qemu does. */
#define QCOW2_WRITE_REFCOUNT_ORDER 4
#define QCOW2_REFCOUNT_MAX 0xffffu

/* A clean table's place in the LRU. */
struct l2_slot {
    uint64_t l1_index; /* UINT64_MAX: free */
    uint64_t used;     /* LRU tick */
};

/* What the store knows of a table it holds, by L1 index: */
enum {
    L2_DIRTY = 1u << 0,    /* changed since finish() last wrote it: pinned */
    L2_CHANGED = 1u << 1,  /* changed since a checkpoint last took it */
    L2_UNLINKED = 1u << 2, /* its place is not in the L1 table on disk yet */
};

/* Tables by L1 index.  Clean ones (as on disk) are evicted least recently
 * used first; dirty ones (changed since finish() last wrote them) stay
 * until it writes them. */
struct l2_store {
    uint64_t **tables; /* per L1 index: entries in host byte order, or NULL */
    uint8_t *dirty;    /* per L1 index: L2_* flags (0: clean) */
    struct l2_slot *slots;
    unsigned nslots;
    uint64_t tick;
};

struct qcow2_new_bitmap; /* qcow2_bitmaps_write.c */

/* What a writable image keeps beyond the reader's state. */
struct qcow2_writer {
    int existing; /* opened, not created: its header is patched, not rewritten */
    /* opened with IC_OPEN_RESUME: an image imgcopy's writer laid out, whose
     * header is written anew (as a new image's) */
    int resumed;
    uint8_t header[QCOW2_HEADER_READ]; /* existing: the header as found */
    int compress;
    enum ic_compression_type compression; /* the header's compression_type */
    int compression_level;                /* 0: the type's default */
    int marked; /* the header says incomplete: written to since finish() */
    int bitmaps_dropped; /* a header was written: its auto-clear bits say no bitmaps */
    /* host allocation (qcow2_alloc.c) */
    uint16_t *rc; /* refcount per host cluster */
    uint64_t rc_len;
    uint64_t host_end;    /* first free byte, a cluster boundary */
    uint64_t file_size;   /* the host file's size, >= host_end */
    uint64_t comp_cursor; /* where the next compressed cluster may go; 0: none */
    uint64_t ref_start, ref_clusters; /* refcount structures finish() wrote */
    /* persistent bitmaps to store (qcow2_bitmaps_write.c): their bits are
     * written when they are added, their tables and the directory by
     * finish(); `stored`: the last finish() stored them (the complete
     * header names that directory) */
    struct qcow2_new_bitmap **new_bitmaps;
    size_t nnew_bitmaps;
    uint64_t bitmap_dir_bytes; /* the directory's size, entries of new_bitmaps */
    int bitmaps_stored;
    uint64_t bitmap_dir_off; /* the directory finish() wrote (0: none), in clusters: */
    uint64_t bitmap_dir_clusters;
    size_t header_written; /* bytes of the header last written (a shorter one pads with zeros) */
};

struct qcow2_state {
    struct qcow2_header h;
    struct ic_image *file; /* the host file: img->file, the image layer's */
    uint64_t *l1;          /* host byte order: its first l1_len entries */
    /* Entries of the L1 table held in memory (and by the L2 store's
     * arrays): a reader's are those inside the host file, the rest read as
     * zeros (qcow2_l1_entry); a writer's are all h.l1_size of them. */
    uint64_t l1_len;
    uint64_t l2_entries;   /* entries per L2 table */
    /* extended L2 entries (read only): each entry is followed by its
     * subcluster bitmap, and a cluster is read in 32 subclusters */
    int extl2;
    uint64_t unit_size;    /* a cluster, or a subcluster with extl2 */

    /* guards the L1 and L2 tables and the writer's allocation state */
    pthread_mutex_t meta_lock;
    /* one checkpoint or finish at a time (taken before meta_lock): only
     * they change the L1 table */
    pthread_mutex_t checkpoint_lock;
    struct l2_store l2;

    /* qemu asks the host file about holes under data clusters only when
     * the image looks metadata-preallocated; decided on first use */
    pthread_mutex_t prealloc_lock;
    int prealloc_checked;
    int prealloc;

    struct qcow2_writer *w; /* a writable image, or NULL */

    struct ic_snapshot *snapshots; /* the snapshot table, read at open */
    uint32_t *snapshot_extra;      /* each entry's extra_data_size */
    size_t nsnapshots;

    /* the persistent bitmaps, from the directory read at open (none when
     * the auto-clear bit says a program unaware of them wrote the image
     * last); their names live in bitmap_names */
    struct qcow2_bitmap *bitmaps;
    size_t nbitmaps;
    char *bitmap_names;

    /* what dirty maps read last (qcow2_dirty.c): a window of a bitmap
     * table and a cluster of bits, made on first use, under dirty_lock */
    pthread_mutex_t dirty_lock;
    struct qcow2_dirty_cache *dirty;
};

static inline struct qcow2_state *qcow2_state_of(struct ic_image *img)
{
    return img->drv_state;
}

/* L1 entry i: past the entries in memory, 0 (no L2 table). */
static inline uint64_t qcow2_l1_entry(const struct qcow2_state *s, uint64_t i)
{
    return i < s->l1_len ? s->l1[i] : 0;
}

/* How many of the n 8-byte entries of a table at `off` hold bytes of a
 * file of `file_len` bytes: the rest read as zeros (qcow2_read_meta, as
 * qemu reads past the end), and a zero entry names nothing.  A table
 * sized by a header field costs what the file holds, not what it claims. */
static inline uint64_t qcow2_entries_in_file(uint64_t file_len, uint64_t off, uint64_t n)
{
    if (off >= file_len)
        return 0;
    uint64_t live = (file_len - off) / 8 + ((file_len - off) % 8 != 0);
    return live < n ? live : n;
}

/* The entries of bitmap tables a file justifies: those of tables that do
 * not overlap (as in an image qemu wrote) twice over, plus a floor.  A
 * hostile directory may name one table thousands of times. */
static inline uint64_t qcow2_bitmap_entries_allowed(uint64_t file_len)
{
    return (1ull << 16) + file_len / 8 * 2;
}

static inline int qcow2_corrupt(struct ic_image *img, struct ic_error *err, const char *what,
                                uint64_t value)
{
    return ic_error_format(err, img->path, "corrupt qcow2 image: %s (0x%llx)", what,
                           (unsigned long long)value);
}

/* Bytes of the host file; reads past its end return zeros, as qemu's do. */
static inline int qcow2_read_meta(struct ic_image *img, void *buf, uint64_t len, uint64_t off,
                                  const char *what, struct ic_error *err)
{
    struct ic_image *file = qcow2_state_of(img)->file;
    if (off > QCOW2_MAX_OFFSET || len > QCOW2_MAX_OFFSET - off)
        return qcow2_corrupt(img, err, what, off);
    uint64_t fsize = ic_image_size(file);
    uint64_t n = off >= fsize ? 0 : (fsize - off < len ? fsize - off : len);
    if (n && ic_image_pread(file, buf, (size_t)n, off, err) < 0)
        return -1;
    memset((uint8_t *)buf + n, 0, (size_t)(len - n));
    return 0;
}

/* qcow2_codec.c: a compressed cluster's L2 entry names `len` bytes at
 * host offset `host`. */
void qcow2_compressed_decode(const struct qcow2_header *h, uint64_t entry, uint64_t *host,
                             uint64_t *len);
uint64_t qcow2_compressed_encode(const struct qcow2_header *h, uint64_t host, uint64_t len);
/* The compressed cluster of L2 entry `entry`, inflated into `out` (one
 * cluster). */
int qcow2_inflate_cluster(struct ic_image *img, uint64_t entry, uint8_t *out,
                          struct ic_error *err);
/* One cluster compressed as the writer's image says (its compression_type,
 * the level asked for) into at most `cap` bytes: 0, 1 when it does not
 * fit (stored as it is), -1 with errno (ic_compress). */
int qcow2_compress_cluster(const struct qcow2_writer *w, const uint8_t *in, size_t len,
                           uint8_t *out, size_t cap, size_t *out_len);
/* The compression a header's compression_type names. */
static inline enum ic_compression_type qcow2_compression(const struct qcow2_header *h)
{
    return h->compression_type == QCOW2_COMPRESSION_ZSTD ? IC_COMPRESSION_ZSTD
                                                         : IC_COMPRESSION_DEFLATE;
}

/* qcow2_l2.c.  Needs s->l1 and s->h.  Without meta_lock held: */
int qcow2_l2_init(struct ic_image *img, struct ic_error *err);
/* A writer may set any L1 entry: all h.l1_size of them in memory (the
 * ones past the end of the file, zeros). */
int qcow2_l1_hold_all(struct ic_image *img, struct ic_error *err);
void qcow2_l2_free(struct qcow2_state *s);
/* Up to `n` entries from guest cluster `gc` on, within one table: *got of
 * them, and with extended L2 entries their subcluster bitmaps in `bitmaps`
 * (NULL: not wanted).  A table that does not exist reads as zero entries. */
int qcow2_l2_get(struct ic_image *img, uint64_t gc, uint64_t n, uint64_t *out,
                 uint64_t *bitmaps, uint64_t *got, struct ic_error *err);
/* Whether L1 entry i has a table, in memory or on disk. */
int qcow2_l2_has_table(struct qcow2_state *s, uint64_t l1_index);
/* With meta_lock held: */
/* The table of guest cluster gc, to change: loaded or made, and kept
 * until finish() writes it; flagged changed for the next checkpoint (the
 * caller changes it before it lets go of meta_lock). */
uint64_t *qcow2_l2_for_update(struct ic_image *img, uint64_t gc, struct ic_error *err);
/* The entries of table i when it has changes to write, else NULL. */
const uint64_t *qcow2_l2_dirty(const struct qcow2_state *s, uint64_t l1_index);
/* Every changed table is written (s->l1 says where): they become clean. */
void qcow2_l2_written(struct qcow2_state *s);

/* qcow2_alloc.c.  With meta_lock held (but for count_refcounted): */
/* The writer's refcounts from the image's refcount structures; those are
 * freed (write_refcounts writes new ones at the end). */
int qcow2_alloc_load(struct ic_image *img, struct ic_error *err);
/* `n` whole clusters at the end of the file. */
int qcow2_alloc_clusters(struct ic_image *img, uint64_t n, uint64_t *host, struct ic_error *err);
/* `len` bytes for a compressed cluster. */
int qcow2_alloc_bytes(struct ic_image *img, uint64_t len, uint64_t *host, struct ic_error *err);
/* Drop one reference to the host cluster at `host` / to the bytes of the
 * compressed cluster of L2 entry `entry`. */
void qcow2_release_cluster(struct qcow2_state *s, uint64_t host);
void qcow2_release_compressed(struct qcow2_state *s, uint64_t entry);
/* Refcount table and blocks for every host cluster, written. */
int qcow2_write_refcounts(struct ic_image *img, struct ic_error *err);
/* The writer's refcounts become `rc` (for `rc_len` clusters, malloc'ed:
 * owned from now on, even on failure), and the host file is cut (or
 * grown) to `end`, a cluster boundary past every cluster in use. */
int qcow2_alloc_adopt(struct ic_image *img, uint16_t *rc, uint64_t rc_len, uint64_t end,
                      struct ic_error *err);
void qcow2_alloc_free(struct qcow2_writer *w);
/* qemu's test for metadata preallocation: how many of the first
 * `end_cluster` host clusters have a refcount, counting up to `threshold`;
 * -1 when the refcount structures are unreadable.  Any state. */
int qcow2_count_refcounted(struct ic_image *img, uint64_t end_cluster, uint64_t threshold,
                           uint64_t *count);

/* qcow2_tables.c: the snapshot table and the bitmap directory, read and
 * checked at open as qemu does (the bitmaps' tables too). */
int qcow2_load_snapshots(struct ic_image *img, struct ic_error *err);
int qcow2_load_bitmaps(struct ic_image *img, struct ic_error *err);
int qcow2_snapshots(struct ic_image *img, const struct ic_snapshot **out, size_t *count);
size_t qcow2_bitmaps(struct ic_image *img, struct ic_bitmap *out, size_t cap);

/* qcow2_dirty.c: the dirty map of bitmap `name` (the driver's
 * dirty_status); what it keeps, freed at close. */
int qcow2_dirty_status(struct ic_image *img, const char *name, uint64_t start, uint64_t end,
                       struct ic_extent_list *out, struct ic_error *err);
void qcow2_dirty_free(struct qcow2_state *s);

/* qcow2_read.c */
int qcow2_pread(struct ic_image *img, void *buf, size_t len, uint64_t off,
                struct ic_error *err);
int qcow2_block_status(struct ic_image *img, uint64_t start, uint64_t end, uint64_t want,
                       struct ic_extent_list *out, struct ic_error *err);

/* qcow2_write.c */
int qcow2_stage(struct ic_image *img, struct ic_staged_write *w, struct ic_error *err);
int qcow2_place(struct ic_image *img, struct ic_staged_write *w, struct ic_error *err);
int qcow2_commit(struct ic_image *img, struct ic_staged_write *w, struct ic_error *err);
void qcow2_unstage(struct ic_image *img, struct ic_staged_write *w);
int qcow2_pwrite(struct ic_image *img, const void *buf, size_t len, uint64_t off,
                 struct ic_error *err);
int qcow2_zero(struct ic_image *img, uint64_t off, uint64_t len, unsigned flags,
               struct ic_error *err);
int qcow2_flush(struct ic_image *img, struct ic_error *err);
uint64_t qcow2_write_alignment(const struct ic_image *img);
/* With meta_lock held: the clusters under guest [off, end) get host
 * clusters of their own, which a write may fill. */
int qcow2_ensure_clusters(struct ic_image *img, uint64_t off, uint64_t end,
                          struct ic_error *err);
/* qcow2_header_write.c: the header a writer writes.  Marked complete or
 * not (with meta_lock held, or before any other thread has the image). */
int qcow2_write_header(struct ic_image *img, int complete, struct ic_error *err);
/* The first change after opening or after finish() marks the image
 * incomplete until the next finish(): 1 marked now, 0 it was already, -1
 * an error.  A write of the guest's data that marks it drops the bitmaps
 * the last finish() stored (imgcopy keeps no bitmap up to date).
 * meta_lock held. */
int qcow2_mark_written_locked(struct ic_image *img, struct ic_error *err);

/* qcow2_bitmaps_write.c: persistent bitmaps a writer stores (a new image,
 * v3, or one resumed), as qemu-img convert --bitmaps stores them.  Without
 * meta_lock: the driver's add_bitmap (driver.h), whose bits are written
 * at once, into clusters of their own (none for a cluster without a bit
 * set). */
int qcow2_add_bitmap(struct ic_image *img, const char *name, unsigned granularity_bits,
                     unsigned flags, ic_dirty_next_fn *next, void *ctx, struct ic_error *err);
/* With meta_lock held: */
/* finish(): every bitmap's table, then the directory, in new clusters
 * (those the last finish() wrote freed); the header then names them. */
int qcow2_store_bitmaps(struct ic_image *img, struct ic_error *err);
/* A write after the finish() that stored them: the bitmaps and every
 * cluster of theirs go. */
void qcow2_drop_bitmaps(struct qcow2_state *s);
/* Any state: what the writer keeps of them, freed (close). */
void qcow2_new_bitmaps_free(struct qcow2_writer *w);

/* qcow2_finish.c */
int qcow2_checkpoint(struct ic_image *img, struct ic_error *err);
int qcow2_finish(struct ic_image *img, int sync, struct ic_error *err);

/* qcow2_check.c: qemu-img check, read-only */
int qcow2_check(struct ic_image *img, struct ic_check_result *out, struct ic_error *err);

/* qcow2_create.c: the writer of a new image (the state allocated, its
 * header to fill) or of an opened one. */
int qcow2_create_new(struct ic_image *img, int *fresh, struct ic_error *err);
int qcow2_open_writer(struct ic_image *img, struct ic_error *err);

/* qcow2_resume.c: the writer of an image imgcopy's writer left incomplete
 * (IC_OPEN_RESUME): its refcounts made from the clusters its header, L1
 * and L2 tables reference (every entry checked), its host file cut after
 * the last of them.  The writer's state is allocated, its L1 held whole. */
int qcow2_resume_rebuild(struct ic_image *img, struct ic_error *err);

#endif
