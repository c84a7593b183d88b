/* The Python glue's shared declarations: the only header that includes
 * Python.h, included only by the files of csrc/py/ (the C core never sees
 * Python).  module.c is the module and its functions, image_type.c the
 * Image type, args.c the argument converters and the core's structs as
 * keywords and dicts, errors.c how a core call runs and how its error is
 * raised. */
#ifndef IMGCOPY_GLUE_H
#define IMGCOPY_GLUE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "calls.h"

/* CPython 3.9 (the oldest supported) lacks this 3.10 function. */
#if PY_VERSION_HEX < 0x030A0000
static inline PyObject *Py_NewRef(PyObject *obj)
{
    Py_INCREF(obj);
    return obj;
}
#endif

typedef struct {
    PyTypeObject *image_type;
    PyTypeObject *pool_type;
    PyTypeObject *journal_type;
    PyObject *error;                 /* imgcopy.errors.Error */
    PyObject *image_format_error;    /* imgcopy.errors.ImageFormatError */
    PyObject *os_error_factory;      /* imgcopy.errors.os_error */
    PyObject *unsupported_operation; /* io.UnsupportedOperation */
} core_state;

static inline core_state *module_state(PyObject *module)
{
    return PyModule_GetState(module);
}

/* Image is final: its type's module is the one that made it. */
static inline core_state *type_state(PyTypeObject *type)
{
    return PyType_GetModuleState(type);
}

/* errors.c */
void raise_error(core_state *st, const struct ic_error *err);

/* run.c: the one place the GIL is released */
/* A blocking call of the core, its failure raised (-1). */
int glue_run(core_state *st, struct glue_call *call);
/* Wait for a job (job.h) in slices; between them `between(ctx)` (optional:
 * -1 with a Python error set), progress(done, total) and Ctrl-C.  A Python
 * error cancels the job and stays set: 1; 0 when it ended on its own. */
int glue_watch(struct ic_job *job, PyObject *progress, int (*between)(void *ctx), void *ctx);
/* progress(done, total) unless progress is None; -1 when it raised */
int glue_report(PyObject *progress, uint64_t done, uint64_t total);
/* A millisecond without the GIL (waiting for another thread's call). */
void glue_nap(void);

/* args.c: converters for PyArg_Parse* "O&" */
/* A non-negative integer argument, named with its function in errors. */
struct u64_arg {
    const char *function;
    const char *name;
    uint64_t value;
};

/* A path (str, bytes, os.PathLike) as the file system spells it; no NULs. */
struct path_arg {
    PyObject *bytes;
    const char *path;
};

/* Packed extents (a struct ic_extent array) in a bytes-like object. */
struct packed_arg {
    Py_buffer buf;
    const struct ic_extent *extents;
    size_t count;
};
int u64_converter(PyObject *obj, void *target);
int path_converter(PyObject *obj, void *target);
int packed_converter(PyObject *obj, void *target);
/* The keywords `fields` names, set in the struct at `target` (the others
 * keep what it holds); returns a new dict of the other keywords, for
 * PyArg_ParseTupleAndKeywords, or NULL. */
PyObject *take_fields(PyObject *kwds, const struct ic_field *fields, void *target,
                      const char *function);
PyObject *fields_dict(const struct ic_field *fields, const void *source);
PyObject *packed_bytes(const void *items, size_t count, size_t size);

/* image_type.c */
typedef struct {
    PyObject_HEAD
    struct ic_image *img;
    int busy;          /* calls running with the GIL released */
    int close_pending; /* close() came while busy: the last call closes */
    int closing;       /* close() waits for the calls in flight */
    int finished;      /* finish() succeeded: a new image is complete */
} ImageObject;
extern PyType_Spec image_type_spec;

struct ic_pool;
typedef struct {
    PyObject_HEAD
    struct ic_pool *pool;
} PoolObject;
extern PyType_Spec pool_type_spec;

struct ic_journal;
typedef struct {
    PyObject_HEAD
    struct ic_journal *journal; /* NULL once closed or completed */
    PyObject *path;             /* str, for messages */
    int busy;                   /* a copy records in it (with the GIL released) */
} JournalObject;
extern PyType_Spec journal_type_spec;
/* the open journal, or NULL with an exception (closed, or busy) */
struct ic_journal *journal_usable(JournalObject *self);
struct ic_image *image_usable(ImageObject *self);
/* A call in flight on the image (close() waits for it) */
void image_enter(ImageObject *self);
void image_leave(ImageObject *self);

/* compare.c */
PyObject *glue_compare(PyObject *m, PyObject *args, PyObject *kwds);
/* check.c */
PyObject *mod_check(PyObject *m, PyObject *args, PyObject *kwds);

/* imgcopy/_core.pyi documents the functions and methods. */
#define KEYWORDS(function) (PyCFunction)(void (*)(void))(function), METH_VARARGS | METH_KEYWORDS

#endif
