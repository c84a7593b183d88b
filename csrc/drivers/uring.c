/* io_uring for the file protocol's scattered O_DIRECT reads (uring.h).
 * Raw system calls: the few operations used here do not earn liburing a
 * place among the build's dependencies.  Each thread keeps one small ring
 * (a worker reads one request at a time), made on first use and closed
 * when the thread ends. */
#include <errno.h>
#include <linux/io_uring.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "uring.h"

struct ring {
    int fd;
    pid_t owner; /* a forked child shares the parent's ring: never use it */
    unsigned *sq_head, *sq_tail, *sq_mask, *sq_array;
    unsigned *cq_head, *cq_tail, *cq_mask;
    struct io_uring_sqe *sqes;
    struct io_uring_cqe *cqes;
    void *sq_map, *cq_map;
    size_t sq_len, cq_len, sqes_len;
};

/* 0: not asked yet; 1: works; -1: this kernel (or its sandbox) has none */
static atomic_int available;
static pthread_once_t key_once = PTHREAD_ONCE_INIT;
static pthread_key_t ring_key;
static int key_made;

static void ring_free(struct ring *r)
{
    if (r->sqes && r->sqes != MAP_FAILED)
        munmap(r->sqes, r->sqes_len);
    if (r->cq_map && r->cq_map != MAP_FAILED && r->cq_map != r->sq_map)
        munmap(r->cq_map, r->cq_len);
    if (r->sq_map && r->sq_map != MAP_FAILED)
        munmap(r->sq_map, r->sq_len);
    if (r->fd >= 0)
        close(r->fd);
    free(r);
}

static void ring_destructor(void *p)
{
    ring_free(p);
}

static void make_key(void)
{
    key_made = pthread_key_create(&ring_key, ring_destructor) == 0;
}

static struct ring *ring_new(void)
{
    struct ring *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    struct io_uring_params p;
    memset(&p, 0, sizeof p);
    r->owner = getpid();
    r->fd = (int)syscall(__NR_io_uring_setup, IC_READ_RUNS_MAX, &p);
    if (r->fd < 0) {
        free(r);
        return NULL;
    }
    r->sq_len = p.sq_off.array + p.sq_entries * sizeof(unsigned);
    r->cq_len = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
    /* since 5.4 both rings live in one mapping */
    if (p.features & IORING_FEAT_SINGLE_MMAP) {
        if (r->cq_len > r->sq_len)
            r->sq_len = r->cq_len;
        r->cq_len = r->sq_len;
    }
    r->sq_map = mmap(NULL, r->sq_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, r->fd,
                     IORING_OFF_SQ_RING);
    if (r->sq_map == MAP_FAILED)
        goto fail;
    r->cq_map = (p.features & IORING_FEAT_SINGLE_MMAP)
                    ? r->sq_map
                    : mmap(NULL, r->cq_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE,
                           r->fd, IORING_OFF_CQ_RING);
    if (r->cq_map == MAP_FAILED)
        goto fail;
    r->sqes_len = p.sq_entries * sizeof(struct io_uring_sqe);
    r->sqes = mmap(NULL, r->sqes_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, r->fd,
                   IORING_OFF_SQES);
    if (r->sqes == MAP_FAILED)
        goto fail;
    uint8_t *sq = r->sq_map, *cq = r->cq_map;
    r->sq_head = (unsigned *)(sq + p.sq_off.head);
    r->sq_tail = (unsigned *)(sq + p.sq_off.tail);
    r->sq_mask = (unsigned *)(sq + p.sq_off.ring_mask);
    r->sq_array = (unsigned *)(sq + p.sq_off.array);
    r->cq_head = (unsigned *)(cq + p.cq_off.head);
    r->cq_tail = (unsigned *)(cq + p.cq_off.tail);
    r->cq_mask = (unsigned *)(cq + p.cq_off.ring_mask);
    r->cqes = (struct io_uring_cqe *)(cq + p.cq_off.cqes);
    return r;
fail:
    ring_free(r);
    return NULL;
}

