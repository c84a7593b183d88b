"""VMDK images read by imgcopy versus qemu-img: every subformat qemu-img
writes (monolithicSparse, monolithicFlat, twoGbMaxExtentSparse,
twoGbMaxExtentFlat, streamOptimized; adapter types, hwversion 6 / compat6,
zeroed grains; a > 2 GiB disk in several extents), delta disks over a base,
and VMware's version-3 sample.  For each: map equals qemu-img map (start,
length, depth, present, zero, data), info equals qemu-img info (format,
virtual size, cluster size, cid, parent-cid, create-type), converts to raw
and to qcow2 read the same as the image by qemu-img compare, plan's
counters equal the copy's, and the CLI maps it.
"""

import json
import os
import subprocess
import sys

import pytest

import imgcopy

from .gen import vmdk_images
from .oracles import assert_same_content, needs_qemu, qemu_info, qemu_map

pytestmark = needs_qemu

PLAN_KEYS = ("bytes_read", "bytes_written", "bytes_zeroed", "bytes_skipped", "read_requests",
             "write_requests", "zero_requests", "extents")


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("vmdk"))
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = vmdk_images.build(d, name)
        return cache[name]

    return get


def _fields(entries):
    return [(e["start"], e["length"], e["depth"], e["present"], e["zero"], e["data"])
            for e in entries]


@pytest.mark.parametrize("name", vmdk_images.NAMES)
def test_map_equals_qemu(images, name):
    img = images(name)
    q = qemu_map(img.path, fmt="vmdk").extents
    m = json.loads(imgcopy.map(img.path, format="vmdk").to_json())
    assert _fields(m) == _fields(q)
    # compressed grains have no host offset; other data does
    for a, b in zip(m, q):
        assert ("offset" in a) == ("offset" in b), (a, b)


@pytest.mark.parametrize("name", vmdk_images.NAMES)
def test_info_equals_qemu(images, name):
    img = images(name)
    q = qemu_info(img.path, fmt="vmdk")
    i = imgcopy.info(img.path).to_dict()
    assert i["format"] == q["format"] == "vmdk"
    assert i["virtual-size"] == q["virtual-size"]
    assert i.get("cluster-size") == q.get("cluster-size")
    assert i.get("backing-filename") == q.get("backing-filename")
    assert i.get("backing-filename-format") == q.get("backing-filename-format")
    qs, s = q["format-specific"], i["format-specific"]
    assert s["type"] == qs["type"] == "vmdk"
    for key in ("cid", "parent-cid", "create-type"):
        assert s["data"][key] == qs["data"][key], key


@pytest.mark.parametrize("name", vmdk_images.NAMES)
def test_convert_and_plan(images, name, tmp_path):
    img = images(name)
    raw = str(tmp_path / "out.raw")
    r = imgcopy.convert(img.path, raw, src_format="vmdk", dst_format="raw")
    assert_same_content(img.path, raw, "vmdk", "raw")
    if img.raw:
        assert_same_content(img.raw, raw, "raw", "raw")
    p = imgcopy.plan(img.path, src_format="vmdk")
    assert {k: p.totals()[k] for k in PLAN_KEYS} == {k: r.to_dict()[k] for k in PLAN_KEYS}
    qcow2 = str(tmp_path / "out.qcow2")
    imgcopy.convert(img.path, qcow2, src_format="vmdk", dst_format="qcow2")
    assert_same_content(img.path, qcow2, "vmdk", "qcow2")


@pytest.mark.parametrize("name", ["monolithicSparse", "streamOptimized", "twoGbMaxExtentFlat",
                                  "delta"])
def test_cli_map(images, name):
    img = images(name)
    p = subprocess.run([sys.executable, "-m", "imgcopy", "map", "--output=json", "-f", "vmdk",
                        img.path], capture_output=True, text=True, check=True)
    assert _fields(json.loads(p.stdout)) == _fields(qemu_map(img.path, fmt="vmdk").extents)


def test_probed_as_vmdk(images):
    for name in ("monolithicSparse", "streamOptimized"):
        with imgcopy.open(images(name).path) as im:
            assert imgcopy.info(images(name).path).format == "vmdk"
            assert im.size == vmdk_images.SIZE


@pytest.mark.parametrize("name", ["monolithicSparse", "streamOptimized", "twoGbMaxExtentSparse",
                                  "delta"])
def test_reads_at_odd_offsets(images, name, tmp_path):
    """Image.read across grain and extent boundaries, against qemu's bytes."""
    img = images(name)
    raw = str(tmp_path / "q.raw")
    subprocess.run(["qemu-img", "convert", "-f", "vmdk", "-O", "raw", img.path, raw], check=True)
    with open(raw, "rb") as f:
        want = f.read()
    with imgcopy.open(img.path, format="vmdk") as im:
        for off, n in [(0, 1), (65535, 3), (100 * 1024 + 7, 300 * 1024), (len(want) - 513, 513),
                       (3 * 1024 * 1024 - 1, 65538)]:
            assert im.read(off, n) == want[off:off + n], (off, n)


def test_extent_outside_directory_refused(images, tmp_path):
    img = images("monolithicFlat")
    d = tmp_path / "sub"
    d.mkdir()
    text = open(img.path, "rb").read().replace(b'"monolithicFlat-flat.vmdk"',
                                               b'"../monolithicFlat-flat.vmdk"')
    (d / "x.vmdk").write_bytes(text)
    os.link(os.path.join(os.path.dirname(img.path), "monolithicFlat-flat.vmdk"),
            str(tmp_path / "monolithicFlat-flat.vmdk"))
    with pytest.raises(imgcopy.ImageFormatError, match="outside"):
        imgcopy.map(str(d / "x.vmdk"), format="vmdk")


def test_changed_parent_refused_like_qemu(tmp_path):
    """A write into the parent changes its CID: qemu then refuses to read
    the delta's unallocated grains, and so do we (map still works)."""
    from .oracles import qemu_img, qemu_io
    d = str(tmp_path)
    vmdk_images.make_source(os.path.join(d, "src.raw"), vmdk_images.SIZE, 4)
    qemu_img("convert", "-f", "raw", "-O", "vmdk", "src.raw", "base.vmdk", cwd=d)
    qemu_img("create", "-f", "vmdk", "-b", "base.vmdk", "-F", "vmdk", "delta.vmdk", cwd=d)
    qemu_io(os.path.join(d, "delta.vmdk"), ["write -P 3 0 64k"], fmt="vmdk")
    delta = os.path.join(d, "delta.vmdk")
    out = os.path.join(d, "out.raw")
    imgcopy.convert(delta, out, src_format="vmdk", dst_format="raw")
    assert_same_content(delta, out, "vmdk", "raw")
    os.unlink(out)
    qemu_io(os.path.join(d, "base.vmdk"), ["write -P 5 1M 4k"], fmt="vmdk")
    assert qemu_img("convert", "-f", "vmdk", "-O", "raw", delta, out, check=False).returncode != 0
    with pytest.raises(imgcopy.ImageFormatError, match="parentCID"):
        imgcopy.convert(delta, out + "2", src_format="vmdk", dst_format="raw")
    assert _fields(json.loads(imgcopy.map(delta, format="vmdk").to_json())) == \
        _fields(qemu_map(delta, fmt="vmdk").extents)
