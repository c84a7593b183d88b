/* Dirty bitmaps of an NBD export (qemu-nbd -B NAME: the meta context
 * qemu:dirty-bitmap:NAME): which ranges changed since the bitmap began.
 * A meta context is chosen when a connection negotiates, so a bitmap is
 * read on a connection of its own, opened at the first question and kept
 * for the next ones; the export's list of bitmaps comes from option
 * negotiation (NBD_OPT_LIST_META_CONTEXT). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nbd_state.h"

struct names {
    char **items;
    size_t count;
    int failed;
};

static int add_name(void *ctx, const char *name)
{
    struct names *n = ctx;
    size_t skip = strlen(NBD_DIRTY_PREFIX);
    if (strncmp(name, NBD_DIRTY_PREFIX, skip) != 0 || n->failed)
        return 0;
    char **grown = realloc(n->items, (n->count + 1) * sizeof *grown);
    char *copy = grown ? strdup(name + skip) : NULL;
    if (grown)
        n->items = grown;
    if (!copy) {
        n->failed = 1;
        return 0;
    }
    n->items[n->count++] = copy;
    return 0;
}

static void free_names(char **names, size_t count)
{
    for (size_t i = 0; i < count; i++)
        free(names[i]);
    free(names);
}

int nbd_bitmap_names(struct ic_image *img, char ***names, size_t *count, struct ic_error *err)
{
    struct nbd_state *st = nbd_state_of(img);
    const struct nbd_lib *lib = st->lib;
    *names = NULL;
    *count = 0;
    if (!lib->set_opt_mode || !lib->opt_list_meta_context || !lib->opt_abort)
        return ic_error_os(err, ENOTSUP, img->path, "listing an export's dirty bitmaps needs "
                           "libnbd 1.6 or later");
    struct nbd_handle *h = lib->create();
    if (!h)
        return nbd_handle_error(img, lib, "nbd_create", err);
    struct names found = {0};
    int ret = 0;
    /* the namespace asks the server for every bitmap it has */
    if (lib->set_opt_mode(h, 1) < 0 || lib->set_uri_allow_local_file(h, 1) < 0 ||
        lib->add_meta_context(h, NBD_DIRTY_PREFIX) < 0)
        ret = nbd_handle_error(img, lib, "nbd_set_opt_mode", err);
    else if (lib->connect_uri(h, img->path) < 0)
        ret = nbd_handle_error(img, lib, "cannot connect", err);
    else if (lib->opt_list_meta_context(h, (nbd_context_callback){.callback = add_name,
                                                                   .user_data = &found}) < 0)
        ret = nbd_handle_error(img, lib, "listing the export's meta contexts", err);
    else if (found.failed)
        ret = ic_error_nomem(err);
    if (ret == 0)
        (void)lib->opt_abort(h); /* a polite goodbye; the list is in */
    lib->close(h);
    if (ret < 0) {
        free_names(found.items, found.count);
        return -1;
    }
    *names = found.items;
    *count = found.count;
    return 0;
}

/* "a, b, c" of the export's bitmaps, or why there are none */
static void describe_names(struct ic_image *img, char *out, size_t cap)
{
    char **names;
    size_t count;
    struct ic_error ignored = {0};
    if (nbd_bitmap_names(img, &names, &count, &ignored) < 0) {
        snprintf(out, cap, "its bitmaps could not be listed: %.200s", ignored.msg);
        return;
    }
    if (count == 0)
        snprintf(out, cap, "it offers none (qemu-nbd -B NAME exports one)");
    else {
        size_t used = (size_t)snprintf(out, cap, "it offers: ");
        for (size_t i = 0; i < count && used < cap; i++)
            used += (size_t)snprintf(out + used, cap - used, "%s%s", i ? ", " : "", names[i]);
    }
    free_names(names, count);
}

