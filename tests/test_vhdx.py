"""The VHDX driver (csrc/drivers/vhdx*.c), read-only, against qemu-img.

- images qemu-img makes (convert -O vhdx: dynamic and fixed, block sizes
  1M/8M/32M, block_state_zero on and off, log_size) from seeded raw
  sources with odd sizes, holes, zero runs and data at the end: info,
  converts to raw and qcow2 identical by qemu-img compare, map's zero
  ranges read zero and qemu's data is data, plan == convert, CLI map;
- qemu's sample images from other producers (Hyper-V, Disk2VHD), and the
  one whose log needs replaying (refused, as qemu refuses it read-only);
- differencing images (qemu 7.2 neither makes nor reads them): written
  by tests/gen/vhdx_images.py over a parent qemu-img made, checked against
  the guest bytes the generator says (the same writer's dynamic images
  are first checked against qemu-img);
- hostile files (tests/fuzz/hostile_vhdx.py): a format error or an OS
  error, quickly.
"""
import bz2
import json
import os
import random
import shutil
import subprocess
import time

import pytest

import imgcopy
from imgcopy import ImageFormatError

from .convert_helpers import imgcopy_child_env, imgcopy_cmd
from .fuzz import hostile_vhdx
from .gen import vhdx_images as vx
from .gen.sparse import make_sparse, pattern
from .oracles import qemu_compare, qemu_img, qemu_info, qemu_io
from .units import KiB, MiB

HERE = os.path.dirname(os.path.abspath(__file__))
SAMPLES = os.path.join(HERE, "data", "qemu-iotests")
PLAN_KEYS = ("bytes_read", "bytes_written", "bytes_zeroed", "bytes_skipped", "read_requests",
             "write_requests", "zero_requests", "extents")
SECTOR = 512


# --------------------------------------------------------------------------
# sources and checks

def seeded_source(path, kind, seed):
    """A raw source: `odd` (5 MiB + 3 sectors, data in and across blocks,
    zero runs, holes, data in the last sector) or `big` (40 MiB + 7
    sectors, a few scattered runs and the end)."""
    rng = random.Random(seed)
    if kind == "odd":
        size = 5 * MiB + 3 * SECTOR
        data = [(0, pattern(rng, 100 * KiB, zero_runs=True)),
                (MiB - 8 * KiB, pattern(rng, 24 * KiB)),          # across a 1 MiB boundary
                (2 * MiB + 512, bytes(64 * KiB)),                   # written zeros
                (3 * MiB + 4 * KiB, pattern(rng, 300 * KiB, zero_runs=True)),
                (size - SECTOR, pattern(rng, SECTOR))]
    else:
        size = 40 * MiB + 7 * SECTOR
        data = [(4 * KiB, pattern(rng, 8 * KiB)),
                (17 * MiB + 1536, pattern(rng, 70 * KiB, zero_runs=True)),
                (33 * MiB - 2 * KiB, pattern(rng, 4 * KiB)),
                (size - 5 * KiB, pattern(rng, 5 * KiB))]
    make_sparse(path, size, data)
    return size


def qemu_view(img, out, fmt="vhdx"):
    """The guest bytes as qemu-img reads them."""
    qemu_img("convert", "-f", fmt, "-O", "raw", img, out)
    with open(out, "rb") as f:
        return f.read()


def check_map(img, guest, fmt="vhdx"):
    """Every extent we call zero reads zero; every non-zero sector of the
    guest is in a data extent (or, below, in the parent's); a data
    extent's host bytes are the guest's."""
    emap = list(imgcopy.map(img, format=fmt))
    assert emap[0].start == 0 and emap[-1].start + emap[-1].length == len(guest)
    with open(img, "rb") as f:
        host = f.read()
    for e in emap:
        piece = guest[e.start:e.start + e.length]
        if e.zero:
            assert piece.count(0) == len(piece), e
        else:
            assert e.data, e
        if e.data and e.depth == 0 and e.host_offset is not None:
            assert host[e.host_offset:e.host_offset + e.length] == piece, e
    return emap


def check_plan_equals_convert(img, tmp_path, fmt="vhdx"):
    p = imgcopy.plan(img, src_format=fmt)
    r = imgcopy.convert(img, str(tmp_path / "plan-check.raw"), src_format=fmt,
                        dst_format="raw", flush=False)
    assert {k: p.totals()[k] for k in PLAN_KEYS} == {k: r.to_dict()[k] for k in PLAN_KEYS}
    os.unlink(tmp_path / "plan-check.raw")
    return r


