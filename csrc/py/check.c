/* imgcopy._core.check: qemu-img check of one image, read-only.  The image
 * is opened, checked and closed in one call of the core; the result is a
 * dict with qemu's names (snake_case) and the detail lines. */
#include "glue.h"

PyObject *mod_check(PyObject *m, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"path", "format", "force_share", "member", "external_files", NULL};
    struct path_arg path = {0};
    struct glue_call call = {.op = GLUE_CHECK};
    int force_share = 0, external = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O&|z$pzp:check", kwlist, path_converter, &path,
                                     &call.format, &force_share, &call.member, &external))
        return NULL;
    call.path = path.path;
    /* qemu-img check opens dirty and corrupt-flagged images (read-only);
     * `member`: the image is that member of the tar archive at path */
    call.flags = IC_OPEN_FORCE | (force_share ? IC_OPEN_FORCE_SHARE : 0) |
                 (external ? IC_OPEN_EXTERNAL_FILES : 0);
    int ret = glue_run(module_state(m), &call);
    Py_DECREF(path.bytes);
    if (ret < 0)
        return NULL;
    const struct ic_check_result *r = &call.check_result;
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
    ic_check_result_free(&call.check_result);
    return out;
}
