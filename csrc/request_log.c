/* The requests a copy makes, recorded as it makes them (for plans and
 * tests): appended under a lock by the workers, sorted once at the end. */
#include <pthread.h>
#include <stdlib.h>

#include "imgcopy.h"
#include "request_log.h"

struct ic_request_log {
    pthread_mutex_t lock;
    struct ic_request *items;
    size_t count, cap;
    int failed;
};

struct ic_request_log *ic_request_log_new(void)
{
    struct ic_request_log *log = calloc(1, sizeof *log);
    if (log)
        pthread_mutex_init(&log->lock, NULL);
    return log;
}

void ic_request_log_free(struct ic_request_log *log)
{
    if (!log)
        return;
    pthread_mutex_destroy(&log->lock);
    free(log->items);
    free(log);
}

void ic_request_log_add(struct ic_request_log *log, uint64_t off, uint64_t len, uint32_t kind)
{
    if (!log)
        return;
    pthread_mutex_lock(&log->lock);
    if (log->count == log->cap && !log->failed) {
        size_t nc = log->cap ? log->cap * 2 : 1024;
        struct ic_request *ni = realloc(log->items, nc * sizeof *ni);
        if (ni) {
            log->items = ni;
            log->cap = nc;
        } else {
            log->failed = 1;
        }
    }
    if (log->count < log->cap)
        log->items[log->count++] = (struct ic_request){.offset = off, .length = len, .kind = kind};
    pthread_mutex_unlock(&log->lock);
}

static int by_offset(const void *a, const void *b)
{
    const struct ic_request *x = a, *y = b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

const struct ic_request *ic_request_log_sorted(struct ic_request_log *log, size_t *count)
{
    *count = log->failed ? 0 : log->count;
    if (log->failed || !log->count)
        return NULL;
    qsort(log->items, log->count, sizeof *log->items, by_offset);
    return log->items;
}


int ic_request_log_failed(const struct ic_request_log *log)
{
    return log && log->failed;
}
