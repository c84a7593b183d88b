/* imgcopy core: the plain C API used by the Python glue, the C unit tests
 * and the fuzzers.  No Python here.
 *
 * Conventions: functions return 0 (or a non-negative count) on success and
 * -1 on failure, with details in the caller's struct ic_error. */
#ifndef IMGCOPY_H
#define IMGCOPY_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"

struct ic_pool; /* job.h: worker threads and a budget that jobs share */
struct ic_job;  /* job.h: a planner and items the pool runs */

/* Extent flags, qemu-img map's vocabulary. */
enum {
    IC_EXT_DATA = 1u << 0,         /* reads come from this image's storage  */
    IC_EXT_ZERO = 1u << 1,         /* reads return zeros                    */
    IC_EXT_PRESENT = 1u << 2,      /* allocated at `depth` of the chain     */
    IC_EXT_OFFSET_VALID = 1u << 3, /* host_offset means something           */
    IC_EXT_COMPRESSED = 1u << 4,
    /* a dirty map's (ic_image_dirty_status): a persistent bitmap marks the
     * range changed since it was started; the other flags then say nothing
     * (ic_extents_mark_dirty sets it on an extent map's extents) */
    IC_EXT_DIRTY = 1u << 5,
};

struct ic_extent {
    uint64_t start;
    uint64_t length;
    uint64_t host_offset; /* host offset of `start`, if IC_EXT_OFFSET_VALID */
    uint32_t flags;
    uint32_t depth;
};

struct ic_extent_list {
    struct ic_extent *items;
    size_t count;
    size_t capacity;
};

int ic_extent_list_push(struct ic_extent_list *list, const struct ic_extent *e);
/* The same, the failure (out of memory) in `err`. */
int ic_extent_list_add(struct ic_extent_list *list, const struct ic_extent *e,
                       struct ic_error *err);
/* ic_extent_list_add, or the last extent made longer where `e` continues
 * it (same flags, contiguous, host offsets contiguous where valid); the
 * items before `first` are never changed. */
int ic_extent_list_join(struct ic_extent_list *list, size_t first, const struct ic_extent *e,
                        struct ic_error *err);
void ic_extent_list_free(struct ic_extent_list *list);

/* Open flags. */
enum {
    IC_OPEN_RDWR = 1u << 0,
    IC_OPEN_DIRECT = 1u << 1,    /* O_DIRECT where requests are aligned */
    IC_OPEN_WRITEBACK = 1u << 2, /* start writeback behind each write  */
    IC_OPEN_FORCE = 1u << 3,     /* read a dirty or corrupt-flagged image */
    /* ic_image_create of a regular file: write it under a temporary name
     * in the same directory, renamed over `path` by ic_image_finish() and
     * removed by ic_image_close() without it, so that `path` never holds an
     * incomplete copy (block devices are written in place) */
    IC_CREATE_ATOMIC = 1u << 4,
    /* A copy's source: others may not write or resize it meanwhile (as
     * qemu-img convert locks its source) */
    IC_OPEN_SOURCE = 1u << 5,
    /* Read an image others write, as qemu-img -U does (read-only) */
    IC_OPEN_FORCE_SHARE = 1u << 6,
    /* Let an image's own content name files outside its directory (a vmdk
     * descriptor's extents with absolute paths or ".."): off by default, as
     * an untrusted image must not make imgcopy read arbitrary files */
    IC_OPEN_EXTERNAL_FILES = 1u << 7,
    /* Open the image alone, not the backing file it names (qemu-img info
     * without --backing-chain): for describing it only, as what it does
     * not hold then reads as zeros; read-only */
    IC_OPEN_NO_BACKING = 1u << 8,
    /* A raw destination others write too, each its own ranges (range
     * shards of one disk in several processes): shared as qemu's
     * share-rw=on shares it; a format's file is never shared so */
    IC_OPEN_SHARE_WRITE = 1u << 9,
    /* With IC_OPEN_RDWR: carry on writing an image a crash interrupted (a
     * resumed copy).  A qcow2 image imgcopy's writer left incomplete
     * (marked dirty and corrupt, v3; without its magic, v2: then the
     * format must be named, "qcow2", as no probe finds it) opens: its
     * refcounts are rebuilt from what its L1 and L2 tables reference, what
     * a crash left after the last referenced cluster is cut off, and
     * ic_image_finish() then writes a complete image.  What every
     * completed ic_image_checkpoint() made durable is there.  A complete
     * image opens as without the flag; other formats ignore it. */
    IC_OPEN_RESUME = 1u << 10,
};

struct ic_image;

struct ic_cache_stats {
    uint64_t hits;        /* block-status queries answered from memory  */
    uint64_t misses;      /* queries that had to ask the driver         */
    uint64_t lseek_calls; /* SEEK_DATA / SEEK_HOLE system calls made    */
    uint64_t intervals;   /* known intervals currently held             */
};

/* The format the file at `path` looks like: a readable format ("raw",
 * "qcow2") or one imgcopy recognises but cannot read ("vmdk", "vpc", ...);
 * "raw" when nothing else matches.  A static string. */
