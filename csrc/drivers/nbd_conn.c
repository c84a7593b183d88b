/* The NBD driver's connections (nbd_state.h): each has one I/O thread
 * that owns its libnbd handle, submits the requests callers queue and
 * polls the socket; completions settle the requests, and the first
 * failure of one nobody waits for is kept for every later call. */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "nbd_state.h"

static const char *const op_names[] = {
    [OP_READ] = "read", [OP_WRITE] = "write", [OP_ZERO] = "zero",
    [OP_FLUSH] = "flush", [OP_STATUS] = "block status",
};

int nbd_request_error(struct ic_image *img, enum nbd_op op, uint64_t off, int errnum,
                         struct ic_error *err)
{
    return ic_error_os(err, errnum ? errnum : EIO, img->path, "NBD %s at offset %" PRIu64,
                       op_names[op], off);
}

int nbd_handle_error(struct ic_image *img, const struct nbd_lib *lib, const char *what,
                        struct ic_error *err)
{
    int errnum = lib->get_errno();
    const char *msg = lib->get_error();
    return ic_error_os(err, errnum ? errnum : EIO, img->path, "%s: %s", what,
                       msg ? msg : "libnbd nbd_failed");
}

uint64_t nbd_now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* A small request's round trip is the cost of a request (a large read's
 * or write's also carries its bytes): the shortest seen is kept, from the
 * answers a copy waits for and those it does not alike (a server's block
 * status may be slower than its reads: its first answers alone would
 * overprice every read). */
static void note_rtt(struct nbd_state *st, const struct nbd_request *r, uint64_t rtt)
{
    if (r->error || ((r->op == OP_READ || r->op == OP_WRITE) && r->len > (64u << 10)))
        return;
    uint64_t seen = atomic_load(&st->min_rtt);
    while ((seen == 0 || rtt < seen) && !atomic_compare_exchange_weak(&st->min_rtt, &seen, rtt))
        ;
}

/* ---- the I/O thread of a connection ------------------------------------ */

/* An unwaited request is over (st->lock held): it frees its room.  One
 * with an asynchronous caller to tell is returned (told and freed once
 * the lock is released: tell()); any other is freed. */
static struct nbd_request *retire_locked(struct nbd_state *st, struct nbd_request *r)
{
    if (r->op == OP_WRITE || r->op == OP_ZERO) {
        if (r->op == OP_WRITE)
            st->bytes_in_flight -= r->len;
        st->unwaited--;
        st->unwaited_in[r->epoch]--;
    }
    if (r->aio)
        return r;
    free(r->buf);
    free(r);
    return NULL;
}

/* An asynchronous request's part is answered (no lock held): the last
 * part tells the caller.  A failed write is told the failure kept
 * (first_failure), so that every caller hears of the same one. */
static void tell(struct nbd_request *r)
{
    struct nbd_aio *a = r->aio;
    if (r->error && !atomic_exchange(&a->failed, 1)) {
        a->errnum = r->error;
        a->op = r->op;
        a->off = r->off;
    }
    free(r);
    if (atomic_fetch_sub(&a->parts, 1) != 1)
        return;
    struct ic_error e = {0};
    const struct ic_error *failure = NULL;
    if (atomic_load(&a->failed)) {
        if (a->op == OP_READ || nbd_failed(a->img, &e) == 0)
            nbd_request_error(a->img, a->op, a->off, a->errnum, &e);
        failure = &e;
    }
    a->done(a->ctx, failure);
    free(a);
}

static void tell_all(struct nbd_request *list)
{
    while (list) {
        struct nbd_request *next = list->next;
        tell(list);
        list = next;
    }
}

/* Runs on the connection's I/O thread only (libnbd's callbacks, a refused
 * submission).  A failed unwaited write or zero is held back (settle): a
 * connection that dies fails everything in flight in one libnbd call, in
 * libnbd's order, and when a server dies every connection does; the
 * failure kept must be the first of them (first_failure), not whichever
 * libnbd reported first.  An asynchronous read is told at once. */
