"""Persistent dirty bitmaps of qcow2 images, as the C driver lists them:
``Image.bitmaps()``, ``info()`` and ``imgcopy info`` against ``qemu-img
info`` on images given bitmaps by ``qemu-img bitmap`` (granularities from
512 bytes to 2 MiB, disabled ones, long and non-ASCII names), bitmaps left
in use by a qemu that died with the image open for writing, bitmaps the
auto-clear bit disowns, and images imgcopy wrote into."""
import json
import subprocess
import sys

import pytest

import imgcopy
from imgcopy import Bitmap
from imgcopy.info import chain_to_json, info_chain
from .oracles import needs_qemu, qemu_img, qemu_info, qemu_io_args
from .units import KiB

pytestmark = needs_qemu

# (name, granularity or None for qemu's default, --disable)
BITMAPS = [("b1", None, False), ("off", "64k", True), ("fine", "512", False),
           ("coarse", "2M", True), ("b" * 200, "4k", False), ("\u00e9t\u00e9 \u2603", None, False)]


def with_bitmaps(path, size="10M", bitmaps=BITMAPS, compat=None):
    args = ["create", "-q", "-f", "qcow2"] + (["-o", f"compat={compat}"] if compat else [])
    qemu_img(*args, path, size)
    for name, granularity, disable in bitmaps:
        qemu_img("bitmap", "--add", *(["-g", granularity] if granularity else []),
                 *(["--disable"] if disable else []), path, name)
    return path


def left_in_use(path):
    """qemu opens the image for writing (marking its bitmaps in use) and
    dies without closing it."""
    qemu_io_args("-f", "qcow2", "-c", "sigraise 9", path, check=False)
    return path


def qemu_bitmaps(path):
    """qemu-img info's list of the image's bitmaps (its JSON), or None."""
    return qemu_info(path, "qcow2")["format-specific"]["data"].get("bitmaps")


def as_qemu_lists(bitmaps):
    return [{"flags": (["in-use"] if b.in_use else []) + (["auto"] if b.auto else []),
             "name": b.name, "granularity": b.granularity} for b in bitmaps]


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    d = tmp_path_factory.mktemp("bitmaps")
    clean = with_bitmaps(str(d / "clean.qcow2"))
    in_use = left_in_use(with_bitmaps(str(d / "in-use.qcow2"), "3M", BITMAPS[:3]))
    one = with_bitmaps(str(d / "one.qcow2"), "1G", [("only", "1M", False)])
    return {"clean": clean, "in-use": in_use, "one": one}


@pytest.mark.parametrize("name", ["clean", "in-use", "one"])
def test_bitmaps_are_qemus(images, name):
    path = images[name]
    with imgcopy.open(path) as img:
        bitmaps = img.bitmaps()
    want = qemu_bitmaps(path)
    assert as_qemu_lists(bitmaps) == want
    assert all(isinstance(b, Bitmap) for b in bitmaps)
    for b in bitmaps:
        assert b.consistent is (not b.in_use) and b.enabled is b.auto
    if name == "in-use":   # the oracle's image is what its name says
        assert bitmaps and all(b.in_use and not b.consistent for b in bitmaps)


@pytest.mark.parametrize("name", ["clean", "in-use", "one"])
@pytest.mark.parametrize("output", ["human", "json"])
def test_info_lists_them_as_qemu_img_info(images, name, output):
    """Byte for byte but imgcopy's own "compressed clusters" line."""
    path = images[name]
    i = imgcopy.info(path)
    mine = i.to_json() if output == "json" else i.to_human()
    if output == "json":
        mine = mine.replace(',\n    "compressed-clusters": 0', "")
    else:
        mine = mine.replace("compressed clusters: 0\n", "")
    assert mine == qemu_img("info", f"--output={output}", path).stdout


def test_cli_info(images, imgcopy_env):
    for output in ("human", "json"):
        p = subprocess.run([sys.executable, "-m", "imgcopy", "info", f"--output={output}",
                            images["clean"]], env=imgcopy_env, capture_output=True)
        assert p.returncode == 0, p.stderr
        want = qemu_img("info", f"--output={output}", images["clean"], text=False).stdout
        assert p.stdout.replace(b"compressed clusters: 0\n", b"").replace(
            b',\n    "compressed-clusters": 0', b"") == want


