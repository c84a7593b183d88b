/* Libraries loaded at run time (libcrypto for checksums, libnbd for NBD):
 * a build runs without them and says what to install when one is asked
 * for.  One loader for both: the first soname that opens, its symbols
 * resolved into the caller's slots, what failed kept for the message. */
#ifndef IMGCOPY_RUNTIME_LIB_H
#define IMGCOPY_RUNTIME_LIB_H

#include <stddef.h>

struct ic_runtime_symbol {
    const char *name;
    const char *alias; /* an older release's name, or NULL */
    void **slot;       /* POSIX: a function pointer travels through void * */
    int required;
};

struct ic_runtime_lib {
    const char *env;             /* names another build (or none): tests use it */
    const char *const *sonames;  /* tried in order, NULL-terminated */
    const char *needs;           /* "OpenSSL 1.1 or later": said when a symbol lacks */
    const char *missing;         /* after loading: NULL, or what failed */
    char detail[256];            /* why */
};

/* 0 when loaded, -1 with lib->missing and lib->detail set. */
int ic_runtime_lib_load(struct ic_runtime_lib *lib, const struct ic_runtime_symbol *symbols,
                        size_t nsymbols, void **handle);

#endif
