/* The image layer: opening an image (its protocol, probing, qemu's locks,
 * its format, its backing chain), creating one, closing it.  A raw image
 * is its protocol image; any other format is an image on top of one. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "image.h"
#include "lock.h"
#include "probe.h"

struct ic_image *ic_image_new(const char *path, const struct ic_driver *drv, unsigned flags,
                              uint64_t size)
{
    struct ic_image *img = calloc(1, sizeof *img);
    if (!img)
        return NULL;
    if (!(img->path = strdup(path)) || ic_cache_init(img) < 0) {
        free(img->path);
        free(img);
        return NULL;
    }
    img->drv = drv;
    img->open_flags = flags;
    img->size = size;
    img->meta_budget = IC_CHAIN_META_BUDGET;
    return img;
}

void ic_image_free(struct ic_image *img)
{
    ic_cache_destroy(img);
    free(img->path);
    free(img->member);
    free(img);
}

void ic_image_close(struct ic_image *img)
{
    if (!img)
        return;
    img->drv->close(img);
    ic_image_close(img->backing);
    ic_image_close(img->file);
    ic_image_free(img);
}

/* ---- probing ------------------------------------------------------------ */

/* The format name the first and last bytes of a protocol image look like;
 * holes are never read (probing must not change what SEEK_DATA says). */
static int probe_protocol(struct ic_image *p, const char **format, struct ic_error *err)
{
    uint8_t head[IC_PROBE_HEAD], tail[IC_PROBE_TAIL];
    size_t hlen = p->size < sizeof head ? (size_t)p->size : sizeof head, tlen = 0;
    if (ic_image_reads_as_hole(p, 0, hlen))
        memset(head, 0, hlen);
    else if (hlen && ic_image_pread(p, head, hlen, 0, err) < 0)
        return -1;
    if (p->size >= sizeof tail && !ic_image_reads_as_hole(p, p->size - sizeof tail, sizeof tail)) {
        if (ic_image_pread(p, tail, sizeof tail, p->size - sizeof tail, err) < 0)
            return -1;
        tlen = sizeof tail;
    }
    *format = ic_probe_format(head, hlen, tail, tlen);
    return 0;
}

/* The container format a protocol image's head looks like (probe.c), or
 * NULL (read errors: NULL, the format's own open then says what fails). */
static const char *container_look(struct ic_image *p)
{
    uint8_t head[IC_PROBE_HEAD];
    if (p->size < sizeof head || ic_image_reads_as_hole(p, 0, sizeof head) ||
        ic_image_pread(p, head, sizeof head, 0, NULL) < 0)
        return NULL;
    return ic_probe_container(head, sizeof head);
}

static int open_protocol(const char *path, const char *member, unsigned flags,
                         struct ic_image **out, struct ic_error *err);

/* A member of the archive at `path`: the archive opened by its own
 * protocol, and the member's bytes in it, by the registry's container. */
static int open_member(const char *path, const char *member, unsigned flags,
                       struct ic_image **out, struct ic_error *err)
{
    const struct ic_driver *container = ic_container_for(NULL);
    struct ic_image *archive, *p;
    if (open_protocol(path, NULL, flags, &archive, err) < 0)
        return -1;
    if (!(p = ic_image_new(path, container, flags, 0)) || !(p->member = strdup(member))) {
        if (p)
            ic_image_free(p);
        ic_image_close(archive);
        return ic_error_nomem(err);
    }
    if (container->open_on(p, archive, member, err) < 0) {
        ic_image_close(p);
        return -1;
    }
    *out = p;
    return 0;
}

static int open_protocol(const char *path, const char *member, unsigned flags,
                         struct ic_image **out, struct ic_error *err)
{
    if (member)
        return open_member(path, member, flags, out, err);
    const struct ic_driver *proto = ic_protocol_for(path);
    if (!proto->open_protocol)
        return ic_error_value(err, "%s can only be a destination", path);
    struct ic_image *p = ic_image_new(path, proto, flags, 0);
    if (!p)
        return ic_error_nomem(err);
    if (proto->open_protocol(p, path, err) < 0) {
        ic_image_close(p);
        return -1;
    }
    *out = p;
    return 0;
}

int ic_image_probe(const char *path, const char **format, struct ic_error *err)
{
    return ic_image_probe_member(path, NULL, format, err);
}

int ic_image_probe_member(const char *path, const char *member, const char **format,
                          struct ic_error *err)
{
    struct ic_image *p;
    if (open_protocol(path, member, 0, &p, err) < 0)
        return -1;
    int r = probe_protocol(p, format, err);
    ic_image_close(p);
    return r;
}

