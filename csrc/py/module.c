/* imgcopy._core: the only file that knows about Python.  It converts
 * arguments (options are keywords), runs the core's calls with the GIL
 * released (calls.h) and turns struct ic_error into Python exceptions.
 * Its state (exception classes, the Image type) is the module's. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <limits.h>
#include <string.h>
#include <time.h>

#include "calls.h"

/* CPython 3.9 (the oldest supported) lacks these 3.10 functions. */
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

typedef struct {
    PyTypeObject *image_type;
    PyObject *error;                 /* imgcopy.errors.Error */
    PyObject *image_format_error;    /* imgcopy.errors.ImageFormatError */
    PyObject *os_error_factory;      /* imgcopy.errors.os_error */
    PyObject *unsupported_operation; /* io.UnsupportedOperation */
} core_state;

static core_state *module_state(PyObject *module)
{
    return PyModule_GetState(module);
}

/* Image is final: its type's module is the one that made it. */
static core_state *type_state(PyTypeObject *type)
{
    return PyType_GetModuleState(type);
}

/* ---- errors ------------------------------------------------------------- */

/* How imgcopy/errors.py names a remedy (None: there is none). */
static const char *const remedy_codes[] = {
    [IC_REMEDY_NONE] = NULL,
    [IC_REMEDY_AS_RAW] = "as_raw",
    [IC_REMEDY_FORCE] = "force",
    [IC_REMEDY_FORCE_SHARE] = "force_share",
};

/* The exception a factory of imgcopy.errors made becomes the current one. */
static void raise_made(PyObject *exc)
{
    if (exc) {
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
        Py_DECREF(exc);
    }
}

static void raise_error(core_state *st, const struct ic_error *err)
{
    PyObject *path = NULL, *reason = NULL;
    if (err->kind == IC_ERR_OS || err->kind == IC_ERR_FORMAT)
        path = err->path[0] ? PyUnicode_DecodeFSDefault(err->path) : Py_NewRef(Py_None);
    switch (err->kind) {
    case IC_ERR_OS:
        reason = err->msg[0] ? PyUnicode_FromFormat("%s (%s)", strerror(err->errnum), err->msg)
                             : PyUnicode_FromString(strerror(err->errnum));
        if (reason && path)
            raise_made(PyObject_CallFunction(st->os_error_factory, "iOOz", err->errnum, reason,
                                             path, remedy_codes[err->remedy]));
        break;
    case IC_ERR_FORMAT:
        if (path)
            raise_made(PyObject_CallFunction(st->image_format_error, "sOz", err->msg, path,
                                             remedy_codes[err->remedy]));
        break;
    case IC_ERR_NOMEM:
        PyErr_NoMemory();
        break;
    case IC_ERR_READONLY:
        PyErr_Format(st->unsupported_operation, "%s: %s", err->path, err->msg);
        break;
    case IC_ERR_VALUE:
        PyErr_SetString(PyExc_ValueError, err->msg);
        break;
    case IC_ERR_NONE:
        PyErr_SetString(st->error, err->msg[0] ? err->msg : "unknown error");
        break;
    }
    Py_XDECREF(reason);
    Py_XDECREF(path);
}

/* Every blocking call of the core goes through here: run with the GIL
 * released, its failure raised (-1). */
static int run(core_state *st, struct glue_call *call)
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

/* ---- argument converters (PyArg_Parse* "O&") ---------------------------- */

/* A non-negative integer argument, named with its function in errors. */
struct u64_arg {
    const char *function;
    const char *name;
    uint64_t value;
};

static int u64_converter(PyObject *obj, void *target)
{
    struct u64_arg *arg = target;
    /* a bool is an int to Python, but never a size or an offset */
    PyObject *index = PyBool_Check(obj) || !PyIndex_Check(obj) ? NULL : PyNumber_Index(obj);
    if (!index) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_TypeError, "%s() argument '%s' must be an int, not %.100s",
                         arg->function, arg->name, Py_TYPE(obj)->tp_name);
        return 0;
    }
    int overflow;
    long long as_signed = PyLong_AsLongLongAndOverflow(index, &overflow);
    unsigned long long value =
        overflow > 0 ? PyLong_AsUnsignedLongLong(index) : (unsigned long long)as_signed;
    Py_DECREF(index);
    const char *problem = overflow < 0 || (!overflow && as_signed < 0) ? "must not be negative"
                          : PyErr_Occurred()           ? "is too large"
                                                       : NULL;
    if (problem) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s() argument '%s' %s", arg->function, arg->name,
                     problem);
        return 0;
    }
    arg->value = value;
    return 1;
}

/* A path (str, bytes, os.PathLike) as the file system spells it; no NULs. */
struct path_arg {
    PyObject *bytes;
    const char *path;
};

