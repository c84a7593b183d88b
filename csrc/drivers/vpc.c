/* VHD, qemu's "vpc" format, read-only: fixed disks (the guest bytes, then
 * a footer) and dynamic disks (a footer copy at 0, a dynamic header, a
 * block allocation table of sector numbers, blocks of a sector bitmap and
 * data).  Like qemu 7.2, reads ignore the bitmaps: an allocated block is
 * data as a whole, an unallocated one reads as zeros.  Differencing disks
 * and types the specification does not define are refused (qemu would
 * read them as dynamic disks, a differencing one without its parent). */
#include <stdlib.h>
#include <string.h>

#include "image.h"
#include "vpc_format.h"

/* BAT entries checked per read at open */
#define BAT_CHUNK 16384u

struct vpc_state {
    struct ic_image *file;
    struct vpc_footer footer;
    struct vpc_dyn_header dyn;
    int dynamic_layout;     /* a footer copy at 0, a dynamic header */
    uint32_t *bat;          /* dynamic: the entries the virtual size uses */
    uint64_t nblocks;
};

static struct vpc_state *state_of(struct ic_image *img)
{
    return img->drv_state;
}

static void vpc_close(struct ic_image *img)
{
    struct vpc_state *s = state_of(img);
    if (!s)
        return;
    free(s->bat);
    free(s);
    img->drv_state = NULL;
}

static uint32_t be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* qemu sees the file in whole sectors: its length rounded up, the bytes
 * past the end reading as zeros.  Every check and read below uses that
 * view, so a VHD whose last sector is cut short opens as in qemu. */
static uint64_t sectors_length(struct vpc_state *s)
{
    uint64_t fsize = ic_image_size(s->file);
    return fsize / VPC_SECTOR * VPC_SECTOR + (fsize % VPC_SECTOR ? VPC_SECTOR : 0);
}

/* Where the footer is: a copy at 0 means a dynamic disk (qemu never looks
 * at the end of the file then), else a fixed disk's footer ends the file. */
static int load_footer(struct ic_image *img, struct vpc_state *s, struct ic_error *err)
{
    uint64_t fsize = sectors_length(s);
    uint8_t f[VPC_FOOTER_SIZE];
    if (fsize < VPC_FOOTER_SIZE)
        return ic_error_format(err, img->path, "file too small for a VHD footer "
                               "(%llu bytes)", (unsigned long long)fsize);
    if (ic_image_pread_padded(s->file, f, sizeof f, 0, err) < 0)
        return -1;
    if (vpc_footer_magic(f)) {
        s->dynamic_layout = 1;
        if (vpc_parse_footer(f, &s->footer, img->path, err) < 0)
            return -1;
        return vpc_check_type(s->footer.type, img->path, err);
    }
    if (ic_image_pread_padded(s->file, f, sizeof f, fsize - VPC_FOOTER_SIZE, err) < 0)
        return -1;
    if (!vpc_footer_magic(f))
        return ic_error_format(err, img->path, "invalid VPC image (no \"conectix\" footer at "
                               "offset 0 or at the end of the file)");
    if (vpc_parse_footer(f, &s->footer, img->path, err) < 0)
        return -1;
    if (s->footer.type != VPC_TYPE_FIXED) {
        if (vpc_check_type(s->footer.type, img->path, err) < 0)
            return -1;
        return ic_error_format(err, img->path, "invalid VPC image (a dynamic disk without "
                               "its footer copy at offset 0)");
    }
    return 0;
}

/* Entries [first, end) of the BAT, read from the file and checked: every
 * entry's block must lie inside the file (qemu refuses a truncated image);
 * only the entries the virtual size reaches are kept. */
static int check_entries(struct ic_image *img, struct vpc_state *s, uint64_t first,
                         uint64_t end, uint8_t *chunk, struct ic_error *err)
{
    const struct vpc_dyn_header *d = &s->dyn;
    uint64_t fsize = sectors_length(s);
    uint64_t block_span = (uint64_t)d->bitmap_size + d->block_size;
    for (uint64_t i = first; i < end;) {
        uint64_t n = end - i < BAT_CHUNK ? end - i : BAT_CHUNK;
        if (ic_image_pread_padded(s->file, chunk, (size_t)(n * 4), d->table_offset + i * 4,
                                  err) < 0)
            return -1;
        for (uint64_t j = 0; j < n; j++, i++) {
            uint32_t e = be32(chunk + j * 4);
            if (e != VPC_BAT_UNALLOCATED && (uint64_t)e * VPC_SECTOR + block_span > fsize)
                return ic_error_format(err, img->path, "VHD block %llu (sector %u) lies past "
                                       "the end of the file: the image is truncated",
                                       (unsigned long long)i, e);
            if (i < s->nblocks)
                s->bat[i] = e;
        }
    }
    return 0;
}

