/* compare(a, b, *, strict=False, concurrency=4): qemu-img compare on two
 * open images, its outcome as a dict; a failure to read either image is
 * raised with what qemu-img would report as attributes of the exception
 * (compare_step: 3 block status, 4 read; compare_image: 0 or 1;
 * compare_offset: where). */
#include "glue.h"

static const char *const outcome_names[] = {
    [IC_COMPARE_IDENTICAL] = "identical", [IC_COMPARE_CONTENT] = "content",
    [IC_COMPARE_SIZE] = "size",           [IC_COMPARE_STATUS] = "status",
    [IC_COMPARE_FAILED] = "failed",
};

/* [(percent, in_tail), ...]: the reports qemu-img -p prints */
static PyObject *progress_list(const struct ic_compare_result *r)
{
    PyObject *list = PyList_New((Py_ssize_t)r->nprogress);
    for (size_t i = 0; list && i < r->nprogress; i++) {
        PyObject *item = Py_BuildValue("(dO)", (double)r->progress[i].percent,
                                       r->progress[i].in_tail ? Py_True : Py_False);
        if (!item)
            Py_CLEAR(list);
        else
            PyList_SET_ITEM(list, (Py_ssize_t)i, item);
    }
    return list;
}

static void annotate(const struct ic_compare_result *r)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (value) {
        PyObject *step = PyLong_FromLong(r->failed_step);
        PyObject *image = PyLong_FromLong(r->failed_image);
        PyObject *offset = PyLong_FromUnsignedLongLong(r->offset);
        PyObject *warned = PyBool_FromLong(r->warned);
        PyObject *progress = progress_list(r);
        if (step && image && offset && warned && progress) {
            /* a failure to set an attribute leaves the error as it is */
            if (PyObject_SetAttrString(value, "compare_step", step) < 0 ||
                PyObject_SetAttrString(value, "compare_image", image) < 0 ||
                PyObject_SetAttrString(value, "compare_offset", offset) < 0 ||
                PyObject_SetAttrString(value, "compare_warned", warned) < 0 ||
                PyObject_SetAttrString(value, "compare_progress", progress) < 0)
                PyErr_Clear();
        }
        Py_XDECREF(step);
        Py_XDECREF(image);
        Py_XDECREF(offset);
        Py_XDECREF(warned);
        Py_XDECREF(progress);
        PyErr_Clear(); /* only ours: the error fetched is restored below */
    }
    PyErr_Restore(type, value, tb);
}

PyObject *glue_compare(PyObject *m, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"a", "b", "strict", "concurrency", "progress", NULL};
    core_state *st = module_state(m);
    ImageObject *a, *b;
    struct ic_compare_options opt;
    ic_compare_options_init(&opt);
    int strict = 0, progress = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!O!|$pIp:compare", kwlist, st->image_type,
                                     &a, st->image_type, &b, &strict, &opt.concurrency,
                                     &progress))
        return NULL;
    opt.strict = strict;
    opt.progress = progress;
    struct ic_image *ia = image_usable(a), *ib = ia ? image_usable(b) : NULL;
    if (!ib)
        return NULL;
    struct ic_compare_result r = {0};
    struct ic_error err = {0};
    int ret;
    image_enter(a);
    image_enter(b);
    Py_BEGIN_ALLOW_THREADS
    ret = ic_compare(ia, ib, &opt, &r, &err);
    Py_END_ALLOW_THREADS
    image_leave(a);
    image_leave(b);
    if (ret < 0) {
        raise_error(st, &err);
        if (r.outcome == IC_COMPARE_FAILED)
            annotate(&r);
        ic_compare_result_free(&r);
        return NULL;
    }
    PyObject *reports = progress_list(&r);
    ic_compare_result_free(&r);
    if (!reports)
        return NULL;
    PyObject *dict = Py_BuildValue("{s:s,s:O,s:K,s:K,s:K,s:O,s:O,s:O,s:K,s:K,s:N}", "outcome",
                         outcome_names[r.outcome], "identical", r.identical ? Py_True : Py_False,
                         "offset", (unsigned long long)r.offset, "size_a",
                         (unsigned long long)r.size_a, "size_b", (unsigned long long)r.size_b,
                         "size_mismatch", r.size_mismatch ? Py_True : Py_False, "in_tail",
                         r.in_tail ? Py_True : Py_False, "warned", r.warned ? Py_True : Py_False,
                         "bytes_read_a", (unsigned long long)r.bytes_read_a, "bytes_read_b",
                         (unsigned long long)r.bytes_read_b, "progress", reports);
    return dict;
}
