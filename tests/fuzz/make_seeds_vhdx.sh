#!/bin/sh
# Regenerate the VHDX fuzzer's seeds (tests/fuzz/seeds/vhdx/) with qemu-img
# and qemu-io: small valid images of every kind qemu makes, plus a
# differencing image written by tests/gen/vhdx_images.py (qemu cannot make
# one).  Each is stored in the harness's segment form (fuzz_vhdx.c,
# hostile_vhdx.py's to_segments): the non-zero 512-byte sectors only.  Every
# seed stays below the fuzzer's -max_len (256 KiB), the directory below
# 1 MiB.
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
OUT=${1:-$HERE/seeds/vhdx}
command -v qemu-img >/dev/null && command -v qemu-io >/dev/null || {
    echo "make_seeds_vhdx.sh: needs qemu-img and qemu-io (Debian: qemu-utils)" >&2
    exit 1
}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/imgcopy-seeds-vhdx.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
cd "$TMP"

img() { qemu-img create -q -f vhdx "$@"; }
io() { f=$1; shift; for c in "$@"; do qemu-io -f vhdx -c "$c" "$f" >/dev/null; done; }

# dynamic, 1 MiB blocks: data, zeros, data at the odd end
img -o block_size=1M dyn-1m.vhdx 5121K
io dyn-1m.vhdx "write -P 0x11 0 4k" "write -z 1M 1M" "write -P 0x22 3M 512" \
   "write -P 0x33 5120k 1k"
# dynamic, 8 MiB blocks, block_state_zero=off
img -o block_size=8M,block_state_zero=off dyn-8m.vhdx 20M
io dyn-8m.vhdx "write -P 0x44 8M 4k" "write -P 0x55 20476k 4k"
# dynamic, 32 MiB blocks, a larger log
img -o block_size=32M,log_size=2M dyn-32m.vhdx 64M
io dyn-32m.vhdx "write -P 0x66 100k 8k"
# an empty dynamic image, and a fixed one with a little data
img empty.vhdx 1G
img -o subformat=fixed,block_size=1M fixed-1m.vhdx 3M
io fixed-1m.vhdx "write -P 0x77 0 4k" "write -P 0x78 2M 4k"

cd "$REPO"
python3 - "$TMP" <<'PY'
import os, sys
from tests.fuzz.hostile_vhdx import to_segments, base
tmp = sys.argv[1]
b, _ = base(diff=True, parent="base.vhdx")
open(os.path.join(tmp, "diff-base.vhdx"), "wb").write(bytes(b))
b, _ = base(diff=True, parent="nothing.vhdx", lss=4096)
open(os.path.join(tmp, "diff-4k-missing-parent.vhdx"), "wb").write(bytes(b))
b, _ = base(lss=4096)
open(os.path.join(tmp, "dyn-4k-sectors.vhdx"), "wb").write(bytes(b))
for f in sorted(os.listdir(tmp)):
    if f.endswith(".vhdx"):
        with open(os.path.join(tmp, f), "rb") as src:
            seg = to_segments(src.read())
        with open(os.path.join(tmp, f[:-5] + ".seg"), "wb") as dst:
            dst.write(seg)
PY
mkdir -p "$OUT"
rm -f "$OUT"/*.seg
for f in "$TMP"/*.seg; do
    size=$(stat -c %s "$f")
    if [ "$size" -gt 262144 ]; then
        echo "make_seeds_vhdx.sh: $f is $size bytes, above the fuzzer's max_len" >&2
        exit 1
    fi
    cp "$f" "$OUT/"
done
total=$(du -sb "$OUT" | cut -f1)
if [ "$total" -ge 1048576 ]; then
    echo "make_seeds_vhdx.sh: the seeds take $total bytes, keep them below 1 MiB" >&2
    exit 1
fi
echo "$(ls "$OUT" | wc -l) seeds, $total bytes in $OUT"
