/* The run-time loader (runtime_lib.h). */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include "runtime_lib.h"

static void *open_first(struct ic_runtime_lib *lib, const char **opened)
{
    const char *name = lib->env ? getenv(lib->env) : NULL;
    if (name && name[0]) {
        *opened = name;
        return dlopen(name, RTLD_NOW | RTLD_LOCAL);
    }
    void *so = NULL;
    for (size_t i = 0; !so && lib->sonames[i]; i++) {
        *opened = lib->sonames[i];
        so = dlopen(lib->sonames[i], RTLD_NOW | RTLD_LOCAL);
    }
    *opened = lib->sonames[0]; /* what the message names */
    return so;
}

int ic_runtime_lib_load(struct ic_runtime_lib *lib, const struct ic_runtime_symbol *symbols,
                        size_t nsymbols, void **handle)
{
    const char *name = NULL;
    void *so = open_first(lib, &name);
    if (!so) {
        const char *why = dlerror();
        snprintf(lib->detail, sizeof lib->detail, "%s", why ? why : name);
        lib->missing = name;
        return -1;
    }
    for (size_t i = 0; i < nsymbols; i++) {
        *symbols[i].slot = dlsym(so, symbols[i].name);
        if (!*symbols[i].slot && symbols[i].alias)
            *symbols[i].slot = dlsym(so, symbols[i].alias);
        if (!*symbols[i].slot && symbols[i].required) {
            snprintf(lib->detail, sizeof lib->detail, "%s lacks %s (%s is needed)", name,
                     symbols[i].name, lib->needs);
            lib->missing = symbols[i].name;
            return -1;
        }
    }
    if (handle)
        *handle = so;
    return 0;
}
