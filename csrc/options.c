/* What a copy and a new image may be asked for: the one definition of valid
 * options and of the copy's defaults.  The copy engine and image creation
 * check here, and so do Python's option objects when they are made, so
 * that a bad option is refused before any file is touched, with the same
 * message wherever it comes from. */
#include <string.h>

#include "compression.h"
#include "driver.h"
#include "sparse.h"

#define MAX_CONCURRENCY 1024u
#define MIN_REQUEST_SIZE 4096u
#define MAX_REQUEST_SIZE (1u << 30)
#define MAX_CONNECTIONS 16u
#define MAX_REQUESTS_IN_FLIGHT 1024u
#define MAX_COMPARE_BLOCK (64u << 20)
#define MAX_RETRIES 1000u
#define MAX_RETRY_DELAY_MS 3600000u
/* nbdcopy's default: enough to hide a round trip of a few ms */
#define DEFAULT_REQUESTS_IN_FLIGHT 64u

void ic_copy_options_init(struct ic_copy_options *o)
{
    *o = (struct ic_copy_options){
        /* qemu-img's -S default: a 4 KiB run of zeros is worth a hole */
        .sparse_threshold = 4096,
        /* chosen by measurement (benchmarks/bench_convert.py, README): with
         * 2 MiB requests, 4 threads keep a 2-core machine's disk busy
         * without queueing more than it can use */
        .request_size = 2u << 20,
        .concurrency = 4,
        .out_of_order = 1,
        .target_is_zero = IC_AUTO,
        .flush = 1,
        .requests_in_flight = DEFAULT_REQUESTS_IN_FLIGHT,
        .retry_delay_ms = 1000,
    };
}

int ic_copy_options_check(const struct ic_copy_options *o, struct ic_error *err)
{
    if (o->concurrency < 1 || o->concurrency > MAX_CONCURRENCY)
        return ic_error_value(err, "concurrency must be between 1 and %u", MAX_CONCURRENCY);
    if (o->request_size < MIN_REQUEST_SIZE || o->request_size > MAX_REQUEST_SIZE ||
        o->request_size % MIN_REQUEST_SIZE)
        return ic_error_value(err, "request_size must be a multiple of 4096 between 4 KiB "
                                   "and 1 GiB");
    if (o->connections > MAX_CONNECTIONS)
        return ic_error_value(err, "connections must be between 1 and %u (0: as the server "
                                   "allows)", MAX_CONNECTIONS);
    if (o->requests_in_flight > MAX_REQUESTS_IN_FLIGHT) /* 0: the default */
        return ic_error_value(err, "requests_in_flight must be between 1 and %u",
                              MAX_REQUESTS_IN_FLIGHT);
    if (o->sparse_threshold % 512 || o->sparse_threshold > IC_MAX_SPARSE_THRESHOLD)
        return ic_error_value(err, "sparse_threshold must be a multiple of 512 from 0 to "
                                   "16 MiB");
    if (o->target_is_zero != 0 && o->target_is_zero != 1 && o->target_is_zero != IC_AUTO)
        return ic_error_value(err, "target_is_zero must be true, false or auto");
    if (o->compare_block_size && (o->compare_block_size % 512 ||
                                  o->compare_block_size > MAX_COMPARE_BLOCK))
        return ic_error_value(err, "compare_block_size must be a multiple of 512 from 512 "
                                   "bytes to 64 MiB");
    if (o->retries > MAX_RETRIES)
        return ic_error_value(err, "retries must be from 0 to %u", MAX_RETRIES);
    if (o->retry_delay_ms > MAX_RETRY_DELAY_MS)
        return ic_error_value(err, "retry_delay must be from 0 to %u seconds",
                              MAX_RETRY_DELAY_MS / 1000);
    if (o->nchanged && !o->changed)
        return ic_error_value(err, "%zu changed ranges without their list", o->nchanged);
    return 0;
}

static uint64_t round_up(uint64_t n, uint64_t unit)
{
    return n % unit ? (n / unit + 1) * unit : n;
}

/* Requests and holes at least as long as the destination handles well (an
 * NBD server's preferred block size), as the NBD spec asks. */
