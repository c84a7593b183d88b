/* imgcopy._core: the only file that knows about Python.  It converts
 * arguments, releases the GIL around the core's work and turns struct
 * ic_error into Python exceptions. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <string.h>
#include <time.h>

#include "../imgcopy.h"

/* CPython 3.9 (the oldest supported) lacks these 3.10 conveniences. */
#if PY_VERSION_HEX < 0x030A0000
static inline PyObject *Py_NewRef(PyObject *obj)
{
    Py_INCREF(obj);
    return obj;
}

static int PyModule_AddObjectRef(PyObject *module, const char *name, PyObject *value)
{
    Py_INCREF(value);
    if (PyModule_AddObject(module, name, value) < 0) {
        Py_DECREF(value);
        return -1;
    }
    return 0;
}
#endif

static PyObject *Error;
static PyObject *ImageFormatError;
static PyObject *UnsupportedOperation;

static PyObject *OSErrorFactory; /* imgcopy.errors.os_error */

static const char *remedy_code(enum ic_remedy remedy)
{
    switch (remedy) {
    case IC_REMEDY_AS_RAW:
        return "as_raw";
    case IC_REMEDY_FORCE:
        return "force";
    case IC_REMEDY_FORCE_SHARE:
        return "force_share";
    case IC_REMEDY_NONE:
        break;
    }
    return NULL;
}

static PyObject *raise_error(const struct ic_error *err)
{
    switch (err->kind) {
    case IC_ERR_OS: {
        const char *what = strerror(err->errnum);
        PyObject *reason = err->msg[0] ? PyUnicode_FromFormat("%s (%s)", what, err->msg)
                                       : PyUnicode_FromString(what);
        PyObject *path = err->path[0] ? PyUnicode_DecodeFSDefault(err->path) : Py_NewRef(Py_None);
        PyObject *exc = reason && path
                            ? PyObject_CallFunction(OSErrorFactory, "iOOz", err->errnum, reason,
                                                    path, remedy_code(err->remedy))
                            : NULL;
        if (exc) {
            PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
            Py_DECREF(exc);
        }
        Py_XDECREF(reason);
        Py_XDECREF(path);
        return NULL;
    }
    case IC_ERR_FORMAT: {
        const char *remedy = remedy_code(err->remedy);
        PyObject *path = err->path[0] ? PyUnicode_DecodeFSDefault(err->path)
                                      : Py_NewRef(Py_None);
        PyObject *exc = path ? PyObject_CallFunction(ImageFormatError, "sOz", err->msg, path,
                                                     remedy)
                             : NULL;
        Py_XDECREF(path);
        if (exc) {
            PyErr_SetObject(ImageFormatError, exc);
            Py_DECREF(exc);
        }
        return NULL;
    }
    case IC_ERR_NOMEM:
        return PyErr_NoMemory();
    case IC_ERR_READONLY:
        PyErr_Format(UnsupportedOperation, "%s: %s", err->path, err->msg);
        return NULL;
    case IC_ERR_VALUE:
        PyErr_SetString(PyExc_ValueError, err->msg);
        return NULL;
    case IC_ERR_NONE:
        break;
    }
    PyErr_SetString(Error, err->msg[0] ? err->msg : "unknown error");
    return NULL;
}

/* ---- Image ------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    struct ic_image *img;
    int busy;          /* calls running with the GIL released */
    int close_pending; /* close() came while busy: the last call closes */
    int closing;       /* close() waits for the calls in flight */
    int finished;      /* finish() succeeded: a new image is complete */
} ImageObject;

static void image_release(ImageObject *self)
{
    if (self->img) {
        ic_image_close(self->img);
        self->img = NULL;
    }
}

/* Every method starts with this: a closed image is a ValueError, as for
 * Python file objects. */
static struct ic_image *usable(ImageObject *self)
{
    if (!self->img || self->close_pending || self->closing) {
        PyErr_SetString(PyExc_ValueError, "I/O operation on closed image");
        return NULL;
    }
    return self->img;
}

static void enter(ImageObject *self)
{
    self->busy++;
}

static void leave(ImageObject *self)
{
    if (--self->busy == 0 && self->close_pending)
        image_release(self);
}

/* Run fn(img) with the GIL released; None or the error. */
static PyObject *call_unlocked(ImageObject *self, int (*fn)(struct ic_image *, struct ic_error *))
{
    struct ic_image *img = usable(self);
    if (!img)
        return NULL;
    struct ic_error err = {0};
    int ret;
    enter(self);
    Py_BEGIN_ALLOW_THREADS
    ret = fn(img, &err);
    Py_END_ALLOW_THREADS
    leave(self);
    if (ret < 0)
        return raise_error(&err);
    Py_RETURN_NONE;
}