static int path_converter(PyObject *obj, void *target)
{
    struct path_arg *arg = target;
    if (!obj) { /* a later argument failed */
        Py_CLEAR(arg->bytes);
        return 1;
    }
    if (!PyUnicode_FSConverter(obj, &arg->bytes))
        return 0;
    arg->path = PyBytes_AS_STRING(arg->bytes);
    return Py_CLEANUP_SUPPORTED;
}

/* Packed extents (a struct ic_extent array) in a bytes-like object. */
struct packed_arg {
    Py_buffer buf;
    const struct ic_extent *extents;
    size_t count;
};

static int packed_converter(PyObject *obj, void *target)
{
    struct packed_arg *arg = target;
    if (!obj) {
        PyBuffer_Release(&arg->buf);
        return 1;
    }
    if (PyObject_GetBuffer(obj, &arg->buf, PyBUF_SIMPLE) < 0)
        return 0;
    if (arg->buf.len % (Py_ssize_t)sizeof(struct ic_extent)) {
        PyBuffer_Release(&arg->buf);
        PyErr_SetString(PyExc_ValueError, "packed extents have the wrong length");
        return 0;
    }
    arg->extents = arg->buf.buf;
    arg->count = (size_t)arg->buf.len / sizeof(struct ic_extent);
    return Py_CLEANUP_SUPPORTED;
}

/* ---- the core's structs as keywords and dicts (ic_field tables) -------- */

static int set_field(const struct ic_field *f, void *target, PyObject *value,
                     const char *function)
{
    char *at = (char *)target + f->offset;
    struct u64_arg number = {function, f->name, 0};
    struct ic_error err = {0};
    int truth;
    switch (f->kind) {
    case IC_FIELD_U64:
    case IC_FIELD_UNSIGNED:
        if (!u64_converter(value, &number))
            return -1;
        if (f->kind == IC_FIELD_U64)
            *(uint64_t *)at = number.value;
        else /* too many stays too many, never wraps round to a valid count */
            *(unsigned *)at = number.value > UINT_MAX ? UINT_MAX : (unsigned)number.value;
        return 0;
    case IC_FIELD_FLAG:
        if ((truth = PyObject_IsTrue(value)) < 0)
            return -1;
        *(int *)at = truth;
        return 0;
    case IC_FIELD_TEXT:
    case IC_FIELD_CHOICE:
        break;
    }
    const char *text = NULL;
    if (value != Py_None && !PyUnicode_Check(value)) {
        PyErr_Format(PyExc_TypeError, "%s() argument '%s' must be str or None, not %.100s",
                     function, f->name, Py_TYPE(value)->tp_name);
        return -1;
    }
    if (value != Py_None && !(text = PyUnicode_AsUTF8(value)))
        return -1;
    if (f->kind == IC_FIELD_TEXT)
        *(const char **)at = text; /* the caller's keywords keep it alive */
    else if (text && f->choose(target, text, &err) < 0) {
        PyErr_SetString(PyExc_ValueError, err.msg);
        return -1;
    }
    return 0;
}

/* The keywords `fields` names, set in the struct at `target` (the others
 * keep what it holds); returns a new dict of the other keywords, for
 * PyArg_ParseTupleAndKeywords, or NULL. */
static PyObject *take_fields(PyObject *kwds, const struct ic_field *fields, void *target,
                             const char *function)
{
    PyObject *rest = kwds ? PyDict_Copy(kwds) : PyDict_New();
    for (const struct ic_field *f = fields; rest && f->name; f++) {
        PyObject *key = PyUnicode_FromString(f->name);
        /* borrowed: `kwds` keeps it, and the text a field points into, alive */
        PyObject *value = key ? PyDict_GetItemWithError(rest, key) : NULL;
        if (!key || (!value && PyErr_Occurred()) ||
            (value && (set_field(f, target, value, function) < 0 ||
                       PyDict_DelItem(rest, key) < 0)))
            Py_CLEAR(rest);
        Py_XDECREF(key);
    }
    return rest;
}

static PyObject *field_value(const struct ic_field *f, const void *source)
{
    const char *at = (const char *)source + f->offset;
    switch (f->kind) {
    case IC_FIELD_U64:
        return PyLong_FromUnsignedLongLong(*(const uint64_t *)at);
    case IC_FIELD_UNSIGNED:
        return PyLong_FromUnsignedLong(*(const unsigned *)at);
    case IC_FIELD_FLAG:
        return PyBool_FromLong(*(const int *)at);
    case IC_FIELD_TEXT:
    case IC_FIELD_CHOICE:
        break;
    }
    return PyErr_Format(PyExc_SystemError, "field %s cannot be shown", f->name);
}

static PyObject *fields_dict(const struct ic_field *fields, const void *source)
{
    PyObject *dict = PyDict_New();
    for (const struct ic_field *f = fields; dict && f->name; f++) {
        PyObject *value = field_value(f, source);
        if (!value || PyDict_SetItemString(dict, f->name, value) < 0)
            Py_CLEAR(dict);
        Py_XDECREF(value);
    }
    return dict;
}

