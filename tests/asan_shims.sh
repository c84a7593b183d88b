#!/bin/sh
# make test-sanitize preloads ASan into Python, and children inherit it:
# qemu-img hangs under it (its coroutines), and the fuzzer and C tests
# bring their own sanitizer runtimes.  DIR gets one shim per such tool that
# runs it without the preload; PATH=DIR:$PATH puts them first.
set -eu
dir=$1
rm -rf "$dir"
mkdir -p "$dir"
for tool in qemu-img qemu-io qemu-nbd nbdkit nbdcopy nbdinfo nbdsh make cc gcc clang; do
    path=$(command -v "$tool") || continue
    printf '#!/bin/sh\nunset LD_PRELOAD\nexec %s "$@"\n' "$path" > "$dir/$tool"
    chmod +x "$dir/$tool"
done
