/* A connection to the NBD server made and ended: its handle, the meta
 * contexts it asks for (kept, as a reconnection asks for them again) and
 * the I/O thread that owns it (nbd_conn.c).  The export's data and its
 * dirty bitmaps (nbd_dirty.c) each connect through here. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "nbd_state.h"

int nbd_connect(struct ic_image *img, struct nbd_conn *c, const char *const *contexts,
                struct ic_error *err)
{
    struct nbd_state *st = nbd_state_of(img);
    const struct nbd_lib *lib = st->lib;
    c->st = st;
    c->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (c->wake_fd < 0)
        return ic_error_os(err, errno, img->path, "eventfd");
    if (!(c->h = lib->create()))
        return nbd_handle_error(img, lib, "nbd_create", err);
    size_t n = 0;
    for (const char *const *name = contexts; *name; name++) {
        if (lib->add_meta_context(c->h, *name) < 0)
            return nbd_handle_error(img, lib, "nbd_add_meta_context", err);
        /* kept: a reconnection asks for them again */
        if (n + 1 < sizeof c->contexts / sizeof *c->contexts && !(c->contexts[n++] = strdup(*name)))
            return ic_error_nomem(err);
    }
    if (ic_nbd_prepare_handle(lib, c->h) < 0)
        return nbd_handle_error(img, lib, "cannot set up the NBD handle", err);
    if (lib->connect_uri(c->h, img->path) < 0)
        return nbd_handle_error(img, lib, "cannot connect", err);
    int e = pthread_create(&c->thread, NULL, nbd_conn_thread, c);
    if (e)
        return ic_error_os(err, e, img->path, "start NBD I/O thread");
    c->thread_started = 1;
    pthread_mutex_lock(&st->lock);
    st->nthreads++;
    pthread_mutex_unlock(&st->lock);
    return 0;
}

void nbd_stop_conn(struct nbd_state *st, struct nbd_conn *c)
{
    if (c->thread_started) {
        pthread_mutex_lock(&st->lock);
        c->stop = 1;
        nbd_wake(c);
        pthread_mutex_unlock(&st->lock);
        pthread_join(c->thread, NULL);
    }
    if (c->h) {
        /* nothing in flight: NBD_CMD_DISC, then the socket closed without
         * waiting for the server to close its side (nbdkit takes some 7 ms
         * to end its threads: a copy paid it for each connection); with
         * answers outstanding (a failed copy), they are waited for, as
         * nbdkit before 1.33.10 dies when a client hangs up on replies */
        if (st->lib->aio_in_flight(c->h) != 0 || st->lib->aio_disconnect(c->h, 0) < 0)
            st->lib->shutdown(c->h, 0);
        st->lib->close(c->h);
    }
    if (c->wake_fd >= 0)
        close(c->wake_fd);
    for (size_t i = 0; i < sizeof c->contexts / sizeof *c->contexts; i++)
        free(c->contexts[i]);
}
