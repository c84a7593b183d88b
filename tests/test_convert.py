"""imgcopy.convert(): content, layout and counters, with qemu-img as the oracle.

- an option matrix (seeded all-pairs selection) over seeded images: output
  byte-identical (qemu-img compare), counters consistent;
- the sparse layout of the output equals qemu-img convert -S N's, exactly,
  on the benchmark corpus image;
- existing targets (create=False), null: targets, block devices, progress
  reporting, and that source holes are never read.
"""

import json
import os
import shutil
import stat

import pytest

from .convert_helpers import (FACTORS, check_bytes_read, check_result, combo_id,
                              fully_allocated, pairwise_combos, task_count, wait_task_count)
from .gen.convert_sources import MATRIX_IMAGES, UNSTABLE_MAP_KINDS
from .gen.raw_layouts import zero_runs
from .gen.sparse import garbage, make_sparse
from .oracles import (assert_prefix_equal, assert_same_content, clip_entries, qemu_img,
                      qemu_map, require_qemu_img, sha256_file, sha256_range, source_layout)
from .servers import slow_export
from .units import GiB, KiB, MiB

imgcopy = pytest.importorskip("imgcopy")

COMBOS = pairwise_combos(FACTORS + (("image", [n for n, _, _ in MATRIX_IMAGES]),), seed=2024)


def _is_single_data_extent(path, size):
    entries = clip_entries(qemu_map(path).extents, size)
    return len(entries) == 1 and entries[0][5] and not entries[0][4] and entries[0][1] == size


# ---------------------------------------------------------------------------
# 1. the option matrix

@pytest.mark.parametrize("combo", COMBOS, ids=combo_id)
def test_matrix_byte_identical(combo, convert_sources, tmp_path):
    opts = dict(combo)
    name = opts.pop("image")
    img = convert_sources.get(name)
    layout = convert_sources.layout(name)
    dst = str(tmp_path / "out.raw")

    res = imgcopy.convert(img.path, dst, **opts)

    assert os.path.getsize(dst) == img.size
    assert_same_content(img.path, dst, "raw", "raw")
    # a file made by convert reads as zeros: nothing is ever zeroed in it
    d = check_result(res, img.size, fresh_target=True, offload=opts["offload"])
    thr = opts["sparse_threshold"]
    if thr == 0:
        # fully allocated: nothing skipped, the holes allocated (zero requests
        # that keep them so: a new file's fallocate), no zeros written
        assert d["bytes_skipped"] == 0 and d["bytes_written"] + d["bytes_zeroed"] == img.size, d
        assert fully_allocated(dst, img.size), os.stat(dst)
    if img.kind in UNSTABLE_MAP_KINDS:
        return  # ext4 unwritten extents: the map moves when read; content only
    assert d["extents"] == layout.runs, (d, layout)
    # extents are asked for once: about two lseek calls per extent at most
    assert d["lseek_calls"] <= 2 * layout.runs + 4, (d, layout)
    check_bytes_read(res, layout, thr, exact=opts["offload"])
    if opts["offload"]:
        # data is copied in the kernel as it is: no zero detection inside data
        if thr:
            assert d["bytes_written"] == layout.data_bytes, (d, layout)
            assert d["bytes_skipped"] == img.size - layout.data_bytes, (d, layout)
    elif thr:
        assert d["bytes_written"] <= layout.data_bytes, (d, layout)
        assert d["bytes_skipped"] >= img.size - layout.data_bytes, (d, layout)


def test_matrix_covers_every_pair():
    # every value of every option (and every image) appears
    for name, values in FACTORS:
        assert {c[name] for c in COMBOS} == set(values), name
    assert {c["image"] for c in COMBOS} == {n for n, _, _ in MATRIX_IMAGES}
    assert 30 <= len(COMBOS) <= 60


