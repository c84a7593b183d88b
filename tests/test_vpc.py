"""VHD (qemu's "vpc") read as qemu-img 7.2 reads it: images qemu-img makes
(dynamic and fixed, with and without force_size) from seeded raw sources,
images of other producers (qemu-iotests' samples: Virtual PC, Hyper-V,
disk2vhd), small-block images written byte by byte (tests/gen/vpc_images.py)
and the hostile cases of tests/fuzz/hostile_vpc.py.  qemu-img is the oracle
of every answer: map (the whole entry, host offsets included), info, the
guest bytes (qemu-img compare of what imgcopy converts), and plan's counters
against convert's."""
import bz2
import json
import os
import random
import subprocess
import sys

import pytest

import imgcopy
from .convert_helpers import imgcopy_child_env
from .fuzz import hostile_vpc
from .gen import vpc_images as v
from .gen.raw_kinds import make_image
from .gen.sparse import seeded_bytes
from .oracles import (assert_same_content, entry_tuple, extent_tuple, qemu_img, qemu_info,
                      qemu_map, require_qemu)
from .units import KiB, MiB

HERE = os.path.dirname(os.path.abspath(__file__))
SAMPLES = os.path.join(HERE, "data", "qemu-iotests")
# CopyResult.to_dict() keys a plan also has (tests/test_plan.py)
PLAN_KEYS = ("bytes_read", "bytes_written", "bytes_zeroed", "bytes_skipped", "read_requests",
             "write_requests", "zero_requests", "extents")

SOURCES = [("holes_and_data", 1), ("alloc_zeros", 2), ("odd_size", 3), ("small_extents", 4),
           ("last_byte", 5), ("tiny", 6), ("unaligned", 7), ("big_sparse", 8)]
SUBFORMATS = {"dynamic": "subformat=dynamic", "fixed": "subformat=fixed",
              "dynamic-force": "subformat=dynamic,force_size=on",
              "fixed-force": "subformat=fixed,force_size=on"}
CASES = [(k, s, sub) for k, s in SOURCES for sub in SUBFORMATS
         if not (k == "big_sparse" and sub.startswith("fixed"))]


def case_id(c):
    return "%s-%d-%s" % c


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """(kind, seed, subformat) -> a VHD qemu-img converted from the seeded raw source."""
    require_qemu()
    d = tmp_path_factory.mktemp("vpc")
    out = {}
    for kind, seed in SOURCES:
        src = str(d / ("%s-%d.raw" % (kind, seed)))
        make_image(src, kind, seed)
        for sub, opts in SUBFORMATS.items():
            if (kind, seed, sub) in CASES:
                dst = str(d / ("%s-%d-%s.vhd" % (kind, seed, sub)))
                qemu_img("convert", "-f", "raw", "-O", "vpc", "-o", opts, src, dst)
                out[(kind, seed, sub)] = dst
    return out


