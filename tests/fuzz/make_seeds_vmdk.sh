#!/bin/sh
# Regenerate the vmdk fuzzer's seed corpus (tests/fuzz/seeds/vmdk/) with
# qemu-img and qemu-io: small valid images of every subformat qemu writes,
# as the harness (fuzz_vmdk.c) lays out its directory: extent files and
# parents are renamed to the harness's "flat.vmdk", "sparse.vmdk",
# "base.vmdk" and "input.vmdk".  Every seed stays below the fuzzer's
# -max_len (256 KiB); the directory stays below 1 MiB.
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${1:-$HERE/seeds/vmdk}
command -v qemu-img >/dev/null && command -v qemu-io >/dev/null || {
    echo "make_seeds_vmdk.sh: needs qemu-img and qemu-io (Debian: qemu-utils)" >&2
    exit 1
}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/imgcopy-seeds.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
cd "$TMP"
mkdir -p "$OUT"

io() { f=$1; shift; for c in "$@"; do qemu-io -f vmdk -c "$c" "$f" >/dev/null; done; }

# a small disk with data, zeros and holes; 4 KiB of grains would need
# options qemu lacks, so the disks stay small (a grain is 64 KiB)
qemu-img create -q -f raw src.raw 512k
qemu-io -f raw -c "write -P 0x11 0 8k" -c "write -P 0x33 508k 4k" src.raw >/dev/null

qemu-img convert -f raw -O vmdk -o subformat=monolithicSparse src.raw "$OUT/sparse.vmdk"
qemu-img convert -f raw -O vmdk -o subformat=streamOptimized src.raw "$OUT/stream.vmdk"
qemu-img convert -f raw -O vmdk -o subformat=monolithicSparse,hwversion=6 src.raw \
    "$OUT/sparse-hw6.vmdk"
qemu-img create -q -f vmdk -o zeroed_grain=on base.vmdk 512k
io base.vmdk "write -P 0x44 0 64k" "write -z 128k 64k" "write -P 0x55 448k 64k"
cp base.vmdk "$OUT/zeroed-grain.vmdk"

# a delta whose parent is the harness's copy of the input
qemu-img create -q -f vmdk -b base.vmdk -F vmdk -o zeroed_grain=on delta.vmdk
io delta.vmdk "write -P 0x66 64k 64k" "write -z 0 64k"
cp delta.vmdk "$OUT/delta.vmdk"
# and one whose parent is the harness's fixed sparse extent
cp base.vmdk sparse.vmdk
qemu-img create -q -f vmdk -b sparse.vmdk -F vmdk delta2.vmdk
io delta2.vmdk "write -P 0x77 192k 64k"
cp delta2.vmdk "$OUT/delta-of-sparse.vmdk"

# descriptor files naming the harness's flat and sparse extents
qemu-img convert -f raw -O vmdk -o subformat=monolithicFlat src.raw flat.vmdk
sed 's/"flat-flat.vmdk"/"flat.vmdk"/' flat.vmdk | tr -d '\000' >"$OUT/desc-flat.vmdk"
qemu-img convert -f raw -O vmdk -o subformat=twoGbMaxExtentSparse src.raw two.vmdk
sed 's/"two-s001.vmdk"/"sparse.vmdk"/' two.vmdk | tr -d '\000' >"$OUT/desc-sparse.vmdk"
{
    printf '# Disk DescriptorFile\r\nversion=1\r\nCID=fffffffe\r\nparentCID=ffffffff\r\n'
    printf 'createType="twoGbMaxExtentFlat"\r\n'
    printf 'RW 1000 FLAT "flat.vmdk" 0\r\nRW 2048 SPARSE "sparse.vmdk"\r\n'
    printf 'RW 1048 FLAT "flat.vmdk" 1000\r\n'
} >"$OUT/desc-mixed-crlf.vmdk"
ls -l "$OUT"
