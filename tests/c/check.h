/* The C tests' one assertion: print where and why, then exit 1. */
#ifndef IMGCOPY_TEST_CHECK_H
#define IMGCOPY_TEST_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#define CHECK(cond, ...)                                                                   \
    do {                                                                                   \
        check_count++;                                                                     \
        if (!(cond)) {                                                                     \
            fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond);       \
            fprintf(stderr, __VA_ARGS__);                                                  \
            fprintf(stderr, "\n");                                                         \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

static unsigned long check_count;

#endif
