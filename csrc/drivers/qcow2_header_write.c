/* The header a writer writes: marked incomplete before its first change
 * reaches the file, complete when finish() has written everything it
 * names. */
#include "qcow2_state.h"

static struct qcow2_state *state(struct ic_image *img)
{
    return qcow2_state_of(img);
}

int qcow2_write_header(struct ic_image *img, int complete, struct ic_error *err)
{
    struct qcow2_state *s = state(img);
    struct qcow2_writer *w = s->w;
    uint8_t h[QCOW2_HEADER_MAX];
    size_t len;
    if (w->existing && !w->resumed) {
        qcow2_patch_header(w->header, &s->h, complete, h, &len);
    } else {
        /* the bitmaps the last finish() stored, named by a complete header */
        struct qcow2_header q = s->h;
        q.has_bitmaps = w->bitmaps_stored;
        q.nb_bitmaps = (uint32_t)w->nnew_bitmaps;
        q.bitmap_directory_size = w->bitmap_dir_bytes;
        q.bitmap_directory_offset = w->bitmap_dir_off;
        qcow2_encode_header(&q, complete, h, &len);
        /* what a longer header before it left (an extension) becomes zeros */
        if (len < w->header_written)
            len = w->header_written;
        w->header_written = len;
    }
    if (ic_image_pwrite(s->file, h, len, 0, err) < 0)
        return -1;
    /* the auto-clear bits are cleared (we keep no bitmap up to date): the
     * image's bitmaps, if any, are stale from now on (those a writer
     * stores are listed when the image is opened again) */
    w->bitmaps_dropped = 1;
    return 0;
}

int qcow2_mark_written_locked(struct ic_image *img, struct ic_error *err)
{
    struct qcow2_state *s = state(img);
    if (s->w->marked)
        return 0;
    if (qcow2_write_header(img, 0, err) < 0)
        return -1;
    s->w->marked = 1;
    return 1;
}