/* ---- locks, as qemu takes them (lock.c) ------------------------------- */

enum {
    CR = IC_PERM_CONSISTENT_READ,
    W = IC_PERM_WRITE,
    WU = IC_PERM_WRITE_UNCHANGED,
    RS = IC_PERM_RESIZE,
};

/* What an image does to its chain: a writer writes and shares only reads
 * (as a VM's disk: qemu cannot write what imgcopy writes); a copy's
 * source reads and lets nobody write (qemu-img convert's source); a
 * reader reads and shares all (qemu-img map).  A backing file is read,
 * and written by others only if the image above lets them. */
static void node_role(unsigned flags, const struct ic_image *above, unsigned *perm,
                      unsigned *shared)
{
    if (above) {
        *perm = above->lock_perm & CR;
        *shared = CR | WU | ((above->lock_shared & W) ? W | RS : 0);
    } else if (flags & IC_OPEN_RDWR) {
        *perm = CR | W;
        *shared = CR | WU | ((flags & IC_OPEN_SHARE_WRITE) ? W : 0);
    } else {
        *perm = CR;
        *shared = (flags & IC_OPEN_SOURCE) ? CR | WU : IC_PERM_ALL;
    }
}

/* Lock the protocol image under an image of format `drv` (NULL: raw)
 * playing that role: a qcow2 file's metadata must not change under its
 * reader, and its writer may grow it; force_share shares everything
 * (readers only). */
static int lock_protocol(struct ic_image *p, const struct ic_driver *drv, unsigned flags,
                         unsigned perm, unsigned shared, struct ic_error *err)
{
    if (!p->drv->lock)
        return 0;
    if (drv) {
        perm |= CR | ((perm & W) ? RS : 0);
        shared &= ~(W | RS);
    }
    if (flags & IC_OPEN_FORCE_SHARE)
        shared = IC_PERM_ALL;
    return p->drv->lock(p, perm, shared, err);
}

/* ---- the backing chain -------------------------------------------------- */

/* Where a protocol image's bytes start in the file its identity names
 * (a member in its archive). */
static uint64_t file_offset(const struct ic_image *p)
{
    return p->drv->file_offset ? p->drv->file_offset(p) : 0;
}

/* Two names of one disk: the same inode, or device nodes of the same
 * block device. */
static int same_file(const struct ic_file_id *a, const struct ic_file_id *b)
{
    if (a->rdev || b->rdev)
        return a->rdev == b->rdev;
    return a->dev == b->dev && a->ino == b->ino;
}

/* This image's place in its chain: the files above it and its own. */
static int join_chain(struct ic_image *img, struct ic_image *p, const struct ic_image *above,
                      struct ic_error *err)
{
    if (above) {
        if (above->chain_len >= IC_CHAIN_MAX)
            return ic_error_format(err, img->path, "backing chain deeper than %d images",
                                   IC_CHAIN_MAX);
        memcpy(img->chain, above->chain, above->chain_len * sizeof *img->chain);
        memcpy(img->chain_member, above->chain_member,
               above->chain_len * sizeof *img->chain_member);
        img->chain_len = above->chain_len;
        img->meta_budget = above->meta_budget;
    }
    struct ic_file_id id = {0};
    uint64_t member = file_offset(p);
    if (!p->drv->identity || !p->drv->identity(p, &id.dev, &id.ino, &id.rdev))
        return 0;
    for (unsigned k = 0; k < img->chain_len; k++)
        if (same_file(&img->chain[k], &id) && img->chain_member[k] == member)
            return ic_error_format(err, img->path, "backing chain loops back to %s%s%s",
                                   img->member ? img->member : img->path,
                                   img->member ? " in " : "", img->member ? img->path : "");
    img->chain_member[img->chain_len] = member;
    img->chain[img->chain_len++] = id;
    return 0;
}

static int open_link(const char *path, const char *member, const char *format, unsigned flags,
                     const struct ic_image *above, struct ic_image **out, struct ic_error *err);

/* Backing file names are relative to the overlay's directory. */
static int backing_path(const struct ic_image *img, const char *name, char *out, size_t cap,
                        struct ic_error *err)
{
    const char *slash = strrchr(img->path, '/');
    int n = name[0] == '/' || !slash
                ? snprintf(out, cap, "%s", name)
                : snprintf(out, cap, "%.*s/%s", (int)(slash - img->path), img->path, name);
    if (n < 0 || (size_t)n >= cap)
        return ic_error_format(err, img->path, "backing file name too long");
    return 0;
}

