/* compare(a, b, *, strict=False, concurrency=4): qemu-img compare on two
 * open images, its outcome as a dict; a failure to read either image is
 * raised with what qemu-img would report as attributes of the exception
 * (compare_step: 3 block status, 4 read; compare_image: 0 or 1;
 * compare_offset: where). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "../job.h"
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

/* Reports the comparison's threads make final, kept (under their lock)
 * until the watching thread hands them to on_progress between slices. */
struct reports {
    pthread_mutex_t lock;
    struct ic_compare_progress *pending;
    size_t npending, cap;
    int lost; /* no memory for one: on_progress is told no more */
    PyObject *on_progress;
};

/* From the comparison's threads: keep a report for the watching one. */
static void keep_report(void *ctx, const struct ic_compare_progress *p)
{
    struct reports *j = ctx;
    pthread_mutex_lock(&j->lock);
    if (j->npending == j->cap && !j->lost) {
        size_t cap = j->cap ? 2 * j->cap : 64;
        struct ic_compare_progress *n = realloc(j->pending, cap * sizeof *n);
        if (n) {
            j->pending = n;
            j->cap = cap;
        } else {
            j->lost = 1;
        }
    }
    if (!j->lost)
        j->pending[j->npending++] = *p;
    pthread_mutex_unlock(&j->lock);
}

/* Hand the reports kept so far to on_progress(percent, in_tail); -1 when
 * it raised. */
static int deliver(void *ctx)
{
    struct reports *j = ctx;
    if (j->on_progress == Py_None)
        return 0;
    pthread_mutex_lock(&j->lock);
    size_t n = j->npending;
    struct ic_compare_progress *batch = n ? malloc(n * sizeof *batch) : NULL;
    if (batch)
        memcpy(batch, j->pending, n * sizeof *batch);
    j->npending = 0;
    pthread_mutex_unlock(&j->lock);
    if (n && !batch) {
        PyErr_NoMemory();
        return -1;
    }
    int ret = 0;
    for (size_t i = 0; i < n && ret == 0; i++) {
        PyObject *r = PyObject_CallFunction(j->on_progress, "dO", (double)batch[i].percent,
                                            batch[i].in_tail ? Py_True : Py_False);
        ret = r ? 0 : -1;
        Py_XDECREF(r);
    }
    free(batch);
    return ret;
}

/* Start, watch and finish the comparison: 0 with call->compare_result
 * (ret says how it went), -1 when a Python error is set. */
static int run_compare(core_state *st, struct glue_call *call, struct reports *reports,
                       int *ret, struct ic_error *err)
{
    if (glue_run(st, call) < 0)
        return -1;
    struct ic_job *job = ic_compare_job(call->compare);
    int python_error = job ? glue_watch(job, Py_None, deliver, reports) : 0;
    call->op = GLUE_COMPARE_FINISH;
    *ret = glue_call_run(call, err);
    if (!python_error && deliver(reports) < 0)
        python_error = 1;
    return python_error ? -1 : 0;
}

PyObject *glue_compare(PyObject *m, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"a", "b", "strict", "concurrency", "progress", "on_progress", NULL};
    core_state *st = module_state(m);
    ImageObject *a, *b;
    struct ic_compare_options opt;
    ic_compare_options_init(&opt);
    int strict = 0, progress = 0;
    PyObject *on_progress = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!O!|$pIpO:compare", kwlist, st->image_type,
                                     &a, st->image_type, &b, &strict, &opt.concurrency,
                                     &progress, &on_progress))
        return NULL;
    if (on_progress != Py_None && !PyCallable_Check(on_progress))
        return PyErr_Format(PyExc_TypeError, "compare() argument 'on_progress' must be callable");
    opt.strict = strict;
    opt.progress = progress;
    struct ic_image *ia = image_usable(a), *ib = ia ? image_usable(b) : NULL;
    if (!ib)
        return NULL;
    struct reports kept = {.on_progress = on_progress};
    if (on_progress != Py_None) {
        opt.progress = 1;
        opt.report = keep_report;
        opt.report_ctx = &kept;
    }
    pthread_mutex_init(&kept.lock, NULL);
    struct glue_call call = {.op = GLUE_COMPARE_START, .img = ia, .dst = ib,
                             .compare_options = &opt};
    struct ic_error err = {0};
    int ret = 0;
    image_enter(a);
    image_enter(b);
    int python_error = run_compare(st, &call, &kept, &ret, &err);
    image_leave(a);
    image_leave(b);
    pthread_mutex_destroy(&kept.lock);
    free(kept.pending);
    struct ic_compare_result r = call.compare_result;
    if (python_error) {
        ic_compare_result_free(&r);
        return NULL;
    }
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
