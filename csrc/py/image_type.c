/* imgcopy._core.Image: an open image, closed once no call of another
 * thread is running on it. */
#include <string.h>

#include "glue.h"

static void image_release(ImageObject *self)
{
    if (self->img) {
        ic_image_close(self->img);
        self->img = NULL;
    }
}

/* A closed image is a ValueError, as for Python file objects. */
struct ic_image *image_usable(ImageObject *self)
{
    if (!self->img || self->close_pending || self->closing) {
        PyErr_SetString(PyExc_ValueError, "I/O operation on closed image");
        return NULL;
    }
    return self->img;
}

void image_enter(ImageObject *self)
{
    self->busy++;
}

void image_leave(ImageObject *self)
{
    if (--self->busy == 0 && self->close_pending)
        image_release(self);
}

/* glue_run() on this image, which stays open meanwhile: close() waits for the
 * call, or leaves the release to it. */
static int run_on_image(ImageObject *self, struct glue_call *call)
{
    core_state *st = (call->img = image_usable(self)) ? type_state(Py_TYPE(self)) : NULL;
    if (!st)
        return -1;
    image_enter(self);
    int ret = glue_run(st, call);
    image_leave(self);
    return ret;
}

static int image_init(ImageObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"path", "format", "writable", "direct", "force", "force_share",
                             "source", "member", "external_files", "no_backing", "share_write",
                             "resume", "writeback", NULL};
    struct path_arg path = {0};
    int writable = 0, direct = 0, force = 0, force_share = 0, source = 0, external = 0;
    int no_backing = 0, share_write = 0, resume = 0, writeback = 0;
    struct glue_call call = {.op = GLUE_OPEN};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O&|z$pppppzppppp:Image", kwlist,
                                     path_converter, &path, &call.format, &writable, &direct,
                                     &force, &force_share, &source, &call.member, &external,
                                     &no_backing, &share_write, &resume, &writeback))
        return -1;
    call.path = path.path;
    call.flags = (writable ? IC_OPEN_RDWR : 0) | (direct ? IC_OPEN_DIRECT : 0) |
                 (force ? IC_OPEN_FORCE : 0) | (force_share ? IC_OPEN_FORCE_SHARE : 0) |
                 (source ? IC_OPEN_SOURCE : 0) | (external ? IC_OPEN_EXTERNAL_FILES : 0) |
                 (no_backing ? IC_OPEN_NO_BACKING : 0) | (share_write ? IC_OPEN_SHARE_WRITE : 0) |
                 (resume ? IC_OPEN_RESUME : 0) | (writeback ? IC_OPEN_WRITEBACK : 0);
    core_state *st = type_state(Py_TYPE(self));
    int ret = -1;
    if (self->img)
        PyErr_SetString(PyExc_RuntimeError, "Image is already open");
    else if (st && (ret = glue_run(st, &call)) == 0)
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
    while (self->busy)
        glue_nap();
    struct glue_call call = {.op = GLUE_FINISH, .img = self->img, .flags = 0 /* no sync */};
    int ret = finish ? glue_run(st, &call) : 0;
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
    struct ic_image *img = image_usable(self);
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


static PyObject *image_block_status(ImageObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"offset", "length", NULL};
    struct glue_call call = {.op = GLUE_BLOCK_STATUS};
    if (parse_range(args, kwds, "O&O&:block_status", kwlist, &call) < 0 ||
        run_on_image(self, &call) < 0)
        return NULL;
    return packed_bytes(&call.extent, 1, sizeof call.extent);
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
                        : packed_bytes(call.list.items, call.list.count, sizeof *call.list.items);
    ic_extent_list_free(&call.list);
    return res;
}

/* dirty_map(bitmap, start, end): the packed dirty map of [start, end) of
 * the persistent bitmap named `bitmap` (as bitmaps() names it: the file
 * system's encoding, undecodable bytes escaped) */
