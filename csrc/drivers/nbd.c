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
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "nbd_state.h"

/* ---- opening ------------------------------------------------------------ */

static void nbd_close_image(struct ic_image *img)
{
    struct nbd_state *st = nbd_state_of(img);
    if (!st)
        return;
    if (st->prober_started) /* its requests end with the connections' answers */
        pthread_join(st->prober, NULL);
    for (unsigned i = 0; i < st->nconns; i++)
        nbd_stop_conn(st, &st->conns[i]);
    nbd_status_free(st);
    nbd_dirty_close(st);
    nbd_bitmaps_free(st);
    pthread_mutex_destroy(&st->lock);
    pthread_cond_destroy(&st->changed);
    free(st->zeros);
    free(st);
    img->drv_state = NULL;
}

static const char *const data_contexts[] = {"base:allocation", "qemu:allocation-depth", NULL};

static int connect_one(struct ic_image *img, struct nbd_conn *c, struct ic_error *err)
{
    return nbd_connect(img, c, data_contexts, err);
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
    st->dirty.wake_fd = -1;
    img->drv_state = st;
    st->uri = img->path;
    st->retry_delay_ms = 1000;
    st->nconns = 1;
    if (connect_one(img, &st->conns[0], err) < 0)
        return -1;
    struct nbd_handle *h = st->conns[0].h;
    int64_t size = lib->get_size(h);
    if (size < 0)
        return nbd_handle_error(img, lib, "nbd_get_size", err);
    img->size = (uint64_t)size;
    int writable = (img->open_flags & IC_OPEN_RDWR) != 0;
    if (writable && lib->is_read_only(h) == 1)
        return ic_error_os(err, EROFS, img->path, "the NBD export is read-only");
    st->max_requests = 64;
    st->multi_conn = lib->can_multi_conn(h) == 1;
    st->min_block = block_size(lib, h, NBD_SIZE_MINIMUM, 1);
    /* requests must be whole blocks: an export that ends inside one cannot
     * be read or written to its end (qemu refuses to open it too) */
    if (st->min_block > 1 && img->size % st->min_block)
        return ic_error_value(err, "%s: the NBD export's size (%llu bytes) is not a multiple of "
                              "its minimum block size (%llu bytes): its last block cannot be "
                              "read or written", img->path, (unsigned long long)img->size,
                              (unsigned long long)st->min_block);
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
    atomic_store(&st->nactive_seen, 1);
    return 0;
}

struct connecting {
    struct ic_image *img;
    struct nbd_conn *c;
    struct ic_error err;
    int r;
};

static void *connect_thread(void *arg)
{
    struct connecting *k = arg;
    k->r = connect_one(k->img, k->c, &k->err);
    return NULL;
}

/* Connections [from, to) made side by side: a handshake is a few round
 * trips, which over a real network would add up one connection after
 * another.  0, or -1 with the first failure (in connection order). */
static int connect_more(struct ic_image *img, unsigned from, unsigned to, struct ic_error *err)
{
    struct nbd_state *st = nbd_state_of(img);
    struct connecting k[NBD_MAX_CONNECTIONS];
    pthread_t threads[NBD_MAX_CONNECTIONS];
    int started[NBD_MAX_CONNECTIONS] = {0};
    for (unsigned i = from; i < to; i++) {
        k[i] = (struct connecting){.img = img, .c = &st->conns[i]};
        started[i] = pthread_create(&threads[i], NULL, connect_thread, &k[i]) == 0;
        if (!started[i]) /* no thread to spare: made here, in turn */
            connect_thread(&k[i]);
    }
    int r = 0;
    for (unsigned i = from; i < to; i++) {
        if (started[i])
            pthread_join(threads[i], NULL);
        if (k[i].r < 0 && r == 0) {
            *err = k[i].err;
            r = -1;
        }
    }
    return r;
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
    if (want > have) {
        /* connected outside the lock: requests keep going to the others */
        int r = connect_more(img, have, want, err);
        pthread_mutex_lock(&st->lock);
        st->nconns = want; /* closed with the rest, even half made */
        pthread_mutex_unlock(&st->lock);
        if (r < 0)
            return -1;
    }
    pthread_mutex_lock(&st->lock);
    st->nactive = want;
    atomic_store(&st->nactive_seen, want);
    pthread_cond_broadcast(&st->changed); /* a writer may have room now */
    pthread_mutex_unlock(&st->lock);
    return 0;
}