/* Whether a name an image holds stays inside the image's directory. */
static int inside_directory(const char *name)
{
    if (name[0] == '/')
        return 0;
    for (const char *p = name; *p;) {
        const char *end = strchr(p, '/');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        if (n == 2 && p[0] == '.' && p[1] == '.')
            return 0;
        p += n;
        while (*p == '/')
            p++;
    }
    return 1;
}

/* What a member of an archive names (a backing file, an extent file) is
 * another member of it, relative to the naming member's directory there:
 * the archive is the only place its files can be. */
static int sibling_member(const struct ic_image *img, const char *name, const char *what,
                          char *out, size_t cap, struct ic_error *err)
{
    if (!inside_directory(name))
        return ic_error_format(err, img->path, "%s '%s' of member '%s' is not another member "
                               "of the archive (absolute, or outside the member's directory)",
                               what, name, img->member);
    const char *slash = strrchr(img->member, '/');
    int n = slash ? snprintf(out, cap, "%.*s/%s", (int)(slash - img->member), img->member, name)
                  : snprintf(out, cap, "%s", name);
    if (n < 0 || (size_t)n >= cap)
        return ic_error_format(err, img->path, "%s name too long", what);
    return 0;
}

/* Whether two protocol images are the same bytes: one file, or one
 * member of one archive. */
static int same_bytes(struct ic_image *a, struct ic_image *b)
{
    struct ic_file_id x = {0}, y = {0};
    if (!a->drv->identity || !b->drv->identity || !a->drv->identity(a, &x.dev, &x.ino, &x.rdev) ||
        !b->drv->identity(b, &y.dev, &y.ino, &y.rdev))
        return 0;
    return same_file(&x, &y) && file_offset(a) == file_offset(b);
}

/* A name the image holds, opened beneath the image's directory. */
static int open_beneath(struct ic_image *img, const char *name, const char *path,
                        unsigned flags, struct ic_image **out, struct ic_error *err)
{
    char dir[IC_ERROR_PATH_MAX];
    const char *slash = strrchr(img->path, '/');
    int n = !slash ? snprintf(dir, sizeof dir, ".")
                   : snprintf(dir, sizeof dir, "%.*s", slash == img->path ? 1
                                                       : (int)(slash - img->path), img->path);
    if (n < 0 || (size_t)n >= sizeof dir)
        return ic_error_format(err, img->path, "image path too long");
    struct ic_image *p = ic_image_new(path, &ic_protocol_file, flags, 0);
    if (!p)
        return ic_error_nomem(err);
    if (ic_protocol_file.open_beneath(p, img->path, "extent file", dir, name, err) < 0) {
        ic_image_close(p);
        return -1;
    }
    *out = p;
    return 0;
}

int ic_image_open_extent_file(struct ic_image *img, const char *name, struct ic_image **out,
                              struct ic_error *err)
{
    char path[IC_ERROR_PATH_MAX];
    if (!name[0])
        return ic_error_format(err, img->path, "an extent file with an empty name");
    const char *member = NULL;
    int external = (img->open_flags & IC_OPEN_EXTERNAL_FILES) != 0;
    if (img->member) {
        if (sibling_member(img, name, "extent file", path, sizeof path, err) < 0)
            return -1;
        member = path;
    } else if (!inside_directory(name) && !external)
        return ic_error_format(err, img->path,
                               "extent file '%s' is outside the image's directory (allow it "
                               "with external_files=True)", name);
    if (!member && backing_path(img, name, path, sizeof path, err) < 0)
        return -1;
    if (!member && ic_protocol_for(path) != &ic_protocol_file)
        return ic_error_format(err, img->path, "extent file '%s' is not a file", name);
    unsigned flags = img->open_flags & (IC_OPEN_DIRECT | IC_OPEN_FORCE_SHARE);
    struct ic_image *p;
    /* confined, the name is resolved beneath the directory, links and all:
     * a link out of it (or a device node in it) is refused as ".." is */
    int r = member || external ? open_protocol(member ? img->path : path, member, flags, &p, err)
                               : open_beneath(img, name, path, flags, &p, err);
    if (r < 0)
        return -1;
    if (img->file && same_bytes(p, img->file)) {
        ic_image_close(p);
        return ic_error_format(err, img->path, "extent file '%s' is this image's own file",
                               name);
    }
    if (lock_protocol(p, NULL, flags, img->lock_perm & CR, img->lock_shared, err) < 0) {
        ic_image_close(p);
        return -1;
    }
    *out = p;
    return 0;
}

int ic_image_backing_location(const struct ic_image *img, char *out, size_t cap,
                              int *is_member)
{
    const char *name = img->backing_name;
    if (!name[0])
        return 0;
    *is_member = img->member != NULL;
    if (img->member)
        return sibling_member(img, name, "backing file", out, cap, NULL) == 0;
    return backing_path(img, name, out, cap, NULL) == 0 && ic_protocol_for(out) == &ic_protocol_file;
}

