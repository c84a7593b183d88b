/* The NBD protocol (nbd://, nbd+unix://, nbds://, ... URIs) through
 * libnbd, loaded at run time (nbd_lib.c).
 *
 * A libnbd handle serialises its synchronous calls, and every request
 * costs a round trip, so requests are asynchronous: each connection has
 * one I/O thread that owns its handle, submits the requests callers queue
 * and polls the socket.  Reads, block status and flushes wait for their
 * reply; writes and zeroes do not: a write's bytes are copied, and the
 * caller goes on while up to NBD_BYTES_IN_FLIGHT bytes travel.  Their
 * first failure (the lowest offset of those in flight) is kept and returned by
 * every later call and by flush and finish, so a failed write can never
 * end in a reported success.  Several connections are used when the
 * server allows it (multi-conn). */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../error.h"
#include "../image.h"
#include "nbd_lib.h"

/* Bytes of writes in flight before a writer waits (nbdcopy: 64 requests) */
#define NBD_BYTES_IN_FLIGHT (64u << 20)
#define NBD_MAX_CONNECTIONS 16
/* A request's length field is 32 bits; zero requests stay aligned */
#define NBD_MAX_ZERO (UINT32_MAX & ~(uint64_t)((1u << 20) - 1))
#define NBD_MAX_STATUS (UINT32_MAX & ~(uint64_t)((1u << 20) - 1))

enum nbd_op { OP_READ, OP_WRITE, OP_ZERO, OP_FLUSH, OP_STATUS };

struct nbd_state;

struct nbd_request {
    enum nbd_op op;
    struct nbd_state *st;
    void *buf; /* read into; a write's own copy (freed at completion) */
    uint64_t off, len;
    uint32_t flags;
    int refused;  /* libnbd refused it: it never went out (a dead connection) */
    struct nbd_conn *conn; /* the connection it went to */
    int waited; /* the caller waits: it frees the request */
    int done;
    int error;
    /* block status: the answer, per context */
    uint32_t *alloc, *depth;
    size_t nalloc, ndepth;
    struct nbd_request *next;
};

struct nbd_conn {
    struct nbd_state *st;
    struct nbd_handle *h;
    int shut; /* aborted: its socket shut down (by its I/O thread) */
    pthread_t thread;
    int thread_started;
    int wake_fd;
    /* under st->lock */
    struct nbd_request *head, *tail;
    int stop;
    /* unwaited requests that failed, held until published (settle) */
    struct nbd_request *failures;
    int settled; /* dead, or its thread gone */
};

struct nbd_state {
    const struct nbd_lib *lib;
    struct nbd_conn conns[NBD_MAX_CONNECTIONS];
    unsigned nconns;    /* connected (under lock once the first runs) */
    unsigned nactive;   /* of them, those requests go to */
    unsigned next_conn;
    unsigned max_requests; /* in flight per connection */
    int multi_conn;
    uint64_t min_block, pref_block, max_block;
    int can_zero, can_fast_zero, can_flush, has_alloc, has_depth;
    _Atomic uint32_t deepest; /* the deepest allocation-depth answered */
    pthread_mutex_t lock;
    pthread_cond_t changed; /* a request completed */
    uint64_t bytes_in_flight;
    unsigned unwaited; /* writes and zeroes not completed yet */
    unsigned nthreads;  /* connections whose I/O thread started */
    unsigned nsettled;  /* of them, dead or gone */
    int dying;          /* a connection died: the others are shut down */
    atomic_uint held;   /* failures not yet published */
    int unflushed;     /* written or zeroed since the last flush */
    int aborted;       /* nbd_abort: every request fails at once */
    /* the first failure of a request nobody waited for (first_failure) */
    int failed_errno;
    enum nbd_op failed_op;
    uint64_t failed_off;
    int failed_refused;
    void *zeros; /* max_block zero bytes, for servers without WRITE_ZEROES */
};

static struct nbd_state *nbd_state_of(struct ic_image *img)
{
    return img->drv_state;
}

static const char *const op_names[] = {
    [OP_READ] = "read", [OP_WRITE] = "write", [OP_ZERO] = "zero",
    [OP_FLUSH] = "flush", [OP_STATUS] = "block status",
};

static int request_error(struct ic_image *img, enum nbd_op op, uint64_t off, int errnum,
                         struct ic_error *err)
{
    return ic_error_os(err, errnum ? errnum : EIO, img->path, "NBD %s at offset %" PRIu64,
                       op_names[op], off);
}

