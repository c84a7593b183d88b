/* VMDK, read-only (see vmdk_state.h for the parts): open, the extent
 * list with each extent's guest range, reads and block status routed to
 * extents, and what qemu-img info reports.
 *
 * img->file is either a sparse extent with an embedded descriptor
 * (monolithicSparse, streamOptimized), read as the single extent, or a
 * descriptor file naming extent files, opened through the image layer
 * (relative to the descriptor, inside its directory).  A delta disk names
 * its parent in parentFileNameHint: the image layer opens it as the
 * backing file, and what the delta does not hold is IC_EXT_BELOW. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vmdk_state.h"

/* Grain table entries a block-status walk classifies past the one asked
 * for. */
#define WALK_EXTRA_GRAINS 8192u

static void vmdk_close(struct ic_image *img)
{
    struct vmdk_state *s = vmdk_state_of(img);
    if (!s)
        return;
    for (size_t i = 0; i < s->next; i++) {
        if (s->ext[i].owned)
            ic_image_close(s->ext[i].file);
        free(s->ext[i].gd);
    }
    free(s->ext);
    vmdk_cache_free(s);
    pthread_mutex_destroy(&s->gt_lock);
    free(s);
    img->drv_state = NULL;
}

/* Up to `cap` bytes of text at `off` of `file`, NUL terminated. */
static char *read_text(struct ic_image *file, uint64_t off, uint64_t cap, struct ic_error *err)
{
    uint64_t fsize = ic_image_size(file);
    uint64_t n = off >= fsize ? 0 : (fsize - off < cap ? fsize - off : cap);
    char *t = malloc((size_t)n + 1);
    if (!t) {
        ic_error_nomem(err);
        return NULL;
    }
    if (n && ic_image_pread(file, t, (size_t)n, off, err) < 0) {
        free(t);
        return NULL;
    }
    t[n] = '\0';
    return t;
}

static struct vmdk_extent *add_extent(struct ic_image *img, struct ic_error *err)
{
    struct vmdk_state *s = vmdk_state_of(img);
    if (s->next >= VMDK_MAX_EXTENTS) {
        vmdk_error(err, img->path, "more than %u extents", VMDK_MAX_EXTENTS);
        return NULL;
    }
    struct vmdk_extent *p = realloc(s->ext, (s->next + 1) * sizeof *p);
    if (!p) {
        ic_error_nomem(err);
        return NULL;
    }
    s->ext = p;
    struct vmdk_extent *e = &p[s->next++];
    memset(e, 0, sizeof *e);
    e->start = s->next > 1 ? p[s->next - 2].end : 0;
    return e;
}

/* The extents a descriptor names, one after the other in the guest. */
static int open_extents(struct ic_image *img, const struct vmdk_desc *d, struct ic_error *err)
{
    for (size_t i = 0; i < d->nextents; i++) {
        const struct vmdk_desc_extent *x = &d->extents[i];
        struct vmdk_extent *e = add_extent(img, err);
        if (!e)
            return -1;
        e->type = x->type;
        if (ic_image_open_extent_file(img, x->name, &e->file, err) < 0)
            return -1;
        e->owned = 1;
        e->file_size = ic_image_size(e->file);
        if (x->type == VMDK_TYPE_SPARSE) {
            struct vmdk_sparse_header h;
            if (vmdk_sparse_open(img, e, &h, err) < 0)
                return -1;
            if (h.capacity == 0 && h.desc_offset && !e->grain)
                return vmdk_error(err, img->path, "extent '%s' is itself a descriptor",
                                  x->name);
        } else {
            e->flat = 1;
            e->flat_offset = x->flat_offset * VMDK_SECTOR;
            e->end = e->start + x->sectors * VMDK_SECTOR;
        }
        if (e->end < e->start || e->end > (UINT64_C(1) << 62))
            return vmdk_error(err, img->path, "the extents add up to more than 4 EiB");
    }
    return 0;
}