/* ---- Image -------------------------------------------------------------- */

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

/* A closed image is a ValueError, as for Python file objects. */
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

/* run() on this image, which stays open meanwhile: close() waits for the
 * call, or leaves the release to it. */
static int run_on_image(ImageObject *self, struct glue_call *call)
{
    core_state *st = (call->img = usable(self)) ? type_state(Py_TYPE(self)) : NULL;
    if (!st)
        return -1;
    enter(self);
    int ret = run(st, call);
    leave(self);
    return ret;
}

static int image_init(ImageObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"path", "format", "writable", "direct", "force", "force_share",
                             "source", NULL};
    struct path_arg path = {0};
    int writable = 0, direct = 0, force = 0, force_share = 0, source = 0;
    struct glue_call call = {.op = GLUE_OPEN};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O&|z$ppppp:Image", kwlist, path_converter,
                                     &path, &call.format, &writable, &direct, &force,
                                     &force_share, &source))
        return -1;
    call.path = path.path;
    call.flags = (writable ? IC_OPEN_RDWR : 0) | (direct ? IC_OPEN_DIRECT : 0) |
                 (force ? IC_OPEN_FORCE : 0) | (force_share ? IC_OPEN_FORCE_SHARE : 0) |
                 (source ? IC_OPEN_SOURCE : 0);
    core_state *st = type_state(Py_TYPE(self));
    int ret = -1;
    if (self->img)
        PyErr_SetString(PyExc_RuntimeError, "Image is already open");
    else if (st && (ret = run(st, &call)) == 0)
        self->img = call.image;
    Py_DECREF(path.bytes);
    return ret;
}

static void image_dealloc(PyObject *obj)
{
    PyTypeObject *type = Py_TYPE(obj);
    image_release((ImageObject *)obj);
    type->tp_free(obj);
    Py_DECREF(type); /* an instance of a heap type owns a reference to it */
}

/* Writes what the format holds in memory and marks the image complete. */
static PyObject *image_finish(ImageObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"sync", NULL};
    int sync = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|$p:finish", kwlist, &sync))
        return NULL;
    struct glue_call call = {.op = GLUE_FINISH, .flags = (unsigned)sync};
    self->finished = run_on_image(self, &call) == 0;
    return self->finished ? Py_NewRef(Py_None) : NULL;
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
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|$p:close", kwlist, &finish))
        return NULL;
    if (!self->img || self->close_pending || self->closing)
        Py_RETURN_NONE;
    if (self->busy && !ic_image_writable(self->img)) {
        self->close_pending = 1;
        Py_RETURN_NONE;
    }
    core_state *st = type_state(Py_TYPE(self));
    if (!st)
        return NULL;
    self->closing = 1;
    while (self->busy) {
        Py_BEGIN_ALLOW_THREADS
        struct timespec nap = {0, 1000000};
        nanosleep(&nap, NULL);
        Py_END_ALLOW_THREADS
    }
    struct glue_call call = {.op = GLUE_FINISH, .img = self->img, .flags = 0 /* no sync */};
    int ret = finish ? run(st, &call) : 0;
    image_release(self);
    self->closing = 0;
    return ret < 0 ? NULL : Py_NewRef(Py_None);
}

/* The getters: what an image is; `finished` and `closed` stay readable
 * once it is closed. */
enum image_attribute { IMAGE_SIZE, IMAGE_FORMAT, IMAGE_WRITABLE, IMAGE_CLOSED, IMAGE_FINISHED };

static PyObject *image_get(ImageObject *self, void *closure)
{
    enum image_attribute which = (enum image_attribute)(intptr_t)closure;
    if (which == IMAGE_FINISHED)
        return PyBool_FromLong(self->finished);
    if (which == IMAGE_CLOSED)
        return PyBool_FromLong(!self->img || self->close_pending || self->closing);
    struct ic_image *img = usable(self);
    if (!img)
        return NULL;
    if (which == IMAGE_SIZE)
        return PyLong_FromUnsignedLongLong(ic_image_size(img));
    if (which == IMAGE_FORMAT)
        return PyUnicode_FromString(ic_image_format(img));
    return PyBool_FromLong(ic_image_writable(img));
}

/* (offset, length)-like arguments into call->offset and call->length, and
 * an optional third unit (zero's flags) into call->flags */
static int parse_range(PyObject *args, PyObject *kwds, const char *format, char **kwlist,
                       struct glue_call *call)
{
    const char *function = strchr(format, ':') + 1;
    struct u64_arg first = {function, kwlist[0], 0}, second = {function, kwlist[1], 0};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, format, kwlist, u64_converter, &first,
                                     u64_converter, &second, &call->flags))
        return -1;
    call->offset = first.value;
    call->length = second.value;
    return 0;
}

