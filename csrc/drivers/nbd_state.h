/* The NBD driver's shared state: nbd.c opens, reads, writes and asks
 * block status; nbd_conn.c runs each connection's I/O thread and the
 * queue of requests in flight. */
#ifndef IMGCOPY_NBD_STATE_H
#define IMGCOPY_NBD_STATE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "../error.h"
#include "../image.h"
#include "nbd_lib.h"

/* Bytes of writes in flight before a writer waits (nbdcopy: 64 requests) */
#define NBD_BYTES_IN_FLIGHT (64u << 20)
#define NBD_MAX_CONNECTIONS 16
#define NBD_DIRTY_PREFIX "qemu:dirty-bitmap:"
#define NBD_STATE_DIRTY 1u /* qemu:dirty-bitmap: changed */
/* A request's length field is 32 bits; zero requests stay aligned */
#define NBD_MAX_ZERO (UINT32_MAX & ~(uint64_t)((1u << 20) - 1))
#define NBD_MAX_STATUS (UINT32_MAX & ~(uint64_t)((1u << 20) - 1))

enum nbd_op { OP_READ, OP_WRITE, OP_ZERO, OP_FLUSH, OP_STATUS };

struct nbd_state;

/* An asynchronous read or write (nbd_aio_pread/pwrite) in one or more
 * requests: `done` runs once the last has its reply. */
struct nbd_aio {
    struct ic_image *img;
    ic_aio_done_fn *done;
    void *ctx;
    atomic_uint parts;   /* requests not answered yet */
    atomic_int failed;   /* set by the first that failed, which fills: */
    int errnum;
    enum nbd_op op;
    uint64_t off;
};

struct nbd_request {
    enum nbd_op op;
    struct nbd_state *st;
    /* read into; a write's own copy (freed at completion), or the
     * caller's bytes (an asynchronous write: `aio` set) */
    void *buf;
    uint64_t off, len;
    uint32_t flags;
    int refused;  /* libnbd refused it: it never went out (a dead connection) */
    struct nbd_conn *conn; /* the connection it went to */
    int waited; /* the caller waits: it frees the request */
    uint64_t t0; /* sent (CLOCK_MONOTONIC ns): its round trip is measured */
    struct nbd_aio *aio; /* asynchronous: told at completion, then freed */
    unsigned epoch; /* unwaited: the drain epoch it was queued in */
    int done;
    int error;
    /* block status: the answer, per context */
    uint32_t *alloc, *depth;
    size_t nalloc, ndepth;
    struct nbd_request *next;
};

/* Block status asked ahead (nbd_status.c): lanes, each walking a region
 * of the disk one answer after another, several regions at once */
#define STATUS_LANES 8
struct status_lane {
    uint64_t next, end;           /* what the lane has still to ask */
    struct nbd_request query;     /* the question in flight (sent) */
    int sent;
    struct ic_extent_list answer; /* answers in, contiguous from `from` */
    uint64_t from, to;
};
struct nbd_status_ahead {
    /* used by block status only, which the extent cache serialises */
    struct status_lane lanes[STATUS_LANES];
    uint64_t region; /* a lane's share (0: answers come whole: none) */
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
    /* reconnecting (st->retries): the meta contexts it asks for, the
     * requests the dead connection left unanswered (sent again once it is
     * back), and whether it gave up */
    char *contexts[4];
    struct nbd_request *retry_head, *retry_tail;
    int gave_up;
    unsigned reconnects;
};

