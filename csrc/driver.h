/* What a protocol or format driver provides to the image layer.  Every
 * operation returns 0 or -1 with details in `err`; none exits or prints.
 *
 * A protocol driver reaches bytes (drivers/file.c: a file or block device;
 * nbd.c: an NBD export; tar.c: a member of a tar archive, itself a
 * protocol image; null.c: the null sink).  A format driver (qcow2, vmdk,
 * vhdx, vpc) interprets the bytes
 * of a child image, img->file, which is a protocol image; it answers for
 * its own layer only: block status says where its layer does not hold a
 * range (IC_EXT_BELOW), and reads of such ranges go to
 * ic_image_read_below(); the image layer walks the backing chain.  "raw"
 * is no driver: a raw image is its protocol image.
 *
 * Required of every driver: name, kind, close, pread, block_status; of
 * protocols: open; of writable drivers: pwrite.  Everything else is
 * optional and has a default in the image layer (image_io.c). */
#ifndef IMGCOPY_DRIVER_H
#define IMGCOPY_DRIVER_H

#include <stdint.h>

#include "imgcopy.h"

struct ic_image;

/* An extent a format's own layer does not hold: the backing file (or
 * zeros past its end) answers for it. */
#define IC_EXT_BELOW (1u << 30)

/* Extents a block-status walk learns past the one asked for: enough that
 * a forward map costs one walk per this many extents, few enough that a
 * query stays cheap. */
#define IC_WALK_EXTRA_EXTENTS 256

enum ic_driver_kind { IC_PROTOCOL, IC_FORMAT };

/* The dirty ranges of a bitmap being stored, one at a time into *out, in
 * increasing order, not overlapping: 1, or 0 once there are no more, or
 * -1 with `err`. */
typedef int ic_dirty_next_fn(void *ctx, struct ic_range *out, struct ic_error *err);

/* The end of an asynchronous request: `err` NULL, or what went wrong. */
typedef void ic_aio_done_fn(void *ctx, const struct ic_error *err);

/* One range of a vectored read (pread_runs): `len` bytes at `off` into
 * `buf`. */
struct ic_read_run {
    void *buf;
    size_t len;
    uint64_t off;
};

/* The most runs one pread_runs call carries: enough for a 4 MiB request of
 * 64 KiB clusters, bounded so that drivers keep their bookkeeping on the
 * stack. */
#define IC_READ_RUNS_MAX 64

struct ic_driver {
    const char *name;
    enum ic_driver_kind kind;
    /* the format a protocol image reports (NULL: "raw") */
    const char *format_name;

    /* protocols: open what `path` names; fill img->size.  img->open_flags
     * say how. */
    int (*open_protocol)(struct ic_image *img, const char *path, struct ic_error *err);
    /* protocols: a destination of img->size bytes at `path`, new (a file:
     * with IC_CREATE_ATOMIC under a temporary name) or reused (a block
     * device); *fresh when it reads as zeros */
    int (*create_protocol)(struct ic_image *img, const char *path, int *fresh,
                           struct ic_error *err);
    /* formats: read the layout from img->file; fill img->size and, for a
     * backing file, img->backing_name and img->backing_format */
    int (*open)(struct ic_image *img, struct ic_error *err);
    /* formats: lay out a new image of img->size bytes on img->file (and
     * img->backing, opened by the image layer, for an overlay) */
    int (*create)(struct ic_image *img, int *fresh, struct ic_error *err);
    void (*close)(struct ic_image *img);

    /* Thread-safe for concurrent calls; ranges are inside the image. */
    int (*pread)(struct ic_image *img, void *buf, size_t len, uint64_t off,
                 struct ic_error *err);
    /* Protocols: read `n` (<= IC_READ_RUNS_MAX) ranges at once: a format's
     * scattered host reads of one request (a fragmented qcow2's clusters),
     * which the protocol keeps in flight together rather than waiting for
     * each in turn.  All or nothing: -1 when any run fails.  Without it
     * the image layer reads them one after another with pread. */
    int (*pread_runs)(struct ic_image *img, const struct ic_read_run *runs, size_t n,
                      struct ic_error *err);
    int (*pwrite)(struct ic_image *img, const void *buf, size_t len, uint64_t off,
                  struct ic_error *err);
    int (*zero)(struct ic_image *img, uint64_t off, uint64_t len, unsigned flags,
                struct ic_error *err);
    /* zero without IC_ZERO_MAY_UNMAP leaves the range allocated (a hole
     * punched only when asked): a format that makes zero clusters instead
     * gets fully allocated zeros written as data */
    int zero_allocates;
    int (*flush)(struct ic_image *img, struct ic_error *err);
    /* ic_image_checkpoint(): what flush does, and the metadata held in
     * memory written so that reopening with IC_OPEN_RESUME after a crash
     * at any later moment finds every write completed before the call;
     * thread-safe against concurrent writes (default: flush) */
    int (*checkpoint)(struct ic_image *img, struct ic_error *err);
    /* Append contiguous extents starting exactly at `start`, never past
     * `end`, covering `want` and, cheaply, more after it (up to
     * IC_WALK_EXTRA_EXTENTS; formats walking their tables count clusters,
     * grains or blocks): the caller holds the cache lock and records
     * everything appended. */
    int (*block_status)(struct ic_image *img, uint64_t start, uint64_t end, uint64_t want,
                        struct ic_extent_list *out, struct ic_error *err);
    /* block_status is as cheap at any offset as after the last answer:
     * the cache asks from the query, not from the start of the gap. */
    int random_access_status;

