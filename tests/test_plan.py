"""imgcopy.plan(): the requests of a copy, found without writing, must be
exactly those of the matching convert() - same counters, same layout of the
output - on seeded images and on the benchmark corpus, for -S 4k ... 1M."""
import os
import shutil
import tempfile
from typing import Dict, Iterator, List, Tuple

import pytest

import imgcopy
from imgcopy.extents import human_size
from .gen import qcow2_images
from .gen.raw_kinds import make_image
from .gen.raw_layouts import odd_1000001, zeros_around_thresholds
from .gen.sparse import garbage
from .oracles import require_qemu
from .units import KiB, MiB

# CopyResult.to_dict() keys a plan also has (no elapsed time, no cache counters)
PLAN_KEYS = ("bytes_read", "bytes_written", "bytes_zeroed", "bytes_skipped", "read_requests",
             "write_requests", "zero_requests", "extents")
THRESHOLDS = [4 * KiB << i for i in range(9)]            # 4k ... 1M


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Iterator[str]:
    """Where copies go: memory when there is room (copies of the corpus are
    ~80 MiB; the disk of a busy CI machine makes them slow), else tmp."""
    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK):
        st = os.statvfs(shm)
        if st.f_bavail * st.f_frsize > 1 << 30:
            d = tempfile.mkdtemp(prefix="imgcopy-plan-", dir=shm)
            yield d
            shutil.rmtree(d, ignore_errors=True)
            return
    yield str(tmp_path_factory.mktemp("plan-out"))


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> Dict[str, Tuple[str, int]]:
    """Seeded raw sources: name -> (path, size)."""
    d = tmp_path_factory.mktemp("plan-src")
    out = {}
    for kind, seed in [("holes_and_data", 11), ("alloc_zeros", 12), ("alloc_zeros", 13),
                       ("small_extents", 14), ("unaligned", 15), ("odd_size", 16),
                       ("all_data", 17), ("empty", 0), ("tiny", 18), ("last_byte", 19)]:
        p = str(d / ("%s-%d.img" % (kind, seed)))
        out["%s-%d" % (kind, seed)] = (p, make_image(p, kind, seed))
    p = str(d / "odd_1000001.img")
    out["odd_1000001"] = (p, odd_1000001(p, 1))
    p = str(d / "zero_runs.img")
    out["zero_runs"] = (p, zeros_around_thresholds(p))
    return out


def common(d: dict) -> dict:
    return {k: d[k] for k in PLAN_KEYS}


def write_runs(plan) -> List[Tuple[int, int]]:
    """[start, end) ranges written, neighbouring write requests merged."""
    runs: List[Tuple[int, int]] = []
    for r in plan:
        if r.kind == "write":
            if runs and runs[-1][1] == r.offset:
                runs[-1] = (runs[-1][0], r.end)
            else:
                runs.append((r.offset, r.end))
    return runs


def data_ranges(path) -> List[Tuple[int, int]]:
    runs: List[Tuple[int, int]] = []
    for e in imgcopy.map(path, format="raw"):
        if e.data:
            if runs and runs[-1][1] == e.start:
                runs[-1] = (runs[-1][0], e.end)
            else:
                runs.append((e.start, e.end))
    return runs


def check_structure(plan, size, request_size, threshold=0):
    """Requests tile [0, size) in guest order; the totals add up.  Requests
    are cut at request_size, rounded up to whole zero-detection blocks (the
    largest power of two not above the threshold)."""
    if threshold:
        request_size = max(request_size, 1 << (threshold.bit_length() - 1))
    pos = 0
    by_kind = {"write": [0, 0], "zero": [0, 0], "skip": [0, 0]}
    for r in plan:
        assert r.offset == pos and r.length > 0, (r, pos)
        if r.kind == "write":  # zero requests go up to the destination's limit
            assert r.length <= request_size, r
        by_kind[r.kind][0] += 1
        by_kind[r.kind][1] += r.length
        pos = r.end
    assert pos == size == plan.size
    t = plan.totals()
    assert by_kind["write"] == [t["write_requests"], t["bytes_written"]]
    assert by_kind["zero"] == [t["zero_requests"], t["bytes_zeroed"]]
    assert by_kind["skip"][1] == t["bytes_skipped"]
    assert t["bytes_written"] + t["bytes_zeroed"] + t["bytes_skipped"] == size
    assert len(plan) == sum(n for n, _ in by_kind.values())


