"""Image.read() on qcow2 images versus ``qemu-img convert -O raw`` (and qemu-io).

Guest bytes must be identical at every offset: whole images, random
cluster-unaligned ranges, ranges straddling every extent boundary (compressed,
zero, unallocated, backing, past-the-backing-end clusters), for every cluster
size and compat level.  Images imgcopy cannot read correctly (encryption,
external data files, zstd, unknown incompatible bits, dirty or
corrupt ones unless forced) are refused with ImageFormatError naming the
feature; backing loops and missing backing files fail cleanly.
"""

import json
import os
import random
import re
import shutil

import pytest

import imgcopy

from .gen import qcow2_images
from .gen.qcow2_meta import header_patch, l2_patch
from .oracles import needs_qemu, qemu_img, qemu_io, qemu_io_args
from .build_features import HAVE_ZSTD
from .units import KiB, MiB

pytestmark = needs_qemu

READ_NAMES = [n for n in qcow2_images.NAMES if n != "petabyte"]


# --------------------------------------------------------------------------
# guest bytes

@pytest.mark.parametrize("name", qcow2_images.SMALL_NAMES)
def test_read_whole_image(qcow2_all, name):
    b = qcow2_all.get(name)
    want = qcow2_all.raw_bytes(name)
    with imgcopy.open(b.path) as img:
        assert img.format == "qcow2" and img.size == b.size == len(want)
        assert img.read(0, b.size) == want


def _ranges(size, entries, rng, n_random):
    """(offset, length) pairs: random ones, and some straddling each boundary."""
    out = []
    bounds = [d["start"] for d in entries if 0 < d["start"] < size]
    if len(bounds) > 80:
        bounds = rng.sample(bounds, 80)
    for bnd in bounds:
        a = max(0, bnd - rng.choice([1, 7, 511, 512, 4095, rng.randint(1, 200000)]))
        n = rng.choice([2, 513, 4097, 65536 + 3, rng.randint(1, 600000)])
        out.append((a, min(n, size - a)))
    for _ in range(n_random):
        off = rng.randrange(size)
        n = rng.choice([1, 3, 511, 512, 1000, 4096, 4097, 65535, 65537, 3 * MiB + 5,
                        rng.randint(1, 300000)])
        out.append((off, min(n, size - off)))
    out += [(0, 1), (size - 1, 1), (size - 4097, 4097), (0, 0), (size, 0)]
    return out


@pytest.mark.parametrize("name", READ_NAMES)
def test_read_random_ranges(qcow2_all, name):
    b = qcow2_all.get(name)
    entries = json.loads(qcow2_all.qemu_json(b.path))
    rng = random.Random("read-" + name)
    with imgcopy.open(b.path) as img:
        for off, n in _ranges(b.size, entries, rng, 60):
            got = img.read(off, n)
            assert len(got) == n, (name, off, n)
            if got != qcow2_all.raw_read(name, off, n):
                want = qcow2_all.raw_read(name, off, n)
                i = next(i for i in range(n) if got[i] != want[i])
                pytest.fail("%s: read(%d, %d) differs from qemu at guest offset %d "
                            "(got %02x, want %02x)" % (name, off, n, off + i, got[i], want[i]))


@pytest.mark.parametrize("name", qcow2_images.CORPUS)
def test_read_corpus_whole(qcow2_all, name):
    """The make_corpus images, read in 4 MiB + 1 chunks (unaligned on purpose)."""
    b = qcow2_all.get(name)
    chunk = 4 * MiB + 4097
    with imgcopy.open(b.path) as img, open(qcow2_all.raw(name), "rb") as raw:
        pos = 0
        while pos < b.size:
            n = min(chunk, b.size - pos)
            assert img.read(pos, n) == raw.read(n), (name, pos)
            pos += n


def test_uniform_images_identical(qcow2_all):
    """The same guest writes give the same bytes for every cluster size and
    compat level (qemu agrees with itself, and imgcopy with qemu)."""
    ref = qcow2_all.raw_bytes(qcow2_images.UNI_NAMES[0])
    for name in qcow2_images.UNI_NAMES:
        assert qcow2_all.raw_bytes(name) == ref, name
        with imgcopy.open(qcow2_all.get(name).path) as img:
            assert img.read(0, img.size) == ref, name
    # and they do hold what was written
    assert ref[0] == 0x41 and ref[2 * MiB + 5] == 0x43 and ref[3 * MiB + 777] == 0x44
    assert ref[400000:700000] == bytes(300000)
    assert ref[-1] == 0x46


