#!/bin/sh
# Regenerate the fuzzer's seed corpus (tests/fuzz/seeds/qcow2/) with qemu-img and
# qemu-io: small valid qcow2 images covering what the parser must handle.
# Every seed stays below the fuzzer's -max_len (256 KiB); the directory
# stays below 1 MiB.
#
# Backing files are named as the harness lays them out in its private
# directory: "base.raw" (a fixed sparse raw file), "base.qcow2" (a copy of
# the input itself, so its chain is hostile at every level) and
# "input.qcow2" (the input: a loop).
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${1:-$HERE/seeds/qcow2}
command -v qemu-img >/dev/null && command -v qemu-io >/dev/null || {
    echo "make_seeds.sh: needs qemu-img and qemu-io (Debian: qemu-utils)" >&2
    exit 1
}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/imgcopy-seeds.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
cd "$TMP"

img() { qemu-img create -q -f qcow2 "$@"; }
io() { f=$1; shift; for c in "$@"; do qemu-io -f qcow2 -c "$c" "$f" >/dev/null; done; }

# v2 (compat=0.10): no zero flag, no feature table
img -o compat=0.10,cluster_size=4096 v2-4k.qcow2 4M
io v2-4k.qcow2 "write -P 0x11 0 8k" "write -P 0x22 1M 4k" "write -P 0x00 2M 4k" \
   "write -P 0x33 4092k 4k"

# v3 with 512-byte clusters: many L2 tables, runs of every kind
img -o cluster_size=512 v3-512.qcow2 256K
io v3-512.qcow2 "write -P 0x41 0 2k" "write -z 2k 1k" "write -P 0x42 8k 512" \
   "write -P 0x43 64k 4k" "write -z 128k 32k" "discard 65k 1k"

# v3 with 4k clusters: data, zero clusters, a discard
img -o cluster_size=4096 v3-4k.qcow2 1M
io v3-4k.qcow2 "write -P 0x51 0 12k" "write -z 16k 8k" "write -P 0x52 512k 4k" \
   "write -P 0x53 1020k 4k" "discard 4k 4k"

# v3 with 16k clusters (64k ones with data would not fit in max_len): zero
# clusters, a zero cluster keeping its allocation, data at the end; and an
# empty 64k-cluster image of 64 GiB (4 clusters)
img -o cluster_size=16384 v3-16k-zero.qcow2 8M
io v3-16k-zero.qcow2 "write -z 0 32k" "write -P 0x62 48k 16k" "write -z 48k 16k" \
   "write -P 0x63 8176k 16k"
img -o cluster_size=65536 v3-64k-empty.qcow2 64G

# compressed clusters (zlib), next to normal ones
img -o cluster_size=4096 v3-compressed.qcow2 256K
io v3-compressed.qcow2 "write -c -P 0x71 0 4k" "write -c -P 0x72 4k 4k" "write -P 0x73 8k 4k" \
   "write -c -P 0x00 12k 4k" "write -c -P 0x74 64k 4k"
img -o compat=0.10,cluster_size=512 v2-compressed-512.qcow2 64K
io v2-compressed-512.qcow2 "write -c -P 0x75 0 512" "write -c -P 0x76 1k 512" "write -P 0x77 2k 512"

# refcount widths: 1 and 64 bits (the preallocation detector reads both)
img -o cluster_size=4096,refcount_bits=1 v3-refcount1.qcow2 512K
io v3-refcount1.qcow2 "write -P 0x81 0 8k"
img -o cluster_size=4096,refcount_bits=64 v3-refcount64.qcow2 512K
io v3-refcount64.qcow2 "write -P 0x82 0 8k"

# metadata preallocation on a tiny image (all clusters allocated, the file
# is mostly holes: the harness writes inputs back sparse)
img -o cluster_size=512,preallocation=metadata v3-prealloc-meta.qcow2 64K
io v3-prealloc-meta.qcow2 "write -P 0x91 0 1k"

# backing files: raw, qcow2, and the image itself (a loop)
qemu-img create -q -f raw base.raw 1M
img -u -o cluster_size=4096 -b base.raw -F raw backing-raw.qcow2 1M
io backing-raw.qcow2 "write -P 0xa1 4k 4k" "write -z 64k 8k"
cp v3-4k.qcow2 base.qcow2
img -u -o cluster_size=4096 -b base.qcow2 -F qcow2 backing-qcow2.qcow2 1M
io backing-qcow2.qcow2 "write -P 0xa2 8k 4k"
img -u -o cluster_size=4096 -b input.qcow2 -F qcow2 backing-self.qcow2 1M
# v2 without a backing format extension (the backing file is probed):
# qemu 7.2 insists on -F, so blank the extension (it starts at byte 72)
img -u -o compat=0.10,cluster_size=512 -b base.raw -F raw backing-noformat-v2.qcow2 64K
dd if=/dev/zero of=backing-noformat-v2.qcow2 bs=1 seek=72 count=8 conv=notrunc status=none