int ic_image_probe(const char *path, const char **format, struct ic_error *err);
/* Whether imgcopy can open images of this format. */
int ic_format_readable(const char *format);
/* The formats imgcopy reads ("raw" first), and those it can create: up to
 * `cap` static names in `names`; returns how many there are. */
size_t ic_formats(const char **names, size_t cap);
size_t ic_writable_formats(const char **names, size_t cap);

/* format: NULL probes; otherwise a driver name ("raw"). */
int ic_image_open(const char *path, const char *format, unsigned flags,
                  struct ic_image **out, struct ic_error *err);
/* The image in member `member` of the tar archive at `path` (a file or an
 * NBD URI), read in place; member NULL is ic_image_open.  Read-only.  Its
 * backing file, and a vmdk's extent files, are other members of the same
 * archive, named relative to the member's directory there. */
int ic_image_open_member(const char *path, const char *member, const char *format,
                         unsigned flags, struct ic_image **out, struct ic_error *err);
/* The probe of ic_image_probe, of a member of a tar archive (NULL: the file). */
int ic_image_probe_member(const char *path, const char *member, const char **format,
                          struct ic_error *err);
/* The tar member an image was opened from, or NULL. */
const char *ic_image_member(const struct ic_image *img);
/* How a new image is laid out (qcow2; raw ignores it). */
struct ic_create_options {
    uint64_t cluster_size; /* 0: 64 KiB */
    int compat_v2;         /* qcow2 version 2 ("compat=0.10") */
    int prealloc_metadata; /* allocate every cluster up front, unwritten */
    int compress;          /* store data clusters compressed */
    int compression_zstd;  /* qcow2 compression_type zstd, not zlib (deflate) */
    unsigned compression_level; /* 0: the type's default (compression.h) */
    const char *backing_file;   /* qcow2 overlay: its backing file, as stored */
    const char *backing_format; /* NULL: probe it */
};

/* qemu's names of the choices: compat "1.1" (or "v3") and "0.10" (or
 * "v2"); preallocation "off" and "metadata" (options.c). */
int ic_create_options_set_compat(struct ic_create_options *o, const char *name,
                                 struct ic_error *err);
int ic_create_options_set_preallocation(struct ic_create_options *o, const char *name,
                                        struct ic_error *err);
/* qemu's names of the qcow2 compression types: "zlib" and "zstd". */
int ic_create_options_set_compression_type(struct ic_create_options *o, const char *name,
                                           struct ic_error *err);
/* The library this build compresses compression type `name` with, and its
 * version ("libdeflate 1.14", "libzstd 1.5.4"), or NULL: none. */
const char *ic_compression_type_library(const char *name);
/* The libraries this build can use, as ic_library_version() names them:
 * zlib, libdeflate, zstd (linked), libnbd, libcrypto (loaded at run time). */
extern const char *const ic_libraries[];
/* The version of library `name` this build has ("1.5.4"), loading the
 * run-time ones; NULL where the build lacks it or the machine does. */
const char *ic_library_version(const char *name);
/* Whether a new image of `format` (NULL: raw; "null": the null sink) can
 * be laid out as `opts` (NULL: the defaults) says; ic_image_create()
 * checks this before it touches anything. */
int ic_create_options_check(const char *format, const struct ic_create_options *opts,
                            struct ic_error *err);

/* Create (or, for a block device, reuse) a writable image of `size`
 * bytes.  *fresh tells whether it is known to read as zeros.  Until
 * ic_image_finish() succeeds a new qcow2 image is marked incomplete. */
int ic_image_create(const char *path, const char *format, uint64_t size, unsigned flags,
                    const struct ic_create_options *opts, struct ic_image **out, int *fresh,
                    struct ic_error *err);
/* Write what the format keeps in memory (qcow2 metadata) and mark the
 * image complete; `sync` makes it durable first.  An image created with
 * IC_CREATE_ATOMIC is then renamed into place (and, with `sync`, the
 * rename made durable). */
int ic_image_finish(struct ic_image *img, int sync, struct ic_error *err);
void ic_image_close(struct ic_image *img);

uint64_t ic_image_size(const struct ic_image *img);
const char *ic_image_format(const struct ic_image *img);
const char *ic_image_path(const struct ic_image *img);
int ic_image_writable(const struct ic_image *img);
/* The image this one reads unallocated ranges from, or NULL. */
struct ic_image *ic_image_backing(const struct ic_image *img);
/* Where the image's backing file is (opened or not): the path the image
 * layer opens, or (*is_member set) the member of the image's own archive.
 * 0 without a backing file, or one that cannot be a file (too long a
 * name, another protocol, a member's name leaving its directory). */
int ic_image_backing_location(const struct ic_image *img, char *out, size_t cap,
                              int *is_member);
/* The file of this image or of its backing chain that `path` names (the
 * same inode, or the same block device), or NULL: a destination must
 * never be a file its source reads. */
const char *ic_image_reads_file(const struct ic_image *img, const char *path);
/* The length qemu gives an image: a raw file's rounded up to whole
 * 512-byte sectors (the tail reads as zeros). */
uint64_t ic_image_qemu_length(const struct ic_image *img);
int ic_image_has_backing_file(const struct ic_image *img);

/* The extent starting at `offset`, at most `length` bytes long.
 * offset + length must lie inside the image and length must be > 0. */
