"""imgcopy.convert() from qcow2 sources, with qemu-img as the oracle.

Every qcow2 image of tests/gen/qcow2_images.py, converted to raw, must compare
identical to its source (``qemu-img compare -f qcow2 -F raw``): backing chains
flatten to their full content, compressed / zero / unallocated clusters come
out right, whatever the engine's options.  The sparse layout of the output
must equal what ``qemu-img convert -S N`` produces, on the make_corpus images.
"""

import json
import os

import pytest

import imgcopy

from .gen import qcow2_images
from .oracles import assert_same_content, needs_qemu, qemu_img, qemu_io, qemu_map
from .units import KiB, MiB, TiB

pytestmark = needs_qemu

CONVERT_NAMES = qcow2_images.SMALL_NAMES + ["corpus-frag-backward", "corpus-frag-forward",
                                        "corpus-prealloc-meta"]


def _data_bytes(qcow2_all, b):
    """Guest bytes the engine has to read: data extents that are not zero."""
    return sum(d["length"] for d in json.loads(qcow2_all.qemu_json(b.path))
               if d["data"] and not d["zero"])


def check_result(r, size, *, fresh=False, data_bytes=None, sparse_threshold=None):
    assert isinstance(r, imgcopy.CopyResult)
    d = r.to_dict()
    for k, v in d.items():
        assert v >= 0, (k, d)
    assert r.bytes_written + r.bytes_zeroed + r.bytes_skipped == size, d
    if fresh and r.options.sparse_threshold:  # fully allocated: zeros allocated
        assert r.bytes_zeroed == 0 and r.zero_requests == 0, d
    if r.bytes_written:
        assert r.write_requests > 0, d
    if data_bytes is not None:
        # zero and unallocated clusters are never read; zero detection may
        # look around a request edge by at most sparse_threshold bytes
        assert r.bytes_read >= data_bytes, (d, data_bytes)
        if sparse_threshold == 0:
            assert r.bytes_read == data_bytes, (d, data_bytes)
        elif sparse_threshold is not None:
            assert r.bytes_read - data_bytes <= sparse_threshold * max(1, r.read_requests), d
    return d


# --------------------------------------------------------------------------
# every image, default options

@pytest.mark.parametrize("name", CONVERT_NAMES)
def test_convert_to_raw(qcow2_all, tmp_path, name):
    b = qcow2_all.get(name)
    dst = str(tmp_path / "out.raw")
    r = imgcopy.convert(b.path, dst)
    try:
        assert os.path.getsize(dst) == b.size
        check_result(r, b.size, fresh=True, data_bytes=_data_bytes(qcow2_all, b), sparse_threshold=4096)
        assert_same_content(b.path, dst, "qcow2", "raw")
    finally:
        os.unlink(dst)


@pytest.mark.parametrize("name", ["chain-top", "chain-small", "chain-probe", "tree-over"])
def test_chain_flattens(qcow2_all, tmp_path, name):
    """A backing chain converts to its full, flattened guest content."""
    b = qcow2_all.get(name)
    dst = str(tmp_path / "flat.raw")
    imgcopy.convert(b.path, dst, src_format="qcow2")
    with open(dst, "rb") as f:
        assert f.read() == qcow2_all.raw_bytes(name)
    # and the copy stands alone
    assert imgcopy.open(dst).backing_chain == []


# --------------------------------------------------------------------------
# engine options

OPTION_IMAGES = ["uni-c512-v3", "uni-c2097152-v2", "chain-top", "convc-64k",
                 "prealloc-metadata-written", "odd-64k", "frag-forward"]
COMBOS = [
    dict(concurrency=1, out_of_order=False, sparse_threshold=0, request_size=64 * KiB),
    dict(concurrency=4, out_of_order=True, sparse_threshold=4096, request_size=2 * MiB),
    dict(concurrency=8, out_of_order=True, sparse_threshold=65536, request_size=64 * KiB),
    dict(concurrency=8, out_of_order=False, sparse_threshold=4096, request_size=2 * MiB,
         direct=True),
    dict(concurrency=4, sparse_threshold=0, request_size=2 * MiB, direct=(True, False),
         offload=True),
    dict(concurrency=1, sparse_threshold=512, request_size=4096, flush=False),
    dict(concurrency=4, out_of_order=False, sparse_threshold=65536, request_size=1 * MiB,
         direct=(False, True)),
]


def _combo_id(c):
    return "-".join("%s=%s" % (k[:4], v) for k, v in c.items())


@pytest.mark.parametrize("opts", COMBOS, ids=[_combo_id(c) for c in COMBOS])
@pytest.mark.parametrize("name", OPTION_IMAGES)
def test_convert_options(qcow2_all, tmp_path, name, opts):
    b = qcow2_all.get(name)
    dst = str(tmp_path / "out.raw")
    r = imgcopy.convert(b.path, dst, **opts)
    try:
        check_result(r, b.size, fresh=True, data_bytes=_data_bytes(qcow2_all, b),
                     sparse_threshold=opts["sparse_threshold"])
        assert_same_content(b.path, dst, "qcow2", "raw")
        if opts["sparse_threshold"] == 0:
            # fully allocated: no holes at all in the output (its zeros
            # fallocated: disk space, not data to qemu-img map)
            assert os.stat(dst).st_blocks * 512 >= b.size, os.stat(dst)
    finally:
        os.unlink(dst)


@pytest.mark.parametrize("name", ["uni-c4096-v3", "chain-top", "convc-4k", "corpus-frag-backward"])
def test_convert_to_null(qcow2_all, name):
    b = qcow2_all.get(name)
    for opts in (dict(), dict(concurrency=1, out_of_order=False, request_size=64 * KiB)):
        r = imgcopy.convert(b.path, "null:", **opts)
        check_result(r, b.size, data_bytes=_data_bytes(qcow2_all, b), sparse_threshold=4096)