/* A copy's patience with a server that drops: connections made again */
static void nbd_set_retries(struct ic_image *img, unsigned retries, uint64_t delay_ms)
{
    struct nbd_state *st = nbd_state_of(img);
    pthread_mutex_lock(&st->lock);
    st->retries = retries;
    st->retry_delay_ms = delay_ms;
    pthread_mutex_unlock(&st->lock);
}

/* Cancelled: every connection is shut down instead of drained (see
 * nbd_shut_down); requests not yet queued fail at once. */
static void nbd_abort(struct ic_image *img)
{
    struct nbd_state *st = nbd_state_of(img);
    pthread_mutex_lock(&st->lock);
    st->aborted = 1;
    for (unsigned i = 0; i < st->nconns; i++)
        if (st->conns[i].thread_started)
            nbd_wake(&st->conns[i]);
    if (st->dirty.thread_started)
        nbd_wake(&st->dirty);
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
        int e = nbd_run_waited(st, &r, NULL);
        if (e)
            return nbd_request_error(img, OP_READ, off + done, e, err);
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
        if (nbd_queue_unwaited(img, r, err) < 0)
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
        if (nbd_queue_unwaited(img, r, err) < 0)
            return -1;
        done += n;
    }
    return 0;
}

static int nbd_flush(struct ic_image *img, struct ic_error *err)
{
    struct nbd_state *st = nbd_state_of(img);
    if (nbd_drain(img, err) < 0)
        return -1;
    pthread_mutex_lock(&st->lock);
    int unflushed = st->unflushed;
    st->unflushed = 0;
    pthread_mutex_unlock(&st->lock);
    if (!st->can_flush || !unflushed)
        return 0; /* each flush is a round trip per connection */
    for (unsigned i = 0; i < st->nconns; i++) {
        struct nbd_request r = {.op = OP_FLUSH};
        int e = nbd_run_waited(st, &r, &st->conns[i]);
        if (e) {
            pthread_mutex_lock(&st->lock);
            st->unflushed = 1;
            pthread_mutex_unlock(&st->lock);
            return nbd_request_error(img, OP_FLUSH, 0, e, err);
        }
    }
    return 0;
}