/* Extents (and snapshots) travel to Python packed, as the core's structs:
 * an ExtentMap of a million extents stays one bytes object until someone
 * looks inside (imgcopy/extents.py reads them). */
static PyObject *packed(const void *items, size_t count, size_t size)
{
    return PyBytes_FromStringAndSize(items, (Py_ssize_t)(count * size));
}

static PyObject *image_block_status(ImageObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"offset", "length", NULL};
    struct glue_call call = {.op = GLUE_BLOCK_STATUS};
    if (parse_range(args, kwds, "O&O&:block_status", kwlist, &call) < 0 ||
        run_on_image(self, &call) < 0)
        return NULL;
    return packed(&call.extent, 1, sizeof call.extent);
}

static PyObject *image_map(ImageObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"start", "end", NULL};
    struct glue_call call = {.op = GLUE_MAP};
    if (parse_range(args, kwds, "O&O&:map", kwlist, &call) < 0)
        return NULL;
    call.end = call.length;
    PyObject *res = run_on_image(self, &call) < 0
                        ? NULL
                        : packed(call.list.items, call.list.count, sizeof *call.list.items);
    ic_extent_list_free(&call.list);
    return res;
}

static PyObject *image_read(ImageObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"offset", "length", NULL};
    struct glue_call call = {.op = GLUE_READ};
    struct ic_image *img;
    if (parse_range(args, kwds, "O&O&:read", kwlist, &call) < 0 || !(img = usable(self)))
        return NULL;
    uint64_t size = ic_image_size(img);
    if (call.offset > size || call.length > size - call.offset)
        return PyErr_Format(PyExc_ValueError, "read of %llu bytes at %llu is outside the image "
                            "(size %llu)", (unsigned long long)call.length,
                            (unsigned long long)call.offset, (unsigned long long)size);
    if (call.length > PY_SSIZE_T_MAX)
        return PyErr_NoMemory();
    PyObject *data = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)call.length);
    if (data && (call.buf = PyBytes_AS_STRING(data), run_on_image(self, &call) < 0))
        Py_CLEAR(data);
    return data;
}

static PyObject *image_write(ImageObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"offset", "data", NULL};
    struct u64_arg offset = {"write", "offset", 0};
    Py_buffer data;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O&y*:write", kwlist, u64_converter, &offset,
                                     &data))
        return NULL;
    struct glue_call call = {.op = GLUE_WRITE, .offset = offset.value, .buf = data.buf,
                             .length = (uint64_t)data.len};
    int ret = run_on_image(self, &call);
    PyBuffer_Release(&data);
    return ret < 0 ? NULL : Py_NewRef(Py_None);
}