static int from_descriptor(struct ic_image *img, const char *text, struct vmdk_desc *d,
                           struct ic_error *err)
{
    if (vmdk_parse_descriptor(text, strlen(text), 0, d, img->path, err) < 0)
        return -1;
    if (vmdk_check_create_type(d, img->path, err) < 0)
        return -1;
    snprintf(vmdk_state_of(img)->create_type, sizeof vmdk_state_of(img)->create_type, "%s",
             d->create_type);
    if (!d->nextents)
        return vmdk_error(err, img->path, "the descriptor names no extents");
    return open_extents(img, d, err);
}

/* A sparse file: the single extent, and its embedded descriptor for the
 * CIDs and the parent; or (capacity 0) a descriptor file stored in it. */
static int from_sparse(struct ic_image *img, struct vmdk_desc *d, struct ic_error *err)
{
    struct vmdk_state *s = vmdk_state_of(img);
    struct vmdk_extent *e = add_extent(img, err);
    if (!e)
        return -1;
    e->type = VMDK_TYPE_SPARSE;
    e->file = img->file;
    e->file_size = ic_image_size(img->file);
    struct vmdk_sparse_header h;
    if (vmdk_sparse_open(img, e, &h, err) < 0)
        return -1;
    if (h.capacity == 0 && h.desc_offset && !e->grain) {
        if (h.desc_offset > ic_image_size(img->file) / VMDK_SECTOR)
            return vmdk_error(err, img->path, "descriptor offset past the end of the file");
        s->next = 0;
        char *text = read_text(img->file, h.desc_offset * VMDK_SECTOR, VMDK_DESC_MAX, err);
        if (!text)
            return -1;
        int r = from_descriptor(img, text, d, err);
        free(text);
        return r;
    }
    snprintf(s->create_type, sizeof s->create_type, "%s",
             e->compressed ? "streamOptimized" : "monolithicSparse");
    /* qemu reads the CIDs and the parent from 20 sectors at 512, wherever
     * the header says the descriptor is */
    uint64_t off = 1, len = VMDK_EMBEDDED_DESC_MIN;
    char *text = read_text(img->file, off * VMDK_SECTOR, len, err);
    if (!text)
        return -1;
    int r = vmdk_parse_descriptor(text, strlen(text), 1, d, img->path, err);
    free(text);
    return r;
}

static int load(struct ic_image *img, struct ic_error *err)
{
    struct vmdk_state *s = vmdk_state_of(img);
    uint64_t fsize = ic_image_size(img->file);
    uint8_t magic[4];
    if (fsize < 4)
        return vmdk_error(err, img->path, "file is too small, not a valid image");
    if (ic_image_pread(img->file, magic, 4, 0, err) < 0)
        return -1;
    struct vmdk_desc d;
    memset(&d, 0, sizeof d);
    int r;
    if (memcmp(magic, VMDK4_MAGIC, 4) == 0 || memcmp(magic, VMDK3_MAGIC, 4) == 0) {
        r = from_sparse(img, &d, err);
    } else {
        char *text = read_text(img->file, 0, VMDK_DESC_MAX, err);
        if (!text)
            return -1;
        r = from_descriptor(img, text, &d, err);
        free(text);
    }
    vmdk_desc_free(&d);
    if (r < 0)
        return -1;
    /* qemu refuses a descriptor without both CIDs */
    if (!d.has_cid || !d.has_parent_cid)
        return vmdk_error(err, img->path, "the descriptor has no %s",
                          d.has_cid ? "parentCID" : "CID");
    s->cid = d.cid;
    s->parent_cid = d.parent_cid;
    img->size = s->next ? s->ext[s->next - 1].end : 0;
    if (img->size > (UINT64_C(1) << 62))
        return vmdk_error(err, img->path, "a disk of more than 4 EiB");
    if (d.has_parent_hint) {
        snprintf(img->backing_name, sizeof img->backing_name, "%s", d.parent_hint);
        snprintf(img->backing_format, sizeof img->backing_format, "vmdk");
    }
    return 0;
}