static PyObject *image_dirty_map(ImageObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"bitmap", "start", "end", NULL};
    PyObject *name = NULL;
    struct u64_arg start = {"dirty_map", "start", 0}, end = {"dirty_map", "end", 0};
    struct glue_call call = {.op = GLUE_DIRTY_MAP};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O&O&O&:dirty_map", kwlist,
                                     PyUnicode_FSConverter, &name, u64_converter, &start,
                                     u64_converter, &end))
        return NULL;
    PyObject *res = NULL;
    if (end.value < start.value) {
        PyErr_SetString(PyExc_ValueError, "dirty_map(): end is before start");
    } else {
        call.name = PyBytes_AS_STRING(name);
        call.offset = start.value;
        call.length = end.value - start.value;
        if (run_on_image(self, &call) == 0)
            res = packed_bytes(call.list.items, call.list.count, sizeof *call.list.items);
    }
    ic_extent_list_free(&call.list);
    Py_DECREF(name);
    return res;
}

/* add_bitmap(name, granularity, ranges, *, enabled=True): a persistent
 * bitmap stored by the next finish(), its dirty ranges packed (offset,
 * length) pairs of native uint64 */
static PyObject *image_add_bitmap(ImageObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"name", "granularity", "ranges", "enabled", NULL};
    PyObject *name = NULL;
    struct u64_arg granularity = {"add_bitmap", "granularity", 0};
    Py_buffer ranges = {0};
    int enabled = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O&O&y*|$p:add_bitmap", kwlist,
                                     PyUnicode_FSConverter, &name, u64_converter, &granularity,
                                     &ranges, &enabled))
        return NULL;
    int ret = -1;
    if (ranges.len % (Py_ssize_t)sizeof(struct ic_range)) {
        PyErr_SetString(PyExc_ValueError, "add_bitmap() ranges must be packed (offset, length) "
                        "pairs of 64-bit integers");
    } else {
        struct glue_call call = {.op = GLUE_ADD_BITMAP, .name = PyBytes_AS_STRING(name),
                                 .size = granularity.value,
                                 .flags = enabled ? IC_BITMAP_AUTO : 0, .ranges = ranges.buf,
                                 .nranges = (size_t)ranges.len / sizeof(struct ic_range)};
        ret = run_on_image(self, &call);
    }
    PyBuffer_Release(&ranges);
    Py_DECREF(name);
    return ret < 0 ? NULL : Py_NewRef(Py_None);
}

/* copy_bitmap(source, name): source's persistent bitmap `name` stored by
 * the next finish(), read from source now */
static PyObject *image_copy_bitmap(ImageObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"source", "name", NULL};
    PyObject *name = NULL;
    ImageObject *source;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!O&:copy_bitmap", kwlist, Py_TYPE(self),
                                     &source, PyUnicode_FSConverter, &name))
        return NULL;
    struct glue_call call = {.op = GLUE_COPY_BITMAP, .name = PyBytes_AS_STRING(name)};
    int ret = -1;
    if (source == self)
        PyErr_SetString(PyExc_ValueError, "copy_bitmap(): the source is this image");
    else if ((call.dst = image_usable(source))) {
        image_enter(source);
        ret = run_on_image(self, &call);
        image_leave(source);
    }
    Py_DECREF(name);
    return ret < 0 ? NULL : Py_NewRef(Py_None);
}

static PyObject *image_read(ImageObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"offset", "length", NULL};
    struct glue_call call = {.op = GLUE_READ};
    struct ic_image *img;
    if (parse_range(args, kwds, "O&O&:read", kwlist, &call) < 0 || !(img = image_usable(self)))
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

/* ic_image_checkpoint(): what was written so far survives a crash (open
 * with resume=True to carry on) */
static PyObject *image_checkpoint(ImageObject *self, PyObject *unused)
{
    (void)unused;
    struct glue_call call = {.op = GLUE_CHECKPOINT};
    return run_on_image(self, &call) < 0 ? NULL : Py_NewRef(Py_None);
}