static int parse_u64(PyObject *obj, const char *what, uint64_t *out)
{
    if (!PyLong_Check(obj) && !PyIndex_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s must be an integer", what);
        return -1;
    }
    PyObject *idx = PyNumber_Index(obj);
    if (!idx)
        return -1;
    int overflow;
    long long sv = PyLong_AsLongLongAndOverflow(idx, &overflow);
    if (overflow < 0 || (overflow == 0 && sv < 0)) {
        Py_DECREF(idx);
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_ValueError, "%s must not be negative", what);
        return -1;
    }
    unsigned long long v = PyLong_AsUnsignedLongLong(idx);
    Py_DECREF(idx);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s is too large", what);
        return -1;
    }
    *out = v;
    return 0;
}

/* (offset, length)-style arguments: two non-negative integers. */
static int parse_pair(PyObject *args, const char *n1, uint64_t *a, const char *n2, uint64_t *b)
{
    PyObject *x, *y;
    if (!PyArg_ParseTuple(args, "OO", &x, &y) || parse_u64(x, n1, a) < 0 ||
        parse_u64(y, n2, b) < 0)
        return -1;
    return 0;
}

/* Paths arrive through PyUnicode_FSConverter, which refuses embedded NULs. */
static int image_init(ImageObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"path", "format", "writable", "direct", "force", "force_share",
                             "source", NULL};
    PyObject *path_bytes = NULL;
    const char *format = NULL;
    int writable = 0, direct = 0, force = 0, force_share = 0, source = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O&|zppppp", kwlist, PyUnicode_FSConverter,
                                     &path_bytes, &format, &writable, &direct, &force,
                                     &force_share, &source))
        return -1;
    if (self->img) {
        Py_DECREF(path_bytes);
        PyErr_SetString(PyExc_RuntimeError, "Image is already open");
        return -1;
    }
    const char *path = PyBytes_AS_STRING(path_bytes);
    struct ic_error err = {0};
    struct ic_image *img = NULL;
    int ret;
    Py_BEGIN_ALLOW_THREADS
    ret = ic_image_open(path, format,
                        (writable ? IC_OPEN_RDWR : 0) | (direct ? IC_OPEN_DIRECT : 0) |
                            (force ? IC_OPEN_FORCE : 0) |
                            (force_share ? IC_OPEN_FORCE_SHARE : 0) |
                            (source ? IC_OPEN_SOURCE : 0),
                        &img, &err);
    Py_END_ALLOW_THREADS
    Py_DECREF(path_bytes);
    if (ret < 0) {
        raise_error(&err);
        return -1;
    }
    self->img = img;
    return 0;
}