int ic_image_block_status(struct ic_image *img, uint64_t offset, uint64_t length,
                          struct ic_extent *out, struct ic_error *err);

/* Extents of [start, end), neighbours merged as qemu-img map merges them. */
int ic_image_map(struct ic_image *img, uint64_t start, uint64_t end,
                 struct ic_extent_list *out, struct ic_error *err);

int ic_image_pread(struct ic_image *img, void *buf, size_t len, uint64_t offset,
                   struct ic_error *err);
int ic_image_pwrite(struct ic_image *img, const void *buf, size_t len, uint64_t offset,
                    struct ic_error *err);

/* Zero flags. */
enum {
    IC_ZERO_MAY_UNMAP = 1u << 0, /* a hole is fine                           */
    IC_ZERO_FAST = 1u << 1,      /* fail with ENOTSUP rather than write zeros */
    /* the range reads as zeros already: only give it disk space (a new
     * file's fallocate), as cheaply as the driver can; without MAY_UNMAP */
    IC_ZERO_ALLOCATE = 1u << 2,
};
int ic_image_zero(struct ic_image *img, uint64_t offset, uint64_t length, unsigned flags,
                  struct ic_error *err);
int ic_image_flush(struct ic_image *img, struct ic_error *err);
/* A point a crash can be resumed from: every write that completed before
 * the call began is durable when it returns, and stays readable after a
 * crash at any later moment by opening the image with IC_OPEN_RESUME (a
 * qcow2 image's metadata is written so that it is consistent at every
 * step).  Writes still in flight meanwhile (other threads may go on
 * writing) may or may not be there after a crash, even in part.  Formats
 * keeping no metadata in memory: ic_image_flush(). */
int ic_image_checkpoint(struct ic_image *img, struct ic_error *err);

/* A write in three steps, so that a format can allocate host space in
 * guest order while the I/O stays parallel: stage (any thread: e.g.
 * compress), place (in guest order: allocate), commit (any thread: write).
 * `buf` must stay valid until commit; unstage drops a write never
 * committed.  Formats without placement write everything at commit.  A
 * write without `buf` makes the range read as zeros (a hole may do): an
 * overlay decides in guest order which clusters become zero clusters. */
struct ic_staged_write {
    uint64_t off;
    uint64_t len;
    const uint8_t *buf; /* NULL: zeros */
    void *priv;           /* the driver's */
    uint64_t scratch[2];  /* the driver's */
};
int ic_image_stage(struct ic_image *img, struct ic_staged_write *w, struct ic_error *err);
int ic_image_place(struct ic_image *img, struct ic_staged_write *w, struct ic_error *err);
int ic_image_commit(struct ic_image *img, struct ic_staged_write *w, struct ic_error *err);
void ic_image_unstage(struct ic_image *img, struct ic_staged_write *w);
/* Whether place() must be called in guest order. */
int ic_image_places_in_order(const struct ic_image *img);
/* Whether a zero without IC_ZERO_MAY_UNMAP leaves the range allocated (a
 * file, an NBD export): fully allocated output needs no written zeros. */
int ic_image_zero_allocates(const struct ic_image *img);
/* Writes must cover whole units of this many bytes (1: any range). */
uint64_t ic_image_write_alignment(const struct ic_image *img);
/* Zero ranges are cut into requests of at most this: local zeroing costs
 * nothing per request, so the default only keeps progress moving; a
 * remote destination says what its protocol carries. */
#define IC_ZERO_LIMIT (1ull << 30)
uint64_t ic_image_zero_limit(const struct ic_image *img);
/* The smallest request the image handles well (0: no preference): a
 * copy's requests and holes are at least this long. */
uint64_t ic_image_preferred_size(const struct ic_image *img);
/* How many connections and requests in flight a remote endpoint (the
 * image's protocol) uses; nothing for local files. */
int ic_image_tune(struct ic_image *img, unsigned connections, unsigned requests,
                  struct ic_error *err);
/* How often a remote endpoint's dropped connection is made again (its
 * unanswered requests sent again), the first after delay_ms, doubling. */
void ic_image_set_retries(struct ic_image *img, unsigned retries, uint64_t delay_ms);

/* A cancelled copy's endpoints: requests in flight fail at once instead of
 * being waited for (a remote endpoint's connections are shut down); the
 * image, its protocol and its backing chain can then only be closed. */
void ic_image_abort(struct ic_image *img);

/* Page-cache hygiene for a copy: wait for the writeback of a range written
 * a while ago and drop its pages; drop the pages of a range read once.
 * Hints only: they never fail. */
void ic_image_settle_written(struct ic_image *img, uint64_t off, uint64_t len);
void ic_image_settle_read(struct ic_image *img, uint64_t off, uint64_t len);

/* Copy [off, off+len) from src to dst in the kernel (copy_file_range).
 * Fails with ENOTSUP when the pair or the filesystem cannot. */
int ic_image_copy_range(struct ic_image *src, struct ic_image *dst, uint64_t off, uint64_t len,
                        struct ic_error *err);

