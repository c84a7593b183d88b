#!/bin/sh
# Regenerate the tar fuzzer's seed corpus (tests/fuzz/seeds/tar/) with
# qemu-img, qemu-io and GNU tar: small archives in every header format the
# parser reads, holding the members the harness asks for ("disk.raw",
# "disk.qcow2", "vm/top.qcow2" over "vm/base.qcow2").  Every seed stays
# below the fuzzer's -max_len (256 KiB); the directory below 1 MiB.
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${1:-$HERE/seeds/tar}
command -v qemu-img >/dev/null && command -v qemu-io >/dev/null && command -v tar >/dev/null || {
    echo "make_seeds_tar.sh: needs qemu-img, qemu-io (Debian: qemu-utils) and GNU tar" >&2
    exit 1
}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/imgcopy-seeds-tar.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
cd "$TMP"
mkdir -p "$OUT" vm

# a raw disk: data, a zero run, a hole, an odd tail
printf 'raw disk data %.0s' $(seq 1 200) > disk.raw
truncate -s 24577 disk.raw
qemu-img create -q -f qcow2 -o cluster_size=512 disk.qcow2 64k
qemu-io -f qcow2 -c "write -P 0x41 0 1k" -c "write -z 8k 1k" -c "write -P 0x42 60k 512" \
    disk.qcow2 >/dev/null
qemu-img create -q -f qcow2 -o cluster_size=512 vm/base.qcow2 32k
qemu-io -f qcow2 -c "write -P 0x51 0 2k" vm/base.qcow2 >/dev/null
qemu-img create -q -f qcow2 -o cluster_size=512 -b base.qcow2 -F qcow2 vm/top.qcow2 32k
qemu-io -f qcow2 -c "write -P 0x52 1k 1k" vm/top.qcow2 >/dev/null

for fmt in gnu ustar pax v7; do
    tar --format=$fmt --owner=0 --group=0 --mtime=@1700000000 -cf "$OUT/$fmt.tar" \
        disk.raw disk.qcow2 vm/base.qcow2 vm/top.qcow2
done
# "./" prefixes, and a name longer than 100 bytes (GNU 'L', pax path=)
long=$(printf 'd%.0s' $(seq 1 120))
mkdir "$long" && cp disk.raw "$long/disk.raw"
tar --format=gnu -cf "$OUT/gnu-dot-long.tar" ./disk.qcow2 "$long/disk.raw" ./disk.raw
tar --format=pax -cf "$OUT/pax-long.tar" "$long/disk.raw" disk.qcow2
# GNU sparse members (refused by name), and members after them
truncate -s 65536 holes.raw && printf 'x' | dd of=holes.raw bs=1 seek=30000 conv=notrunc 2>/dev/null
tar --format=gnu --sparse -cf "$OUT/gnu-sparse.tar" holes.raw disk.raw
tar --format=pax --sparse -cf "$OUT/pax-sparse.tar" holes.raw disk.qcow2
ls -l "$OUT"