static void image_dealloc(ImageObject *self)
{
    image_release(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int do_finish(struct ic_image *img, struct ic_error *err)
{
    return ic_image_finish(img, 1, err);
}

static int do_finish_nosync(struct ic_image *img, struct ic_error *err)
{
    return ic_image_finish(img, 0, err);
}

/* Writes what the format holds in memory and marks the image complete. */
static PyObject *image_finish(ImageObject *self, PyObject *args)
{
    int sync = 1;
    if (!PyArg_ParseTuple(args, "|p", &sync))
        return NULL;
    PyObject *r = call_unlocked(self, sync ? do_finish : do_finish_nosync);
    self->finished = r != NULL;
    return r;
}

static PyObject *get_finished(ImageObject *self, void *c)
{
    (void)c;
    return PyBool_FromLong(self->finished);
}

/* close(finish=False): with finish, what the format holds in memory is
 * written first and the image marked complete; without, an image
 * abandoned half-written stays marked incomplete.  Calls still running in
 * other threads end first (new ones fail as on a closed image): finishing
 * under a write in flight would leave a healthy image marked incomplete.
 * A read-only image closed from inside one of its own calls (a copy's
 * progress callback) is released by that call when it ends. */
static PyObject *image_close(ImageObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"finish", NULL};
    int finish = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|p", kwlist, &finish))
        return NULL;
    if (!self->img || self->close_pending || self->closing)
        Py_RETURN_NONE;
    if (self->busy && !ic_image_writable(self->img)) {
        self->close_pending = 1;
        Py_RETURN_NONE;
    }
    self->closing = 1;
    while (self->busy) {
        Py_BEGIN_ALLOW_THREADS
        struct timespec nap = {0, 1000000};
        nanosleep(&nap, NULL);
        Py_END_ALLOW_THREADS
    }
    struct ic_error err = {0};
    int ret = 0;
    if (finish) {
        struct ic_image *img = self->img;
        Py_BEGIN_ALLOW_THREADS
        ret = ic_image_finish(img, 0, &err);
        Py_END_ALLOW_THREADS
    }
    image_release(self);
    self->closing = 0;
    if (ret < 0)
        return raise_error(&err);
    Py_RETURN_NONE;
}

static PyObject *get_closed(ImageObject *self, void *c)
{
    (void)c;
    return PyBool_FromLong(!self->img || self->close_pending || self->closing);
}

static PyObject *get_size(ImageObject *self, void *c)
{
    (void)c;
    struct ic_image *img = usable(self);
    return img ? PyLong_FromUnsignedLongLong(ic_image_size(img)) : NULL;
}

static PyObject *get_format(ImageObject *self, void *c)
{
    (void)c;
    struct ic_image *img = usable(self);
    return img ? PyUnicode_FromString(ic_image_format(img)) : NULL;
}

static PyObject *get_writable(ImageObject *self, void *c)
{
    (void)c;
    struct ic_image *img = usable(self);
    return img ? PyBool_FromLong(ic_image_writable(img)) : NULL;
}

static PyObject *extent_tuple(const struct ic_extent *e)
{
    PyObject *host = (e->flags & IC_EXT_OFFSET_VALID)
                         ? PyLong_FromUnsignedLongLong(e->host_offset)
                         : Py_NewRef(Py_None);
    if (!host)
        return NULL;
    return Py_BuildValue("(KKINNNNN)", (unsigned long long)e->start,
                         (unsigned long long)e->length, (unsigned)e->depth,
                         PyBool_FromLong(e->flags & IC_EXT_PRESENT),
                         PyBool_FromLong(e->flags & IC_EXT_ZERO),
                         PyBool_FromLong(e->flags & IC_EXT_DATA), host,
                         PyBool_FromLong(e->flags & IC_EXT_COMPRESSED));
}

static PyObject *image_block_status(ImageObject *self, PyObject *args)
{
    uint64_t off, len;
    if (parse_pair(args, "offset", &off, "length", &len) < 0)
        return NULL;
    struct ic_image *img = usable(self);
    if (!img)
        return NULL;
    struct ic_error err = {0};
    struct ic_extent e;
    int ret;
    enter(self);
    Py_BEGIN_ALLOW_THREADS
    ret = ic_image_block_status(img, off, len, &e, &err);
    Py_END_ALLOW_THREADS
    leave(self);
    return ret < 0 ? raise_error(&err) : extent_tuple(&e);
}

/* Extents travel to Python packed, as struct ic_extent: an ExtentMap of a
 * million extents stays one bytes object until someone looks inside. */
static PyObject *image_map(ImageObject *self, PyObject *args)
{
    uint64_t start, end;
    if (parse_pair(args, "start", &start, "end", &end) < 0)
        return NULL;
    struct ic_image *img = usable(self);
    if (!img)
        return NULL;
    struct ic_error err = {0};
    struct ic_extent_list list = {0};
    int ret;
    enter(self);
    Py_BEGIN_ALLOW_THREADS
    ret = ic_image_map(img, start, end, &list, &err);
    Py_END_ALLOW_THREADS
    leave(self);
    PyObject *res = ret < 0 ? raise_error(&err)
                            : PyBytes_FromStringAndSize((const char *)list.items,
                                                        (Py_ssize_t)(list.count * sizeof *list.items));
    ic_extent_list_free(&list);
    return res;
}

static PyObject *image_read(ImageObject *self, PyObject *args)
{
    uint64_t off, len;
    if (parse_pair(args, "offset", &off, "length", &len) < 0)
        return NULL;
    struct ic_image *img = usable(self);
    if (!img)
        return NULL;
    if (off > ic_image_size(img) || len > ic_image_size(img) - off)
        return PyErr_Format(PyExc_ValueError, "read of %llu bytes at %llu is outside the image "
                            "(size %llu)", (unsigned long long)len, (unsigned long long)off,
                            (unsigned long long)ic_image_size(img));
    if (len > PY_SSIZE_T_MAX)
        return PyErr_NoMemory();
    PyObject *buf = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)len);
    if (!buf)
        return NULL;
    struct ic_error err = {0};
    int ret;
    enter(self);
    Py_BEGIN_ALLOW_THREADS
    ret = ic_image_pread(img, PyBytes_AS_STRING(buf), (size_t)len, off, &err);
    Py_END_ALLOW_THREADS
    leave(self);
    if (ret < 0) {
        Py_DECREF(buf);
        return raise_error(&err);
    }
    return buf;
}