/* This thread's ring, or NULL (io_uring unavailable: said once for all) */
static struct ring *thread_ring(void)
{
    if (atomic_load(&available) < 0)
        return NULL;
    pthread_once(&key_once, make_key);
    if (!key_made) {
        atomic_store(&available, -1);
        return NULL;
    }
    struct ring *r = pthread_getspecific(ring_key);
    if (r && r->owner == getpid())
        return r;
    if (r) {
        /* made before a fork: its completions could go to the parent.
         * Closing it here lets go of the child's references only. */
        (void)pthread_setspecific(ring_key, NULL);
        ring_free(r);
    }
    r = ring_new();
    if (!r || pthread_setspecific(ring_key, r) != 0) {
        /* ENOSYS, EPERM (io_uring_disabled, a seccomp filter), or no
         * memory for it: reads go one after another, as without it */
        if (r)
            ring_free(r);
        atomic_store(&available, -1);
        return NULL;
    }
    atomic_store(&available, 1);
    return r;
}

int ic_uring_available(void)
{
    return thread_ring() != NULL;
}

/* Take the completions there are; returns how many. */
static unsigned reap(struct ring *r, struct ic_uring_read *reads)
{
    unsigned head = *r->cq_head, got = 0;
    unsigned tail = __atomic_load_n(r->cq_tail, __ATOMIC_ACQUIRE);
    for (; head != tail; head++, got++) {
        const struct io_uring_cqe *c = &r->cqes[head & *r->cq_mask];
        struct ic_uring_read *rd = &reads[c->user_data];
        /* an error leaves the read to the caller, which meets it again
         * and reports it with its errno */
        if (c->res > 0 && (size_t)c->res <= rd->len - rd->done)
            rd->done += (size_t)c->res;
    }
    __atomic_store_n(r->cq_head, head, __ATOMIC_RELEASE);
    return got;
}

int ic_uring_readv(int fd, struct ic_uring_read *reads, size_t n)
{
    struct ring *r = thread_ring();
    if (!r || n > IC_READ_RUNS_MAX)
        return -1;
    unsigned tail = *r->sq_tail, queued = 0;
    for (size_t i = 0; i < n; i++) {
        if (reads[i].done >= reads[i].len)
            continue;
        unsigned idx = tail & *r->sq_mask;
        struct io_uring_sqe *e = &r->sqes[idx];
        memset(e, 0, sizeof *e);
        /* READV: the oldest read io_uring has (5.1) */
        e->opcode = IORING_OP_READV;
        e->fd = fd;
        e->off = reads[i].off;
        e->addr = (uint64_t)(uintptr_t)reads[i].iov;
        e->len = (unsigned)reads[i].iovcnt;
        e->user_data = i;
        r->sq_array[idx] = idx;
        tail++;
        queued++;
    }
    __atomic_store_n(r->sq_tail, tail, __ATOMIC_RELEASE);
    unsigned to_submit = queued, in_flight = 0, waited = 0;
    while (to_submit > 0 || in_flight > 0) {
        unsigned want = in_flight > 0 ? 1 : 0;
        long ret = syscall(__NR_io_uring_enter, r->fd, to_submit, want,
                           want ? IORING_ENTER_GETEVENTS : 0, NULL, 0);
        if (ret >= 0) {
            to_submit -= (unsigned)ret;
            in_flight += (unsigned)ret;
        } else if (errno != EINTR && errno != EAGAIN && errno != EBUSY) {
            /* refused: what the kernel has not taken is withdrawn (its
             * reads are the caller's to do) */
            if (to_submit > 0) {
                __atomic_store_n(r->sq_tail, *r->sq_head, __ATOMIC_RELEASE);
                to_submit = 0;
            }
            /* what is in flight must land before the buffers go back:
             * completions arrive as this thread enters the kernel */
            if (in_flight > 0) {
                struct timespec pause = {0, 100000};
                (void)nanosleep(&pause, NULL); /* EINTR: only a shorter pause */
            }
        } else if (to_submit > 0 && in_flight == 0 && ++waited > 1000) {
            /* the kernel keeps saying "later" with nothing in flight:
             * give the reads back rather than spin */
            __atomic_store_n(r->sq_tail, *r->sq_head, __ATOMIC_RELEASE);
            to_submit = 0;
        }
        in_flight -= reap(r, reads);
    }
    return 0;
}
