/* imgcopy._core.checksum(): blkhash checksums of open images, hashed by
 * the core's job while this thread watches it (run.c), reporting progress
 * and answering Ctrl-C. */
#include "../job.h"
#include "glue.h"

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
    struct glue_call call = {.op = GLUE_CHECKSUM_START, .img = img, .checksum_options = &opt};
    PyObject *digest = NULL;
    image_enter(image);
    if (glue_run(st, &call) == 0) {
        struct ic_job *job = ic_checksum_job(call.checksum);
        int python_error = glue_watch(job, progress, NULL, NULL);
        uint64_t done, total;
        ic_job_progress(job, &done, &total);
        struct ic_error err = {0};
        call.op = GLUE_CHECKSUM_FINISH;
        /* Python's error (already set) wins over the job's own; the last
         * report is (total, total), once the digest is known */
        int ret = python_error ? glue_call_run(&call, &err) : glue_run(st, &call);
        if (!python_error && ret == 0 && glue_report(progress, total, total) == 0 &&
            PyErr_CheckSignals() == 0)
            digest = PyUnicode_FromString(call.hex);
    }
    image_leave(image);
    return digest;
}