/* An internal snapshot (qcow2), as qemu-img info lists it. */
struct ic_snapshot {
    char id[128];    /* cut at 127 bytes and at a NUL, as qemu does */
    char name[256];  /* cut at 255 bytes and at a NUL */
    uint64_t vm_state_size;
    uint64_t vm_clock_nsec;
    uint32_t date_sec;
    uint32_t date_nsec;
    int64_t icount; /* -1: not recorded */
};

/* The image's internal snapshots, in table order (none for most formats). */
int ic_image_snapshots(struct ic_image *img, const struct ic_snapshot **out, size_t *count);

/* A persistent dirty bitmap stored in the image (qcow2), as qemu-img info
 * lists it. */
enum {
    IC_BITMAP_IN_USE = 1u << 0, /* a program had it open for writing and did not
                                   close it: its bits may be stale (inconsistent) */
    IC_BITMAP_AUTO = 1u << 1,   /* enabled: writes through qemu update it */
};
struct ic_bitmap {
    const char *name;     /* as stored (UTF-8 by the spec); valid while the image is open */
    uint64_t granularity; /* bytes one bit covers */
    unsigned flags;       /* IC_BITMAP_* */
};
/* The image's persistent bitmaps, in the order it stores them: the first
 * `cap` into `out` (NULL with cap 0 counts them); returns how many it has.
 * None once the image has been written (imgcopy keeps no bitmap up to
 * date, and marks them invalid as qemu's readers expect). */
size_t ic_image_bitmaps(struct ic_image *img, struct ic_bitmap *out, size_t cap);

/* Dirty maps: where persistent bitmap `bitmap` of the image's own layer
 * (never its backing chain's) marks guest bytes changed since it was
 * started.  Extents of a dirty map carry IC_EXT_DIRTY (changed) or no flag
 * (clean), depth 0, no host offset; a bitmap marks whole granules, so
 * dirty ranges start and end on its granularity (or where the range asked
 * for starts or ends, or at the image's end).
 *
 * The errors, whatever the image's driver (a qcow2 image's bitmaps
 * extension, an NBD export's qemu:dirty-bitmap:NAME contexts):
 *   IC_ERR_VALUE   the format keeps no bitmaps, or none of that name (the
 *                  message lists those there are);
 *   IC_ERR_FORMAT  the bitmap is one qemu refuses: in use (a program had
 *                  it open for writing and did not close it), with qemu's
 *                  "Bitmap 'NAME' is inconsistent and cannot be used";
 *                  a corrupt bitmap table;
 *   IC_ERR_OS      its bits could not be read.
 * A disabled bitmap (not IC_BITMAP_AUTO) is read as any other. */

/* Contiguous extents appended to `out` from exactly `start`, none past
 * `end` (start < end <= the image's size), as many as the driver finds
 * cheaply (a bitmap cluster or a reply): at least one.  Neighbours it
 * appends differ in flags; the caller asks again from where they end. */
int ic_image_dirty_status(struct ic_image *img, const char *bitmap, uint64_t start,
                          uint64_t end, struct ic_extent_list *out, struct ic_error *err);
/* The dirty map of [start, start + length): extents appended to `out`
 * tiling the range, neighbours merged (an empty range appends none). */
int ic_image_dirty_map(struct ic_image *img, const char *bitmap, uint64_t start,
                       uint64_t length, struct ic_extent_list *out, struct ic_error *err);
/* An extent map (`ext`, `n` extents tiling a range) with a dirty map laid
 * over it: each extent cut where `dirty` (sorted, not overlapping) changes
 * between dirty and clean, IC_EXT_DIRTY set on the pieces inside its dirty
 * extents (host offsets follow the cuts); neighbours merged as qemu-img
 * map merges them.  Pure. */
int ic_extents_mark_dirty(const struct ic_extent *ext, size_t n, const struct ic_extent *dirty,
                          size_t ndirty, struct ic_extent_list *out, struct ic_error *err);

struct ic_range; /* below */

/* Storing persistent bitmaps, as qemu-img convert --bitmaps stores the
 * source's: in a qcow2 v3 image imgcopy creates (or resumes writing).
 * Bitmap `name` (qcow2: 1 to 1023 bytes, unique), a bit per `granularity`
 * bytes (a power of two; qcow2: 512 B to 2 GiB), `flags` 0 (disabled) or
 * IC_BITMAP_AUTO (enabled: qemu marks what the guest writes from then
 * on), its bits set for every granule the `n` ranges `dirty` touch (any
 * order, overlapping or not, inside the image).  Its bits are written
 * now; ic_image_finish() stores the bitmap (the image is incomplete until
 * it does).  Writes before that finish do not change its bits; a write
 * after it drops the image's stored bitmaps (imgcopy keeps none up to
 * date).  The writer lists none (ic_image_bitmaps): the image opened
 * again does.  Errors: IC_ERR_VALUE for what qemu refuses (the name, the
 * granularity, too many bitmaps or too large a one, a qcow2 v2 image, an
 * empty disk, a range outside the image), IC_ERR_OS with ENOTSUP for a
 * format that keeps no bitmaps or an existing qcow2 image, a read-only
 * image's error. */
int ic_image_add_bitmap(struct ic_image *img, const char *name, uint64_t granularity,
                        unsigned flags, const struct ic_range *dirty, size_t n,
                        struct ic_error *err);