static void at_least_preferred(struct ic_copy_options *o, uint64_t preferred)
{
    if (preferred > IC_MAX_SPARSE_THRESHOLD)
        preferred = IC_MAX_SPARSE_THRESHOLD;
    if (o->sparse_threshold && o->sparse_threshold < preferred)
        o->sparse_threshold = preferred;
    if (o->request_size < preferred)
        o->request_size = round_up(preferred, MIN_REQUEST_SIZE);
}

/* A source whose round trips are dear (a serialising NBD server: a VDDK
 * source) is read in requests whose bytes take at least ROUND_TRIPS_PER
 * times their round trip (the round trip then costs at most a seventeenth
 * of the request: one request is served at a time, and every round trip
 * is paid whole), up to LONG_REQUEST_SIZE (four of them fill the bytes in
 * flight): nbdcopy --request-size=4M's advice for VDDK, made a rule and
 * measured (benchmarks/bench_nbd.py: at 5 ms, 8 MiB requests took 1.11 s
 * for the 640 MiB image, 16 MiB ones 0.72 s). */
#define LONG_REQUEST_SIZE (16u << 20)
#define ROUND_TRIPS_PER 16u
static void as_long_as_round_trips(struct ic_copy_options *o, uint64_t cost)
{
    uint64_t want = cost > LONG_REQUEST_SIZE / ROUND_TRIPS_PER ? LONG_REQUEST_SIZE
                                                               : cost * ROUND_TRIPS_PER;
    if (o->request_size < want)
        o->request_size = round_up(want, MIN_REQUEST_SIZE);
}

/* Whole units only: a hole is a unit of zeros, nothing less (as qemu-img
 * aligns -S up to the destination's request alignment); a format that
 * writes whole clusters in guest order (compression) judges each cluster
 * on its own, as qemu-img -c does. */
static void whole_units(struct ic_copy_options *o, uint64_t align, int places_in_order)
{
    if (align <= 1)
        return;
    o->request_size = round_up(o->request_size, align);
    if (o->sparse_threshold && (o->sparse_threshold < align || places_in_order))
        o->sparse_threshold = align;
}

int ic_copy_options_effective(const struct ic_copy_options *asked,
                              const struct ic_copy_facts *f, struct ic_copy_options *out,
                              struct ic_error *err)
{
    if (ic_copy_options_check(asked, err) < 0)
        return -1;
    struct ic_copy_options o = *asked;
    /* a new file reads as zeros: its zero ranges need nothing */
    if (o.target_is_zero == IC_AUTO)
        o.target_is_zero = f->dst_fresh;
    if (!o.requests_in_flight)
        o.requests_in_flight = DEFAULT_REQUESTS_IN_FLIGHT;
    if (o.checksum) /* the kernel's copy shows us no data to hash */
        o.offload = 0;
    if (f->dst_discards)
        o.flush = 0;
    /* comparing, the destination's content decides what is written: it
     * is read, never assumed, and the data never copied by the kernel */
    if (o.compare_block_size) {
        o.target_is_zero = 0;
        o.offload = 0;
    }
    at_least_preferred(&o, f->dst_preferred);
    as_long_as_round_trips(&o, f->src_serial_cost);
    whole_units(&o, f->dst_write_align, f->dst_places_in_order);
    /* compared blocks tile the requests, none straddling two items */
    if (o.compare_block_size)
        o.request_size = round_up(o.request_size, o.compare_block_size);
    /* blocks tile the requests, so that none straddles two work items and
     * the output never depends on the request size */
    o.request_size = round_up(o.request_size, ic_sparse_granularity(o.sparse_threshold));
    *out = o;
    return 0;
}

/* qemu's spellings of the qcow2 versions (-o compat=) */
static const struct {
    const char *name;
    int v2;
} compat_names[] = {
    {"1.1", 0},
    {"v3", 0},
    {"0.10", 1},
    {"v2", 1},
};

