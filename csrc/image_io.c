/* Queries and I/O of the image layer: bounds checks, then the driver, or
 * the default of an optional operation. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "image.h"

uint64_t ic_image_size(const struct ic_image *img)
{
    return img->size;
}

const char *ic_image_format(const struct ic_image *img)
{
    if (img->drv->kind == IC_FORMAT)
        return img->drv->name;
    return img->drv->format_name ? img->drv->format_name : "raw";
}

const char *ic_image_path(const struct ic_image *img)
{
    return img->path;
}

struct ic_image *ic_image_backing(const struct ic_image *img)
{
    return img->backing;
}

const char *ic_image_reads_file(const struct ic_image *img, const char *path)
{
    struct stat st;
    if (stat(path, &st) < 0)
        return NULL; /* nothing there yet: nothing to overwrite */
    struct ic_file_id id = {st.st_dev, st.st_ino, S_ISBLK(st.st_mode) ? st.st_rdev : 0};
    for (const struct ic_image *i = img; i; i = i->backing) {
        if (i->chain_len == 0) /* "null:" and other file-less images */
            continue;
        const struct ic_file_id *own = &i->chain[i->chain_len - 1];
        if (own->rdev || id.rdev ? own->rdev == id.rdev
                                 : own->dev == id.dev && own->ino == id.ino)
            return i->path;
    }
    return NULL;
}

uint64_t ic_image_qemu_length(const struct ic_image *img)
{
    return img->drv->kind == IC_PROTOCOL ? (img->size + 511) / 512 * 512 : img->size;
}

int ic_image_snapshots(struct ic_image *img, const struct ic_snapshot **out, size_t *count)
{
    if (img->drv->snapshots)
        return img->drv->snapshots(img, out, count);
    *out = NULL;
    *count = 0;
    return 0;
}

size_t ic_image_bitmaps(struct ic_image *img, struct ic_bitmap *out, size_t cap)
{
    return img->drv->bitmaps ? img->drv->bitmaps(img, out, cap) : 0;
}

void ic_image_describe(struct ic_image *img, struct ic_image_info *out)
{
    memset(out, 0, sizeof *out);
    if (img->drv->describe)
        img->drv->describe(img, out);
}

void ic_image_info_add(struct ic_image_info *out, const char *key, enum ic_info_kind kind,
                       int64_t number, const char *text)
{
    struct ic_info_field *f = &out->fields[out->nfields++];
    f->key = key;
    f->kind = kind;
    f->number = number;
    snprintf(f->text, sizeof f->text, "%.*s", (int)sizeof f->text - 1, text ? text : "");
}

int ic_image_has_backing_file(const struct ic_image *img)
{
    return img->backing != NULL;
}

int ic_image_fresh(const struct ic_image *img)
{
    return atomic_load_explicit(&((struct ic_image *)img)->fresh, memory_order_relaxed);
}

void ic_image_written(struct ic_image *img)
{
    if (atomic_load_explicit(&img->fresh, memory_order_relaxed))
        atomic_store_explicit(&img->fresh, 0, memory_order_relaxed);
}

int ic_image_writable(const struct ic_image *img)
{
    return (img->open_flags & IC_OPEN_RDWR) != 0;
}

static int check_range(const struct ic_image *img, uint64_t offset, uint64_t length,
                       struct ic_error *err)
{
    if (offset > img->size || length > img->size - offset)
        return ic_error_value(err,
                              "range %llu+%llu is outside the image (size %llu)",
                              (unsigned long long)offset, (unsigned long long)length,
                              (unsigned long long)img->size);
    return 0;
}

/* What a format's layer does not hold, [start, end), for the extent cache:
 * the backing file answers, one level deeper (a raw backing file's length
 * rounded up to 512 bytes, as qemu sees it); past its end, or without one,
 * it reads as zeros. */