static PyObject *image_zero(ImageObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"offset", "length", "flags", NULL};
    struct glue_call call = {.op = GLUE_ZERO};
    if (parse_range(args, kwds, "O&O&|I:zero", kwlist, &call) < 0 ||
        run_on_image(self, &call) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *image_flush(ImageObject *self, PyObject *unused)
{
    (void)unused;
    struct glue_call call = {.op = GLUE_FLUSH};
    return run_on_image(self, &call) < 0 ? NULL : Py_NewRef(Py_None);
}

static PyObject *image_cache_stats(ImageObject *self, PyObject *unused)
{
    (void)unused;
    struct ic_image *img = usable(self);
    struct ic_cache_stats stats;
    if (!img)
        return NULL;
    ic_image_cache_stats(img, &stats);
    return fields_dict(ic_cache_stats_fields, &stats);
}

/* [(path, format), ...] from this image down its backing chain */
static PyObject *image_chain(ImageObject *self, PyObject *unused)
{
    (void)unused;
    struct ic_image *img = usable(self);
    PyObject *list = img ? PyList_New(0) : NULL;
    for (; list && img; img = ic_image_backing(img)) {
        PyObject *item = Py_BuildValue("(O&s)", PyUnicode_DecodeFSDefault, ic_image_path(img),
                                       ic_image_format(img));
        if (!item || PyList_Append(list, item) < 0)
            Py_CLEAR(list);
        Py_XDECREF(item);
    }
    return list;
}

static PyObject *image_snapshots(ImageObject *self, PyObject *unused)
{
    (void)unused;
    struct ic_image *img = usable(self);
    const struct ic_snapshot *snapshots;
    size_t count;
    if (!img)
        return NULL;
    ic_image_snapshots(img, &snapshots, &count);
    return packed(snapshots, count, sizeof *snapshots);
}

/* An ic_info_field's value as Python's int, bool or str */
static PyObject *info_value(const struct ic_info_field *field)
{
    switch (field->kind) {
    case IC_INFO_BOOL:
        return PyBool_FromLong(field->number != 0);
    case IC_INFO_INT:
        return PyLong_FromLongLong(field->number);
    case IC_INFO_STRING:
        break;
    }
    return PyUnicode_FromString(field->text);
}

static PyObject *decoded_or_none(const char *text)
{
    return text[0] ? PyUnicode_DecodeFSDefault(text) : Py_NewRef(Py_None);
}

/* What the image's own header says (imgcopy/_core.pyi: ImageDescription) */
static PyObject *image_describe(ImageObject *self, PyObject *unused)
{
    (void)unused;
    struct ic_image *img = usable(self);
    if (!img)
        return NULL;
    struct ic_image_info info;
    ic_image_describe(img, &info);
    PyObject *specific = PyList_New(0);
    for (size_t i = 0; specific && i < info.nfields; i++) {
        PyObject *value = info_value(&info.fields[i]);
        PyObject *item = value ? Py_BuildValue("(sO)", info.fields[i].key, value) : NULL;
        if (!item || PyList_Append(specific, item) < 0)
            Py_CLEAR(specific);
        Py_XDECREF(item);
        Py_XDECREF(value);
    }
    PyObject *backing_name = decoded_or_none(info.has_backing ? info.backing_name : "");
    PyObject *backing_format = decoded_or_none(info.backing_format);
    PyObject *result = NULL;
    if (specific && backing_name && backing_format)
        result = Py_BuildValue("{s:K,s:O,s:O,s:O,s:O}",
                               "cluster_size", (unsigned long long)info.cluster_size,
                               "dirty", info.dirty ? Py_True : Py_False,
                               "backing_name", backing_name,
                               "backing_format", backing_format,
                               "format_specific", specific);
    Py_XDECREF(specific);
    Py_XDECREF(backing_name);
    Py_XDECREF(backing_format);
    return result;
}

static PyObject *image_reads_file(ImageObject *self, PyObject *arg)
{
    struct ic_image *img = usable(self);
    struct path_arg path = {0};
    if (!img || !path_converter(arg, &path))
        return NULL;
    const char *found = ic_image_reads_file(img, path.path);
    Py_DECREF(path.bytes);
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

/* imgcopy/_core.pyi documents the functions and methods. */
#define KEYWORDS(function) (PyCFunction)(void (*)(void))(function), METH_VARARGS | METH_KEYWORDS

static PyMethodDef image_methods[] = {
    {"close", KEYWORDS(image_close), NULL},
    {"finish", KEYWORDS(image_finish), NULL},
    {"block_status", KEYWORDS(image_block_status), NULL},
    {"map", KEYWORDS(image_map), NULL},
    {"read", KEYWORDS(image_read), NULL},
    {"write", KEYWORDS(image_write), NULL},
    {"zero", KEYWORDS(image_zero), NULL},
    {"flush", (PyCFunction)image_flush, METH_NOARGS, NULL},
    {"cache_stats", (PyCFunction)image_cache_stats, METH_NOARGS, NULL},
    {"drop_cache", (PyCFunction)image_drop_cache, METH_NOARGS, NULL},
    {"reads_file", (PyCFunction)image_reads_file, METH_O, NULL},
    {"snapshots", (PyCFunction)image_snapshots, METH_NOARGS, NULL},
    {"describe", (PyCFunction)image_describe, METH_NOARGS, NULL},
    {"chain", (PyCFunction)image_chain, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

#define ATTRIBUTE(name, which) {name, (getter)image_get, NULL, NULL, (void *)(intptr_t)(which)}

static PyGetSetDef image_getset[] = {
    ATTRIBUTE("size", IMAGE_SIZE),
    ATTRIBUTE("format", IMAGE_FORMAT),
    ATTRIBUTE("writable", IMAGE_WRITABLE),
    ATTRIBUTE("closed", IMAGE_CLOSED),
    ATTRIBUTE("finished", IMAGE_FINISHED),
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot image_slots[] = {
    {Py_tp_doc, (void *)"an open disk image"},
    {Py_tp_new, (void *)PyType_GenericNew},
    {Py_tp_init, (void *)image_init},
    {Py_tp_dealloc, (void *)image_dealloc},
    {Py_tp_methods, image_methods},
    {Py_tp_getset, image_getset},
    {0, NULL},
};

static PyType_Spec image_spec = {
    .name = "imgcopy._core.Image",
    .basicsize = sizeof(ImageObject),
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = image_slots,
};

/* ---- module functions --------------------------------------------------- */

static PyObject *mod_probe(PyObject *m, PyObject *arg)
{
    struct path_arg path = {0};
    if (!path_converter(arg, &path))
        return NULL;
    struct glue_call call = {.op = GLUE_PROBE, .path = path.path};
    int ret = run(module_state(m), &call);
    Py_DECREF(path.bytes);
    return ret < 0 ? NULL : PyUnicode_FromString(call.probed);
}

static PyObject *names_tuple(size_t (*list)(const char **, size_t))
{
    const char *names[64];
    size_t count = list(names, sizeof names / sizeof names[0]);
    if (count > sizeof names / sizeof names[0])
        return PyErr_Format(PyExc_SystemError, "more than %zu formats", count);
    PyObject *tuple = PyTuple_New((Py_ssize_t)count);
    for (size_t i = 0; tuple && i < count; i++) {
        PyObject *name = PyUnicode_FromString(names[i]);
        if (!name)
            Py_CLEAR(tuple);
        else
            PyTuple_SET_ITEM(tuple, (Py_ssize_t)i, name);
    }
    return tuple;
}

static PyObject *mod_formats(PyObject *m, PyObject *unused)
{
    (void)m, (void)unused;
    return names_tuple(ic_formats);
}

static PyObject *mod_writable_formats(PyObject *m, PyObject *unused)
{
    (void)m, (void)unused;
    return names_tuple(ic_writable_formats);
}

static PyObject *mod_create(PyObject *m, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"path", "format", "size", "direct", "writeback", "atomic", NULL};
    core_state *st = module_state(m);
    struct path_arg path = {0};
    struct u64_arg size = {"create", "size", 0};
    struct ic_create_options opts = {0};
    int direct = 0, writeback = 0, atomic = 0, ret = -1;
    struct glue_call call = {.op = GLUE_CREATE, .create_options = &opts};
    PyObject *rest = take_fields(kwds, ic_create_option_fields, &opts, "create");
    if (rest && PyArg_ParseTupleAndKeywords(args, rest, "O&zO&|$ppp:create", kwlist,
                                            path_converter, &path, &call.format, u64_converter,
                                            &size, &direct, &writeback, &atomic)) {
        call.path = path.path;
        call.size = size.value;
        call.flags = (direct ? IC_OPEN_DIRECT : 0) | (writeback ? IC_OPEN_WRITEBACK : 0) |
                     (atomic ? IC_CREATE_ATOMIC : 0);
        ret = run(st, &call);
        Py_DECREF(path.bytes);
    }
    Py_XDECREF(rest);
    if (ret < 0)
        return NULL;
    ImageObject *image = (ImageObject *)st->image_type->tp_alloc(st->image_type, 0);
    if (!image) {
        ic_image_close(call.image);
        return NULL;
    }
    image->img = call.image;
    return Py_BuildValue("(NN)", (PyObject *)image, PyBool_FromLong(call.fresh));
}

/* The check create() and copy() make before they touch anything, alone. */
static PyObject *mod_check_create_options(PyObject *m, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"format", NULL};
    struct ic_create_options opts = {0};
    struct ic_error err = {0};
    const char *format;
    PyObject *rest = take_fields(kwds, ic_create_option_fields, &opts, "check_create_options");
    int parsed = rest && PyArg_ParseTupleAndKeywords(args, rest, "z:check_create_options",
                                                     kwlist, &format);
    if (parsed && ic_create_options_check(format, &opts, &err) < 0)
        raise_error(module_state(m), &err);
    Py_XDECREF(rest);
    return parsed && !err.kind ? Py_NewRef(Py_None) : NULL;
}

static PyObject *mod_check_copy_options(PyObject *m, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {NULL};
    struct ic_copy_options opt;
    struct ic_error err = {0};
    ic_copy_options_init(&opt);
    PyObject *rest = take_fields(kwds, ic_copy_option_fields, &opt, "check_copy_options");
    int parsed = rest && PyArg_ParseTupleAndKeywords(args, rest, ":check_copy_options", kwlist);
    if (parsed && ic_copy_options_check(&opt, &err) < 0)
        raise_error(module_state(m), &err);
    Py_XDECREF(rest);
    return parsed && !err.kind ? Py_NewRef(Py_None) : NULL;
}

static PyObject *mod_copy_option_defaults(PyObject *m, PyObject *unused)
{
    (void)m, (void)unused;
    struct ic_copy_options defaults;
    ic_copy_options_init(&defaults);
    return fields_dict(ic_copy_option_fields, &defaults);
}

/* Slices the calling thread waits in, with the GIL released: short enough
 * for Ctrl-C and progress to feel immediate. */
#define WAIT_SLICE_MS 100

static int report_progress(PyObject *progress, const struct ic_copy_stats *st)
{
    PyObject *r = progress == Py_None
                      ? Py_NewRef(Py_None)
                      : PyObject_CallFunction(progress, "KK", (unsigned long long)st->done,
                                              (unsigned long long)st->total);
    Py_XDECREF(r);
    return r ? 0 : -1;
}

/* Waits for the copy's threads, reporting progress.  A Python error (the
 * callback's, Ctrl-C) cancels the copy and stays set for the caller: 1. */
static int watch_copy(struct glue_call *copy, PyObject *progress)
{
    int python_error = 0, done;
    for (;;) {
        Py_BEGIN_ALLOW_THREADS
        done = ic_copy_wait(copy->copy, WAIT_SLICE_MS);
        Py_END_ALLOW_THREADS
        if (done)
            return python_error; /* the last report waits for the outcome */
        if (!python_error) {
            ic_copy_progress(copy->copy, &copy->stats);
            python_error = report_progress(progress, &copy->stats) < 0 ||
                           PyErr_CheckSignals() < 0;
        }
        if (python_error)
            ic_copy_cancel(copy->copy);
    }
}

/* copy()'s one result: the counters, and under "requests" the requests
 * made (packed struct ic_request, by offset) when they were logged. */
static PyObject *copy_report(const struct ic_copy_stats *stats, struct ic_request_log *log)
{
    size_t count = 0;
    const struct ic_request *requests = log ? ic_request_log_sorted(log, &count) : NULL;
    PyObject *logged = log ? packed(requests, count, sizeof *requests) : Py_NewRef(Py_None);
    PyObject *report = logged ? fields_dict(ic_copy_stats_fields, stats) : NULL;
    if (report && PyDict_SetItemString(report, "requests", logged) < 0)
        Py_CLEAR(report);
    Py_XDECREF(logged);
    return report;
}

static PyObject *mod_copy(PyObject *m, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"src", "dst", "progress", "log", NULL};
    core_state *st = module_state(m);
    ImageObject *src, *dst;
    PyObject *progress = Py_None, *report = NULL;
    int log = 0;
    struct ic_copy_options opt;
    ic_copy_options_init(&opt);
    PyObject *rest = take_fields(kwds, ic_copy_option_fields, &opt, "copy");
    int parsed = rest && PyArg_ParseTupleAndKeywords(args, rest, "O!O!|$Op:copy", kwlist,
                                                     st->image_type, &src, st->image_type,
                                                     &dst, &progress, &log);
    Py_XDECREF(rest);
    if (!parsed)
        return NULL;
    if (progress != Py_None && !PyCallable_Check(progress))
        return PyErr_Format(PyExc_TypeError, "copy() argument 'progress' must be callable");
    struct glue_call copy = {.op = GLUE_COPY_START, .copy_options = &opt, .img = usable(src)};
    if (!copy.img || !(copy.dst = usable(dst)))
        return NULL;
    if (src == dst)
        return PyErr_Format(PyExc_ValueError, "source and destination are the same image");
    if (log && !(opt.log = ic_request_log_new()))
        return PyErr_NoMemory();
    enter(src);
    enter(dst);
    if (run(st, &copy) == 0) {
        int python_error = watch_copy(&copy, progress);
        struct ic_error err = {0};
        copy.op = GLUE_COPY_FINISH;
        /* Python's error (already set) wins over the copy's own */
        int ret = python_error ? glue_call_run(&copy, &err) : run(st, &copy);
        /* Every byte is written, nothing committed yet (the caller finishes
         * the destination when this returns): the 100% report and Ctrl-C
         * can still cancel the copy, however short it was. */
        if (!python_error && ret == 0 && report_progress(progress, &copy.stats) == 0 &&
            PyErr_CheckSignals() == 0)
            report = copy_report(&copy.stats, opt.log);
    }
    leave(src);
    leave(dst);
    ic_request_log_free(opt.log);
    return report;
}

/* ---- packed extents ----------------------------------------------------- */

/* format_map(packed, start, tail_end, names=None): qemu-img map's output,
 * JSON without names, else human with the file of each depth of the chain
 * in names, NUL-separated */
static PyObject *mod_format_map(PyObject *m, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"packed", "start", "tail_end", "names", NULL};
    struct packed_arg extents = {0};
    struct u64_arg start = {"format_map", "start", 0}, tail_end = {"format_map", "tail_end", 0};
    Py_ssize_t names_length = 0;
    struct glue_call call = {.op = GLUE_FORMAT_MAP};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O&O&O&|z#:format_map", kwlist,
                                     packed_converter, &extents, u64_converter, &start,
                                     u64_converter, &tail_end, &call.names, &names_length))
        return NULL;
    call.extents = extents.extents;
    call.extent_count = extents.count;
    call.offset = start.value;
    call.end = tail_end.value;
    call.names_length = (size_t)names_length;
    PyObject *text = run(module_state(m), &call) < 0 ? NULL : PyUnicode_DecodeFSDefault(call.text);
    free(call.text);
    PyBuffer_Release(&extents.buf);
    return text;
}

