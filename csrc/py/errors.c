/* How the core's errors are raised in Python. */
#include <string.h>

#include "glue.h"

/* How imgcopy/errors.py names a remedy (None: there is none). */
static const char *const remedy_codes[] = {
    [IC_REMEDY_NONE] = NULL,
    [IC_REMEDY_AS_RAW] = "as_raw",
    [IC_REMEDY_FORCE] = "force",
    [IC_REMEDY_FORCE_SHARE] = "force_share",
    [IC_REMEDY_MEMBER] = "member", /* "member:NAME" */
};

/* The exception a factory of imgcopy.errors made becomes the current one. */
static void raise_made(PyObject *exc)
{
    if (exc) {
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
        Py_DECREF(exc);
    }
}

/* A message may quote what an image holds (a tar member's name), which
 * need not be UTF-8: undecodable bytes are shown escaped. */
static PyObject *message(const char *msg)
{
    return PyUnicode_DecodeUTF8(msg, (Py_ssize_t)strlen(msg), "backslashreplace");
}

void raise_error(core_state *st, const struct ic_error *err)
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
        if (path && (reason = message(err->msg))) {
            PyObject *code = Py_NewRef(Py_None);
            if (err->remedy == IC_REMEDY_MEMBER) {
                char text[sizeof err->remedy_arg + 8];
                snprintf(text, sizeof text, "member:%s", err->remedy_arg);
                Py_SETREF(code, message(text));
            } else if (remedy_codes[err->remedy]) {
                Py_SETREF(code, PyUnicode_FromString(remedy_codes[err->remedy]));
            }
            if (code)
                raise_made(PyObject_CallFunction(st->image_format_error, "OOO", reason, path,
                                                 code));
            Py_XDECREF(code);
        }
        break;
    case IC_ERR_NOMEM:
        PyErr_NoMemory();
        break;
    case IC_ERR_READONLY:
        PyErr_Format(st->unsupported_operation, "%s: %s", err->path, err->msg);
        break;
    case IC_ERR_VALUE:
        if ((reason = message(err->msg)))
            PyErr_SetObject(PyExc_ValueError, reason);
        break;
    case IC_ERR_NONE:
        PyErr_SetString(st->error, err->msg[0] ? err->msg : "unknown error");
        break;
    }
    Py_XDECREF(reason);
    Py_XDECREF(path);
}