static int handle_error(struct ic_image *img, const struct nbd_lib *lib, const char *what,
                        struct ic_error *err)
{
    int errnum = lib->get_errno();
    const char *msg = lib->get_error();
    return ic_error_os(err, errnum ? errnum : EIO, img->path, "%s: %s", what,
                       msg ? msg : "libnbd failed");
}

/* ---- the I/O thread of a connection ------------------------------------ */

static void wake(struct nbd_conn *c);

/* An unwaited request is over (st->lock held): it frees its room. */
static void retire_locked(struct nbd_state *st, struct nbd_request *r)
{
    if (r->op == OP_WRITE)
        st->bytes_in_flight -= r->len;
    st->unwaited--;
    free(r->buf);
    free(r);
}

/* Runs on the connection's I/O thread only (libnbd's callbacks, a refused
 * submission).  A failed unwaited request is held back (settle): a
 * connection that dies fails everything in flight in one libnbd call, in
 * libnbd's order, and when a server dies every connection does; the
 * failure kept must be the first of them (first_failure), not whichever
 * libnbd reported first. */
static void complete(struct nbd_request *r, int error)
{
    struct nbd_state *st = r->st;
    pthread_mutex_lock(&st->lock);
    if (r->waited) {
        r->error = error;
        r->done = 1;
    } else if (error) {
        r->error = error;
        r->next = r->conn->failures;
        r->conn->failures = r;
        atomic_fetch_add(&st->held, 1);
    } else {
        retire_locked(st, r);
    }
    pthread_cond_broadcast(&st->changed);
    pthread_mutex_unlock(&st->lock);
}

/* Whether failed request `r` says better what went wrong than the failure
 * kept so far: one that went out (was in flight when the server failed or
 * died) over one libnbd refused afterwards, then the lowest offset. */
static int first_failure(const struct nbd_state *st, const struct nbd_request *r)
{
    if (!st->failed_errno || r->refused != st->failed_refused)
        return !st->failed_errno || !r->refused;
    return r->off < st->failed_off;
}

/* Every held failure at once (st->lock held): the first (first_failure)
 * is kept, also against a failure kept before; then their room is freed,
 * so that nobody sees the room before the failure. */
static void publish_locked(struct nbd_state *st)
{
    for (unsigned i = 0; i < NBD_MAX_CONNECTIONS; i++) {
        struct nbd_conn *c = &st->conns[i];
        while (c->failures) {
            struct nbd_request *r = c->failures;
            c->failures = r->next;
            if (first_failure(st, r)) {
                st->failed_errno = r->error;
                st->failed_op = r->op;
                st->failed_off = r->off;
                st->failed_refused = r->refused;
            }
            atomic_fetch_sub(&st->held, 1);
            retire_locked(st, r);
        }
    }
    pthread_cond_broadcast(&st->changed);
}

/* After each libnbd call of the I/O thread (and as it exits).  The
 * failures of a live connection are published at once; once one has
 * died, the others are shut down too (see the loop) and nothing is
 * published until every connection has settled (is dead, or its thread
 * gone), so that the failure kept is the first of them all. */
static void settle(struct nbd_conn *c, int exiting)
{
    struct nbd_state *st = c->st;
    const struct nbd_lib *lib = st->lib;
    int died = !exiting && (lib->aio_is_dead(c->h) || lib->aio_is_closed(c->h));
    int settles = (died || exiting) && !c->settled; /* only this thread sets it */
    if (!atomic_load(&st->held) && !settles)
        return;
    pthread_mutex_lock(&st->lock);
    if (settles) {
        c->settled = 1;
        st->nsettled++;
        if (died && !st->dying) {
            st->dying = 1;
            for (unsigned i = 0; i < st->nconns; i++)
                if (&st->conns[i] != c && st->conns[i].thread_started)
                    wake(&st->conns[i]);
        }
    }
    if (!st->dying || st->nsettled == st->nthreads || exiting)
        publish_locked(st);
    pthread_mutex_unlock(&st->lock);
}

static int on_complete(void *user_data, int *error)
{
    complete(user_data, *error);
    return 1; /* retire the command */
}