def _qemu_io_read(path, off, n):
    out = qemu_io_args("-r", "-f", "qcow2", "-c", "read -v %d %d" % (off, n), path).stdout
    data = bytearray()
    for line in out.splitlines():
        m = re.match(r"^[0-9a-f]{8}:  ((?:[0-9a-f]{2} )+)", line)
        if m:
            data += bytes.fromhex(m.group(1).replace(" ", ""))
    assert len(data) == n, out
    return bytes(data)


@pytest.mark.parametrize("name,off,n", [
    ("chain-top", 65530, 20),                 # data written in top / COW'd cluster
    ("chain-top", 1 * MiB + 64 * KiB - 5, 11),  # backing data into a zero cluster
    ("chain-top", 3 * MiB + 690, 30),         # across the raw base's odd end
    ("chain-top", 4 * MiB - 2050, 8),         # across mid's end
    ("convc-64k", 1 * MiB - 9, 40),
    ("odd-64k", 983040 - 3, 9),               # into the compressed partial cluster
    ("uni-c512-v2", 3 * MiB + 770, 16),
])
def test_read_vs_qemu_io(qcow2_all, name, off, n):
    b = qcow2_all.get(name)
    with imgcopy.open(b.path) as img:
        assert img.read(off, n) == _qemu_io_read(b.path, off, n)


def test_read_concurrent_threads(qcow2_all):
    """Reads from several threads share the L2 cache safely."""
    from concurrent.futures import ThreadPoolExecutor

    name = "uni-c512-v3"           # 32 L2 tables: the cache is busy
    b = qcow2_all.get(name)
    want = qcow2_all.raw_bytes(name)
    rng = random.Random(7)
    jobs = [(o, min(rng.randint(1, 200000), b.size - o))
            for o in (rng.randrange(b.size) for _ in range(400))]
    with imgcopy.open(b.path) as img:
        with ThreadPoolExecutor(4) as ex:
            res = list(ex.map(lambda j: img.read(*j), jobs))
    for (o, n), got in zip(jobs, res):
        assert got == want[o:o + n], (o, n)


def test_petabyte_reads(qcow2_all):
    b = qcow2_all.get("petabyte")
    off = qcow2_images.PB_DATA_OFFSET
    with imgcopy.open(b.path) as img:
        assert img.read(off - 100, 65536 + 200) == bytes(100) + b"\x77" * 65536 + bytes(100)
        assert img.read(0, 4096) == bytes(4096)
        assert img.read(b.size - 10, 10) == bytes(10)


# --------------------------------------------------------------------------
# open(): format, mode and paths

def test_open_format_and_mode(qcow2_all):
    b = qcow2_all.get("odd-64k-tail")
    with imgcopy.open(b.path, format="qcow2") as img:
        assert img.format == "qcow2" and img.size == b.size
    # format="raw" reads the container itself, on purpose
    with imgcopy.open(b.path, format="raw") as img:
        assert img.format == "raw" and img.size == os.path.getsize(b.path)
        assert img.read(0, 4) == b"QFI\xfb"
    # r+ opens for writing; opened and closed without a write, the image is
    # left exactly as it was
    before = open(b.path, "rb").read()
    for fmt in (None, "qcow2"):
        with imgcopy.open(b.path, format=fmt, mode="r+") as img:
            assert img.format == "qcow2"
    assert open(b.path, "rb").read() == before
    assert imgcopy.map(b.path).to_json() == qcow2_all.qemu_json(b.path)


def test_format_mismatch(tmp_path):
    raw = tmp_path / "plain.raw"
    with open(raw, "wb") as f:
        f.truncate(1 * MiB)
    refused(imgcopy.open, str(raw), format="qcow2", words="not a qcow2 image")
    # the qcow2 magic and garbage after it: probed as qcow2, refused, never raw
    fake = tmp_path / "fake.img"
    with open(fake, "wb") as f:
        f.write(b"QFI\xfb" + b"garbage!" * 100)
        f.truncate(100000)
    refused(imgcopy.open, str(fake), words="version")
    with imgcopy.open(str(fake), format="raw") as img:
        assert img.size == 100000


def test_open_pathlike_and_bytes(qcow2_all):
    import pathlib

    b = qcow2_all.get("chain-top")
    want = qcow2_all.raw_read("chain-top", 0, 300000)
    for p in (pathlib.Path(b.path), os.fsencode(b.path)):
        with imgcopy.open(p) as img:
            assert img.read(0, 300000) == want
            assert img.backing_chain == b.chain


