/* Hosted sparse extents ("KDMV", versions 1 to 3): the header (or, in a
 * stream, the footer that replaces it), the grain directory read at open,
 * grain tables read when first needed into a cache shared by all extents
 * and bounded, and compressed grains (streamOptimized: a marker with the
 * grain's LBA and size, then a zlib stream).  Every field is hostile: the
 * bounds are qemu's, and what lies past the end of a file reads as zeros,
 * as qemu reads it. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "../compression.h"
#include "vmdk_state.h"

void vmdk_sparse_decode(const uint8_t *b, struct vmdk_sparse_header *h)
{
    /* offsets are those of the packed struct after the 4-byte magic */
    h->version = vmdk_le32(b + 4);
    h->flags = vmdk_le32(b + 8);
    h->capacity = vmdk_le64(b + 12);
    h->granularity = vmdk_le64(b + 20);
    h->desc_offset = vmdk_le64(b + 28);
    h->desc_size = vmdk_le64(b + 36);
    h->gtes = vmdk_le32(b + 44);
    h->rgd_offset = vmdk_le64(b + 48);
    h->gd_offset = vmdk_le64(b + 56);
    h->grain_offset = vmdk_le64(b + 64);
    h->compress = (uint16_t)(b[77] | b[78] << 8);
}

int vmdk_sparse_check(const struct vmdk_sparse_header *h, uint64_t file_size, const char *path,
                      struct ic_error *err)
{
    if (h->version > 3)
        return vmdk_error(err, path, "unsupported VMDK version %u", h->version);
    if (h->gtes > VMDK_MAX_GTES)
        return vmdk_error(err, path, "grain table of %u entries is too big (at most %u)",
                          h->gtes, VMDK_MAX_GTES);
    if (h->gtes == 0)
        return vmdk_error(err, path, "grain tables of 0 entries");
    if (h->granularity == 0 || h->granularity > VMDK_MAX_GRAIN_SECTORS)
        return vmdk_error(err, path, "invalid granularity %llu sectors",
                          (unsigned long long)h->granularity);
    uint64_t per_gt = (uint64_t)h->gtes * h->granularity;
    uint64_t gd = h->capacity / per_gt + (h->capacity % per_gt != 0);
    if (gd > VMDK_MAX_GD_ENTRIES)
        return vmdk_error(err, path, "grain directory of %llu entries is too big",
                          (unsigned long long)gd);
    /* so that byte offsets of the guest and of the file never overflow */
    if (h->capacity > (UINT64_C(1) << 54))
        return vmdk_error(err, path, "capacity of %llu sectors is too large",
                          (unsigned long long)h->capacity);
    if (h->gd_offset >= (UINT64_C(1) << 54))
        return vmdk_error(err, path, "grain directory offset %llu is invalid",
                          (unsigned long long)h->gd_offset);
    uint64_t file_sectors = file_size / VMDK_SECTOR + (file_size % VMDK_SECTOR != 0);
    if (file_sectors < h->grain_offset)
        return vmdk_error(err, path, "file truncated, expecting at least %llu bytes",
                          (unsigned long long)h->grain_offset * VMDK_SECTOR);
    if (h->compress == VMDK4_COMPRESSION_DEFLATE &&
        h->granularity * VMDK_SECTOR > VMDK_MAX_COMPRESSED_GRAIN)
        return vmdk_error(err, path, "compressed grains of %llu bytes are too large",
                          (unsigned long long)(h->granularity * VMDK_SECTOR));
    return 0;
}

/* A stream's footer: the header that counts, at the end of the file
 * between a footer marker and an end-of-stream marker. */
static int read_footer(struct ic_image *img, struct vmdk_extent *e, struct vmdk_sparse_header *h,
                       struct ic_error *err)
{
    uint8_t f[1536];
    uint64_t end = (e->file_size + VMDK_SECTOR - 1) / VMDK_SECTOR * VMDK_SECTOR;
    if (end < sizeof f)
        return vmdk_error(err, img->path, "invalid footer (file too small)");
    if (ic_image_pread_padded(e->file, f, sizeof f, end - sizeof f, err) < 0)
        return -1;
    if (memcmp(f + 512, VMDK4_MAGIC, 4) != 0 || vmdk_le32(f + 8) != 0 ||
        vmdk_le32(f + 12) != VMDK_MARKER_FOOTER || vmdk_le64(f + 1024) != 0 ||
        vmdk_le32(f + 1032) != 0 || vmdk_le32(f + 1036) != VMDK_MARKER_EOS)
        return vmdk_error(err, img->path, "invalid footer");
    vmdk_sparse_decode(f + 512, h);
    return 0;
}