int ic_create_options_set_compat(struct ic_create_options *o, const char *name,
                                 struct ic_error *err)
{
    for (size_t i = 0; i < sizeof compat_names / sizeof compat_names[0]; i++) {
        if (strcmp(name, compat_names[i].name) == 0) {
            o->compat_v2 = compat_names[i].v2;
            return 0;
        }
    }
    return ic_error_value(err, "compat must be one of 1.1, v3, 0.10, v2, not '%s'", name);
}

int ic_create_options_set_preallocation(struct ic_create_options *o, const char *name,
                                        struct ic_error *err)
{
    if (strcmp(name, "off") != 0 && strcmp(name, "metadata") != 0)
        return ic_error_value(err, "preallocation must be 'off' or 'metadata', not '%s'", name);
    o->prealloc_metadata = strcmp(name, "metadata") == 0;
    return 0;
}

int ic_create_options_set_compression_type(struct ic_create_options *o, const char *name,
                                           struct ic_error *err)
{
    if (strcmp(name, "zlib") != 0 && strcmp(name, "zstd") != 0)
        return ic_error_value(err, "compression_type must be 'zlib' or 'zstd', not '%s'", name);
    o->compression_zstd = strcmp(name, "zstd") == 0;
    return 0;
}

const char *ic_compression_type_library(const char *name)
{
    if (strcmp(name, "zlib") == 0)
        return ic_compression_library(IC_COMPRESSION_DEFLATE);
    if (strcmp(name, "zstd") == 0)
        return ic_compression_library(IC_COMPRESSION_ZSTD);
    return NULL;
}

/* The format named as ic_image_create() names it: NULL is raw, and the
 * null destination lays nothing out (raw too). */
static int creatable(const char *format, const struct ic_driver **drv, struct ic_error *err)
{
    const char *name = !format || strcmp(format, "null") == 0 ? "raw" : format;
    *drv = ic_format_driver(name);
    if (!*drv && strcmp(name, "raw") != 0)
        return ic_error_value(err, "unknown image format '%s'", name);
    if (*drv && !(*drv)->create)
        return ic_error_value(err, "cannot write %s images", name);
    return 0;
}

int ic_create_options_check(const char *format, const struct ic_create_options *o,
                            struct ic_error *err)
{
    const struct ic_driver *drv;
    if (creatable(format, &drv, err) < 0)
        return -1;
    if (!o)
        return 0;
    uint64_t c = o->cluster_size;
    if (c && (c < 512 || c > (2u << 20) || (c & (c - 1))))
        return ic_error_value(err, "cluster_size must be a power of two from 512 to 2 MiB");
    if (o->compress && o->prealloc_metadata)
        return ic_error_value(err, "compression and preallocation exclude each other");
    enum ic_compression_type type = o->compression_zstd ? IC_COMPRESSION_ZSTD
                                                        : IC_COMPRESSION_DEFLATE;
    if (o->compression_zstd && !ic_compression_available(IC_COMPRESSION_ZSTD))
        return ic_error_value(err, "compression_type 'zstd' needs libzstd, which this build of "
                              "imgcopy lacks (install libzstd-dev and rebuild)");
    if (o->compression_zstd && o->compat_v2)
        return ic_error_value(err, "compression_type 'zstd' needs compat 1.1 (qcow2 version 3)");
    if (o->compression_level > (unsigned)ic_compression_max_level(type))
        return ic_error_value(err, "compression_level must be from 1 to %d for %s (%s), or 0 "
                              "for its default (%d)", ic_compression_max_level(type),
                              o->compression_zstd ? "zstd" : "zlib",
                              ic_compression_library(type), ic_compression_default_level(type));
    if (o->compression_level && !o->compress)
        return ic_error_value(err, "compression_level without compress: nothing is compressed");
    if (!drv && o->backing_file)
        return ic_error_value(err, "raw images have no backing file");
    if (o->backing_format && !ic_format_readable(o->backing_format))
        return ic_error_value(err, "backing format must be one of the readable formats, not "
                              "'%s'", o->backing_format);
    if (o->backing_file && (!o->backing_file[0] || strlen(o->backing_file) > 1023))
        return ic_error_value(err, "backing file name must be 1 to 1023 bytes");
    return 0;
}
