"""Compressed qcow2, both compression types (zlib: deflate, written by
libdeflate where the build has it; zstd), checked against qemu: every image
imgcopy compresses passes qemu-img check and converts back to its source
through qemu-img; every image qemu-img compresses reads as qemu reads it;
sizes are no larger than qemu-img convert -c's; a corrupt compressed
cluster is an ImageFormatError, as it is an error for qemu."""
import os
import random
import struct
import subprocess
import sys

import pytest

import imgcopy

from .build_features import HAVE_ZSTD, LIBRARIES
from .oracles import needs_qemu, qemu_img, qemu_info, require_qemu, verify_qcow2
from .units import KiB, MiB

pytestmark = needs_qemu

TYPES = ["zlib", pytest.param("zstd", marks=pytest.mark.skipif(
    not HAVE_ZSTD, reason="imgcopy built without libzstd"))]


def _vocabulary(n=3000, seed=5):
    """Words with the letter frequencies of English, drawn with Zipf's law
    below: text that compresses as prose does (a handful of words repeated
    is far more compressible than any real text)."""
    rng = random.Random(seed)
    letters = "etaoinshrdlucmfwypvbgkjqxz"
    return ["".join(rng.choice(letters[:rng.randint(8, 26)])
                    for _ in range(rng.randint(1, 10))) for _ in range(n)]


VOCABULARY = _vocabulary()
ZIPF = [1 / (rank + 1) for rank in range(len(VOCABULARY))]


