"""Hostile qcow2 files (tests/fuzz/regressions: hand-made by hostile.py and
found by the fuzzer) against qemu-img: where qemu-img map reads a file,
imgcopy.map gives the same answer; where qemu refuses it, so does imgcopy.
The differences below are deliberate: each says why."""
import os
import subprocess

import pytest

import imgcopy

from .build_features import HAVE_ZSTD
from .oracles import qemu_img

HERE = os.path.dirname(os.path.abspath(__file__))
REGRESSIONS = os.path.join(HERE, "fuzz", "regressions", "qcow2")

# imgcopy refuses what qemu reads, on purpose
STRICTER = {
    "hostile-backing-is-a-char-device.qcow2":
        "a backing file must be a regular file or block device (a character device can "
        "block or never end)",
    "hostile-compressed-in-header.qcow2":
        "a compressed cluster inside the header is metadata read as guest data",
}
if not HAVE_ZSTD:
    STRICTER["hostile-compression-type-zstd.qcow2"] = "zstd clusters cannot be read without libzstd"
# qemu takes minutes on these (deliberate work amplification), or runs out
# of memory (a dirty bitmap of 256 MiB per bitmap of the directory)
SLOW_FOR_QEMU = ("hostile-amplify-", "hostile-check-amplify-", "hostile-bitmaps-")


def inputs():
    names = sorted(os.listdir(REGRESSIONS)) if os.path.isdir(REGRESSIONS) else []
    return [n for n in names if not n.startswith(SLOW_FOR_QEMU)]


@pytest.mark.parametrize("name", inputs())
def test_map_agrees_with_qemu(name):
    path = os.path.join(REGRESSIONS, name)
    try:
        q = qemu_img("map", "-f", "qcow2", "--output=json", path, check=False, timeout=20)
    except subprocess.TimeoutExpired:
        pytest.skip("qemu-img map takes longer than 20 s")
    try:
        # dirty and corrupt flags need force=True in imgcopy (qemu reads them)
        mine = imgcopy.map(path, format="qcow2", force=True).to_json()
        refused = None
    except (imgcopy.ImageFormatError, OSError) as exc:
        mine, refused = None, exc
    if name in STRICTER:
        assert q.returncode == 0 and refused is not None, STRICTER[name]
        return
    if q.returncode != 0:
        assert refused is not None, "qemu refuses it (%s), imgcopy maps it" % q.stderr.strip()
    else:
        assert refused is None, "qemu maps it, imgcopy refuses: %s" % refused
        assert mine == q.stdout
