"""Creating qcow2 images: imgcopy.convert(..., dst_format="qcow2") and
``imgcopy convert -O qcow2``, with qemu-img as the oracle (issue 5).

Every image imgcopy writes must pass ``qemu-img check`` (no leaks,
corruptions or OFLAG_COPIED errors), compare identical to its source, show
the right virtual size / cluster size / compat in ``qemu-img info`` and
convert back to raw identically.  Its ``qemu-img map`` must equal that of
``qemu-img convert -O qcow2 -S N`` of the same source (start, length, depth,
present, zero, data; not offsets), and with compression that of
``qemu-img convert -c`` cluster by cluster.  Data clusters land in guest
order whatever the thread count (``qemu-img check``: 0.00% fragmented), and a
copy that fails never leaves an image that looks complete.

Sources are small and shared: the make_corpus.py image sparse-6g.raw at
scale 1/16 (session), seeded raw images from tests/gen/raw_kinds.py (extended
to a 512-byte multiple, the size qemu gives them, except in the odd-size test),
qcow2 images from tests/gen/qcow2_images.py (compressed clusters, backing chains,
snapshots, metadata preallocation) and a few layouts built here.
"""

import errno
import json
import os
import subprocess

import pytest

import imgcopy

from .convert_helpers import imgcopy_cmd
from .gen import qcow2_images, raw_kinds
from .gen.qcow2_meta import qemu_thinks_preallocated, read_header, read_tables
from .gen.raw_layouts import dense, many_extents, partial_clusters
from .gen.sparse import make_sparse, pad_to_sector, padded_size
from .oracles import (assert_same_content, cluster_layout, diff_layouts, host_order_violations,
                      layout, needs_qemu_img, qemu_check, qemu_img, qemu_info, qemu_io, qemu_map,
                      verify_qcow2)
from .units import KiB, MiB

pytestmark = needs_qemu_img

INCOMPAT_DIRTY = 1
INCOMPAT_CORRUPT = 2


# --------------------------------------------------------------------------
# shared sources and qemu's reference conversions

class Sources:
    """Read-only sources built once per module, plus memoized
    ``qemu-img convert`` reference images and their maps."""

    def __init__(self, root):
        self.root = str(root)
        self._paths = {}
        self._refs = {}
        self._maps = {}

    def path(self, name):
        return os.path.join(self.root, name)

    def seeded(self, kind, seed, pad=True):
        """A tests/gen/raw_kinds.py image; pad=True extends it to 512 bytes."""
        key = ("seeded", kind, seed, pad)
        if key not in self._paths:
            p = self.path("%s-%d%s.raw" % (kind, seed, "-pad" if pad else ""))
            size = raw_kinds.make_image(p, kind, seed)
            if pad:
                size = pad_to_sector(p)
            self._paths[key] = (p, size)
        return self._paths[key]

    def built(self, name, builder, **kw):
        key = ("built", name)
        if key not in self._paths:
            p = self.path(name + ".raw")
            self._paths[key] = (p, builder(p, **kw))
        return self._paths[key]

    def reference(self, src, *qemu_args, src_fmt="raw"):
        """``qemu-img convert -t unsafe -f SRC_FMT -O qcow2 ARGS src ref``
        (memoized; -t unsafe: no flush, same image)."""
        key = (src, src_fmt) + tuple(qemu_args)
        if key not in self._refs:
            p = self.path("ref-%d.qcow2" % len(self._refs))
            qemu_img(*(["convert", "-t", "unsafe", "-f", src_fmt, "-O", "qcow2"] +
                       list(qemu_args) + [src, p]))
            self._refs[key] = p
        return self._refs[key]

    def map_of(self, path, fmt="qcow2"):
        if path not in self._maps:
            self._maps[path] = qemu_map(path, fmt).extents
        return self._maps[path]


@pytest.fixture(scope="module")
def srcs(tmp_path_factory):
    return Sources(tmp_path_factory.mktemp("qcow2w-src"))


@pytest.fixture
def out(tmp_path):
    """Where a test's outputs go (removed with tmp_path)."""
    return tmp_path


def convert_qcow2(src, dst, **kw):
    dst = str(dst)
    if os.path.exists(dst):
        os.unlink(dst)
    r = imgcopy.convert(src, dst, dst_format="qcow2", **kw)
    d = r.to_dict()
    size = imgcopy.open(src).size
    assert d["bytes_written"] + d["bytes_zeroed"] + d["bytes_skipped"] == size, d
    return r


def cs_of(kw):
    return kw.get("cluster_size") or 64 * KiB


