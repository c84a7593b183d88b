/* Image formats recognised by their magic (probe.c).  Pure functions over
 * buffers, so the fuzzer can drive them. */
#ifndef IMGCOPY_PROBE_H
#define IMGCOPY_PROBE_H

#include <stddef.h>
#include <stdint.h>

/* How many bytes of the start and of the end of a file probing looks at. */
#define IC_PROBE_HEAD 512
#define IC_PROBE_TAIL 512

/* The format name the bytes look like ("raw" if none, "tar" for a tar
 * archive): `head` holds the first `hlen` bytes of the file, `tail` its
 * last `tlen` bytes (both at most the sizes above; tlen is 0 when the file
 * is shorter than the tail). */
const char *ic_probe_format(const uint8_t *head, size_t hlen, const uint8_t *tail, size_t tlen);
/* Whether `head` (hlen bytes) starts with a tar header (ustar or v7, its
 * checksum right): ic_probe_format's "tar". */
int ic_probe_is_tar(const uint8_t *head, size_t hlen);
/* The container format (registry.c's ic_container_for) `head` starts
 * with, whatever format it is named as ("tar"), or NULL. */
const char *ic_probe_container(const uint8_t *head, size_t hlen);

#endif
