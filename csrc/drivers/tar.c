/* The tar member protocol: an image whose bytes are one member of a tar
 * archive, read in place (an OVA's disks, not extracted).  The archive is
 * a protocol image of its own (a file, an NBD export); this one
 * translates offsets into it, clips its block status to the member (so
 * holes of a sparse archive stay holes) and lends it its locks and
 * identity.  Read-only: a member's size is fixed by its header. */
#include <stdlib.h>
#include <string.h>

#include "tar.h"

struct member_state {
    struct ic_image *tar;
    uint64_t offset; /* of the member's data in the archive */
};

static struct member_state *state(const struct ic_image *img)
{
    return img->drv_state;
}

/* open_on: `img` becomes `member` of the archive `tar`, owning it */
static int member_open_on(struct ic_image *img, struct ic_image *tar, const char *member,
                          struct ic_error *err)
{
    struct ic_tar_member m;
    struct member_state *s;
    if (ic_tar_find(tar, member, &m, err) < 0) {
        ic_image_close(tar);
        return -1;
    }
    if (!(s = calloc(1, sizeof *s))) {
        ic_image_close(tar);
        return ic_error_nomem(err);
    }
    s->tar = tar;
    s->offset = m.data_offset;
    img->drv_state = s;
    img->size = m.size;
    return 0;
}

/* file_offset: the member's place in its archive, telling members of one
 * archive apart */
static uint64_t member_file_offset(const struct ic_image *img)
{
    return state(img) ? state(img)->offset : 0;
}

static void member_close(struct ic_image *img)
{
    struct member_state *s = state(img);
    if (s) {
        ic_image_close(s->tar);
        free(s);
        img->drv_state = NULL;
    }
}

static int member_pread(struct ic_image *img, void *buf, size_t len, uint64_t off,
                        struct ic_error *err)
{
    return ic_image_pread(state(img)->tar, buf, len, state(img)->offset + off, err);
}

/* A member's runs are the archive's, shifted: a vmdk in an OVA reads its
 * scattered grains as concurrently as the file would. */
static int member_pread_runs(struct ic_image *img, const struct ic_read_run *runs, size_t n,
                             struct ic_error *err)
{
    struct ic_read_run shifted[IC_READ_RUNS_MAX];
    for (size_t i = 0; i < n; i++) {
        shifted[i] = runs[i];
        shifted[i].off += state(img)->offset;
    }
    return ic_image_pread_runs(state(img)->tar, shifted, n, err);
}

/* The archive's extents over the member, shifted to the member's offsets
 * (host offsets too: the member is the file a format reads). */
static int member_block_status(struct ic_image *img, uint64_t start, uint64_t end,
                               uint64_t want, struct ic_extent_list *out, struct ic_error *err)
{
    struct member_state *s = state(img);
    uint64_t pos = start;
    unsigned extra = 0;
    while (pos < end && (pos <= want || extra < IC_WALK_EXTRA_EXTENTS)) {
        struct ic_extent e;
        uint64_t seeks = atomic_load(&s->tar->lseek_calls);
        int r = ic_image_block_status(s->tar, s->offset + pos, end - pos, &e, err);
        /* the archive's system calls are this image's, for its counters */
        atomic_fetch_add(&img->lseek_calls, atomic_load(&s->tar->lseek_calls) - seeks);
        if (r < 0)
            return -1;
        uint64_t len = e.length < end - pos ? e.length : end - pos;
        if (len == 0)
            return ic_error_format(err, img->path, "empty extent at offset %llu",
                                   (unsigned long long)(s->offset + pos));
        e.start = pos;
        e.length = len;
        e.host_offset = pos;
        e.depth = 0;
        if (ic_extent_list_add(out, &e, err) < 0)
            return -1;
        if (pos > want)
            extra++;
        pos += len;
    }
    return 0;
}

static int member_reads_as_hole(struct ic_image *img, uint64_t off, uint64_t len)
{
    return ic_image_reads_as_hole(state(img)->tar, state(img)->offset + off, len);
}

static int member_lock(struct ic_image *img, unsigned perm, unsigned shared,
                       struct ic_error *err)
{
    struct ic_image *tar = state(img)->tar;
    return tar->drv->lock ? tar->drv->lock(tar, perm, shared, err) : 0;
}

static int member_identity(struct ic_image *img, uint64_t *dev, uint64_t *ino, uint64_t *rdev)
{
    struct ic_image *tar = state(img)->tar;
    return tar->drv->identity ? tar->drv->identity(tar, dev, ino, rdev) : 0;
}

static uint64_t member_preferred_size(const struct ic_image *img)
{
    return ic_image_preferred_size(state(img)->tar);
}

static int member_tune(struct ic_image *img, unsigned connections, unsigned requests,
                       struct ic_error *err)
{
    return ic_image_tune(state(img)->tar, connections, requests, err);
}

static void member_settle_read(struct ic_image *img, uint64_t off, uint64_t len)
{
    ic_image_settle_read(state(img)->tar, state(img)->offset + off, len);
}

const struct ic_driver ic_protocol_tar_member = {
    .name = "tar-member",
    .kind = IC_PROTOCOL,
    .close = member_close,
    .pread = member_pread,
    .pread_runs = member_pread_runs,
    .block_status = member_block_status,
    .reads_as_hole = member_reads_as_hole,
    .lock = member_lock,
    .identity = member_identity,
    .preferred_size = member_preferred_size,
    .tune = member_tune,
    .settle_read = member_settle_read,
    .open_on = member_open_on,
    .file_offset = member_file_offset,
    .refuse_as_disk = ic_tar_refuse_as_disk,
};
