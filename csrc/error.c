#include "error.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static void set(struct ic_error *err, enum ic_error_kind kind, int errnum, const char *path,
                const char *fmt, va_list ap)
{
    /* the message may quote the error it replaces: format it aside */
    char msg[sizeof err->msg];
    vsnprintf(msg, sizeof msg, fmt, ap);
    char where[sizeof err->path];
    snprintf(where, sizeof where, "%s", path ? path : "");
    err->kind = kind;
    err->errnum = errnum;
    err->remedy = IC_REMEDY_NONE;
    err->remedy_arg[0] = '\0';
    memcpy(err->path, where, sizeof where);
    memcpy(err->msg, msg, sizeof msg);
}

int ic_error_remedy(struct ic_error *err, enum ic_remedy remedy)
{
    if (err)
        err->remedy = remedy;
    return -1;
}

int ic_error_remedy_member(struct ic_error *err, const char *member)
{
    if (err && strlen(member) < sizeof err->remedy_arg) {
        err->remedy = IC_REMEDY_MEMBER;
        snprintf(err->remedy_arg, sizeof err->remedy_arg, "%s", member);
    }
    return -1;
}

int ic_error_os(struct ic_error *err, int errnum, const char *path, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        set(err, IC_ERR_OS, errnum, path, fmt, ap);
        va_end(ap);
    }
    return -1;
}

int ic_error_value(struct ic_error *err, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        set(err, IC_ERR_VALUE, EINVAL, NULL, fmt, ap);
        va_end(ap);
    }
    return -1;
}

int ic_error_format(struct ic_error *err, const char *path, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        set(err, IC_ERR_FORMAT, EINVAL, path, fmt, ap);
        va_end(ap);
    }
    return -1;
}

int ic_error_nomem(struct ic_error *err)
{
    if (err) {
        err->kind = IC_ERR_NOMEM;
        err->errnum = ENOMEM;
        err->remedy = IC_REMEDY_NONE;
        err->path[0] = '\0';
        snprintf(err->msg, sizeof err->msg, "out of memory");
    }
    return -1;
}

void ic_error_clear(struct ic_error *err)
{
    if (err) {
        err->kind = IC_ERR_NONE;
        err->errnum = 0;
        err->remedy = IC_REMEDY_NONE;
        err->path[0] = '\0';
        err->msg[0] = '\0';
    }
}

int ic_error_readonly(struct ic_error *err, const char *path)
{
    if (err) {
        err->kind = IC_ERR_READONLY;
        err->errnum = EBADF;
        err->remedy = IC_REMEDY_NONE;
        snprintf(err->path, sizeof err->path, "%s", path ? path : "");
        snprintf(err->msg, sizeof err->msg, "image is open read-only");
    }
    return -1;
}