static int vmdk_open(struct ic_image *img, struct ic_error *err)
{
    if (img->open_flags & IC_OPEN_RDWR)
        return vmdk_error(err, img->path, "vmdk images are read-only here");
    struct vmdk_state *s = calloc(1, sizeof *s);
    if (!s)
        return ic_error_nomem(err);
    pthread_mutex_init(&s->gt_lock, NULL);
    img->drv_state = s;
    if (load(img, err) < 0) {
        vmdk_close(img);
        return -1;
    }
    return 0;
}

/* The extent holding guest byte `off` (< img->size). */
static size_t find_extent(const struct vmdk_state *s, uint64_t off)
{
    size_t lo = 0, hi = s->next;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (s->ext[mid].start <= off)
            lo = mid;
        else
            hi = mid;
    }
    /* empty extents share their start with the next one */
    while (lo + 1 < s->next && s->ext[lo].end <= off)
        lo++;
    return lo;
}

/* ---- reads ----------------------------------------------------------- */

/* qemu reads a delta's unallocated grains from its parent only while the
 * parent's CID is the one the delta recorded: a parent changed since
 * would show through with other data. */
static int parent_valid(struct ic_image *img, struct ic_error *err)
{
    struct vmdk_state *s = vmdk_state_of(img);
    if (!img->backing || atomic_load(&s->parent_checked))
        return 0;
    const struct ic_image *p = img->backing;
    if (p->drv != &ic_format_vmdk)
        return vmdk_error(err, img->path, "the parent of a vmdk delta must be a vmdk image");
    const struct vmdk_state *ps = p->drv_state;
    if (ps->cid != s->parent_cid)
        return vmdk_error(err, img->path, "parentCID %08x does not match the parent's CID "
                          "%08x: the parent changed after this delta was made",
                          s->parent_cid, ps->cid);
    atomic_store(&s->parent_checked, 1);
    return 0;
}

/* A sparse extent's share of a read: its data grains go into `data`, read
 * when the whole request's are known (vmdk_pread). */
static int read_sparse(struct ic_image *img, size_t xi, uint8_t *buf, uint64_t len, uint64_t off,
                       struct ic_read_batch *data, struct ic_error *err)
{
    struct vmdk_state *s = vmdk_state_of(img);
    const struct vmdk_extent *e = &s->ext[xi];
    uint8_t *grain_buf = NULL;
    uint32_t entries[VMDK_MAX_GTES];
    int ret = 0;
    while (len > 0 && ret == 0) {
        uint64_t rel = off - e->start, gi = rel / e->grain, got;
        uint64_t want = (rel % e->grain + len + e->grain - 1) / e->grain;
        if (vmdk_sparse_entries(img, xi, gi, want, entries, &got, err) < 0) {
            ret = -1;
            break;
        }
        for (uint64_t i = 0; i < got && len > 0 && ret == 0;) {
            enum vmdk_grain_kind k = vmdk_sparse_kind(e, entries[i]);
            uint64_t in = (off - e->start) % e->grain;
            uint64_t n = e->grain - in < len ? e->grain - in : len;
            uint64_t j = i + 1;
            /* grains of a kind, host data contiguous, go in one request */
            while (j < got && n < len && k != VMDK_COMPRESSED) {
                enum vmdk_grain_kind kj = vmdk_sparse_kind(e, entries[j]);
                if (kj != k || (k == VMDK_DATA && (uint64_t)entries[j] !=
                                (uint64_t)entries[i] + (j - i) * (e->grain / VMDK_SECTOR)))
                    break;
                n += e->grain < len - n ? e->grain : len - n;
                j++;
            }
            switch (k) {
            case VMDK_UNALLOC:
                ret = parent_valid(img, err);
                if (ret == 0)
                    ret = ic_image_read_below(img, buf, (size_t)n, off, err);
                break;
            case VMDK_ZEROED:
                memset(buf, 0, (size_t)n);
                break;
            case VMDK_DATA:
                ret = ic_read_batch_add_padded(data, e->file, buf, (size_t)n,
                                               (uint64_t)entries[i] * VMDK_SECTOR + in, err);
                break;
            case VMDK_COMPRESSED: {
                if (!grain_buf && !(grain_buf = malloc((size_t)e->grain))) {
                    ret = ic_error_nomem(err);
                    break;
                }
                uint64_t gstart = off - in, need = e->end - gstart;
                ret = vmdk_sparse_inflate(img, e, entries[i], grain_buf,
                                          need < e->grain ? need : e->grain, err);
                if (ret == 0)
                    memcpy(buf, grain_buf + in, (size_t)n);
                break;
            }
            }
            buf += n;
            off += n;
            len -= n;
            i = j;
        }
    }
    free(grain_buf);
    return ret;
}

