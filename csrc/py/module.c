/* imgcopy._core: the module and its functions.  The glue converts
 * arguments (options are keywords), runs the core's calls with the GIL
 * released (calls.h) and turns struct ic_error into Python exceptions;
 * its state (exception classes, the Image type) is the module's. */
#include "blkhash.h"
#include "glue.h"

#if PY_VERSION_HEX < 0x030A0000
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

/* ---- module functions --------------------------------------------------- */

static PyObject *mod_probe(PyObject *m, PyObject *arg)
{
    struct path_arg path = {0};
    if (!path_converter(arg, &path))
        return NULL;
    struct glue_call call = {.op = GLUE_PROBE, .path = path.path};
    int ret = glue_run(module_state(m), &call);
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
        ret = glue_run(st, &call);
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

static PyObject *mod_compression_libraries(PyObject *m, PyObject *unused)
{
    (void)m, (void)unused;
    const char *zlib = ic_compression_type_library("zlib");
    const char *zstd = ic_compression_type_library("zstd");
    return Py_BuildValue("{s:z,s:z}", "zlib", zlib, "zstd", zstd);
}

static PyObject *mod_library_versions(PyObject *m, PyObject *unused)
{
    (void)m, (void)unused;
    PyObject *d = PyDict_New();
    for (size_t i = 0; d && ic_libraries[i]; i++) {
        const char *v = ic_library_version(ic_libraries[i]);
        PyObject *value = v ? PyUnicode_FromString(v) : Py_NewRef(Py_None);
        if (!value || PyDict_SetItemString(d, ic_libraries[i], value) < 0)
            Py_CLEAR(d);
        Py_XDECREF(value);
    }
    return d;
}

/* copy()'s one result: the counters, and under "requests" the requests
 * made (packed struct ic_request, by offset) when they were logged. */
static PyObject *copy_report(const struct ic_copy_stats *stats, struct ic_request_log *log,
                             const struct ic_copy_options *used)
{
    size_t count = 0;
    const struct ic_request *requests = log ? ic_request_log_sorted(log, &count) : NULL;
    PyObject *logged = log ? packed_bytes(requests, count, sizeof *requests) : Py_NewRef(Py_None);
    PyObject *report = logged ? fields_dict(ic_copy_stats_fields, stats) : NULL;
    if (report && PyDict_SetItemString(report, "requests", logged) < 0)
        Py_CLEAR(report);
    /* "options": those the copy ran with (ic_copy_options_effective) */
    PyObject *options = report ? fields_dict(ic_copy_option_fields, used) : NULL;
    if (report && (!options || PyDict_SetItemString(report, "options", options) < 0))
        Py_CLEAR(report);
    Py_XDECREF(options);
    /* "checksum": the source's, only when the copy was asked for it */
    PyObject *checksum = stats->checksum[0] ? PyUnicode_FromString(stats->checksum) : NULL;
    if (report && stats->checksum[0] &&
        (!checksum || PyDict_SetItemString(report, "checksum", checksum) < 0))
        Py_CLEAR(report);
    Py_XDECREF(checksum);
    Py_XDECREF(logged);
    return report;
}

static PyObject *copy_images(core_state *st, ImageObject *src, ImageObject *dst,
                             PyObject *progress, int log, struct ic_copy_options *opt);

static PyObject *mod_copy(PyObject *m, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"src", "dst", "progress", "log", "checksum",
                             "checksum_block_size", "changed", "compare_block_size",
                             "block_digests", "pool", "buffer_limit", "journal",
                             "journal_interval_ms", "journal_interval_bytes", NULL};
    core_state *st = module_state(m);
    ImageObject *src, *dst;
    PyObject *progress = Py_None, *changed = Py_None, *pool = Py_None, *journal = Py_None;
    struct u64_arg buffer_limit = {"copy", "buffer_limit", 0};
    struct u64_arg interval_ms = {"copy", "journal_interval_ms", 0};
    struct u64_arg interval_bytes = {"copy", "journal_interval_bytes", 0};
    int log = 0, want_digests = 0;
    struct ic_copy_options opt;
    struct u64_arg checksum_block = {"copy", "checksum_block_size", 0};
    struct u64_arg compare_block = {"copy", "compare_block_size", 0};
    ic_copy_options_init(&opt);
    PyObject *rest = take_fields(kwds, ic_copy_option_fields, &opt, "copy");
    int parsed = rest && PyArg_ParseTupleAndKeywords(args, rest, "O!O!|$OpzO&OO&pOO&OO&O&:copy",
                                                     kwlist, st->image_type, &src,
                                                     st->image_type, &dst, &progress, &log,
                                                     &opt.checksum, u64_converter,
                                                     &checksum_block, &changed, u64_converter,
                                                     &compare_block, &want_digests, &pool,
                                                     u64_converter, &buffer_limit, &journal,
                                                     u64_converter, &interval_ms,
                                                     u64_converter, &interval_bytes);
    opt.checksum_block_size = checksum_block.value;
    opt.compare_block_size = compare_block.value;
    opt.buffer_limit = buffer_limit.value;
    Py_XDECREF(rest);
    if (!parsed)
        return NULL;
    if (pool != Py_None && !PyObject_TypeCheck(pool, st->pool_type))
        return PyErr_Format(PyExc_TypeError, "copy() argument 'pool' must be a Pool, not %s",
                            Py_TYPE(pool)->tp_name);
    if (pool != Py_None)
        opt.pool = ((PoolObject *)pool)->pool; /* the caller's reference keeps it */
    if (journal != Py_None && !PyObject_TypeCheck(journal, st->journal_type))
        return PyErr_Format(PyExc_TypeError, "copy() argument 'journal' must be a Journal, "
                            "not %s", Py_TYPE(journal)->tp_name);
    JournalObject *jo = journal != Py_None ? (JournalObject *)journal : NULL;
    if (jo && !(opt.journal = journal_usable(jo)))
        return NULL;
    opt.journal_interval_ms = interval_ms.value;
    opt.journal_interval_bytes = interval_bytes.value;
    /* changed: packed (offset, length) pairs of native uint64, or None */
    Py_buffer ranges = {0};
    if (changed != Py_None) {
        if (PyObject_GetBuffer(changed, &ranges, PyBUF_SIMPLE) < 0)
            return NULL;
        if (ranges.len % (Py_ssize_t)sizeof(struct ic_range)) {
            PyBuffer_Release(&ranges);
            return PyErr_Format(PyExc_ValueError, "copy() changed ranges must be packed "
                                "(offset, length) pairs of 64-bit integers");
        }
        opt.changed = ranges.buf;
        opt.nchanged = (size_t)ranges.len / sizeof(struct ic_range);
        opt.has_changed = 1;
    }
    /* a shard's block digests: its one range's blocks, gathered */
    struct ic_block_digests digests = {0};
    if (want_digests) {
        uint64_t block = opt.checksum_block_size ? opt.checksum_block_size
                                                 : IC_BLKHASH_DEFAULT_BLOCK;
        struct ic_error err = {0};
        if (!opt.checksum || opt.nchanged != 1 || opt.changed[0].length == 0) {
            PyErr_SetString(PyExc_ValueError, "copy() block_digests needs a checksum and one "
                            "changed range (a shard)");
        } else {
            uint64_t first = opt.changed[0].offset / block;
            uint64_t end = (opt.changed[0].offset + opt.changed[0].length + block - 1) / block;
            if (ic_block_digests_init(&digests, opt.checksum, block, first, end - first,
                                      &err) < 0)
                raise_error(st, &err);
            else {
                opt.block_sink = ic_block_digests_sink;
                opt.block_sink_ctx = &digests;
            }
        }
    }
    if (jo)
        jo->busy = 1; /* the copy records in it without the GIL */
    PyObject *copied = PyErr_Occurred() ? NULL : copy_images(st, src, dst, progress, log, &opt);
    if (jo)
        jo->busy = 0;
    if (copied && want_digests) {
        PyObject *packed = digests.missing == 0
            ? PyBytes_FromStringAndSize((const char *)digests.digests,
                                        (Py_ssize_t)(digests.count * digests.dsize))
            : PyErr_Format(PyExc_RuntimeError, "the shard's copy left %llu blocks unhashed",
                           (unsigned long long)digests.missing);
        PyObject *first = packed ? PyLong_FromUnsignedLongLong(digests.first) : NULL;
        if (!first || PyDict_SetItemString(copied, "block_digests", packed) < 0 ||
            PyDict_SetItemString(copied, "first_block", first) < 0)
            Py_CLEAR(copied);
        Py_XDECREF(packed);
        Py_XDECREF(first);
    }
    ic_block_digests_free(&digests);
    if (changed != Py_None)
        PyBuffer_Release(&ranges);
    return copied;
}

