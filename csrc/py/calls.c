/* The core's blocking calls, run from their description (calls.h). */
#include <stdlib.h>

#include "calls.h"

static int format_map_human(struct glue_call *c, struct ic_error *err)
{
    size_t count = 1;
    for (size_t i = 0; i < c->names_length; i++)
        count += c->names[i] == '\0';
    const char **names = malloc(count * sizeof *names);
    if (!names)
        return ic_error_nomem(err);
    names[0] = c->names;
    for (size_t i = 0, n = 1; i < c->names_length; i++)
        if (c->names[i] == '\0')
            names[n++] = c->names + i + 1;
    c->text = ic_format_map_human(c->extents, c->extent_count, c->offset, c->end, names, count,
                                  err);
    free(names);
    return c->text ? 0 : -1;
}

/* qemu-img check opens, checks and closes the image in one call */
static int check_image(struct glue_call *c, struct ic_error *err)
{
    struct ic_image *img;
    if (ic_image_open_member(c->path, c->member, c->format, c->flags, &img, err) < 0)
        return -1;
    c->opened = ic_image_format(img);
    int ret = ic_image_check(img, &c->check_result, err);
    ic_image_close(img);
    return ret;
}

int glue_call_run(struct glue_call *c, struct ic_error *err)
{
    switch (c->op) {
    case GLUE_OPEN:
        return ic_image_open_member(c->path, c->member, c->format, c->flags, &c->image, err);
    case GLUE_CREATE:
        return ic_image_create(c->path, c->format, c->size, c->flags, c->create_options,
                               &c->image, &c->fresh, err);
    case GLUE_PROBE:
        return ic_image_probe_member(c->path, c->member, &c->probed, err);
    case GLUE_BLOCK_STATUS:
        return ic_image_block_status(c->img, c->offset, c->length, &c->extent, err);
    case GLUE_MAP:
        return ic_image_map(c->img, c->offset, c->end, &c->list, err);
    case GLUE_READ:
        return ic_image_pread(c->img, c->buf, (size_t)c->length, c->offset, err);
    case GLUE_WRITE:
        return ic_image_pwrite(c->img, c->buf, (size_t)c->length, c->offset, err);
    case GLUE_ZERO:
        return ic_image_zero(c->img, c->offset, c->length, c->flags, err);
    case GLUE_FLUSH:
        return ic_image_flush(c->img, err);
    case GLUE_CHECKPOINT:
        return ic_image_checkpoint(c->img, err);
    case GLUE_FINISH:
        return ic_image_finish(c->img, (int)c->flags, err);
    case GLUE_COPY_START:
        return ic_copy_start(c->img, c->dst, c->copy_options, &c->copy, err);
    case GLUE_COPY_FINISH:
        return ic_copy_finish(c->copy, &c->stats, err);
    case GLUE_CHECKSUM_START:
        return ic_checksum_start(c->img, c->checksum_options, &c->checksum, err);
    case GLUE_CHECKSUM_FINISH:
        return ic_checksum_finish(c->checksum, c->hex, err);
    case GLUE_COMPARE_START:
        return ic_compare_start(c->img, c->dst, c->compare_options, &c->compare, err);
    case GLUE_COMPARE_FINISH:
        return ic_compare_finish(c->compare, &c->compare_result, err);
    case GLUE_CHECK:
        return check_image(c, err);
    case GLUE_DIRTY_MAP:
        return ic_image_dirty_map(c->img, c->name, c->offset, c->length, &c->list, err);
    case GLUE_ADD_BITMAP:
        return ic_image_add_bitmap(c->img, c->name, c->size, c->flags, c->ranges, c->nranges,
                                   err);
    case GLUE_COPY_BITMAP:
        /* into c->img, from c->dst: the other image of the call */
        return ic_image_copy_bitmap(c->img, c->dst, c->name, err);
    case GLUE_FORMAT_DIRTY:
        c->text = c->name ? ic_format_dirty_human(c->extents, c->extent_count, c->name, err)
                          : ic_format_dirty_json(c->extents, c->extent_count, c->offset, err);
        return c->text ? 0 : -1;
    case GLUE_FORMAT_MAP:
        if (c->names)
            return format_map_human(c, err);
        c->text = ic_format_map_json(c->extents, c->extent_count, c->offset, c->end, err);
        return c->text ? 0 : -1;
    }
    return ic_error_value(err, "unknown call %d", (int)c->op);
}