int vmdk_sparse_open(struct ic_image *img, struct vmdk_extent *e, struct vmdk_sparse_header *h,
                     struct ic_error *err)
{
    uint8_t head[512];
    if (e->file_size < 4)
        return vmdk_error(err, img->path, "file is too small, not a valid image");
    if (ic_image_pread_padded(e->file, head, sizeof head, 0, err) < 0)
        return -1;
    if (memcmp(head, VMDK3_MAGIC, 4) == 0)
        return vmdk_error(err, img->path, "VMDK3 (\"COWD\", vmfsSparse) extents are not "
                          "supported");
    if (memcmp(head, VMDK4_MAGIC, 4) != 0)
        return vmdk_error(err, img->path, "extent is not a hosted sparse extent (no KDMV "
                          "magic)");
    vmdk_sparse_decode(head, h);
    /* a capacity of 0 with a descriptor: the caller decides */
    if (h->capacity == 0 && h->desc_offset)
        return 0;
    if (h->gd_offset == VMDK4_GD_AT_END && read_footer(img, e, h, err) < 0)
        return -1;
    if (vmdk_sparse_check(h, e->file_size, img->path, err) < 0)
        return -1;
    e->flat = 0;
    e->version = h->version;
    e->compressed = h->compress == VMDK4_COMPRESSION_DEFLATE;
    e->has_marker = (h->flags & VMDK4_FLAG_MARKER) != 0;
    e->zero_grain = (h->flags & VMDK4_FLAG_ZERO_GRAIN) != 0;
    e->grain = h->granularity * VMDK_SECTOR;
    e->gtes = h->gtes;
    e->end = e->start + h->capacity * VMDK_SECTOR;
    uint64_t per_gt = (uint64_t)h->gtes * h->granularity;
    e->gd_entries = h->capacity / per_gt + (h->capacity % per_gt != 0);
    /* the directory is held as far as the file goes: a header may claim
     * 32 Mi entries (128 MiB) in a file of a few KiB */
    uint64_t gd_at = h->gd_offset * VMDK_SECTOR;
    uint64_t in_file = gd_at < e->file_size ? (e->file_size - gd_at + 3) / 4 : 0;
    e->gd_len = in_file < e->gd_entries ? in_file : e->gd_entries;
    uint64_t bytes = e->gd_len * 4;
    if (!bytes)
        return 0;
    if (ic_image_take_meta_budget(img, bytes) < 0)
        return vmdk_error(err, img->path, "the grain directories need more than %u MiB of "
                          "memory", IC_CHAIN_META_BUDGET >> 20);
    e->gd = malloc((size_t)bytes);
    if (!e->gd)
        return ic_error_nomem(err);
    if (ic_image_pread_padded(e->file, e->gd, (size_t)bytes, gd_at, err) < 0)
        return -1;
    for (uint64_t i = 0; i < e->gd_len; i++)
        e->gd[i] = vmdk_le32((const uint8_t *)&e->gd[i]);
    return 0;
}

enum vmdk_grain_kind vmdk_sparse_kind(const struct vmdk_extent *e, uint32_t entry)
{
    if (entry == 0)
        return VMDK_UNALLOC;
    if (e->zero_grain && entry == VMDK_GTE_ZEROED)
        return VMDK_ZEROED;
    return e->compressed ? VMDK_COMPRESSED : VMDK_DATA;
}

