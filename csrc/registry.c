/* Every protocol and format imgcopy has: the one list the image layer,
 * probing and Python's lists of formats come from.  A new format is its
 * driver and a line here. */
#include <string.h>

#include "driver.h"

static const struct ic_driver *const formats[] = {
    &ic_format_qcow2,
    &ic_format_vmdk,
    &ic_format_vhdx,
    &ic_format_vpc,
};

/* by what a path looks like (the whole path, or a URI's scheme: a
 * prefix ending in "://"); the file protocol takes the rest */
static const struct {
    const char *path;
    const struct ic_driver *drv;
} protocol_paths[] = {
    {"null:", &ic_protocol_null},
    {"nbd://", &ic_protocol_nbd},
    {"nbd+unix://", &ic_protocol_nbd},
    {"nbd+vsock://", &ic_protocol_nbd},
    {"nbds://", &ic_protocol_nbd},
    {"nbds+unix://", &ic_protocol_nbd},
    {"nbds+vsock://", &ic_protocol_nbd},
};

/* by the format a probe names: the protocol whose images are members of
 * such an image (the first one also opens member names, which are never
 * probed).  A new container is its driver and a line here. */
static const struct {
    const char *format;
    const struct ic_driver *drv;
} containers[] = {
    {"tar", &ic_protocol_tar_member},
};

static int names(const char *path, const char *pattern)
{
    size_t n = strlen(pattern);
    int scheme = n > 3 && strcmp(pattern + n - 3, "://") == 0;
    return scheme ? strncmp(path, pattern, n) == 0 : strcmp(path, pattern) == 0;
}

const struct ic_driver *ic_format_driver(const char *name)
{
    for (size_t i = 0; i < sizeof formats / sizeof formats[0]; i++)
        if (strcmp(formats[i]->name, name) == 0)
            return formats[i];
    return NULL;
}

const struct ic_driver *ic_protocol_for(const char *path)
{
    for (size_t i = 0; i < sizeof protocol_paths / sizeof protocol_paths[0]; i++)
        if (names(path, protocol_paths[i].path))
            return protocol_paths[i].drv;
    return &ic_protocol_file;
}

const struct ic_driver *ic_container_for(const char *format)
{
    if (!format)
        return containers[0].drv;
    for (size_t i = 0; i < sizeof containers / sizeof containers[0]; i++)
        if (strcmp(containers[i].format, format) == 0)
            return containers[i].drv;
    return NULL;
}

static size_t list(const char **names, size_t cap, int writable)
{
    size_t n = 0;
    if (n < cap)
        names[n] = "raw";
    n++;
    for (size_t i = 0; i < sizeof formats / sizeof formats[0]; i++) {
        if (writable && !formats[i]->create)
            continue;
        if (n < cap)
            names[n] = formats[i]->name;
        n++;
    }
    return n;
}

size_t ic_formats(const char **names, size_t cap)
{
    return list(names, cap, 0);
}

size_t ic_writable_formats(const char **names, size_t cap)
{
    return list(names, cap, 1);
}

int ic_format_readable(const char *format)
{
    return strcmp(format, "raw") == 0 || ic_format_driver(format) != NULL;
}