/* Bitmap `name` of `src`'s own layer, stored into `dst` as
 * ic_image_add_bitmap() stores one: its granularity, whether it is
 * enabled, and its dirty map, read now a piece at a time.  `src` must
 * list it (ic_image_bitmaps: a qcow2 image; else IC_ERR_VALUE, "Source
 * lacks bitmap support") and qemu must be able to use it (in use:
 * IC_ERR_FORMAT, "Cannot copy inconsistent bitmap"); `dst` at least as
 * large as `src`. */
int ic_image_copy_bitmap(struct ic_image *dst, struct ic_image *src, const char *name,
                         struct ic_error *err);

/* What qemu-img info reports of an image beyond its sizes, as its format's
 * driver parsed it (info never parses a header a second time). */
enum ic_info_kind {
    IC_INFO_STRING,
    IC_INFO_INT,
    IC_INFO_BOOL,
    IC_INFO_BITMAPS, /* the image's bitmaps (ic_image_bitmaps), `number` of them, listed here */
};
struct ic_info_field {
    const char *key; /* qemu's name, e.g. "refcount-bits" */
    enum ic_info_kind kind;
    int64_t number; /* INT, BOOL, BITMAPS */
    char text[32];  /* STRING */
};
#define IC_INFO_MAX_FIELDS 16
struct ic_image_info {
    uint64_t cluster_size; /* 0: the format has none */
    int dirty;             /* not cleanly shut down */
    int has_backing;
    char backing_name[1024]; /* as the image stores it */
    char backing_format[16]; /* "": not stored */
    /* Facts of the format that info and measure need, each driver stating
     * its own (so that neither keeps a list of formats): */
    int may_hold_compressed; /* clusters (grains) may be stored compressed:
                                info counts them */
    int qemu_sees_all_data;  /* qemu 7.2 has no block status for the format and
                                takes all of this layer as data (measure, compare) */
    int stores_bitmaps;      /* the image can hold persistent bitmaps (a
                                qcow2 v3 image): measure reports their size */
    /* qemu-img info's "format-specific" data, in its order */
    size_t nfields;
    struct ic_info_field fields[IC_INFO_MAX_FIELDS];
};
void ic_image_describe(struct ic_image *img, struct ic_image_info *out);

void ic_image_cache_stats(struct ic_image *img, struct ic_cache_stats *out);
void ic_image_drop_cache(struct ic_image *img);

/* qemu-img map output.  `tail_end` > the last extent's end appends qemu's
 * view of a raw file rounded up to 512 bytes (a zero extent past EOF).
 * An empty list prints qemu's zero-length entry at `start`.  The result is
 * malloc'ed and NUL terminated. */
char *ic_format_map_json(const struct ic_extent *ext, size_t n, uint64_t start,
                         uint64_t tail_end, struct ic_error *err);
/* names[d] is the file printed for extents at depth d. */
char *ic_format_map_human(const struct ic_extent *ext, size_t n, uint64_t start,
                          uint64_t tail_end, const char *const *names, size_t nnames,
                          struct ic_error *err);

/* A dirty map's output, merging neighbours by IC_EXT_DIRTY alone (what
 * nbdinfo --map=qemu:dirty-bitmap:NAME tells, in qemu-img map's shapes):
 * JSON, one entry per range, `{ "start": S, "length": L, "dirty": B}`
 * (an empty list prints a zero-length clean entry at `start`); human,
 * the dirty ranges only, as qemu-img map prints data ranges, under
 * "Offset  Length  File" naming `file`.  malloc'ed, NUL terminated. */
char *ic_format_dirty_json(const struct ic_extent *ext, size_t n, uint64_t start,
                           struct ic_error *err);
char *ic_format_dirty_human(const struct ic_extent *ext, size_t n, const char *file,
                            struct ic_error *err);

/* Bytes of a list of extents by flag. */
struct ic_extent_totals {
    uint64_t data;
    uint64_t zero;
    uint64_t present;
    uint64_t compressed;
    uint64_t dirty;
};
void ic_extent_totals(const struct ic_extent *ext, size_t n, struct ic_extent_totals *out);

/* The two merge rules of qemu-img map. */
int ic_extent_mergeable(const struct ic_extent *cur, const struct ic_extent *next);

/* ---- copy engine (copy.c) ------------------------------------------- */

/* The requests a copy makes, as it makes them (for plans and tests). */
enum { IC_REQ_WRITE = 1, IC_REQ_ZERO = 2, IC_REQ_SKIP = 3 };
struct ic_request {
    uint64_t offset;
    uint64_t length;
    uint32_t kind;
    uint32_t reserved;
};
struct ic_request_log;
struct ic_request_log *ic_request_log_new(void);
void ic_request_log_free(struct ic_request_log *log);
/* The requests recorded so far, sorted by offset; NULL when none were
 * recorded or memory ran out (*count says which: 0 or how many). */
const struct ic_request *ic_request_log_sorted(struct ic_request_log *log, size_t *count);

/* An option the copy decides from its images (ic_copy_options_effective) */
#define IC_AUTO (-1)

/* qemu-img's limit of -S too */
#define IC_MAX_SPARSE_THRESHOLD (16u << 20)

struct ic_copy;