def check_converts(img, tmp_path, expected_raw, fmt="vhdx"):
    """convert to raw (bytes as expected) and to qcow2 (qemu-img compare)."""
    out = str(tmp_path / "out.raw")
    imgcopy.convert(img, out, src_format=fmt, dst_format="raw")
    with open(out, "rb") as f, open(expected_raw, "rb") as g:
        assert f.read() == g.read()
    q = str(tmp_path / "out.qcow2")
    imgcopy.convert(img, q, src_format=fmt, dst_format="qcow2")
    assert qemu_compare(q, expected_raw, "qcow2", "raw").returncode == 0


# --------------------------------------------------------------------------
# images qemu-img makes

QEMU_IMAGES = [
    ("odd", "subformat=dynamic,block_size=1M,block_state_zero=on"),
    ("odd", "subformat=dynamic,block_size=8M,block_state_zero=off"),
    ("odd", "subformat=fixed,block_size=1M"),
    ("odd", "subformat=dynamic,block_size=1M,log_size=4M"),
    ("big", "subformat=dynamic,block_size=32M,log_size=2M"),
    ("big", "subformat=fixed,block_size=8M,block_state_zero=off"),
    ("big", "subformat=dynamic"),
]


@pytest.mark.parametrize("kind,opts", QEMU_IMAGES, ids=["%s-%s" % (k, o.replace(",", "-"))
                                                        for k, o in QEMU_IMAGES])
def test_qemu_made_images(tmp_path, kind, opts):
    src = str(tmp_path / "src.raw")
    seeded_source(src, kind, seed=len(opts))
    img = str(tmp_path / "img.vhdx")
    qemu_img("convert", "-f", "raw", "-O", "vhdx", "-o", opts, src, img)
    q = qemu_info(img, "vhdx")
    i = imgcopy.info(img)
    assert i.format == "vhdx" and q["format"] == "vhdx"
    assert i.virtual_size == q["virtual-size"]
    assert i.cluster_size == q["cluster-size"]
    assert i.backing_filename is None
    assert imgcopy.open(img).format == "vhdx"  # probed
    guest = qemu_view(img, str(tmp_path / "qemu.raw"))
    check_converts(img, tmp_path, str(tmp_path / "qemu.raw"))
    check_map(img, guest)
    check_plan_equals_convert(img, tmp_path)


def test_mostly_empty_image_reads_only_allocated_blocks(tmp_path):
    img = str(tmp_path / "sparse.vhdx")
    qemu_img("create", "-q", "-f", "vhdx", "-o", "block_size=1M", img, str(64 * MiB + 512))
    qemu_io(img, ["write -P 0x5a 5M 4k", "write -P 0x6b 40M 512", "write -z 50M 1M",
                  "write -P 0x7c 64M 512"], fmt="vhdx")
    emap = list(imgcopy.map(img))
    data = sum(e.length for e in emap if e.data)
    assert 0 < data <= 4 * MiB, emap  # qemu writes "write -z" as a data block
    r = imgcopy.convert(img, str(tmp_path / "out.raw"), dst_format="raw", sparse_threshold=0)
    assert r.bytes_read == data, (r, emap)
    assert qemu_compare(img, str(tmp_path / "out.raw"), "vhdx", "raw").returncode == 0
    guest = qemu_view(img, str(tmp_path / "qemu.raw"))
    check_map(img, guest)


def test_cli_map_and_info_json(tmp_path):
    src = str(tmp_path / "src.raw")
    size = seeded_source(src, "odd", seed=3)
    img = str(tmp_path / "img.vhdx")
    qemu_img("convert", "-f", "raw", "-O", "vhdx", "-o", "block_size=1M", src, img)
    env = imgcopy_child_env()
    out = subprocess.run(imgcopy_cmd() + ["map", "--output=json", "-f", "vhdx", img],
                         capture_output=True, text=True, env=env, check=True).stdout
    entries = json.loads(out)
    assert entries[0]["start"] == 0
    assert entries[-1]["start"] + entries[-1]["length"] == size
    assert out == imgcopy.map(img, format="vhdx").to_json()
    info = json.loads(subprocess.run(imgcopy_cmd() + ["info", "--output=json", img],
                                     capture_output=True, text=True, env=env,
                                     check=True).stdout)
    q = qemu_info(img, "vhdx")
    for k in ("virtual-size", "cluster-size", "format"):
        assert info[k] == q[k], k


# --------------------------------------------------------------------------
# qemu's sample images