def assert_same_layout(mine, ref, end=None):
    """qemu-img map of both images equal on start/length/depth/present/
    zero/data (up to `end`, when given)."""
    a, b = layout(qemu_map(mine, "qcow2").extents), layout(qemu_map(ref, "qcow2").extents)
    if end is not None:
        a, b = clip_layout(a, end), clip_layout(b, end)
    assert a == b, "qemu-img map of %s (imgcopy) != %s (qemu-img):\n%s" % (
        mine, ref, diff_layouts(a, b))


def clip_layout(entries, end):
    return [(s, min(l, end - s)) + tuple(rest) for (s, l, *rest) in entries if s < end]


def assert_same_cluster_layout(mine, ref, cluster_size, size):
    a = cluster_layout(qemu_map(mine, "qcow2").extents, cluster_size, size)
    b = cluster_layout(qemu_map(ref, "qcow2").extents, cluster_size, size)
    bad = [(i, x, y) for i, (x, y) in enumerate(zip(a, b)) if x != y]
    assert not bad and len(a) == len(b), "clusters differ (index, imgcopy, qemu): %r" % bad[:5]


# --------------------------------------------------------------------------
# 1. every image imgcopy writes passes qemu-img check / compare / info

RAW_IMAGES = [("holes_and_data", 3), ("alloc_zeros", 5), ("small_extents", 2),
              ("unaligned", 7), ("all_data", 9), ("last_byte", 4), ("tiny", 6),
              ("all_hole", 3), ("empty", 0), ("first_byte", 1), ("big_sparse", 1)]

OPTION_SETS = [
    dict(),
    dict(cluster_size=512, compat="0.10"),
    dict(cluster_size=4 * KiB, compress=True),
    dict(cluster_size=2 * MiB, compat="0.10", compress=True),
    dict(cluster_size=4 * KiB, preallocation="metadata", concurrency=16, request_size=64 * KiB),
    dict(compat="0.10", preallocation="metadata", sparse_threshold=0),
    dict(cluster_size=512, compress=True, concurrency=1, out_of_order=False),
    dict(cluster_size=2 * MiB, sparse_threshold=64 * KiB, concurrency=8, flush=False),
    dict(cluster_size=64 * KiB, compress=True, compat="0.10", request_size=64 * KiB),
]


