/* Python's arguments as the core's: integers, paths and packed extents
 * (PyArg_Parse* "O&" converters), keywords into the core's structs and
 * those structs back as dicts (ic_field tables, csrc/fields.c). */
#include <limits.h>

#include "glue.h"

int u64_converter(PyObject *obj, void *target)
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


int path_converter(PyObject *obj, void *target)
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


int packed_converter(PyObject *obj, void *target)
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
    case IC_FIELD_AUTO_FLAG:
        if (f->kind == IC_FIELD_AUTO_FLAG && value == Py_None)
            truth = IC_AUTO;
        else if ((truth = PyObject_IsTrue(value)) < 0)
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

PyObject *take_fields(PyObject *kwds, const struct ic_field *fields, void *target,
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
    case IC_FIELD_AUTO_FLAG:
        if (*(const int *)at == IC_AUTO)
            return Py_NewRef(Py_None);
        return PyBool_FromLong(*(const int *)at);
    case IC_FIELD_TEXT:
    case IC_FIELD_CHOICE:
        break;
    }
    return PyErr_Format(PyExc_SystemError, "field %s cannot be shown", f->name);
}

PyObject *fields_dict(const struct ic_field *fields, const void *source)
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

/* Extents (and snapshots) travel to Python packed, as the core's structs:
 * an ExtentMap of a million extents stays one bytes object until someone
 * looks inside (imgcopy/extents.py reads them). */
PyObject *packed_bytes(const void *items, size_t count, size_t size)
{
    return PyBytes_FromStringAndSize(items, (Py_ssize_t)(count * size));
}
