/* Disks inside tar archives (an OVA's vmdk): the header parser
 * (tar_format.c) and the protocol whose image is one member's bytes
 * (tar.c). */
#ifndef IMGCOPY_TAR_H
#define IMGCOPY_TAR_H

#include <stdint.h>

#include "../image.h"

/* Longer GNU long names or pax records than this are refused: a name is
 * never that long, and a hostile size must not become an allocation. */
#define IC_TAR_LONG_MAX (64u << 10)

struct ic_tar_member {
    uint64_t data_offset; /* where the member's bytes start in the archive */
    uint64_t size;
};

/* Find `member` (compared without leading "./") in the archive `tar`, a
 * protocol image: the first member of that name, as the archive is read
 * as a stream and what follows it never matters.  A corrupt archive is a
 * format error; a member that is not there, or not a regular file, is a
 * value error naming some of the members there are. */
int ic_tar_find(struct ic_image *tar, const char *member, struct ic_tar_member *out,
                struct ic_error *err);

/* Refuse the archive `tar` (a protocol image; `path` for the message,
 * `member` if it is itself a member of another archive) opened as a disk
 * image: a format error naming the members that look like disks (probed as
 * an image is; raw ones by a .raw or .img name), with IC_REMEDY_MEMBER
 * naming the first of them, or IC_REMEDY_AS_RAW.  Returns -1. */
int ic_tar_refuse_as_disk(struct ic_image *tar, const char *path, const char *member,
                          struct ic_error *err);

/* The member protocol (tar.c, ic_protocol_tar_member) reaches the image
 * layer through its driver's container slots only: open_on (a member of
 * an open archive), file_offset (its place there), refuse_as_disk (the
 * function above). */

#endif