static struct vmdk_gt_slot *cached_table(struct ic_image *img, size_t xi, uint64_t gdi,
                                         struct ic_error *err)
{
    struct vmdk_state *s = vmdk_state_of(img);
    const struct vmdk_extent *e = &s->ext[xi];
    struct vmdk_gt_slot *slot = &s->slots[(xi * 7919 + gdi) % VMDK_GT_CACHE_SLOTS];
    if (slot->valid && slot->ext == xi && slot->gd_index == gdi)
        return slot;
    uint64_t bytes = (uint64_t)e->gtes * 4;
    if (!slot->table) {
        /* tables of all sizes fit a slot of the largest */
        if (ic_image_take_meta_budget(img, VMDK_MAX_GTES * 4) < 0) {
            vmdk_error(err, img->path, "the grain table cache needs more than %u MiB of "
                       "memory", IC_CHAIN_META_BUDGET >> 20);
            return NULL;
        }
        slot->table = malloc(VMDK_MAX_GTES * 4);
        if (!slot->table) {
            ic_error_nomem(err);
            return NULL;
        }
    }
    slot->valid = 0;
    if (ic_image_pread_padded(e->file, slot->table, (size_t)bytes,
                              (uint64_t)e->gd[gdi] * VMDK_SECTOR, err) < 0)
        return NULL;
    for (uint32_t i = 0; i < e->gtes; i++)
        slot->table[i] = vmdk_le32((const uint8_t *)&slot->table[i]);
    slot->ext = xi;
    slot->gd_index = gdi;
    slot->valid = 1;
    return slot;
}

int vmdk_sparse_entries(struct ic_image *img, size_t xi, uint64_t first, uint64_t max,
                        uint32_t *out, uint64_t *got, struct ic_error *err)
{
    struct vmdk_state *s = vmdk_state_of(img);
    const struct vmdk_extent *e = &s->ext[xi];
    uint64_t gdi = first / e->gtes, gti = first % e->gtes;
    uint64_t n = e->gtes - gti < max ? e->gtes - gti : max;
    if (gdi >= e->gd_entries)
        return vmdk_error(err, img->path, "grain %llu is past the grain directory",
                          (unsigned long long)first);
    *got = n;
    if (vmdk_gd_entry(e, gdi) == 0) {
        memset(out, 0, (size_t)n * 4);
        return 0;
    }
    pthread_mutex_lock(&s->gt_lock);
    struct vmdk_gt_slot *slot = cached_table(img, xi, gdi, err);
    if (slot)
        memcpy(out, slot->table + gti, (size_t)n * 4);
    pthread_mutex_unlock(&s->gt_lock);
    return slot ? 0 : -1;
}

int vmdk_sparse_inflate(struct ic_image *img, const struct vmdk_extent *e, uint32_t entry,
                        uint8_t *out, uint64_t need, struct ic_error *err)
{
    uint64_t off = (uint64_t)entry * VMDK_SECTOR, len = e->grain;
    if (e->has_marker) {
        uint8_t m[12];
        if (ic_image_pread_padded(e->file, m, sizeof m, off, err) < 0)
            return -1;
        len = vmdk_le32(m + 8);
        off += sizeof m;
        /* qemu reads two grains from the marker */
        if (len == 0 || len > 2 * e->grain)
            return vmdk_error(err, img->path, "compressed grain at offset %llu has an "
                              "invalid size %llu", (unsigned long long)(off - sizeof m),
                              (unsigned long long)len);
    }
    /* what lies past the end of the file reads as zeros: a stream ends
     * before that or does not inflate */
    if (off >= e->file_size)
        return vmdk_error(err, img->path, "compressed grain at offset %llu is past the end "
                          "of the file", (unsigned long long)off);
    if (len > e->file_size - off)
        len = e->file_size - off;
    uint8_t *in = malloc((size_t)len);
    if (!in)
        return ic_error_nomem(err);
    if (ic_image_pread(e->file, in, (size_t)len, off, err) < 0) {
        free(in);
        return -1;
    }
    size_t made;
    int r = ic_zlib_inflate(in, (size_t)len, out, (size_t)e->grain, &made);
    int saved = errno;
    free(in);
    if (r < 0 && saved == ENOMEM)
        return ic_error_nomem(err);
    if (r < 0 || made < need)
        return vmdk_error(err, img->path, "compressed grain at offset %llu does not "
                          "inflate to a grain", (unsigned long long)off);
    if (made < e->grain)
        memset(out + made, 0, (size_t)(e->grain - made));
    return 0;
}

void vmdk_cache_free(struct vmdk_state *s)
{
    for (unsigned i = 0; i < VMDK_GT_CACHE_SLOTS; i++)
        free(s->slots[i].table);
}