/* Open what `img` names as its backing file, read-only, below it.  What an
 * image names is part of its (possibly hostile) content: an unusable
 * backing file is a format error of the overlay; I/O errors stay I/O. */
static int open_backing(struct ic_image *img, const char *name, const char *format,
                        struct ic_error *err)
{
    char path[IC_ERROR_PATH_MAX];
    const char *member = NULL;
    if (img->member) {
        if (sibling_member(img, name, "backing file", path, sizeof path, err) < 0)
            return -1;
        member = path;
    } else if (backing_path(img, name, path, sizeof path, err) < 0) {
        return -1;
    }
    if (format && !ic_format_readable(format))
        return ic_error_format(err, img->path, "backing file format '%s' is not supported",
                               format);
    if (!member && ic_protocol_for(path) != &ic_protocol_file) /* "null:" is a file here */
        return ic_error_format(err, img->path, "backing file '%s' is not an image", path);
    unsigned flags = img->open_flags & (IC_OPEN_DIRECT | IC_OPEN_FORCE | IC_OPEN_FORCE_SHARE);
    if (open_link(member ? img->path : path, member, format, flags, img, &img->backing, err) ==
        0)
        return 0;
    /* no caller option changes a backing file */
    if (err && (err->remedy == IC_REMEDY_AS_RAW || err->remedy == IC_REMEDY_MEMBER))
        err->remedy = IC_REMEDY_NONE;
    if (err && (err->kind == IC_ERR_OS || err->kind == IC_ERR_FORMAT) &&
        strcmp(err->path, member ? img->path : path) == 0) {
        /* whose backing file it is ("PATH: No such file or directory
         * (open, the backing file of TOP)") */
        char msg[sizeof err->msg];
        if (snprintf(msg, sizeof msg, err->kind == IC_ERR_OS ? "%s, the backing file of %s"
                                                              : "%s (the backing file of %s)",
                     err->msg, img->member ? img->member : img->path) > 0)
            memcpy(err->msg, msg, sizeof msg); /* cut if need be */
    }
    if (err && err->kind == IC_ERR_VALUE) {
        /* "PATH: reason" says PATH once, in our own words */
        const char *reason = err->msg;
        size_t n = strlen(path);
        if (strncmp(reason, path, n) == 0 && strncmp(reason + n, ": ", 2) == 0)
            reason += n + 2;
        ic_error_format(err, img->path, "unusable backing file %s: %s", path, reason);
    }
    return -1;
}

/* Open `path` as one link of a backing chain (`above`: the image it is the
 * backing file of, or NULL). */
static int open_link(const char *path, const char *member, const char *format, unsigned flags,
                     const struct ic_image *above, struct ic_image **out, struct ic_error *err)
{
    if (format && !ic_format_readable(format))
        return ic_error_value(err, "unknown image format '%s'", format);
    struct ic_image *p, *img = NULL;
    if (open_protocol(path, member, flags, &p, err) < 0)
        return -1;
    const char *name = format;
    if (!name && probe_protocol(p, &name, err) < 0)
        goto fail;
    /* a container (a tar archive, an OVA) is no disk, probed or named as
     * one: its disks are members (raw reads its bytes, on purpose) */
    const struct ic_driver *container = ic_container_for(name);
    const char *look;
    if (!container && format && strcmp(name, "raw") != 0 && (look = container_look(p)))
        container = ic_container_for(look);
    if (container) {
        container->refuse_as_disk(p, path, member, err);
        goto fail;
    }
    if (!ic_format_readable(name)) {
        /* "qcow" is qcow2's magic with version 1: say so */
        ic_error_format(err, path, "this is a %s image%s, a format imgcopy cannot read yet", name,
                        strcmp(name, "qcow") == 0 ? " (version 1, the format before qcow2)" : "");
        ic_error_remedy(err, IC_REMEDY_AS_RAW);
        goto fail;
    }
    const struct ic_driver *drv = ic_format_driver(name);
    /* locked before a byte of metadata is read: an image another process
     * writes reports that, not the state of its header */
    unsigned perm, shared;
    node_role(flags, above, &perm, &shared);
    if (lock_protocol(p, drv, flags, perm, shared, err) < 0)
        goto fail;
    if (drv) {
        if (!(img = ic_image_new(path, drv, flags, 0)) ||
            (member && !(img->member = strdup(member)))) {
            ic_error_nomem(err);
            goto fail;
        }
        img->file = p;
    } else {
        img = p;
    }
    p = NULL;
    img->lock_perm = perm;
    img->lock_shared = shared;
    if (join_chain(img, img->file ? img->file : img, above, err) < 0 ||
        (drv && drv->open(img, err) < 0) ||
        (img->backing_name[0] && !(flags & IC_OPEN_NO_BACKING) &&
         open_backing(img, img->backing_name, img->backing_format[0] ? img->backing_format
                                                                     : NULL, err) < 0))
        goto fail;
    *out = img;
    return 0;
fail:
    ic_image_close(img);
    ic_image_close(p);
    return -1;
}

