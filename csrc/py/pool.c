/* imgcopy._core.Pool(threads, budget=0): a pool of worker threads and a
 * budget of bytes in flight that several copies share (job.h): a fleet's
 * copies run on one pool, so their threads and memory have one bound. */
#include "glue.h"
#include "job.h"

static PyObject *pool_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"threads", "budget", NULL};
    unsigned threads = 0;
    unsigned long long budget = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "I|K:Pool", kwlist, &threads, &budget))
        return NULL;
    PoolObject *self = (PoolObject *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
    struct ic_error err = {0};
    int r;
    Py_BEGIN_ALLOW_THREADS /* threads start */
    r = ic_pool_new(threads, budget, &self->pool, &err);
    Py_END_ALLOW_THREADS
    if (r < 0) {
        Py_DECREF(self);
        raise_error(type_state(type), &err);
        return NULL;
    }
    return (PyObject *)self;
}

static void pool_dealloc(PyObject *obj)
{
    PoolObject *self = (PoolObject *)obj;
    PyTypeObject *type = Py_TYPE(obj);
    if (self->pool) {
        Py_BEGIN_ALLOW_THREADS /* its threads are joined */
        ic_pool_free(self->pool);
        Py_END_ALLOW_THREADS
    }
    type->tp_free(obj);
    Py_DECREF(type);
}

static PyObject *pool_threads(PyObject *obj, void *closure)
{
    (void)closure;
    return PyLong_FromUnsignedLong(ic_pool_threads(((PoolObject *)obj)->pool));
}

static PyObject *pool_budget(PyObject *obj, void *closure)
{
    (void)closure;
    return PyLong_FromUnsignedLongLong(ic_pool_budget(((PoolObject *)obj)->pool));
}

static PyGetSetDef pool_getset[] = {
    {"threads", pool_threads, NULL, "worker threads", NULL},
    {"budget", pool_budget, NULL, "bytes in flight its copies may hold (0: no bound)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot pool_slots[] = {
    {Py_tp_new, pool_new},
    {Py_tp_dealloc, pool_dealloc},
    {Py_tp_getset, pool_getset},
    {Py_tp_doc, "Pool(threads, budget=0): worker threads and a budget of bytes in flight "
                "that copies share (copy(pool=...))"},
    {0, NULL},
};

PyType_Spec pool_type_spec = {
    .name = "imgcopy._core.Pool",
    .basicsize = sizeof(PoolObject),
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = pool_slots,
};