/* The connection that reads `bitmap`, opened if need be */
static int dirty_connection(struct ic_image *img, const char *bitmap, struct ic_error *err)
{
    struct nbd_state *st = nbd_state_of(img);
    if (st->dirty_name && strcmp(st->dirty_name, bitmap) == 0)
        return 0;
    nbd_dirty_close(st);
    size_t len = strlen(NBD_DIRTY_PREFIX) + strlen(bitmap) + 1;
    char *context = malloc(len);
    if (!context)
        return ic_error_nomem(err);
    snprintf(context, len, "%s%s", NBD_DIRTY_PREFIX, bitmap);
    const char *const contexts[] = {context, NULL};
    int ret = nbd_connect(img, &st->dirty, contexts, err);
    if (ret == 0 && st->lib->can_meta_context(st->dirty.h, context) != 1) {
        char offered[512];
        describe_names(img, offered, sizeof offered);
        ret = ic_error_value(err, "%s: the NBD export has no dirty bitmap '%s': %s", img->path,
                             bitmap, offered);
    }
    free(context);
    if (ret == 0 && !(st->dirty_name = strdup(bitmap)))
        ret = ic_error_nomem(err);
    if (ret < 0)
        nbd_dirty_close(st);
    return ret;
}

void nbd_dirty_close(struct nbd_state *st)
{
    if (st->dirty.h || st->dirty.wake_fd >= 0)
        nbd_stop_conn(st, &st->dirty);
    memset(&st->dirty, 0, sizeof st->dirty);
    st->dirty.wake_fd = -1;
    free(st->dirty_name);
    st->dirty_name = NULL;
}

static int push(struct ic_extent_list *out, uint64_t start, uint64_t len, unsigned flags,
                struct ic_error *err)
{
    struct ic_extent e = {.start = start, .length = len, .flags = flags};
    if (out->count && out->items[out->count - 1].flags == flags &&
        out->items[out->count - 1].start + out->items[out->count - 1].length == start) {
        out->items[out->count - 1].length += len;
        return 0;
    }
    return ic_extent_list_push(out, &e) < 0 ? ic_error_nomem(err) : 0;
}

/* Extents from `start` as far as the server answers (not past `end`),
 * IC_EXT_DIRTY where the bitmap says the range changed. */
int nbd_dirty_status(struct ic_image *img, const char *bitmap, uint64_t start, uint64_t end,
                     struct ic_extent_list *out, struct ic_error *err)
{
    struct nbd_state *st = nbd_state_of(img);
    if (dirty_connection(img, bitmap, err) < 0)
        return -1;
    uint64_t len = end - start < NBD_MAX_STATUS ? end - start : NBD_MAX_STATUS;
    struct nbd_request r = {.op = OP_STATUS, .off = start, .len = len};
    int e = nbd_run_waited(st, &r, &st->dirty);
    int ret = 0;
    if (e) {
        ret = nbd_request_error(img, OP_STATUS, start, e, err);
    } else if (!r.nalloc) {
        ret = ic_error_os(err, EIO, img->path, "the NBD server answered no dirty bitmap '%s' "
                          "at offset %" PRIu64, bitmap, start);
    } else {
        uint64_t pos = start;
        for (size_t i = 0; i + 1 < r.nalloc && pos < start + len && ret == 0; i += 2) {
            uint64_t n = r.alloc[i];
            if (n == 0)
                break; /* a broken answer: what came before it stands */
            if (n > start + len - pos)
                n = start + len - pos;
            ret = push(out, pos, n, (r.alloc[i + 1] & NBD_STATE_DIRTY) ? IC_EXT_DIRTY : 0, err);
            pos += n;
        }
        if (ret == 0 && pos == start)
            ret = ic_error_os(err, EIO, img->path, "the NBD server's dirty bitmap '%s' answer "
                              "at offset %" PRIu64 " is empty", bitmap, start);
    }
    free(r.alloc);
    free(r.depth);
    return ret;
}