static int on_extents(void *user_data, const char *context, uint64_t offset,
                      uint32_t *entries, size_t count, int *error)
{
    (void)offset;
    (void)error;
    struct nbd_request *r = user_data;
    uint32_t **into = strcmp(context, "base:allocation") == 0 ? &r->alloc
                      : strcmp(context, "qemu:allocation-depth") == 0 ? &r->depth
                                                                     : NULL;
    size_t *n = into == &r->alloc ? &r->nalloc : &r->ndepth;
    if (!into || *into || !count)
        return 0; /* another context, or a second answer: ignored */
    if (!(*into = malloc(count * sizeof *entries)))
        return 0; /* treated as no answer: everything reads as data */
    memcpy(*into, entries, count * sizeof *entries);
    *n = count & ~(size_t)1;
    return 0;
}

static void submit(struct nbd_conn *c, struct nbd_request *r)
{
    const struct nbd_lib *lib = c->st->lib;
    nbd_completion_callback done = {.callback = on_complete, .user_data = r};
    int64_t cookie = -1;
    switch (r->op) {
    case OP_READ:
        cookie = lib->aio_pread(c->h, r->buf, (size_t)r->len, r->off, done, 0);
        break;
    case OP_WRITE:
        cookie = lib->aio_pwrite(c->h, r->buf, (size_t)r->len, r->off, done, 0);
        break;
    case OP_ZERO:
        cookie = lib->aio_zero(c->h, r->len, r->off, done, r->flags);
        break;
    case OP_FLUSH:
        cookie = lib->aio_flush(c->h, done, 0);
        break;
    case OP_STATUS: {
        nbd_extent_callback extents = {.callback = on_extents, .user_data = r};
        cookie = lib->aio_block_status(c->h, r->len, r->off, extents, done, 0);
        break;
    }
    }
    if (cookie < 0) { /* refused before it was sent: libnbd calls no callback */
        r->refused = 1;
        complete(r, lib->get_errno() ? lib->get_errno() : EIO);
    }
}

/* An aborted connection's socket is shut down by its own thread (the
 * descriptor is libnbd's, valid while the handle lives): the thread then
 * reads its end, libnbd fails every request in flight (their callbacks run
 * as usual: nothing leaks, nobody waits on) and the handle is dead, so
 * later requests fail at once and closing waits for nothing. */
static void shut_down(struct nbd_conn *c)
{
    const struct nbd_lib *lib = c->st->lib;
    int fd = lib->aio_get_fd(c->h);
    if (fd >= 0)
        (void)shutdown(fd, SHUT_RDWR); /* ENOTCONN: the server went first */
    c->shut = 1;
}

/* Only this thread calls libnbd on its handle (completions run here too),
 * so the handle's lock and st->lock are never taken in both orders. */