def unpack(name, tmp_path):
    """A sample decompressed, sparse (its zeros as holes)."""
    out = str(tmp_path / name[:-4])
    with bz2.open(os.path.join(SAMPLES, name)) as src, open(out, "wb") as dst:
        while True:
            chunk = src.read(MiB)
            if not chunk:
                break
            if chunk.count(0) == len(chunk):
                dst.seek(len(chunk), os.SEEK_CUR)
            else:
                dst.write(chunk)
        dst.truncate()
    return out


@pytest.mark.parametrize("name", ["iotest-dynamic-1G.vhdx.bz2", "test-disk2vhd.vhdx.bz2"])
def test_samples_read_as_qemu_reads_them(tmp_path, name):
    img = unpack(name, tmp_path)
    q = qemu_info(img, "vhdx")
    i = imgcopy.info(img)
    assert (i.format, i.virtual_size, i.cluster_size) == ("vhdx", q["virtual-size"],
                                                          q["cluster-size"])
    out = str(tmp_path / "out.raw")
    r = imgcopy.convert(img, out, dst_format="raw")
    assert qemu_compare(img, out, "vhdx", "raw").returncode == 0
    # zero extents read zero in qemu-io, in 64 MiB reads
    cmds = []
    for e in imgcopy.map(img):
        if e.zero:
            for off in range(e.start, e.start + e.length, 64 * MiB):
                n = min(64 * MiB, e.start + e.length - off)
                cmds.append("read -P 0 %d %d" % (off, n))
    qemu_io(img, cmds, fmt="vhdx", read_only=True)
    assert r.bytes_read <= sum(e.length for e in imgcopy.map(img) if e.data)
    check_plan_equals_convert(img, tmp_path)


def test_sample_with_log_to_replay_is_refused(tmp_path):
    img = unpack("iotest-dirtylog-10G-4M.vhdx.bz2", tmp_path)
    q = qemu_img("info", "-f", "vhdx", img, check=False)
    assert q.returncode != 0 and "log that needs to be replayed" in q.stderr
    with pytest.raises(ImageFormatError, match="log that needs to be replayed"):
        imgcopy.open(img)
    with pytest.raises(ImageFormatError, match="qemu-img check -r all"):
        imgcopy.convert(img, str(tmp_path / "out.raw"), dst_format="raw")
    assert not os.path.exists(tmp_path / "out.raw")


# --------------------------------------------------------------------------
# images written from the spec: first checked against qemu, then trusted

def spec_blocks(rng, nblocks, *, diff, lss=512, block_size=MiB):
    """Every state in turn over `nblocks` blocks, partial ones with runs
    of sectors present and absent."""
    spb = block_size // lss
    blocks = {}
    kinds = [vx.FULLY_PRESENT, vx.ZERO, vx.NOT_PRESENT, vx.UNMAPPED, vx.UNDEFINED]
    if diff:
        kinds.append(vx.PARTIALLY_PRESENT)
    for b in range(nblocks):
        k = kinds[b % len(kinds)]
        if k == vx.NOT_PRESENT:
            continue
        data = b""
        sectors = ()
        if k in (vx.FULLY_PRESENT, vx.PARTIALLY_PRESENT):
            data = pattern(rng, rng.randrange(lss, block_size + 1), zero_runs=True)
        if k == vx.PARTIALLY_PRESENT:
            sectors = tuple(sorted(set(rng.randrange(spb) for _ in range(40))
                                   | set(range(5, 300)) | {0, spb - 1}))
        blocks[b] = vx.Block(k, data, sectors)
    return blocks


def test_spec_writer_agrees_with_qemu(tmp_path):
    """A dynamic image from the generator reads in qemu as the generator
    says (its checksums, regions, metadata and BAT are right)."""
    rng = random.Random(7)
    size = 6 * MiB + 5 * SECTOR
    blocks = spec_blocks(rng, 7, diff=False)
    img = str(tmp_path / "gen.vhdx")
    vx.write_vhdx(img, size, blocks)
    exp = str(tmp_path / "expected.raw")
    with open(exp, "wb") as f:
        f.write(vx.guest_bytes(size, blocks))
    assert qemu_compare(img, exp, "vhdx", "raw").returncode == 0
    check_converts(img, tmp_path, exp)
    with open(exp, "rb") as f:
        check_map(img, f.read())


def test_4k_logical_sectors(tmp_path):
    """qemu refuses 4 KiB logical sectors; the spec allows them."""
    rng = random.Random(8)
    size = 5 * MiB + 3 * 4096
    blocks = spec_blocks(rng, 6, diff=False, lss=4096)
    img = str(tmp_path / "4k.vhdx")
    vx.write_vhdx(img, size, blocks, lss=4096)
    exp = str(tmp_path / "expected.raw")
    with open(exp, "wb") as f:
        f.write(vx.guest_bytes(size, blocks, lss=4096))
    assert imgcopy.info(img).virtual_size == size
    check_converts(img, tmp_path, exp)
    with open(exp, "rb") as f:
        check_map(img, f.read())


