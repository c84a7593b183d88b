/* imgcopy._core.check: qemu-img check of one image, read-only.  The image
 * is opened, checked and closed with the GIL released; the result is a
 * dict with qemu's names (snake_case) and the detail lines. */
#include "glue.h"

struct check_call {
    const char *path, *format;
    unsigned flags;
    const char *opened; /* the image's format (a static name) */
    struct ic_check_result result;
};

static int check_run(struct check_call *c, struct ic_error *err)
{
    struct ic_image *img;
    if (ic_image_open(c->path, c->format, c->flags, &img, err) < 0)
        return -1;
    c->opened = ic_image_format(img);
    int ret = ic_image_check(img, &c->result, err);
    ic_image_close(img);
    return ret;
}

PyObject *mod_check(PyObject *m, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"path", "format", "force_share", NULL};
    struct path_arg path = {0};
    struct check_call call = {0};
    int force_share = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O&|z$p:check", kwlist, path_converter, &path,
                                     &call.format, &force_share))
        return NULL;
    call.path = path.path;
    /* qemu-img check opens dirty and corrupt-flagged images (read-only) */
    call.flags = IC_OPEN_FORCE | (force_share ? IC_OPEN_FORCE_SHARE : 0);
    struct ic_error err = {0};
    int ret;
    Py_BEGIN_ALLOW_THREADS
    ret = check_run(&call, &err);
    Py_END_ALLOW_THREADS
    Py_DECREF(path.bytes);
    if (ret < 0) {
        raise_error(module_state(m), &err);
        return NULL;
    }
    const struct ic_check_result *r = &call.result;
    PyObject *out = Py_BuildValue(
        "{sKsKsKsKsKsKsKsKsKsKsisy#ss}", "corruptions", (unsigned long long)r->corruptions,
        "leaks", (unsigned long long)r->leaks, "check_errors",
        (unsigned long long)r->check_errors, "corruptions_fixed",
        (unsigned long long)r->corruptions_fixed, "leaks_fixed",
        (unsigned long long)r->leaks_fixed, "image_end_offset",
        (unsigned long long)r->image_end_offset, "total_clusters",
        (unsigned long long)r->total_clusters, "allocated_clusters",
        (unsigned long long)r->allocated_clusters, "fragmented_clusters",
        (unsigned long long)r->fragmented_clusters, "compressed_clusters",
        (unsigned long long)r->compressed_clusters, "failed_errno", r->failed_errno,
        "messages", r->messages ? r->messages : "", (Py_ssize_t)r->messages_len, "format", call.opened);
    ic_check_result_free(&call.result);
    return out;
}