/* The BAT lies inside the file, but in a sparse file a header may size it
 * at 2 Gi entries of holes: only the parts the file holds as data are
 * read.  Entries in holes are zeros, each a block at sector 0 (not
 * unallocated: that is 0xffffffff), all checked at once. */
static int load_bat(struct ic_image *img, struct vpc_state *s, struct ic_error *err)
{
    const struct vpc_dyn_header *d = &s->dyn;
    uint64_t fsize = sectors_length(s);
    uint64_t entries = d->max_table_entries, bytes = entries * 4;
    if (d->table_offset > fsize || bytes > fsize - d->table_offset ||
        (d->table_offset + bytes + VPC_SECTOR - 1) / VPC_SECTOR * VPC_SECTOR > fsize)
        return ic_error_format(err, img->path, "VHD block allocation table (%llu entries at "
                               "offset %llu) runs past the end of the file",
                               (unsigned long long)entries,
                               (unsigned long long)d->table_offset);
    s->nblocks = (img->size + d->block_size - 1) / d->block_size;
    if (ic_image_take_meta_budget(img, s->nblocks * 4) < 0)
        return ic_error_format(err, img->path, "the VHD block allocation table needs more "
                               "than %u MiB of memory", IC_CHAIN_META_BUDGET >> 20);
    /* zeros: what entries in holes are */
    s->bat = calloc(s->nblocks ? s->nblocks : 1, 4);
    uint8_t *chunk = malloc(BAT_CHUNK * 4);
    int r = s->bat && chunk ? 0 : ic_error_nomem(err);
    uint64_t block_span = (uint64_t)d->bitmap_size + d->block_size;
    /* entries [0, done) are checked */
    for (uint64_t pos = 0, done = 0; r == 0 && pos < bytes;) {
        struct ic_extent x;
        r = ic_image_data_status(s->file, pos, d->table_offset + pos, bytes - pos, &x, err);
        if (r < 0)
            break;
        pos += x.length;
        if (!(x.flags & IC_EXT_ZERO)) {
            uint64_t end = (pos + 3) / 4;
            r = check_entries(img, s, done, end, chunk, err);
            done = end;
        } else if (pos / 4 > done) {
            if (block_span > fsize)
                r = ic_error_format(err, img->path, "VHD block %llu (sector 0) lies past the "
                                    "end of the file: the image is truncated",
                                    (unsigned long long)done);
            done = pos / 4;
        }
    }
    free(chunk);
    return r;
}

static int load(struct ic_image *img, struct vpc_state *s, struct ic_error *err)
{
    if (load_footer(img, s, err) < 0)
        return -1;
    img->size = s->footer.size;
    if (!s->dynamic_layout)
        return 0;
    /* a header cut by the end of the file reads as zeros there */
    uint64_t off = s->footer.data_offset;
    if (off >= sectors_length(s))
        return ic_error_format(err, img->path, "dynamic VHD header at offset %llu lies past "
                               "the end of the file", (unsigned long long)off);
    uint8_t h[VPC_DYN_HEADER_SIZE];
    if (ic_image_pread_padded(s->file, h, sizeof h, off, err) < 0 ||
        vpc_parse_dyn_header(h, img->size, &s->dyn, img->path, err) < 0)
        return -1;
    if (load_bat(img, s, err) < 0)
        return -1;
    /* A footer copy at 0 that says "fixed": qemu checks the dynamic
     * structures, then reads the file as a fixed disk (from offset 0, the
     * footer copy included) */
    if (s->footer.type == VPC_TYPE_FIXED) {
        free(s->bat);
        s->bat = NULL;
        s->nblocks = 0;
    }
    return 0;
}

static int vpc_open(struct ic_image *img, struct ic_error *err)
{
    struct vpc_state *s = calloc(1, sizeof *s);
    if (!s)
        return ic_error_nomem(err);
    s->file = img->file;
    img->drv_state = s;
    if (load(img, s, err) < 0) {
        vpc_close(img);
        return -1;
    }
    return 0;
}

/* ---- reads ------------------------------------------------------------ */