# --------------------------------------------------------------------------
# seeded images: plan == convert into a new raw file

@pytest.mark.parametrize("threshold", [0, 4 * KiB, 8 * KiB, 64 * KiB, 1 * MiB])
def test_plan_equals_convert_on_seeded_images(sources, scratch, threshold):
    for name, (src, size) in sorted(sources.items()):
        for request_size in (2 * MiB, 64 * KiB):
            p = imgcopy.plan(src, sparse_threshold=threshold, request_size=request_size)
            check_structure(p, size, request_size, threshold)
            dst = os.path.join(scratch, "seeded.raw")
            r = imgcopy.convert(src, dst, sparse_threshold=threshold,
                                request_size=request_size, flush=False)
            assert common(p.totals()) == common(r.to_dict()), (name, request_size)
            # what was written is where the output has data (whole 4 KiB blocks)
            if threshold >= 4 * KiB:
                assert data_ranges(dst) == _blocks(write_runs(p), size), (name, request_size)
            os.unlink(dst)


def _blocks(runs, size, block=4 * KiB):
    """Runs widened to whole file-system blocks, clipped at the end of the file."""
    out: List[Tuple[int, int]] = []
    for s, e in runs:
        s, e = s // block * block, min(size, -(-e // block) * block)
        if out and out[-1][1] >= s:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


@pytest.mark.parametrize("threshold", [4 * KiB, 64 * KiB])
def test_plan_into_existing_target(sources, scratch, threshold):
    """target_is_zero=False: zero ranges are zeroed, as convert(create=False)
    does into a destination with nothing that reads as zeros (garbage)."""
    for name in ("holes_and_data-11", "alloc_zeros-12", "zero_runs", "odd_1000001"):
        src, size = sources[name]
        p = imgcopy.plan(src, sparse_threshold=threshold, target_is_zero=False)
        check_structure(p, size, 2 * MiB, threshold)
        dst = os.path.join(scratch, "existing.raw")
        garbage(dst, size, seed=11)
        r = imgcopy.convert(src, dst, create=False, target_is_zero=False,
                            sparse_threshold=threshold, flush=False)
        assert common(p.totals()) == common(r.to_dict()), name
        assert p.totals()["zero_requests"] > 0 or size == p.totals()["bytes_written"], name
        os.unlink(dst)


def test_plan_does_not_depend_on_concurrency(sources):
    src, _ = sources["zero_runs"]
    plans = [imgcopy.plan(src, sparse_threshold=4096, concurrency=c) for c in (1, 3, 8)]
    assert len({tuple(p) for p in plans}) == 1
    assert len({tuple(sorted(p.totals().items())) for p in plans}) == 1


def test_thresholds_on_known_zero_runs(sources):
    """zero_runs holds written zeros of known lengths: a run becomes a hole
    when it is at least the threshold long (aligned to it)."""
    src, size = sources["zero_runs"]
    written = {t: imgcopy.plan(src, sparse_threshold=t).totals()["bytes_written"]
               for t in THRESHOLDS}
    values = [written[t] for t in THRESHOLDS]
    assert values == sorted(values)                      # more threshold, more writing
    assert written[4 * KiB] < written[1 * MiB]


def test_plan_writes_nothing(sources, tmp_path):
    src, _ = sources["alloc_zeros-12"]
    before = os.listdir(os.path.dirname(src))
    st = os.stat(src)
    imgcopy.plan(src)
    assert os.listdir(os.path.dirname(src)) == before
    assert os.stat(src).st_mtime_ns == st.st_mtime_ns


def test_plan_requests_and_pandas(sources):
    pd = pytest.importorskip("pandas")
    src, size = sources["zero_runs"]
    p = imgcopy.plan(src, sparse_threshold=4096, request_size=64 * KiB)
    assert p[0] == list(p)[0] and p[-1] == list(p)[-1]
    with pytest.raises(IndexError):
        p[len(p)]
    assert p.requests("write") == [r for r in p if r.kind == "write"]
    df = p.to_pandas()
    assert isinstance(df, pd.DataFrame)
    assert list(df.columns) == ["kind", "offset", "length", "end"]
    assert len(df) == len(p)
    t = p.totals()
    sums = df.groupby("kind")["length"].sum().to_dict()
    assert sums.get("write", 0) == t["bytes_written"]
    assert sums.get("skip", 0) == t["bytes_skipped"]
    assert (df["end"] - df["offset"] == df["length"]).all()
    assert repr(p).startswith("<CopyPlan %s, %d requests" % (human_size(p.size), len(p)))