static PyObject *image_cache_stats(ImageObject *self, PyObject *unused)
{
    (void)unused;
    struct ic_image *img = image_usable(self);
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
    struct ic_image *img = image_usable(self);
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

/* [member or None, ...] from this image down its backing chain: which
 * member of its archive each image of chain() is */
static PyObject *image_chain_members(ImageObject *self, PyObject *unused)
{
    (void)unused;
    struct ic_image *img = image_usable(self);
    PyObject *list = img ? PyList_New(0) : NULL;
    for (; list && img; img = ic_image_backing(img)) {
        const char *member = ic_image_member(img);
        PyObject *item = member ? PyUnicode_DecodeFSDefault(member) : Py_NewRef(Py_None);
        if (!item || PyList_Append(list, item) < 0)
            Py_CLEAR(list);
        Py_XDECREF(item);
    }
    return list;
}

static PyObject *image_snapshots(ImageObject *self, PyObject *unused)
{
    (void)unused;
    struct ic_image *img = image_usable(self);
    const struct ic_snapshot *snapshots;
    size_t count;
    if (!img)
        return NULL;
    ic_image_snapshots(img, &snapshots, &count);
    return packed_bytes(snapshots, count, sizeof *snapshots);
}

/* [(name, granularity, flags), ...] of the image's persistent bitmaps
 * (flags: BITMAP_IN_USE, BITMAP_AUTO) */
static PyObject *bitmap_list(struct ic_image *img)
{
    size_t n = ic_image_bitmaps(img, NULL, 0);
    struct ic_bitmap *bitmaps = n ? PyMem_Calloc(n, sizeof *bitmaps) : NULL;
    if (n && !bitmaps)
        return PyErr_NoMemory();
    /* as many as there were a moment ago, at most: an image being written
     * drops its bitmaps */
    size_t now = ic_image_bitmaps(img, bitmaps, n);
    if (now < n)
        n = now;
    PyObject *list = PyList_New(0);
    for (size_t i = 0; list && i < n; i++) {
        PyObject *item = Py_BuildValue("(O&KI)", PyUnicode_DecodeFSDefault, bitmaps[i].name,
                                       (unsigned long long)bitmaps[i].granularity,
                                       bitmaps[i].flags);
        if (!item || PyList_Append(list, item) < 0)
            Py_CLEAR(list);
        Py_XDECREF(item);
    }
    PyMem_Free(bitmaps);
    return list;
}

static PyObject *image_bitmaps(ImageObject *self, PyObject *unused)
{
    (void)unused;
    struct ic_image *img = image_usable(self);
    return img ? bitmap_list(img) : NULL;
}

/* An ic_info_field's value as Python's int, bool, str or, for the
 * bitmaps, bitmap_list()'s list */
static PyObject *info_value(struct ic_image *img, const struct ic_info_field *field)
{
    switch (field->kind) {
    case IC_INFO_BOOL:
        return PyBool_FromLong(field->number != 0);
    case IC_INFO_INT:
        return PyLong_FromLongLong(field->number);
    case IC_INFO_BITMAPS:
        return bitmap_list(img);
    case IC_INFO_STRING:
        break;
    }
    return PyUnicode_FromString(field->text);
}

static PyObject *decoded_or_none(const char *text)
{
    return text[0] ? PyUnicode_DecodeFSDefault(text) : Py_NewRef(Py_None);
}

/* What the header of the image at `depth` of the chain (0: this one) says,
 * and its format's facts (imgcopy/_core.pyi: ImageDescription) */
static PyObject *image_describe(ImageObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"depth", NULL};
    unsigned int depth = 0;
    struct ic_image *img = image_usable(self);
    if (!img || !PyArg_ParseTupleAndKeywords(args, kwds, "|I:describe", kwlist, &depth))
        return NULL;
    for (unsigned int d = 0; d < depth && img; d++)
        img = ic_image_backing(img);
    if (!img) {
        PyErr_Format(PyExc_IndexError, "the backing chain has no image at depth %u", depth);
        return NULL;
    }
    struct ic_image_info info;
    ic_image_describe(img, &info);
    PyObject *specific = PyList_New(0);
    for (size_t i = 0; specific && i < info.nfields; i++) {
        PyObject *value = info_value(img, &info.fields[i]);
        PyObject *item = value ? Py_BuildValue("(sO)", info.fields[i].key, value) : NULL;
        if (!item || PyList_Append(specific, item) < 0)
            Py_CLEAR(specific);
        Py_XDECREF(item);
        Py_XDECREF(value);
    }
    PyObject *backing_name = decoded_or_none(info.has_backing ? info.backing_name : "");
    PyObject *backing_format = decoded_or_none(info.backing_format);
    char where[IC_ERROR_PATH_MAX];
    int is_member = 0;
    PyObject *location = !ic_image_backing_location(img, where, sizeof where, &is_member)
                             ? Py_NewRef(Py_None)
                         : is_member ? Py_BuildValue("(O&O&)", PyUnicode_DecodeFSDefault,
                                                     ic_image_path(img), PyUnicode_DecodeFSDefault,
                                                     where)
                                     : Py_BuildValue("(O&O)", PyUnicode_DecodeFSDefault, where,
                                                     Py_None);
    PyObject *result = NULL;
    if (specific && backing_name && backing_format && location)
        result = Py_BuildValue("{s:K,s:O,s:O,s:O,s:O,s:O,s:O,s:O,s:O}",
                               "cluster_size", (unsigned long long)info.cluster_size,
                               "dirty", info.dirty ? Py_True : Py_False,
                               "backing_name", backing_name,
                               "backing_format", backing_format,
                               "backing_location", location,
                               "format_specific", specific,
                               "may_hold_compressed",
                               info.may_hold_compressed ? Py_True : Py_False,
                               "qemu_sees_all_data", info.qemu_sees_all_data ? Py_True : Py_False,
                               "stores_bitmaps", info.stores_bitmaps ? Py_True : Py_False);
    Py_XDECREF(specific);
    Py_XDECREF(backing_name);
    Py_XDECREF(backing_format);
    Py_XDECREF(location);
    return result;
}