static int status_below(struct ic_image *img, uint64_t start, uint64_t end,
                        struct ic_extent_list *out, struct ic_error *err)
{
    struct ic_image *b = img->backing;
    uint64_t bsize = b ? ic_image_size(b) : 0, tail = b ? ic_image_qemu_length(b) : 0;
    uint64_t pos = start;
    while (pos < end && pos < bsize) {
        struct ic_extent e;
        uint64_t lim = end < bsize ? end : bsize;
        if (ic_image_block_status(b, pos, lim - pos, &e, err) < 0)
            return -1;
        e.depth++;
        if (ic_extent_list_add(out, &e, err) < 0)
            return -1;
        pos += e.length;
    }
    if (pos < end && pos < tail) {
        uint64_t lim = end < tail ? end : tail;
        struct ic_extent e = {.start = pos, .length = lim - pos, .host_offset = pos, .depth = 1,
                              .flags = IC_EXT_ZERO | IC_EXT_PRESENT | IC_EXT_OFFSET_VALID};
        if (ic_extent_list_add(out, &e, err) < 0)
            return -1;
        pos = lim;
    }
    if (pos < end) {
        struct ic_extent e = {.start = pos, .length = end - pos, .flags = IC_EXT_ZERO};
        return ic_extent_list_add(out, &e, err);
    }
    return 0;
}

int ic_image_block_status(struct ic_image *img, uint64_t offset, uint64_t length,
                          struct ic_extent *out, struct ic_error *err)
{
    if (length == 0)
        return ic_error_value(err, "block status of an empty range");
    if (check_range(img, offset, length, err) < 0)
        return -1;
    return ic_cache_block_status(img, offset, length, status_below, out, err);
}

int ic_image_map(struct ic_image *img, uint64_t start, uint64_t end,
                 struct ic_extent_list *out, struct ic_error *err)
{
    if (start > end || check_range(img, start, end - start, err) < 0)
        return ic_error_value(err, "map range %llu..%llu is outside the image (size %llu)",
                              (unsigned long long)start, (unsigned long long)end,
                              (unsigned long long)img->size);
    uint64_t pos = start;
    while (pos < end) {
        struct ic_extent e;
        if (ic_cache_block_status(img, pos, end - pos, status_below, &e, err) < 0)
            return -1;
        if (out->count > 0 && ic_extent_mergeable(&out->items[out->count - 1], &e))
            out->items[out->count - 1].length += e.length;
        else if (ic_extent_list_add(out, &e, err) < 0)
            return -1;
        pos += e.length;
    }
    return 0;
}

/* The bitmap `name` can be read as a dirty map: the driver reads bitmaps,
 * has one of that name, and qemu would use it.  Otherwise the error says
 * which bitmaps there are.  A driver that does not list its bitmaps (a
 * remote export, where listing costs a connection) checks the name itself
 * when it reads the bitmap. */
static int dirty_bitmap_usable(struct ic_image *img, const char *name, struct ic_error *err)
{
    if (!name)
        return ic_error_value(err, "a dirty map needs a bitmap's name");
    if (!img->drv->dirty_status)
        return ic_error_value(err, "%s: %s images keep no persistent dirty bitmaps "
                              "(no bitmap '%.64s')", img->path, ic_image_format(img), name);
    if (!img->drv->bitmaps)
        return 0;
    size_t n = img->drv->bitmaps(img, NULL, 0);
    struct ic_bitmap *list = n ? calloc(n, sizeof *list) : NULL;
    if (n && !list)
        return ic_error_nomem(err);
    n = img->drv->bitmaps(img, list, n); /* fewer, if the image was written meanwhile */
    size_t i = 0;
    while (i < n && strcmp(list[i].name, name) != 0)
        i++;
    if (i < n) {
        unsigned flags = list[i].flags;
        free(list);
        if (flags & IC_BITMAP_IN_USE)
            /* qemu's words (bdrv_dirty_bitmap_check); qemu-img convert
             * --bitmaps suggests the same remedy */
            return ic_error_format(err, img->path, "Bitmap '%.64s' is inconsistent and "
                                   "cannot be used (a program had the image open for "
                                   "writing and did not close it, so its bits may be "
                                   "stale: 'qemu-img bitmap --remove' deletes it)", name);
        return 0;
    }
    /* qemu-nbd's words, and the names there are, as many as fit */
    char names[IC_ERROR_MSG_MAX / 2] = "";
    size_t len = 0;
    for (i = 0; i < n && len < sizeof names; i++) {
        int w = snprintf(names + len, sizeof names - len, "%s'%.64s'", i ? ", " : "",
                         list[i].name);
        if (w < 0 || (size_t)w >= sizeof names - len) {
            snprintf(names + len, sizeof names - len, ", ...");
            break;
        }
        len += (size_t)w;
    }
    free(list);
    if (n == 0)
        return ic_error_value(err, "%s: Bitmap '%.64s' is not found (the image has no "
                              "bitmaps)", img->path, name);
    return ic_error_value(err, "%s: Bitmap '%.64s' is not found (the image has %zu: %s)",
                          img->path, name, n, names);
}