/* Whether a failed request is to be sent again: its connection dropped
 * (a server's answer is final) and it is to be made again (I/O thread). */
static int resend(struct nbd_conn *c, int error)
{
    struct nbd_state *st = c->st;
    if (!error || !st->retries || c->gave_up)
        return 0;
    /* libnbd fails what a dead connection held with ENOTCONN, before the
     * handle says it is dead; ESHUTDOWN is a server going away */
    return error == ENOTCONN || error == ECONNRESET || error == EPIPE || error == ESHUTDOWN ||
           error == ECONNABORTED || st->lib->aio_is_dead(c->h) || st->lib->aio_is_closed(c->h);
}

static void complete(struct nbd_request *r, int error)
{
    struct nbd_state *st = r->st;
    struct nbd_request *told = NULL;
    pthread_mutex_lock(&st->lock);
    if (r->conn && !st->aborted && resend(r->conn, error)) {
        /* kept for the connection made again (a partial answer dropped) */
        struct nbd_conn *c = r->conn;
        free(r->alloc);
        free(r->depth);
        r->alloc = r->depth = NULL;
        r->nalloc = r->ndepth = 0;
        r->refused = 0;
        r->next = NULL;
        if (c->retry_tail)
            c->retry_tail->next = r;
        else
            c->retry_head = r;
        c->retry_tail = r;
        pthread_mutex_unlock(&st->lock);
        return;
    }
    if (!r->refused && !error)
        note_rtt(st, r, nbd_now_ns() - r->t0);
    if (r->waited) {
        r->error = error;
        r->done = 1;
    } else if (r->op == OP_READ) {
        r->error = error;
        told = r;
    } else if (error) {
        r->error = error;
        r->next = r->conn->failures;
        r->conn->failures = r;
        atomic_fetch_add(&st->held, 1);
    } else {
        told = retire_locked(st, r);
    }
    pthread_cond_broadcast(&st->changed);
    pthread_mutex_unlock(&st->lock);
    if (told) {
        told->next = NULL;
        tell(told);
    }
}

/* Whether nbd_failed request `r` says better what went wrong than the failure
 * kept so far: one that went out (was in flight when the server nbd_failed or
 * died) over one libnbd refused afterwards, then the lowest offset. */
static int first_failure(const struct nbd_state *st, const struct nbd_request *r)
{
    if (!st->failed_errno || r->refused != st->failed_refused)
        return !st->failed_errno || !r->refused;
    return r->off < st->failed_off;
}

/* Every held failure at once (st->lock held): the first (first_failure)
 * is kept, also against a failure kept before; then their room is freed,
 * so that nobody sees the room before the failure.  The asynchronous
 * ones are returned, to be told once the lock is released. */
static struct nbd_request *publish_locked(struct nbd_state *st)
{
    struct nbd_request *told = NULL;
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
            struct nbd_request *t = retire_locked(st, r);
            if (t) {
                t->next = told;
                told = t;
            }
        }
    }
    pthread_cond_broadcast(&st->changed);
    return told;
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
    /* with retries, a dead connection comes back: it neither settles nor
     * takes the others down */
    int died = !exiting && !(st->retries && !c->gave_up) &&
               (lib->aio_is_dead(c->h) || lib->aio_is_closed(c->h));
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
                    nbd_wake(&st->conns[i]);
        }
    }
    struct nbd_request *told = NULL;
    if (!st->dying || st->nsettled == st->nthreads || exiting)
        told = publish_locked(st);
    pthread_mutex_unlock(&st->lock);
    tell_all(told);
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
    /* a dirty bitmap's answers come on a connection of their own: the
     * allocation arrays hold them */
    uint32_t **into = strcmp(context, "base:allocation") == 0 ? &r->alloc
                      : strcmp(context, "qemu:allocation-depth") == 0 ? &r->depth
                      : strncmp(context, NBD_DIRTY_PREFIX, strlen(NBD_DIRTY_PREFIX)) == 0
                          ? &r->alloc
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
    r->t0 = nbd_now_ns(); /* its round trip: from now, not from its wait in the queue */
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
void nbd_shut_down(struct nbd_conn *c)
{
    const struct nbd_lib *lib = c->st->lib;
    int fd = lib->aio_get_fd(c->h);
    if (fd >= 0)
        (void)shutdown(fd, SHUT_RDWR); /* ENOTCONN: the server went first */
    c->shut = 1;
}