def _opt_id(kw):
    short = {"cluster_size": "c", "compat": "v", "compress": "z", "preallocation": "P",
             "concurrency": "m", "request_size": "r", "out_of_order": "W",
             "sparse_threshold": "S", "flush": "F"}
    parts = []
    for k, v in kw.items():
        if k in ("cluster_size", "request_size", "sparse_threshold"):
            v = "%dk" % (v // KiB) if v >= KiB else str(v)
        elif isinstance(v, bool):
            v = int(v)
        elif k == "preallocation":
            v = v[:4]
        parts.append("%s%s" % (short[k], v))
    return "-".join(parts) or "default"


# each image meets two option sets (rotating), every option set meets >= 2 images
RAW_CASES = [(img, OPTION_SETS[(i + j * 3) % len(OPTION_SETS)])
             for i, img in enumerate(RAW_IMAGES) for j in range(2)]


@pytest.mark.parametrize("image,kw", RAW_CASES,
                         ids=["%s-%s" % (i[0], _opt_id(k)) for i, k in RAW_CASES])
def test_raw_source_verifies(srcs, out, image, kw):
    src, size = srcs.seeded(*image)
    dst = out / "o.qcow2"
    convert_qcow2(src, dst, **kw)
    verify_qcow2(src, dst, virtual_size=size, cluster_size=cs_of(kw),
                 compat=kw.get("compat", "1.1"), tmpdir=out, roundtrip=True,
                 compressed=kw.get("compress", False))
    with imgcopy.open(str(dst)) as img:
        assert (img.format, img.size) == ("qcow2", size)


QCOW2_SOURCES = ["uni-c512-v2", "uni-c65536-v3", "uni-c2097152-v3", "convc-64k", "convc-4k",
                 "chain-top", "chain-small", "tree-over", "odd-64k", "odd-64k-tail",
                 "snapshot", "prealloc-metadata-written", "prealloc-metadata-4k-v2-written"]
QCOW2_CASES = [(n, OPTION_SETS[(i * 2 + j) % len(OPTION_SETS)])
               for i, n in enumerate(QCOW2_SOURCES) for j in range(2)]


@pytest.mark.parametrize("name,kw", QCOW2_CASES,
                         ids=["%s-%s" % (n, _opt_id(k)) for n, k in QCOW2_CASES])
def test_qcow2_source_verifies(qcow2_store, out, name, kw):
    """qcow2 sources (compressed clusters, backing chains, snapshots,
    metadata preallocation) become standalone images with the same content."""
    b = qcow2_store.get(name)
    dst = out / "o.qcow2"
    convert_qcow2(b.path, dst, **kw)
    verify_qcow2(b.path, dst, virtual_size=b.size, cluster_size=cs_of(kw),
                 compat=kw.get("compat", "1.1"), src_fmt="qcow2", tmpdir=out,
                 compressed=kw.get("compress", False))


def test_petabyte_source(qcow2_store, out):
    """A 1 PiB qcow2 source with one 64 KiB cluster at 500 TiB: a 16 MiB L1
    table, one L2 table (qemu-img compare would take 30 s: the data is
    checked with qemu-io and the map around it)."""
    b = qcow2_store.get("petabyte")
    dst = out / "o.qcow2"
    convert_qcow2(b.path, dst)
    info = qemu_info(str(dst), force_share=True)
    assert info["virtual-size"] == b.size == 1 << 50, info
    qemu_check(str(dst), "qcow2", strict=True)
    off = qcow2_images.PB_DATA_OFFSET
    window = ["--start-offset", str(off - MiB), "--max-length", str(3 * MiB)]
    mine = json.loads(qemu_img(*(["map", "--output=json"] + window + [str(dst)])).stdout)
    theirs = json.loads(qemu_img(*(["map", "--output=json"] + window + [b.path])).stdout)
    assert layout(mine) == layout(theirs)
    # (qemu_io fails on a "Pattern verification failed")
    qemu_io(str(dst), ["read -P 0x77 %d 64k" % off, "read -P 0 %d 64k" % (off + 64 * KiB)],
            fmt="qcow2")
    assert os.path.getsize(dst) < 32 * MiB


# --------------------------------------------------------------------------
# 2. layout equals qemu-img convert -S N

MAP_IMAGES = [("holes_and_data", 3), ("holes_and_data", 8), ("alloc_zeros", 5),
              ("small_extents", 2), ("unaligned", 7), ("first_byte", 1), ("last_byte", 4)]


@pytest.mark.parametrize("sparse", [4 * KiB, 64 * KiB], ids=["S4k", "S64k"])
@pytest.mark.parametrize("image", MAP_IMAGES, ids=["%s-%d" % i for i in MAP_IMAGES])
def test_map_equals_qemu_seeded(srcs, out, image, sparse):
    src, size = srcs.seeded(*image)
    dst = out / "o.qcow2"
    convert_qcow2(src, dst, sparse_threshold=sparse)
    ref = srcs.reference(src, "-S", str(sparse))
    # first the clusters themselves: a fully allocated copy of the file
    # hides the host file's holes from qemu (see test_not_taken_for_...)
    full = out / "full.qcow2"
    subprocess.run(["cp", "--sparse=never", str(dst), str(full)], check=True)
    assert_same_layout(full, ref)
    # then qemu-img map of the image itself
    assert_same_layout(dst, ref)


CORPUS_MAP_OPTS = [
    dict(sparse_threshold=4 * KiB),
    dict(sparse_threshold=64 * KiB),
    dict(sparse_threshold=4 * KiB, concurrency=16, request_size=64 * KiB, out_of_order=True),
    dict(sparse_threshold=64 * KiB, concurrency=1, out_of_order=False, request_size=1 * MiB),
]


@pytest.mark.parametrize("kw", CORPUS_MAP_OPTS, ids=[_opt_id(k) for k in CORPUS_MAP_OPTS])
def test_map_equals_qemu_corpus(srcs, corpus_raw, out, kw):
    src, size = corpus_raw
    dst = out / "o.qcow2"
    convert_qcow2(src, dst, **kw)
    c = verify_qcow2(src, dst, virtual_size=size)
    assert c.fragmented == 0.0, c.text
    assert_same_layout(dst, srcs.reference(src, "-S", str(kw["sparse_threshold"])))


@pytest.fixture(scope="module")
def corpus_slice(corpus_raw, srcs):
    """The first 96 MiB of the corpus image (a quarter: ~20 MiB of data),
    for the compressed comparison (deflating the whole corpus twice, here
    and by qemu-img -c, takes ~10 s on 2 cores)."""
    src, size = corpus_raw
    p = srcs.path("corpus-slice.raw")
    subprocess.run(["cp", "--sparse=always", src, p], check=True)
    os.truncate(p, 96 * MiB)
    return p, 96 * MiB


def test_compressed_layout_equals_qemu_corpus(srcs, corpus_slice, out):
    src, size = corpus_slice
    dst = out / "o.qcow2"
    convert_qcow2(src, dst, compress=True, concurrency=2)
    verify_qcow2(src, dst, virtual_size=size, compressed=True)
    ref = srcs.reference(src, "-c")
    assert_same_cluster_layout(dst, ref, 64 * KiB, size)
    # compressed clusters are reported as data without a host offset, as qemu's
    assert any(d["data"] and "offset" not in d for d in qemu_map(str(dst), "qcow2").extents)
    # and the image is about as small as qemu's
    assert os.path.getsize(dst) <= os.path.getsize(ref) * 1.05 + 1 * MiB


@pytest.mark.parametrize("cluster_size", [4 * KiB, 64 * KiB], ids=["c4k", "c64k"])
@pytest.mark.parametrize("image", [("holes_and_data", 3), ("alloc_zeros", 5), ("all_data", 9),
                                   ("unaligned", 7)], ids=lambda i: "%s-%d" % i)
def test_compressed_layout_equals_qemu_seeded(srcs, out, image, cluster_size):
    src, size = srcs.seeded(*image)
    dst = out / "o.qcow2"
    convert_qcow2(src, dst, compress=True, cluster_size=cluster_size)
    ref = srcs.reference(src, "-c", "-o", "cluster_size=%d" % cluster_size)
    assert_same_cluster_layout(dst, ref, cluster_size, size)


def test_not_taken_for_metadata_preallocated(srcs, out):
    """The host file's allocation matches the refcounts, so qemu's
    metadata-preallocation heuristic (qcow2_detect_metadata_preallocation:
    refcounted clusters >= max(allocated*10/9, allocated+2)) does not fire:
    if it did, qemu-img map would report the unwritten tail of each partly
    written cluster as zero, unlike qemu's own conversion."""
    src = srcs.path("two-runs.raw")
    make_sparse(src, 1 * MiB, [(1000, b"\x51" * 70000), (512 * KiB, b"\x52" * (88 * KiB))])
    dst = out / "o.qcow2"
    convert_qcow2(src, dst)
    ref = srcs.reference(src, "-S", "4096")
    assert not qemu_thinks_preallocated(ref)
    assert not qemu_thinks_preallocated(str(dst)), (
        "st_blocks=%d, tables=%r" % (os.stat(dst).st_blocks, read_tables(str(dst))))
    assert_same_layout(dst, ref)


# --------------------------------------------------------------------------
# 3. host clusters in guest order

@pytest.mark.parametrize("request_size", [64 * KiB, 2 * MiB], ids=["r64k", "r2M"])
@pytest.mark.parametrize("concurrency", [1, 4, 16])
def test_guest_order_corpus(corpus_raw, out, concurrency, request_size):
    src, size = corpus_raw
    dst = out / "o.qcow2"
    convert_qcow2(src, dst, concurrency=concurrency, request_size=request_size,
                  out_of_order=True, flush=concurrency == 4)
    c = qemu_check(str(dst), "qcow2", strict=True)
    assert "0.00% fragmented" in c.text, c.text
    bad = host_order_violations(qemu_map(str(dst), "qcow2").extents)
    assert not bad, bad[:3]


# --------------------------------------------------------------------------
# 4. cluster sizes, compat levels, compression, preallocation

@pytest.mark.parametrize("compress", [False, True], ids=["plain", "comp"])
@pytest.mark.parametrize("compat", ["0.10", "1.1"])
@pytest.mark.parametrize("cluster_size", [512, 4 * KiB, 64 * KiB, 2 * MiB],
                         ids=["c512", "c4k", "c64k", "c2M"])
def test_cluster_size_compat(srcs, out, cluster_size, compat, compress):
    src, size = srcs.seeded("holes_and_data", 3)
    dst = out / "o.qcow2"
    convert_qcow2(src, dst, cluster_size=cluster_size, compat=compat, compress=compress)
    c = verify_qcow2(src, dst, virtual_size=size, cluster_size=cluster_size, compat=compat,
                     compressed=compress)
    h = read_header(str(dst))
    assert h.version == (2 if compat == "0.10" else 3)
    assert h.incompatible == 0, h
    assert h.cluster_size == cluster_size
    if not compress:
        assert c.fragmented == 0.0, c.text
        assert not host_order_violations(qemu_map(str(dst), "qcow2").extents)
    else:
        assert_same_cluster_layout(
            dst, srcs.reference(src, "-c", "-o", "cluster_size=%d,compat=%s" % (cluster_size,
                                                                                 compat)),
            cluster_size, size)


@pytest.mark.parametrize("compat", ["0.10", "1.1"])
def test_preallocation_metadata_seeded(srcs, out, compat):
    src, size = srcs.seeded("holes_and_data", 8)
    dst = out / "o.qcow2"
    convert_qcow2(src, dst, preallocation="metadata", compat=compat)
    verify_qcow2(src, dst, virtual_size=size, compat=compat, tmpdir=out, roundtrip=True)
    ref = srcs.reference(src, "-o", "preallocation=metadata,compat=%s" % compat)
    # qemu's own preallocated image ends its host file with the last guest
    # cluster, and qemu-img map reports the partial cluster's tail there as
    # data where it lies over a host hole inside the file: compare whole
    # clusters only (the corpus test below compares everything)
    assert_same_layout(dst, ref, end=size // (64 * KiB) * (64 * KiB))
    # every cluster is allocated (present), none of them unallocated
    assert all(d["present"] for d in qemu_map(str(dst), "qcow2").extents)


def test_preallocation_metadata_corpus(srcs, corpus_raw, out):
    src, size = corpus_raw
    dst = out / "o.qcow2"
    convert_qcow2(src, dst, preallocation="metadata")
    verify_qcow2(src, dst, virtual_size=size)
    info = qemu_info(str(dst), force_share=True)
    data_bytes = sum(d["length"] for d in srcs.map_of(src, "raw") if d["data"])
    # sparse: about the source's data, not the virtual size
    assert info["actual-size"] < size // 3, info
    assert info["actual-size"] <= data_bytes + 4 * MiB, (info, data_bytes)
    assert_same_layout(dst, srcs.reference(src, "-o", "preallocation=metadata"))


# --------------------------------------------------------------------------
# 5. images with many refcount blocks and L2 tables

def test_many_tables_512(srcs, out):
    """512-byte clusters: a refcount block covers 256 clusters (128 KiB), an
    L2 table 64 clusters (32 KiB); thousands of extents need dozens of each
    (and a refcount table of several clusters)."""
    src, size = srcs.built("many512", many_extents, runs=2500)
    dst = out / "o.qcow2"
    convert_qcow2(src, dst, cluster_size=512, concurrency=8, flush=False)
    c = verify_qcow2(src, dst, virtual_size=size, cluster_size=512, tmpdir=out, roundtrip=True)
    assert c.fragmented == 0.0, c.text
    t = read_tables(str(dst))
    assert t.refcount_blocks >= 10, t
    assert t.header.rc_table_clusters >= 1
    assert t.l2_tables >= 100, t
    assert_same_layout(dst, srcs.reference(src, "-o", "cluster_size=512"))


def test_many_tables_4k_40m(srcs, out):
    """4 KiB clusters and ~40 MiB of data: several refcount blocks (8 MiB
    of host each) and L2 tables (2 MiB of guest each)."""
    src, size = srcs.built("dense", dense)
    dst = out / "o.qcow2"
    convert_qcow2(src, dst, cluster_size=4 * KiB)
    c = verify_qcow2(src, dst, virtual_size=size, cluster_size=4 * KiB)
    assert c.fragmented == 0.0, c.text
    t = read_tables(str(dst))
    assert t.refcount_blocks >= 4, t
    assert t.l2_tables >= 20, t
    assert_same_layout(dst, srcs.reference(src, "-o", "cluster_size=4096"))


# --------------------------------------------------------------------------
# 6. thousands of extents, many threads

@pytest.mark.parametrize("compress", [False, True], ids=["plain", "comp"])
@pytest.mark.parametrize("out_of_order", [True, False], ids=["W", "inorder"])
def test_many_extents_threads(srcs, out, out_of_order, compress):
    src, size = srcs.built("many", many_extents)
    dst = out / "o.qcow2"
    convert_qcow2(src, dst, concurrency=16, out_of_order=out_of_order, compress=compress,
                  request_size=64 * KiB, flush=False)
    c = verify_qcow2(src, dst, virtual_size=size, compressed=compress)
    if compress:
        assert_same_cluster_layout(dst, srcs.reference(src, "-c"), 64 * KiB, size)
    else:
        assert c.fragmented == 0.0, c.text
        assert not host_order_violations(qemu_map(str(dst), "qcow2").extents)
        assert_same_layout(dst, srcs.reference(src, "-S", "4096"))


ROUNDS = 5


@pytest.mark.parametrize("kw", [dict(sparse_threshold=0, concurrency=4),
                                dict(sparse_threshold=4096, concurrency=4),
                                dict(sparse_threshold=0, concurrency=16, request_size=64 * KiB)],
                         ids=["S0-m4", "S4k-m4", "S0-m16-r64k"])
def test_partial_clusters_repeated(srcs, out, kw):
    """Clusters written by several requests (data runs that start and end
    inside 64 KiB clusters), copied many times with threads: the content
    must come out right every time (no write may be lost to the zeroing of
    a freshly allocated cluster by another thread)."""
    src, size = srcs.built("partial", partial_clusters)
    failures = []
    for i in range(ROUNDS):
        dst = out / ("o%d.qcow2" % i)
        convert_qcow2(src, dst, flush=False, **kw)
        p = qemu_img("compare", "-f", "raw", "-F", "qcow2", src, dst, check=False)
        if p.returncode != 0:
            failures.append((i, p.stdout.strip()))
        os.unlink(dst)
    assert not failures, "%d of %d copies differ from the source: %r" % (
        len(failures), ROUNDS, failures)


# --------------------------------------------------------------------------
# 7. odd sizes: the virtual size is the source's, rounded up to 512 bytes

@pytest.mark.parametrize("image", [("tiny", 6), ("odd_size", 2), ("all_data", 9),
                                   ("unaligned", 7)], ids=lambda i: "%s-%d" % i)
def test_odd_size_source(srcs, out, image):
    """qemu reads a raw file of any size as round_up(size, 512) bytes (the
    tail reads as zeros) and qcow2 virtual sizes are sector multiples for
    qemu: an image that says 1000001 bytes is 999936 bytes to qemu, and its
    last bytes are lost."""
    src, size = srcs.seeded(*image, pad=False)
    assert size % 512
    dst = out / "o.qcow2"
    convert_qcow2(src, dst)
    info = qemu_info(str(dst), force_share=True)
    ref = srcs.reference(src)
    assert info["virtual-size"] == qemu_info(ref, force_share=True)["virtual-size"] \
        == padded_size(size), info
    assert_same_content(src, dst, "raw", "qcow2", force_share=True)


# --------------------------------------------------------------------------
# 8. a failed copy never looks complete

def assert_looks_incomplete(dst, compat):
    if not os.path.exists(dst) or os.path.getsize(dst) < 8:
        return
    with open(dst, "rb") as f:
        magic = f.read(4)
    p = qemu_img("info", "-U", "--output=json", dst, check=False)
    if compat == "0.10" or magic != b"QFI\xfb":
        # no magic: nobody takes it for a qcow2 image
        assert magic != b"QFI\xfb", "a v2 image that failed has its magic"
        assert p.returncode == 0 and json.loads(p.stdout)["format"] == "raw", p.stdout
        with imgcopy.open(dst) as img:
            assert img.format == "raw"
        with pytest.raises(imgcopy.ImageFormatError):
            imgcopy.open(dst, format="qcow2")
        return
    h = read_header(dst)
    assert h.incompatible & INCOMPAT_DIRTY and h.incompatible & INCOMPAT_CORRUPT, h
    if p.returncode == 0:
        # qemu opens it: then it must say corrupt
        info = json.loads(p.stdout)
        assert info["format"] != "qcow2" or \
            info["format-specific"]["data"].get("corrupt") is True, info
    else:
        assert "Could not open" in p.stderr, p.stderr
    assert qemu_img("check", dst, check=False).returncode != 0
    with pytest.raises(imgcopy.ImageFormatError):
        imgcopy.open(dst)
    with imgcopy.open(dst, force=True) as img:
        assert img.format == "qcow2"


@pytest.mark.parametrize("compress", [False, True], ids=["plain", "comp"])
@pytest.mark.parametrize("compat", ["1.1", "0.10"])
def test_failed_copy_eio(corpus_raw, out, compat, compress):
    """The source shrinks under the copy (truncated to 1 MiB from the first
    progress report, which comes after about a tenth of a second): reads
    past its new end fail with EIO."""
    base, size = corpus_raw
    src = str(out / "victim.raw")
    subprocess.run(["cp", "--sparse=always", base, src], check=True)
    cut = []

    def progress(done, total):
        if not cut and done < total:
            os.truncate(src, 1 * MiB)
            cut.append(done)

    dst = str(out / "o.qcow2")
    try:
        imgcopy.convert(src, dst, dst_format="qcow2", compat=compat, compress=compress,
                        concurrency=1, request_size=64 * KiB, progress=progress)
    except OSError as e:
        assert e.errno == errno.EIO, e
    else:
        if not cut:
            pytest.skip("the copy finished before its first progress report")
        pytest.fail("the copy succeeded although its source was truncated at %d" % cut[0])
    assert_looks_incomplete(dst, compat)


@pytest.mark.parametrize("compat", ["1.1", "0.10"])
def test_failed_copy_enospc(srcs, out, mount_tmpfs, compat):
    src, size = srcs.built("dense", dense)
    dst = os.path.join(str(mount_tmpfs(out / "mnt", "16m")), "o.qcow2")
    with pytest.raises(OSError) as ei:
        imgcopy.convert(src, dst, dst_format="qcow2", compat=compat, cluster_size=4 * KiB)
    assert ei.value.errno == errno.ENOSPC, ei.value
    assert_looks_incomplete(dst, compat)


def test_complete_image_is_clean(srcs, out):
    """...and a copy that succeeds clears the bits."""
    src, size = srcs.seeded("holes_and_data", 3)
    dst = out / "o.qcow2"
    convert_qcow2(src, dst)
    h = read_header(str(dst))
    assert h.incompatible == 0, h
    with imgcopy.open(str(dst)) as img:
        assert img.format == "qcow2"


# --------------------------------------------------------------------------
# 9. argument checking and the command line

@pytest.mark.parametrize("kw", [dict(cluster_size=3 * KiB), dict(cluster_size=256),
                                dict(cluster_size=4 * MiB), dict(compat="0.9"),
                                dict(preallocation="full"),
                                dict(preallocation="metadata", compress=True)],
                         ids=["c3k", "c256", "c4M", "v0.9", "Pfull", "Pmeta-z"])
def test_bad_creation_options_touch_nothing(srcs, out, kw):
    """Bad creation options are refused before the destination is touched:
    an existing file keeps its bytes, a missing one is not created.
    (qemu-img: "Compression and preallocation not supported at the same
    time".)"""
    src, size = srcs.seeded("holes_and_data", 3)
    keep = out / "keep.qcow2"
    keep.write_bytes(b"precious\n")
    with pytest.raises(ValueError):
        imgcopy.convert(src, str(keep), dst_format="qcow2", **kw)
    assert keep.read_bytes() == b"precious\n"
    missing = out / "missing.qcow2"
    with pytest.raises(ValueError):
        imgcopy.convert(src, str(missing), dst_format="qcow2", **kw)
    assert not missing.exists()


def run_cli(env, *args):
    return subprocess.run(imgcopy_cmd() + [str(a) for a in args], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, env=env)


def test_cli_equals_library(srcs, imgcopy_env, out):
    src, size = srcs.seeded("holes_and_data", 8)
    a = out / "cli.qcow2"
    b = out / "lib.qcow2"
    p = run_cli(imgcopy_env, "convert", "-O", "qcow2", "-c", "-o", "cluster_size=4k,compat=0.10",
                src, a)
    assert p.returncode == 0, p.stderr
    assert p.stderr == "" and p.stdout == ""
    convert_qcow2(src, b, compress=True, cluster_size=4 * KiB, compat="0.10")
    verify_qcow2(src, a, virtual_size=size, cluster_size=4 * KiB, compat="0.10", compressed=True)
    ia, ib = qemu_info(str(a), force_share=True), qemu_info(str(b), force_share=True)
    for k in ("virtual-size", "cluster-size", "format-specific"):
        assert ia[k] == ib[k], k
    assert qemu_map(str(a), "qcow2").extents == qemu_map(str(b), "qcow2").extents
    # guest-order placement makes the copy deterministic: the same bytes
    assert subprocess.run(["cmp", "-s", str(a), str(b)]).returncode == 0


def test_cli_preallocation_and_stats(srcs, imgcopy_env, out):
    src, size = srcs.seeded("alloc_zeros", 5)
    a = out / "cli.qcow2"
    p = run_cli(imgcopy_env, "convert", "-O", "qcow2", "-o", "cluster_size=512",
                "-o", "preallocation=metadata", "-m", "16", "--stats=json", src, a)
    assert p.returncode == 0, p.stderr
    stats = json.loads(p.stdout)
    assert stats["bytes_written"] + stats["bytes_zeroed"] + stats["bytes_skipped"] == size
    verify_qcow2(src, a, virtual_size=size, cluster_size=512)
    assert all(d["present"] for d in qemu_map(str(a), "qcow2").extents)


@pytest.mark.parametrize("opts", ["foo=1", "cluster_size", "compat=0.9", "preallocation=full",
                                  "cluster_size=3k", "cluster_size=abc", "cluster_size=64k,bar=2"])
def test_cli_bad_o(srcs, imgcopy_env, out, opts):
    src, size = srcs.seeded("holes_and_data", 3)
    p = run_cli(imgcopy_env, "convert", "-O", "qcow2", "-o", opts, src, out / "o.qcow2")
    assert p.returncode == 1, (p.returncode, p.stderr)
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("imgcopy: "), p.stderr
    assert "Traceback" not in p.stderr


def test_cli_backing(srcs, imgcopy_env, out):
    """-B: refused with one line while overlays are not supported (README:
    "Not yet: -B overlays"); once they are, the result must be a sound
    overlay of the given backing file."""
    src, size = srcs.seeded("holes_and_data", 3)
    dst = out / "o.qcow2"
    p = run_cli(imgcopy_env, "convert", "-O", "qcow2", "-B", src, "-F", "raw", src, dst)
    if p.returncode != 0:
        assert p.returncode == 1
        lines = p.stderr.splitlines()
        assert len(lines) == 1 and "not supported" in lines[0], p.stderr
        return
    info = qemu_info(str(dst), force_share=True)
    assert info.get("backing-filename"), info
    qemu_check(str(dst), "qcow2", strict=True)
    assert_same_content(src, dst, "raw", "qcow2", force_share=True)


@pytest.mark.parametrize("args,msg", [
    (["-c"], "qcow2"),
    (["-O", "raw", "-o", "cluster_size=64k"], "qcow2"),
], ids=["c-raw", "o-raw"])
def test_cli_refused(srcs, imgcopy_env, out, args, msg):
    src, size = srcs.seeded("holes_and_data", 3)
    dst = out / "o.qcow2"
    p = run_cli(imgcopy_env, "convert", *[a.format(src=src) for a in args], src, dst)
    assert p.returncode == 1, (p.returncode, p.stderr)
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and msg in lines[0], p.stderr


@pytest.mark.parametrize("size", [1000001, 3 * 65536 + 100, 7 * 512, 65537, 511])
@pytest.mark.parametrize("cluster_size", [4096, 65536])
def test_compress_odd_sized_source(tmp_path, size, cluster_size):
    """-c with data in a last, partial cluster: compressed (zero-padded) like
    qemu-img convert -c, never "compressed writes must cover whole
    clusters"."""
    src = str(tmp_path / "odd.raw")
    text = (b"compressible text, " * (size // 19 + 1))[:size - 1] + b"\x01"
    with open(src, "wb") as f:
        f.write(text)
    dst = str(tmp_path / "odd.qcow2")
    imgcopy.convert(src, dst, dst_format="qcow2", compress=True, cluster_size=cluster_size)
    assert qemu_img("compare", "-f", "raw", "-F", "qcow2", src, dst).returncode == 0
    qemu_check(dst)
    ref = str(tmp_path / "ref.qcow2")
    qemu_img("convert", "-c", "-f", "raw", "-O", "qcow2", "-o",
             "cluster_size=%d" % cluster_size, src, ref)

    def layout(path):
        out = qemu_img("map", "--output=json", path).stdout
        return [(e["start"], e["length"], e["data"], e["zero"], "offset" in e)
                for e in json.loads(out)]
    assert layout(dst) == layout(ref)


@pytest.mark.parametrize("cluster_size", [64 * KiB, 2 * MiB])
def test_too_large_for_qcow2_says_why_and_leaves_nothing(tmp_path, cluster_size):
    """A 2^63-512 byte source: qcow2 (its L1 table capped at 32 MiB, as in
    qemu) cannot hold it at any cluster size; the message says what fits,
    suggests larger clusters only where they exist, and no file is left."""
    shm = "/dev/shm"
    if not os.path.isdir(shm) or not os.access(shm, os.W_OK):
        pytest.skip("needs a writable /dev/shm (tmpfs holds a 2^63-byte sparse file)")
    src = os.path.join(shm, "imgcopy-huge-%d.raw" % os.getpid())
    try:
        with open(src, "wb") as f:
            f.truncate((1 << 63) - 512)
    except OSError as exc:
        pytest.skip("cannot make a 2^63-byte file: %s" % exc)
    try:
        dst = str(tmp_path / "huge.qcow2")
        with pytest.raises(ValueError, match="holds at most") as info:
            imgcopy.convert(src, dst, dst_format="qcow2", cluster_size=cluster_size)
        assert ("larger clusters" in str(info.value)) == (cluster_size < 2 * MiB)
        assert os.listdir(str(tmp_path)) == []
    finally:
        os.unlink(src)