/* A byte range (offset, length) */
struct ic_range {
    uint64_t offset, length;
};
/* Sort ranges and merge those that overlap or touch, dropping empty ones,
 * in place (*n becomes their number); -1 with a value error naming the
 * first that reaches past `size`. */
int ic_ranges_normalize(struct ic_range *r, size_t *n, uint64_t size, struct ic_error *err);

struct ic_journal;

struct ic_copy_options {
    uint64_t sparse_threshold; /* zero runs this long become holes; 0: write all */
    uint64_t request_size;     /* bytes per read/write request             */
    unsigned concurrency;      /* work items in flight (a private pool's threads) */
    int out_of_order;          /* writes may complete in any order         */
    /* skip zero ranges instead of zeroing them; IC_AUTO: when the
     * destination is one ic_image_create() made reading as zeros */
    int target_is_zero;
    int offload;               /* copy_file_range for data                 */
    int flush;                 /* make the destination durable at the end  */
    /* remote endpoints (NBD) */
    unsigned connections;        /* 0: as the server allows (multi-conn: 4) */
    unsigned requests_in_flight; /* per connection (0: the default, 64)     */
    unsigned retries;            /* a dropped connection made again, times */
    uint64_t retry_delay_ms;     /* before the first retry; doubling        */
    struct ic_request_log *log; /* optional: record every request here     */
    /* Checksum the source from what the copy reads (blkhash, checksum.c):
     * the algorithm (NULL: none) and block size (0: 64 KiB); the hex
     * digest lands in ic_copy_stats.checksum.  Not in the field table:
     * front ends pass them on their own (Python: convert's checksum=). */
    const char *checksum;
    uint64_t checksum_block_size;
    /* optional: run on this pool (job.h), shared with other jobs, under its
     * budget of bytes in flight; NULL: threads of the copy's own */
    struct ic_pool *pool;
    /* Copy only these ranges of the source (a warm migration's changes):
     * every other destination byte is left as it is.  Any order, overlaps
     * allowed; ic_copy_start() sorts and merges a copy of them and refuses
     * one past the source's end.  has_changed 0: the whole source. */
    const struct ic_range *changed;
    size_t nchanged;
    int has_changed;
    /* Read the destination too and write only the blocks of this size
     * (guest-aligned) where it differs from the source; 0: off. */
    uint64_t compare_block_size;
    /* The checksum's block digests, told as they are known (blkhash.h's
     * sink: a journal records them, a range shard returns them). */
    void (*block_sink)(void *ctx, uint64_t first, uint64_t count, const uint8_t *digests);
    void *block_sink_ctx;
    /* A checksum with `changed` ranges: the digests of every block outside
     * them, handed in through ic_copy_put_digests() by this callback (a
     * resumed copy's recorded blocks); without it, `changed` must be one
     * range of whole blocks (or reaching the end), a shard, whose digests
     * the sink collects and whose copy makes no whole checksum. */
    int (*preset_digests)(void *ctx, struct ic_copy *c, struct ic_error *err);
    void *preset_ctx;
    /* Bytes of buffers the copy's items may hold at most (a fleet's share
     * of its memory limit): fewer items in flight; 0: as it needs. */
    uint64_t buffer_limit;
    /* A resumable copy: record in this journal (journal.h, opened by the
     * caller with the copy's identity, its size the source's) what is
     * done.  Every journal_interval_ms (0: 5 s), or sooner once
     * journal_interval_bytes more are done (0: by time only), the
     * destination is made durable and what was done before that recorded,
     * with the checksum's block digests when the journal keeps them (the
     * copy's checksum and block size must be the journal's then); at the
     * end, all of it.  A resumed journal's digests complete the checksum
     * of a copy of what is left (`changed`: what it does not hold).  Not
     * with compare_block_size nor block_sink.  Not in the field table. */
    struct ic_journal *journal;
    uint64_t journal_interval_ms;
    uint64_t journal_interval_bytes;
};


/* The defaults (options.c), and whether options are valid: ic_copy_start()
 * checks them before it touches the destination. */
void ic_copy_options_init(struct ic_copy_options *o);
int ic_copy_options_check(const struct ic_copy_options *o, struct ic_error *err);

/* What the rules of the options read of a copy's images (ic_copy_facts_of). */
struct ic_copy_facts {
    uint64_t dst_preferred;   /* the smallest request it handles well (0: any) */
    uint64_t dst_write_align; /* writes cover whole units of this (1: any range) */
    int dst_places_in_order;  /* allocates host space in guest order (qcow2) */
    int dst_fresh;            /* ic_image_create() made it, reading as zeros */
    int dst_discards;         /* the null sink: nothing to make durable */
    /* a serialising source's round trip, in bytes (0: the source answers
     * requests together, or they are cheap) */
    uint64_t src_serial_cost;
};
void ic_copy_facts_of(const struct ic_image *src, const struct ic_image *dst,
                      struct ic_copy_facts *out);
/* The options a copy runs with, from those asked for and the facts of its
 * images: the one place their rules live (options.c), pure.  -1 with
 * `err` when the options asked for are invalid (ic_copy_options_check). */
int ic_copy_options_effective(const struct ic_copy_options *asked,
                              const struct ic_copy_facts *facts,
                              struct ic_copy_options *out, struct ic_error *err);