static PyObject *image_write(ImageObject *self, PyObject *args)
{
    PyObject *o_off;
    Py_buffer data;
    uint64_t off;
    if (!PyArg_ParseTuple(args, "Oy*", &o_off, &data))
        return NULL;
    if (parse_u64(o_off, "offset", &off) < 0) {
        PyBuffer_Release(&data);
        return NULL;
    }
    struct ic_image *img = usable(self);
    if (!img) {
        PyBuffer_Release(&data);
        return NULL;
    }
    struct ic_error err = {0};
    int ret;
    enter(self);
    Py_BEGIN_ALLOW_THREADS
    ret = ic_image_pwrite(img, data.buf, (size_t)data.len, off, &err);
    Py_END_ALLOW_THREADS
    leave(self);
    PyBuffer_Release(&data);
    if (ret < 0)
        return raise_error(&err);
    Py_RETURN_NONE;
}

static PyObject *image_zero(ImageObject *self, PyObject *args)
{
    PyObject *o_off, *o_len;
    uint64_t off, len;
    unsigned flags = 0;
    if (!PyArg_ParseTuple(args, "OO|I", &o_off, &o_len, &flags) ||
        parse_u64(o_off, "offset", &off) < 0 || parse_u64(o_len, "length", &len) < 0)
        return NULL;
    struct ic_image *img = usable(self);
    if (!img)
        return NULL;
    struct ic_error err = {0};
    int ret;
    enter(self);
    Py_BEGIN_ALLOW_THREADS
    ret = ic_image_zero(img, off, len, flags, &err);
    Py_END_ALLOW_THREADS
    leave(self);
    if (ret < 0)
        return raise_error(&err);
    Py_RETURN_NONE;
}

static int do_flush(struct ic_image *img, struct ic_error *err)
{
    return ic_image_flush(img, err);
}

static PyObject *image_flush(ImageObject *self, PyObject *unused)
{
    (void)unused;
    return call_unlocked(self, do_flush);
}

static PyObject *image_cache_stats(ImageObject *self, PyObject *unused)
{
    (void)unused;
    struct ic_image *img = usable(self);
    if (!img)
        return NULL;
    struct ic_cache_stats st;
    ic_image_cache_stats(img, &st);
    return Py_BuildValue("{sKsKsKsK}", "hits", (unsigned long long)st.hits, "misses",
                         (unsigned long long)st.misses, "lseek_calls",
                         (unsigned long long)st.lseek_calls, "intervals",
                         (unsigned long long)st.intervals);
}

/* [(path, format), ...] from this image down its backing chain */
static PyObject *image_chain(ImageObject *self, PyObject *unused)
{
    (void)unused;
    struct ic_image *img = usable(self);
    if (!img)
        return NULL;
    PyObject *list = PyList_New(0);
    for (; list && img; img = ic_image_backing(img)) {
        PyObject *item = Py_BuildValue("(O&s)", PyUnicode_DecodeFSDefault, ic_image_path(img),
                                       ic_image_format(img));
        if (!item || PyList_Append(list, item) < 0) {
            Py_XDECREF(item);
            Py_CLEAR(list);
            break;
        }
        Py_DECREF(item);
    }
    return list;
}

/* [(id, name, vm_state_size, date_sec, date_nsec, vm_clock_nsec, icount)]:
 * the internal snapshots; id and name are bytes, as stored */
static PyObject *image_snapshots(ImageObject *self, PyObject *unused)
{
    (void)unused;
    struct ic_image *img = usable(self);
    if (!img)
        return NULL;
    const struct ic_snapshot *sn;
    size_t n;
    ic_image_snapshots(img, &sn, &n);
    PyObject *list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; list && i < n; i++) {
        PyObject *item = Py_BuildValue("(yyKIIKL)", sn[i].id, sn[i].name,
                                       (unsigned long long)sn[i].vm_state_size, sn[i].date_sec,
                                       sn[i].date_nsec, (unsigned long long)sn[i].vm_clock_nsec,
                                       (long long)sn[i].icount);
        if (!item) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, item);
    }
    return list;
}

/* reads_file(path) -> the file of the chain `path` names, or None */
static PyObject *image_reads_file(ImageObject *self, PyObject *arg)
{
    struct ic_image *img = usable(self);
    PyObject *path_bytes = NULL;
    if (!img || !PyUnicode_FSConverter(arg, &path_bytes))
        return NULL;
    const char *found = ic_image_reads_file(img, PyBytes_AS_STRING(path_bytes));
    Py_DECREF(path_bytes);
    return found ? PyUnicode_DecodeFSDefault(found) : Py_NewRef(Py_None);
}

static PyObject *image_drop_cache(ImageObject *self, PyObject *unused)
{
    (void)unused;
    struct ic_image *img = usable(self);
    if (!img)
        return NULL;
    ic_image_drop_cache(img);
    Py_RETURN_NONE;
}