/* Wait `ms` for nothing but an abort: -1 when aborted */
static int pause_unless_aborted(struct nbd_conn *c, uint64_t ms)
{
    struct nbd_state *st = c->st;
    uint64_t until = nbd_now_ns() + ms * 1000000u;
    for (;;) {
        pthread_mutex_lock(&st->lock);
        int aborted = st->aborted;
        pthread_mutex_unlock(&st->lock);
        uint64_t now = nbd_now_ns();
        if (aborted)
            return -1;
        if (now >= until)
            return 0;
        struct pollfd fd = {.fd = c->wake_fd, .events = POLLIN};
        uint64_t left = (until - now) / 1000000u + 1;
        if (poll(&fd, 1, left > 1000 ? 1000 : (int)left) > 0) {
            uint64_t n;
            (void)!read(c->wake_fd, &n, sizeof n);
        }
    }
}

/* The connection dropped: make it again (its meta contexts asked for as
 * before), up to st->retries times with a doubling pause; then the
 * requests it left unanswered go out again, first.  -1: it gave up. */
static int reconnect(struct nbd_conn *c)
{
    struct nbd_state *st = c->st;
    const struct nbd_lib *lib = st->lib;
    uint64_t delay = st->retry_delay_ms;
    for (unsigned attempt = 0; attempt < st->retries; attempt++) {
        if (pause_unless_aborted(c, delay) < 0)
            return -1;
        delay = delay * 2 < 60000 ? delay * 2 : 60000;
        struct nbd_handle *h = lib->create();
        int ok = h != NULL && ic_nbd_prepare_handle(lib, h) >= 0;
        for (size_t i = 0; ok && i < sizeof c->contexts / sizeof *c->contexts && c->contexts[i];
             i++)
            ok = lib->add_meta_context(h, c->contexts[i]) >= 0;
        if (ok && lib->connect_uri(h, st->uri) >= 0) {
            lib->close(c->h);
            c->h = h;
            c->shut = 0;
            c->reconnects++;
            pthread_mutex_lock(&st->lock);
            if (c->retry_head) { /* the unanswered first, in their order */
                c->retry_tail->next = c->head;
                if (!c->head)
                    c->tail = c->retry_tail;
                c->head = c->retry_head;
                c->retry_head = c->retry_tail = NULL;
            }
            pthread_mutex_unlock(&st->lock);
            return 0;
        }
        if (h)
            lib->close(h);
    }
    return -1;
}

/* Gave up: what waits to be sent again fails (on the dead handle) */
static void give_up(struct nbd_conn *c)
{
    struct nbd_state *st = c->st;
    pthread_mutex_lock(&st->lock);
    c->gave_up = 1;
    if (c->retry_head) {
        c->retry_tail->next = c->head;
        if (!c->head)
            c->tail = c->retry_tail;
        c->head = c->retry_head;
        c->retry_head = c->retry_tail = NULL;
    }
    pthread_mutex_unlock(&st->lock);
}

/* Only this thread calls libnbd on its handle (completions run here too),
 * so the handle's lock and st->lock are never taken in both orders. */
void *nbd_conn_thread(void *arg)
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
            nbd_shut_down(c);
        while (batch) {
            struct nbd_request *next = batch->next;
            batch->next = NULL;
            submit(c, batch);
            batch = next;
        }
        settle(c, 0);
        alive = !lib->aio_is_dead(c->h) && !lib->aio_is_closed(c->h);
        if (!alive && st->retries && !c->gave_up) {
            pthread_mutex_lock(&st->lock);
            int owed = (c->retry_head || c->head) && !st->aborted;
            pthread_mutex_unlock(&st->lock);
            if (owed) {
                if (reconnect(c) < 0)
                    give_up(c);
                continue;
            }
        }
        if (stop && (!alive || lib->aio_in_flight(c->h) == 0))
            break;
        /* the connection died while requests wait in the queue: fail them
         * now (nothing on a dead socket would wake the poll for them) */
        pthread_mutex_lock(&st->lock);
        int queued = c->head != NULL;
        pthread_mutex_unlock(&st->lock);
        if (!alive && queued)
            continue;
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