def test_plan_option_errors(sources):
    src, _ = sources["tiny-18"]
    for kwargs in ({"sparse_threshold": 1000}, {"request_size": 1000}, {"concurrency": 0}):
        with pytest.raises(ValueError):
            imgcopy.plan(src, **kwargs)
    with pytest.raises(FileNotFoundError):
        imgcopy.plan(src + ".missing")


# --------------------------------------------------------------------------
# qcow2 sources

@pytest.mark.parametrize("name", ["convc-64k", "conv-4k", "chain-top", "prealloc-metadata",
                                  "uni-c512-v2"])
@pytest.mark.parametrize("threshold", [4 * KiB, 64 * KiB])
def test_plan_equals_convert_qcow2(qcow2_store, scratch, name, threshold):
    require_qemu()
    b = qcow2_store.get(name)
    p = imgcopy.plan(b.path, sparse_threshold=threshold)
    check_structure(p, b.size, 2 * MiB, threshold)
    dst = os.path.join(scratch, "q.raw")
    r = imgcopy.convert(b.path, dst, sparse_threshold=threshold, flush=False)
    assert common(p.totals()) == common(r.to_dict())
    assert data_ranges(dst) == _blocks(write_runs(p), b.size)
    os.unlink(dst)


# --------------------------------------------------------------------------
# the corpus image of the issue: 1443 extents at -S 4k, 213 at -S 64k

@pytest.fixture(scope="module")
def corpus(qcow2_store):
    require_qemu()
    import json

    d = qcow2_images.corpus_dir(qcow2_store)
    with open(os.path.join(d, "manifest.json")) as f:
        manifest = json.load(f)["images"]["sparse-6g.raw"]
    return os.path.join(d, "sparse-6g.raw"), manifest


def test_corpus_threshold_sweep(corpus, scratch):
    src, man = corpus
    size = man["virtual_size"]
    previous = previous_runs = None
    for t in THRESHOLDS:
        p = imgcopy.plan(src, sparse_threshold=t)
        check_structure(p, size, 2 * MiB, t)
        dst = os.path.join(scratch, "corpus.raw")
        r = imgcopy.convert(src, dst, sparse_threshold=t, flush=False)
        assert common(p.totals()) == common(r.to_dict()), t
        runs = write_runs(p)
        assert data_ranges(dst) == runs, t
        os.unlink(dst)
        # every allocated zero run (4k..60k) becomes a hole at 4k, none from 64k on,
        # some in between
        if t == 4 * KiB:
            assert len(runs) == man["data_runs"] + man["allocated_zero_runs"]
        elif t >= 64 * KiB:
            assert len(runs) == man["data_runs"], t
        else:
            assert man["data_runs"] < len(runs) < man["data_runs"] + man["allocated_zero_runs"]
        # data runs and the holes between them: qemu-img map's line count of the copy
        expect = {4 * KiB: man["expected_map_lines_dst_S4k"],
                  64 * KiB: man["expected_map_lines_dst_S64k"]}.get(t)
        if expect is not None:
            assert 2 * len(runs) - 1 == expect, t
        t_now = p.totals()
        assert t_now["bytes_read"] == man["allocated_bytes_expected"]
        if previous is not None:
            # more threshold: written runs merge, and fewer requests write them
            # (each data run cut as qemu-img reads it: 2 MiB windows from its start)
            assert len(runs) <= len(previous_runs)
            assert t_now["write_requests"] <= previous["write_requests"]
            assert t_now["bytes_written"] >= previous["bytes_written"]
        assert t_now["write_requests"] >= len(runs)
        previous, previous_runs = t_now, runs
    assert previous is not None
    assert previous["bytes_written"] == man["allocated_bytes_expected"]


@pytest.mark.parametrize("fname", ["sparse-6g.qcow2", "sparse-6g-compressed.qcow2"])
def test_corpus_qcow2(corpus, scratch, fname):
    src = os.path.join(os.path.dirname(corpus[0]), fname)
    for t in (4 * KiB, 64 * KiB, 1 * MiB):
        p = imgcopy.plan(src, sparse_threshold=t)
        dst = os.path.join(scratch, "corpus-q.raw")
        r = imgcopy.convert(src, dst, sparse_threshold=t, flush=False)
        assert common(p.totals()) == common(r.to_dict()), (fname, t)
        os.unlink(dst)
