#!/bin/sh
# make test-sanitize preloads ASan into Python, and children inherit it:
# qemu-img hangs under it (its coroutines), and the fuzzer and C tests
# bring their own sanitizer runtimes.  DIR gets one shim per such tool that
# runs it without the preload; PATH=DIR:$PATH puts them first.  The shim
# keeps the preload in IMGCOPY_ASAN_PRELOAD for the commands such a tool runs
# (nbdkit --run starting imgcopy again).
set -eu
dir=$1
rm -rf "$dir"
mkdir -p "$dir"
for tool in qemu-img qemu-io qemu-nbd nbdkit nbdcopy nbdinfo nbdsh make cc gcc clang; do
    path=$(command -v "$tool") || continue
    printf '#!/bin/sh\nexport IMGCOPY_ASAN_PRELOAD="${LD_PRELOAD:-}"\nunset LD_PRELOAD\nexec %s "$@"\n' \
        "$path" > "$dir/$tool"
    chmod +x "$dir/$tool"
done