def make_parent(tmp_path, size, seed, name="parent.vhdx"):
    rng = random.Random(seed)
    raw = str(tmp_path / "parent.raw")
    make_sparse(raw, size, [(0, pattern(rng, 2 * MiB + 3 * KiB, zero_runs=True)),
                            (3 * MiB + 512, pattern(rng, MiB)),
                            (size - 3 * SECTOR, pattern(rng, 3 * SECTOR))])
    qemu_img("convert", "-f", "raw", "-O", "vhdx", "-o", "block_size=1M", raw,
             str(tmp_path / name))
    with open(raw, "rb") as f:
        return f.read()


@pytest.mark.parametrize("lss", [512, 4096])
def test_differencing_image(tmp_path, lss):
    size = 7 * MiB + 2 * 4096
    parent = make_parent(tmp_path, size, seed=lss)
    rng = random.Random(lss + 1)
    blocks = spec_blocks(rng, 8, diff=True, lss=lss)
    child = str(tmp_path / "child.vhdx")
    linkage = vx.data_write_guid(tmp_path / "parent.vhdx").upper()  # any case will do
    vx.write_vhdx(child, size, blocks, lss=lss,
                  parent={"parent_linkage": linkage,
                          "relative_path": ".\\parent.vhdx",
                          "absolute_win32_path": "C:\\nowhere\\parent.vhdx"})
    expected = vx.guest_bytes(size, blocks, parent, lss=lss)
    exp = str(tmp_path / "expected.raw")
    with open(exp, "wb") as f:
        f.write(expected)
    i = imgcopy.info(child)
    assert (i.format, i.virtual_size, i.cluster_size) == ("vhdx", size, MiB)
    assert i.backing_filename == "./parent.vhdx" and i.backing_filename_format == "vhdx"
    check_converts(child, tmp_path, exp)
    emap = check_map(child, expected)
    # the parent answers where the child holds nothing, partially present
    # blocks are split by their sector bitmaps
    assert any(e.depth == 1 and e.data for e in emap)
    assert any(e.depth == 0 and e.data for e in emap)
    partial = [b for b, blk in blocks.items() if blk.state == vx.PARTIALLY_PRESENT]
    for b in partial:
        inside = [e for e in emap if b * MiB <= e.start < (b + 1) * MiB]
        assert len(inside) > 2, inside
    check_plan_equals_convert(child, tmp_path)


def test_differencing_parent_by_absolute_path(tmp_path):
    """No relative path that resolves: the Windows path is used when it
    names a file here."""
    size = 5 * MiB
    parent = make_parent(tmp_path, size, seed=3)
    blocks = {1: vx.Block(vx.FULLY_PRESENT, b"\x42" * 1000)}
    win = "C:" + str(tmp_path / "parent.vhdx").replace("/", "\\")
    child = str(tmp_path / "child.vhdx")
    vx.write_vhdx(child, size, blocks, parent={"relative_path": "missing\\parent.vhdx",
                                                "absolute_win32_path": win})
    img = imgcopy.open(child)
    assert img.backing_chain[0][0] == str(tmp_path / "parent.vhdx")
    assert img.read(0, size) == vx.guest_bytes(size, blocks, parent)


def test_differencing_wrong_parent_is_refused(tmp_path):
    """The parent's data write GUID must be the locator's parent_linkage
    (or parent_linkage2): another image of the same name is not it."""
    size = 5 * MiB
    parent = make_parent(tmp_path, size, seed=4)
    blocks = {1: vx.Block(vx.FULLY_PRESENT, b"\x42" * 1000)}
    child = str(tmp_path / "child.vhdx")
    right = vx.data_write_guid(tmp_path / "parent.vhdx")
    wrong = "{83ab3a4e-1ca9-4b17-a41f-2dd1ec63f30b}"
    vx.write_vhdx(child, size, blocks, parent={"parent_linkage": wrong,
                                                "parent_linkage2": right.strip("{}"),
                                                "relative_path": "parent.vhdx"})
    assert imgcopy.open(child).read(0, size) == vx.guest_bytes(size, blocks, parent)
    vx.write_vhdx(child, size, blocks, parent={"parent_linkage": wrong,
                                                "relative_path": "parent.vhdx"})
    with pytest.raises(ImageFormatError, match="not the image this differencing image"):
        imgcopy.map(child)
    with pytest.raises(ImageFormatError, match="not the image this differencing image"):
        imgcopy.convert(child, str(tmp_path / "out.raw"), dst_format="raw")


