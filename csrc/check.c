/* qemu-img check through the image layer: formats check their own layer
 * (driver.h's check op); the rest have no checker, as raw has none in
 * qemu. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_messages.h"
#include "image.h"

static size_t capacity(size_t used)
{
    size_t cap = 4096;
    while (cap < used)
        cap *= 2;
    return cap;
}

/* The longest line (the rest is cut) and the room a line needs below the
 * cap. */
#define LINE_MAX_BYTES 1024

int ic_check_message(struct ic_check_result *r, const char *fmt, ...)
{
    char line[LINE_MAX_BYTES];
    if (r->messages_len + sizeof line > IC_CHECK_MESSAGES_MAX)
        return 0; /* qemu would go on printing; nobody reads that far */
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n < 0)
        return 0;
    size_t len = (size_t)n < sizeof line ? (size_t)n : sizeof line - 1;
    /* the buffer's capacity is implied by its length: a power of two, so
     * that appending a line costs no copy most of the time */
    size_t cap = capacity(r->messages ? r->messages_len + 1 : 0);
    char *grown = r->messages;
    if (r->messages_len + len + 1 > cap || !grown) {
        grown = realloc(r->messages, capacity(r->messages_len + len + 1));
        if (!grown)
            return -1;
    }
    memcpy(grown + r->messages_len, line, len);
    r->messages_len += len;
    grown[r->messages_len] = '\0';
    r->messages = grown;
    return 0;
}

int ic_check_repeat(struct ic_check_result *r, size_t from, size_t to)
{
    if (!r->messages || to > r->messages_len || from >= to)
        return 0;
    size_t len = to - from;
    if (r->messages_len + len + LINE_MAX_BYTES > IC_CHECK_MESSAGES_MAX) {
        /* near the cap: the lines ic_check_message would still have
         * appended, one by one, so that a repeat is the same text as the
         * messages given again */
        size_t keep = 0;
        while (from + keep < to && r->messages_len + keep + LINE_MAX_BYTES <=
                                       IC_CHECK_MESSAGES_MAX) {
            const char *nl = memchr(r->messages + from + keep, '\n', to - from - keep);
            keep = nl ? (size_t)(nl + 1 - (r->messages + from)) : to - from;
        }
        len = keep;
        if (!len)
            return 0;
    }
    size_t cap = capacity(r->messages_len + 1);
    if (r->messages_len + len + 1 > cap) {
        char *grown = realloc(r->messages, capacity(r->messages_len + len + 1));
        if (!grown)
            return -1;
        r->messages = grown;
    }
    memmove(r->messages + r->messages_len, r->messages + from, len);
    r->messages_len += len;
    r->messages[r->messages_len] = '\0';
    return 0;
}

int ic_image_check(struct ic_image *img, struct ic_check_result *out, struct ic_error *err)
{
    memset(out, 0, sizeof *out);
    if (!img->drv->check)
        return ic_error_os(err, ENOTSUP, img->path, "This image format does not support "
                           "checks");
    if (img->drv->check(img, out, err) < 0) {
        ic_check_result_free(out);
        return -1;
    }
    return 0;
}

void ic_check_result_free(struct ic_check_result *r)
{
    free(r->messages);
    r->messages = NULL;
    r->messages_len = 0;
}
