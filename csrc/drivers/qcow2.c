/* qcow2, read side: header and feature checks, L1/L2 lookup through a
 * bounded L2 cache, zlib-compressed clusters, backing chains, and block
 * status in qemu-img map's terms.  The file is untrusted input: every
 * offset and size is checked before use, and metadata memory is capped. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "qcow2_internal.h"

static struct qcow2_state *state(struct ic_image *img)
{
    return qcow2_state_of(img);
}

/* ---- metadata reads ---------------------------------------------------- */

static int corrupt(struct ic_image *img, struct ic_error *err, const char *what, uint64_t value)
{
    return ic_error_format(err, img->path, "corrupt qcow2 image: %s (0x%llx)", what,
                           (unsigned long long)value);
}

int qcow2_read_meta(struct ic_image *img, void *buf, uint64_t len, uint64_t off,
                    const char *what, struct ic_error *err)
{
    struct qcow2_state *s = state(img);
    if (off > QCOW2_MAX_OFFSET || len > QCOW2_MAX_OFFSET - off)
        return corrupt(img, err, what, off);
    uint64_t fsize = ic_image_size(s->file);
    uint64_t n = off >= fsize ? 0 : (fsize - off < len ? fsize - off : len);
    if (n && ic_image_pread(s->file, buf, (size_t)n, off, err) < 0)
        return -1;
    memset((uint8_t *)buf + n, 0, (size_t)(len - n));
    return 0;
}

#define read_meta qcow2_read_meta

/* Copy up to `n` L2 entries for clusters starting at guest cluster `gc`
 * (within one L2 table); returns how many, 0..n.  An unallocated L2 table
 * reads as zero entries. */
static int l2_entries(struct ic_image *img, uint64_t gc, uint64_t n, uint64_t *out,
                      uint64_t *got, struct ic_error *err)
{
    struct qcow2_state *s = state(img);
    uint64_t l1_index = gc / s->l2_entries, l2_index = gc % s->l2_entries;
    if (n > s->l2_entries - l2_index)
        n = s->l2_entries - l2_index;
    *got = n;
    int in_memory;
    if (qcow2_writer_l2(s, gc, n, out, &in_memory) < 0 || in_memory)
        return 0;
    if (l1_index >= s->h.l1_size) {
        memset(out, 0, n * sizeof *out);
        return 0;
    }
    uint64_t l2_offset = s->l1[l1_index] & QCOW2_OFFSET_MASK;
    if (l2_offset == 0) {
        memset(out, 0, n * sizeof *out);
        return 0;
    }
    if (l2_offset % s->h.cluster_size || l2_offset < s->h.cluster_size)
        return corrupt(img, err, "misplaced L2 table", l2_offset);

    pthread_mutex_lock(&s->l2_lock);
    struct l2_slot *slot = NULL, *victim = &s->slots[0];
    for (unsigned i = 0; i < s->nslots; i++) {
        if (s->slots[i].offset == l2_offset) {
            slot = &s->slots[i];
            break;
        }
        if (s->slots[i].used < victim->used)
            victim = &s->slots[i];
    }
    if (!slot) {
        slot = victim;
        slot->offset = 0;
        /* slots get memory as they are first used */
        if (!slot->entries && !(slot->entries = malloc(s->h.cluster_size))) {
            pthread_mutex_unlock(&s->l2_lock);
            return ic_error_nomem(err);
        }
        if (read_meta(img, slot->entries, s->h.cluster_size, l2_offset, "unreadable L2 table", err) < 0) {
            pthread_mutex_unlock(&s->l2_lock);
            return -1;
        }
        for (uint64_t i = 0; i < s->l2_entries; i++)
            slot->entries[i] = qcow2_be64(&slot->entries[i]);
        slot->offset = l2_offset;
    }
    slot->used = ++s->tick;
    memcpy(out, &slot->entries[l2_index], n * sizeof *out);
    pthread_mutex_unlock(&s->l2_lock);
    return 0;
}

/* ---- cluster classification ------------------------------------------- */

enum cluster_kind { CL_UNALLOCATED, CL_ZERO, CL_NORMAL, CL_COMPRESSED };

struct cluster {
    enum cluster_kind kind;
    uint64_t host;      /* NORMAL, ZERO with preallocation: cluster start */
    uint64_t csize;     /* COMPRESSED: bytes of compressed data */
    int host_valid;
};

