/* imgcopy._core.Journal(path, *, source, destination, size, options,
 * algorithm=None, block_size=1): a copy's journal (journal.h), opened or
 * created with the copy's identity, handed to copy(journal=...): it
 * records what the copy makes durable; .done the ranges an earlier run
 * recorded (packed (offset, length) pairs), complete() removes it. */
#include "digest.h"
#include "glue.h"
#include "journal.h"

static PyObject *journal_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"path", "source", "destination", "size", "options", "algorithm",
                             "block_size", NULL};
    struct path_arg path = {0};
    const char *source = NULL, *destination = NULL, *options = NULL, *algorithm = NULL;
    unsigned long long size = 0, block_size = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O&|$ssKszK:Journal", kwlist, path_converter,
                                     &path, &source, &destination, &size, &options,
                                     &algorithm, &block_size))
        return NULL;
    core_state *st = type_state(type);
    struct ic_error err = {0};
    struct ic_journal_identity id = {.source = source, .destination = destination,
                                     .size = size, .options = options, .algorithm = algorithm,
                                     .block_size = block_size};
    JournalObject *self = NULL;
    if (algorithm) {
        const struct ic_digest *d = ic_digest_lookup(algorithm, &err);
        if (!d) {
            raise_error(st, &err);
            goto out;
        }
        id.digest_size = ic_digest_size(d);
    }
    if (!(self = (JournalObject *)type->tp_alloc(type, 0)))
        goto out;
    if (!(self->path = PyUnicode_DecodeFSDefault(path.path))) {
        Py_CLEAR(self);
        goto out;
    }
    int r;
    Py_BEGIN_ALLOW_THREADS /* reads the whole journal, or makes it durable */
    r = ic_journal_open(path.path, &id, &self->journal, &err);
    Py_END_ALLOW_THREADS
    if (r < 0) {
        Py_CLEAR(self);
        raise_error(st, &err);
    }
out:
    Py_XDECREF(path.bytes);
    return (PyObject *)self;
}

static void journal_dealloc(PyObject *obj)
{
    JournalObject *self = (JournalObject *)obj;
    PyTypeObject *type = Py_TYPE(obj);
    ic_journal_close(self->journal); /* kept: the next run resumes */
    Py_XDECREF(self->path);
    type->tp_free(obj);
    Py_DECREF(type);
}

struct ic_journal *journal_usable(JournalObject *self)
{
    if (!self->journal) {
        PyErr_Format(PyExc_ValueError, "journal %R is closed", self->path);
        return NULL;
    }
    if (self->busy) {
        PyErr_Format(PyExc_RuntimeError, "journal %R records another copy", self->path);
        return NULL;
    }
    return self->journal;
}

static PyObject *journal_close(PyObject *obj, PyObject *unused)
{
    (void)unused;
    JournalObject *self = (JournalObject *)obj;
    if (self->busy)
        return PyErr_Format(PyExc_RuntimeError, "journal %R records a copy", self->path);
    ic_journal_close(self->journal);
    self->journal = NULL;
    Py_RETURN_NONE;
}

static PyObject *journal_complete(PyObject *obj, PyObject *unused)
{
    (void)unused;
    JournalObject *self = (JournalObject *)obj;
    if (!journal_usable(self))
        return NULL;
    struct ic_error err = {0};
    int r;
    struct ic_journal *j = self->journal;
    self->journal = NULL; /* freed whatever happens */
    Py_BEGIN_ALLOW_THREADS /* unlink and fsync the directory */
    r = ic_journal_complete(j, &err);
    Py_END_ALLOW_THREADS
    if (r < 0) {
        raise_error(type_state(Py_TYPE(obj)), &err);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *journal_resumed(PyObject *obj, void *closure)
{
    (void)closure;
    JournalObject *self = (JournalObject *)obj;
    if (!journal_usable(self))
        return NULL;
    return PyBool_FromLong(ic_journal_resumed(self->journal));
}

static PyObject *journal_done(PyObject *obj, void *closure)
{
    (void)closure;
    JournalObject *self = (JournalObject *)obj;
    if (!journal_usable(self))
        return NULL;
    size_t n = 0;
    const struct ic_range *r = ic_journal_done(self->journal, &n);
    return PyBytes_FromStringAndSize(n ? (const char *)r : "",
                                     (Py_ssize_t)(n * sizeof *r));
}

static PyObject *journal_closed(PyObject *obj, void *closure)
{
    (void)closure;
    return PyBool_FromLong(((JournalObject *)obj)->journal == NULL);
}

static PyMethodDef journal_methods[] = {
    {"close", journal_close, METH_NOARGS, "close, keeping the file (the next run resumes)"},
    {"complete", journal_complete, METH_NOARGS,
     "the copy completed: remove the journal (durably)"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef journal_getset[] = {
    {"resumed", journal_resumed, NULL, "the journal existed: an earlier run's", NULL},
    {"done", journal_done, NULL,
     "the ranges recorded done, packed (offset, length) pairs of native uint64", NULL},
    {"closed", journal_closed, NULL, "closed or completed", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot journal_slots[] = {
    {Py_tp_new, journal_new},
    {Py_tp_dealloc, journal_dealloc},
    {Py_tp_methods, journal_methods},
    {Py_tp_getset, journal_getset},
    {Py_tp_doc, "Journal(path, *, source, destination, size, options, algorithm=None, "
                "block_size=1): a copy's journal, for copy(journal=...)"},
    {0, NULL},
};

PyType_Spec journal_type_spec = {
    .name = "imgcopy._core.Journal",
    .basicsize = sizeof(JournalObject),
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = journal_slots,
};