/* copy() once its arguments are parsed */
static PyObject *copy_images(core_state *st, ImageObject *src, ImageObject *dst,
                             PyObject *progress, int log, struct ic_copy_options *opt)
{
    PyObject *report = NULL;
    if (progress != Py_None && !PyCallable_Check(progress))
        return PyErr_Format(PyExc_TypeError, "copy() argument 'progress' must be callable");
    struct glue_call copy = {.op = GLUE_COPY_START, .copy_options = opt, .img = image_usable(src)};
    if (!copy.img || !(copy.dst = image_usable(dst)))
        return NULL;
    if (src == dst)
        return PyErr_Format(PyExc_ValueError, "source and destination are the same image");
    if (log && !(opt->log = ic_request_log_new()))
        return PyErr_NoMemory();
    image_enter(src);
    image_enter(dst);
    if (glue_run(st, &copy) == 0) {
        struct ic_copy_options used;
        ic_copy_options_used(copy.copy, &used);
        int python_error = glue_watch(ic_copy_job(copy.copy), progress, NULL, NULL);
        struct ic_error err = {0};
        copy.op = GLUE_COPY_FINISH;
        /* Python's error (already set) wins over the copy's own */
        int ret = python_error ? glue_call_run(&copy, &err) : glue_run(st, &copy);
        /* Every byte is written, nothing committed yet (the caller finishes
         * the destination when this returns): the 100% report and Ctrl-C
         * can still cancel the copy, however short it was. */
        if (!python_error && ret == 0 &&
            glue_report(progress, copy.stats.done, copy.stats.total) == 0 &&
            PyErr_CheckSignals() == 0)
            report = copy_report(&copy.stats, opt->log, &used);
    }
    image_leave(src);
    image_leave(dst);
    ic_request_log_free(opt->log);
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
    PyObject *text = glue_run(module_state(m), &call) < 0 ? NULL : PyUnicode_DecodeFSDefault(call.text);
    free(call.text);
    PyBuffer_Release(&extents.buf);
    return text;
}