static PyObject *mod_extent_totals(PyObject *m, PyObject *arg)
{
    (void)m;
    struct packed_arg extents = {0};
    struct ic_extent_totals t;
    if (!packed_converter(arg, &extents))
        return NULL;
    ic_extent_totals(extents.extents, extents.count, &t);
    PyBuffer_Release(&extents.buf);
    return Py_BuildValue("(KKKK)", (unsigned long long)t.data, (unsigned long long)t.zero,
                         (unsigned long long)t.present, (unsigned long long)t.compressed);
}

static PyMethodDef module_methods[] = {
    {"probe", mod_probe, METH_O, NULL},
    {"formats", mod_formats, METH_NOARGS, NULL},
    {"writable_formats", mod_writable_formats, METH_NOARGS, NULL},
    {"create", KEYWORDS(mod_create), NULL},
    {"check_create_options", KEYWORDS(mod_check_create_options), NULL},
    {"copy", KEYWORDS(mod_copy), NULL},
    {"check_copy_options", KEYWORDS(mod_check_copy_options), NULL},
    {"copy_option_defaults", mod_copy_option_defaults, METH_NOARGS, NULL},
    {"format_map", KEYWORDS(mod_format_map), NULL},
    {"extent_totals", mod_extent_totals, METH_O, NULL},
    {NULL, NULL, 0, NULL},
};

