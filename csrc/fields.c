/* The structs front ends fill in and show, field by field (imgcopy.h). */
#include <stddef.h>

#include "imgcopy.h"

#define FIELD(type, name, kind) {#name, kind, offsetof(type, name), NULL}

const struct ic_field ic_copy_option_fields[] = {
    FIELD(struct ic_copy_options, sparse_threshold, IC_FIELD_U64),
    FIELD(struct ic_copy_options, request_size, IC_FIELD_U64),
    FIELD(struct ic_copy_options, concurrency, IC_FIELD_UNSIGNED),
    FIELD(struct ic_copy_options, out_of_order, IC_FIELD_FLAG),
    FIELD(struct ic_copy_options, target_is_zero, IC_FIELD_AUTO_FLAG),
    FIELD(struct ic_copy_options, offload, IC_FIELD_FLAG),
    FIELD(struct ic_copy_options, flush, IC_FIELD_FLAG),
    FIELD(struct ic_copy_options, connections, IC_FIELD_UNSIGNED),
    FIELD(struct ic_copy_options, requests_in_flight, IC_FIELD_UNSIGNED),
    FIELD(struct ic_copy_options, retries, IC_FIELD_UNSIGNED),
    FIELD(struct ic_copy_options, retry_delay_ms, IC_FIELD_U64),
    {NULL, IC_FIELD_U64, 0, NULL},
};

static int choose_compat(void *s, const char *name, struct ic_error *err)
{
    return ic_create_options_set_compat(s, name, err);
}

static int choose_preallocation(void *s, const char *name, struct ic_error *err)
{
    return ic_create_options_set_preallocation(s, name, err);
}

static int choose_compression_type(void *s, const char *name, struct ic_error *err)
{
    return ic_create_options_set_compression_type(s, name, err);
}

/* compat, preallocation and compression_type are qemu's names of the choices they set */
const struct ic_field ic_create_option_fields[] = {
    FIELD(struct ic_create_options, cluster_size, IC_FIELD_U64),
    {"compat", IC_FIELD_CHOICE, 0, choose_compat},
    {"preallocation", IC_FIELD_CHOICE, 0, choose_preallocation},
    FIELD(struct ic_create_options, compress, IC_FIELD_FLAG),
    {"compression_type", IC_FIELD_CHOICE, 0, choose_compression_type},
    FIELD(struct ic_create_options, compression_level, IC_FIELD_UNSIGNED),
    FIELD(struct ic_create_options, backing_file, IC_FIELD_TEXT),
    FIELD(struct ic_create_options, backing_format, IC_FIELD_TEXT),
    {NULL, IC_FIELD_U64, 0, NULL},
};

/* done and total are progress, not a result */
const struct ic_field ic_copy_stats_fields[] = {
    FIELD(struct ic_copy_stats, bytes_read, IC_FIELD_U64),
    FIELD(struct ic_copy_stats, bytes_written, IC_FIELD_U64),
    FIELD(struct ic_copy_stats, bytes_zeroed, IC_FIELD_U64),
    FIELD(struct ic_copy_stats, bytes_skipped, IC_FIELD_U64),
    FIELD(struct ic_copy_stats, bytes_already_zero, IC_FIELD_U64),
    FIELD(struct ic_copy_stats, read_requests, IC_FIELD_U64),
    FIELD(struct ic_copy_stats, write_requests, IC_FIELD_U64),
    FIELD(struct ic_copy_stats, zero_requests, IC_FIELD_U64),
    FIELD(struct ic_copy_stats, extents, IC_FIELD_U64),
    FIELD(struct ic_copy_stats, bytes_changed, IC_FIELD_U64),
    FIELD(struct ic_copy_stats, bytes_compared, IC_FIELD_U64),
    FIELD(struct ic_copy_stats, bytes_equal, IC_FIELD_U64),
    {NULL, IC_FIELD_U64, 0, NULL},
};

const struct ic_field ic_cache_stats_fields[] = {
    FIELD(struct ic_cache_stats, hits, IC_FIELD_U64),
    FIELD(struct ic_cache_stats, misses, IC_FIELD_U64),
    FIELD(struct ic_cache_stats, lseek_calls, IC_FIELD_U64),
    FIELD(struct ic_cache_stats, intervals, IC_FIELD_U64),
    {NULL, IC_FIELD_U64, 0, NULL},
};
