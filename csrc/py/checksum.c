/* imgcopy._core.checksum(): blkhash checksums of open images, hashed by
 * the core's threads while this thread waits with the GIL released,
 * reporting progress and answering Ctrl-C. */
#include "glue.h"

#define WAIT_SLICE_MS 100

PyObject *mod_checksum_algorithms(PyObject *m, PyObject *unused)
{
    (void)unused;
    const char *names[64];
    struct ic_error err = {0};
    int n = ic_checksum_algorithms(names, 64, &err);
    if (n < 0) {
        raise_error(module_state(m), &err);
        return NULL;
    }
    if (n > 64)
        n = 64;
    PyObject *tuple = PyTuple_New(n);
    for (int i = 0; tuple && i < n; i++) {
        PyObject *name = PyUnicode_FromString(names[i]);
        if (!name)
            Py_CLEAR(tuple);
        else
            PyTuple_SET_ITEM(tuple, i, name);
    }
    return tuple;
}

/* checksum_check(algorithm, block_size): ValueError (or OSError ENOSYS)
 * unless a checksum can be made so; before a copy touches anything */
PyObject *mod_checksum_check(PyObject *m, PyObject *args)
{
    const char *algorithm;
    struct u64_arg block = {"checksum_check", "block_size", 0};
    struct ic_error err = {0};
    if (!PyArg_ParseTuple(args, "sO&:checksum_check", &algorithm, u64_converter, &block))
        return NULL;
    if (ic_checksum_check(algorithm, block.value, &err) < 0) {
        raise_error(module_state(m), &err);
        return NULL;
    }
    return Py_NewRef(Py_None);
}

/* progress(done, total), then Ctrl-C: 0, or -1 with Python's error set */
static int report(PyObject *progress, uint64_t done, uint64_t total)
{
    PyObject *r = progress == Py_None
                      ? Py_NewRef(Py_None)
                      : PyObject_CallFunction(progress, "KK", (unsigned long long)done,
                                              (unsigned long long)total);
    Py_XDECREF(r);
    return !r || PyErr_CheckSignals() < 0 ? -1 : 0;
}

/* Progress and Ctrl-C while the job runs; a Python error cancels it and
 * stays set: 1.  The last report, (total, total), waits for the outcome. */
static int watch(struct ic_checksum *job, PyObject *progress)
{
    int python_error = 0, done;
    for (;;) {
        Py_BEGIN_ALLOW_THREADS
        done = ic_checksum_wait(job, WAIT_SLICE_MS);
        Py_END_ALLOW_THREADS
        if (done)
            return python_error;
        if (!python_error) {
            uint64_t now, total;
            ic_checksum_progress(job, &now, &total);
            python_error = report(progress, now, total) < 0;
        }
        if (python_error)
            ic_checksum_cancel(job);
    }
}

PyObject *mod_checksum(PyObject *m, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"image", "algorithm", "block_size", "threads", "request_size",
                             "length", "progress", NULL};
    core_state *st = module_state(m);
    ImageObject *image;
    struct ic_checksum_options opt = {0};
    struct u64_arg block = {"checksum", "block_size", 0}, threads = {"checksum", "threads", 0},
                   request = {"checksum", "request_size", 0},
                   length = {"checksum", "length", 0};
    PyObject *progress = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!|z$O&O&O&O&O:checksum", kwlist,
                                     st->image_type, &image, &opt.algorithm, u64_converter,
                                     &block, u64_converter, &threads, u64_converter, &request,
                                     u64_converter, &length, &progress))
        return NULL;
    if (progress != Py_None && !PyCallable_Check(progress))
        return PyErr_Format(PyExc_TypeError, "checksum() argument 'progress' must be callable");
    if (threads.value > UINT_MAX)
        threads.value = UINT_MAX; /* refused as too many */
    opt.block_size = block.value;
    opt.threads = (unsigned)threads.value;
    opt.request_size = request.value;
    opt.length = length.value;
    struct ic_image *img = image_usable(image);
    if (!img)
        return NULL;
    struct ic_checksum *job = NULL;
    struct ic_error err = {0};
    char hex[IC_CHECKSUM_HEX_MAX];
    image_enter(image);
    int ret;
    Py_BEGIN_ALLOW_THREADS
    ret = ic_checksum_start(img, &opt, &job, &err);
    Py_END_ALLOW_THREADS
    if (ret == 0) {
        uint64_t now, total;
        int python_error = watch(job, progress);
        ic_checksum_progress(job, &now, &total); /* the job is freed by finish */
        Py_BEGIN_ALLOW_THREADS
        ret = ic_checksum_finish(job, hex, &err);
        Py_END_ALLOW_THREADS
        if (python_error)
            ret = -2; /* Python's error (set) wins */
        /* Every byte hashed: 100% is reported once, however short the job
         * was (it may end within the first wait slice), and an error there
         * still fails the call. */
        else if (ret == 0 && report(progress, total, total) < 0)
            ret = -2;
    }
    image_leave(image);
    if (ret == -1)
        raise_error(st, &err);
    return ret < 0 ? NULL : PyUnicode_FromString(hex);
}