int ic_image_open(const char *path, const char *format, unsigned flags, struct ic_image **out,
                  struct ic_error *err)
{
    return ic_image_open_member(path, NULL, format, flags, out, err);
}

const char *ic_image_member(const struct ic_image *img)
{
    return img->member;
}

int ic_image_open_member(const char *path, const char *member, const char *format,
                         unsigned flags, struct ic_image **out, struct ic_error *err)
{
    if (member && (flags & IC_OPEN_RDWR))
        return ic_error_value(err, "%s: member '%s' of a tar archive can only be read: it "
                              "cannot be opened for writing or be a destination", path, member);
    if ((flags & IC_OPEN_NO_BACKING) && (flags & IC_OPEN_RDWR))
        return ic_error_value(err, "an image opened without its backing file can only be "
                              "read");
    if ((flags & IC_OPEN_RESUME) && !(flags & IC_OPEN_RDWR))
        return ic_error_value(err, "resume carries on writing an image: it opens one for "
                              "writing only");
    if ((flags & IC_OPEN_FORCE_SHARE) && (flags & IC_OPEN_RDWR))
        return ic_error_value(err, "force_share reads an image others may write: it cannot "
                              "open one for writing");
    if (strcmp(path, "null:") == 0 || (format && strcmp(format, "null") == 0))
        return ic_error_value(err, "the null image can only be a destination");
    return open_link(path, member, format, flags, NULL, out, err);
}

int ic_image_take_meta_budget(struct ic_image *img, uint64_t bytes)
{
    if (bytes > img->meta_budget)
        return -1;
    img->meta_budget -= bytes;
    return 0;
}

/* ---- creating ----------------------------------------------------------- */

int ic_image_create(const char *path, const char *format, uint64_t size, unsigned flags,
                    const struct ic_create_options *opts, struct ic_image **out, int *fresh,
                    struct ic_error *err)
{
    /* options a format cannot take are refused before anything is touched */
    if (ic_create_options_check(format, opts, err) < 0)
        return -1;
    int to_null = format && strcmp(format, "null") == 0;
    const struct ic_driver *proto = to_null ? &ic_protocol_null : ic_protocol_for(path);
    const struct ic_driver *drv = to_null || !format ? NULL : ic_format_driver(format);
    /* a format's file starts empty: the format lays it out */
    struct ic_image *p = ic_image_new(path, proto, flags | IC_OPEN_RDWR, drv ? 0 : size);
    struct ic_image *img = NULL;
    if (!p)
        return ic_error_nomem(err);
    int pfresh = 0;
    unsigned perm = CR | W, shared = CR | WU; /* a writer */
    if (proto->create_protocol(p, path, &pfresh, err) < 0) {
        ic_image_close(p);
        return -1;
    }
    if (lock_protocol(p, drv, 0, perm, shared, err) < 0)
        goto fail;
    if (!drv) {
        img = p;
        *fresh = pfresh;
    } else {
        if (!(img = ic_image_new(path, drv, (flags & ~IC_CREATE_ATOMIC) | IC_OPEN_RDWR, size))) {
            ic_error_nomem(err);
            goto fail;
        }
        img->file = p;
    }
    p = NULL;
    img->lock_perm = perm;
    img->lock_shared = shared;
    if (join_chain(img, img->file ? img->file : img, NULL, err) < 0)
        goto fail;
    if (drv) {
        static const struct ic_create_options defaults = {0};
        img->create_opts = opts ? opts : &defaults;
        /* an overlay's backing file must open, as readers will open it */
        if (opts && opts->backing_file &&
            open_backing(img, opts->backing_file, opts->backing_format, err) < 0)
            goto fail;
        int r = drv->create(img, fresh, err);
        img->create_opts = NULL;
        if (r < 0)
            goto fail;
    }
    /* what the copy into it may skip (calloc'ed: 0 for opened images) */
    atomic_store(&img->fresh, *fresh);
    *out = img;
    return 0;
fail:
    ic_image_close(img);
    ic_image_close(p);
    return -1;
}