def assert_map_as_qemu(path, fmt="vpc", cli=False):
    """imgcopy.map == qemu-img map, every field of every entry (host offsets
    too: the same file is read); with `cli`, the JSON of
    ``python -m imgcopy map`` is qemu's, byte for byte."""
    q = qemu_map(path, fmt=fmt)
    mine = [extent_tuple(e) for e in imgcopy.map(path, format=fmt)]
    # an empty image: qemu prints a zero-length entry, the API has none
    assert mine == [entry_tuple(d) for d in q.extents if d["length"]]
    if not cli:
        return
    p = subprocess.run([sys.executable, "-m", "imgcopy", "map", "--output=json", "-f", fmt, path],
                       env=imgcopy_child_env(), capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == q.extents
    assert p.stdout == q.text


def assert_info_as_qemu(path):
    """format, virtual size, cluster size (a dynamic disk's block size) and
    the absence of format-specific data, as qemu-img info says."""
    q = qemu_info(path, fmt="vpc")
    mine = imgcopy.info(path, format="vpc").to_dict()
    assert mine["format"] == q["format"] == "vpc"
    assert mine["virtual-size"] == q["virtual-size"]
    assert imgcopy.open(path, format="vpc").size == q["virtual-size"]
    # qemu's cluster size is an int: a 2 GiB block prints as -2147483648
    if q.get("cluster-size", 0) < 0:
        q["cluster-size"] += 1 << 32
    for key in ("cluster-size", "format-specific", "dirty-flag", "backing-filename"):
        assert mine.get(key) == q.get(key), key


def assert_converts_as_qemu(path, tmp, threshold=None):
    """convert to raw and to qcow2: guest bytes identical to the VHD's as
    qemu reads them; plan's counters are convert's."""
    raw = os.path.join(tmp, "out.raw")
    r = imgcopy.convert(path, raw, src_format="vpc", dst_format="raw",
                        sparse_threshold=threshold, flush=False)
    assert_same_content(path, raw, "vpc", "raw")
    p = imgcopy.plan(path, src_format="vpc", sparse_threshold=threshold)
    assert {k: p.totals()[k] for k in PLAN_KEYS} == {k: r.to_dict()[k] for k in PLAN_KEYS}
    qcow2 = os.path.join(tmp, "out.qcow2")
    imgcopy.convert(path, qcow2, src_format="vpc", dst_format="qcow2", flush=False)
    assert_same_content(path, qcow2, "vpc", "qcow2")
    os.unlink(raw)
    os.unlink(qcow2)


# --------------------------------------------------------------------------
# images qemu-img makes

@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_qemu_made_image(made, case, tmp_path):
    path = made[case]
    assert_map_as_qemu(path, cli=True)
    assert_info_as_qemu(path)
    assert_converts_as_qemu(path, str(tmp_path), threshold=4 * KiB)


@pytest.mark.parametrize("sub", ["dynamic", "fixed"])
def test_probed_as_vpc(made, sub):
    """A dynamic disk by its footer copy at 0, a fixed one by its footer at
    the end of the file."""
    path = made[("holes_and_data", 1, sub)]
    with imgcopy.open(path) as img:
        assert img.format == "vpc"
    assert [extent_tuple(e) for e in imgcopy.map(path)] == \
        [entry_tuple(d) for d in qemu_map(path, fmt="vpc").extents]


def test_partial_ranges(made):
    """map of ranges that start and end inside blocks, as qemu maps them."""
    path = made[("big_sparse", 8, "dynamic")]
    size = imgcopy.open(path, format="vpc").size
    for start, length in [(1, 3 * MiB), (2 * MiB - 512, 4096), (size - 5000, 5000),
                          (size // 2 + 12345, 7 * MiB)]:
        q = qemu_map(path, fmt="vpc", start=start, length=length)
        mine = imgcopy.map(path, format="vpc", start=start, length=length)
        assert [extent_tuple(e) for e in mine] == [entry_tuple(d) for d in q.extents]


def test_reads_match_qemu(made, tmp_path):
    """Image.read at odd offsets across block and file boundaries gives the
    bytes qemu-img converts the image to."""
    for sub in ("dynamic", "fixed-force"):
        path = made[("odd_size", 3, sub)]
        out = str(tmp_path / "qemu.raw")
        qemu_img("convert", "-f", "vpc", "-O", "raw", path, out)
        with open(out, "rb") as f:
            raw = f.read()
        with imgcopy.open(path, format="vpc") as img:
            assert img.size == len(raw)
            for off, n in [(0, 1), (511, 1025), (2 * MiB - 3, 7), (img.size - 1, 1),
                           (img.size // 3, 300000)]:
                if off + n <= img.size:
                    assert img.read(off, n) == raw[off:off + n], (sub, off, n)


# --------------------------------------------------------------------------
# images of other producers (qemu-iotests 146)

def decompress_sparse(name, dst):
    """A sample image, all-zero 64 KiB runs left as holes."""
    with bz2.open(os.path.join(SAMPLES, name)) as f, open(dst, "wb") as out:
        while True:
            chunk = f.read(64 * KiB)
            if not chunk:
                break
            if chunk.count(0) == len(chunk):
                out.seek(len(chunk), os.SEEK_CUR)
            else:
                out.write(chunk)
        out.truncate()
    return dst


@pytest.mark.parametrize("name", ["d2v-zerofilled.vhd.bz2", "hyperv2012r2-dynamic.vhd.bz2",
                                  "virtualpc-dynamic.vhd.bz2"])
def test_sample_images(name, tmp_path):
    require_qemu()
    path = decompress_sparse(name, str(tmp_path / name[:-4]))
    assert_info_as_qemu(path)
    assert_map_as_qemu(path, cli=True)
    if name.startswith("d2v"):
        # qemu-iotests 146: disk2vhd sizes by current_size
        assert imgcopy.open(path, format="vpc").size == 263454720
        assert_converts_as_qemu(path, str(tmp_path))
    else:
        # 127 GiB of nothing: the copy is all zeros, checked without writing it
        p = imgcopy.plan(path, src_format="vpc")
        assert p.totals()["bytes_written"] == 0
        assert p.totals()["bytes_read"] == 0


# --------------------------------------------------------------------------
# hand-made images: small blocks, other creators' size rules

def _blob(n, seed):
    return seeded_bytes(n, seed)


HANDMADE = {
    # 512-byte blocks, the last one partial
    "dyn-512": lambda: v.dynamic(100 * 512 + 300, {0: _blob(512, 1), 7: _blob(10, 2),
                                                   8: _blob(512, 3), 100: _blob(300, 4)},
                                 block_size=512),
    # 4 KiB blocks stored in reverse order, a block of zeros written out
    "dyn-4k": lambda: v.dynamic(300 * KiB + 1234, {i: _blob(4096, i) for i in range(0, 76, 3)}
                                | {10: bytes(4096)}, block_size=4096),
    # Virtual PC: the size is the CHS geometry (smaller than current_size)
    "vpc-chs": lambda: v.dynamic(600 * KiB, {0: _blob(4096, 5), 60: _blob(4096, 6)},
                                 block_size=4096, creator_app=b"vpc ", geometry=(9, 4, 17)),
    # Hyper-V, disk2vhd, XenServer, XenConverter: current_size
    "win": lambda: v.dynamic(90 * KiB + 512, {3: _blob(4096, 7)}, block_size=4096,
                             creator_app=b"win ", geometry=(2, 4, 17)),
    "d2v-fixed": lambda: v.fixed(_blob(70000, 8), 100 * KiB + 512, creator_app=b"d2v ",
                                 geometry=(3, 4, 17)),
    "tap": lambda: v.dynamic(64 * KiB, {1: _blob(4096, 9)}, block_size=4096,
                             creator_app=b"tap\0", geometry=(1, 4, 17)),
    "ctxs-fixed": lambda: v.fixed(_blob(512, 10), 9 * 512, creator_app=b"CTXS",
                                  geometry=(1, 1, 1)),
    # qemu's CHS sizing with the maximal geometry: current_size
    "qemu-max-chs": lambda: v.dynamic(64 * KiB + 512, {16: _blob(512, 11)}, block_size=4096,
                                      creator_app=b"qemu"),
    "vpc-fixed-chs": lambda: v.fixed(_blob(20000, 12), 40 * KiB, creator_app=b"vpc ",
                                     geometry=(1, 4, 17)),
    # a sector bitmap of zeros: qemu reads the block's data anyway
    "bitmap-zero": lambda: v.dynamic(64 * KiB, {2: _blob(8192, 13)}, block_size=8192,
                                     bitmap_byte=0),
    "block-1m": lambda: v.dynamic(3 * MiB + 512, {1: _blob(5000, 14)}, block_size=1 * MiB),
}


@pytest.mark.parametrize("name", sorted(HANDMADE))
def test_handmade_image(name, tmp_path):
    require_qemu()
    path = str(tmp_path / (name + ".vhd"))
    with open(path, "wb") as f:
        f.write(bytes(HANDMADE[name]()))
    assert_info_as_qemu(path)
    assert_map_as_qemu(path)
    assert_converts_as_qemu(path, str(tmp_path))


# --------------------------------------------------------------------------
# hostile images

HOSTILE_ANY = sorted(n for n, c in hostile_vpc.CASES.items() if c.expect == "any")
HOSTILE_ERROR = sorted(n for n, c in hostile_vpc.CASES.items() if c.expect == "error")

# each opened in a child process: a hang or a crash fails the test, not the run
_OPEN_ALL = """
import json, sys, imgcopy
out = {}
for path in sys.argv[1:]:
    try:
        with imgcopy.open(path, format="vpc") as img:
            img.extents()
            img.read(0, min(img.size, 65536))
        out[path] = ["opened", ""]
    except imgcopy.ImageFormatError as e:
        out[path] = ["ImageFormatError", str(e)]
    except Exception as e:
        out[path] = [type(e).__name__, str(e)]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def hostile_dir(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("vpc-hostile"))
    hostile_vpc.write_all(d)
    return d


def hostile_path(d, name):
    return os.path.join(d, "hostile-%s.vhd" % name)


def test_hostile_refused(hostile_dir):
    paths = [hostile_path(hostile_dir, n) for n in HOSTILE_ERROR]
    p = subprocess.run([sys.executable, "-c", _OPEN_ALL, *paths], env=imgcopy_child_env(),
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)
    for name, path in zip(HOSTILE_ERROR, paths):
        assert got[path][0] == "ImageFormatError", (name, got[path])
    assert "differencing" in got[hostile_path(hostile_dir, "differencing")][1]
    assert "disk type 5" in got[hostile_path(hostile_dir, "type-5")][1]


@pytest.mark.parametrize("name", sorted(hostile_vpc.CASES))
def test_hostile_qemu_agrees(hostile_dir, name):
    """qemu-img opens exactly the cases the table says it opens: imgcopy
    refuses what qemu refuses, and refuses more only on purpose."""
    require_qemu()
    p = qemu_img("info", "-f", "vpc", hostile_path(hostile_dir, name), check=False)
    assert (p.returncode == 0) == hostile_vpc.CASES[name].qemu_opens, p.stderr


@pytest.mark.parametrize("name", HOSTILE_ANY)
def test_hostile_read_as_qemu(hostile_dir, name, tmp_path):
    """Damage qemu reads through (a lost last footer, a bad dynamic header
    checksum, blocks over metadata, a fixed footer claiming more than the
    file): imgcopy reads the same bytes and maps the same extents."""
    require_qemu()
    path = hostile_path(hostile_dir, name)
    assert_info_as_qemu(path)
    assert_map_as_qemu(path)
    assert_converts_as_qemu(path, str(tmp_path))


# --------------------------------------------------------------------------
# the fuzzer's seeds: valid images, read as qemu reads them; and mutants of
# them, opened or refused as qemu does

SEEDS = os.path.join(HERE, "fuzz", "seeds", "vpc")


@pytest.mark.parametrize("name", sorted(os.listdir(SEEDS)) if os.path.isdir(SEEDS) else [])
def test_fuzz_seed_read_as_qemu(name, tmp_path):
    require_qemu()
    path = os.path.join(SEEDS, name)
    assert_info_as_qemu(path)
    assert_map_as_qemu(path)
    assert_converts_as_qemu(path, str(tmp_path))


def _mutant_sources():
    names = sorted(os.listdir(SEEDS)) if os.path.isdir(SEEDS) else []
    return [os.path.join(SEEDS, n) for n in names if os.path.getsize(os.path.join(SEEDS, n)) < 100 * KiB]


@pytest.mark.parametrize("seed", range(4))
def test_mutants_as_qemu(seed, tmp_path):
    """Seeded mutants of the seeds' headers, BATs and ends: imgcopy opens
    exactly those qemu-img opens (but the disk types it refuses on purpose),
    and reads them as qemu does."""
    require_qemu()
    rng = random.Random(seed)
    sources = _mutant_sources()
    opened = 0
    for n in range(40):
        with open(rng.choice(sources), "rb") as f:
            img = v.mutate(f.read(), rng)
        path = str(tmp_path / ("m%d.vhd" % n))
        with open(path, "wb") as f:
            f.write(bytes(img))
        q = qemu_img("info", "-f", "vpc", path, check=False)
        try:
            imgcopy.open(path, format="vpc").close()
            mine = None
        except imgcopy.ImageFormatError as e:
            mine = str(e)
        if mine is not None and "disk type" in mine:
            continue
        assert (q.returncode == 0) == (mine is None), (n, q.stderr, mine)
        if mine is None:
            opened += 1
            assert_info_as_qemu(path)
            assert_map_as_qemu(path)
            assert_converts_as_qemu(path, str(tmp_path))
    assert opened > 0


def test_bat_beyond_memory_budget(tmp_path):
    """A BAT of 280 MiB (a hole in a sparse file: every entry reads as
    block 0, which lies inside the file) is more than a chain's metadata
    budget: refused before it is read, where qemu would allocate it."""
    entries, bs = 70 << 20, 512
    size = entries * bs
    bat_end = 1536 + entries * 4
    path = str(tmp_path / "big-bat.vhd")
    ft = v.footer(disk_type=v.DYNAMIC, current_size=size, data_offset=512)
    with open(path, "wb") as f:
        f.write(ft + v.dyn_header(table_offset=1536, entries=entries, block_size=bs))
        f.truncate(bat_end)
    with pytest.raises(imgcopy.ImageFormatError, match="memory"):
        imgcopy.open(path, format="vpc")