static PyMethodDef image_methods[] = {
    {"close", (PyCFunction)(void (*)(void))image_close, METH_VARARGS | METH_KEYWORDS,
     "close(finish=False): close the image (idempotent) once calls in flight end; finish "
     "first writes held metadata and marks the image complete"},
    {"finish", (PyCFunction)image_finish, METH_VARARGS,
     "finish(sync=True): write held metadata and mark a new image complete"},
    {"block_status", (PyCFunction)image_block_status, METH_VARARGS,
     "block_status(offset, length) -> (start, length, depth, present, zero, data, offset, "
     "compressed)"},
    {"map", (PyCFunction)image_map, METH_VARARGS,
     "map(start, end) -> bytes of packed extents (struct ic_extent)"},
    {"read", (PyCFunction)image_read, METH_VARARGS, "read(offset, length) -> bytes"},
    {"write", (PyCFunction)image_write, METH_VARARGS, "write(offset, data)"},
    {"zero", (PyCFunction)image_zero, METH_VARARGS, "zero(offset, length, flags=0)"},
    {"flush", (PyCFunction)image_flush, METH_NOARGS, "flush()"},
    {"cache_stats", (PyCFunction)image_cache_stats, METH_NOARGS, "cache counters"},
    {"drop_cache", (PyCFunction)image_drop_cache, METH_NOARGS, "forget all cached extents"},
    {"reads_file", (PyCFunction)image_reads_file, METH_O,
     "reads_file(path) -> the file of this image's chain that path names, or None"},
    {"snapshots", (PyCFunction)image_snapshots, METH_NOARGS,
     "snapshots() -> [(id, name, vm_state_size, date_sec, date_nsec, vm_clock_nsec, icount)]"},
    {"chain", (PyCFunction)image_chain, METH_NOARGS,
     "chain() -> [(path, format)] from this image down its backing chain"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef image_getset[] = {
    {"size", (getter)get_size, NULL, "virtual size in bytes", NULL},
    {"format", (getter)get_format, NULL, "format name", NULL},
    {"writable", (getter)get_writable, NULL, "opened for writing", NULL},
    {"closed", (getter)get_closed, NULL, "True after close()", NULL},
    {"finished", (getter)get_finished, NULL, "True once finish() succeeded", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject ImageType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "imgcopy._core.Image",
    .tp_basicsize = sizeof(ImageObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "Image(path, format=None, writable=False): an open disk image",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)image_init,
    .tp_dealloc = (destructor)image_dealloc,
    .tp_methods = image_methods,
    .tp_getset = image_getset,
};

/* create(path, format, size, direct=False, writeback=False, cluster_size=0,
 *        compat_v2=False, prealloc_metadata=False, compress=False) -> (Image, fresh) */
static PyObject *mod_create(PyObject *m, PyObject *args, PyObject *kwds)
{
    (void)m;
    static char *kwlist[] = {"path", "format", "size", "direct", "writeback", "cluster_size",
                             "compat_v2", "prealloc_metadata", "compress", "backing_file",
                             "backing_format", "atomic", NULL};
    PyObject *path_bytes = NULL, *o_size, *o_cluster = NULL;
    const char *format = NULL;
    int direct = 0, writeback = 0, atomic = 0;
    struct ic_create_options copts = {0};
    uint64_t size;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O&zO|ppOpppzzp", kwlist, PyUnicode_FSConverter,
                                     &path_bytes, &format, &o_size, &direct, &writeback,
                                     &o_cluster, &copts.compat_v2, &copts.prealloc_metadata,
                                     &copts.compress, &copts.backing_file,
                                     &copts.backing_format, &atomic))
        return NULL;
    if (parse_u64(o_size, "size", &size) < 0 ||
        (o_cluster && parse_u64(o_cluster, "cluster_size", &copts.cluster_size) < 0)) {
        Py_DECREF(path_bytes);
        return NULL;
    }
    const char *path = PyBytes_AS_STRING(path_bytes);
    unsigned flags = (direct ? IC_OPEN_DIRECT : 0) | (writeback ? IC_OPEN_WRITEBACK : 0) |
                     (atomic ? IC_CREATE_ATOMIC : 0);
    struct ic_error err = {0};
    struct ic_image *img = NULL;
    int fresh = 0, ret;
    Py_BEGIN_ALLOW_THREADS
    ret = ic_image_create(path, format, size, flags, &copts, &img, &fresh, &err);
    Py_END_ALLOW_THREADS
    Py_DECREF(path_bytes);
    if (ret < 0)
        return raise_error(&err);
    ImageObject *obj = (ImageObject *)ImageType.tp_alloc(&ImageType, 0);
    if (!obj) {
        ic_image_close(img);
        return NULL;
    }
    obj->img = img;
    return Py_BuildValue("(NN)", (PyObject *)obj, PyBool_FromLong(fresh));
}

/* probe(path) -> the format name the file looks like */
static PyObject *mod_probe(PyObject *m, PyObject *arg)
{
    (void)m;
    PyObject *path_bytes = NULL;
    if (!PyUnicode_FSConverter(arg, &path_bytes))
        return NULL;
    const char *path = PyBytes_AS_STRING(path_bytes);
    struct ic_error err = {0};
    const char *format = NULL;
    int ret;
    Py_BEGIN_ALLOW_THREADS
    ret = ic_image_probe(path, &format, &err);
    Py_END_ALLOW_THREADS
    Py_DECREF(path_bytes);
    return ret < 0 ? raise_error(&err) : PyUnicode_FromString(format);
}

static PyObject *stats_dict(const struct ic_copy_stats *st)
{
    return Py_BuildValue("{sKsKsKsKsKsKsKsK}", "bytes_read", (unsigned long long)st->bytes_read,
                         "bytes_written", (unsigned long long)st->bytes_written, "bytes_zeroed",
                         (unsigned long long)st->bytes_zeroed, "bytes_skipped",
                         (unsigned long long)st->bytes_skipped, "read_requests",
                         (unsigned long long)st->read_requests, "write_requests",
                         (unsigned long long)st->write_requests, "zero_requests",
                         (unsigned long long)st->zero_requests, "extents",
                         (unsigned long long)st->extents);
}

/* Slices the calling thread waits in, with the GIL released: short enough
 * for Ctrl-C and progress to feel immediate. */
#define WAIT_SLICE_MS 100

/* copy(src, dst, sparse_threshold, request_size, concurrency, out_of_order,
 *      target_is_zero, offload, flush, progress) -> dict of counters */
static PyObject *mod_copy(PyObject *m, PyObject *args, PyObject *kwds)
{
    (void)m;
    static char *kwlist[] = {"src", "dst", "sparse_threshold", "request_size", "concurrency",
                             "out_of_order", "target_is_zero", "offload", "flush", "progress",
                             "log", NULL};
    ImageObject *src, *dst;
    PyObject *o_thr, *o_req, *progress = Py_None;
    unsigned concurrency;
    int out_of_order, target_is_zero, offload, flush, want_log = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!O!OOIppppO|p", kwlist, &ImageType, &src,
                                     &ImageType, &dst, &o_thr, &o_req, &concurrency,
                                     &out_of_order, &target_is_zero, &offload, &flush, &progress,
                                     &want_log))
        return NULL;
    struct ic_copy_options opt = {
        .concurrency = concurrency,
        .out_of_order = out_of_order,
        .target_is_zero = target_is_zero,
        .offload = offload,
        .flush = flush,
    };
    if (parse_u64(o_thr, "sparse_threshold", &opt.sparse_threshold) < 0 ||
        parse_u64(o_req, "request_size", &opt.request_size) < 0)
        return NULL;
    struct ic_image *s_img = usable(src), *d_img = s_img ? usable(dst) : NULL;
    if (!s_img || !d_img)
        return NULL;
    if (src == dst)
        return PyErr_Format(PyExc_ValueError, "source and destination are the same image");
    if (want_log && !(opt.log = ic_request_log_new()))
        return PyErr_NoMemory();

    struct ic_error err = {0};
    struct ic_copy *c = NULL;
    int ret;
    enter(src);
    enter(dst);
    Py_BEGIN_ALLOW_THREADS
    ret = ic_copy_start(s_img, d_img, &opt, &c, &err);
    Py_END_ALLOW_THREADS
    if (ret < 0) {
        leave(src);
        leave(dst);
        ic_request_log_free(opt.log);
        return raise_error(&err);
    }
    /* Python errors raised while waiting (the progress callback, Ctrl-C)
     * cancel the copy and win over its own error. */
    int python_error = 0, done = 0;
    struct ic_copy_stats st;
    while (!done) {
        Py_BEGIN_ALLOW_THREADS
        done = ic_copy_wait(c, WAIT_SLICE_MS);
        Py_END_ALLOW_THREADS
        if (done)
            break; /* the last report waits for the outcome */
        if (!python_error && progress != Py_None) {
            ic_copy_progress(c, &st);
            PyObject *r = PyObject_CallFunction(progress, "KK", (unsigned long long)st.done,
                                                (unsigned long long)st.total);
            if (!r)
                python_error = 1;
            Py_XDECREF(r);
        }
        if (!python_error && PyErr_CheckSignals() < 0)
            python_error = 1;
        if (python_error)
            ic_copy_cancel(c);
    }
    Py_BEGIN_ALLOW_THREADS
    ret = ic_copy_finish(c, &st, &err);
    Py_END_ALLOW_THREADS
    leave(src);
    leave(dst);
    /* Every byte is written, nothing committed yet (the caller finishes
     * the destination when this returns): the 100% report and Ctrl-C can
     * still cancel the copy, however short it was. */
    if (ret == 0 && !python_error && progress != Py_None) {
        PyObject *r = PyObject_CallFunction(progress, "KK", (unsigned long long)st.done,
                                            (unsigned long long)st.total);
        python_error = r == NULL;
        Py_XDECREF(r);
    }
    if (ret == 0 && !python_error && PyErr_CheckSignals() < 0)
        python_error = 1;
    PyObject *res = NULL;
    if (python_error)
        res = NULL;
    else if (ret < 0)
        raise_error(&err);
    else if (!opt.log)
        res = stats_dict(&st);
    else {
        /* (counters, packed struct ic_request array sorted by offset) */
        size_t n;
        const struct ic_request *reqs = ic_request_log_sorted(opt.log, &n);
        PyObject *packed = PyBytes_FromStringAndSize((const char *)reqs,
                                                     (Py_ssize_t)(n * sizeof *reqs));
        PyObject *d = stats_dict(&st);
        if (packed && d)
            res = PyTuple_Pack(2, d, packed);
        Py_XDECREF(packed);
        Py_XDECREF(d);
    }
    ic_request_log_free(opt.log);
    return res;
}