def text_like(rng: random.Random, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        out += (" ".join(rng.choices(VOCABULARY, ZIPF, k=200)) + ".\n").encode()
    return bytes(out[:n])


def make_source(path, size, seed=1) -> str:
    """A raw image of text-like runs, random (incompressible) runs, zeros
    written as data, and holes; `size` need not be a cluster multiple."""
    rng = random.Random(seed)
    with open(path, "wb") as f:
        f.truncate(size)
        off = 0
        while off < size:
            n = min(rng.choice([3 * KiB, 64 * KiB, 200 * KiB, 700 * KiB]), size - off)
            kind = rng.choice(["text", "text", "random", "zeros", "hole"])
            if kind != "hole":
                f.seek(off)
                f.write(text_like(rng, n) if kind == "text" else
                        rng.randbytes(n) if kind == "random" else bytes(n))
            off += n
    return str(path)


def convert(src, dst, **kw):
    if os.path.exists(dst):
        os.unlink(dst)
    return imgcopy.convert(src, str(dst), dst_format="qcow2", compress=True, **kw)


def compressed_clusters(path) -> int:
    p = qemu_img("check", "--output=json", str(path))
    import json
    return json.loads(p.stdout).get("compressed-clusters", 0)


def compression_type_of(path) -> str:
    return qemu_info(str(path))["format-specific"]["data"]["compression-type"]


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    d = tmp_path_factory.mktemp("compress-src")
    size = 5 * MiB + 1536
    return make_source(d / "src.raw", size), size


# -- what imgcopy writes, qemu reads --------------------------------------

LEVELS = {"zlib": [None, 1, 9, 12], "zstd": [None, 1, 19]}


@pytest.mark.parametrize("ctype", TYPES)
@pytest.mark.parametrize("cluster_size", [512, 4 * KiB, 64 * KiB, 2 * MiB],
                         ids=["512", "4k", "64k", "2M"])
def test_qemu_reads_what_imgcopy_compresses(source, tmp_path, ctype, cluster_size):
    src, size = source
    # every level of the type meets some cluster size
    levels = LEVELS[ctype]
    level = levels[[512, 4 * KiB, 64 * KiB, 2 * MiB].index(cluster_size) % len(levels)]
    if ctype == "zlib" and level and level > 9 and not LIBRARIES["zlib"].startswith("libdeflate"):
        level = 9
    dst = tmp_path / "c.qcow2"
    convert(src, dst, cluster_size=cluster_size, compression_type=ctype,
            compression_level=level)
    verify_qcow2(src, str(dst), virtual_size=size, cluster_size=cluster_size,
                 tmpdir=str(tmp_path), compressed=True)
    assert compression_type_of(dst) == ctype
    assert compressed_clusters(dst) > 0
    with imgcopy.open(str(dst)) as img, open(src, "rb") as f:
        assert img.read(0, size) == f.read()


@pytest.mark.parametrize("ctype", TYPES)
@pytest.mark.parametrize("cluster_size", [512, 4 * KiB, 64 * KiB, 2 * MiB],
                         ids=["512", "4k", "64k", "2M"])
def test_imgcopy_reads_what_qemu_compresses(source, tmp_path, ctype, cluster_size):
    src, size = source
    q = str(tmp_path / "q.qcow2")
    qemu_img("convert", "-f", "raw", "-O", "qcow2", "-c", "-o",
             "compression_type=%s,cluster_size=%d" % (ctype, cluster_size), src, q)
    assert compressed_clusters(q) > 0
    back = str(tmp_path / "back.raw")
    imgcopy.convert(q, back)
    with open(back, "rb") as a, open(src, "rb") as b:
        # qemu rounds the qcow2's size up to whole sectors
        assert a.read()[:size] == b.read()
    assert imgcopy.info(q).format_specific["data"]["compression-type"] == ctype


@pytest.mark.parametrize("ctype", TYPES)
def test_no_larger_than_qemu(tmp_path, ctype):
    """The default level compresses text-like data (the case where levels
    differ most) no worse than qemu-img convert -c: zlib's output is
    smaller than qemu's, zstd's the same to 0.5% (the same library and
    level).  A third of the clusters are incompressible, stored whole
    between compressed ones: compressed clusters go on filling the host
    cluster the last one left partly free, as qemu packs them."""
    rng = random.Random(7)
    src = str(tmp_path / "text.raw")
    with open(src, "wb") as f:
        for _ in range(128):
            f.write(rng.randbytes(64 * KiB) if rng.random() < 0.33 else
                    text_like(rng, 64 * KiB))
    q = str(tmp_path / "q.qcow2")
    qemu_img("convert", "-f", "raw", "-O", "qcow2", "-c", "-o", "compression_type=" + ctype,
             src, q)
    mine = tmp_path / "m.qcow2"
    convert(src, mine, compression_type=ctype)
    limit = 1.0 if ctype == "zlib" else 1.005
    assert os.path.getsize(mine) <= os.path.getsize(q) * limit, \
        (os.path.getsize(mine), os.path.getsize(q))
    qemu_img("compare", "-f", "raw", "-F", "qcow2", src, str(mine))


def test_compression_level_trades_size(tmp_path):
    """Levels are passed through: the highest compresses text smaller than
    the lowest."""
    rng = random.Random(3)
    src = str(tmp_path / "text.raw")
    with open(src, "wb") as f:
        f.write(text_like(rng, 2 * MiB))
    sizes = {}
    for level in (1, 9):
        dst = tmp_path / ("l%d.qcow2" % level)
        convert(src, dst, compression_level=level)
        sizes[level] = os.path.getsize(dst)
    assert sizes[9] < sizes[1], sizes


# -- corrupt compressed clusters ------------------------------------------

def first_compressed_cluster(path):
    """(host offset, length) of guest cluster 0's compressed data, from the
    header, L1 and L2 tables."""
    with open(path, "rb") as f:
        head = f.read(104)
        cluster_bits = struct.unpack(">I", head[20:24])[0]
        l1_offset = struct.unpack(">Q", head[40:48])[0]
        f.seek(l1_offset)
        l2_offset = struct.unpack(">Q", f.read(8))[0] & 0x00fffffffffffe00
        f.seek(l2_offset)
        entry = struct.unpack(">Q", f.read(8))[0]
    assert entry >> 62 & 1, "cluster 0 is compressed"
    bits = 62 - (cluster_bits - 8)
    host = entry & ((1 << bits) - 1)
    sectors = ((entry & ((1 << 62) - 1)) >> bits) + 1
    return host, sectors * 512 - (host & 511)


@pytest.mark.parametrize("ctype", TYPES)
@pytest.mark.parametrize("damage", ["zeros", "flipped", "truncated"])
def test_corrupt_cluster_reads_as_qemu_reads_it(tmp_path, ctype, damage):
    require_qemu()
    rng = random.Random(11)
    src = str(tmp_path / "src.raw")
    with open(src, "wb") as f:
        f.write(text_like(rng, 256 * KiB))
    q = str(tmp_path / "q.qcow2")
    qemu_img("convert", "-f", "raw", "-O", "qcow2", "-c", "-o", "compression_type=" + ctype,
             src, q)
    host, length = first_compressed_cluster(q)
    # the next cluster's data may begin in the last sector: leave it be
    length -= 512
    with open(q, "r+b") as f:
        if damage == "zeros":
            f.seek(host)
            f.write(bytes(length))
        elif damage == "flipped":
            f.seek(host + length // 3)
            b = f.read(16)
            f.seek(host + length // 3)
            f.write(bytes(x ^ 0xa5 for x in b))
        else:  # the second half of the data gone
            f.seek(host + length // 2)
            f.write(bytes(length - length // 2))
    # qemu is the oracle: deflate has no checksum, and damage it does not
    # notice must read as qemu reads it
    p = qemu_img("convert", "-O", "raw", q, str(tmp_path / "qemu.raw"), check=False)
    if p.returncode == 0:
        assert damage == "flipped", "qemu reads %s data" % damage
        imgcopy.convert(q, str(tmp_path / "out.raw"))
        with open(tmp_path / "out.raw", "rb") as a, open(tmp_path / "qemu.raw", "rb") as b:
            assert a.read() == b.read()
        return
    with pytest.raises(imgcopy.ImageFormatError, match="compressed cluster"):
        imgcopy.convert(q, str(tmp_path / "out.raw"))
    with imgcopy.open(q) as img:
        with pytest.raises(imgcopy.ImageFormatError):
            img.read(0, 64 * KiB)
        # the clusters after it still read
        with open(src, "rb") as f:
            f.seek(64 * KiB)
            assert img.read(64 * KiB, 64 * KiB) == f.read(64 * KiB)


# -- options ---------------------------------------------------------------

@pytest.mark.parametrize("kw,words", [
    (dict(compress=True, compression_type="lz4"), "compression_type must be"),
    (dict(compress=True, compression_level=0), "positive integer"),
    (dict(compress=True, compression_level=-3), "positive integer"),
    (dict(compress=True, compression_level=True), "positive integer"),
    (dict(compress=True, compression_level="5"), "positive integer"),
    (dict(compress=True, compression_level=99), "compression_level must be from 1 to"),
    (dict(compression_level=5), "without compress"),
])
def test_bad_options(kw, words):
    with pytest.raises(ValueError, match=words):
        imgcopy.Qcow2Options(**kw)


@pytest.mark.skipif(not HAVE_ZSTD, reason="imgcopy built without libzstd")
def test_zstd_options():
    with pytest.raises(ValueError, match="compat 1.1"):
        imgcopy.Qcow2Options(compression_type="zstd", compat="0.10")
    with pytest.raises(ValueError, match="from 1 to 19"):
        imgcopy.Qcow2Options(compress=True, compression_type="zstd", compression_level=20)
    imgcopy.Qcow2Options(compress=True, compression_type="zstd", compression_level=19)


@pytest.mark.skipif(HAVE_ZSTD, reason="imgcopy built with libzstd")
def test_zstd_refused_without_libzstd():
    with pytest.raises(ValueError, match="libzstd"):
        imgcopy.Qcow2Options(compression_type="zstd")


@pytest.mark.skipif(not HAVE_ZSTD, reason="imgcopy built without libzstd")
def test_zstd_header_without_compressing(tmp_path):
    """compression_type=zstd without -c makes a zstd image qemu writes
    compressed clusters into, as qemu-img create -o compression_type=zstd."""
    src = make_source(tmp_path / "s.raw", 1 * MiB)
    dst = str(tmp_path / "z.qcow2")
    imgcopy.convert(src, dst, dst_format="qcow2", compression_type="zstd")
    assert compression_type_of(dst) == "zstd"
    verify_qcow2(src, dst, virtual_size=1 * MiB)
    assert compressed_clusters(dst) == 0


def test_libraries_named():
    libs = imgcopy.compression_libraries()
    assert set(libs) == {"zlib", "zstd"}
    assert libs["zlib"].split()[0] in ("libdeflate", "zlib")
    assert (libs["zstd"] is None) == (not HAVE_ZSTD)


@pytest.mark.parametrize("ctype", TYPES)
def test_cli(source, tmp_path, ctype):
    src, size = source
    dst = str(tmp_path / "cli.qcow2")
    p = subprocess.run([sys.executable, "-m", "imgcopy", "convert", "-O", "qcow2", "-c", "-o",
                        "compression_type=%s,compression_level=2" % ctype, src, dst],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert compression_type_of(dst) == ctype
    verify_qcow2(src, dst, virtual_size=size, tmpdir=str(tmp_path), compressed=True)


def test_cli_bad_level(source, tmp_path):
    src, _ = source
    p = subprocess.run([sys.executable, "-m", "imgcopy", "convert", "-O", "qcow2", "-c", "-o",
                        "compression_level=high", src, str(tmp_path / "x.qcow2")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "compression_level" in p.stderr, p.stderr
    assert not os.path.exists(tmp_path / "x.qcow2")


def test_existing_destination_keeps_its_layout(source, tmp_path):
    """-n -c is refused, not ignored: the existing image is not written."""
    src, size = source
    dst = str(tmp_path / "existing.qcow2")
    qemu_img("create", "-f", "qcow2", dst, str(size))
    before = open(dst, "rb").read()
    with pytest.raises(ValueError, match="compress lays out a new image"):
        imgcopy.convert(src, dst, dst_format="qcow2", create=False, compress=True)
    with pytest.raises(ValueError, match="compression_type"):
        imgcopy.convert(src, dst, dst_format="qcow2", create=False, compression_type="zstd")
    assert open(dst, "rb").read() == before


# --------------------------------------------------------------------------
# built without the optional libraries: zlib alone, zstd refused clearly

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_WITHOUT_LIBRARIES_CHECK = r"""
import os, subprocess, sys
import imgcopy
from imgcopy.errors import ImageFormatError
src, zstd_image, out = sys.argv[1:4]
libs = imgcopy.compression_libraries()
assert libs["zlib"].startswith("zlib ") and libs["zstd"] is None, libs
try:
    imgcopy.convert(src, out, dst_format="qcow2", compress=True, compression_type="zstd")
except ValueError as e:
    assert "libzstd" in str(e), e
else:
    raise AssertionError("zstd compression without libzstd was accepted")
assert not os.path.exists(out)
try:
    imgcopy.map(zstd_image)
except ImageFormatError as e:
    assert "zstd" in str(e) and "libzstd" in str(e) and e.filename == zstd_image, e
else:
    raise AssertionError("a zstd image opened without libzstd")
imgcopy.convert(src, out, dst_format="qcow2", compress=True)
print("ok")
"""


@needs_qemu
def test_built_without_optional_libraries(tmp_path, source):
    source, size = source
    """The extension built with IMGCOPY_WITHOUT=libdeflate,zstd: deflate by
    zlib (qemu checks and compares its output), zstd refused by name."""
    build = tmp_path / "build"
    env = dict(os.environ, IMGCOPY_WITHOUT="libdeflate,zstd")
    env.pop("IMGCOPY_REQUIRE", None)  # a build that lacks them on purpose
    p = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--build-lib",
                        str(build / "lib"), "--build-temp", str(build / "tmp")],
                       cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:]
    package = build / "lib" / "imgcopy"
    for name in os.listdir(os.path.join(REPO, "imgcopy")):
        if name.endswith((".py", ".pyi", ".typed")):
            (package / name).write_bytes(open(os.path.join(REPO, "imgcopy", name), "rb").read())
    zstd_image = str(tmp_path / "z.qcow2")
    qemu_img("create", "-q", "-f", "qcow2", "-o", "compression_type=zstd", zstd_image, "1M")
    out = str(tmp_path / "out.qcow2")
    env = dict(os.environ, PYTHONPATH=str(build / "lib"))
    p = subprocess.run([sys.executable, "-c", _WITHOUT_LIBRARIES_CHECK, source, zstd_image, out],
                       cwd=str(tmp_path), env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=300)
    assert p.returncode == 0 and p.stdout == "ok\n", p.stderr[-3000:]
    verify_qcow2(source, out, virtual_size=size, tmpdir=str(tmp_path), compressed=True)
    assert compressed_clusters(out) > 0
