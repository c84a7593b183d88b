/* Error details carried from the core up to Python. */
#ifndef IMGCOPY_ERROR_H
#define IMGCOPY_ERROR_H

enum ic_error_kind {
    IC_ERR_NONE = 0,
    IC_ERR_OS,          /* a system call failed: errnum and path say which */
    IC_ERR_VALUE,       /* the caller asked for something invalid         */
    IC_ERR_FORMAT,      /* the image is corrupt or uses what we lack      */
    IC_ERR_NOMEM,
    IC_ERR_READONLY,    /* a write to an image opened read-only          */
};

/* What the caller can do about an error: front ends spell it their way
 * (format="raw" in Python, -f raw on the command line). */
enum ic_remedy {
    IC_REMEDY_NONE = 0,
    IC_REMEDY_AS_RAW, /* open the file as raw bytes (an image format we lack) */
    IC_REMEDY_FORCE,  /* read a dirty or corrupt-flagged image read-only      */
    IC_REMEDY_FORCE_SHARE, /* read an image another process writes (qemu -U) */
    IC_REMEDY_MEMBER, /* read a member of the tar archive (remedy_arg), or its raw bytes */
};

#define IC_ERROR_PATH_MAX 4096
#define IC_ERROR_MSG_MAX 512

struct ic_error {
    enum ic_error_kind kind;
    int errnum;
    enum ic_remedy remedy;
    char path[IC_ERROR_PATH_MAX];
    char msg[IC_ERROR_MSG_MAX];
    char remedy_arg[256]; /* IC_REMEDY_MEMBER: the member's name */
};

/* Each returns -1 so that failures read `return ic_error_os(...)`.
 * `err` may be NULL. */
int ic_error_os(struct ic_error *err, int errnum, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
int ic_error_value(struct ic_error *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
int ic_error_format(struct ic_error *err, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Set err->remedy (after one of the above); returns -1 too. */
int ic_error_remedy(struct ic_error *err, enum ic_remedy remedy);
/* IC_REMEDY_MEMBER, naming the member (a longer name: no remedy). */
int ic_error_remedy_member(struct ic_error *err, const char *member);
int ic_error_nomem(struct ic_error *err);
int ic_error_readonly(struct ic_error *err, const char *path);
void ic_error_clear(struct ic_error *err);

#endif