static int vmdk_pread(struct ic_image *img, void *vbuf, size_t len, uint64_t off,
                      struct ic_error *err)
{
    struct vmdk_state *s = vmdk_state_of(img);
    uint8_t *buf = vbuf;
    /* the request's grains, scattered in their files, are read together
     * once all are known, not waited for one after another */
    struct ic_read_batch data;
    ic_read_batch_init(&data);
    while (len > 0) {
        size_t xi = find_extent(s, off);
        const struct vmdk_extent *e = &s->ext[xi];
        uint64_t n = e->end - off < len ? e->end - off : len;
        int r = e->flat ? ic_read_batch_add_padded(&data, e->file, buf, (size_t)n,
                                                   e->flat_offset + (off - e->start), err)
                        : read_sparse(img, xi, buf, n, off, &data, err);
        if (r < 0)
            return -1;
        buf += n;
        off += n;
        len -= (size_t)n;
    }
    return ic_read_batch_flush(&data, err);
}

/* ---- block status ----------------------------------------------------- */

struct walk {
    struct ic_extent_list *out;
    size_t first; /* items before this one are not ours to merge */
};

/* A flat extent's data: holes of its file read as zeros (qemu's
 * BDRV_BLOCK_RECURSE), as does what lies past its end. */
static int status_flat(const struct vmdk_extent *e, uint64_t pos, uint64_t end, struct walk *w,
                       struct ic_error *err)
{
    while (pos < end) {
        uint64_t h = e->flat_offset + (pos - e->start);
        struct ic_extent x;
        if (ic_image_data_status(e->file, pos, h, end - pos, &x, err) < 0 ||
            ic_extent_list_join(w->out, w->first, &x, err) < 0)
            return -1;
        pos += x.length;
    }
    return 0;
}

static uint32_t grain_flags(enum vmdk_grain_kind k)
{
    switch (k) {
    case VMDK_UNALLOC:
        return IC_EXT_BELOW;
    case VMDK_ZEROED:
        return IC_EXT_ZERO | IC_EXT_PRESENT;
    case VMDK_DATA:
        return IC_EXT_DATA | IC_EXT_PRESENT | IC_EXT_OFFSET_VALID;
    case VMDK_COMPRESSED:
        return IC_EXT_DATA | IC_EXT_PRESENT | IC_EXT_COMPRESSED;
    }
    return 0;
}