#define IC_CHECKSUM_HEX_MAX 129 /* the longest digest (64 bytes) as hex, NUL */

struct ic_copy_stats {
    uint64_t bytes_read;
    uint64_t bytes_written;
    uint64_t bytes_zeroed;
    uint64_t bytes_skipped;
    uint64_t bytes_already_zero; /* of bytes_skipped: the destination read zeros already */
    uint64_t read_requests;
    uint64_t write_requests;
    uint64_t zero_requests;
    uint64_t extents;  /* source extents (data/zero runs) */
    uint64_t bytes_changed;  /* what was to be copied: the source, or its changed ranges */
    uint64_t bytes_compared; /* compare mode: destination bytes read and compared */
    uint64_t bytes_equal;    /* of them, in blocks equal to the source's (not written) */
    uint64_t done;     /* destination bytes dealt with so far */
    uint64_t total;
    char checksum[IC_CHECKSUM_HEX_MAX]; /* ic_copy_finish(): "" unless asked for */
};

struct ic_copy;

/* Start copying src [0, src size) to dst as a job (job.h) that runs until
 * the copy is done, fails or is cancelled.  src and dst must outlive it. */
int ic_copy_start(struct ic_image *src, struct ic_image *dst, const struct ic_copy_options *opt,
                  struct ic_copy **out, struct ic_error *err);
/* The job, to wait for, watch and cancel with job.h's calls. */
struct ic_job *ic_copy_job(struct ic_copy *c);
/* For preset_digests: blocks [first, first+count) known (NULL digests:
 * full zero blocks) */
int ic_copy_put_digests(struct ic_copy *c, uint64_t first, uint64_t count,
                        const uint8_t *digests, struct ic_error *err);
/* The options it runs with (ic_copy_options_effective), `log` and
 * `checksum` as asked. */
void ic_copy_options_used(const struct ic_copy *c, struct ic_copy_options *out);
void ic_copy_progress(struct ic_copy *c, struct ic_copy_stats *out);
/* Wait for the end and free the copy: 0 on success, -1 with the first
 * error (or cancellation, errnum ECANCELED) in err. */
int ic_copy_finish(struct ic_copy *c, struct ic_copy_stats *out, struct ic_error *err);

int ic_is_zero(const void *buf, size_t len);

/* ---- compare (compare.c) --------------------------------------------- */

/* How a comparison ended, as qemu-img compare reports it. */
enum ic_compare_outcome {
    IC_COMPARE_IDENTICAL = 0, /* "Images are identical."                    */
    IC_COMPARE_CONTENT,       /* "Content mismatch at offset <offset>!"     */
    IC_COMPARE_SIZE,          /* strict: "Strict mode: Image size mismatch!" */
    IC_COMPARE_STATUS,        /* strict: "Strict mode: Offset <offset> block status mismatch!" */
    IC_COMPARE_FAILED,        /* block status or a read failed (the error) */
};
/* What failed: qemu-img compare's exit codes 3 and 4. */
enum { IC_COMPARE_FAIL_STATUS = 3, IC_COMPARE_FAIL_READ = 4 };

/* A progress report qemu-img compare -p prints ("    (%3.2f/100%)\r"). */
struct ic_compare_progress {
    float percent; /* as qemu's float arithmetic gives it */
    int in_tail;   /* after "Warning: Image size mismatch!" */
};

struct ic_compare_options {
    unsigned concurrency; /* steps read at once */
    int strict;           /* qemu-img compare -s: sizes and block status too */
    int progress;         /* record the reports qemu-img compare -p prints */
    struct ic_pool *pool; /* optional: run on this pool (job.h) */
    /* optional, with progress: each report as it becomes final (every step
     * before it done without an outcome), in order; called from the
     * comparison's threads with its lock held: it must be quick */
    void (*report)(void *ctx, const struct ic_compare_progress *p);
    void *report_ctx;
};
void ic_compare_options_init(struct ic_compare_options *o);

struct ic_compare_result {
    int outcome;         /* enum ic_compare_outcome */
    int identical;
    uint64_t offset;     /* CONTENT, STATUS; FAILED: the step's start */
    uint64_t size_a, size_b; /* qemu's lengths (raw files rounded up to 512) */
    int size_mismatch;
    int in_tail;         /* found past the end of the smaller image */
    int warned;          /* qemu printed "Warning: Image size mismatch!" first */
    int failed_image;    /* FAILED: 0 (a) or 1 (b) */
    int failed_step;     /* FAILED: IC_COMPARE_FAIL_STATUS or _READ */
    uint64_t bytes_read_a, bytes_read_b;
    /* with options.progress: the reports qemu prints before the outcome
     * (after the 0% it prints first); free with ic_compare_result_free() */
    struct ic_compare_progress *progress;
    size_t nprogress;
};
void ic_compare_result_free(struct ic_compare_result *r);

/* Compare a and b (opened read-only) as qemu-img compare does; the first
 * difference is the one qemu reports whatever the threads do.  0 with the
 * outcome in `out`; -1 with `err` when an image could not be read, `out`
 * then saying where (outcome FAILED) or nothing (outcome 0: bad options,
 * no memory). */
