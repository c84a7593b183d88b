"""Helpers shared by the convert tests (tests/test_convert*.py): the
invariants of a CopyResult, the threads of this process, the option matrix
(a seeded all-pairs covering array) and the programs the tests run.

The oracles (qemu-img compare / map) are in tests/oracles.py, the sources
in tests/gen/.  Nothing here imports imgcopy at import time.
"""

import os
import random
import sys
from typing import List, Sequence, Tuple

import pytest

from .units import KiB, MiB

STATS_KEYS = ("bytes_read", "bytes_written", "bytes_zeroed", "bytes_skipped", "read_requests",
              "write_requests", "zero_requests", "extents", "elapsed", "cache_hits",
              "cache_misses", "lseek_calls", "bytes_already_zero", "bytes_changed",
              "bytes_compared", "bytes_equal", "bytes_resumed")

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


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
    if fresh_target and res.options.sparse_threshold:
        # (fully allocated output allocates its zeros: zero requests)
        assert d["bytes_zeroed"] == 0 and d["zero_requests"] == 0, d
    if d["bytes_read"] and not offload:
        assert d["read_requests"] > 0, d
    if d["bytes_written"]:
        assert d["write_requests"] > 0, d
    if d["bytes_zeroed"]:
        assert d["zero_requests"] > 0, d
    return d


def fully_allocated(path, size) -> bool:
    """Every block of the file's first `size` bytes has disk space (written
    or fallocated: st_blocks counts both, qemu-img map only the first)."""
    return os.stat(path).st_blocks * 512 >= size


def check_bytes_read(res, layout, sparse_threshold, *, exact):
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

def imgcopy_child_env() -> dict:
    """Environment for child processes that import or run imgcopy (the venv's
    editable install: the same build as ours)."""
    env = dict(os.environ)
    env.pop("PYTHONSTARTUP", None)
    env["LC_ALL"] = "C"
    return env


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
