"""Dirty maps of qcow2 persistent bitmaps (``imgcopy.dirty_map``,
``Image.dirty_map``, ``imgcopy map --bitmap``) against qemu's own reading
of the same bitmaps: ``qemu-nbd -B NAME`` exports them and ``nbdinfo
--map=qemu:dirty-bitmap:NAME`` reads them.

Bitmaps are made by ``qemu-img bitmap`` (granularities 512 B to 2 MiB,
disabled ones, merged and cleared ones, several in one image) and their
bits by a guest's writes through ``qemu-io`` (writes, write zeroes and
discards, unaligned, across clusters and up to the disk's end); clusters of
bits and "all ones" table entries patched by hand check the bit order
against qemu's; qemu's refusals (a bitmap in use, no such bitmap, a table of
the wrong size) are imgcopy's, in qemu's words; a 1 TiB disk with a few
dirty clusters maps in milliseconds."""
import json
import random
import subprocess
import sys
import threading
import time

import pytest

import imgcopy
from imgcopy import ImageFormatError
from .fuzz import hostile
from .gen.qcow2_meta import bitmap_entry, bitmap_patch, bitmap_table
from .oracles import QEMU_NBD, needs_qemu, qemu_img, qemu_io, run
from .servers import NBDINFO, needs_qemu_nbd, qemu_nbd
from .test_bitmaps import left_in_use, with_bitmaps
from .units import GiB, KiB, MiB, TiB

pytestmark = [needs_qemu, needs_qemu_nbd,
              pytest.mark.skipif(NBDINFO is None, reason="nbdinfo not found on PATH "
                                 "(apt-get install libnbd-bin)")]


def _merged(ranges):
    """(start, length, dirty) ranges with neighbours of one state merged."""
    out = []
    for start, length, dirty in ranges:
        if out and out[-1][2] == dirty and out[-1][0] + out[-1][1] == start:
            out[-1] = (out[-1][0], out[-1][1] + length, dirty)
        else:
            out.append((start, length, dirty))
    return out


def qemu_dirty(path, names):
    """{name: [(start, length, dirty), ...]}: what qemu-nbd -B NAME exports of
    each bitmap, as nbdinfo --map=qemu:dirty-bitmap:NAME reads it."""
    extra = [arg for name in names for arg in ("-B", name)]
    with qemu_nbd(path, read_only=True, extra=extra) as srv:
        out = {}
        for name in names:
            p = run([NBDINFO, "--json", f"--map=qemu:dirty-bitmap:{name}", srv.uri])
            out[name] = _merged((e["offset"], e["length"], bool(e["type"] & 1))
                                for e in json.loads(p.stdout))
    return out


def mine(path, name, **kw):
    """imgcopy's dirty map as its JSON says it."""
    return [(e["start"], e["length"], e["dirty"])
            for e in json.loads(imgcopy.dirty_map(path, name, **kw).to_json())]


def qemu_refusal(path, name):
    """What qemu-nbd says when it will not export bitmap `name` (it exits
    before it listens)."""
    p = run([QEMU_NBD, "-r", "-f", "qcow2", "-k", path + ".sock", "-B", name, path],
            check=False, timeout=60)
    assert p.returncode == 1, p
    return p.stderr.strip().split(": ", 1)[1]


def guest_writes(size, cluster):
    """What a guest does to a disk of `size` bytes in clusters of
    `cluster`: a first sector, a write across a cluster boundary, an
    unaligned one across granules, write zeroes, a discard, the last
    sector."""
    return ["write -P 0x11 0 512",
            f"write -P 0x22 {cluster - 512} 1024",
            f"write -P 0x33 {3 * MiB + 100} 70000",
            f"write -z {5 * MiB} 300k",
            f"discard {6 * MiB} 128k",
            f"write -P 0x44 {size - 512} 512"]


