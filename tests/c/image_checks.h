/* What the C tests ask of an image they wrote: ic_image_check() finds it
 * whole (no corruption, leak or error), as qemu-img check would. */
#ifndef IMGCOPY_TEST_IMAGE_CHECKS_H
#define IMGCOPY_TEST_IMAGE_CHECKS_H

#include "check.h"
#include "imgcopy.h"

static void check_image_clean(struct ic_image *img, const char *what)
{
    struct ic_error err = {0};
    struct ic_check_result r;
    int ret = ic_image_check(img, &r, &err);
    CHECK(ret == 0, "%s: check: %s", what, err.msg);
    CHECK(r.corruptions == 0 && r.leaks == 0 && r.check_errors == 0 && !r.failed_errno,
          "%s: %llu corruptions, %llu leaks, %llu errors:\n%.*s", what,
          (unsigned long long)r.corruptions, (unsigned long long)r.leaks,
          (unsigned long long)r.check_errors, (int)(r.messages_len < 2000 ? r.messages_len : 2000),
          r.messages ? r.messages : "");
    ic_check_result_free(&r);
}

#endif