/* What a driver appended from `first` on: contiguous extents from `start`
 * inside `end`, at least one, flagged dirty or not at all. */
static int dirty_answer_ok(struct ic_image *img, const struct ic_extent_list *out,
                           size_t first, uint64_t start, uint64_t end, struct ic_error *err)
{
    uint64_t pos = start;
    for (size_t i = first; i < out->count; i++) {
        const struct ic_extent *e = &out->items[i];
        if (e->start != pos || e->length == 0 || e->length > end - pos ||
            (e->flags & ~(uint32_t)IC_EXT_DIRTY))
            return ic_error_format(err, img->path, "the dirty map's extent at %llu does not "
                                   "follow the one before (at %llu)",
                                   (unsigned long long)e->start, (unsigned long long)pos);
        pos += e->length;
    }
    if (pos == start)
        return ic_error_format(err, img->path, "the dirty map says nothing of offset %llu",
                               (unsigned long long)start);
    return 0;
}

int ic_image_dirty_status(struct ic_image *img, const char *bitmap, uint64_t start,
                          uint64_t end, struct ic_extent_list *out, struct ic_error *err)
{
    if (start >= end || check_range(img, start, end - start, err) < 0)
        return ic_error_value(err, "dirty status of %llu..%llu: not a range inside the "
                              "image (size %llu)", (unsigned long long)start,
                              (unsigned long long)end, (unsigned long long)img->size);
    if (dirty_bitmap_usable(img, bitmap, err) < 0)
        return -1;
    size_t first = out->count;
    if (img->drv->dirty_status(img, bitmap, start, end, out, err) < 0 ||
        dirty_answer_ok(img, out, first, start, end, err) < 0) {
        out->count = first;
        return -1;
    }
    return 0;
}

int ic_image_dirty_map(struct ic_image *img, const char *bitmap, uint64_t start,
                       uint64_t length, struct ic_extent_list *out, struct ic_error *err)
{
    if (check_range(img, start, length, err) < 0)
        return -1;
    if (dirty_bitmap_usable(img, bitmap, err) < 0)
        return -1;
    /* each answer joins the one before it where their flags agree */
    struct ic_extent_list part = {0};
    size_t first = out->count;
    uint64_t pos = start, end = start + length;
    int ret = 0;
    while (ret == 0 && pos < end) {
        part.count = 0;
        ret = img->drv->dirty_status(img, bitmap, pos, end, &part, err);
        if (ret == 0)
            ret = dirty_answer_ok(img, &part, 0, pos, end, err);
        for (size_t i = 0; ret == 0 && i < part.count; i++) {
            ret = ic_extent_list_join(out, first, &part.items[i], err);
            pos += part.items[i].length;
        }
    }
    ic_extent_list_free(&part);
    if (ret < 0)
        out->count = first;
    return ret;
}

int ic_image_pread(struct ic_image *img, void *buf, size_t len, uint64_t offset,
                   struct ic_error *err)
{
    if (check_range(img, offset, len, err) < 0)
        return -1;
    return img->drv->pread(img, buf, len, offset, err);
}