def test_backing_opened_read_only(qcow2_all, tmp_path):
    """A backing file without write permission still opens (read-only)."""
    d = tmp_path / "ro"
    d.mkdir()
    qcow2_images.create(str(d / "base.qcow2"), 1 * MiB, 4 * KiB)
    qemu_io(str(d / "base.qcow2"), ["write -P 0x5a 0 8192"], fmt="qcow2", cache="unsafe")
    qcow2_images.create("top.qcow2", 1 * MiB, 64 * KiB, "1.1", "base.qcow2", "qcow2", cwd=str(d))
    os.chmod(d / "base.qcow2", 0o444)
    with imgcopy.open(str(d / "top.qcow2")) as img:
        assert img.read(0, 8193) == b"\x5a" * 8192 + b"\0"
    if os.geteuid() != 0:
        with pytest.raises(PermissionError):
            open(d / "base.qcow2", "r+b")


# --------------------------------------------------------------------------
# refused images

def refused(fn, *args, words="", **kw):
    """fn(*args, **kw) must raise ImageFormatError whose message, paths
    removed (test directories are named after the tests), contains words."""
    with pytest.raises(imgcopy.ImageFormatError) as ei:
        fn(*args, **kw)
    e = ei.value
    assert isinstance(e, ValueError) and isinstance(e, imgcopy.Error)
    msg = re.sub(r"\S*/\S*", "<path>", str(e))
    assert words.lower() in msg.lower(), (words, str(e))
    return str(e)


# (patch, the words the error must contain)
REFUSED = [
    ({"crypt_method": 1}, "encrypt"),
    ({"crypt_method": 2}, "encrypt"),
    ({"incompatible_set": 2}, "external data file"),
    ({"incompatible_set": 20}, "bit 20"),
    ({"incompatible_set": 63}, "bit 63"),
] + ([] if HAVE_ZSTD else [({"incompatible_set": 3, "compression_type": 1}, "zstd")])


# v2 headers have no feature bits: only encryption applies to them
REFUSED_CASES = [("odd-64k-tail", p, w) for p, w in REFUSED] + \
    [("uni-c4096-v2", p, w) for p, w in REFUSED if "crypt_method" in p]


@pytest.mark.parametrize("base,patch,words", REFUSED_CASES,
                         ids=["%s-%s" % (b, "-".join("%s%s" % kv for kv in p.items()))
                              for b, p, _ in REFUSED_CASES])
def test_refused_feature(qcow2_all, tmp_path, base, patch, words):
    p = header_patch(qcow2_all.get(base).path, str(tmp_path / "x.qcow2"), **patch)
    for force in (False, True):
        refused(imgcopy.open, p, force=force, words=words)
    refused(imgcopy.map, p, words=words)
    refused(imgcopy.convert, p, "null:", words=words)


def test_real_zstd_image(tmp_path):
    """An image qemu itself made with compression_type=zstd: read as qemu
    reads it, or refused by name by a build without libzstd."""
    p = str(tmp_path / "z.qcow2")
    r = qemu_img("create", "-q", "-f", "qcow2", "-o", "compression_type=zstd", p, "1M",
                          check=False)
    if r.returncode != 0:
        pytest.skip("this qemu-img has no zstd: %s" % r.stderr.strip())
    qemu_io(p, ["write -c -P 0x33 0 64k", "write -P 0x44 128k 64k"], fmt="qcow2",
            cache="unsafe")
    if not HAVE_ZSTD:
        refused(imgcopy.open, p, words="zstd")
        return
    with imgcopy.open(p) as img:
        assert img.read(0, 192 * KiB) == b"\x33" * (64 * KiB) + bytes(64 * KiB) + \
            b"\x44" * (64 * KiB)
    assert imgcopy.info(p).format_specific["data"]["compression-type"] == "zstd"


@pytest.mark.parametrize("opt,words", [("data_file=ext.raw", "external data file")])
def test_refused_real_images(tmp_path, opt, words):
    """Images qemu itself made with an external data file (extended L2
    entries are read: test_qcow2_subclusters.py)."""
    d = str(tmp_path)
    qemu_img("create", "-q", "-f", "qcow2", "-o", opt, "x.qcow2", "1M", cwd=d)
    qemu_io("x.qcow2", ["write -P 0x21 0 64k"], cwd=d, fmt="qcow2", cache="unsafe")
    refused(imgcopy.open, os.path.join(d, "x.qcow2"), words=words)