/* ---- packed extent helpers --------------------------------------------- */

static int packed_extents(Py_buffer *buf, const struct ic_extent **ext, size_t *n)
{
    if (buf->len % (Py_ssize_t)sizeof(struct ic_extent)) {
        PyErr_SetString(PyExc_ValueError, "packed extents have the wrong length");
        return -1;
    }
    *ext = buf->buf;
    *n = (size_t)buf->len / sizeof(struct ic_extent);
    return 0;
}

static PyObject *format_map(PyObject *args, int json)
{
    Py_buffer buf;
    unsigned long long start, tail_end;
    PyObject *names_obj = NULL;
    int ok = json ? PyArg_ParseTuple(args, "y*KK", &buf, &start, &tail_end)
                  : PyArg_ParseTuple(args, "y*KKO", &buf, &start, &tail_end, &names_obj);
    if (!ok)
        return NULL;
    const struct ic_extent *ext;
    size_t n;
    if (packed_extents(&buf, &ext, &n) < 0) {
        PyBuffer_Release(&buf);
        return NULL;
    }
    /* the file name of each depth of the chain */
    PyObject *seq = NULL;
    const char **names = NULL;
    Py_ssize_t nnames = 0;
    if (!json) {
        seq = PySequence_Fast(names_obj, "names must be a sequence of str");
        if (!seq) {
            PyBuffer_Release(&buf);
            return NULL;
        }
        nnames = PySequence_Fast_GET_SIZE(seq);
        names = PyMem_Calloc((size_t)nnames + 1, sizeof *names);
        for (Py_ssize_t i = 0; names && i < nnames; i++) {
            names[i] = PyUnicode_AsUTF8(PySequence_Fast_GET_ITEM(seq, i));
            if (!names[i]) {
                PyMem_Free(names);
                Py_DECREF(seq);
                PyBuffer_Release(&buf);
                return NULL;
            }
        }
        if (!names) {
            Py_DECREF(seq);
            PyBuffer_Release(&buf);
            return PyErr_NoMemory();
        }
    }
    struct ic_error err = {0};
    char *s;
    Py_BEGIN_ALLOW_THREADS
    s = json ? ic_format_map_json(ext, n, start, tail_end, &err)
             : ic_format_map_human(ext, n, start, tail_end, names, (size_t)nnames, &err);
    Py_END_ALLOW_THREADS
    PyMem_Free(names);
    Py_XDECREF(seq);
    PyBuffer_Release(&buf);
    if (!s)
        return raise_error(&err);
    PyObject *res = PyUnicode_FromString(s);
    free(s);
    return res;
}

