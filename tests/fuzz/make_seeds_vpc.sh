#!/bin/sh
# Regenerate the fuzzer's seed corpus (tests/fuzz/seeds/vpc/): small valid VHD
# images.  qemu-img makes the fixed disks and the empty dynamic ones (its
# dynamic blocks are 2 MiB: one with data would not fit in the fuzzer's
# max_len of 256 KiB); dynamic disks with data use small blocks, written by
# tests/gen/vpc_images.py.  The directory stays below 1 MiB.
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
TOP=$(cd "$HERE/../.." && pwd)
OUT=${1:-$HERE/seeds/vpc}
PY=${PYTHON:-python3}
command -v qemu-img >/dev/null || {
    echo "make_seeds_vpc.sh: needs qemu-img (Debian: qemu-utils)" >&2
    exit 1
}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/imgcopy-seeds.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
cd "$TMP"

# a raw source: data, a hole, data up to its odd end
head -c 70000 /dev/urandom >src.raw
truncate -s 131072 src.raw
printf 'tail of the disk' >>src.raw
truncate -s 150000 src.raw

qemu-img convert -q -f raw -O vpc -o subformat=fixed src.raw fixed-chs.vhd
qemu-img convert -q -f raw -O vpc -o subformat=fixed,force_size=on src.raw fixed-force-size.vhd
qemu-img create -q -f vpc -o subformat=dynamic empty-dynamic-64m.vhd 64M
qemu-img create -q -f vpc -o subformat=dynamic,force_size=on empty-dynamic-force-size.vhd 3000001
qemu-img create -q -f vpc -o subformat=dynamic empty-dynamic-1g.vhd 1G

# dynamic disks with data: 512-byte and 4 KiB blocks, CHS and current_size
# sizes, a sector bitmap of zeros (ignored by readers)
PYTHONPATH=$TOP "$PY" - <<'PY'
from tests.gen import vpc_images as v
import random
rng = random.Random(5)
def blob(n):
    return bytes(rng.randrange(1, 256) for _ in range(n))
def put(name, img):
    with open(name, "wb") as f:
        f.write(bytes(img))
put("dyn-512.vhd", v.dynamic(9000, {0: blob(512), 3: blob(100), 17: blob(512)}, block_size=512))
put("dyn-4k.vhd", v.dynamic(70000, {0: blob(4096), 1: blob(4096), 9: blob(2000), 17: blob(368)},
                            block_size=4096))
put("dyn-4k-vpc-chs.vhd", v.dynamic(40000, {2: blob(4096), 8: blob(1024)}, block_size=4096,
                                    creator_app=b"vpc ", geometry=(5, 4, 3)))
put("dyn-4k-hyperv.vhd", v.dynamic(30000, {0: blob(4096), 7: blob(1)}, block_size=4096,
                                   creator_app=b"win ", geometry=(3, 4, 17)))
put("dyn-64k-bitmap0.vhd", v.dynamic(200000, {1: blob(65536)}, block_size=65536,
                                     bitmap_byte=0))
put("fixed-d2v.vhd", v.fixed(blob(5000), 8192, creator_app=b"d2v ", geometry=(1, 4, 17)))
PY
rm -f src.raw
mkdir -p "$OUT"
rm -f "$OUT"/*.vhd
for f in *.vhd; do
    size=$(stat -c %s "$f")
    if [ "$size" -gt 262144 ]; then
        echo "make_seeds_vpc.sh: $f is $size bytes, above the fuzzer's max_len" >&2
        exit 1
    fi
    cp "$f" "$OUT/$f"
done
total=$(du -sb "$OUT" | cut -f1)
if [ "$total" -ge 1048576 ]; then
    echo "make_seeds_vpc.sh: the seeds take $total bytes, keep them below 1 MiB" >&2
    exit 1
fi
echo "$(ls "$OUT" | wc -l) seeds, $(du -sb "$OUT" | cut -f1) bytes in $OUT"