def test_compression_type_without_feature_bit(qcow2_all, tmp_path):
    """qemu refuses a compression type whose incompatible bit is not set."""
    p = header_patch(qcow2_all.get("odd-64k-tail").path, str(tmp_path / "x.qcow2"),
                              compression_type=1)
    assert qemu_img("map", p, check=False).returncode != 0
    with pytest.raises(imgcopy.ImageFormatError):
        imgcopy.open(p)


@pytest.mark.parametrize("bit,word", [(0, "dirty"), (1, "corrupt")])
def test_dirty_and_corrupt_need_force(qcow2_all, tmp_path, bit, word):
    name = "odd-64k"
    p = header_patch(qcow2_all.get(name).path, str(tmp_path / "x.qcow2"), incompatible_set=bit)
    refused(imgcopy.open, p, words=word)
    refused(imgcopy.map, p, words=word)
    refused(imgcopy.open, p, mode="r+", force=True)
    with imgcopy.open(p, force=True) as img:
        assert img.read(0, img.size) == qcow2_all.raw_bytes(name)
    m = imgcopy.map(p, force=True)
    # qemu maps such an image when opening it read-only
    assert m.to_json() == qemu_img("map", "--output=json", p).stdout


def test_zero_flag_in_v2_image_is_corruption(tmp_path):
    """v2 has no zero clusters: qemu reports an L2 entry with the zero flag
    as corruption ("Zero cluster entry found in pre-v3 image") and fails the
    read with EIO; imgcopy must not quietly read the cluster's data instead."""
    p = str(tmp_path / "v2.qcow2")
    qcow2_images.create(p, 1 * MiB, 4 * KiB, "0.10")
    qemu_io(p, ["write -P 0x11 0 16k"], fmt="qcow2", cache="unsafe")
    old = l2_patch(p, 1, 1)
    assert old & (1 << 63) and not old & 1
    q = qemu_img("map", "--output=json", p, check=False)
    assert q.returncode != 0 and "pre-v3" in q.stderr
    with pytest.raises(imgcopy.ImageFormatError):
        with imgcopy.open(p) as img:
            img.read(4096, 16)
            img.extents()


def test_backing_loop(tmp_path):
    d = str(tmp_path)
    qcow2_images.create("a.qcow2", 1 * MiB, cwd=d)
    qcow2_images.create("b.qcow2", 1 * MiB, 64 * KiB, "1.1", "a.qcow2", "qcow2", cwd=d)
    qemu_img("rebase", "-u", "-b", "b.qcow2", "-F", "qcow2", "a.qcow2", cwd=d)
    for name in ("a.qcow2", "b.qcow2"):
        refused(imgcopy.open, os.path.join(d, name), words="loop")
        with pytest.raises(imgcopy.ImageFormatError):
            imgcopy.map(os.path.join(d, name))


def test_backing_self_loop(tmp_path):
    d = str(tmp_path)
    qcow2_images.create("a.qcow2", 1 * MiB, cwd=d)
    qemu_img("rebase", "-u", "-b", "a.qcow2", "-F", "qcow2", "a.qcow2", cwd=d)
    with pytest.raises(imgcopy.ImageFormatError):
        imgcopy.open(os.path.join(d, "a.qcow2"))


def test_missing_backing_file(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    qemu_img("create", "-q", "-f", "qcow2", "-u", "-b", "gone.qcow2", "-F", "qcow2",
                      str(d / "top.qcow2"), "1M")
    with pytest.raises(FileNotFoundError) as ei:
        imgcopy.open(str(d / "top.qcow2"))
    want = os.path.join(str(d), "gone.qcow2")
    assert ei.value.filename == want or want in str(ei.value), (ei.value, ei.value.filename)


def test_missing_backing_in_deeper_link(qcow2_all, tmp_path):
    """A chain whose second link is missing: the missing path is named."""
    src = qcow2_all.get("tree-over")
    root = tmp_path / "t"
    shutil.copytree(os.path.dirname(os.path.dirname(src.path)), root)
    os.unlink(root / "base.qcow2")
    with pytest.raises(FileNotFoundError) as ei:
        imgcopy.open(str(root / "deeper" / "over.qcow2"))
    assert "base.qcow2" in (ei.value.filename or str(ei.value))
