"""Helpers shared by the convert tests (tests/test_convert*.py).

qemu-img is the oracle: ``qemu-img compare`` for content, ``qemu-img map``
for the layout of the source (which ranges hold data) and of the output.
Nothing here imports imgcopy at import time.
"""

import json
import os
import random
import shutil
import subprocess
import sys
from typing import Dict, List, NamedTuple, Sequence, Tuple

import pytest

from .imagegen import (QEMU_IMG, NO_QEMU_REASON, GenImage, clip_entries, make_image,
                      make_sparse, qemu_img, qemu_map)

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

STATS_KEYS = ("bytes_read", "bytes_written", "bytes_zeroed", "bytes_skipped", "read_requests",
              "write_requests", "zero_requests", "extents", "elapsed", "cache_hits",
              "cache_misses", "lseek_calls")

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def require_qemu_img():
    if QEMU_IMG is None:
        pytest.skip(NO_QEMU_REASON)


# ---------------------------------------------------------------------------
# content and layout oracles

def qemu_compare(a, b) -> subprocess.CompletedProcess:
    """``qemu-img compare -f raw -F raw A B`` (exit 0: identical)."""
    return qemu_img("compare", "-f", "raw", "-F", "raw", a, b, check=False)


def assert_identical(src, dst):
    p = qemu_compare(src, dst)
    assert p.returncode == 0, "qemu-img compare %s %s: rc=%d %s%s" % (
        src, dst, p.returncode, p.stdout, p.stderr)