static int classify(struct ic_image *img, uint64_t entry, struct cluster *c, struct ic_error *err)
{
    struct qcow2_state *s = state(img);
    memset(c, 0, sizeof *c);
    if (entry & QCOW2_OFLAG_COMPRESSED) {
        unsigned x = 62 - (s->h.cluster_bits - 8);
        uint64_t host = entry & ((1ull << x) - 1);
        uint64_t sectors = ((entry & ~QCOW2_OFLAG_COPIED & ~QCOW2_OFLAG_COMPRESSED) >> x) + 1;
        c->kind = CL_COMPRESSED;
        c->host = host;
        c->csize = sectors * 512 - (host & 511);
        if (host < s->h.cluster_size)
            return corrupt(img, err, "compressed cluster overlaps the header", host);
        return 0;
    }
    uint64_t host = entry & QCOW2_OFFSET_MASK;
    if (host && (host % s->h.cluster_size || host < s->h.cluster_size))
        return corrupt(img, err, "misplaced data cluster", host);
    if ((entry & QCOW2_OFLAG_ZERO) && s->h.version < 3)
        return corrupt(img, err, "zero cluster in a version 2 image", entry);
    if (entry & QCOW2_OFLAG_ZERO) {
        c->kind = CL_ZERO;
        c->host = host;
        c->host_valid = host != 0;
    } else if (host) {
        c->kind = CL_NORMAL;
        c->host = host;
        c->host_valid = 1;
    } else {
        if (entry & QCOW2_OFLAG_COPIED)
            return corrupt(img, err, "data cluster at offset 0", entry);
        c->kind = CL_UNALLOCATED;
    }
    return 0;
}

/* ---- reading ----------------------------------------------------------- */

/* Host file reads past its end return zeros, as qemu's do. */
static int read_host(struct ic_image *img, uint8_t *buf, uint64_t len, uint64_t off,
                     struct ic_error *err)
{
    struct qcow2_state *s = state(img);
    uint64_t fsize = ic_image_size(s->file);
    uint64_t n = off >= fsize ? 0 : (fsize - off < len ? fsize - off : len);
    if (n && ic_image_pread(s->file, buf, (size_t)n, off, err) < 0)
        return -1;
    memset(buf + n, 0, (size_t)(len - n));
    return 0;
}

static int inflate_cluster(struct ic_image *img, const struct cluster *c, uint8_t *out,
                           struct ic_error *err)
{
    struct qcow2_state *s = state(img);
    uint64_t csize = c->csize > 2 * s->h.cluster_size ? 2 * s->h.cluster_size : c->csize;
    uint8_t *in = malloc(csize);
    if (!in)
        return ic_error_nomem(err);
    if (read_host(img, in, csize, c->host, err) < 0) {
        free(in);
        return -1;
    }
    z_stream z;
    memset(&z, 0, sizeof z);
    int ret = inflateInit2(&z, -12);
    if (ret != Z_OK) {
        free(in);
        return ic_error_nomem(err);
    }
    z.next_in = in;
    z.avail_in = (uInt)csize;
    z.next_out = out;
    z.avail_out = (uInt)s->h.cluster_size;
    ret = inflate(&z, Z_FINISH);
    int full = z.avail_out == 0;
    inflateEnd(&z);
    free(in);
    /* qemu accepts a stream that fills the cluster, ended or not */
    if (!full || (ret != Z_STREAM_END && ret != Z_BUF_ERROR && ret != Z_OK))
        return corrupt(img, err, "compressed cluster does not inflate to a cluster", c->host);
    return 0;
}

int qcow2_copy_compressed(struct ic_image *img, uint64_t entry, uint64_t host,
                          struct ic_error *err)
{
    struct qcow2_state *s = state(img);
    struct cluster c;
    uint8_t *buf = malloc(s->h.cluster_size);
    if (!buf)
        return ic_error_nomem(err);
    int ret = classify(img, entry, &c, err);
    if (ret == 0)
        ret = inflate_cluster(img, &c, buf, err);
    if (ret == 0)
        ret = ic_image_pwrite(s->file, buf, s->h.cluster_size, host, err);
    free(buf);
    return ret;
}

