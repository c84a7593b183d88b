/* Finding zeros in buffers, the inner loop of sparse copying. */
#include <string.h>

#include "imgcopy.h"

int ic_is_zero(const void *buf, size_t len)
{
    const unsigned char *p = buf;
    /* a cheap look at the head rejects most data at once; then comparing
     * the buffer with itself shifted by 16 bytes lets memcmp's vector
     * loop do the rest */
    size_t head = len < 16 ? len : 16;
    for (size_t i = 0; i < head; i++)
        if (p[i])
            return 0;
    return len <= 16 || memcmp(p, p + 16, len - 16) == 0;
}
