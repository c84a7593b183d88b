/* The core's blocking calls as data: the Python glue (module.c,
 * image_type.c, checksum.c, ...) fills in a struct glue_call and runs it
 * through glue_run() (run.c, the one place the GIL is released), which
 * raises its error; the calls themselves need no Python.  Jobs (copy,
 * checksum, compare) are waited for by glue_watch() there. */
#ifndef IMGCOPY_GLUE_CALLS_H
#define IMGCOPY_GLUE_CALLS_H

#include "../imgcopy.h"

enum glue_op {
    GLUE_OPEN,
    GLUE_CREATE,
    GLUE_PROBE,
    GLUE_BLOCK_STATUS,
    GLUE_MAP,
    GLUE_READ,
    GLUE_WRITE,
    GLUE_ZERO,
    GLUE_FLUSH,
    GLUE_CHECKPOINT,
    GLUE_FINISH,
    GLUE_COPY_START,
    GLUE_COPY_FINISH,
    GLUE_CHECKSUM_START,
    GLUE_CHECKSUM_FINISH,
    GLUE_COMPARE_START,
    GLUE_COMPARE_FINISH,
    GLUE_CHECK,
    GLUE_FORMAT_MAP,
    GLUE_DIRTY_MAP,
    GLUE_FORMAT_DIRTY,
    GLUE_ADD_BITMAP,
    GLUE_COPY_BITMAP,
};

struct glue_call {
    enum glue_op op;
    /* what the call takes, as its core function names it */
    struct ic_image *img, *dst;
    const char *path, *format;
    const char *member; /* open, probe: a member of the tar archive at path, or NULL */
    uint64_t offset, length, end, size;
    unsigned flags; /* open, create and zero flags; finish: sync */
    void *buf;      /* read into / write from */
    const struct ic_create_options *create_options;
    const struct ic_copy_options *copy_options;
    const struct ic_checksum_options *checksum_options;
    const struct ic_compare_options *compare_options;
    const struct ic_extent *extents; /* format_map */
    size_t extent_count;
    /* format_map: NULL for JSON, else the file of each depth of the
     * chain, NUL-separated in `names_length` bytes */
    const char *names;
    size_t names_length;
    /* dirty_map, add_bitmap, copy_bitmap: the bitmap's name; format_dirty:
     * the file human output names (NULL: JSON) */
    const char *name;
    /* add_bitmap: its dirty ranges (granularity: `size`, flags: `flags`) */
    const struct ic_range *ranges;
    size_t nranges;
    /* what it gives */
    struct ic_image *image; /* open, create */
    int fresh;              /* create */
    const char *probed;     /* probe */
    struct ic_extent extent;
    struct ic_extent_list list;
    struct ic_copy *copy;
    struct ic_copy_stats stats;
    struct ic_checksum *checksum;
    char hex[IC_CHECKSUM_HEX_MAX]; /* checksum finish */
    struct ic_compare *compare;
    struct ic_compare_result compare_result;
    struct ic_check_result check_result;
    const char *opened; /* check: the image's format (a static name) */
    char *text; /* format_map: malloc'ed */
};

int glue_call_run(struct glue_call *c, struct ic_error *err);

#endif
