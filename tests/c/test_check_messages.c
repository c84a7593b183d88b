/* The check's detail lines (csrc/check.c): appended in order, repeated
 * from the buffer itself (an L2 table named again), capped; and the image
 * layer's answer for a format without a checker. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "check.h"            /* the tests' CHECK (tests/c/check.h) */
#include "../../csrc/check_messages.h" /* the check's messages */

/* Lines of several lengths at the start of r, then filler lines until
 * fewer than 1024 + room bytes are left below the cap (1024: what a line
 * needs); [0, *run_end) is the run. */
static void fill_near_cap(struct ic_check_result *r, size_t room, size_t *run_end)
{
    memset(r, 0, sizeof *r);
    for (int i = 0; i < 40; i++)
        CHECK(ic_check_message(r, "run line %d %0*d\n", i, 10 + 7 * i, 0) == 0, "run");
    *run_end = r->messages_len;
    while (r->messages_len + 1024 + room < IC_CHECK_MESSAGES_MAX) {
        size_t chunk = r->messages_len < (1u << 20) ? r->messages_len : (1u << 20);
        if (r->messages_len + chunk + 1024 + room < IC_CHECK_MESSAGES_MAX)
            CHECK(ic_check_repeat(r, 0, chunk) == 0, "fill");
        else
            CHECK(ic_check_message(r, "%0200d\n", 0) == 0, "fill");
    }
}

/* Near the cap, repeating a run appends what giving its lines again
 * would: the lines that still fit, whole (a pass over an L2 table
 * replayed has the text of the pass scanned again). */
static void test_repeat_near_the_cap(void)
{
    for (size_t room = 0; room < 4000; room += 333) {
        struct ic_check_result a, b;
        size_t run_end;
        fill_near_cap(&a, room, &run_end);
        fill_near_cap(&b, room, &run_end);
        size_t before = a.messages_len;
        CHECK(ic_check_repeat(&a, 0, run_end) == 0, "repeat");
        for (int i = 0; i < 40; i++)
            CHECK(ic_check_message(&b, "run line %d %0*d\n", i, 10 + 7 * i, 0) == 0, "again");
        CHECK(a.messages_len == b.messages_len, "room %zu: repeat %zu bytes, lines again %zu",
              room, a.messages_len - before, b.messages_len - before);
        CHECK(memcmp(a.messages, b.messages, a.messages_len + 1) == 0, "room %zu: same text",
              room);
        CHECK(a.messages_len <= IC_CHECK_MESSAGES_MAX, "capped");
        CHECK(a.messages[a.messages_len - 1] == '\n', "whole lines");
        ic_check_result_free(&a);
        ic_check_result_free(&b);
    }
}

int main(void)
{
    test_repeat_near_the_cap();
    struct ic_check_result r;
    memset(&r, 0, sizeof r);
    CHECK(ic_check_message(&r, "ERROR cluster %d refcount=%d reference=%d\n", 5, 0, 1) == 0,
          "append");
    size_t from = r.messages_len;
    CHECK(ic_check_message(&r, "Leaked cluster %d\n", 6) == 0, "append");
    size_t to = r.messages_len;
    CHECK(strcmp(r.messages, "ERROR cluster 5 refcount=0 reference=1\nLeaked cluster 6\n") == 0,
          "text: %s", r.messages);
    /* repeated many times: the buffer moves as it grows, the copies do not
     * read freed memory (ASan would say) */
    for (int i = 0; i < 5000; i++)
        CHECK(ic_check_repeat(&r, from, to) == 0, "repeat");
    CHECK(r.messages_len == to + 5000 * (to - from), "length %zu", r.messages_len);
    CHECK(memcmp(r.messages + r.messages_len - (to - from), "Leaked cluster 6\n", to - from) == 0,
          "last copy");
    CHECK(r.messages[r.messages_len] == '\0', "terminated");
    /* an empty or bad range adds nothing */
    size_t len = r.messages_len;
    CHECK(ic_check_repeat(&r, to, to) == 0 && r.messages_len == len, "empty");
    CHECK(ic_check_repeat(&r, 0, len + 1) == 0 && r.messages_len == len, "past the end");
    /* the cap: lines past it are dropped, never an error */
    for (size_t before = 0; before != r.messages_len;) {
        before = r.messages_len;
        size_t chunk = before < (1u << 20) ? before : (1u << 20);
        CHECK(ic_check_repeat(&r, 0, chunk) == 0, "fill");
        if (r.messages_len == before) /* a chunk no longer fits: lines until the cap */
            CHECK(ic_check_message(&r, "%0500d\n", 0) == 0, "fill");
    }
    for (int i = 0; i < 100; i++)
        CHECK(ic_check_message(&r, "ERROR past the cap %d\n", i) == 0, "capped");
    CHECK(r.messages_len <= IC_CHECK_MESSAGES_MAX, "capped at %zu", r.messages_len);
    CHECK(ic_check_repeat(&r, 0, 4096) == 0 && r.messages_len <= IC_CHECK_MESSAGES_MAX,
          "repeat capped");
    ic_check_result_free(&r);
    CHECK(r.messages == NULL && r.messages_len == 0, "freed");

    /* raw has no checker: ENOTSUP, qemu's message */
    char path[] = "/tmp/imgcopy-test-check-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp");
    CHECK(ftruncate(fd, 1 << 20) == 0, "ftruncate");
    close(fd);
    struct ic_image *img;
    struct ic_error err = {0};
    CHECK(ic_image_open(path, "raw", 0, &img, &err) == 0, "open: %s", err.msg);
    CHECK(ic_image_check(img, &r, &err) == -1, "raw checked");
    CHECK(err.kind == IC_ERR_OS && err.errnum == ENOTSUP, "error %d %d", err.kind, err.errnum);
    CHECK(strstr(err.msg, "This image format does not support checks") != NULL, "%s", err.msg);
    ic_image_close(img);
    unlink(path);
    printf("test_check_messages: %lu checks passed\n", check_count);
    return 0;
}