int qcow2_copy_from_backing(struct ic_image *img, uint64_t gc, uint64_t host,
                            struct ic_error *err)
{
    struct qcow2_state *s = state(img);
    uint64_t csz = s->h.cluster_size, off = gc * csz;
    uint64_t n = s->h.size - off < csz ? s->h.size - off : csz;
    uint8_t *buf = malloc(csz);
    if (!buf)
        return ic_error_nomem(err);
    int ret = ic_image_read_below(img, buf, (size_t)n, off, err);
    if (ret == 0)
        ret = ic_image_pwrite(s->file, buf, n, host, err);
    free(buf);
    return ret;
}

static int qcow2_pread(struct ic_image *img, void *vbuf, size_t len, uint64_t off,
                       struct ic_error *err)
{
    struct qcow2_state *s = state(img);
    uint8_t *buf = vbuf;
    uint64_t csz = s->h.cluster_size;
    uint8_t *cbuf = NULL;
    uint64_t entries[512];
    int ret = 0;
    while (len > 0 && ret == 0) {
        uint64_t gc = off / csz, got;
        uint64_t want = (off % csz + len + csz - 1) / csz;
        if (want > 512)
            want = 512;
        if (l2_entries(img, gc, want, entries, &got, err) < 0)
            return free(cbuf), -1;
        for (uint64_t i = 0; i < got && len > 0 && ret == 0;) {
            struct cluster c;
            if (classify(img, entries[i], &c, err) < 0) {
                ret = -1;
                break;
            }
            uint64_t in = off % csz;
            uint64_t n = csz - in < len ? csz - in : len;
            /* contiguous clusters of the same kind go in one request */
            uint64_t j = i + 1;
            while (j < got && n < len) {
                struct cluster d;
                if (classify(img, entries[j], &d, err) < 0)
                    return free(cbuf), -1;
                if (d.kind != c.kind || c.kind == CL_COMPRESSED ||
                    (c.kind == CL_NORMAL && d.host != c.host + (j - i) * csz))
                    break;
                n += csz < len - n ? csz : len - n;
                j++;
            }
            switch (c.kind) {
            case CL_NORMAL:
                ret = read_host(img, buf, n, c.host + in, err);
                break;
            case CL_ZERO:
                memset(buf, 0, (size_t)n);
                break;
            case CL_UNALLOCATED:
                ret = ic_image_read_below(img, buf, (size_t)n, off, err);
                break;
            case CL_COMPRESSED:
                if (!cbuf && !(cbuf = malloc(csz)))
                    return ic_error_nomem(err);
                ret = inflate_cluster(img, &c, cbuf, err);
                if (ret == 0)
                    memcpy(buf, cbuf + in, (size_t)n);
                break;
            }
            buf += n;
            off += n;
            len -= (size_t)n;
            i = j;
        }
    }
    free(cbuf);
    return ret;
}

static int qcow2_pwrite(struct ic_image *img, const void *buf, size_t len, uint64_t off,
                        struct ic_error *err)
{
    return qcow2_write(img, buf, len, off, err);
}

static int qcow2_zero(struct ic_image *img, uint64_t off, uint64_t len, unsigned flags,
                      struct ic_error *err)
{
    (void)flags;
    return qcow2_write_zeroes(img, off, len, err);
}

static int qcow2_flush(struct ic_image *img, struct ic_error *err)
{
    struct qcow2_state *s = state(img);
    return s->w ? ic_image_flush(s->file, err) : 0;
}

/* ---- block status ----------------------------------------------------- */

/* qemu's test (qcow2_detect_metadata_preallocation): more clusters have a
 * refcount than the file has blocks allocated for. */