int ic_image_pread_runs(struct ic_image *file, const struct ic_read_run *runs, size_t n,
                        struct ic_error *err)
{
    if (n > IC_READ_RUNS_MAX)
        return ic_error_value(err, "%zu runs in one read (at most %d)", n, IC_READ_RUNS_MAX);
    for (size_t i = 0; i < n; i++)
        if (check_range(file, runs[i].off, runs[i].len, err) < 0)
            return -1;
    if (n > 1 && file->drv->pread_runs)
        return file->drv->pread_runs(file, runs, n, err);
    for (size_t i = 0; i < n; i++)
        if (file->drv->pread(file, runs[i].buf, runs[i].len, runs[i].off, err) < 0)
            return -1;
    return 0;
}

void ic_read_batch_init(struct ic_read_batch *b)
{
    b->file = NULL;
    b->n = 0;
}

int ic_read_batch_flush(struct ic_read_batch *b, struct ic_error *err)
{
    size_t n = b->n;
    b->n = 0;
    return n ? ic_image_pread_runs(b->file, b->runs, n, err) : 0;
}

int ic_read_batch_add(struct ic_read_batch *b, struct ic_image *file, void *buf, size_t len,
                      uint64_t off, struct ic_error *err)
{
    if (len == 0)
        return 0;
    if (b->n > 0 && b->file != file && ic_read_batch_flush(b, err) < 0)
        return -1;
    b->file = file;
    /* the continuation of the last run, in the file and in memory, is
     * part of it: one request, not two */
    struct ic_read_run *last = b->n ? &b->runs[b->n - 1] : NULL;
    if (last && last->off + last->len == off && (uint8_t *)last->buf + last->len == buf) {
        last->len += len;
        return 0;
    }
    if (b->n == IC_READ_RUNS_MAX && ic_read_batch_flush(b, err) < 0)
        return -1;
    b->runs[b->n++] = (struct ic_read_run){.buf = buf, .len = len, .off = off};
    return 0;
}

int ic_read_batch_add_padded(struct ic_read_batch *b, struct ic_image *file, void *buf,
                             size_t len, uint64_t off, struct ic_error *err)
{
    uint64_t size = ic_image_size(file);
    size_t in = off >= size ? 0 : (size - off < len ? (size_t)(size - off) : len);
    memset((uint8_t *)buf + in, 0, len - in);
    return ic_read_batch_add(b, file, buf, in, off, err);
}

int ic_image_aio_reads(const struct ic_image *img)
{
    return img->drv->aio_pread != NULL;
}

int ic_image_aio_writes(const struct ic_image *img)
{
    /* a staged write goes through the format, never straight out */
    return img->drv->aio_pwrite != NULL && !img->drv->stage;
}

uint64_t ic_image_request_cost(const struct ic_image *img)
{
    return img->drv->request_cost ? img->drv->request_cost(img) : 0;
}

int ic_image_serialises(const struct ic_image *img)
{
    return img->drv->serialises ? img->drv->serialises(img) : 0;
}

unsigned ic_image_requests_in_flight(const struct ic_image *img)
{
    return img->drv->requests_in_flight ? img->drv->requests_in_flight(img) : 0;
}

int ic_image_aio_pread(struct ic_image *img, void *buf, size_t len, uint64_t off,
                       ic_aio_done_fn *done, void *ctx, struct ic_error *err)
{
    if (!img->drv->aio_pread)
        return 0;
    if (check_range(img, off, len, err) < 0)
        return -1;
    return img->drv->aio_pread(img, buf, len, off, done, ctx, err);
}

int ic_image_aio_pwrite(struct ic_image *img, const void *buf, size_t len, uint64_t off,
                        ic_aio_done_fn *done, void *ctx, struct ic_error *err)
{
    if (!ic_image_aio_writes(img))
        return 0;
    if (!ic_image_writable(img))
        return ic_error_readonly(err, img->path);
    if (check_range(img, off, len, err) < 0)
        return -1;
    ic_image_written(img);
    return img->drv->aio_pwrite(img, buf, len, off, done, ctx, err);
}

int ic_image_pwrite(struct ic_image *img, const void *buf, size_t len, uint64_t offset,
                    struct ic_error *err)
{
    if (!ic_image_writable(img))
        return ic_error_readonly(err, img->path);
    if (check_range(img, offset, len, err) < 0)
        return -1;
    ic_image_written(img);
    return img->drv->pwrite(img, buf, len, offset, err);
}

