/* How the core's blocking work runs from Python: the one place that
 * releases the GIL.  A call (calls.h) runs to its end; a job (job.h) is
 * watched in slices, reporting progress and answering Ctrl-C between them. */
#include <time.h>

#include "../job.h"
#include "glue.h"

/* Slices the calling thread waits in, with the GIL released: short enough
 * for Ctrl-C and progress to feel immediate. */
#define WAIT_SLICE_MS 100

int glue_run(core_state *st, struct glue_call *call)
{
    struct ic_error err = {0};
    int ret;
    Py_BEGIN_ALLOW_THREADS
    ret = glue_call_run(call, &err);
    Py_END_ALLOW_THREADS
    if (ret < 0)
        raise_error(st, &err);
    return ret < 0 ? -1 : 0;
}

int glue_report(PyObject *progress, uint64_t done, uint64_t total)
{
    if (progress == Py_None)
        return 0;
    PyObject *r = PyObject_CallFunction(progress, "KK", (unsigned long long)done,
                                        (unsigned long long)total);
    Py_XDECREF(r);
    return r ? 0 : -1;
}

int glue_watch(struct ic_job *job, PyObject *progress, int (*between)(void *ctx), void *ctx)
{
    int python_error = 0, done;
    for (;;) {
        Py_BEGIN_ALLOW_THREADS
        done = ic_job_wait(job, WAIT_SLICE_MS);
        Py_END_ALLOW_THREADS
        if (done)
            return python_error; /* the last report waits for the outcome */
        if (!python_error) {
            uint64_t now, total;
            ic_job_progress(job, &now, &total);
            python_error = (between && between(ctx) < 0) ||
                           glue_report(progress, now, total) < 0 || PyErr_CheckSignals() < 0;
        }
        if (python_error)
            ic_job_cancel(job);
    }
}

void glue_nap(void)
{
    Py_BEGIN_ALLOW_THREADS
    struct timespec nap = {0, 1000000};
    nanosleep(&nap, NULL);
    Py_END_ALLOW_THREADS
}