static int nbd_finish(struct ic_image *img, int sync, struct ic_error *err)
{
    return sync ? nbd_flush(img, err) : nbd_drain(img, err);
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

/* What a request costs, in bytes: many are in flight, so a round trip
 * costs its share of the server's concurrency (taken as 16, nbdkit's
 * threads; 1 when the server is seen answering one request after
 * another), during which the link (taken as 1 GiB/s, a fast network's or
 * a local socket's order) carries this many bytes.  A hole shorter than
 * that is cheaper read through than asked around: at 5 ms, 320 KiB (5 MiB
 * from a serialising server).  A round trip under NBD_LOCAL_RTT is a local
 * socket's (~0.1 ms, more on a busy machine): there no hole is worth
 * reading. */
#define NBD_LOCAL_RTT 1000000ull /* ns */
#define NBD_ASSUMED_BANDWIDTH 1073741824ull /* bytes per second */
#define NBD_ASSUMED_CONCURRENCY 16u

/* Requests sent at once to learn what a round trip costs: the shortest
 * of a few is the round trip (one alone can be slowed by anything, a
 * busy machine, a cold server), and whether they came back together or
 * one after another tells whether the server answers them in parallel.
 * One batch, so that a 5 ms server costs one round trip here (four for a
 * serialising one), not one per sample. */
#define NBD_PROBES 4u

/* A tiny question of the export: block status of its start (a read where
 * it has none) */
static int make_probe(struct nbd_state *st, const struct ic_image *img, struct nbd_request *r)
{
    uint64_t len = st->min_block > 4096 ? st->min_block : 4096;
    if (len > img->size)
        len = img->size;
    *r = (struct nbd_request){.op = st->has_alloc || st->has_depth ? OP_STATUS : OP_READ,
                              .off = 0, .len = len, .flags = 0};
    if (len == 0)
        return -1;
    if (r->op == OP_READ && !(r->buf = malloc((size_t)len)))
        return -1;
    return 0;
}

static void free_probe(struct nbd_request *r)
{
    if (r->op == OP_READ)
        free(r->buf);
    free(r->alloc);
    free(r->depth);
}

/* The probes, sent at once: each answer is a round-trip sample
 * (note_rtt), and the batch's time (returned, ns; 0: a probe failed) */
static uint64_t probe_batch(struct nbd_state *st, const struct ic_image *img)
{
    struct nbd_request r[NBD_PROBES];
    unsigned made = 0, sent = 0;
    int failed = 0;
    uint64_t t0 = nbd_now_ns();
    for (; made < NBD_PROBES && !failed; made++) {
        if (make_probe(st, img, &r[made]) < 0) {
            failed = 1;
            break;
        }
        if (nbd_submit_waited(st, &r[made], NULL))
            failed = 1;
        else
            sent++;
    }
    for (unsigned i = 0; i < sent; i++)
        failed |= nbd_wait(st, &r[i]) != 0;
    uint64_t took = nbd_now_ns() - t0;
    for (unsigned i = 0; i < made; i++)
        free_probe(&r[i]);
    return failed ? 0 : took;
}

static void *probe_thread(void *arg)
{
    const struct ic_image *img = arg;
    (void)probe_batch(img->drv_state, img);
    return NULL;
}

/* Batches of probes (asked once): a server that serves them in parallel
 * answers a batch together, in about one round trip, one that does not in
 * one round trip per probe.  A busy machine blurs both: a batch neither
 * clearly one nor the other is sent again (the shortest round trip and
 * batch kept), up to NBD_PROBE_BATCHES.  A failed probe leaves the server
 * counted as answering together. */
#define NBD_PROBE_BATCHES 4u
static void probe_server(struct nbd_state *st, const struct ic_image *img)
{
    if (atomic_load(&st->serialises))
        return;
    /* a server that offers multi-conn asks for connections served side
     * by side: it is taken at its word, and nobody waits for its round
     * trip: the probes go out on a thread of their own, ahead of the
     * copy's first block status, whose answer finds their samples in */
    if (st->multi_conn) {
        atomic_store(&st->serialises, 1);
        st->prober_started = pthread_create(&st->prober, NULL, probe_thread, (void *)img) == 0;
        return;
    }
    uint64_t shortest = UINT64_MAX;
    int serial = 0;
    for (unsigned batch = 0; batch < NBD_PROBE_BATCHES; batch++) {
        uint64_t took = probe_batch(st, img);
        uint64_t rtt = atomic_load(&st->min_rtt);
        if (!took || !rtt)
            break;
        shortest = took < shortest ? took : shortest;
        /* together: about one round trip; one by one: one each */
        serial = shortest > rtt * (NBD_PROBES + 1) / 2;
        if (shortest > rtt * (NBD_PROBES - 1) || shortest * 2 < rtt * 3)
            break; /* clearly one by one, or clearly together */
    }
    atomic_store(&st->serialises, serial ? 2 : 1);
}

static uint64_t nbd_request_cost(const struct ic_image *img)
{
    struct nbd_state *st = img->drv_state;
    probe_server(st, img);
    uint64_t rtt = atomic_load(&st->min_rtt); /* ns */
    if (rtt < NBD_LOCAL_RTT)
        return 0;
    uint64_t connections = atomic_load(&st->nactive_seen);
    if (!connections)
        connections = 1;
    uint64_t concurrency =
        atomic_load(&st->serialises) == 2 ? 1 : NBD_ASSUMED_CONCURRENCY * connections;
    return rtt * (NBD_ASSUMED_BANDWIDTH / concurrency) / 1000000000ull;
}

static int nbd_serialised(const struct ic_image *img)
{
    const struct nbd_state *st = img->drv_state;
    return atomic_load(&st->serialises) == 2;
}

static unsigned nbd_requests_in_flight(const struct ic_image *img)
{
    struct nbd_state *st = img->drv_state;
    pthread_mutex_lock(&st->lock);
    unsigned n = st->nactive * st->max_requests;
    pthread_mutex_unlock(&st->lock);
    return n;
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
    .bitmaps = nbd_bitmaps,
    .dirty_status = nbd_dirty_status,
    .finish = nbd_finish,
    .block_status = nbd_block_status, /* nbd_status.c */
    .random_access_status = 1,
    .write_alignment = nbd_write_alignment,
    .zero_limit = nbd_zero_limit,
    .preferred_size = nbd_preferred_size,
    .tune = nbd_tune,
    .set_retries = nbd_set_retries,
    .abort = nbd_abort,
    .aio_pread = nbd_aio_pread,
    .aio_pwrite = nbd_aio_pwrite,
    .request_cost = nbd_request_cost,
    .serialises = nbd_serialised,
    .requests_in_flight = nbd_requests_in_flight,
};