def test_backing_chain_json(tmp_path):
    """Bitmaps in a chain's images: the list qemu prints (its escapes and
    empty lists included)."""
    base = with_bitmaps(str(tmp_path / "base.qcow2"), "4M", BITMAPS[:2])
    top = str(tmp_path / "top.qcow2")
    qemu_img("create", "-q", "-f", "qcow2", "-b", base, "-F", "qcow2", top)
    with_bitmaps_on = [("\u00e9", "64k", True)]
    for name, granularity, _ in with_bitmaps_on:
        qemu_img("bitmap", "--add", "-g", granularity, "--disable", top, name)
    infos = info_chain(top)
    mine = json.loads(chain_to_json(infos))
    for d in mine:
        d.pop("compressed-clusters", None)
    assert mine == json.loads(qemu_img("info", "--backing-chain", "--output=json", top).stdout)
    text = chain_to_json(infos)
    assert '"flags": [\n' in text and "\\u00E9" in text


@pytest.mark.parametrize("make", ["raw", "v2", "no-bitmaps", "removed", "vmdk"])
def test_none_where_qemu_lists_none(tmp_path, make):
    path = str(tmp_path / "img")
    fmt = "qcow2"
    if make == "raw":
        qemu_img("create", "-q", "-f", "raw", path, "1M")
        fmt = "raw"
    elif make == "vmdk":
        qemu_img("create", "-q", "-f", "vmdk", path, "1M")
        fmt = "vmdk"
    elif make == "v2":
        with_bitmaps(path, "1M", [], compat="0.10")
    elif make == "no-bitmaps":
        with_bitmaps(path, "1M", [])
    else:  # every bitmap removed: the directory is gone
        with_bitmaps(path, "1M", BITMAPS[:2])
        for name, _, _ in BITMAPS[:2]:
            qemu_img("bitmap", "--remove", path, name)
    with imgcopy.open(path) as img:
        assert img.bitmaps() == []
    data = qemu_info(path, fmt).get("format-specific", {}).get("data", {})
    assert "bitmaps" not in data
    i = imgcopy.info(path)
    assert "bitmaps" not in (i.format_specific or {"data": {}})["data"]


def test_disowned_by_the_autoclear_bit(tmp_path):
    """A program unaware of bitmaps wrote the image last (its auto-clear
    bit is clear): qemu ignores the directory, and so does imgcopy."""
    path = with_bitmaps(str(tmp_path / "a.qcow2"), "1M", BITMAPS[:2])
    with open(path, "r+b") as f:   # autoclear_features: byte 88, big-endian
        f.seek(88)
        f.write(bytes(8))
    assert qemu_bitmaps(path) is None
    with imgcopy.open(path) as img:
        assert img.bitmaps() == []


def test_gone_once_imgcopy_writes(tmp_path):
    """imgcopy keeps no bitmap up to date: the first write clears the
    auto-clear bit, so qemu and imgcopy list none from then on."""
    path = with_bitmaps(str(tmp_path / "w.qcow2"), "1M", BITMAPS[:2])
    with imgcopy.open(path, mode="r+") as img:
        assert [b.name for b in img.bitmaps()] == [n for n, _, _ in BITMAPS[:2]]
        img.write(64 * KiB, b"x" * 512)
        assert img.bitmaps() == []
    assert qemu_bitmaps(path) is None
    with imgcopy.open(path) as img:
        assert img.bitmaps() == []


def test_many_bitmaps(tmp_path):
    """A directory of many entries, read in one piece at open."""
    names = [("bm%03d" % i, "64k", i % 2 == 1) for i in range(40)]
    path = with_bitmaps(str(tmp_path / "many.qcow2"), "8M", names)
    with imgcopy.open(path) as img:
        assert as_qemu_lists(img.bitmaps()) == qemu_bitmaps(path)