int ic_compare(struct ic_image *a, struct ic_image *b, const struct ic_compare_options *opt,
               struct ic_compare_result *out, struct ic_error *err);
/* The same as a job (job.h) to watch and cancel (ECANCELED) while it runs:
 * start, then finish (which waits, frees it and gives what ic_compare()
 * gives).  ic_compare_job() is NULL when the outcome was known at once. */
struct ic_compare;
int ic_compare_start(struct ic_image *a, struct ic_image *b, const struct ic_compare_options *opt,
                     struct ic_compare **out, struct ic_error *err);
struct ic_job *ic_compare_job(struct ic_compare *c);
int ic_compare_finish(struct ic_compare *c, struct ic_compare_result *out, struct ic_error *err);

/* ---- the structs front ends fill in and show, by name (fields.c) ------ */

/* A field of one of the structs above, for front ends that take options
 * as keywords and show counters as dicts (the Python glue): a new option
 * or counter is a row in a table, not code in every front end. */
enum ic_field_kind {
    IC_FIELD_U64,      /* uint64_t                                  */
    IC_FIELD_UNSIGNED, /* unsigned                                  */
    IC_FIELD_FLAG,     /* int, 0 or 1                               */
    IC_FIELD_AUTO_FLAG, /* int, 0, 1 or IC_AUTO (Python: None)      */
    IC_FIELD_TEXT,     /* const char *, NULL for none               */
    IC_FIELD_CHOICE,   /* one of the names `choose` takes           */
};

struct ic_field {
    const char *name;
    enum ic_field_kind kind;
    size_t offset;
    /* IC_FIELD_CHOICE: sets the struct at `s` as `name` says */
    int (*choose)(void *s, const char *name, struct ic_error *err);
};

/* Each table ends with a row whose name is NULL. */
extern const struct ic_field ic_copy_option_fields[];   /* struct ic_copy_options */
extern const struct ic_field ic_create_option_fields[]; /* struct ic_create_options */
extern const struct ic_field ic_copy_stats_fields[];    /* struct ic_copy_stats: the result */
extern const struct ic_field ic_cache_stats_fields[];   /* struct ic_cache_stats */

/* ---- checksums (checksum.c; blkhash.h has the construction) ----------- */

/* blkhash's checksum (blksum >= 0.10, nbdcopy --blkhash) of an image's
 * guest content: the extent map decides what is read; zero ranges cost
 * nothing, data is read and hashed by worker threads.  A copy computes
 * its source's from what it reads (ic_copy_options.checksum). */

struct ic_checksum_options {
    const char *algorithm; /* hashlib's name (or OpenSSL's); NULL: sha256 */
    uint64_t block_size;   /* 0: 64 KiB */
    unsigned threads;      /* 0: 4 */
    uint64_t request_size; /* bytes per read; 0: 2 MiB */
    uint64_t length;       /* hash [0, length); 0: the whole image */
    struct ic_pool *pool;  /* optional: run on this pool (job.h), threads its slots */
};

/* The names of the algorithms libcrypto provides (static strings): how
 * many there are, up to `cap` stored; -1 (ENOSYS) without libcrypto. */
int ic_checksum_algorithms(const char **names, size_t cap, struct ic_error *err);
/* Whether a checksum can be made with this algorithm and block size (0:
 * the default), before anything is opened. */
int ic_checksum_check(const char *algorithm, uint64_t block_size, struct ic_error *err);

struct ic_checksum;
/* Start hashing `img` (which must outlive the job) as a job (job.h). */
int ic_checksum_start(struct ic_image *img, const struct ic_checksum_options *opt,
                      struct ic_checksum **out, struct ic_error *err);
/* The job, to wait for, watch and cancel with job.h's calls. */
struct ic_job *ic_checksum_job(struct ic_checksum *c);
/* Join the threads and free the job: the digest as hex into `hex`
 * (IC_CHECKSUM_HEX_MAX bytes), or -1 with the first error (ECANCELED when
 * cancelled). */
int ic_checksum_finish(struct ic_checksum *job, char *hex, struct ic_error *err);
/* ---- consistency check (check.c; qemu-img check) ----------------------- */

/* What qemu-img check reports, with qemu's names.  `messages` holds the
 * detail lines qemu prints on stderr while it checks ("ERROR ...",
 * "Leaked cluster ..."), each ending in a newline; malloc'ed, may be NULL. */
struct ic_check_result {
    uint64_t corruptions, leaks, check_errors, corruptions_fixed, leaks_fixed;
    uint64_t image_end_offset;
    uint64_t total_clusters, allocated_clusters, fragmented_clusters, compressed_clusters;
    /* qemu's check stopped (it then prints "Check failed: <strerror>"):
     * the errno, else 0 */
    int failed_errno;
    char *messages;
    size_t messages_len;
};
/* Check the image's own layer read-only, as qemu-img check (without -r)
 * does.  -1 with errnum ENOTSUP for formats without a checker (raw): qemu's
 * "This image format does not support checks".  `out` is filled even when
 * failed_errno is set; free it with ic_check_result_free. */
int ic_image_check(struct ic_image *img, struct ic_check_result *out, struct ic_error *err);
void ic_check_result_free(struct ic_check_result *r);

#endif