void nbd_wake(struct nbd_conn *c)
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
    nbd_wake(c);
}

/* Send `r`, whose reply someone waits for (nbd_wait): 0, or ECANCELED
 * when the image was aborted (nothing was sent). */
int nbd_submit_waited(struct nbd_state *st, struct nbd_request *r, struct nbd_conn *on)
{
    r->t0 = nbd_now_ns();
    r->waited = 1;
    r->st = st;
    pthread_mutex_lock(&st->lock);
    if (st->aborted) {
        pthread_mutex_unlock(&st->lock);
        r->done = 1;
        r->error = ECANCELED;
        return ECANCELED;
    }
    if (on) {
        r->conn = on;
        if (on->tail)
            on->tail->next = r;
        else
            on->head = r;
        on->tail = r;
        nbd_wake(on);
    } else {
        enqueue_locked(st, r);
    }
    pthread_mutex_unlock(&st->lock);
    return 0;
}

/* Wait for the reply of a request nbd_submit_waited() sent: 0, or its errno */
int nbd_wait(struct nbd_state *st, struct nbd_request *r)
{
    pthread_mutex_lock(&st->lock);
    while (!r->done)
        pthread_cond_wait(&st->changed, &st->lock);
    pthread_mutex_unlock(&st->lock);
    return r->error;
}

/* Run `r` and wait for its reply: 0, or its errno */
int nbd_run_waited(struct nbd_state *st, struct nbd_request *r, struct nbd_conn *on)
{
    int e = nbd_submit_waited(st, r, on);
    return e ? e : nbd_wait(st, r);
}

/* The first failure of a write or zero nobody waited for, as an error */
int nbd_failed(struct ic_image *img, struct ic_error *err)
{
    struct nbd_state *st = nbd_state_of(img);
    pthread_mutex_lock(&st->lock);
    int errnum = st->failed_errno;
    enum nbd_op op = st->failed_op;
    uint64_t off = st->failed_off;
    pthread_mutex_unlock(&st->lock);
    return errnum ? nbd_request_error(img, op, off, errnum, err) : 0;
}

/* Queue a write or zero nobody waits for, once the bytes in flight allow */
int nbd_queue_unwaited(struct ic_image *img, struct nbd_request *r, struct ic_error *err)
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
        if (!r->aio)
            free(r->buf);
        free(r);
        return aborted ? nbd_request_error(img, op, off, ECANCELED, err) : nbd_failed(img, err);
    }
    if (r->op == OP_WRITE)
        st->bytes_in_flight += r->len;
    st->unwaited++;
    r->epoch = st->epoch;
    st->unwaited_in[r->epoch]++;
    st->unflushed = 1;
    enqueue_locked(st, r);
    pthread_mutex_unlock(&st->lock);
    return 0;
}

/* Wait until every write and zero queued before has its reply; their
 * first failure */
int nbd_drain(struct ic_image *img, struct ic_error *err)
{
    struct nbd_state *st = nbd_state_of(img);
    pthread_mutex_lock(&st->lock);
    /* those queued from now on go to the other epoch: a copy writing on
     * never keeps this drain waiting (one drain at a time) */
    while (st->draining)
        pthread_cond_wait(&st->changed, &st->lock);
    st->draining = 1;
    unsigned before = st->epoch;
    st->epoch ^= 1;
    while (st->unwaited_in[before])
        pthread_cond_wait(&st->changed, &st->lock);
    st->draining = 0;
    pthread_cond_broadcast(&st->changed);
    pthread_mutex_unlock(&st->lock);
    return nbd_failed(img, err);
}

/* ---- asynchronous reads and writes -------------------------------------- */