static int count_refcounted(struct ic_image *img, uint64_t end_cluster, uint64_t threshold,
                            uint64_t *count)
{
    struct qcow2_state *s = state(img);
    struct ic_error err;
    uint64_t csz = s->h.cluster_size;
    unsigned bits = 1u << s->h.refcount_order;
    uint64_t per_block = csz * 8 / bits;
    uint64_t table_bytes = (uint64_t)s->h.refcount_table_clusters * csz;
    if (table_bytes > QCOW2_MAX_REFTABLE_BYTES)
        return -1;
    uint64_t *table = malloc(table_bytes ? table_bytes : 1);
    uint8_t *block = malloc(csz);
    int ret = -1;
    if (!table || !block ||
        read_meta(img, table, table_bytes, s->h.refcount_table_offset, "refcount table", &err))
        goto out;
    *count = 0;
    for (uint64_t i = 0; i < end_cluster && *count < threshold;) {
        uint64_t ti = i / per_block;
        if (ti >= table_bytes / 8)
            break;
        uint64_t boff = qcow2_be64(&table[ti]) & QCOW2_OFFSET_MASK;
        uint64_t first = i, last = (ti + 1) * per_block;
        if (last > end_cluster)
            last = end_cluster;
        i = last;
        if (!boff)
            continue;
        if (read_meta(img, block, csz, boff, "refcount block", &err) < 0)
            goto out;
        for (uint64_t k = first; k < last && *count < threshold; k++) {
            uint64_t idx = k % per_block;
            uint64_t bitpos = idx * bits;
            uint64_t v = 0;
            if (bits >= 8) {
                for (unsigned b = 0; b < bits / 8; b++)
                    v = v << 8 | block[bitpos / 8 + b];
            } else {
                v = (block[bitpos / 8] >> (bitpos % 8)) & ((1u << bits) - 1);
            }
            *count += v != 0;
        }
    }
    ret = 0;
out:
    free(table);
    free(block);
    return ret;
}

static int detect_prealloc(struct ic_image *img)
{
    struct qcow2_state *s = state(img);
    uint64_t csz = s->h.cluster_size;
    uint64_t real_clusters = ic_image_allocated_bytes(s->file) / csz;
    uint64_t threshold = real_clusters * 10 / 9;
    if (threshold < real_clusters + 2)
        threshold = real_clusters + 2;
    uint64_t end_cluster = (ic_image_size(s->file) + csz - 1) / csz, count = 0;
    /* like qemu, an unreadable refcount structure just means "no" */
    return count_refcounted(img, end_cluster, threshold, &count) == 0 && count >= threshold;
}

static int preallocated(struct ic_image *img)
{
    struct qcow2_state *s = state(img);
    pthread_mutex_lock(&s->prealloc_lock);
    if (!s->prealloc_checked) {
        s->prealloc = detect_prealloc(img);
        s->prealloc_checked = 1;
    }
    int r = s->prealloc;
    pthread_mutex_unlock(&s->prealloc_lock);
    return r;
}

static int push(struct ic_extent_list *out, const struct ic_extent *e, struct ic_error *err)
{
    if (ic_extent_list_push(out, e) < 0)
        return ic_error_nomem(err);
    return 0;
}

/* Guest range [start, end) unallocated here: the image layer asks the
 * backing file. */
static int status_below(uint64_t start, uint64_t end, struct ic_extent_list *out,
                        struct ic_error *err)
{
    struct ic_extent e = {.start = start, .length = end - start, .flags = IC_EXT_BELOW};
    return push(out, &e, err);
}

/* A run of data clusters at host offset `host`: in a preallocated image,
 * holes of the host file read as zeros (qemu's BDRV_BLOCK_RECURSE). */
static int status_data(struct ic_image *img, uint64_t start, uint64_t end, uint64_t host,
                       struct ic_extent_list *out, struct ic_error *err)
{
    struct qcow2_state *s = state(img);
    uint32_t flags = IC_EXT_DATA | IC_EXT_PRESENT | IC_EXT_OFFSET_VALID;
    if (!preallocated(img)) {
        struct ic_extent e = {.start = start, .length = end - start, .host_offset = host,
                              .flags = flags};
        return push(out, &e, err);
    }
    uint64_t fsize = ic_image_size(s->file);
    for (uint64_t pos = start; pos < end;) {
        uint64_t h = host + (pos - start);
        struct ic_extent e = {.start = pos, .host_offset = h, .flags = flags};
        if (h >= fsize) {
            e.length = end - pos;
            e.flags |= IC_EXT_ZERO;
        } else {
            struct ic_extent f;
            uint64_t lim = end - pos < fsize - h ? end - pos : fsize - h;
            if (ic_image_block_status(s->file, h, lim, &f, err) < 0)
                return -1;
            e.length = f.length;
            if (f.flags & IC_EXT_ZERO)
                e.flags |= IC_EXT_ZERO;
        }
        if (push(out, &e, err) < 0)
            return -1;
        pos += e.length;
    }
    return 0;
}

/* Whether L1 entry i has an L2 table (in memory, for an image being
 * written). */
