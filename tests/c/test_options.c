/* What options are valid (csrc/options.c), at the edges of every range,
 * and the tables front ends read them by (csrc/fields.c).  The copy and the
 * creation refuse what the check refuses, before they touch anything. */
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "imgcopy.h"

static int copy_valid(struct ic_copy_options o)
{
    struct ic_error err = {0};
    int r = ic_copy_options_check(&o, &err);
    CHECK((r == 0) == (err.kind == IC_ERR_NONE), "result %d, error kind %d", r, err.kind);
    CHECK(r == 0 || (err.kind == IC_ERR_VALUE && err.msg[0]), "a refusal says why");
    return r == 0;
}

static void check_copy_options(void)
{
    struct ic_copy_options d;
    ic_copy_options_init(&d);
    CHECK(copy_valid(d), "the defaults are valid");
    CHECK(d.sparse_threshold == 4096 && d.out_of_order && d.flush &&
              d.target_is_zero == IC_AUTO && !d.offload && !d.log,
          "defaults");
    struct {
        uint64_t sparse_threshold, request_size;
        unsigned concurrency;
        int valid;
    } cases[] = {
        {0, 4096, 1, 1},
        {512, 1u << 30, 1024, 1},
        {16u << 20, 2u << 20, 4, 1},
        {(16u << 20) + 512, 2u << 20, 4, 0}, /* qemu-img's -S limit */
        {1000, 2u << 20, 4, 0},             /* not whole sectors */
        {4096, 4095, 4, 0},
        {4096, 4096 + 512, 4, 0},
        {4096, (1u << 30) + 4096, 4, 0},
        {4096, 0, 4, 0},
        {4096, 2u << 20, 0, 0},
        {4096, 2u << 20, 1025, 0},
        {4096, 2u << 20, ~0u, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct ic_copy_options o = d;
        o.sparse_threshold = cases[i].sparse_threshold;
        o.request_size = cases[i].request_size;
        o.concurrency = cases[i].concurrency;
        CHECK(copy_valid(o) == cases[i].valid, "case %zu", i);
    }
}

/* The options a copy runs with, from those asked for and its images' facts. */
static struct ic_copy_options effective(struct ic_copy_options asked, struct ic_copy_facts f)
{
    struct ic_copy_options out;
    struct ic_error err = {0};
    memset(&out, 0xa5, sizeof out);
    CHECK(ic_copy_options_effective(&asked, &f, &out, &err) == 0, "%s", err.msg);
    return out;
}

static void check_effective_options(void)
{
    struct ic_copy_options d;
    ic_copy_options_init(&d);
    const struct ic_copy_facts file = {.dst_write_align = 1};
    struct ic_copy_options o = effective(d, file);
    CHECK(o.sparse_threshold == 4096 && o.request_size == d.request_size &&
              o.concurrency == d.concurrency && o.flush && o.requests_in_flight == 64,
          "a file changes nothing but auto");
    /* target_is_zero: auto is whether the copy made the destination */
    CHECK(o.target_is_zero == 0, "an existing file: %d", o.target_is_zero);
    CHECK(effective(d, (struct ic_copy_facts){.dst_write_align = 1, .dst_fresh = 1})
              .target_is_zero == 1, "a new file reads as zeros");
    struct ic_copy_options asked = d;
    asked.target_is_zero = 1;
    CHECK(effective(asked, file).target_is_zero == 1, "asked for: an existing destination");
    asked.target_is_zero = 0;
    CHECK(effective(asked, (struct ic_copy_facts){.dst_fresh = 1}).target_is_zero == 0,
          "asked against: a new one");

    /* an NBD server preferring 64 KiB: requests and holes at least that */
    const struct ic_copy_facts pref64 = {.dst_preferred = 64 << 10, .dst_write_align = 512};
    asked = d;
    asked.request_size = 4096;
    o = effective(asked, pref64);
    CHECK(o.sparse_threshold == 64 << 10 && o.request_size == 64 << 10, "%llu %llu",
          (unsigned long long)o.sparse_threshold, (unsigned long long)o.request_size);
    asked.sparse_threshold = 0;
    o = effective(asked, pref64);
    CHECK(o.sparse_threshold == 0 && o.request_size == 64 << 10, "fully allocated stays so");
    asked.sparse_threshold = 1 << 20;
    asked.request_size = 4 << 20;
    o = effective(asked, pref64);
    CHECK(o.sparse_threshold == 1 << 20 && o.request_size == 4 << 20, "larger ones stay");
    /* a preference beyond -S's limit raises -S to the limit only */
    o = effective(d, (struct ic_copy_facts){.dst_preferred = 32u << 20});
    CHECK(o.sparse_threshold == IC_MAX_SPARSE_THRESHOLD && o.request_size == 16u << 20,
          "%llu %llu", (unsigned long long)o.sparse_threshold,
          (unsigned long long)o.request_size);

    /* a source whose round trip costs a good part of a request (a
     * serialising server at 0.25 ms: 256 KiB) is read in requests 16 times
     * that, up to 16 MiB; cheaper round trips change nothing */
    o = effective(d, (struct ic_copy_facts){.src_serial_cost = 256u << 10});
    CHECK(o.request_size == 4u << 20, "%llu", (unsigned long long)o.request_size);
    o = effective(d, (struct ic_copy_facts){.src_serial_cost = 1u << 20});
    CHECK(o.request_size == 16u << 20, "%llu", (unsigned long long)o.request_size);
    o = effective(d, (struct ic_copy_facts){.src_serial_cost = 80u << 20});
    CHECK(o.request_size == 16u << 20, "%llu", (unsigned long long)o.request_size);
    o = effective(d, (struct ic_copy_facts){.src_serial_cost = 64u << 10});
    CHECK(o.request_size == 2u << 20, "%llu", (unsigned long long)o.request_size);

    /* a qcow2 destination writing whole 64 KiB clusters in guest order
     * (compression): each cluster judged on its own */
    const struct ic_copy_facts clusters = {.dst_write_align = 64 << 10,
                                           .dst_places_in_order = 1};
    asked = d;
    asked.sparse_threshold = 1 << 20;
    asked.request_size = 100 * 4096;
    o = effective(asked, clusters);
    CHECK(o.sparse_threshold == 64 << 10 && o.request_size == 448 << 10, "%llu %llu",
          (unsigned long long)o.sparse_threshold, (unsigned long long)o.request_size);
    /* an endpoint's minimum block: -S at least a block, requests whole blocks */
    asked = d;
    asked.sparse_threshold = 1024;
    asked.request_size = 12288;
    o = effective(asked, (struct ic_copy_facts){.dst_write_align = 8192});
    CHECK(o.sparse_threshold == 8192 && o.request_size == 16384, "%llu %llu",
          (unsigned long long)o.sparse_threshold, (unsigned long long)o.request_size);
    asked.sparse_threshold = 64 << 10;
    o = effective(asked, (struct ic_copy_facts){.dst_write_align = 8192});
    CHECK(o.sparse_threshold == 64 << 10 && o.request_size == 64 << 10,
          "blocks of the threshold tile the requests: %llu",
          (unsigned long long)o.request_size);
    /* the threshold's blocks tile the requests */
    asked = d;
    asked.sparse_threshold = 16u << 20;
    asked.request_size = 4u << 20;
    CHECK(effective(asked, file).request_size == 16u << 20, "16 MiB blocks");
    asked.sparse_threshold = 3 * 4096; /* blocks of 8 KiB */
    asked.request_size = 3 * 4096;
    CHECK(effective(asked, file).request_size == 16384, "8 KiB blocks");

    /* the rest */
    asked = d;
    asked.requests_in_flight = 0;
    asked.offload = 1;
    asked.checksum = "sha256";
    o = effective(asked, (struct ic_copy_facts){.dst_discards = 1});
    CHECK(o.requests_in_flight == 64 && !o.offload && !o.flush && o.checksum == asked.checksum,
          "defaults in flight, no offload with a checksum, no flush into the null sink");

    /* what the check refuses, effective() refuses, and writes nothing */
    asked = d;
    asked.request_size = 1000;
    struct ic_error err = {0};
    struct ic_copy_options out = d;
    out.concurrency = 77;
    CHECK(ic_copy_options_effective(&asked, &file, &out, &err) < 0 &&
              err.kind == IC_ERR_VALUE && out.concurrency == 77,
          "request_size 1000 refused: %s", err.msg);
    asked = d;
    asked.target_is_zero = 2;
    CHECK(ic_copy_options_effective(&asked, &file, &out, &err) < 0, "target_is_zero 2");
}

static void check_create_options(void)
{
    struct ic_error err = {0};
    struct ic_create_options o = {0};
    CHECK(ic_create_options_check("qcow2", &o, &err) == 0, "%s", err.msg);
    CHECK(ic_create_options_check(NULL, NULL, &err) == 0, "raw, defaults: %s", err.msg);
    CHECK(ic_create_options_check("null", &o, &err) == 0, "%s", err.msg);
    CHECK(ic_create_options_check("vmdk", &o, &err) < 0, "vmdk is not writable");
    uint64_t clusters[] = {512, 4096, 65536, 2u << 20, 256, 4u << 20, 3 * 4096, 1000};
    for (size_t i = 0; i < sizeof clusters / sizeof clusters[0]; i++) {
        o.cluster_size = clusters[i];
        ic_error_clear(&err);
        CHECK((ic_create_options_check("qcow2", &o, &err) == 0) == (i < 4), "cluster %llu",
              (unsigned long long)clusters[i]);
    }
    o = (struct ic_create_options){.compress = 1, .prealloc_metadata = 1};
    CHECK(ic_create_options_check("qcow2", &o, &err) < 0, "compression with preallocation");
    o = (struct ic_create_options){.backing_file = "base.raw"};
    CHECK(ic_create_options_check("qcow2", &o, &err) == 0, "%s", err.msg);
    CHECK(ic_create_options_check("raw", &o, &err) < 0, "raw has no backing file");
    o.backing_file = "";
    CHECK(ic_create_options_check("qcow2", &o, &err) < 0, "an empty backing file name");
    o = (struct ic_create_options){.backing_file = "b", .backing_format = "qed"};
    CHECK(ic_create_options_check("qcow2", &o, &err) < 0, "an unreadable backing format");

    const char *v3[] = {"1.1", "v3"}, *v2[] = {"0.10", "v2"};
    for (int i = 0; i < 2; i++) {
        o = (struct ic_create_options){.compat_v2 = 1};
        CHECK(ic_create_options_set_compat(&o, v3[i], &err) == 0 && !o.compat_v2, "%s", v3[i]);
        CHECK(ic_create_options_set_compat(&o, v2[i], &err) == 0 && o.compat_v2, "%s", v2[i]);
    }
    CHECK(ic_create_options_set_compat(&o, "1.0", &err) < 0 && strstr(err.msg, "'1.0'"),
          "an unknown compat is named: %s", err.msg);
    CHECK(ic_create_options_set_preallocation(&o, "metadata", &err) == 0 && o.prealloc_metadata,
          "metadata");
    CHECK(ic_create_options_set_preallocation(&o, "off", &err) == 0 && !o.prealloc_metadata,
          "off");
    CHECK(ic_create_options_set_preallocation(&o, "full", &err) < 0, "full is not supported");
}

/* The copy refuses what the check refuses: nothing of the destination is
 * touched (not even its size checked first). */
static void check_copy_refuses_first(void)
{
    char src_path[] = "/tmp/imgcopy-test-options-XXXXXX";
    int fd = mkstemp(src_path);
    CHECK(fd >= 0 && ftruncate(fd, 1 << 20) == 0, "source");
    close(fd);
    struct ic_error err = {0};
    struct ic_image *src, *dst;
    int fresh;
    CHECK(ic_image_open(src_path, "raw", 0, &src, &err) == 0, "%s", err.msg);
    CHECK(ic_image_create("null:", "null", 1 << 20, 0, NULL, &dst, &fresh, &err) == 0, "%s",
          err.msg);
    struct ic_copy_options o;
    ic_copy_options_init(&o);
    o.request_size = 1000;
    struct ic_copy *c = NULL;
    char why[IC_ERROR_MSG_MAX];
    CHECK(ic_copy_options_check(&o, &err) < 0, "request_size 1000");
    memcpy(why, err.msg, sizeof why);
    ic_error_clear(&err);
    CHECK(ic_copy_start(src, dst, &o, &c, &err) < 0 && !c, "the copy starts anyway");
    CHECK(err.kind == IC_ERR_VALUE && strcmp(err.msg, why) == 0, "'%s' vs '%s'", err.msg, why);
    ic_image_close(dst);
    ic_image_close(src);
    unlink(src_path);
}

/* Every table names distinct fields that lie inside their struct. */
static void check_table(const struct ic_field *fields, size_t struct_size, size_t expected)
{
    size_t n = 0;
    for (const struct ic_field *f = fields; f->name; f++, n++) {
        CHECK(f->offset < struct_size, "%s outside its struct", f->name);
        CHECK((f->kind == IC_FIELD_CHOICE) == (f->choose != NULL), "%s: choose", f->name);
        for (const struct ic_field *g = fields; g != f; g++)
            CHECK(strcmp(f->name, g->name) != 0, "%s twice", f->name);
    }
    CHECK(n == expected, "%zu fields, expected %zu", n, expected);
}

static void check_tables(void)
{
    check_table(ic_copy_option_fields, sizeof(struct ic_copy_options), 11);
    check_table(ic_create_option_fields, sizeof(struct ic_create_options), 8);
    check_table(ic_copy_stats_fields, sizeof(struct ic_copy_stats), 12);
    check_table(ic_cache_stats_fields, sizeof(struct ic_cache_stats), 4);
    /* a choice sets its struct as its name says */
    struct ic_create_options o = {0};
    struct ic_error err = {0};
    for (const struct ic_field *f = ic_create_option_fields; f->name; f++)
        if (strcmp(f->name, "compat") == 0)
            CHECK(f->choose(&o, "0.10", &err) == 0 && o.compat_v2, "compat 0.10");
}

int main(void)
{
    check_copy_options();
    check_effective_options();
    check_create_options();
    check_copy_refuses_first();
    check_tables();
    printf("test_options: %lu checks passed\n", check_count);
    return 0;
}