/* ---- the module --------------------------------------------------------- */

static int core_traverse(PyObject *m, visitproc visit, void *arg)
{
    core_state *st = module_state(m);
    Py_VISIT(st->image_type);
    Py_VISIT(st->error);
    Py_VISIT(st->image_format_error);
    Py_VISIT(st->os_error_factory);
    Py_VISIT(st->unsupported_operation);
    return 0;
}

static int core_clear(PyObject *m)
{
    core_state *st = module_state(m);
    Py_CLEAR(st->image_type);
    Py_CLEAR(st->error);
    Py_CLEAR(st->image_format_error);
    Py_CLEAR(st->os_error_factory);
    Py_CLEAR(st->unsupported_operation);
    return 0;
}

static void core_free(void *m)
{
    core_clear(m);
}

static PyObject *attribute_of(const char *module_name, const char *name)
{
    PyObject *module = PyImport_ImportModule(module_name);
    PyObject *value = module ? PyObject_GetAttrString(module, name) : NULL;
    Py_XDECREF(module);
    return value;
}

static int core_exec(PyObject *m)
{
    core_state *st = module_state(m);
    /* the exceptions are Python classes (imgcopy/errors.py): they spell
     * remedies for the API and the CLI */
    if (!(st->unsupported_operation = attribute_of("io", "UnsupportedOperation")) ||
        !(st->error = attribute_of("imgcopy.errors", "Error")) ||
        !(st->image_format_error = attribute_of("imgcopy.errors", "ImageFormatError")) ||
        !(st->os_error_factory = attribute_of("imgcopy.errors", "os_error")) ||
        !(st->image_type = (PyTypeObject *)PyType_FromModuleAndSpec(m, &image_spec, NULL)))
        return -1;
    static const struct {
        const char *name;
        long value;
    } constants[] = {
        {"ZERO_MAY_UNMAP", IC_ZERO_MAY_UNMAP},
        {"ZERO_FAST", IC_ZERO_FAST},
        {"EXTENT_SIZE", (long)sizeof(struct ic_extent)},
        {"EXTENT_DATA", IC_EXT_DATA},
        {"EXTENT_ZERO", IC_EXT_ZERO},
        {"EXTENT_PRESENT", IC_EXT_PRESENT},
        {"EXTENT_OFFSET_VALID", IC_EXT_OFFSET_VALID},
        {"EXTENT_COMPRESSED", IC_EXT_COMPRESSED},
        {"SNAPSHOT_SIZE", (long)sizeof(struct ic_snapshot)},
        {"REQUEST_SIZE", (long)sizeof(struct ic_request)},
        {"REQ_WRITE", IC_REQ_WRITE},
        {"REQ_ZERO", IC_REQ_ZERO},
        {"REQ_SKIP", IC_REQ_SKIP},
    };
    for (size_t i = 0; i < sizeof constants / sizeof constants[0]; i++)
        if (PyModule_AddIntConstant(m, constants[i].name, constants[i].value) < 0)
            return -1;
    if (PyModule_AddObjectRef(m, "Image", (PyObject *)st->image_type) < 0 ||
        PyModule_AddObjectRef(m, "Error", st->error) < 0 ||
        PyModule_AddObjectRef(m, "ImageFormatError", st->image_format_error) < 0)
        return -1;
    return 0;
}

static PyModuleDef_Slot core_slots[] = {
    {Py_mod_exec, (void *)core_exec},
    {0, NULL},
};

static struct PyModuleDef core_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "imgcopy._core",
    .m_doc = "imgcopy's C core (imgcopy/_core.pyi describes it)",
    .m_size = sizeof(core_state),
    .m_methods = module_methods,
    .m_slots = core_slots,
    .m_traverse = core_traverse,
    .m_clear = core_clear,
    .m_free = core_free,
};

PyMODINIT_FUNC PyInit__core(void)
{
    return PyModuleDef_Init(&core_module);
}
