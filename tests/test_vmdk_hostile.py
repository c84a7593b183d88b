"""Hostile vmdk files (tests/fuzz/hostile_vmdk.py): each gives
ImageFormatError (or OSError) where it must, never a crash, a hang or a
runaway allocation; where qemu-img reads one, imgcopy maps and reads it as
qemu does.  The afl-made sample (afl9.vmdk) is refused as qemu refuses it."""

import json
import os
import shutil
import subprocess
import time

import pytest

import imgcopy

from .fuzz import hostile_vmdk
from .gen import vmdk_images
from .oracles import HAVE_QEMU, qemu_img

NAMES = sorted(hostile_vmdk.CASES)


def _layout(d, data):
    for name, content in hostile_vmdk.helper_files().items():
        with open(os.path.join(d, name), "wb") as f:
            f.write(content)
    for name in ("input.vmdk", "base.vmdk"):
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)
    return os.path.join(d, "input.vmdk")


def _exercise(path):
    """Open, map (head and tail windows) and read a little."""
    m = imgcopy.map(path, format="vmdk", length=64 << 20)
    with imgcopy.open(path, format="vmdk") as im:
        size = im.size
        if size > 64 << 20:
            imgcopy.map(path, format="vmdk", start=size - (64 << 20))
        im.read(0, min(size, 1 << 20))
        if size:
            im.read(max(0, size - 4096), min(size, 4096))
    return m


def _fields(entries):
    return [(e["start"], e["length"], e["depth"], e["present"], e["zero"], e["data"])
            for e in entries]


@pytest.mark.parametrize("name", NAMES)
def test_hostile(name, tmp_path):
    data, expect = hostile_vmdk.CASES[name]
    path = _layout(str(tmp_path), data)
    t0 = time.monotonic()
    if expect == "error":
        with pytest.raises((imgcopy.ImageFormatError, OSError)):
            _exercise(path)
    else:
        try:
            m = _exercise(path)
        except (imgcopy.ImageFormatError, OSError):
            m = None
        if m is not None and HAVE_QEMU:
            q = qemu_img("map", "--output=json", "-f", "vmdk", "--max-length", str(64 << 20),
                         path, check=False)
            if q.returncode == 0:
                assert _fields(json.loads(m.to_json())) == _fields(json.loads(q.stdout))
    assert time.monotonic() - t0 < 10


@pytest.mark.skipif(not HAVE_QEMU, reason="needs qemu-img")
def test_afl9_refused_like_qemu(tmp_path):
    path = vmdk_images.sample(str(tmp_path), "afl9")
    q = qemu_img("info", "-f", "vmdk", path, check=False)
    assert q.returncode != 0
    with pytest.raises(imgcopy.ImageFormatError, match="grain directory"):
        imgcopy.map(path, format="vmdk")


@pytest.mark.skipif(not HAVE_QEMU, reason="needs qemu-img")
@pytest.mark.parametrize("name", ["stream", "stream-footer", "zeroed-grains", "desc-two-extents",
                                  "version-3", "grain-past-eof", "gd-past-eof", "many-gts",
                                  "stream-many-gts", "granularity-3"])
def test_valid_hand_made_read_like_qemu(name, tmp_path):
    """Hand-made images qemu reads: the same bytes."""
    path = _layout(str(tmp_path), hostile_vmdk.CASES[name][0])
    raw = str(tmp_path / "q.raw")
    subprocess.run(["qemu-img", "convert", "-f", "vmdk", "-O", "raw", path, raw], check=True)
    with open(raw, "rb") as f:
        want = f.read()
    with imgcopy.open(path, format="vmdk") as im:
        assert im.size == len(want)
        assert im.read(0, im.size) == want


@pytest.mark.parametrize("name, words", [
    ("desc-vmfs-sparse", "createType 'vmfsSparse'"),
    ("desc-se-sparse", "createType 'seSparse'"),
    ("desc-custom", "createType 'custom'"),
    ("desc-zero-extent", "ZERO extents are not supported"),
    ("desc-vmfssparse-extent", "VMFSSPARSE extents are not supported"),
    ("desc-unknown-extent", "unknown extent type 'WEIRD'"),
    ("desc-rdonly", "access RDONLY"),
    ("desc-encrypted", "encrypted"),
    ("cowd-magic", "COWD"),
    ("version-4", "version 4"),
    ("desc-many-extents", "more than 1024 extents"),
    ("desc-outside", "outside the image's directory"),
    ("stream-marker-garbage", "does not inflate"),
])
def test_refusal_names_the_feature(name, words, tmp_path):
    path = _layout(str(tmp_path), hostile_vmdk.CASES[name][0])
    with pytest.raises(imgcopy.ImageFormatError) as e:
        _exercise(path)
    assert words in str(e.value)
    assert "vmdk" in str(e.value)
