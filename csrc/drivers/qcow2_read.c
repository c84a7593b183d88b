/* qcow2 reads and block status in qemu-img map's terms: what this image's
 * own layer holds (data, zero clusters, compressed clusters); what it
 * does not hold, the image layer asks the backing file.  The file is
 * untrusted input: every entry is checked before use. */
#include <stdlib.h>
#include <string.h>

#include "qcow2_state.h"

/* ---- cluster classification ------------------------------------------- */

enum cluster_kind { CL_UNALLOCATED, CL_ZERO, CL_NORMAL, CL_COMPRESSED };

/* One unit of the guest disk: a cluster, or with extended L2 entries a
 * subcluster (a 32nd of one) */
struct cluster {
    enum cluster_kind kind;
    uint64_t host;      /* NORMAL, ZERO with preallocation: the unit's start;
                           COMPRESSED: the compressed data's */
    uint64_t entry;     /* COMPRESSED: the L2 entry */
    int host_valid;     /* UNALLOCATED too: a subcluster of an allocated cluster */
};

/* Subcluster `sc` of an extended L2 entry, as qemu's
 * qcow2_get_subcluster_type reads it: the zero flag of the entry itself
 * means nothing there; the bitmap's high half says zeros, its low half
 * data, neither: the layer below. */
static int classify_subcluster(struct ic_image *img, uint64_t host, uint64_t bitmap,
                               unsigned sc, struct cluster *c, struct ic_error *err)
{
    struct qcow2_state *s = qcow2_state_of(img);
    uint64_t zeros = QCOW2_SUBCLUSTER_ZEROS(bitmap), data = QCOW2_SUBCLUSTER_DATA(bitmap);
    if (host ? (zeros & data) != 0 : data != 0)
        return qcow2_corrupt(img, err, host ? "subcluster both data and zeros"
                                            : "data subclusters in an unallocated cluster",
                             bitmap);
    c->host = host ? host + sc * s->unit_size : 0;
    c->host_valid = host != 0;
    c->kind = zeros >> sc & 1 ? CL_ZERO : data >> sc & 1 ? CL_NORMAL : CL_UNALLOCATED;
    return 0;
}

static int classify(struct ic_image *img, uint64_t entry, uint64_t bitmap, unsigned sc,
                    struct cluster *c, struct ic_error *err)
{
    struct qcow2_state *s = qcow2_state_of(img);
    memset(c, 0, sizeof *c);
    if (entry & QCOW2_OFLAG_COMPRESSED) {
        /* a compressed cluster is one, whatever its bitmap says (qemu
         * reads it so; its check complains) */
        c->kind = CL_COMPRESSED;
        c->entry = entry;
        uint64_t len;
        qcow2_compressed_decode(&s->h, entry, &c->host, &len);
        if (c->host < s->h.cluster_size)
            return qcow2_corrupt(img, err, "compressed cluster overlaps the header", c->host);
        return 0;
    }
    uint64_t host = entry & QCOW2_OFFSET_MASK;
    if (host && (host % s->h.cluster_size || host < s->h.cluster_size))
        return qcow2_corrupt(img, err, "misplaced data cluster", host);
    if (s->extl2)
        return classify_subcluster(img, host, bitmap, sc, c, err);
    if ((entry & QCOW2_OFLAG_ZERO) && s->h.version < 3)
        return qcow2_corrupt(img, err, "zero cluster in a version 2 image", entry);
    if (entry & QCOW2_OFLAG_ZERO) {
        c->kind = CL_ZERO;
        c->host = host;
        c->host_valid = host != 0;
    } else if (host) {
        c->kind = CL_NORMAL;
        c->host = host;
        c->host_valid = 1;
    } else {
        /* offset 0 is unallocated, whatever the flags say (COPIED alone:
         * qemu reads it so, and its check finds nothing wrong) */
        c->kind = CL_UNALLOCATED;
    }
    return 0;
}

#define UNITS_MAX 512u

/* Units [u, u + n) classified into `out`: *got of them (at least one, at
 * most UNITS_MAX, within one L2 table) */
static int get_units(struct ic_image *img, uint64_t u, uint64_t n, struct cluster *out,
                     uint64_t *got, struct ic_error *err)
{
    struct qcow2_state *s = qcow2_state_of(img);
    uint64_t per = s->extl2 ? QCOW2_SUBCLUSTERS : 1, first = u % per;
    uint64_t entries[UNITS_MAX], bitmaps[UNITS_MAX], clusters;
    if (n > UNITS_MAX - first)
        n = UNITS_MAX - first;
    if (qcow2_l2_get(img, u / per, (first + n + per - 1) / per, entries,
                     s->extl2 ? bitmaps : NULL, &clusters, err) < 0)
        return -1;
    uint64_t k = 0;
    for (uint64_t i = 0; i < clusters && k < n; i++)
        for (uint64_t sc = i ? 0 : first; sc < per && k < n; sc++, k++)
            if (classify(img, entries[i], s->extl2 ? bitmaps[i] : 0, (unsigned)sc, &out[k],
                         err) < 0)
                return -1;
    *got = k;
    return 0;
}