struct nbd_state {
    const struct nbd_lib *lib;
    struct nbd_conn conns[NBD_MAX_CONNECTIONS];
    unsigned nconns;    /* connected (under lock once the first runs) */
    unsigned nactive;   /* of them, those requests go to */
    /* nactive for the price of a round trip, which the planner asks at
     * every extent: read without the lock the I/O threads take */
    _Atomic unsigned nactive_seen;
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
    /* of them, per drain epoch: a drain waits for those queued before it
     * only (a checkpoint's flush, while the copy goes on writing) */
    unsigned unwaited_in[2];
    unsigned epoch;
    int draining;
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
    /* the shortest round trip seen of a small request (ns; 0: none yet):
     * what a request costs beyond its bytes */
    _Atomic uint64_t min_rtt;
    /* whether the server answers requests in flight together (nbdkit's
     * threads, qemu-nbd) or one after another (a VDDK source, nbdkit's
     * noparallel filter): 0 not known yet, 1 together, 2 one by one */
    atomic_int serialises;
    /* a multi-conn server's round-trip samples, sent without waiting */
    pthread_t prober;
    int prober_started;
    /* a dropped connection is made again this many times (0: never), the
     * first after retry_delay_ms, doubling; its unanswered requests are
     * sent again (a server's own error answer is never retried) */
    unsigned retries;
    uint64_t retry_delay_ms;
    const char *uri; /* the image's path: what is connected again */
    struct nbd_status_ahead ahead;
    /* a dirty bitmap's connection (nbd_dirty.c): its meta context is
     * asked for when connecting, so a bitmap has a connection of its own */
    struct nbd_conn dirty;
    char *dirty_name;
    /* the export's bitmaps, listed once when first asked (bitmaps()) */
    char **listed;
    size_t nlisted;
    int listed_known;
};

static inline struct nbd_state *nbd_state_of(struct ic_image *img)
{
    return img->drv_state;
}

/* nbd_conn.c */
int nbd_request_error(struct ic_image *img, enum nbd_op op, uint64_t off, int errnum,
                         struct ic_error *err);
int nbd_handle_error(struct ic_image *img, const struct nbd_lib *lib, const char *what,
                        struct ic_error *err);
void nbd_shut_down(struct nbd_conn *c);
void *nbd_conn_thread(void *arg);
void nbd_wake(struct nbd_conn *c);
/* CLOCK_MONOTONIC, in ns */
uint64_t nbd_now_ns(void);
int nbd_run_waited(struct nbd_state *st, struct nbd_request *r, struct nbd_conn *on);
int nbd_submit_waited(struct nbd_state *st, struct nbd_request *r, struct nbd_conn *on);
int nbd_wait(struct nbd_state *st, struct nbd_request *r);
int nbd_failed(struct ic_image *img, struct ic_error *err);
int nbd_queue_unwaited(struct ic_image *img, struct nbd_request *r, struct ic_error *err);
int nbd_drain(struct ic_image *img, struct ic_error *err);
/* nbd_connect.c */
int nbd_connect(struct ic_image *img, struct nbd_conn *c, const char *const *contexts,
                struct ic_error *err);
void nbd_stop_conn(struct nbd_state *st, struct nbd_conn *c);
/* nbd_dirty.c */
int nbd_dirty_status(struct ic_image *img, const char *bitmap, uint64_t start, uint64_t end,
                     struct ic_extent_list *out, struct ic_error *err);
int nbd_bitmap_names(struct ic_image *img, char ***names, size_t *count, struct ic_error *err);
void nbd_dirty_close(struct nbd_state *st);
size_t nbd_bitmaps(struct ic_image *img, struct ic_bitmap *out, size_t cap);
void nbd_bitmaps_free(struct nbd_state *st);
/* nbd_status.c */
int nbd_block_status(struct ic_image *img, uint64_t start, uint64_t end, uint64_t want,
                     struct ic_extent_list *out, struct ic_error *err);
/* after every connection stopped */
void nbd_status_free(struct nbd_state *st);
/* nbd_conn.c */
int nbd_aio_pread(struct ic_image *img, void *buf, size_t len, uint64_t off,
                  ic_aio_done_fn *done, void *ctx, struct ic_error *err);
int nbd_aio_pwrite(struct ic_image *img, const void *buf, size_t len, uint64_t off,
                   ic_aio_done_fn *done, void *ctx, struct ic_error *err);

#endif