def assert_prefix_equal(src, dst, size):
    """The first `size` bytes of dst equal src (dst may be larger)."""
    if size == 0:
        return
    p = subprocess.run(["cmp", "-n", str(size), os.fspath(src), os.fspath(dst)],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.returncode == 0, "cmp -n %d %s %s: %s%s" % (size, src, dst, p.stdout, p.stderr)


def sha256_range(path, start, length=None) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        f.seek(start)
        left = length
        while left is None or left > 0:
            n = 1 << 20 if left is None else min(1 << 20, left)
            chunk = f.read(n)
            if not chunk:
                break
            h.update(chunk)
            if left is not None:
                left -= len(chunk)
    return h.hexdigest()


class Layout(NamedTuple):
    """What qemu-img map says of a raw source, clipped to its size."""
    size: int
    data_bytes: int   # bytes that must be read (data, not zero)
    runs: int         # alternating data / zero runs (neighbours merged)


def source_layout(path) -> Layout:
    size = os.path.getsize(path)
    entries = clip_entries(qemu_map(path).extents, size)
    data = 0
    runs = 0
    last = None
    for (_s, length, _d, _p, zero, is_data, _o) in entries:
        kind = bool(is_data) and not zero
        if kind:
            data += length
        if kind != last:
            runs += 1
            last = kind
    return Layout(size, data, runs)


def map_json(path) -> list:
    return json.loads(qemu_img("map", "-f", "raw", "--output=json", path).stdout)


# ---------------------------------------------------------------------------
# CopyResult checks

def check_result(res, size, *, fresh_target=None, offload=False):
    """Invariants every copy must satisfy; returns res.to_dict().

    (With offload, copy_file_range both reads and writes; whether it counts
    as a read request is checked by its own test, not here.)"""
    d = res.to_dict()
    assert set(d) == set(STATS_KEYS), sorted(d)
    for k in STATS_KEYS:
        assert d[k] >= 0, (k, d)
        assert getattr(res, k) == d[k]
    assert d["bytes_written"] + d["bytes_zeroed"] + d["bytes_skipped"] == size, d
    if fresh_target:
        assert d["bytes_zeroed"] == 0 and d["zero_requests"] == 0, d
    if d["bytes_read"] and not offload:
        assert d["read_requests"] > 0, d
    if d["bytes_written"]:
        assert d["write_requests"] > 0, d
    if d["bytes_zeroed"]:
        assert d["zero_requests"] > 0, d
    return d


def check_bytes_read(res, layout: Layout, sparse_threshold, *, exact):
    """Only data extents are read: exactly, or plus look-around reads of at
    most sparse_threshold bytes each (every one is a read request)."""
    if exact or sparse_threshold == 0:
        assert res.bytes_read == layout.data_bytes, (res, layout)
    else:
        assert res.bytes_read >= layout.data_bytes, (res, layout)
        extra = res.bytes_read - layout.data_bytes
        assert extra <= sparse_threshold * res.read_requests, (res, layout)


def task_count() -> int:
    """Threads of this process, C threads included."""
    return len(os.listdir("/proc/self/task"))


def wait_task_count(expected, timeout=2.0) -> int:
    """Threads may need a moment to vanish from /proc after pthread_join."""
    import time

    deadline = time.monotonic() + timeout
    n = task_count()
    while n != expected and time.monotonic() < deadline:
        time.sleep(0.01)
        n = task_count()
    return n


# ---------------------------------------------------------------------------
# source images

# Seeded images for the option matrix: (name, kind, seed) built by
# tests/imagegen.py, plus custom layouts built below.  Kinds whose map is
# not stable under reads (fallocated / qemu-io unwritten extents on ext4)
# are used for content only.
MATRIX_IMAGES = (
    ("holes_and_data", "holes_and_data", 3),
    ("alloc_zeros", "alloc_zeros", 5),
    ("small_extents", "small_extents", 2),
    ("unaligned", "unaligned", 7),
    ("odd_1000001", "custom", 1),
    ("empty", "empty", 0),
    ("last_byte", "last_byte", 4),
    ("all_data", "all_data", 9),
    ("tiny", "tiny", 6),
    ("qemu_io", "qemu_io", 8),
)
# Images used by single tests only.
EXTRA_IMAGES = (
    ("all_hole", "all_hole", 3),
)
ALL_IMAGES = MATRIX_IMAGES + EXTRA_IMAGES
UNSTABLE_MAP_KINDS = ("qemu_io", "fallocated")


def build_odd_1000001(path, seed):
    """1000001 bytes: data at both ends, written zeros of every size in the
    middle (shorter and longer than each threshold), a real hole."""
    rng = random.Random("convert-odd-%d" % seed)

    def blob(n):
        return rng.randbytes(n).replace(b"\0", b"\x5a")

    size = 1000001
    data = [(0, blob(70000))]
    # written zeros inside a data run: 512, 1000, 4096, 8192, 65536 (+ odd)
    pos = 70000
    for z in (512, 1000, 4096, 4097, 8192, 65536, 70001):
        data.append((pos, bytes(z) + blob(3000)))
        pos += z + 3000
    # a hole from pos+? to 800000, then data up to the last byte
    data.append((800000, blob(size - 800000 - 1) + b"\x01"))
    make_sparse(path, size, data)
    return size


def build_image(path, kind, seed) -> int:
    if kind == "custom":
        return build_odd_1000001(path, seed)
    return make_image(path, kind, seed)


class SourceSet:
    """Session-wide read-only sources and their layouts."""

    def __init__(self, root):
        self.root = root
        self._img: Dict[str, GenImage] = {}
        self._layout: Dict[str, Layout] = {}

    def get(self, name) -> GenImage:
        if name not in self._img:
            (kind, seed), = [(k, s) for (n, k, s) in ALL_IMAGES if n == name]
            if kind == "qemu_io" and shutil.which("qemu-io") is None:
                pytest.skip("qemu-io not found on PATH (install qemu-utils)")
            path = str(self.root / ("%s.img" % name))
            size = build_image(path, kind, seed)
            self._img[name] = GenImage(path, size, kind, seed)
            # the layout, taken once before anybody reads the image
            self._layout[name] = source_layout(path)
        return self._img[name]

    def layout(self, name) -> Layout:
        self.get(name)
        return self._layout[name]


# ---------------------------------------------------------------------------
# option combinations

FACTORS = (
    ("sparse_threshold", (0, 512, 4096, 65536)),
    ("concurrency", (1, 3, 8)),
    ("request_size", (4096, 65536, 2 * MiB)),
    ("out_of_order", (True, False)),
    ("offload", (False, True)),
    ("direct", (False, True)),
    ("flush", (True, False)),
)


def pairwise_combos(factors: Sequence[Tuple[str, Sequence]], seed=2024, extra=0,
                    candidates=40) -> List[dict]:
    """A seeded greedy all-pairs covering array: every pair of values of
    every two factors appears in at least one combination; then `extra`
    random combinations are added.  Deterministic for a given seed."""
    rng = random.Random(seed)
    names = [n for n, _ in factors]
    values = [list(v) for _, v in factors]
    uncovered = set()
    for i in range(len(factors)):
        for j in range(i + 1, len(factors)):
            for a in range(len(values[i])):
                for b in range(len(values[j])):
                    uncovered.add((i, a, j, b))
    rows = []
    while uncovered:
        best, best_gain = None, -1
        # seed each candidate with an uncovered pair so progress is certain
        for _ in range(candidates):
            (i, a, j, b) = rng.choice(sorted(uncovered))
            row = [rng.randrange(len(v)) for v in values]
            row[i], row[j] = a, b
            # greedily improve the other factors
            for k in rng.sample(range(len(values)), len(values)):
                if k in (i, j):
                    continue
                scores = []
                for v in range(len(values[k])):
                    row[k] = v
                    scores.append((_gain(row, uncovered), rng.random(), v))
                row[k] = max(scores)[2]
            g = _gain(row, uncovered)
            if g > best_gain:
                best, best_gain = list(row), g
        assert best is not None
        rows.append(best)
        uncovered -= _pairs(best)
    for _ in range(extra):
        rows.append([rng.randrange(len(v)) for v in values])
    return [{names[k]: values[k][r[k]] for k in range(len(names))} for r in rows]


def _pairs(row):
    return {(i, row[i], j, row[j]) for i in range(len(row)) for j in range(i + 1, len(row))}


def _gain(row, uncovered):
    return len(_pairs(row) & uncovered)


def combo_id(c: dict) -> str:
    short = {"sparse_threshold": "S", "concurrency": "m", "request_size": "r",
             "out_of_order": "W", "offload": "C", "direct": "D", "flush": "F", "image": ""}
    parts = []
    for k, v in c.items():
        if isinstance(v, bool):
            v = int(v)
        elif k == "request_size":
            v = "%dk" % (v // KiB)
        parts.append("%s%s" % (short.get(k, k), v))
    return "-".join(parts)


# ---------------------------------------------------------------------------
# subprocesses

def imgcopy_cmd() -> List[str]:
    """The imgcopy console script next to this interpreter, or -m imgcopy."""
    exe = os.path.join(os.path.dirname(sys.executable), "imgcopy")
    if os.access(exe, os.X_OK):
        return [exe]
    return [sys.executable, "-m", "imgcopy"]


def corpus_script() -> str:
    """make_corpus.py: the repository's copy, else the shared one."""
    for p in (os.path.join(REPO, "benchmarks", "make_corpus.py"),
              "/work/shared/corpus/make_corpus.py"):
        if os.path.exists(p):
            return p
    pytest.skip("make_corpus.py not found (benchmarks/make_corpus.py)")