    /* Staged writes (see ic_staged_write); without them commit is one
     * pwrite (or zero). */
    int (*stage)(struct ic_image *img, struct ic_staged_write *w, struct ic_error *err);
    int (*place)(struct ic_image *img, struct ic_staged_write *w, struct ic_error *err);
    int (*commit)(struct ic_image *img, struct ic_staged_write *w, struct ic_error *err);
    void (*unstage)(struct ic_image *img, struct ic_staged_write *w);
    /* Writes must cover whole units of this size. */
    uint64_t (*write_alignment)(const struct ic_image *img);
    /* The smallest request the endpoint handles well (NBD's preferred
     * block size); 0: no preference */
    uint64_t (*preferred_size)(const struct ic_image *img);
    /* The longest zero request worth sending (default: IC_ZERO_LIMIT) */
    uint64_t (*zero_limit)(const struct ic_image *img);
    /* Write what is held in memory and mark the image complete (a format),
     * put a new file in place (a protocol); the image layer finishes the
     * format, then its file. */
    int (*finish)(struct ic_image *img, int sync, struct ic_error *err);
    /* The internal snapshots found at open. */
    int (*snapshots)(struct ic_image *img, const struct ic_snapshot **out, size_t *count);
    /* The persistent bitmaps found at open: the first `cap` into `out`;
     * returns how many there are (see ic_image_bitmaps). */
    size_t (*bitmaps)(struct ic_image *img, struct ic_bitmap *out, size_t cap);
    /* A persistent bitmap's dirty map (see ic_image_dirty_status): append
     * contiguous extents from exactly `start`, none past `end`, IC_EXT_DIRTY
     * or no flag, as far as is cheap (at least one extent).  The image
     * layer has checked the range and, for a driver with bitmaps(), that
     * `bitmap` is one it lists and not in use; a driver without it refuses
     * a name it lacks itself (a value error listing those it has).  Any
     * thread. */
    int (*dirty_status)(struct ic_image *img, const char *bitmap, uint64_t start, uint64_t end,
                        struct ic_extent_list *out, struct ic_error *err);
    /* Store a persistent bitmap (see ic_image_add_bitmap): `name` (not
     * empty), a bit per 2^granularity_bits bytes, `flags` 0 or
     * IC_BITMAP_AUTO, the dirty ranges from `next` (inside the image, as
     * ic_dirty_next_fn says: the driver refuses others); the image layer
     * has checked that the image is writable.  Without it: the format
     * keeps no bitmaps (ENOTSUP). */
    int (*add_bitmap)(struct ic_image *img, const char *name, unsigned granularity_bits,
                      unsigned flags, ic_dirty_next_fn *next, void *ctx, struct ic_error *err);
    /* What the header says, and the format's facts, for info and measure
     * (`out` arrives zeroed). */
    void (*describe)(struct ic_image *img, struct ic_image_info *out);
    /* qemu-img check of the format's own layer, read-only (`out` arrives
     * zeroed; detail lines go to out->messages).  Without it, checking the
     * image fails with ENOTSUP, as qemu's does for raw. */
    int (*check)(struct ic_image *img, struct ic_check_result *out, struct ic_error *err);

