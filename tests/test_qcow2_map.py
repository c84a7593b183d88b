"""imgcopy.map() / block_status() / backing_chain on qcow2 images versus qemu-img.

Every image of tests/gen/qcow2_images.py (cluster sizes 512 B .. 2 MiB, compat 0.10 and
1.1, zero / unallocated / compressed clusters, backing chains of depth 3 with
raw and qcow2 links, odd virtual sizes, metadata / falloc / full
preallocation, fragmented write orders, the make_corpus images at 1/16 scale)
must map *byte-identically* to ``qemu-img map --output=json`` and to the human
format, whole and in windows (``--start-offset`` / ``--max-length``).  Where
qemu's human format refuses an image ("File contains external, encrypted or
compressed clusters."), imgcopy's to_human() must raise ValueError.
"""

import json
import random
import time

import pytest

import imgcopy

from .gen import qcow2_images
from .oracles import covering, needs_qemu, qemu_chain, qemu_img, qemu_io
from .units import KiB, MiB, PiB

pytestmark = needs_qemu

MAP_NAMES = [n for n in qcow2_images.NAMES if n != "petabyte"]
COMPRESSED_MSG = "File contains external, encrypted or compressed clusters."


def _human_check(m, q, where):
    """imgcopy's human map vs qemu's: equal, or both refuse."""
    if q.returncode == 0:
        assert m.to_human() == q.stdout, where
    else:
        assert COMPRESSED_MSG in q.stderr, (where, q.stderr)
        with pytest.raises(ValueError, match="compressed clusters"):
            m.to_human()


# --------------------------------------------------------------------------
# whole images

@pytest.mark.parametrize("name", MAP_NAMES)
def test_map_json_equals_qemu(qcow2_all, name):
    b = qcow2_all.get(name)
    m = imgcopy.map(b.path)
    assert m.to_json() == qcow2_all.qemu_json(b.path)
    assert m.size == b.size
    assert m.format == "qcow2"
    # the parsed extents tile the image exactly and agree with qemu's entries
    q = json.loads(qcow2_all.qemu_json(b.path))
    assert [e.to_dict() for e in m] == q
    pos = 0
    for e in m:
        assert e.start == pos and e.length > 0
        pos = e.end
    assert pos == b.size


@pytest.mark.parametrize("name", MAP_NAMES)
def test_map_human_equals_qemu(qcow2_all, name):
    b = qcow2_all.get(name)
    q = qcow2_all.qemu_human(b.path)
    # the catalogue knows which images hold compressed clusters; so does qemu
    assert (q.returncode != 0) == b.compressed, (q.returncode, q.stderr)
    _human_check(imgcopy.map(b.path), q, name)


@pytest.mark.parametrize("name", MAP_NAMES)
def test_compressed_flag(qcow2_all, name):
    """Extent.compressed: exactly the data extents qemu reports without an offset
    (in this catalogue, only compressed clusters lack a host offset)."""
    b = qcow2_all.get(name)
    m = imgcopy.map(b.path)
    seen = False
    for e in m:
        if e.compressed:
            seen = True
            assert e.data and e.present and not e.zero and e.host_offset is None, e
        else:
            assert not (e.data and e.host_offset is None), e
    assert seen == b.compressed


# --------------------------------------------------------------------------
# windows (--start-offset / --max-length)

def _windows(size, entries, seed):
    rng = random.Random("qcow2-windows-%s-%d" % (seed, size))
    w = [(size - 1, None), (size, None), (0, 0),
         (rng.randrange(size), rng.randint(1, 3 * size))]
    bounds = sorted({d["start"] for d in entries if 0 < d["start"] < size})
    if bounds:
        for _ in range(2):
            b0 = rng.choice(bounds)
            # straddling an extent boundary, unaligned on both sides
            w.append((max(0, b0 - rng.randint(1, 70000)), rng.randint(2, 300000)))
    s = rng.randrange(size)
    w.append((s, rng.choice([1, 511, 513, 65537, rng.randint(1, size)])))
    # an exact extent
    d = entries[rng.randrange(len(entries))]
    w.append((d["start"], d["length"]))
    return w


@pytest.mark.parametrize("name", MAP_NAMES)
def test_map_windows(qcow2_all, name):
    b = qcow2_all.get(name)
    entries = json.loads(qcow2_all.qemu_json(b.path))
    windows = _windows(b.size, entries, name)
    human = [w for w in windows if w[0] < b.size][-4:]
    qcow2_all.prefetch([(b.path,) + w for w in windows], [(b.path,) + w for w in human])
    for start, length in windows:
        where = (name, start, length)
        m = imgcopy.map(b.path, start=start, length=length)
        assert m.to_json() == qcow2_all.qemu_json(b.path, start, length), where
        # windows agree with the whole map, clipped
        end = b.size if length is None else min(b.size, start + length)
        got = [(e.start, e.end) for e in m]
        if start < end:
            assert got[0][0] == start and got[-1][1] == end, where
        else:
            assert got == [], where
        if (start, length) in human:
            _human_check(m, qcow2_all.qemu_human(b.path, start, length), where)


