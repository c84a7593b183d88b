"""Tables sized by a header field cost what the file holds.

A header may claim a table far larger than its file (an L1 table of 4 M
entries in a file of 4 KiB, a grain directory of 92 MB, a BAT of millions
of entries): the entries past the end of the file read as zeros (or as
whatever the format says a missing entry is), so a reader holds, byte-swaps
and walks only those inside the file.  Each case here is one of the fuzz
regressions (tests/fuzz/regressions/FORMAT/hostile-*) timed against a
baseline on the same machine: the same small image without the claim.
Opening, mapping, reading (and checking, for qcow2) the hostile file must
cost about what the baseline costs, whatever else runs on the machine:
the best of a few rounds, under a generous bound (a few times the
baseline plus some milliseconds, and under a second in any case).
"""
import json
import os
import subprocess
import sys

import pytest

from .convert_helpers import imgcopy_child_env
from .fuzz import hostile

SANITIZED = "asan" in os.environ.get("LD_PRELOAD", "")
SLOW = 5 if SANITIZED else 1
ROUNDS = 5
# the hostile file's best round against the baseline's best round
FACTOR = 5
SLACK = 0.03 * SLOW
CEILING = 1.0 * SLOW

# One child times every file of a case, rounds interleaved (the machine's
# load weighs on both alike), and says how each ended: what imgcopy makes
# of a hostile file is part of what must not change.
CHILD = r"""
import json, sys, time
import imgcopy

WINDOW = 64 << 20

def once(path, fmt, op):
    t = time.perf_counter()
    outcome = "ok"
    try:
        if op == "check":
            r = imgcopy.check(path, format=fmt)
            outcome = "check: %d corruptions, %d leaks, %d errors" % (
                r.corruptions, r.leaks, r.check_errors)
        else:
            with imgcopy.open(path, fmt) as img:
                size = img.size
                img.extents(0, min(size, WINDOW))
                if size > WINDOW:
                    img.extents(size - WINDOW)
                img.read(0, min(size, 1 << 20))
                if size:
                    img.read(size - min(size, 65536), min(size, 65536))
    except (imgcopy.ImageFormatError, OSError) as e:
        outcome = "%s: %s" % (type(e).__name__, e)
    return time.perf_counter() - t, outcome

files = json.loads(sys.argv[1])
best = [None] * len(files)
outcomes = [None] * len(files)
for _ in range(int(sys.argv[2])):
    for i, (path, fmt, op) in enumerate(files):
        secs, outcomes[i] = once(path, fmt, op)
        best[i] = secs if best[i] is None else min(best[i], secs)
print(json.dumps({"best": best, "outcomes": outcomes}))
"""


def time_files(files, cwd, rounds=ROUNDS):
    """[(path, format, "open" | "check")] -> (best seconds, outcomes)."""
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(files), str(rounds)],
                          capture_output=True, text=True, env=imgcopy_child_env(), cwd=cwd,
                          timeout=120 * SLOW)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    return r["best"], r["outcomes"]


def assert_bounded(name, hostile_secs, baseline_secs):
    bound = min(CEILING, FACTOR * baseline_secs + SLACK)
    assert hostile_secs < bound, (
        "%s: %.1f ms, the baseline %.1f ms (bound %.1f ms): a table sized by the header "
        "is read or walked past the end of the file" % (
            name, hostile_secs * 1e3, baseline_secs * 1e3, bound * 1e3))


def write(tmp_path, name, data):
    path = str(tmp_path / name)
    with open(path, "wb") as f:
        f.write(data)
    return path


# -- qcow2 ---------------------------------------------------------------

def qcow2_case(name):
    return hostile.CASES_BY_NAME[name].build()


def qcow2_baseline():
    return bytes(hostile.base_image()[0])


@pytest.mark.parametrize("op", ["open", "check"])
@pytest.mark.parametrize("name", ["l1-size-32MiB-beyond-eof"])
def test_qcow2_table_past_eof(name, op, tmp_path):
    """The largest L1 table qemu takes (32 MiB), claimed by a 4 KiB file:
    opened, mapped and checked as cheaply as the same image without it."""
    base = write(tmp_path, "base.qcow2", qcow2_baseline())
    bad = write(tmp_path, "hostile.qcow2", qcow2_case(name))
    (t_base, t_bad), _ = time_files([(base, "qcow2", op), (bad, "qcow2", op)], str(tmp_path))
    assert_bounded("%s (%s)" % (name, op), t_bad, t_base)