/* Zeros written, for drivers without a way of their own. */
static int write_zeros(struct ic_image *img, uint64_t off, uint64_t len, struct ic_error *err)
{
    static const uint8_t zeros[64 << 10];
    for (uint64_t done = 0; done < len;) {
        uint64_t n = len - done < sizeof zeros ? len - done : sizeof zeros;
        if (img->drv->pwrite(img, zeros, (size_t)n, off + done, err) < 0)
            return -1;
        done += n;
    }
    return 0;
}

int ic_image_zero(struct ic_image *img, uint64_t offset, uint64_t length, unsigned flags,
                  struct ic_error *err)
{
    if (!ic_image_writable(img))
        return ic_error_readonly(err, img->path);
    if (check_range(img, offset, length, err) < 0)
        return -1;
    if (length == 0)
        return 0;
    ic_image_written(img);
    if (img->drv->zero)
        return img->drv->zero(img, offset, length, flags, err);
    if (flags & IC_ZERO_FAST)
        return ic_error_os(err, ENOTSUP, img->path, "no fast way to zero");
    return write_zeros(img, offset, length, err);
}

int ic_image_flush(struct ic_image *img, struct ic_error *err)
{
    if (img->drv->flush)
        return img->drv->flush(img, err);
    return img->file ? ic_image_flush(img->file, err) : 0;
}

int ic_image_checkpoint(struct ic_image *img, struct ic_error *err)
{
    if (img->drv->checkpoint)
        return img->drv->checkpoint(img, err);
    return ic_image_flush(img, err);
}

int ic_image_copy_range(struct ic_image *src, struct ic_image *dst, uint64_t off, uint64_t len,
                        struct ic_error *err)
{
    if (!ic_image_writable(dst))
        return ic_error_readonly(err, dst->path);
    if (check_range(src, off, len, err) < 0 || check_range(dst, off, len, err) < 0)
        return -1;
    if (src->drv != dst->drv || !src->drv->copy_range)
        return ic_error_os(err, ENOTSUP, dst->path, "no in-kernel copy from %s to %s",
                           src->drv->name, dst->drv->name);
    return src->drv->copy_range(src, dst, off, len, err);
}

int ic_image_stage(struct ic_image *img, struct ic_staged_write *w, struct ic_error *err)
{
    w->priv = NULL;
    w->scratch[0] = w->scratch[1] = 0;
    if (!ic_image_writable(img))
        return ic_error_readonly(err, img->path);
    if (check_range(img, w->off, w->len, err) < 0)
        return -1;
    return img->drv->stage ? img->drv->stage(img, w, err) : 0;
}

int ic_image_place(struct ic_image *img, struct ic_staged_write *w, struct ic_error *err)
{
    return img->drv->place ? img->drv->place(img, w, err) : 0;
}

int ic_image_commit(struct ic_image *img, struct ic_staged_write *w, struct ic_error *err)
{
    if (img->drv->commit)
        return img->drv->commit(img, w, err);
    if (!w->buf)
        return ic_image_zero(img, w->off, w->len, IC_ZERO_MAY_UNMAP, err);
    return img->drv->pwrite(img, w->buf, (size_t)w->len, w->off, err);
}

void ic_image_unstage(struct ic_image *img, struct ic_staged_write *w)
{
    if (img->drv->unstage)
        img->drv->unstage(img, w);
    w->priv = NULL;
}

int ic_image_zero_allocates(const struct ic_image *img)
{
    return img->drv->zero && img->drv->zero_allocates;
}

int ic_image_places_in_order(const struct ic_image *img)
{
    return img->drv->place != NULL;
}

uint64_t ic_image_write_alignment(const struct ic_image *img)
{
    return img->drv->write_alignment ? img->drv->write_alignment(img) : 1;
}

int ic_image_tune(struct ic_image *img, unsigned connections, unsigned requests,
                  struct ic_error *err)
{
    for (struct ic_image *i = img; i; i = i->file)
        if (i->drv->tune && i->drv->tune(i, connections, requests, err) < 0)
            return -1;
    return 0;
}

