/* Recording a copy's requests (request_log.c); the reading side is in
 * imgcopy.h. */
#ifndef IMGCOPY_REQUEST_LOG_H
#define IMGCOPY_REQUEST_LOG_H

#include <stdint.h>

struct ic_request_log;

/* Record one request (thread-safe; nothing when `log` is NULL). */
void ic_request_log_add(struct ic_request_log *log, uint64_t off, uint64_t len, uint32_t kind);
/* Whether a request could not be recorded (out of memory). */
int ic_request_log_failed(const struct ic_request_log *log);

#endif