static void *conn_thread(void *arg)
{
    struct nbd_conn *c = arg;
    struct nbd_state *st = c->st;
    const struct nbd_lib *lib = st->lib;
    for (;;) {
        int alive = !lib->aio_is_dead(c->h) && !lib->aio_is_closed(c->h);
        int64_t in_flight = alive ? lib->aio_in_flight(c->h) : 0;
        /* what the queue holds, as far as the requests in flight allow (a
         * dead connection fails them all at once) */
        struct nbd_request *batch = NULL, **last = &batch;
        pthread_mutex_lock(&st->lock);
        while (c->head && (!alive || in_flight < (int64_t)st->max_requests)) {
            *last = c->head;
            c->head = c->head->next;
            last = &(*last)->next;
            in_flight++;
        }
        *last = NULL;
        if (!c->head)
            c->tail = NULL;
        int stop = c->stop && !c->head;
        /* cancelled, or another connection died: this one goes down too */
        int down = st->aborted || st->dying;
        pthread_mutex_unlock(&st->lock);
        if (down && alive && !c->shut)
            shut_down(c);
        while (batch) {
            struct nbd_request *next = batch->next;
            batch->next = NULL;
            submit(c, batch);
            batch = next;
        }
        settle(c, 0);
        alive = !lib->aio_is_dead(c->h) && !lib->aio_is_closed(c->h);
        if (stop && (!alive || lib->aio_in_flight(c->h) == 0))
            break;
        struct pollfd fds[2] = {{.fd = c->wake_fd, .events = POLLIN}, {.fd = -1}};
        if (alive) {
            unsigned dir = lib->aio_get_direction(c->h);
            fds[1].fd = lib->aio_get_fd(c->h);
            fds[1].events = (short)(((dir & NBD_DIRECTION_READ) ? POLLIN : 0) |
                                    ((dir & NBD_DIRECTION_WRITE) ? POLLOUT : 0));
        }
        if (poll(fds, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            break; /* cannot happen with valid descriptors */
        }
        if (fds[0].revents & POLLIN) {
            uint64_t n;
            if (read(c->wake_fd, &n, sizeof n) < 0 && errno != EAGAIN)
                break;
        }
        /* a hang-up or error is read: libnbd then fails what is in flight */
        if (fds[1].revents & (POLLIN | POLLHUP | POLLERR))
            lib->aio_notify_read(c->h);
        else if (fds[1].revents & POLLOUT)
            lib->aio_notify_write(c->h);
        settle(c, 0);
    }
    settle(c, 1);
    return NULL;
}

static void wake(struct nbd_conn *c)
{
    uint64_t one = 1;
    /* a full counter (never here) still wakes the thread */
    if (write(c->wake_fd, &one, sizeof one) < 0 && errno != EAGAIN)
        abort();
}

/* Queue `r` on a connection, round robin; st->lock is held. */
static void enqueue_locked(struct nbd_state *st, struct nbd_request *r)
{
    struct nbd_conn *c = &st->conns[st->next_conn++ % st->nactive];
    r->st = st;
    r->conn = c;
    if (c->tail)
        c->tail->next = r;
    else
        c->head = r;
    c->tail = r;
    wake(c);
}

/* Run `r` and wait for its reply: 0, or its errno */
static int run_waited(struct nbd_state *st, struct nbd_request *r, struct nbd_conn *on)
{
    r->waited = 1;
    r->st = st;
    pthread_mutex_lock(&st->lock);
    if (st->aborted) {
        pthread_mutex_unlock(&st->lock);
        return ECANCELED;
    }
    if (on) {
        r->conn = on;
        if (on->tail)
            on->tail->next = r;
        else
            on->head = r;
        on->tail = r;
        wake(on);
    } else {
        enqueue_locked(st, r);
    }
    while (!r->done)
        pthread_cond_wait(&st->changed, &st->lock);
    pthread_mutex_unlock(&st->lock);
    return r->error;
}

/* The first failure of a write or zero nobody waited for, as an error */
static int failed(struct ic_image *img, struct ic_error *err)
{
    struct nbd_state *st = nbd_state_of(img);
    pthread_mutex_lock(&st->lock);
    int errnum = st->failed_errno;
    enum nbd_op op = st->failed_op;
    uint64_t off = st->failed_off;
    pthread_mutex_unlock(&st->lock);
    return errnum ? request_error(img, op, off, errnum, err) : 0;
}

/* Queue a write or zero nobody waits for, once the bytes in flight allow */
static int queue_unwaited(struct ic_image *img, struct nbd_request *r, struct ic_error *err)
{
    struct nbd_state *st = nbd_state_of(img);
    pthread_mutex_lock(&st->lock);
    while (((r->op == OP_WRITE && st->bytes_in_flight &&
             st->bytes_in_flight + r->len > NBD_BYTES_IN_FLIGHT) ||
            st->unwaited >= st->max_requests * st->nactive) &&
           !st->failed_errno && !st->aborted)
        pthread_cond_wait(&st->changed, &st->lock);
    if (st->failed_errno || st->aborted) {
        int aborted = !st->failed_errno;
        enum nbd_op op = r->op;
        uint64_t off = r->off;
        pthread_mutex_unlock(&st->lock);
        free(r->buf);
        free(r);
        return aborted ? request_error(img, op, off, ECANCELED, err) : failed(img, err);
    }
    if (r->op == OP_WRITE)
        st->bytes_in_flight += r->len;
    st->unwaited++;
    st->unflushed = 1;
    enqueue_locked(st, r);
    pthread_mutex_unlock(&st->lock);
    return 0;
}

/* Wait until every write and zero has its reply; their first failure */
static int drain(struct ic_image *img, struct ic_error *err)
{
    struct nbd_state *st = nbd_state_of(img);
    pthread_mutex_lock(&st->lock);
    while (st->unwaited)
        pthread_cond_wait(&st->changed, &st->lock);
    pthread_mutex_unlock(&st->lock);
    return failed(img, err);
}

/* ---- opening ------------------------------------------------------------ */

static void stop_conn(struct nbd_state *st, struct nbd_conn *c)
{
    if (c->thread_started) {
        pthread_mutex_lock(&st->lock);
        c->stop = 1;
        wake(c);
        pthread_mutex_unlock(&st->lock);
        pthread_join(c->thread, NULL);
    }
    if (c->h) {
        st->lib->shutdown(c->h, 0);
        st->lib->close(c->h);
    }
    if (c->wake_fd >= 0)
        close(c->wake_fd);
}

static void nbd_close_image(struct ic_image *img)
{
    struct nbd_state *st = nbd_state_of(img);
    if (!st)
        return;
    for (unsigned i = 0; i < st->nconns; i++)
        stop_conn(st, &st->conns[i]);
    pthread_mutex_destroy(&st->lock);
    pthread_cond_destroy(&st->changed);
    free(st->zeros);
    free(st);
    img->drv_state = NULL;
}

static int connect_one(struct ic_image *img, struct nbd_conn *c, struct ic_error *err)
{
    struct nbd_state *st = nbd_state_of(img);
    const struct nbd_lib *lib = st->lib;
    c->st = st;
    c->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (c->wake_fd < 0)
        return ic_error_os(err, errno, img->path, "eventfd");
    if (!(c->h = lib->create()))
        return handle_error(img, lib, "nbd_create", err);
    if (lib->add_meta_context(c->h, "base:allocation") < 0 ||
        lib->add_meta_context(c->h, "qemu:allocation-depth") < 0)
        return handle_error(img, lib, "nbd_add_meta_context", err);
    /* the URI is the caller's own: its files (tls-psk-file, tls-certificates)
     * may be read, as qemu-img and nbdcopy read them */
    if (lib->set_uri_allow_local_file(c->h, 1) < 0)
        return handle_error(img, lib, "nbd_set_uri_allow_local_file", err);
    if (lib->connect_uri(c->h, img->path) < 0)
        return handle_error(img, lib, "cannot connect", err);
    int e = pthread_create(&c->thread, NULL, conn_thread, c);
    if (e)
        return ic_error_os(err, e, img->path, "start NBD I/O thread");
    c->thread_started = 1;
    pthread_mutex_lock(&st->lock);
    st->nthreads++;
    pthread_mutex_unlock(&st->lock);
    return 0;
}

static uint64_t block_size(const struct nbd_lib *lib, struct nbd_handle *h, int which,
                           uint64_t otherwise)
{
    int64_t n = lib->get_block_size(h, which);
    return n > 0 ? (uint64_t)n : otherwise;
}

static int nbd_open(struct ic_image *img, const char *uri, struct ic_error *err)
{
    const struct nbd_lib *lib = ic_nbd_lib(uri, err);
    if (!lib)
        return -1;
    struct nbd_state *st = calloc(1, sizeof *st);
    if (!st)
        return ic_error_nomem(err);
    st->lib = lib;
    pthread_mutex_init(&st->lock, NULL);
    pthread_cond_init(&st->changed, NULL);
    atomic_init(&st->held, 0);
    for (unsigned i = 0; i < NBD_MAX_CONNECTIONS; i++)
        st->conns[i].wake_fd = -1;
    img->drv_state = st;
    st->nconns = 1;
    if (connect_one(img, &st->conns[0], err) < 0)
        return -1;
    struct nbd_handle *h = st->conns[0].h;
    int64_t size = lib->get_size(h);
    if (size < 0)
        return handle_error(img, lib, "nbd_get_size", err);
    img->size = (uint64_t)size;
    int writable = (img->open_flags & IC_OPEN_RDWR) != 0;
    if (writable && lib->is_read_only(h) == 1)
        return ic_error_os(err, EROFS, img->path, "the NBD export is read-only");
    st->max_requests = 64;
    st->multi_conn = lib->can_multi_conn(h) == 1;
    st->min_block = block_size(lib, h, NBD_SIZE_MINIMUM, 1);
    st->pref_block = block_size(lib, h, NBD_SIZE_PREFERRED, 4096);
    st->max_block = block_size(lib, h, NBD_SIZE_MAXIMUM, 32u << 20);
    if (st->max_block > (32u << 20))
        st->max_block = 32u << 20; /* libnbd refuses larger payloads */
    st->can_zero = lib->can_zero(h) == 1;
    st->can_fast_zero = lib->can_fast_zero(h) == 1;
    st->can_flush = lib->can_flush(h) == 1;
    st->has_alloc = lib->can_meta_context(h, "base:allocation") == 1;
    st->has_depth = lib->can_meta_context(h, "qemu:allocation-depth") == 1;
    st->nactive = 1;
    return 0;
}

/* A copy's connections and requests in flight.  More than one connection
 * only where the server says they see each other's writes (multi-conn);
 * the default then is 4. */
static int nbd_tune(struct ic_image *img, unsigned connections, unsigned requests,
                    struct ic_error *err)
{
    struct nbd_state *st = nbd_state_of(img);
    unsigned want = !st->multi_conn ? 1 : connections ? connections : 4;
    if (want > NBD_MAX_CONNECTIONS)
        want = NBD_MAX_CONNECTIONS;
    pthread_mutex_lock(&st->lock);
    unsigned have = st->nconns;
    if (requests)
        st->max_requests = requests;
    pthread_mutex_unlock(&st->lock);
    for (unsigned i = have; i < want; i++) {
        /* connected outside the lock: requests keep going to the others */
        int r = connect_one(img, &st->conns[i], err);
        pthread_mutex_lock(&st->lock);
        st->nconns = i + 1; /* closed with the rest, even half made */
        pthread_mutex_unlock(&st->lock);
        if (r < 0)
            return -1;
    }
    pthread_mutex_lock(&st->lock);
    st->nactive = want;
    pthread_cond_broadcast(&st->changed); /* a writer may have room now */
    pthread_mutex_unlock(&st->lock);
    return 0;
}

/* Cancelled: every connection is shut down instead of drained (see
 * shut_down); requests not yet queued fail at once. */
static void nbd_abort(struct ic_image *img)
{
    struct nbd_state *st = nbd_state_of(img);
    pthread_mutex_lock(&st->lock);
    st->aborted = 1;
    for (unsigned i = 0; i < st->nconns; i++)
        if (st->conns[i].thread_started)
            wake(&st->conns[i]);
    pthread_cond_broadcast(&st->changed); /* writers waiting for room */
    pthread_mutex_unlock(&st->lock);
}

static int nbd_create(struct ic_image *img, const char *path, int *fresh, struct ic_error *err)
{
    uint64_t wanted = img->size;
    if (nbd_open(img, path, err) < 0)
        return -1;
    if (img->size < wanted)
        return ic_error_os(err, ENOSPC, img->path,
                           "the NBD export holds %" PRIu64 " bytes, fewer than the %" PRIu64
                           " to write",
                           img->size, wanted);
    *fresh = 0; /* an existing disk: only what the caller knows says it is zero */
    return 0;
}

/* ---- I/O ---------------------------------------------------------------- */

static int read_aligned(struct ic_image *img, void *buf, size_t len, uint64_t off,
                        struct ic_error *err)
{
    struct nbd_state *st = nbd_state_of(img);
    for (size_t done = 0; done < len;) {
        size_t n = len - done < st->max_block ? len - done : (size_t)st->max_block;
        struct nbd_request r = {.op = OP_READ, .buf = (char *)buf + done, .off = off + done,
                                .len = n};
        int e = run_waited(st, &r, NULL);
        if (e)
            return request_error(img, OP_READ, off + done, e, err);
        done += n;
    }
    return 0;
}

/* A read the server's minimum block size does not divide (probing reads
 * 512 bytes) reads the whole blocks around it. */
static int nbd_pread(struct ic_image *img, void *buf, size_t len, uint64_t off,
                     struct ic_error *err)
{
    struct nbd_state *st = nbd_state_of(img);
    uint64_t unit = st->min_block;
    if (unit <= 1 || (off % unit == 0 && len % unit == 0))
        return read_aligned(img, buf, len, off, err);
    uint64_t start = off / unit * unit, end = (off + len + unit - 1) / unit * unit;
    if (end > img->size) /* an export's size should be whole blocks; if not, its tail */
        end = img->size;
    uint8_t *bounce = malloc((size_t)(end - start));
    if (!bounce)
        return ic_error_nomem(err);
    int r = read_aligned(img, bounce, (size_t)(end - start), start, err);
    if (r == 0)
        memcpy(buf, bounce + (off - start), len);
    free(bounce);
    return r;
}

static int nbd_pwrite(struct ic_image *img, const void *buf, size_t len, uint64_t off,
                      struct ic_error *err)
{
    struct nbd_state *st = nbd_state_of(img);
    for (size_t done = 0; done < len;) {
        size_t n = len - done < st->max_block ? len - done : (size_t)st->max_block;
        struct nbd_request *r = calloc(1, sizeof *r);
        void *copy = r ? malloc(n) : NULL;
        if (!copy) {
            free(r);
            return ic_error_nomem(err);
        }
        memcpy(copy, (const char *)buf + done, n);
        *r = (struct nbd_request){.op = OP_WRITE, .buf = copy, .off = off + done, .len = n};
        if (queue_unwaited(img, r, err) < 0)
            return -1;
        done += n;
    }
    return 0;
}

static int nbd_zero(struct ic_image *img, uint64_t off, uint64_t len, unsigned flags,
                    struct ic_error *err)
{
    struct nbd_state *st = nbd_state_of(img);
    if (!st->can_zero || ((flags & IC_ZERO_FAST) && !st->can_fast_zero)) {
        if (flags & IC_ZERO_FAST)
            return ic_error_os(err, ENOTSUP, img->path, "no fast way to zero");
        if (!st->zeros && !(st->zeros = calloc(1, (size_t)st->max_block)))
            return ic_error_nomem(err);
        for (uint64_t done = 0; done < len;) {
            uint64_t n = len - done < st->max_block ? len - done : st->max_block;
            if (nbd_pwrite(img, st->zeros, (size_t)n, off + done, err) < 0)
                return -1;
            done += n;
        }
        return 0;
    }
    uint32_t nbd_flags = (flags & IC_ZERO_MAY_UNMAP ? 0 : NBD_FLAG_NO_HOLE) |
                         (flags & IC_ZERO_FAST ? NBD_FLAG_FAST_ZERO : 0);
    for (uint64_t done = 0; done < len;) {
        uint64_t n = len - done < NBD_MAX_ZERO ? len - done : NBD_MAX_ZERO;
        struct nbd_request *r = calloc(1, sizeof *r);
        if (!r)
            return ic_error_nomem(err);
        *r = (struct nbd_request){.op = OP_ZERO, .off = off + done, .len = n, .flags = nbd_flags};
        if (queue_unwaited(img, r, err) < 0)
            return -1;
        done += n;
    }
    return 0;
}

static int nbd_flush(struct ic_image *img, struct ic_error *err)
{
    struct nbd_state *st = nbd_state_of(img);
    if (drain(img, err) < 0)
        return -1;
    pthread_mutex_lock(&st->lock);
    int unflushed = st->unflushed;
    st->unflushed = 0;
    pthread_mutex_unlock(&st->lock);
    if (!st->can_flush || !unflushed)
        return 0; /* each flush is a round trip per connection */
    for (unsigned i = 0; i < st->nconns; i++) {
        struct nbd_request r = {.op = OP_FLUSH};
        int e = run_waited(st, &r, &st->conns[i]);
        if (e) {
            pthread_mutex_lock(&st->lock);
            st->unflushed = 1;
            pthread_mutex_unlock(&st->lock);
            return request_error(img, OP_FLUSH, 0, e, err);
        }
    }
    return 0;
}

static int nbd_finish(struct ic_image *img, int sync, struct ic_error *err)
{
    return sync ? nbd_flush(img, err) : drain(img, err);
}

/* ---- block status ------------------------------------------------------- */

/* As qemu reports a protocol's extents: the host offset is the guest's */
static int push(struct ic_extent_list *out, uint64_t start, uint64_t len, unsigned flags,
                uint32_t depth, struct ic_error *err)
{
    struct ic_extent e = {.start = start, .length = len, .flags = flags | IC_EXT_OFFSET_VALID,
                          .host_offset = start, .depth = depth};
    return ic_extent_list_push(out, &e) < 0 ? ic_error_nomem(err) : 0;
}

/* qemu:allocation-depth says where in the server's backing chain a range
 * is allocated (n: the n-th image, 0: nowhere).  Without it, everything is
 * the export's own, as for a file. */
static unsigned chain_flags(int known, uint32_t depth)
{
    return !known || depth > 0 ? IC_EXT_PRESENT : 0;
}

/* A range allocated nowhere has the depth of the chain's last image, as
 * qemu-img map of the image says; the export does not tell its chain's
 * length, so the deepest allocation seen stands for it. */
static uint32_t chain_depth(struct nbd_state *st, int known, uint32_t depth)
{
    if (!known)
        return 0;
    if (depth > 0) {
        uint32_t seen = atomic_load(&st->deepest);
        while (depth > seen && !atomic_compare_exchange_weak(&st->deepest, &seen, depth))
            ;
        return depth - 1;
    }
    uint32_t deepest = atomic_load(&st->deepest);
    return deepest > 0 ? deepest - 1 : 0;
}

/* base:allocation (hole, zero) and qemu:allocation-depth (0: unallocated,
 * n: in the n-th image of the chain) merged into extents from `start` */
static int nbd_block_status(struct ic_image *img, uint64_t start, uint64_t end, uint64_t want,
                            struct ic_extent_list *out, struct ic_error *err)
{
    (void)want;
    struct nbd_state *st = nbd_state_of(img);
    if (!st->has_alloc && !st->has_depth)
        return push(out, start, end - start, IC_EXT_DATA | IC_EXT_PRESENT, 0, err);
    uint64_t len = end - start < NBD_MAX_STATUS ? end - start : NBD_MAX_STATUS;
    struct nbd_request r = {.op = OP_STATUS, .off = start, .len = len};
    int e = run_waited(st, &r, NULL);
    int ret = 0;
    if (e || (!r.nalloc && !r.ndepth)) {
        /* a failed answer degrades to "data", as nbdcopy does */
        ret = push(out, start, len, IC_EXT_DATA | IC_EXT_PRESENT, 0, err);
    } else {
        uint64_t pos = start, limit = start + len;
        size_t ia = 0, id = 0;
        uint64_t a_end = start, d_end = start;
        uint32_t a_flags = 0, depth = 1;
        while (pos < limit && ret == 0) {
            if (r.nalloc && pos >= a_end) {
                if (ia >= r.nalloc)
                    break;
                a_end = pos + r.alloc[ia];
                a_flags = r.alloc[ia + 1];
                ia += 2;
            }
            if (r.ndepth && pos >= d_end) {
                if (id >= r.ndepth)
                    break;
                d_end = pos + r.depth[id];
                depth = r.depth[id + 1];
                id += 2;
            }
            uint64_t next = limit;
            if (r.nalloc && a_end < next)
                next = a_end;
            if (r.ndepth && d_end < next)
                next = d_end;
            if (next <= pos)
                break; /* a zero-length entry: a broken answer, stop here */
            unsigned flags = 0;
            if (!r.nalloc || !(a_flags & NBD_STATE_HOLE))
                flags |= IC_EXT_DATA;
            if (r.nalloc && (a_flags & NBD_STATE_ZERO))
                flags |= IC_EXT_ZERO;
            ret = push(out, pos, next - pos, flags | chain_flags(r.ndepth != 0, depth),
                       chain_depth(st, r.ndepth != 0, depth), err);
            pos = next;
        }
        if (ret == 0 && pos == start) /* nothing usable */
            ret = push(out, start, len, IC_EXT_DATA | IC_EXT_PRESENT, 0, err);
    }
    free(r.alloc);
    free(r.depth);
    return ret;
}

static uint64_t nbd_preferred_size(const struct ic_image *img)
{
    const struct nbd_state *st = img->drv_state;
    return st->pref_block > 4096 ? st->pref_block : 0; /* 4 KiB: imgcopy's own floor */
}

static uint64_t nbd_zero_limit(const struct ic_image *img)
{
    const struct nbd_state *st = img->drv_state;
    uint64_t unit = st->min_block > 1 ? st->min_block : 1;
    return NBD_MAX_ZERO / unit * unit;
}

static uint64_t nbd_write_alignment(const struct ic_image *img)
{
    const struct nbd_state *st = img->drv_state;
    return st && st->min_block > 1 ? st->min_block : 1;
}

const struct ic_driver ic_protocol_nbd = {
    .name = "nbd",
    .kind = IC_PROTOCOL,
    .open_protocol = nbd_open,
    .create_protocol = nbd_create,
    .close = nbd_close_image,
    .pread = nbd_pread,
    .pwrite = nbd_pwrite,
    .zero = nbd_zero,
    .zero_allocates = 1, /* WRITE_ZEROES with NO_HOLE, else written zeros */
    .flush = nbd_flush,
    .finish = nbd_finish,
    .block_status = nbd_block_status,
    .random_access_status = 1,
    .write_alignment = nbd_write_alignment,
    .zero_limit = nbd_zero_limit,
    .preferred_size = nbd_preferred_size,
    .tune = nbd_tune,
    .abort = nbd_abort,
};