static int l2_present(struct qcow2_state *s, uint64_t i)
{
    if (s->w)
        return qcow2_writer_has_table(s, i);
    return (s->l1[i] & QCOW2_OFFSET_MASK) != 0;
}

static int qcow2_block_status(struct ic_image *img, uint64_t start, uint64_t end, uint64_t want,
                              struct ic_extent_list *out, struct ic_error *err)
{
    struct qcow2_state *s = state(img);
    uint64_t csz = s->h.cluster_size;
    uint64_t entries[512];
    uint64_t pos = start, extra = 0;
    while (pos < end && (pos <= want || extra < WALK_EXTRA_CLUSTERS)) {
        uint64_t gc = pos / csz, got;
        /* whole L2 ranges without a table are one unallocated run: a
         * petabyte of nothing maps in one step */
        uint64_t l1_index = gc / s->l2_entries, l1_end = l1_index;
        while (l1_end < s->h.l1_size && !l2_present(s, l1_end) &&
               l1_end * s->l2_entries * csz < end)
            l1_end++;
        if (l1_end > l1_index || l1_index >= s->h.l1_size) {
            uint64_t run_end = l1_index >= s->h.l1_size ? end : l1_end * s->l2_entries * csz;
            if (run_end > end || run_end < pos)
                run_end = end;
            if (status_below(pos, run_end, out, err) < 0)
                return -1;
            if (pos > want)
                extra += (run_end - pos) / csz + 1;
            pos = run_end;
            continue;
        }
        uint64_t n = (end - gc * csz + csz - 1) / csz;
        if (l2_entries(img, gc, n < 512 ? n : 512, entries, &got, err) < 0)
            return -1;
        for (uint64_t i = 0; i < got && pos < end;) {
            struct cluster c;
            if (classify(img, entries[i], &c, err) < 0)
                return -1;
            /* the run of clusters like this one, host offsets contiguous */
            uint64_t j = i + 1;
            for (; j < got; j++) {
                struct cluster d;
                if (classify(img, entries[j], &d, err) < 0)
                    return -1;
                if (d.kind != c.kind || d.host_valid != c.host_valid ||
                    (c.host_valid && d.host != c.host + (j - i) * csz))
                    break;
            }
            uint64_t run_end = (gc + j) * csz < end ? (gc + j) * csz : end;
            uint64_t host = c.host + (pos - (gc + i) * csz);
            struct ic_extent e = {.start = pos, .length = run_end - pos};
            int r = 0;
            switch (c.kind) {
            case CL_UNALLOCATED:
                r = status_below(pos, run_end, out, err);
                break;
            case CL_ZERO:
                e.flags = IC_EXT_ZERO | IC_EXT_PRESENT;
                if (c.host_valid) {
                    e.flags |= IC_EXT_OFFSET_VALID;
                    e.host_offset = host;
                }
                r = push(out, &e, err);
                break;
            case CL_NORMAL:
                r = status_data(img, pos, run_end, host, out, err);
                break;
            case CL_COMPRESSED:
                e.flags = IC_EXT_DATA | IC_EXT_PRESENT | IC_EXT_COMPRESSED;
                r = push(out, &e, err);
                break;
            }
            if (r < 0)
                return -1;
            if (pos > want)
                extra += j - i;
            pos = run_end;
            i = j;
        }
    }
    return 0;
}

/* ---- opening ----------------------------------------------------------- */

static void free_state(struct qcow2_state *s)
{
    if (!s)
        return;
    if (s->slots) {
        for (unsigned i = 0; i < s->nslots; i++)
            free(s->slots[i].entries);
        free(s->slots);
    }
    qcow2_writer_free(s->w, s->h.l1_size);
    free(s->l1);
    free(s->snapshots);
    pthread_mutex_destroy(&s->l2_lock);
    pthread_mutex_destroy(&s->prealloc_lock);
    free(s);
}

static void qcow2_close(struct ic_image *img)
{
    free_state(state(img));
    img->drv_state = NULL;
}