# cluster size, disk size (not a multiple of the coarser granularities),
# granularities of its bitmaps
CASES = {
    "clusters-512": (512, 10 * MiB + 1536, [512, 4 * KiB, 64 * KiB, 2 * MiB]),
    "clusters-64k": (64 * KiB, 33 * MiB + 512, [512, 64 * KiB, MiB, 2 * MiB]),
    "clusters-2M": (2 * MiB, 9 * MiB + 512, [512, 64 * KiB]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_guest_writes_as_qemu_exports_them(tmp_path, case):
    cluster, size, granularities = CASES[case]
    path = str(tmp_path / "disk.qcow2")
    bitmaps = [(f"g{g}", str(g), False) for g in granularities] + [("off", None, True)]
    qemu_img("create", "-q", "-f", "qcow2", "-o", f"cluster_size={cluster}", path, str(size))
    with_bitmaps_on(path, bitmaps)
    qemu_io(path, guest_writes(size, cluster), fmt="qcow2")
    names = [n for n, _, _ in bitmaps]
    want = qemu_dirty(path, names)
    for name in names:
        assert mine(path, name) == want[name], name
    assert want["off"] == [(0, size, False)]        # disabled: readable, nothing recorded
    assert want[f"g{granularities[0]}"][-1] == (size - 512, 512, True)   # the disk's end
    # the bitmaps after qemu-img bitmap's own changes: one merged into a
    # new coarser one, one cleared
    qemu_img("bitmap", "--add", "-g", "1M", path, "merged")
    qemu_img("bitmap", "--merge", f"g{granularities[0]}", path, "merged")
    qemu_img("bitmap", "--clear", path, f"g{granularities[1]}")
    names += ["merged"]
    want = qemu_dirty(path, names)
    for name in names:
        assert mine(path, name) == want[name], name
    assert want[f"g{granularities[1]}"] == [(0, size, False)]
    assert any(d for _, _, d in want["merged"])


def with_bitmaps_on(path, bitmaps):
    for name, granularity, disable in bitmaps:
        qemu_img("bitmap", "--add", *(["-g", granularity] if granularity else []),
                 *(["--disable"] if disable else []), path, name)


def test_bits_in_qemus_order(tmp_path):
    """Clusters of bits written by hand (random bytes: thousands of runs in
    one cluster; words of ones and zeros; ones past the disk's end) and
    table entries of a cluster of ones and of none: read as qemu reads
    them."""
    path = str(tmp_path / "bits.qcow2")
    size = 7 * MiB + 512            # 14337 granules: 4 clusters of 512-byte bits
    qemu_img("create", "-q", "-f", "qcow2", "-o", "cluster_size=512", path, str(size))
    with_bitmaps_on(path, [("fine", "512", False)])
    # one dirty granule in each 2 MiB a cluster of bits covers: qemu stores
    # those clusters, which are then overwritten
    qemu_io(path, [f"write -P 1 {i * 2 * MiB} 512" for i in range(4)], fmt="qcow2")
    assert bitmap_entry(path, "fine").table_size == 4
    assert all(bitmap_table(path, "fine"))
    rng = random.Random(26)
    bitmap_patch(path, "fine", bits=(0, bytes(rng.randrange(256) for _ in range(512))))
    bitmap_patch(path, "fine", bits=(1, (b"\xff" * 8 + b"\0" * 8 + b"\x0f\xf0" * 4) * 21
                                        + b"\x80" * 8))
    bitmap_patch(path, "fine", table_entry=(2, 1))        # all ones, no cluster
    bitmap_patch(path, "fine", bits=(3, b"\x01\x80" + b"\xff" * 510))   # past the end too
    want = qemu_dirty(path, ["fine"])["fine"]
    assert len(want) > 2000                     # the random cluster: runs of every length
    assert mine(path, "fine") == want
    # the last cluster: granule 0 and from granule 15 on, to the disk's end
    assert want[-1] == (6 * MiB + 15 * 512, size - 6 * MiB - 15 * 512, True)
    bitmap_patch(path, "fine", table_entry=(2, 0))        # no cluster: all zeros
    assert mine(path, "fine") == qemu_dirty(path, ["fine"])["fine"]


def test_hostile_table_entries_as_qemu_reads_them(tmp_path):
    """A table naming a refcount block, a cluster of ones, a cluster far
    past the end of the file and one of alternating granules (hostile.py):
    qemu opens the image and exports the bitmap; imgcopy reads the same."""
    path = str(tmp_path / "h.qcow2")
    with open(path, "wb") as f:
        f.write(hostile.CASES_BY_NAME["bitmap-bits-anywhere"].build())
    want = qemu_dirty(path, ["b"])["b"]
    assert (2 * MiB, 2 * MiB, True) in want and (4 * MiB, 2 * MiB, False) in want
    assert (8 * 512, 512, True) in want          # the refcount block's first 1 (0x0001)
    assert mine(path, "b") == want


def test_windows_of_the_map(tmp_path):
    """A range of the image: the whole map's ranges clipped to it, its
    extents tiling it; past the end an empty map, the bitmap still
    checked."""
    cluster, size, _ = CASES["clusters-64k"]
    path = str(tmp_path / "w.qcow2")
    qemu_img("create", "-q", "-f", "qcow2", path, str(size))
    with_bitmaps_on(path, [("fine", "512", False)])
    qemu_io(path, guest_writes(size, cluster), fmt="qcow2")
    whole = imgcopy.dirty_map(path, "fine").dirty_ranges()
    for start, length in ((0, 512), (3 * MiB + 99, 70002), (MiB, 5 * MiB), (size - 1000, 10 ** 9),
                          (cluster - 1, 2)):
        m = imgcopy.dirty_map(path, "fine", start=start, length=length)
        end = min(start + length, size)
        assert (m.start, m.end) == (start, end)
        assert m[0].start == start and m[-1].end == end
        assert all(a.end == b.start for a, b in zip(m, m[1:]))
        clipped = [(max(s, start), min(e, end)) for s, e in whole if s < end and e > start]
        assert m.dirty_ranges() == clipped
    empty = imgcopy.dirty_map(path, "fine", start=size, length=4096)
    assert len(empty) == 0 and json.loads(empty.to_json()) == \
        [{"start": size, "length": 0, "dirty": False}]
    with pytest.raises(ValueError, match="is not found"):
        imgcopy.dirty_map(path, "nope", start=size)


def test_extents_keep_their_allocation(tmp_path):
    """A dirty map is the extent map cut where the bitmap changes: every
    piece has the flags (and host offset) of the extent it was cut from."""
    path = str(tmp_path / "alloc.qcow2")
    size = 16 * MiB
    qemu_img("create", "-q", "-f", "qcow2", path, str(size))
    qemu_io(path, ["write -P 5 0 4M", "write -z 8M 1M"], fmt="qcow2")
    with_bitmaps_on(path, [("b", "64k", False)])
    qemu_io(path, ["write -P 6 1M 100k", "write -P 7 12M 64k", "write -z 3M 2M"], fmt="qcow2")
    plain = imgcopy.map(path)
    m = imgcopy.dirty_map(path, "b")
    assert m.bitmap == "b" and plain.bitmap is None
    assert sum(e.length for e in m) == size and m.dirty_bytes == sum(
        e - s for s, e in m.dirty_ranges())
    for e in m:
        whole = next(p for p in plain if p.start <= e.start < p.end)
        assert e.end <= whole.end
        assert (e.depth, e.present, e.zero, e.data, e.compressed) == \
            (whole.depth, whole.present, whole.zero, whole.data, whole.compressed)
        assert e.host_offset == (None if whole.host_offset is None
                                 else whole.host_offset + e.start - whole.start)
    assert [(s, e - s, True) for s, e in m.dirty_ranges()] == \
        [r for r in qemu_dirty(path, ["b"])["b"] if r[2]]
    assert m.summary()["dirty_data_bytes"] == sum(e.length for e in m if e.dirty and e.data)
    assert m != plain and imgcopy.dirty_map(path, "b") == m


def test_a_dirty_map_is_the_changes_a_warm_copy_copies(tmp_path):
    """convert(changed=dirty_map) copies the bitmap's dirty ranges into the
    earlier copy and nothing else; a plain map's extents say nothing of
    changes (dirty None) and stand for all of it."""
    src = str(tmp_path / "src.qcow2")
    qemu_img("create", "-q", "-f", "qcow2", src, str(16 * MiB))
    qemu_io(src, ["write -P 1 0 6M"], fmt="qcow2")
    dst = str(tmp_path / "dst.raw")
    imgcopy.convert(src, dst)
    with_bitmaps_on(src, [("b", "64k", False)])
    qemu_io(src, ["write -P 2 1M 100k", "write -z 3M 64k", "write -P 3 10M 4k"], fmt="qcow2")
    changes = imgcopy.dirty_map(src, "b")
    assert all(e.dirty in (True, False) for e in changes)
    assert all(e.dirty is None for e in imgcopy.map(src))
    res = imgcopy.convert(src, dst, dst_format="raw", create=False, changed=changes)
    assert res.bytes_changed == changes.dirty_bytes == 128 * KiB + 64 * KiB + 64 * KiB
    assert qemu_img("compare", "-q", "-f", "qcow2", "-F", "raw", src, dst,
                    check=False).returncode == 0


def test_several_bitmaps_read_at_once(tmp_path):
    """Threads reading different bitmaps of one open image get what each
    alone gets (the driver reads them under one lock)."""
    path = str(tmp_path / "t.qcow2")
    size = 20 * MiB
    qemu_img("create", "-q", "-f", "qcow2", "-o", "cluster_size=4096", path, str(size))
    names = [("a", "512", False), ("b", "4096", False), ("c", "64k", False)]
    with_bitmaps_on(path, names)
    rng = random.Random(3)
    qemu_io(path, [f"write -P 9 {rng.randrange(size // 512) * 512} {rng.choice([512, 8192])}"
                   for _ in range(300)], fmt="qcow2")
    with imgcopy.open(path) as img:
        alone = {n: img.dirty_map(n) for n, _, _ in names}
        got, errors = {}, []

        def read(n, i):
            try:
                got[(n, i)] = img.dirty_map(n)
            except Exception as exc:   # reported below
                errors.append(exc)
        threads = [threading.Thread(target=read, args=(n, i)) for i in range(4)
                   for n, _, _ in names]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors
    assert all(m == alone[n] for (n, _), m in got.items())
    want = qemu_dirty(path, [n for n, _, _ in names])
    assert all(mine(path, n) == want[n] for n, _, _ in names)


def test_terabyte_disk_in_milliseconds(tmp_path):
    """1 TiB, a few dirty clusters: the table's few clusters of bits are
    read, not 2 MiB of bitmap per 64 KiB granules, nor the disk."""
    path = str(tmp_path / "tera.qcow2")
    size = TiB
    qemu_img("create", "-q", "-f", "qcow2", path, str(size))
    with_bitmaps_on(path, [("b", None, False), ("fine", "4k", False)])
    qemu_io(path, ["write -P 1 0 64k", f"write -P 2 {500 * GiB + 4096} 8k",
                   f"write -P 3 {size - 64 * KiB} 64k"], fmt="qcow2")
    for name in ("b", "fine"):
        best = 10.0
        for _ in range(3):
            t0 = time.perf_counter()
            m = imgcopy.dirty_map(path, name)
            best = min(best, time.perf_counter() - t0)
        assert best < 0.25, f"{name}: {best:.3f} s"
        assert len(m.dirty_ranges()) == 3 and m.dirty_ranges()[-1][1] == size
    want = qemu_dirty(path, ["b", "fine"])
    assert mine(path, "b") == want["b"] and mine(path, "fine") == want["fine"]


def test_in_use_refused_as_qemu_refuses_it(tmp_path):
    path = left_in_use(with_bitmaps(str(tmp_path / "u.qcow2"), "3M",
                                    [("b0", None, False), ("off", "64k", True)]))
    for name in ("b0", "off"):
        said = qemu_refusal(path, name)
        assert said == f"Bitmap '{name}' is inconsistent and cannot be used"
        with pytest.raises(ImageFormatError) as exc:
            imgcopy.dirty_map(path, name)
        assert said in str(exc.value) and exc.value.filename == path
        assert "qemu-img bitmap --remove" in str(exc.value)


def test_no_such_bitmap(tmp_path):
    path = with_bitmaps(str(tmp_path / "n.qcow2"), "1M", [("b0", None, False),
                                                        ("off", "64k", True)])
    said = qemu_refusal(path, "nope")
    assert said == "Bitmap 'nope' is not found"
    with pytest.raises(ValueError) as exc:
        imgcopy.dirty_map(path, "nope")
    assert not isinstance(exc.value, ImageFormatError)
    assert said in str(exc.value) and "the image has 2: 'b0', 'off'" in str(exc.value)
    none = with_bitmaps(str(tmp_path / "none.qcow2"), "1M", [])
    with pytest.raises(ValueError, match="is not found .the image has no bitmaps"):
        imgcopy.dirty_map(none, "b0")
    v2 = with_bitmaps(str(tmp_path / "v2.qcow2"), "1M", [], compat="0.10")
    with pytest.raises(ValueError, match="no bitmaps"):
        imgcopy.dirty_map(v2, "b0")


@pytest.mark.parametrize("fmt", ["raw", "vmdk", "vpc"])
def test_formats_without_bitmaps(tmp_path, fmt):
    path = str(tmp_path / f"d.{fmt}")
    qemu_img("create", "-q", "-f", fmt, path, "1M")
    with pytest.raises(ValueError, match=f"{fmt} images keep no persistent dirty bitmaps"):
        imgcopy.dirty_map(path, "b0")


def test_a_layers_own_bitmaps(tmp_path):
    """An overlay's dirty map is its own bitmap's: the base's bitmaps are
    the base's (qemu-nbd -B would look down the chain for one)."""
    base = with_bitmaps(str(tmp_path / "base.qcow2"), "4M", [("b", None, False)])
    qemu_io(base, ["write -P 1 0 64k"], fmt="qcow2")
    top = str(tmp_path / "top.qcow2")
    qemu_img("create", "-q", "-f", "qcow2", "-b", base, "-F", "qcow2", top)
    with_bitmaps_on(top, [("t", "4k", False)])
    qemu_io(top, ["write -P 2 1M 4k"], fmt="qcow2")
    with pytest.raises(ValueError, match="Bitmap 'b' is not found .the image has 1: 't'"):
        imgcopy.dirty_map(top, "b")
    assert mine(top, "t") == [(0, MiB, False), (MiB, 4096, True), (MiB + 4096, 3 * MiB - 4096,
                                                                  False)]
    assert mine(top, "t") == qemu_dirty(top, ["t"])["t"]
    assert mine(base, "b") == [(0, 64 * KiB, True), (64 * KiB, 4 * MiB - 64 * KiB, False)]


def test_table_of_the_wrong_size_refused_at_open(tmp_path):
    """qemu loads every bitmap when it opens an image and refuses one whose
    table is not exactly the clusters its bits fill; so does imgcopy.  A
    bitmap in use is not loaded: its table may be anything."""
    path = with_bitmaps(str(tmp_path / "s.qcow2"), "10M", [("b0", None, False)])
    bitmap_patch(path, "b0", table_size=2)
    p = qemu_img("info", path, check=False)
    assert p.returncode == 1 and "Could not read bitmap 'b0' from image" in p.stderr
    with pytest.raises(ImageFormatError, match="bitmap 'b0''s table has 2 entries where a disk "
                                               "of 10485760 bytes needs 1"):
        imgcopy.open(path)
    used = left_in_use(with_bitmaps(str(tmp_path / "u.qcow2"), "10M", [("b0", None, False)]))
    bitmap_patch(used, "b0", table_size=2)
    qemu_img("info", used)
    with imgcopy.open(used) as img:
        assert [b.in_use for b in img.bitmaps()] == [True]


def test_none_once_imgcopy_writes(tmp_path):
    """imgcopy keeps no bitmap up to date: once it writes, it reads none."""
    path = with_bitmaps(str(tmp_path / "w.qcow2"), "1M", [("b0", None, False)])
    with imgcopy.open(path, mode="r+") as img:
        assert img.dirty_map("b0").dirty_bytes == 0
        img.write(0, b"x" * 512)
        with pytest.raises(ValueError, match="Bitmap 'b0' is not found"):
            img.dirty_map("b0")


def test_cli(tmp_path, imgcopy_env):
    """imgcopy map --bitmap: the dirty ranges (human, as qemu-img map lists
    data ranges), every range with "dirty" (json); qemu's refusals."""
    cluster, size, _ = CASES["clusters-64k"]
    path = str(tmp_path / "c.qcow2")
    qemu_img("create", "-q", "-f", "qcow2", path, str(size))
    with_bitmaps_on(path, [("b", "4k", False)])
    qemu_io(path, guest_writes(size, cluster), fmt="qcow2")
    want = qemu_dirty(path, ["b"])["b"]

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "imgcopy", "map", *args], env=imgcopy_env,
                              capture_output=True, text=True)
    p = cli("--bitmap", "b", "--output=json", path)
    assert p.returncode == 0, p.stderr
    assert [(e["start"], e["length"], e["dirty"]) for e in json.loads(p.stdout)] == want
    assert p.stdout == imgcopy.dirty_map(path, "b").to_json()
    p = cli("--bitmap", "b", path)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].split() == ["Offset", "Length", "File"]
    assert [tuple(int(x, 0) for x in line.split()[:2]) for line in lines[1:]] == \
        [(s, n) for s, n, d in want if d]
    assert all(line.split()[2] == path for line in lines[1:])
    p = cli("--bitmap", "b", "-s", str(3 * MiB), "-l", str(MiB), "--output=json", path)
    assert json.loads(p.stdout)[0]["start"] == 3 * MiB
    assert sum(e["length"] for e in json.loads(p.stdout)) == MiB
    p = cli("--bitmap", "nope", path)
    assert p.returncode == 1 and "Bitmap 'nope' is not found" in p.stderr
    used = left_in_use(with_bitmaps(str(tmp_path / "u.qcow2"), "1M", [("b0", None, False)]))
    p = cli("--bitmap", "b0", used)
    assert p.returncode == 1 and "Bitmap 'b0' is inconsistent and cannot be used" in p.stderr
