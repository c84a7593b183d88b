/* What this build has: the optional libraries linked in and the ones
 * loaded at run time (`imgcopy --version`, imgcopy.features()). */
#include <stddef.h>
#include <string.h>

#include "compression.h"
#include "digest.h"
#include "drivers/nbd_lib.h"
#include "imgcopy.h"

const char *const ic_libraries[] = {"zlib", "libdeflate", "zstd", "libnbd", "libcrypto", NULL};

const char *ic_library_version(const char *name)
{
    if (strcmp(name, "libnbd") == 0)
        return ic_nbd_lib_version();
    if (strcmp(name, "libcrypto") == 0)
        return ic_digest_lib_version();
    return ic_compression_lib_version(name);
}