void ic_image_set_retries(struct ic_image *img, unsigned retries, uint64_t delay_ms)
{
    for (; img; img = img->backing)
        for (struct ic_image *i = img; i; i = i->file)
            if (i->drv->set_retries)
                i->drv->set_retries(i, retries, delay_ms);
}

void ic_image_abort(struct ic_image *img)
{
    for (; img; img = img->backing) {
        for (struct ic_image *i = img; i; i = i->file)
            if (i->drv->abort)
                i->drv->abort(i);
    }
}

uint64_t ic_image_preferred_size(const struct ic_image *img)
{
    return img->drv->preferred_size ? img->drv->preferred_size(img) : 0;
}

uint64_t ic_image_zero_limit(const struct ic_image *img)
{
    return img->drv->zero_limit ? img->drv->zero_limit(img) : IC_ZERO_LIMIT;
}

int ic_image_finish(struct ic_image *img, int sync, struct ic_error *err)
{
    if (!ic_image_writable(img))
        return 0;
    if (img->drv->finish && img->drv->finish(img, sync, err) < 0)
        return -1;
    /* a format's metadata first, then its file (a new one renamed into
     * place) */
    return img->file ? ic_image_finish(img->file, sync, err) : 0;
}

void ic_image_settle_written(struct ic_image *img, uint64_t off, uint64_t len)
{
    if (img->drv->settle_written)
        img->drv->settle_written(img, off, len);
}

void ic_image_settle_read(struct ic_image *img, uint64_t off, uint64_t len)
{
    if (img->drv->settle_read)
        img->drv->settle_read(img, off, len);
}

int ic_image_pread_padded(struct ic_image *file, void *vbuf, size_t len, uint64_t off,
                          struct ic_error *err)
{
    uint8_t *buf = vbuf;
    uint64_t size = ic_image_size(file);
    size_t n = off >= size ? 0 : (size - off < len ? (size_t)(size - off) : len);
    if (n && ic_image_pread(file, buf, n, off, err) < 0)
        return -1;
    memset(buf + n, 0, len - n);
    return 0;
}

int ic_image_read_below(struct ic_image *img, void *buf, size_t len, uint64_t off,
                        struct ic_error *err)
{
    if (img->backing)
        return ic_image_pread_padded(img->backing, buf, len, off, err);
    memset(buf, 0, len);
    return 0;
}

int ic_image_data_status(struct ic_image *file, uint64_t start, uint64_t host, uint64_t len,
                         struct ic_extent *out, struct ic_error *err)
{
    if (len == 0)
        return ic_error_value(err, "block status of an empty range");
    *out = (struct ic_extent){.start = start, .length = len, .host_offset = host,
                              .flags = IC_EXT_DATA | IC_EXT_PRESENT | IC_EXT_OFFSET_VALID};
    if (host >= file->size) {
        out->flags |= IC_EXT_ZERO;
        return 0;
    }
    /* inside the file, not empty: ic_image_block_status's checks hold */
    struct ic_extent f;
    uint64_t lim = len < file->size - host ? len : file->size - host;
    if (ic_cache_block_status(file, host, lim, status_below, &f, err) < 0)
        return -1;
    out->length = f.length;
    if (f.flags & IC_EXT_ZERO)
        out->flags |= IC_EXT_ZERO;
    return 0;
}

int ic_image_truncate(struct ic_image *file, uint64_t size, struct ic_error *err)
{
    if (!file->drv->truncate)
        return ic_error_os(err, ENOTSUP, file->path, "resize");
    return file->drv->truncate(file, size, err);
}

void ic_image_allocate(struct ic_image *file, uint64_t off, uint64_t len)
{
    if (file->drv->allocate && len)
        file->drv->allocate(file, off, len);
}

uint64_t ic_image_allocated_bytes(struct ic_image *file)
{
    return file->drv->allocated_bytes ? file->drv->allocated_bytes(file) : 0;
}

int ic_image_reads_as_hole(struct ic_image *file, uint64_t off, uint64_t len)
{
    return file->drv->reads_as_hole && len ? file->drv->reads_as_hole(file, off, len) : 0;
}
