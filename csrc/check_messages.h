/* For format drivers' check op (driver.h): the detail lines qemu-img check
 * prints on stderr, collected in the result. */
#ifndef IMGCOPY_CHECK_MESSAGES_H
#define IMGCOPY_CHECK_MESSAGES_H

#include "imgcopy.h"

/* Messages kept per check: a hostile image may produce a line per host
 * cluster; past this the rest are counted in one closing line. */
#define IC_CHECK_MESSAGES_MAX (16u << 20)

/* Append one printf-formatted line (the caller ends it with "\n"); -1
 * only without memory. */
int ic_check_message(struct ic_check_result *r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Append again what messages[from, to) holds (a run of lines); -1 only
 * without memory. */
int ic_check_repeat(struct ic_check_result *r, size_t from, size_t to);

#endif