static struct nbd_aio *new_aio(struct ic_image *img, unsigned parts, ic_aio_done_fn *done,
                               void *ctx)
{
    struct nbd_aio *a = calloc(1, sizeof *a);
    if (!a)
        return NULL;
    a->img = img;
    a->done = done;
    a->ctx = ctx;
    atomic_init(&a->parts, parts);
    atomic_init(&a->failed, 0);
    return a;
}

static unsigned parts_of(const struct nbd_state *st, size_t len)
{
    return (unsigned)((len + st->max_block - 1) / st->max_block);
}

/* A read the server's minimum block size divides, in requests of at most
 * its maximum, all queued at once; the caller's buffer is read into. */
int nbd_aio_pread(struct ic_image *img, void *buf, size_t len, uint64_t off,
                  ic_aio_done_fn *done, void *ctx, struct ic_error *err)
{
    struct nbd_state *st = nbd_state_of(img);
    uint64_t unit = st->min_block;
    if (len == 0 || (unit > 1 && (off % unit || len % unit)))
        return 0; /* the synchronous read reads the blocks around it */
    unsigned n = parts_of(st, len);
    struct nbd_aio *a = new_aio(img, n, done, ctx);
    struct nbd_request **rs = a ? calloc(n, sizeof *rs) : NULL;
    unsigned made = 0;
    for (; rs && made < n; made++)
        if (!(rs[made] = calloc(1, sizeof **rs)))
            break;
    if (!rs || made < n) {
        for (unsigned i = 0; rs && i < made; i++)
            free(rs[i]);
        free(rs);
        free(a);
        return ic_error_nomem(err);
    }
    pthread_mutex_lock(&st->lock);
    if (st->aborted) {
        pthread_mutex_unlock(&st->lock);
        for (unsigned i = 0; i < n; i++)
            free(rs[i]);
        free(rs);
        free(a);
        return nbd_request_error(img, OP_READ, off, ECANCELED, err);
    }
    for (unsigned i = 0; i < n; i++) {
        uint64_t at = (uint64_t)i * st->max_block;
        *rs[i] = (struct nbd_request){.op = OP_READ, .buf = (char *)buf + at, .off = off + at,
                                      .len = len - at < st->max_block ? len - at
                                                                      : st->max_block,
                                      .aio = a};
        enqueue_locked(st, rs[i]);
    }
    pthread_mutex_unlock(&st->lock);
    free(rs);
    return 1;
}

/* A write of the caller's bytes (no copy), as the unwaited writes go: in
 * requests of at most the server's maximum, each waiting for room. */
int nbd_aio_pwrite(struct ic_image *img, const void *buf, size_t len, uint64_t off,
                   ic_aio_done_fn *done, void *ctx, struct ic_error *err)
{
    struct nbd_state *st = nbd_state_of(img);
    if (len == 0)
        return 0;
    unsigned n = parts_of(st, len);
    struct nbd_aio *a = new_aio(img, n, done, ctx);
    if (!a)
        return ic_error_nomem(err);
    for (unsigned i = 0; i < n; i++) {
        uint64_t at = (uint64_t)i * st->max_block;
        struct nbd_request *r = calloc(1, sizeof *r);
        if (r)
            *r = (struct nbd_request){.op = OP_WRITE, .buf = (char *)buf + at, .off = off + at,
                                      .len = len - at < st->max_block ? len - at
                                                                      : st->max_block,
                                      .aio = a};
        if (!r || nbd_queue_unwaited(img, r, err) < 0) {
            if (!r)
                ic_error_nomem(err);
            if (i == 0) {
                free(a);
                return -1;
            }
            /* parts already out: they tell the caller, of this failure */
            if (!atomic_exchange(&a->failed, 1)) {
                a->errnum = err->errnum ? err->errnum : EIO;
                a->op = OP_WRITE;
                a->off = off + at;
            }
            if (atomic_fetch_sub(&a->parts, n - i) == n - i) {
                a->done(a->ctx, err);
                free(a);
            }
            return 1;
        }
    }
    return 1;
}