def test_convert_progress(qcow2_all, tmp_path):
    b = qcow2_all.get("frag-backward")
    seen = []
    r = imgcopy.convert(b.path, str(tmp_path / "p.raw"), request_size=64 * KiB,
                        progress=lambda done, total: seen.append((done, total)))
    check_result(r, b.size, fresh=True)
    assert seen and seen[-1] == (b.size, b.size)
    assert all(t == b.size for _, t in seen)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)


@pytest.mark.parametrize("name", ["chain-top", "prealloc-metadata-written", "odd-64k-v2"])
def test_convert_into_existing_file(qcow2_all, tmp_path, name):
    """create=False over garbage: every source byte lands (zeros included),
    the tail past the source is left alone."""
    b = qcow2_all.get(name)
    dst = str(tmp_path / "old.raw")
    tail = 12345
    with open(dst, "wb") as f:
        f.write(b"\xee" * (b.size + tail))
    r = imgcopy.convert(b.path, dst, create=False, sparse_threshold=4096)
    check_result(r, b.size)
    with open(dst, "rb") as f:
        got = f.read()
    assert got[:b.size] == qcow2_all.raw_bytes(name)
    assert got[b.size:] == b"\xee" * tail
    # target_is_zero=True on a zeroed file: skipping zero ranges is right then
    with open(dst, "wb") as f:
        f.truncate(b.size)
    r = imgcopy.convert(b.path, dst, create=False, target_is_zero=True)
    check_result(r, b.size)
    assert_same_content(b.path, dst, "qcow2", "raw")


def test_convert_refuses_own_source(qcow2_all):
    b = qcow2_all.get("odd-64k-tail")
    with pytest.raises(ValueError):
        imgcopy.convert(b.path, b.path)
    assert imgcopy.map(b.path).to_json() == qcow2_all.qemu_json(b.path)


# --------------------------------------------------------------------------
# a block device destination

@pytest.mark.parametrize("name", ["chain-top", "odd-64k"])
def test_convert_to_block_device(qcow2_all, tmp_path, loop_device, name):
    backing = str(tmp_path / "loop.img")
    with open(backing, "wb") as f:
        f.write(b"\xdd" * (8 * MiB))
    dev = loop_device(backing)
    b = qcow2_all.get(name)
    r = imgcopy.convert(b.path, dev, request_size=256 * KiB)
    check_result(r, b.size)
    with open(dev, "rb") as f:
        got = f.read(8 * MiB)
    assert got[:b.size] == qcow2_all.raw_bytes(name)
    assert got[b.size:] == b"\xdd" * (8 * MiB - b.size)


# --------------------------------------------------------------------------
# the sparse layout equals qemu-img convert -S N's (corpus images)

@pytest.mark.parametrize("threshold", [4096, 65536])
@pytest.mark.parametrize("name", ["corpus-sparse-6g", "corpus-sparse-6g-compressed"])
def test_sparse_layout_matches_qemu(qcow2_all, tmp_path, name, threshold):
    b = qcow2_all.get(name)
    ours, theirs = str(tmp_path / "ours.raw"), str(tmp_path / "qemu.raw")
    try:
        # (no fsync on either side: the layout is what matters here)
        r = imgcopy.convert(b.path, ours, sparse_threshold=threshold, flush=False)
        check_result(r, b.size, fresh=True, data_bytes=_data_bytes(qcow2_all, b),
                     sparse_threshold=threshold)
        qemu_img("convert", "-t", "unsafe", "-f", "qcow2", "-O", "raw", "-S", str(threshold),
                 b.path, theirs)
        want = qemu_map(theirs).text
        got = qemu_map(ours).text
        assert got == want
        assert_same_content(ours, theirs, "raw", "raw")
        # -S 4k keeps the source's allocated zero runs as holes: more extents
        if threshold == 4096:
            assert len(got.splitlines()) > 1000
    finally:
        for p in (ours, theirs):
            if os.path.exists(p):
                os.unlink(p)


def test_convert_huge_sparse(tmp_path):
    """4 TiB of nothing and two clusters (one near the end): only those are
    read and written; the raw output maps like qemu-img's.  (The 1 PiB image
    is left to the map tests: hole requests are cut at 1 GiB, so a 1 PiB
    copy makes a million skip requests.)"""
    src = str(tmp_path / "huge.qcow2")
    qcow2_images.create(src, 4 * TiB)
    qemu_io(src, ["write -P 0x31 %d 64k" % (3 * TiB + 5 * 65536),
                  "write -c -P 0x32 %d 64k" % (4 * TiB - 65536)], fmt="qcow2", cache="unsafe")
    r = imgcopy.convert(src, "null:")
    check_result(r, 4 * TiB)
    assert r.bytes_read == r.bytes_written == 128 * KiB
    dst = str(tmp_path / "huge.raw")
    r = imgcopy.convert(src, dst)
    check_result(r, 4 * TiB, fresh=True)
    assert os.path.getsize(dst) == 4 * TiB
    want = qemu_map(src, None).text
    got = imgcopy.map(dst).to_json()
    # same runs of data and zeros (the raw file has no compressed clusters or offsets)
    strip = lambda js: [(d["start"], d["length"], d["data"]) for d in json.loads(js)]  # noqa: E731
    assert strip(got) == strip(want)
    with open(dst, "rb") as f:
        f.seek(4 * TiB - 65536 - 1)
        assert f.read() == b"\0" + b"\x32" * 65536