/* format_dirty_map(packed, start, file=None): a dirty map's output, JSON
 * without `file`, else human naming it */
static PyObject *mod_format_dirty_map(PyObject *m, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"packed", "start", "file", NULL};
    struct packed_arg extents = {0};
    struct u64_arg start = {"format_dirty_map", "start", 0};
    PyObject *file = NULL;
    struct glue_call call = {.op = GLUE_FORMAT_DIRTY};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O&O&|O&:format_dirty_map", kwlist,
                                     packed_converter, &extents, u64_converter, &start,
                                     PyUnicode_FSConverter, &file))
        return NULL;
    call.extents = extents.extents;
    call.extent_count = extents.count;
    call.offset = start.value;
    call.name = file ? PyBytes_AS_STRING(file) : NULL;
    PyObject *text = glue_run(module_state(m), &call) < 0 ? NULL
                                                          : PyUnicode_DecodeFSDefault(call.text);
    free(call.text);
    Py_XDECREF(file);
    PyBuffer_Release(&extents.buf);
    return text;
}

/* mark_dirty(packed, dirty): the extents of `packed` cut where the dirty
 * map `dirty` changes, IC_EXT_DIRTY set inside its dirty extents */
static PyObject *mod_mark_dirty(PyObject *m, PyObject *args)
{
    struct packed_arg extents = {0}, dirty = {0};
    if (!PyArg_ParseTuple(args, "O&O&:mark_dirty", packed_converter, &extents, packed_converter,
                          &dirty))
        return NULL;
    struct ic_extent_list out = {0};
    struct ic_error err = {0};
    PyObject *res = NULL;
    if (ic_extents_mark_dirty(extents.extents, extents.count, dirty.extents, dirty.count, &out,
                              &err) < 0)
        raise_error(module_state(m), &err);
    else
        res = packed_bytes(out.items, out.count, sizeof *out.items);
    ic_extent_list_free(&out);
    PyBuffer_Release(&extents.buf);
    PyBuffer_Release(&dirty.buf);
    return res;
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
    return Py_BuildValue("(KKKKK)", (unsigned long long)t.data, (unsigned long long)t.zero,
                         (unsigned long long)t.present, (unsigned long long)t.compressed,
                         (unsigned long long)t.dirty);
}