    /* Services of a protocol to the format above it, and to the copy: */
    /* the file's size becomes `size` (a qcow2 host file as it fills) */
    int (*truncate)(struct ic_image *img, uint64_t size, struct ic_error *err);
    /* give [off, off+len) disk space (a hint; never changes what it reads) */
    void (*allocate)(struct ic_image *img, uint64_t off, uint64_t len);
    /* bytes of disk the file holds */
    uint64_t (*allocated_bytes)(struct ic_image *img);
    /* whether [off, off+len) surely reads as zeros without reading it (a
     * hole): probing never reads holes */
    int (*reads_as_hole)(struct ic_image *img, uint64_t off, uint64_t len);
    /* qemu's image locks (lock.h) on what this protocol opened */
    int (*lock)(struct ic_image *img, unsigned perm, unsigned shared, struct ic_error *err);
    /* the files the image reads, as (dev, ino, rdev) for aliasing checks;
     * 0 when it has none */
    int (*identity)(struct ic_image *img, uint64_t *dev, uint64_t *ino, uint64_t *rdev);
    /* page-cache hints: `written` = the range was written earlier and
     * writeback was started: wait for it and drop its pages; `read` = the
     * range will not be read again */
    void (*settle_written)(struct ic_image *img, uint64_t off, uint64_t len);
    void (*settle_read)(struct ic_image *img, uint64_t off, uint64_t len);
    /* remote endpoints: the connections (0: as the server allows) and
     * requests in flight per connection a copy uses */
    int (*tune)(struct ic_image *img, unsigned connections, unsigned requests,
                struct ic_error *err);
    /* remote endpoints: a dropped connection is made again up to `retries`
     * times (the first after delay_ms, doubling) and its unanswered
     * requests sent again; 0: a drop fails the copy */
    void (*set_retries)(struct ic_image *img, unsigned retries, uint64_t delay_ms);
    /* stop now: what is in flight fails at once, later requests fail (a
     * remote endpoint shuts its connections down instead of draining
     * them); the image is good for nothing but closing.  Any thread. */
    void (*abort)(struct ic_image *img);
    /* Asynchronous I/O (remote endpoints): submit, and `done` runs once,
     * on any thread (perhaps before the call returns), with NULL or the
     * error.  A write's `buf` stays the caller's until then (no copy).
     * 1: submitted; 0: not for this range (do it synchronously); -1: err,
     * and `done` never runs. */
    int (*aio_pread)(struct ic_image *img, void *buf, size_t len, uint64_t off,
                     ic_aio_done_fn *done, void *ctx, struct ic_error *err);
    int (*aio_pwrite)(struct ic_image *img, const void *buf, size_t len, uint64_t off,
                      ic_aio_done_fn *done, void *ctx, struct ic_error *err);
    /* Remote endpoints: what a round trip is worth in bytes (a hole this
     * short costs less read through than asked around; 0: requests are
     * cheap), and the requests the endpoint keeps in flight at most. */
    uint64_t (*request_cost)(const struct ic_image *img);
    unsigned (*requests_in_flight)(const struct ic_image *img);
    /* 1: the endpoint answers one request after another (as measured by
     * request_cost, which is asked first), so a round trip is paid whole */
    int (*serialises)(const struct ic_image *img);
    /* copy in the kernel to another image of the same driver; -1 with
     * errnum ENOTSUP when it cannot */
    int (*copy_range)(struct ic_image *src, struct ic_image *dst, uint64_t off, uint64_t len,
                      struct ic_error *err);

    /* Containers: a protocol whose image is one member of another image,
     * the container (a tar archive's member, tar.c), chosen by the
     * registry (ic_container_for), never named by the image layer. */
    /* `img` (from ic_image_new with this driver) becomes the member `name`
     * of the container `child`, an open protocol image; fill img->size.
     * `img` owns `child` from now on, even when this fails. */
    int (*open_on)(struct ic_image *img, struct ic_image *child, const char *name,
                   struct ic_error *err);
    /* Where this image's bytes start in the host file its identity names
     * (members of one archive told apart; without it: 0). */
    uint64_t (*file_offset)(const struct ic_image *img);
    /* Refuse `container` (a protocol image holding this driver's kind of
     * container; `path` for the message, `member` if it is a member of
     * another one) opened as a disk image: a format error saying why it is
     * no disk and which members are.  Returns -1. */
    int (*refuse_as_disk)(struct ic_image *container, const char *path, const char *member,
                          struct ic_error *err);
    /* The file protocol: open `name` beneath the directory `dir` (see
     * ic_file_open_beneath in drivers/file.h) */
    int (*open_beneath)(struct ic_image *img, const char *owner, const char *what,
                        const char *dir, const char *name, struct ic_error *err);
};

/* registry.c: every protocol and format, and lookups in them */
const struct ic_driver *ic_format_driver(const char *name);  /* NULL: raw or unknown */
const struct ic_driver *ic_protocol_for(const char *path);
/* The container driver (open_on) for images of the probed format `format`
 * ("tar"), or NULL when that format is no container; NULL `format`: the
 * container a member name opens (members open without probing). */
const struct ic_driver *ic_container_for(const char *format);

extern const struct ic_driver ic_protocol_file;
extern const struct ic_driver ic_protocol_null;
extern const struct ic_driver ic_protocol_nbd;
/* chosen by a member name, never by a path (ic_container_for) */
extern const struct ic_driver ic_protocol_tar_member;
extern const struct ic_driver ic_format_qcow2;
extern const struct ic_driver ic_format_vmdk;
extern const struct ic_driver ic_format_vhdx;
extern const struct ic_driver ic_format_vpc;

#endif