@pytest.mark.parametrize("name", ["uni-c512-v2", "chain-top", "convc-4k", "odd-64k"])
def test_image_extents_method(qcow2_all, name):
    """Image.extents(start, length) is imgcopy.map(...) on an open image."""
    b = qcow2_all.get(name)
    with imgcopy.open(b.path) as img:
        assert img.format == "qcow2" and img.size == b.size
        for s, l in [(0, None), (12345, 678901), (b.size // 3, None)]:
            assert img.extents(s, l).to_json() == qcow2_all.qemu_json(b.path, s, l)
        # asking twice gives the same answer (caches stay coherent)
        assert img.extents().to_json() == qcow2_all.qemu_json(b.path)


# --------------------------------------------------------------------------
# block status at random offsets

@pytest.mark.parametrize("name", MAP_NAMES)
def test_block_status_consistent_with_map(qcow2_all, name):
    b = qcow2_all.get(name)
    entries = json.loads(qcow2_all.qemu_json(b.path))
    rng = random.Random("bs-" + name)
    offs = {0, b.size - 1}
    for d in entries:
        for o in (d["start"], d["start"] + d["length"] - 1, d["start"] + 1):
            if 0 <= o < b.size:
                offs.add(o)
    offs = sorted(offs)
    if len(offs) > 60:
        offs = rng.sample(offs, 60)
    offs += [rng.randrange(b.size) for _ in range(40)]
    if len(entries) > 400:                    # corpus images: fewer, still random
        offs = rng.sample(offs, 60)
    with imgcopy.open(b.path) as img:
        rng.shuffle(offs)
        for off in offs:
            d = covering(entries, off)
            e = img.block_status(off)
            where = (name, off, d, e)
            assert e.start == off, where
            assert 0 < e.length <= d["start"] + d["length"] - off, where
            assert (e.depth, e.present, e.zero, e.data) == \
                (d["depth"], d["present"], d["zero"], d["data"]), where
            if "offset" in d:
                assert e.host_offset == d["offset"] + (off - d["start"]), where
            else:
                assert e.host_offset is None, where
            # a length limit is honoured
            lim = min(rng.choice([1, 512, 4096, 100000]), b.size - off)
            e2 = img.block_status(off, lim)
            assert e2.start == off and 0 < e2.length <= min(lim, e.length), (where, lim, e2)
            assert e2[2:6] == e[2:6], (where, e2)


def test_block_status_outside(qcow2_all):
    b = qcow2_all.get("uni-c4096-v3")
    with imgcopy.open(b.path) as img:
        with pytest.raises(ValueError):
            img.block_status(b.size)
        with pytest.raises(ValueError):
            img.block_status(-1)


# --------------------------------------------------------------------------
# backing chains

@pytest.mark.parametrize("name", MAP_NAMES)
def test_backing_chain(qcow2_all, name):
    b = qcow2_all.get(name)
    with imgcopy.open(b.path) as img:
        chain = img.backing_chain
    assert chain == b.chain
    assert chain == qemu_chain(b.path)
    assert all(isinstance(p, str) for p, _ in chain)


def test_chain_depths(qcow2_all):
    """depth counts chain levels: the raw base of chain-top is depth 2."""
    m = imgcopy.map(qcow2_all.get("chain-top").path)
    depths = {e.depth for e in m}
    assert depths == {0, 1, 2}, depths
    # chain-small is smaller than its backing: nothing past its own end
    small = qcow2_all.get("chain-small")
    assert imgcopy.map(small.path)[-1].end == small.size


# images in a directory tree, opened by relative and absolute paths; the
# backing names are relative to each overlay's directory
TREE_CASES = [
    ("tree", "sub/deeper/over.qcow2"),
    ("tree", "./sub/deeper/over.qcow2"),
    ("tree/sub", "deeper/../deeper/over.qcow2"),
    ("tree/sub/deeper", "over.qcow2"),
    ("tree/sub/deeper", "../deeper/over.qcow2"),
    (".", "tree/sub/deeper/over.qcow2"),
    ("tree/sub", None),   # absolute path
]


@pytest.mark.parametrize("cwd,rel", TREE_CASES)
def test_tree_relative_paths(qcow2_all, monkeypatch, cwd, rel):
    b = qcow2_all.get("tree-over")
    cwd = qcow2_all.path(cwd)
    path = b.path if rel is None else rel
    monkeypatch.chdir(cwd)
    m = imgcopy.map(path)
    assert m.to_json() == qcow2_all.qemu_json(path, cwd=cwd)
    q = qcow2_all.qemu_human(path, cwd=cwd)
    assert q.returncode == 0, q.stderr
    assert m.to_human() == q.stdout
    # the human format names all three files of the chain
    assert len({line.split()[-1] for line in q.stdout.splitlines()[1:]}) == 3
    with imgcopy.open(path) as img:
        assert img.backing_chain == qemu_chain(path, cwd=cwd)
        assert len(img.backing_chain) == 2


def test_absolute_backing_name(qcow2_all, tmp_path, monkeypatch):
    """A backing file named by an absolute path, the overlay opened relatively."""
    mid = qcow2_all.get("chain-mid")
    d = tmp_path / "abs"
    d.mkdir()
    qcow2_images.create("over.qcow2", 5 * MiB, 64 * KiB, "1.1", mid.path, "qcow2", cwd=str(d))
    qemu_io(str(d / "over.qcow2"), ["write -P 0x99 %d 1000" % (1 * MiB - 500)], fmt="qcow2",
            cache="unsafe")
    monkeypatch.chdir(tmp_path)
    path = "abs/over.qcow2"
    with imgcopy.open(path) as img:
        assert img.backing_chain == [(mid.path, "qcow2")] + mid.chain
        assert img.backing_chain == qemu_chain(path, cwd=str(tmp_path))
    m = imgcopy.map(path)
    assert m.to_json() == qemu_img("map", "--output=json", path, cwd=str(tmp_path)).stdout
    q = qemu_img("map", path, cwd=str(tmp_path), check=False)
    _human_check(m, q, path)


# --------------------------------------------------------------------------
# a 1 PiB image with one cluster of data near 500 TiB

def _pb_expected_json(data_off, host_off):
    size = PiB
    return ('[{ "start": 0, "length": %d, "depth": 0, "present": false, "zero": true, '
            '"data": false},\n'
            '{ "start": %d, "length": 65536, "depth": 0, "present": true, "zero": false, '
            '"data": true, "offset": %d},\n'
            '{ "start": %d, "length": %d, "depth": 0, "present": false, "zero": true, '
            '"data": false}]\n' % (data_off, data_off, host_off, data_off + 65536,
                                   size - data_off - 65536))


def test_petabyte_image(qcow2_all):
    b = qcow2_all.get("petabyte")
    off = qcow2_images.PB_DATA_OFFSET
    # qemu over the whole image takes ~15 s; a window around the data is instant
    win = json.loads(qcow2_all.qemu_json(b.path, off - MiB, 3 * MiB))
    host = [d for d in win if d["data"]]
    assert len(host) == 1 and host[0]["start"] == off and host[0]["length"] == 64 * KiB
    expected = _pb_expected_json(off, host[0]["offset"])

    t0 = time.monotonic()
    with imgcopy.open(b.path) as img:
        assert img.size == PiB
        m = img.extents()
        js = m.to_json()
    elapsed = time.monotonic() - t0
    assert js == expected
    assert elapsed < 2.0, "opening and mapping 1 PiB took %.2f s" % elapsed

    # the only data extent lies inside the window: qemu's human map of the
    # window is the human map of the whole image
    assert m.to_human() == qcow2_all.qemu_human(b.path, off - MiB, 3 * MiB).stdout
    for s, l in [(off - MiB, 3 * MiB), (off + 100, 65536), (0, 2 * MiB),
                 (PiB - 5 * MiB - 7, None), (off - 1, 2)]:
        assert imgcopy.map(b.path, start=s, length=l).to_json() == \
            qcow2_all.qemu_json(b.path, s, l), (s, l)
    with imgcopy.open(b.path) as img:
        e = img.block_status(12345)
        assert (e.start, e.length, e.present, e.zero) == (12345, off - 12345, False, True)
        assert img.read(off - 2, 4) == b"\0\0\x77\x77"
        assert img.read(PiB - 3, 3) == bytes(3)


@pytest.mark.parametrize("base_size", [1, 511, 1000, 1023, 4097, 65535, 65536 + 100])
@pytest.mark.parametrize("depth", [1, 2])
def test_raw_backing_tail_rounded_like_qemu(tmp_path, base_size, depth):
    """qemu sees a raw backing file's length rounded up to 512 bytes: the
    tail past its end is the backing file's (zeros, depth 1), not the top's."""
    base = tmp_path / "base.raw"
    base.write_bytes(bytes(range(1, 256)) * (base_size // 255) + b"\x07" * (base_size % 255))
    below, fmt = "base.raw", "raw"
    for level in range(depth):
        top = str(tmp_path / ("top%d.qcow2" % level))
        qemu_img("create", "-f", "qcow2", "-b", below, "-F", fmt, top, str(MiB),
                 cwd=str(tmp_path))
        below, fmt = "top%d.qcow2" % level, "qcow2"
    q = qemu_img("map", "--output=json", top)
    assert imgcopy.map(top).to_json() == q.stdout
    qh = qemu_img("map", top)
    assert imgcopy.map(top).to_human() == qh.stdout