static int load(struct ic_image *img, struct qcow2_state *s, struct ic_error *err)
{
    uint8_t *cluster0 = NULL;
    uint64_t fsize = ic_image_size(s->file);
    uint8_t head[QCOW2_HEADER_READ];
    memset(head, 0, sizeof head);
    uint64_t nhead = fsize < sizeof head ? fsize : sizeof head;
    if (nhead < QCOW2_HEADER_V2_LEN)
        return ic_error_format(err, img->path, "truncated qcow2 header (%llu bytes)",
                               (unsigned long long)fsize);
    if (ic_image_pread(s->file, head, (size_t)nhead, 0, err) < 0)
        return -1;
    if (qcow2_parse_header(head, nhead, &s->h, img->path, err) < 0)
        return -1;

    /* the header cluster: extensions and the backing file name live there */
    uint64_t n0 = fsize < s->h.cluster_size ? fsize : s->h.cluster_size;
    cluster0 = calloc(1, s->h.cluster_size);
    if (!cluster0)
        return ic_error_nomem(err);
    if (ic_image_pread(s->file, cluster0, (size_t)n0, 0, err) < 0 ||
        qcow2_parse_extensions(cluster0, s->h.cluster_size, &s->h, img->path, err) < 0) {
        free(cluster0);
        return -1;
    }
    free(cluster0);
    if (qcow2_check_features(&s->h, (img->open_flags & IC_OPEN_FORCE) != 0,
                             (img->open_flags & IC_OPEN_RDWR) != 0, img->path, err) < 0)
        return -1;

    /* qemu sees whole 512-byte sectors of the virtual size */
    img->size = s->h.size / 512 * 512;
    s->l2_entries = s->h.cluster_size / 8;
    uint64_t l1_bytes = (uint64_t)s->h.l1_size * 8;
    if (s->h.l1_size) {
        if (ic_image_take_meta_budget(img, l1_bytes) < 0)
            return ic_error_format(err, img->path, "the backing chain's L1 tables need more "
                                   "than %u MiB of memory", IC_CHAIN_META_BUDGET >> 20);
        s->l1 = malloc(l1_bytes);
        if (!s->l1)
            return ic_error_nomem(err);
        if (read_meta(img, s->l1, l1_bytes, s->h.l1_table_offset, "unreadable L1 table",
                      err) < 0)
            return -1;
        for (uint64_t i = 0; i < s->h.l1_size; i++)
            s->l1[i] = qcow2_be64(&s->l1[i]);
    }

    if (qcow2_load_snapshots(img, err) < 0 || qcow2_check_bitmaps(img, err) < 0)
        return -1;

    unsigned slots = (unsigned)(L2_CACHE_BYTES / s->h.cluster_size);
    s->nslots = slots < L2_CACHE_MIN_SLOTS   ? L2_CACHE_MIN_SLOTS
                : slots > L2_CACHE_MAX_SLOTS ? L2_CACHE_MAX_SLOTS
                                             : slots;
    s->slots = calloc(s->nslots, sizeof *s->slots);
    if (!s->slots)
        return ic_error_nomem(err);

    /* the image layer opens the backing file this image names */
    snprintf(img->backing_name, sizeof img->backing_name, "%s", s->h.backing_name);
    snprintf(img->backing_format, sizeof img->backing_format, "%s", s->h.backing_format);
    return 0;
}

static int qcow2_open(struct ic_image *img, struct ic_error *err)
{
    struct qcow2_state *s = calloc(1, sizeof *s);
    if (!s)
        return ic_error_nomem(err);
    pthread_mutex_init(&s->l2_lock, NULL);
    pthread_mutex_init(&s->prealloc_lock, NULL);
    s->file = img->file;
    img->drv_state = s;
    if (load(img, s, err) < 0 ||
        ((img->open_flags & IC_OPEN_RDWR) && qcow2_open_writer(img, err) < 0)) {
        free_state(s);
        img->drv_state = NULL;
        return -1;
    }
    return 0;
}

const struct ic_driver ic_format_qcow2 = {
    .name = "qcow2",
    .kind = IC_FORMAT,
    .open = qcow2_open,
    .create = qcow2_create,
    .close = qcow2_close,
    .pread = qcow2_pread,
    .pwrite = qcow2_pwrite,
    .zero = qcow2_zero,
    .flush = qcow2_flush,
    .block_status = qcow2_block_status,
    .random_access_status = 1,
    .stage = qcow2_stage,
    .place = qcow2_place,
    .commit = qcow2_commit,
    .unstage = qcow2_unstage,
    .finish = qcow2_finish,
    .snapshots = qcow2_snapshots,
    .write_alignment = qcow2_write_alignment,
};