static PyObject *mod_format_map_json(PyObject *m, PyObject *args)
{
    (void)m;
    return format_map(args, 1);
}

static PyObject *mod_format_map_human(PyObject *m, PyObject *args)
{
    (void)m;
    return format_map(args, 0);
}

static PyObject *mod_extent_at(PyObject *m, PyObject *args)
{
    (void)m;
    Py_buffer buf;
    Py_ssize_t i;
    if (!PyArg_ParseTuple(args, "y*n", &buf, &i))
        return NULL;
    const struct ic_extent *ext;
    size_t n;
    PyObject *res = NULL;
    if (packed_extents(&buf, &ext, &n) == 0) {
        if (i < 0 || (size_t)i >= n)
            PyErr_SetString(PyExc_IndexError, "extent index out of range");
        else
            res = extent_tuple(&ext[i]);
    }
    PyBuffer_Release(&buf);
    return res;
}

/* (data_bytes, zero_bytes, present_bytes, compressed_bytes) */
static PyObject *mod_extent_totals(PyObject *m, PyObject *args)
{
    (void)m;
    Py_buffer buf;
    if (!PyArg_ParseTuple(args, "y*", &buf))
        return NULL;
    const struct ic_extent *ext;
    size_t n;
    if (packed_extents(&buf, &ext, &n) < 0) {
        PyBuffer_Release(&buf);
        return NULL;
    }
    unsigned long long data = 0, zero = 0, present = 0, compressed = 0;
    for (size_t i = 0; i < n; i++) {
        if (ext[i].flags & IC_EXT_DATA)
            data += ext[i].length;
        if (ext[i].flags & IC_EXT_ZERO)
            zero += ext[i].length;
        if (ext[i].flags & IC_EXT_PRESENT)
            present += ext[i].length;
        if (ext[i].flags & IC_EXT_COMPRESSED)
            compressed += ext[i].length;
    }
    PyBuffer_Release(&buf);
    return Py_BuildValue("(KKKK)", data, zero, present, compressed);
}