static PyObject *image_reads_file(ImageObject *self, PyObject *arg)
{
    struct ic_image *img = image_usable(self);
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
    struct ic_image *img = image_usable(self);
    if (!img)
        return NULL;
    ic_image_drop_cache(img);
    Py_RETURN_NONE;
}


static PyMethodDef image_methods[] = {
    {"close", KEYWORDS(image_close), NULL},
    {"finish", KEYWORDS(image_finish), NULL},
    {"block_status", KEYWORDS(image_block_status), NULL},
    {"map", KEYWORDS(image_map), NULL},
    {"dirty_map", KEYWORDS(image_dirty_map), NULL},
    {"read", KEYWORDS(image_read), NULL},
    {"write", KEYWORDS(image_write), NULL},
    {"zero", KEYWORDS(image_zero), NULL},
    {"flush", (PyCFunction)image_flush, METH_NOARGS, NULL},
    {"checkpoint", (PyCFunction)image_checkpoint, METH_NOARGS, NULL},
    {"cache_stats", (PyCFunction)image_cache_stats, METH_NOARGS, NULL},
    {"drop_cache", (PyCFunction)image_drop_cache, METH_NOARGS, NULL},
    {"reads_file", (PyCFunction)image_reads_file, METH_O, NULL},
    {"snapshots", (PyCFunction)image_snapshots, METH_NOARGS, NULL},
    {"bitmaps", (PyCFunction)image_bitmaps, METH_NOARGS, NULL},
    {"add_bitmap", KEYWORDS(image_add_bitmap), NULL},
    {"copy_bitmap", KEYWORDS(image_copy_bitmap), NULL},
    {"describe", KEYWORDS(image_describe), NULL},
    {"chain", (PyCFunction)image_chain, METH_NOARGS, NULL},
    {"chain_members", (PyCFunction)image_chain_members, METH_NOARGS, NULL},
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

PyType_Spec image_type_spec = {
    .name = "imgcopy._core.Image",
    .basicsize = sizeof(ImageObject),
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = image_slots,
};