# zstd clusters (refused by a build without libzstd), 4 KiB and 512-byte
# clusters, several sharing sectors
img -o cluster_size=4096,compression_type=zstd v3-zstd.qcow2 256K 2>/dev/null || true
[ -f v3-zstd.qcow2 ] && io v3-zstd.qcow2 "write -c -P 0xb1 0 4k" 2>/dev/null || true
img -o cluster_size=512,compression_type=zstd v3-zstd-512.qcow2 64K 2>/dev/null || true
[ -f v3-zstd-512.qcow2 ] && io v3-zstd-512.qcow2 "write -c -P 0xb2 0 512" \
    "write -c -P 0xb3 512 512" "write -c -P 0xb4 4k 512" "write -P 0xb5 8k 1k" \
    2>/dev/null || true

# persistent bitmaps: a directory of several entries (fine and coarse
# granularities, a disabled one, a long name), and bitmaps left in use by
# a qemu-io that died with the image open for writing
img -o cluster_size=4096 v3-bitmaps.qcow2 1M
io v3-bitmaps.qcow2 "write -P 0xd1 0 8k"
qemu-img bitmap --add -g 512 v3-bitmaps.qcow2 fine
qemu-img bitmap --add -g 64k --disable v3-bitmaps.qcow2 off
qemu-img bitmap --add -g 2M v3-bitmaps.qcow2 "a-bitmap-with-a-rather-long-name-$(printf '%0100d' 0)"
img -o cluster_size=4096 v3-bitmaps-in-use.qcow2 1M
qemu-img bitmap --add -g 4k v3-bitmaps-in-use.qcow2 dirty
qemu-img bitmap --add --disable v3-bitmaps-in-use.qcow2 off
qemu-io -f qcow2 -c "sigraise 9" v3-bitmaps-in-use.qcow2 >/dev/null 2>&1 || true

# dirty bits: bitmaps of 512 B to 2 MiB granules recording guest writes
# (a first sector, a write across clusters, write zeroes, the last
# sector); with 512-byte clusters the finest bitmap's table has several
# entries, and a 4 KiB-cluster image of 34 MiB holds one of three clusters
# (the middle one all clean: no cluster)
img -o cluster_size=512 v3-bitmaps-dirty-512.qcow2 3M
for g in 512 4k 64k 2M; do qemu-img bitmap --add -g $g v3-bitmaps-dirty-512.qcow2 "g$g"; done
qemu-img bitmap --add --disable v3-bitmaps-dirty-512.qcow2 off
io v3-bitmaps-dirty-512.qcow2 "write -P 0xe1 0 512" "write -P 0xe2 1000k 3k" \
   "write -z 2M 64k" "write -P 0xe3 3071k 1k"
img -o cluster_size=4096 v3-bitmaps-dirty-4k.qcow2 34M
qemu-img bitmap --add -g 512 v3-bitmaps-dirty-4k.qcow2 fine
qemu-img bitmap --add -g 1M v3-bitmaps-dirty-4k.qcow2 coarse
io v3-bitmaps-dirty-4k.qcow2 "write -P 0xe4 4k 4k" "write -P 0xe6 33m 512" \
   "write -P 0xe7 34812k 4k"

# features imgcopy refuses, by name: extended L2, dirty, external data
img -o cluster_size=16384,extended_l2=on v3-extl2.qcow2 1M
img -o cluster_size=4096,lazy_refcounts=on v3-dirty.qcow2 256K
qemu-io -f qcow2 -c "write -P 0xc1 0 4k" -c abort v3-dirty.qcow2 >/dev/null 2>&1 || true
qemu-img create -q -f raw data.raw 256K
img -o cluster_size=4096,data_file=data.raw v3-datafile.qcow2 256K

rm -f base.raw base.qcow2 data.raw
mkdir -p "$OUT"
rm -f "$OUT"/*.qcow2
for f in *.qcow2; do
    size=$(stat -c %s "$f")
    if [ "$size" -gt 262144 ]; then
        echo "make_seeds.sh: $f is $size bytes, above the fuzzer's max_len" >&2
        exit 1
    fi
    cp "$f" "$OUT/$f"
done
total=$(du -sb "$OUT" | cut -f1)
if [ "$total" -ge 1048576 ]; then
    echo "make_seeds.sh: the seeds take $total bytes, keep them below 1 MiB" >&2
    exit 1
fi
echo "$(ls "$OUT" | wc -l) seeds, $(du -sb "$OUT" | cut -f1) bytes in $OUT"