/* checksum.c */
PyObject *mod_checksum(PyObject *m, PyObject *args, PyObject *kwds);
PyObject *mod_checksum_algorithms(PyObject *m, PyObject *unused);
PyObject *mod_checksum_check(PyObject *m, PyObject *args);

static PyMethodDef module_methods[] = {
    {"probe", mod_probe, METH_O, NULL},
    {"formats", mod_formats, METH_NOARGS, NULL},
    {"writable_formats", mod_writable_formats, METH_NOARGS, NULL},
    {"create", KEYWORDS(mod_create), NULL},
    {"check_create_options", KEYWORDS(mod_check_create_options), NULL},
    {"copy", KEYWORDS(mod_copy), NULL},
    {"check_copy_options", KEYWORDS(mod_check_copy_options), NULL},
    {"copy_option_defaults", mod_copy_option_defaults, METH_NOARGS, NULL},
    {"compression_libraries", mod_compression_libraries, METH_NOARGS, NULL},
    {"library_versions", mod_library_versions, METH_NOARGS, NULL},
    {"format_map", KEYWORDS(mod_format_map), NULL},
    {"format_dirty_map", KEYWORDS(mod_format_dirty_map), NULL},
    {"mark_dirty", mod_mark_dirty, METH_VARARGS, NULL},
    {"extent_totals", mod_extent_totals, METH_O, NULL},
    {"compare", KEYWORDS(glue_compare), NULL},
    {"checksum", KEYWORDS(mod_checksum), NULL},
    {"checksum_algorithms", mod_checksum_algorithms, METH_NOARGS, NULL},
    {"checksum_check", mod_checksum_check, METH_VARARGS, NULL},
    {"check", KEYWORDS(mod_check), NULL},
    {NULL, NULL, 0, NULL},
};

/* ---- the module --------------------------------------------------------- */

static int core_traverse(PyObject *m, visitproc visit, void *arg)
{
    core_state *st = module_state(m);
    Py_VISIT(st->image_type);
    Py_VISIT(st->pool_type);
    Py_VISIT(st->journal_type);
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
    Py_CLEAR(st->pool_type);
    Py_CLEAR(st->journal_type);
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
        !(st->image_type = (PyTypeObject *)PyType_FromModuleAndSpec(m, &image_type_spec, NULL)) ||
        !(st->pool_type = (PyTypeObject *)PyType_FromModuleAndSpec(m, &pool_type_spec, NULL)) ||
        !(st->journal_type =
              (PyTypeObject *)PyType_FromModuleAndSpec(m, &journal_type_spec, NULL)))
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
        {"EXTENT_DIRTY", IC_EXT_DIRTY},
        {"SNAPSHOT_SIZE", (long)sizeof(struct ic_snapshot)},
        {"REQUEST_SIZE", (long)sizeof(struct ic_request)},
        {"REQ_WRITE", IC_REQ_WRITE},
        {"REQ_ZERO", IC_REQ_ZERO},
        {"REQ_SKIP", IC_REQ_SKIP},
        {"BITMAP_IN_USE", IC_BITMAP_IN_USE},
        {"BITMAP_AUTO", IC_BITMAP_AUTO},
    };
    for (size_t i = 0; i < sizeof constants / sizeof constants[0]; i++)
        if (PyModule_AddIntConstant(m, constants[i].name, constants[i].value) < 0)
            return -1;
    if (PyModule_AddObjectRef(m, "Image", (PyObject *)st->image_type) < 0 ||
        PyModule_AddObjectRef(m, "Pool", (PyObject *)st->pool_type) < 0 ||
        PyModule_AddObjectRef(m, "Journal", (PyObject *)st->journal_type) < 0 ||
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