static PyMethodDef module_methods[] = {
    {"probe", mod_probe, METH_O,
     "probe(path) -> the format the file looks like ('raw' when nothing else matches)"},
    {"create", (PyCFunction)(void (*)(void))mod_create, METH_VARARGS | METH_KEYWORDS,
     "create(path, format, size, direct=False, writeback=False, cluster_size=0, compat_v2=False, "
     "prealloc_metadata=False, compress=False, backing_file=None, backing_format=None, "
     "atomic=False) -> (Image, fresh)"},
    {"copy", (PyCFunction)(void (*)(void))mod_copy, METH_VARARGS | METH_KEYWORDS,
     "copy(src, dst, sparse_threshold, request_size, concurrency, out_of_order, "
     "target_is_zero, offload, flush, progress) -> dict"},
    {"format_map_json", mod_format_map_json, METH_VARARGS,
     "format_map_json(packed, start, tail_end) -> str, as qemu-img map --output=json"},
    {"format_map_human", mod_format_map_human, METH_VARARGS,
     "format_map_human(packed, start, tail_end, names) -> str, as qemu-img map; names[d] "
     "is the file of depth d"},
    {"extent_at", mod_extent_at, METH_VARARGS, "extent_at(packed, i) -> tuple"},
    {"extent_totals", mod_extent_totals, METH_VARARGS,
     "extent_totals(packed) -> (data, zero, present, compressed) bytes"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, .m_name = "imgcopy._core",
    .m_doc = "imgcopy's C core", .m_size = -1, .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__core(void)
{
    PyObject *m = PyModule_Create(&moduledef);
    if (!m)
        return NULL;
    PyObject *io = PyImport_ImportModule("io");
    if (!io)
        goto fail;
    UnsupportedOperation = PyObject_GetAttrString(io, "UnsupportedOperation");
    Py_DECREF(io);
    if (!UnsupportedOperation)
        goto fail;
    /* the exceptions are Python classes (imgcopy/errors.py): they spell
     * remedies for the API and the CLI */
    PyObject *errors = PyImport_ImportModule("imgcopy.errors");
    if (!errors)
        goto fail;
    Error = PyObject_GetAttrString(errors, "Error");
    ImageFormatError = PyObject_GetAttrString(errors, "ImageFormatError");
    OSErrorFactory = PyObject_GetAttrString(errors, "os_error");
    Py_DECREF(errors);
    if (!Error || !ImageFormatError || !OSErrorFactory)
        goto fail;
    if (PyType_Ready(&ImageType) < 0)
        goto fail;
    if (PyModule_AddObjectRef(m, "Image", (PyObject *)&ImageType) < 0 ||
        PyModule_AddObjectRef(m, "Error", Error) < 0 ||
        PyModule_AddObjectRef(m, "ImageFormatError", ImageFormatError) < 0 ||
        PyModule_AddIntConstant(m, "ZERO_MAY_UNMAP", IC_ZERO_MAY_UNMAP) < 0 ||
        PyModule_AddIntConstant(m, "ZERO_FAST", IC_ZERO_FAST) < 0 ||
        PyModule_AddIntConstant(m, "EXTENT_SIZE", (long)sizeof(struct ic_extent)) < 0 ||
        PyModule_AddIntConstant(m, "REQUEST_SIZE", (long)sizeof(struct ic_request)) < 0 ||
        PyModule_AddIntConstant(m, "REQ_WRITE", IC_REQ_WRITE) < 0 ||
        PyModule_AddIntConstant(m, "REQ_ZERO", IC_REQ_ZERO) < 0 ||
        PyModule_AddIntConstant(m, "REQ_SKIP", IC_REQ_SKIP) < 0)
        goto fail;
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