/* ---- reading ----------------------------------------------------------- */

int qcow2_pread(struct ic_image *img, void *vbuf, size_t len, uint64_t off,
                       struct ic_error *err)
{
    struct qcow2_state *s = qcow2_state_of(img);
    uint8_t *buf = vbuf;
    uint64_t csz = s->h.cluster_size, usz = s->unit_size;
    uint8_t *cbuf = NULL;
    struct cluster units[UNITS_MAX];
    /* the request's data clusters, wherever they lie in the file, are read
     * together once all are known (a fragmented image's clusters are in
     * flight at once, not waited for in turn) */
    struct ic_read_batch data;
    ic_read_batch_init(&data);
    int ret = 0;
    while (len > 0 && ret == 0) {
        uint64_t u = off / usz, got;
        if (get_units(img, u, (off % usz + len + usz - 1) / usz, units, &got, err) < 0)
            return free(cbuf), -1;
        for (uint64_t i = 0; i < got && len > 0 && ret == 0;) {
            struct cluster c = units[i];
            uint64_t in = off % usz;
            uint64_t n = usz - in < len ? usz - in : len;
            uint64_t j = i + 1;
            if (c.kind == CL_COMPRESSED) {
                /* the rest of its cluster, inflated once */
                uint64_t cin = off % csz;
                n = csz - cin < len ? csz - cin : len;
                j = i + (cin + n + usz - 1) / usz - cin / usz;
            }
            /* contiguous units of the same kind go in one request */
            while (c.kind != CL_COMPRESSED && j < got && n < len) {
                const struct cluster *d = &units[j];
                if (d->kind != c.kind ||
                    (c.kind == CL_NORMAL && d->host != c.host + (j - i) * usz))
                    break;
                n += usz < len - n ? usz : len - n;
                j++;
            }
            switch (c.kind) {
            case CL_NORMAL:
                if (c.host + in > QCOW2_MAX_OFFSET || n > QCOW2_MAX_OFFSET - (c.host + in))
                    ret = qcow2_corrupt(img, err, "unreadable data cluster", c.host + in);
                else
                    ret = ic_read_batch_add_padded(&data, s->file, buf, (size_t)n, c.host + in,
                                                   err);
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
                ret = qcow2_inflate_cluster(img, c.entry, cbuf, err);
                if (ret == 0)
                    memcpy(buf, cbuf + off % csz, (size_t)n);
                break;
            }
            buf += n;
            off += n;
            len -= (size_t)n;
            i = j;
        }
    }
    free(cbuf);
    if (ret == 0)
        ret = ic_read_batch_flush(&data, err);
    return ret;
}

/* ---- block status ----------------------------------------------------- */

/* qemu's test (qcow2_detect_metadata_preallocation): more clusters have a
 * refcount than the file has blocks allocated for. */
static int detect_prealloc(struct ic_image *img)
{
    struct qcow2_state *s = qcow2_state_of(img);
    uint64_t csz = s->h.cluster_size;
    uint64_t real_clusters = ic_image_allocated_bytes(s->file) / csz;
    uint64_t threshold = real_clusters * 10 / 9;
    if (threshold < real_clusters + 2)
        threshold = real_clusters + 2;
    uint64_t end_cluster = (ic_image_size(s->file) + csz - 1) / csz, count = 0;
    /* like qemu, an unreadable refcount structure just means "no" */
    return qcow2_count_refcounted(img, end_cluster, threshold, &count) == 0 && count >= threshold;
}

static int preallocated(struct ic_image *img)
{
    struct qcow2_state *s = qcow2_state_of(img);
    pthread_mutex_lock(&s->prealloc_lock);
    if (!s->prealloc_checked) {
        s->prealloc = detect_prealloc(img);
        s->prealloc_checked = 1;
    }
    int r = s->prealloc;
    pthread_mutex_unlock(&s->prealloc_lock);
    return r;
}

/* Guest range [start, end) unallocated here: the image layer asks the
 * backing file. */
static int status_below(uint64_t start, uint64_t end, struct ic_extent_list *out,
                        struct ic_error *err)
{
    struct ic_extent e = {.start = start, .length = end - start, .flags = IC_EXT_BELOW};
    return ic_extent_list_add(out, &e, err);
}

/* A run of data clusters at host offset `host`: in a preallocated image,
 * holes of the host file read as zeros (qemu's BDRV_BLOCK_RECURSE). */