def test_differencing_parent_not_found(tmp_path):
    child = str(tmp_path / "child.vhdx")
    vx.write_vhdx(child, 2 * MiB, {}, parent={"absolute_win32_path": "C:\\no\\such.vhdx"})
    with pytest.raises(ImageFormatError, match="not found"):
        imgcopy.open(child)
    vx.write_vhdx(child, 2 * MiB, {}, parent={"relative_path": ".\\gone.vhdx"})
    with pytest.raises((ImageFormatError, OSError), match="gone.vhdx"):
        imgcopy.open(child)


def test_differencing_unknown_parent_type_is_refused(tmp_path):
    child = str(tmp_path / "child.vhdx")
    lay = vx.write_vhdx(child, 2 * MiB, {}, parent={"relative_path": "p.vhd"})
    with open(child, "r+b") as f:
        f.seek(lay.metadata + lay.items["parent_locator"][0])
        f.write(vx.guid("00000000-0000-0000-0000-000000000001"))
    with pytest.raises(ImageFormatError, match="parent locator of an unknown type"):
        imgcopy.open(child)


# --------------------------------------------------------------------------
# hostile files

@pytest.mark.parametrize("name", sorted(hostile_vhdx.CASES))
def test_hostile(tmp_path, name):
    expect, build = hostile_vhdx.CASES[name]
    data = bytes(build())
    img = str(tmp_path / "input.vhdx")
    with open(img, "wb") as f:
        f.write(data)
    shutil.copy(img, tmp_path / "base.vhdx")
    t0 = time.monotonic()
    try:
        with imgcopy.open(img, format="vhdx") as im:
            list(im.extents())
            # the first and the last 64 MiB of a huge disk, all of the others
            ends = (0, im.size) if name not in hostile_vhdx.HUGE else \
                (0, min(im.size, 64 * MiB), max(0, im.size - 64 * MiB), im.size)
            for a, b in zip(ends[::2], ends[1::2]):
                for off in range(a, b, 4 * MiB):
                    im.read(off, min(4 * MiB, b - off))
        failed = None
    except (ImageFormatError, OSError) as e:
        failed = e
    assert time.monotonic() - t0 < 10
    if expect == "error":
        assert failed is not None, name


def test_huge_bat_is_refused_by_the_memory_budget(tmp_path):
    """A 64 TiB disk in 1 MiB blocks needs a 512 MiB BAT: its region is
    there (a sparse file) but the chain's metadata budget says no, before
    anything is read."""
    b, lay = hostile_vhdx.base()
    hostile_vhdx.put(b, hostile_vhdx.item(lay, "disk_size"), "<Q", 64 << 40)
    hostile_vhdx.put(b, hostile_vhdx.region_entry(lay, 0) + 16, "<QI", lay.bat, 0xFFF00000)
    hostile_vhdx.fix_regions(b, lay)
    img = str(tmp_path / "huge-bat.vhdx")
    with open(img, "wb") as f:
        f.write(b)
        f.truncate(lay.bat + 0xFFF00000)
    t0 = time.monotonic()
    with pytest.raises(ImageFormatError, match="BATs need more than"):
        imgcopy.open(img)
    assert time.monotonic() - t0 < 5


@pytest.mark.parametrize("name,owed", [
    ("log-to-replay", True), ("log-to-replay-wrapping", True), ("log-guid-empty-log", False),
    ("log-entry-of-another-log", False), ("log-entry-bad-checksum", False)])
def test_log_replay_owed_as_qemu_finds_it(tmp_path, name, owed):
    """A log GUID alone owes no replay: qemu searches the log for an entry
    of it whose checksum holds, and so does imgcopy; with one, both refuse
    the read-only open, without one both read the image the same."""
    img = str(tmp_path / "input.vhdx")
    with open(img, "wb") as f:
        f.write(bytes(hostile_vhdx.CASES[name][1]()))
    q = qemu_img("info", "-f", "vhdx", img, check=False)
    assert (q.returncode != 0) == owed, q.stderr
    if owed:
        assert "log that needs to be replayed" in q.stderr
        with pytest.raises(ImageFormatError, match="log that needs to be replayed"):
            imgcopy.open(img)
        return
    out = str(tmp_path / "out.raw")
    imgcopy.convert(img, out, dst_format="raw")
    assert qemu_compare(img, out, "vhdx", "raw").returncode == 0