/* [pos, end) of sparse extent xi, stopping early once past `want`. */
static int status_sparse(struct ic_image *img, size_t xi, uint64_t pos, uint64_t end,
                         uint64_t want, struct walk *w, uint64_t *done, struct ic_error *err)
{
    const struct vmdk_extent *e = &vmdk_state_of(img)->ext[xi];
    uint32_t entries[VMDK_MAX_GTES];
    uint64_t extra = 0, span = (uint64_t)e->gtes * e->grain;
    while (pos < end && (pos <= want || extra < WALK_EXTRA_GRAINS)) {
        uint64_t rel = pos - e->start, gi = rel / e->grain, gdi = gi / e->gtes;
        if (gdi < e->gd_entries && vmdk_gd_entry(e, gdi) == 0) {
            /* grain tables never allocated: one unallocated run (past the
             * entries inside the file, none is) */
            uint64_t g = gdi;
            while (g < e->gd_len && e->gd[g] == 0 && e->start + g * span < end)
                g++;
            if (g >= e->gd_len)
                g = e->gd_entries;
            uint64_t run_end = e->start + g * span;
            if (run_end > end || g >= e->gd_entries)
                run_end = end;
            struct ic_extent x = {.start = pos, .length = run_end - pos, .flags = IC_EXT_BELOW};
            if (ic_extent_list_join(w->out, w->first, &x, err) < 0)
                return -1;
            if (pos > want)
                extra += g - gdi;
            pos = run_end;
            continue;
        }
        uint64_t got;
        uint64_t n = (end - pos + rel % e->grain + e->grain - 1) / e->grain;
        if (vmdk_sparse_entries(img, xi, gi, n, entries, &got, err) < 0)
            return -1;
        for (uint64_t i = 0; i < got && pos < end; i++) {
            enum vmdk_grain_kind k = vmdk_sparse_kind(e, entries[i]);
            uint64_t gstart = e->start + (gi + i) * e->grain;
            uint64_t gend = gstart + e->grain < end ? gstart + e->grain : end;
            struct ic_extent x = {.start = pos, .length = gend - pos, .flags = grain_flags(k)};
            if (k == VMDK_DATA)
                x.host_offset = (uint64_t)entries[i] * VMDK_SECTOR + (pos - gstart);
            if (ic_extent_list_join(w->out, w->first, &x, err) < 0)
                return -1;
            if (pos > want)
                extra++;
            pos = gend;
        }
    }
    *done = pos;
    return 0;
}

static int vmdk_block_status(struct ic_image *img, uint64_t start, uint64_t end, uint64_t want,
                             struct ic_extent_list *out, struct ic_error *err)
{
    struct vmdk_state *s = vmdk_state_of(img);
    struct walk w = {out, out->count};
    uint64_t pos = start;
    while (pos < end && pos <= want) {
        size_t xi = find_extent(s, pos);
        const struct vmdk_extent *e = &s->ext[xi];
        uint64_t stop = e->end < end ? e->end : end;
        if (e->flat) {
            if (status_flat(e, pos, stop, &w, err) < 0)
                return -1;
            pos = stop;
        } else if (status_sparse(img, xi, pos, stop, want, &w, &pos, err) < 0) {
            return -1;
        }
    }
    return 0;
}

/* ---- info ------------------------------------------------------------- */

/* qemu-img info's vmdk "format-specific" (qemu 7.2's keys and order; the
 * per-extent list has no place in ic_image_info). */
static void vmdk_describe(struct ic_image *img, struct ic_image_info *out)
{
    struct vmdk_state *s = vmdk_state_of(img);
    /* qemu reports a cluster size when every extent is alike and sparse */
    int alike = s->next > 0 && !s->ext[0].flat;
    for (size_t i = 1; i < s->next && alike; i++)
        alike = !s->ext[i].flat && s->ext[i].compressed == s->ext[0].compressed &&
                s->ext[i].grain == s->ext[0].grain;
    out->cluster_size = alike ? s->ext[0].grain : 0;
    out->may_hold_compressed = 1; /* streamOptimized grains */
    out->has_backing = img->backing_name[0] != '\0';
    snprintf(out->backing_name, sizeof out->backing_name, "%.*s",
             (int)sizeof out->backing_name - 1, img->backing_name);
    snprintf(out->backing_format, sizeof out->backing_format, "%.*s",
             (int)sizeof out->backing_format - 1, img->backing_format);
    ic_image_info_add(out, "cid", IC_INFO_INT, s->cid, NULL);
    ic_image_info_add(out, "parent-cid", IC_INFO_INT, s->parent_cid, NULL);
    ic_image_info_add(out, "create-type", IC_INFO_STRING, 0, s->create_type);
}

const struct ic_driver ic_format_vmdk = {
    .name = "vmdk",
    .kind = IC_FORMAT,
    .open = vmdk_open,
    .close = vmdk_close,
    .pread = vmdk_pread,
    .block_status = vmdk_block_status,
    .random_access_status = 1,
    .describe = vmdk_describe,
};