static int status_data(struct ic_image *img, uint64_t start, uint64_t end, uint64_t host,
                       struct ic_extent_list *out, struct ic_error *err)
{
    struct qcow2_state *s = qcow2_state_of(img);
    if (!preallocated(img)) {
        struct ic_extent e = {.start = start, .length = end - start, .host_offset = host,
                              .flags = IC_EXT_DATA | IC_EXT_PRESENT | IC_EXT_OFFSET_VALID};
        return ic_extent_list_add(out, &e, err);
    }
    for (uint64_t pos = start; pos < end;) {
        struct ic_extent e;
        if (ic_image_data_status(s->file, pos, host + (pos - start), end - pos, &e, err) < 0 ||
            ic_extent_list_add(out, &e, err) < 0)
            return -1;
        pos += e.length;
    }
    return 0;
}

/* Unallocated subclusters of an allocated cluster, [start, end) at host
 * offset `host`: the backing file answers as far as it goes; past it (or
 * without one) they read as zeros that keep their place in the file, as
 * qemu-img map shows them. */
static int status_unallocated_subclusters(struct ic_image *img, uint64_t start, uint64_t end,
                                          uint64_t host, struct ic_extent_list *out,
                                          struct ic_error *err)
{
    uint64_t below = img->backing ? ic_image_qemu_length(img->backing) : 0;
    if (below > start && status_below(start, below < end ? below : end, out, err) < 0)
        return -1;
    if (below >= end)
        return 0;
    uint64_t from = below > start ? below : start;
    struct ic_extent e = {.start = from, .length = end - from, .host_offset = host + (from - start),
                          .flags = IC_EXT_ZERO | IC_EXT_OFFSET_VALID};
    return ic_extent_list_add(out, &e, err);
}

int qcow2_block_status(struct ic_image *img, uint64_t start, uint64_t end, uint64_t want,
                              struct ic_extent_list *out, struct ic_error *err)
{
    struct qcow2_state *s = qcow2_state_of(img);
    uint64_t csz = s->h.cluster_size, usz = s->unit_size;
    struct cluster units[UNITS_MAX];
    uint64_t pos = start, extra = 0;
    while (pos < end && (pos <= want || extra < WALK_EXTRA_CLUSTERS)) {
        uint64_t gc = pos / csz;
        /* whole L2 ranges without a table are one unallocated run: a
         * petabyte of nothing maps in one step */
        uint64_t l1_index = gc / s->l2_entries, l1_end = l1_index;
        while (l1_end < s->l1_len && !qcow2_l2_has_table(s, l1_end) &&
               l1_end * s->l2_entries * csz < end)
            l1_end++;
        /* past the L1 entries in memory, none has a table */
        if (l1_end > l1_index || l1_index >= s->l1_len) {
            uint64_t run_end = l1_end >= s->l1_len ? end : l1_end * s->l2_entries * csz;
            if (run_end > end || run_end < pos)
                run_end = end;
            if (status_below(pos, run_end, out, err) < 0)
                return -1;
            if (pos > want)
                extra += (run_end - pos) / csz + 1;
            pos = run_end;
            continue;
        }
        uint64_t u = pos / usz, got;
        uint64_t n = (end - u * usz + usz - 1) / usz;
        if (get_units(img, u, n, units, &got, err) < 0)
            return -1;
        for (uint64_t i = 0; i < got && pos < end;) {
            const struct cluster c = units[i];
            /* the run of units like this one, host offsets contiguous */
            uint64_t j = i + 1;
            for (; j < got; j++) {
                const struct cluster *d = &units[j];
                if (d->kind != c.kind || d->host_valid != c.host_valid ||
                    (c.host_valid && d->host != c.host + (j - i) * usz))
                    break;
            }
            uint64_t run_end = (u + j) * usz < end ? (u + j) * usz : end;
            uint64_t host = c.host + (pos - (u + i) * usz);
            struct ic_extent e = {.start = pos, .length = run_end - pos};
            int r = 0;
            switch (c.kind) {
            case CL_UNALLOCATED:
                r = c.host_valid ? status_unallocated_subclusters(img, pos, run_end, host, out,
                                                                  err)
                                 : status_below(pos, run_end, out, err);
                break;
            case CL_ZERO:
                e.flags = IC_EXT_ZERO | IC_EXT_PRESENT;
                if (c.host_valid) {
                    e.flags |= IC_EXT_OFFSET_VALID;
                    e.host_offset = host;
                }
                r = ic_extent_list_add(out, &e, err);
                break;
            case CL_NORMAL:
                r = status_data(img, pos, run_end, host, out, err);
                break;
            case CL_COMPRESSED:
                e.flags = IC_EXT_DATA | IC_EXT_PRESENT | IC_EXT_COMPRESSED;
                r = ic_extent_list_add(out, &e, err);
                break;
            }
            if (r < 0)
                return -1;
            if (pos > want)
                extra += s->extl2 ? (j - i + QCOW2_SUBCLUSTERS - 1) / QCOW2_SUBCLUSTERS : j - i;
            pos = run_end;
            i = j;
        }
    }
    return 0;
}