def test_defaults_and_result_type(convert_sources, tmp_path):
    img = convert_sources.get("alloc_zeros")
    dst = tmp_path / "out.raw"  # os.PathLike works too
    threads = task_count()
    res = imgcopy.convert(img.path, dst)
    assert wait_task_count(threads) == threads, "worker threads left running"
    assert isinstance(res, imgcopy.CopyResult)
    assert_same_content(img.path, dst, "raw", "raw")
    d = check_result(res, img.size, fresh_target=True)
    assert json.loads(json.dumps(d)) == d
    assert res.elapsed > 0 and isinstance(res.elapsed, float)


def test_offload_counts_requests(convert_sources, tmp_path):
    """copy_file_range reads the source: the bytes it reads come with read
    requests, as every other read does (bytes_read / read_requests is the
    mean read size a pipeline tunes with)."""
    img = convert_sources.get("holes_and_data")
    layout = convert_sources.layout("holes_and_data")
    res = imgcopy.convert(img.path, str(tmp_path / "out.raw"), offload=True,
                          request_size=65536)
    d = check_result(res, img.size, fresh_target=True, offload=True)
    assert d["bytes_read"] == layout.data_bytes > 0, d
    assert d["read_requests"] >= max(1, d["bytes_read"] // 65536), d


def test_in_order_identical(convert_sources, tmp_path):
    img = convert_sources.get("alloc_zeros")
    outs = []
    for ooo in (True, False):
        dst = str(tmp_path / ("out-%d.raw" % ooo))
        res = imgcopy.convert(img.path, dst, out_of_order=ooo, concurrency=8,
                              request_size=4096)
        check_result(res, img.size, fresh_target=True)
        assert_same_content(img.path, dst, "raw", "raw")
        outs.append(dst)
    assert sha256_file(outs[0]) == sha256_file(outs[1])
    assert qemu_map(outs[0]).extents == qemu_map(outs[1]).extents


# ---------------------------------------------------------------------------
# 2. sparse layout vs qemu-img convert -S, on the benchmark corpus

def _qemu_convert(src, dst, threshold, unsafe=False):
    cache = ["-t", "unsafe"] if unsafe else []
    qemu_img("convert", "-f", "raw", "-O", "raw", *cache, "-S", str(threshold), src, dst)


@pytest.mark.parametrize("threshold", [4 * KiB, 8 * KiB, 16 * KiB, 32 * KiB, 64 * KiB],
                         ids=lambda t: "S%dk" % (t // KiB))
def test_sparse_map_equals_qemu(corpus_raw, tmp_path, threshold):
    corpus_image, size = corpus_raw
    ref = str(tmp_path / "qemu.raw")
    out = str(tmp_path / "imgcopy.raw")
    try:
        # no flushing: the layout is the same, the tests are faster
        _qemu_convert(corpus_image, ref, threshold, unsafe=True)
        res = imgcopy.convert(corpus_image, out, sparse_threshold=threshold, flush=False)
        check_result(res, size, fresh_target=True)
        assert_same_content(corpus_image, out, "raw", "raw")
        want, got = qemu_map(ref).text, qemu_map(out).text
        if got != want:
            w, g = json.loads(want), json.loads(got)
            diff = [(a, b) for a, b in zip(w, g) if a != b][:3]
            pytest.fail("map differs from qemu-img convert -S %d: %d vs %d extents, first "
                        "differences (qemu, imgcopy): %s" % (threshold, len(w), len(g), diff))
    finally:
        for p in (ref, out):
            if os.path.exists(p):
                os.unlink(p)


@pytest.fixture(scope="module")
def zero_runs_source(tmp_path_factory):
    require_qemu_img()
    path = str(tmp_path_factory.mktemp("zero-runs") / "zero-runs.raw")
    zero_runs(path, 0)
    return path


@pytest.mark.parametrize("request_size", [4096, 12288, 2 * MiB],
                         ids=lambda r: "r%dk" % (r // KiB))
@pytest.mark.parametrize("threshold", [512, 8192, 65536], ids=lambda t: "S%d" % t)
def test_sparse_map_independent_of_request_size(zero_runs_source, tmp_path, threshold,
                                                request_size):
    """Zero blocks are aligned to the largest power of two <= threshold,
    like qemu-img -S, whatever the request size."""
    ref = str(tmp_path / "qemu.raw")
    out = str(tmp_path / "imgcopy.raw")
    _qemu_convert(zero_runs_source, ref, threshold)
    res = imgcopy.convert(zero_runs_source, out, sparse_threshold=threshold,
                          request_size=request_size)
    check_result(res, os.path.getsize(zero_runs_source), fresh_target=True)
    assert_same_content(zero_runs_source, out, "raw", "raw")
    want, got = qemu_map(ref).extents, qemu_map(out).extents
    assert got == want, "-S %d --request-size %d: %d extents, qemu-img: %d" % (
        threshold, request_size, len(got), len(want))


def test_sparse_zero_fully_allocated_like_qemu(corpus_raw, tmp_path):
    """-S 0 allocates every block, as qemu-img -S 0 does (its zeros written
    as data, ours fallocated: the same disk space, none of the writes)."""
    corpus_image, size = corpus_raw
    ref = str(tmp_path / "qemu.raw")
    out = str(tmp_path / "imgcopy.raw")
    try:
        _qemu_convert(corpus_image, ref, 0, unsafe=True)
        assert _is_single_data_extent(ref, size), qemu_map(ref).extents
        res = imgcopy.convert(corpus_image, out, sparse_threshold=0, flush=False)
        d = check_result(res, size, fresh_target=True)
        assert_same_content(corpus_image, out, "raw", "raw")
        assert fully_allocated(out, size)
        # the same space (give or take a block of the file system's extent tree)
        assert os.stat(out).st_blocks * 512 <= os.stat(ref).st_blocks * 512 + 64 * KiB
        # the source's holes are still never read, nor written as zeros
        layout = source_layout(corpus_image)
        assert d["bytes_read"] == d["bytes_written"] == layout.data_bytes < size
        assert d["bytes_zeroed"] == size - layout.data_bytes
    finally:
        for p in (ref, out):
            if os.path.exists(p):
                os.unlink(p)


# ---------------------------------------------------------------------------
# 3. existing targets (create=False)

EXISTING_IMAGES = ("holes_and_data", "odd_1000001", "last_byte", "all_hole")


@pytest.mark.parametrize("extra", [0, 300001], ids=["same-size", "larger"])
@pytest.mark.parametrize("name", EXISTING_IMAGES)
def test_existing_garbage_target(convert_sources, tmp_path, name, extra):
    img = convert_sources.get(name)
    layout = convert_sources.layout(name)
    dst = str(tmp_path / "target.raw")
    garbage(dst, img.size + extra, seed=len(name) + extra)
    tail = sha256_range(dst, img.size)

    res = imgcopy.convert(img.path, dst, create=False)

    assert os.path.getsize(dst) == img.size + extra
    assert_prefix_equal(img.path, dst, img.size)
    assert sha256_range(dst, img.size) == tail, "bytes past the source size changed"
    if extra == 0:
        assert_same_content(img.path, dst, "raw", "raw")
    d = check_result(res, img.size)
    # an existing target is not known to read as zeros: zero ranges are zeroed
    assert d["bytes_skipped"] == 0, d
    if layout.data_bytes < img.size:
        assert d["bytes_zeroed"] > 0, d


def test_existing_target_fully_allocated(convert_sources, tmp_path):
    img = convert_sources.get("holes_and_data")
    dst = str(tmp_path / "target.raw")
    garbage(dst, img.size + 4096, seed=1)
    tail = sha256_range(dst, img.size)
    res = imgcopy.convert(img.path, dst, create=False, sparse_threshold=0)
    d = check_result(res, img.size)
    # the garbage zeroed in place (ZERO_RANGE: it stays allocated), not written
    assert d["bytes_skipped"] == 0 and 0 < d["bytes_zeroed"] < img.size, d
    assert fully_allocated(dst, img.size)
    assert_prefix_equal(img.path, dst, img.size)
    assert sha256_range(dst, img.size) == tail


def test_existing_target_is_zero(convert_sources, tmp_path):
    img = convert_sources.get("holes_and_data")
    layout = convert_sources.layout("holes_and_data")
    dst = str(tmp_path / "zeros.raw")
    make_sparse(dst, img.size + 8192)
    res = imgcopy.convert(img.path, dst, create=False, target_is_zero=True)
    d = check_result(res, img.size, fresh_target=True)
    assert d["bytes_skipped"] >= img.size - layout.data_bytes > 0, d
    assert_prefix_equal(img.path, dst, img.size)
    assert os.path.getsize(dst) == img.size + 8192


def test_existing_target_offload(convert_sources, tmp_path):
    img = convert_sources.get("alloc_zeros")
    dst = str(tmp_path / "target.raw")
    garbage(dst, img.size, seed=3)
    res = imgcopy.convert(img.path, dst, create=False, offload=True, concurrency=3,
                          request_size=65536)
    check_result(res, img.size, offload=True)
    assert_same_content(img.path, dst, "raw", "raw")


def test_create_over_existing_file(convert_sources, tmp_path):
    # create=True empties an existing file: its old blocks never show through
    img = convert_sources.get("holes_and_data")
    dst = str(tmp_path / "old.raw")
    garbage(dst, img.size + 123457, seed=4)
    res = imgcopy.convert(img.path, dst)
    check_result(res, img.size, fresh_target=True)
    assert os.path.getsize(dst) == img.size
    assert_same_content(img.path, dst, "raw", "raw")


def test_fresh_target_explicitly_not_zero(convert_sources, tmp_path):
    """target_is_zero=False assumes nothing, but the destination is asked:
    the holes of the new file read as zeros, so no zero request is sent."""
    img = convert_sources.get("holes_and_data")
    layout = convert_sources.layout("holes_and_data")
    dst = str(tmp_path / "out.raw")
    res = imgcopy.convert(img.path, dst, target_is_zero=False)
    d = check_result(res, img.size)
    assert d["zero_requests"] == 0 and d["bytes_zeroed"] == 0, d
    assert d["bytes_already_zero"] == d["bytes_skipped"] >= img.size - layout.data_bytes, d
    assert_same_content(img.path, dst, "raw", "raw")


@pytest.mark.parametrize("threshold", [4 * KiB, 64 * KiB])
def test_existing_target_asked_where_it_reads_zeros(convert_sources, tmp_path, threshold):
    """create=False into a file that is part holes, part garbage: ranges the
    destination already reads as zeros (its holes) get no zero request,
    the garbage is zeroed; the result says how many bytes were spared."""
    img = convert_sources.get("holes_and_data")
    dst = str(tmp_path / "existing.raw")
    garbage(dst, img.size // 2, seed=3)
    with open(dst, "r+b") as f:
        f.truncate(img.size)  # second half: a hole
    res = imgcopy.convert(img.path, dst, create=False, sparse_threshold=threshold)
    d = check_result(res, img.size)
    assert_same_content(img.path, dst, "raw", "raw")
    full = imgcopy.plan(img.path, sparse_threshold=threshold, target_is_zero=False).totals()
    assert 0 < d["bytes_already_zero"] == d["bytes_skipped"], d
    assert d["zero_requests"] < full["zero_requests"], (d, full)
    assert d["bytes_zeroed"] + d["bytes_already_zero"] == full["bytes_zeroed"], (d, full)


def test_existing_target_smaller(convert_sources, tmp_path):
    img = convert_sources.get("holes_and_data")
    dst = str(tmp_path / "small.raw")
    garbage(dst, img.size - 1, seed=5)
    before = sha256_file(dst)
    with pytest.raises(ValueError):
        imgcopy.convert(img.path, dst, create=False)
    assert os.path.getsize(dst) == img.size - 1
    assert sha256_file(dst) == before


def test_existing_target_missing(convert_sources, tmp_path):
    img = convert_sources.get("holes_and_data")
    dst = str(tmp_path / "nope.raw")
    with pytest.raises(FileNotFoundError):
        imgcopy.convert(img.path, dst, create=False)
    assert not os.path.exists(dst)


# ---------------------------------------------------------------------------
# 4. null: destination

@pytest.mark.parametrize("threshold", [0, 4096])
def test_null_target(convert_sources, tmp_path, monkeypatch, threshold):
    img = convert_sources.get("alloc_zeros")
    layout = convert_sources.layout("alloc_zeros")
    monkeypatch.chdir(tmp_path)
    before = sorted(os.listdir(tmp_path))
    res = imgcopy.convert(img.path, "null:", sparse_threshold=threshold)
    d = check_result(res, img.size)
    check_bytes_read(res, layout, threshold, exact=False)
    if threshold == 0:
        assert d["bytes_read"] == layout.data_bytes
    assert sorted(os.listdir(tmp_path)) == before
    assert not os.path.exists(tmp_path / "null:")


def test_null_format(convert_sources, tmp_path):
    img = convert_sources.get("holes_and_data")
    layout = convert_sources.layout("holes_and_data")
    dst = tmp_path / "discarded.raw"
    res = imgcopy.convert(img.path, str(dst), dst_format="null", sparse_threshold=0)
    check_result(res, img.size)
    assert res.bytes_read == layout.data_bytes
    assert not dst.exists()
    assert os.listdir(tmp_path) == []


# ---------------------------------------------------------------------------
# 5. progress

def test_progress_callable(convert_sources, tmp_path):
    img = convert_sources.get("holes_and_data")
    calls = []
    imgcopy.convert(img.path, str(tmp_path / "out.raw"), request_size=4096, concurrency=1,
                    progress=lambda done, total: calls.append((done, total)))
    _check_progress_calls(calls, img.size)


def _check_progress_calls(calls, size):
    assert calls, "progress never called"
    assert all(t == size for _, t in calls), calls[:5]
    dones = [d for d, _ in calls]
    assert dones == sorted(dones), "done went backwards: %s" % dones
    assert all(0 <= d <= size for d in dones)
    assert dones.count(size) == 1 and dones[-1] == size, dones[-5:]


class FakeTqdm:
    def __init__(self):
        self.updates = []

    def update(self, n):
        self.updates.append(n)


def test_progress_tqdm_like(convert_sources, tmp_path):
    img = convert_sources.get("alloc_zeros")
    bar = FakeTqdm()
    imgcopy.convert(img.path, str(tmp_path / "out.raw"), progress=bar)
    assert bar.updates and all(n >= 0 for n in bar.updates), bar.updates
    assert sum(bar.updates) == img.size


def test_progress_empty_source(convert_sources, tmp_path):
    img = convert_sources.get("empty")
    calls = []
    res = imgcopy.convert(img.path, str(tmp_path / "out.raw"),
                          progress=lambda d, t: calls.append((d, t)))
    assert calls == [(0, 0)]
    check_result(res, 0)
    bar = FakeTqdm()
    imgcopy.convert(img.path, str(tmp_path / "out2.raw"), progress=bar)
    assert sum(bar.updates) == 0


def test_progress_regular_during_long_copy(tmp_path):
    # 48 MiB read from NBD into null:, 4 KiB at a time: ~1 s of work
    import time

    size = 48 * MiB
    stamps = []
    with slow_export(str(size)) as srv:
        t0 = time.monotonic()
        res = imgcopy.convert(srv.uri, "null:", request_size=4096,
                              progress=lambda d, t: stamps.append((time.monotonic(), d, t)))
        t1 = time.monotonic()
    check_result(res, size)
    _check_progress_calls([(d, t) for _, d, t in stamps], size)
    times = [t0] + [s for s, _, _ in stamps]
    if t1 - t0 > 0.5:
        assert len(stamps) >= 2, "a %.2f s copy reported progress only once" % (t1 - t0)
    # "at least every 0.2 s", with some slack for a loaded machine
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert max(gaps) < 0.45, gaps


def test_progress_rejects_garbage(convert_sources, tmp_path):
    img = convert_sources.get("tiny")
    with pytest.raises(TypeError):
        imgcopy.convert(img.path, str(tmp_path / "out.raw"), progress=42)


# ---------------------------------------------------------------------------
# 6. source holes are never read

def test_holes_never_read(tmp_path):
    src = str(tmp_path / "sparse.raw")
    size = 1 * GiB
    import random

    data = random.Random(7).randbytes(4096).replace(b"\0", b"\1")
    make_sparse(src, size, [(512 * MiB, data)])
    out = str(tmp_path / "out.raw")
    res = imgcopy.convert(src, out)
    d = check_result(res, size, fresh_target=True)
    assert d["bytes_read"] <= 4096 + 2 * 4096, d
    assert d["read_requests"] <= 3, d
    assert d["bytes_written"] == 4096, d
    assert d["extents"] == 3, d
    assert d["lseek_calls"] <= 8, d
    assert_same_content(src, out, "raw", "raw")
    os.unlink(out)

    # fully allocated to null: still exactly the data is read
    res = imgcopy.convert(src, "null:", sparse_threshold=0)
    d = check_result(res, size)
    assert d["bytes_read"] == 4096 and d["read_requests"] == 1, d


def test_sparse_threshold_zero_runs(tmp_path):
    """Zero runs inside data: shorter than -S are written, longer are holes."""
    import random

    rng = random.Random(11)

    def blob(n):
        return rng.randbytes(n).replace(b"\0", b"\2")

    size = 1 * MiB
    # data | 4 KiB zeros | data | 64 KiB zeros | data, all 64k-aligned runs
    layout = blob(64 * KiB) + bytes(4 * KiB) + blob(60 * KiB) + bytes(64 * KiB) + blob(64 * KiB)
    src = str(tmp_path / "src.raw")
    make_sparse(src, size, [(0, layout)])
    for thr, want_written in ((4096, len(layout) - 68 * KiB),
                              (8192, len(layout) - 64 * KiB),
                              (65536, len(layout) - 64 * KiB),
                              (0, len(layout))):  # the rest allocated, not written
        out = str(tmp_path / ("out-%d.raw" % thr))
        res = imgcopy.convert(src, out, sparse_threshold=thr)
        d = check_result(res, size, fresh_target=True)
        assert d["bytes_written"] == want_written, (thr, d)
        assert_same_content(src, out, "raw", "raw")
        ref = str(tmp_path / ("ref-%d.raw" % thr))
        qemu_img("convert", "-f", "raw", "-O", "raw", "-S", str(thr), src, ref)
        if thr == 0:  # qemu writes the zeros, imgcopy allocates them: the same space
            assert fully_allocated(out, size)
            assert os.stat(out).st_blocks * 512 <= os.stat(ref).st_blocks * 512 + 64 * KiB
        else:
            assert qemu_map(out).extents == qemu_map(ref).extents, thr


@pytest.mark.parametrize("bad", [1, 511, 1000, -512])
def test_bad_sparse_threshold(convert_sources, tmp_path, bad):
    img = convert_sources.get("tiny")
    dst = tmp_path / "out.raw"
    with pytest.raises(ValueError):
        imgcopy.convert(img.path, str(dst), sparse_threshold=bad)
    assert not dst.exists()


# ---------------------------------------------------------------------------
# 7. block device destination (loop device)

@pytest.fixture
def random_disk(tmp_path, loop_device):
    """An 8 MiB loop device full of random bytes: (device, size)."""
    backing = str(tmp_path / "backing.img")
    size = 8 * MiB
    with open(backing, "wb") as f:
        f.write(os.urandom(size))
    return loop_device(backing), size


@pytest.mark.parametrize("name,create,opts", [
    ("holes_and_data", True, {}),
    ("holes_and_data", False, {}),
    ("odd_1000001", True, {"sparse_threshold": 512}),
    ("odd_1000001", False, {"direct": True}),
    ("all_hole", True, {"request_size": 65536, "concurrency": 8}),
], ids=["create", "existing", "odd-S512", "odd-direct", "all-hole"])
def test_block_device_target(convert_sources, random_disk, name, create, opts):
    dev, devsize = random_disk
    img = convert_sources.get(name)
    layout = convert_sources.layout(name)
    assert img.size < devsize
    tail = sha256_range(dev, img.size, devsize - img.size)

    res = imgcopy.convert(img.path, dev, create=create, **opts)

    assert stat.S_ISBLK(os.stat(dev).st_mode), "the block device was replaced"
    assert_prefix_equal(img.path, dev, img.size)
    d = check_result(res, img.size)
    # a disk keeps what it held: zero ranges are zeroed, never skipped
    assert d["bytes_skipped"] == 0, d
    assert d["bytes_zeroed"] >= img.size - layout.data_bytes > 0, d
    assert sha256_range(dev, img.size, devsize - img.size) == tail


def test_block_device_too_small(tmp_path, random_disk):
    dev, devsize = random_disk
    src = str(tmp_path / "big.raw")
    make_sparse(src, devsize + 4096, [(0, b"x" * 4096)])
    with pytest.raises(ValueError):
        imgcopy.convert(src, dev)
    assert stat.S_ISBLK(os.stat(dev).st_mode)
    with pytest.raises(ValueError):
        imgcopy.convert(src, dev, create=False)


def test_block_device_source(random_disk, tmp_path):
    """A block device has no holes: all of it is data, read once; zero
    runs inside become holes in the file."""
    dev, devsize = random_disk
    with open(dev, "r+b") as f:       # zeros in the middle, data around
        f.seek(1 * MiB)
        f.write(bytes(2 * MiB))
        f.flush()
        os.fsync(f.fileno())
    out = str(tmp_path / "out.raw")
    res = imgcopy.convert(dev, out, sparse_threshold=65536)
    d = check_result(res, devsize, fresh_target=True)
    assert d["bytes_read"] == devsize and d["extents"] == 1, d
    assert d["bytes_skipped"] >= 2 * MiB, d
    assert os.path.getsize(out) == devsize
    assert_prefix_equal(dev, out, devsize)


# ---------------------------------------------------------------------------
# 8. the source is never the destination

@pytest.mark.parametrize("how", ["same", "symlink", "hardlink", "dot-path"])
@pytest.mark.parametrize("create", [True, False])
def test_destination_is_the_source(convert_sources, tmp_path, how, create):
    img = convert_sources.get("holes_and_data")
    src = str(tmp_path / "src.raw")
    shutil.copyfile(img.path, src)
    digest = sha256_file(src)
    dst = {"same": src, "dot-path": os.path.join(str(tmp_path), ".", "src.raw"),
           "symlink": str(tmp_path / "link.raw"), "hardlink": str(tmp_path / "hard.raw")}[how]
    if how == "symlink":
        os.symlink(src, dst)
    elif how == "hardlink":
        os.link(src, dst)
    with pytest.raises(ValueError):
        imgcopy.convert(src, dst, create=create)
    assert os.path.getsize(src) == img.size
    assert sha256_file(src) == digest, "the source was overwritten"


def test_concurrent_converts_from_threads(convert_sources, tmp_path):
    """convert() releases the GIL and keeps no global state: copies run
    side by side from Python threads, progress callbacks included."""
    from concurrent.futures import ThreadPoolExecutor

    names = ("holes_and_data", "alloc_zeros", "small_extents", "odd_1000001")
    imgs = [convert_sources.get(n) for n in names]
    calls = {n: [] for n in names}

    def one(i):
        img = imgs[i]
        return imgcopy.convert(img.path, str(tmp_path / ("out-%d.raw" % i)), request_size=4096,
                               concurrency=2 + i,
                               progress=lambda d, t, n=names[i]: calls[n].append((d, t)))

    threads = task_count()
    with ThreadPoolExecutor(len(imgs)) as pool:
        results = list(pool.map(one, range(len(imgs))))
    for i, (img, res) in enumerate(zip(imgs, results)):
        check_result(res, img.size, fresh_target=True)
        assert_same_content(img.path, str(tmp_path / ("out-%d.raw" % i)), "raw", "raw")
        assert calls[names[i]][-1] == (img.size, img.size)
    assert wait_task_count(threads) == threads