static int vpc_pread(struct ic_image *img, void *vbuf, size_t len, uint64_t off,
                     struct ic_error *err)
{
    struct vpc_state *s = state_of(img);
    uint8_t *buf = vbuf;
    /* a fixed disk is its file, zeros past its end (a footer claiming more
     * than the file holds) */
    if (s->footer.type == VPC_TYPE_FIXED)
        return ic_image_pread_padded(s->file, buf, len, off, err);
    uint64_t bs = s->dyn.block_size;
    /* the blocks a request spans lie anywhere in the file: read together */
    struct ic_read_batch data;
    ic_read_batch_init(&data);
    while (len > 0) {
        uint64_t block = off / bs, in = off % bs;
        size_t n = bs - in < len ? (size_t)(bs - in) : len;
        uint32_t e = block < s->nblocks ? s->bat[block] : VPC_BAT_UNALLOCATED;
        if (e == VPC_BAT_UNALLOCATED)
            memset(buf, 0, n);
        else if (ic_read_batch_add_padded(&data, s->file, buf, n,
                                          (uint64_t)e * VPC_SECTOR + s->dyn.bitmap_size + in,
                                          err) < 0)
            return -1;
        buf += n;
        off += n;
        len -= n;
    }
    return ic_read_batch_flush(&data, err);
}

/* ---- block status ----------------------------------------------------- */

/* A fixed disk is data at its own offsets; holes of the file read as zeros
 * (qemu's BDRV_BLOCK_RECURSE), and so does what lies past its end. */
static int status_fixed(struct vpc_state *s, uint64_t start, uint64_t end, uint64_t want,
                        struct ic_extent_list *out, struct ic_error *err)
{
    unsigned extra = 0;
    for (uint64_t pos = start; pos < end && (pos <= want || extra < IC_WALK_EXTRA_EXTENTS);) {
        struct ic_extent e;
        if (ic_image_data_status(s->file, pos, pos, end - pos, &e, err) < 0 ||
            ic_extent_list_add(out, &e, err) < 0)
            return -1;
        if (pos > want)
            extra++;
        pos += e.length;
    }
    return 0;
}

/* A dynamic disk: each allocated block is one data extent (its bitmap
 * keeps it from joining the next one on the host); runs of unallocated
 * blocks are zeros of this layer (no backing file). */
static int vpc_block_status(struct ic_image *img, uint64_t start, uint64_t end, uint64_t want,
                            struct ic_extent_list *out, struct ic_error *err)
{
    struct vpc_state *s = state_of(img);
    if (s->footer.type == VPC_TYPE_FIXED)
        return status_fixed(s, start, end, want, out, err);
    uint64_t bs = s->dyn.block_size;
    unsigned extra = 0;
    for (uint64_t pos = start; pos < end && (pos <= want || extra < IC_WALK_EXTRA_EXTENTS);) {
        uint64_t block = pos / bs;
        uint32_t e = block < s->nblocks ? s->bat[block] : VPC_BAT_UNALLOCATED;
        struct ic_extent x = {.start = pos};
        uint64_t run_end;
        if (e != VPC_BAT_UNALLOCATED) {
            run_end = (block + 1) * bs;
            x.flags = IC_EXT_DATA | IC_EXT_PRESENT | IC_EXT_OFFSET_VALID;
            x.host_offset = (uint64_t)e * VPC_SECTOR + s->dyn.bitmap_size + pos % bs;
        } else {
            uint64_t b = block + 1;
            while (b < s->nblocks && s->bat[b] == VPC_BAT_UNALLOCATED && b * bs < end)
                b++;
            run_end = b * bs;
            x.flags = IC_EXT_ZERO | IC_EXT_PRESENT;
        }
        if (run_end > end)
            run_end = end;
        x.length = run_end - pos;
        if (ic_extent_list_add(out, &x, err) < 0)
            return -1;
        if (pos > want)
            extra++;
        pos = run_end;
    }
    return 0;
}

static void vpc_describe(struct ic_image *img, struct ic_image_info *out)
{
    struct vpc_state *s = state_of(img);
    /* qemu-img info: a dynamic disk's block size is its cluster size; no
     * format-specific data */
    if (s->footer.type != VPC_TYPE_FIXED)
        out->cluster_size = s->dyn.block_size;
}

const struct ic_driver ic_format_vpc = {
    .name = "vpc",
    .kind = IC_FORMAT,
    .open = vpc_open,
    .close = vpc_close,
    .pread = vpc_pread,
    .block_status = vpc_block_status,
    .random_access_status = 1,
    .describe = vpc_describe,
};
