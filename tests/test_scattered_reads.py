"""A format's scattered host reads are in flight together (issue 25).

Images whose clusters (grains, blocks) lie in the file out of guest order
are copied from a cold page cache by one worker, under ``strace -ff``.  The
data runs of a request must reach the disk together, not one after another:
runs that follow each other in the file (written last to first) as one
vectored read, the others announced to the kernel
(``fadvise64(..., POSIX_FADV_WILLNEED)``) before the first of them is waited
for.  With O_DIRECT (``-T none``), where no hint helps, they go to io_uring
in one ``io_uring_enter`` (or one vectored read).  Losing either (runs read
one after another, as before) fails here, whatever the machine's speed.
"""

import glob
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

import imgcopy

from .oracles import needs_qemu, qemu_img, qemu_io
from .page_cache import evict, is_cold
from .units import KiB, MiB

pytestmark = [needs_qemu,
              pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")]

SIZE = 8 * MiB
REQUEST = 2 * MiB

FORMATS = {
    # format: (create options, the unit a guest run is)
    "qcow2": ((), 64 * KiB),
    "vmdk": (("-o", "subformat=monolithicSparse"), 64 * KiB),
    "vhdx": (("-o", "block_size=1M"), 1 * MiB),
}


def _order(n, layout):
    """The order units are written in, so allocated in the file:
    "backwards": last to first (a request's runs are one stretch of the
    file, read backwards); "strided": no two guest neighbours are file
    neighbours (every run its own read)."""
    if layout == "backwards":
        return list(range(n - 1, -1, -1))
    stride = 45 if n > 8 else 3  # coprime with n, and never +-1 apart
    return [i * stride % n for i in range(n)]


def _make(path, fmt, layout):
    opts, unit = FORMATS[fmt]
    qemu_img("create", "-f", fmt, *opts, path, str(SIZE))
    n = SIZE // unit
    qemu_io(path, ["write -P 0x%02x %d %d" % (i % 251 + 1, i * unit, unit)
                   for i in _order(n, layout)], fmt=fmt)
    return path


def _host_runs(path):
    """Host offsets of the data runs (imgcopy's map: qemu maps a vhdx
    without host offsets)."""
    return sorted(e.host_offset for e in imgcopy.map(path)
                  if e.data and not e.zero and e.host_offset is not None)


def _trace(tmp_path, src, fmt, extra):
    prefix = str(tmp_path / "trace")
    for f in glob.glob(prefix + ".*"):
        os.unlink(f)
    evict(src)
    cmd = ["strace", "-ff", "-qq", "-o", prefix, "-e",
           "trace=openat,pread64,preadv,preadv2,fadvise64,io_uring_setup,io_uring_enter",
           sys.executable, "-m", "imgcopy", "convert", "-f", fmt, "-O", "raw", "-m", "1",
           "--request-size", str(REQUEST), *extra, src, "null:"]
    # run where no other imgcopy checkout could be imported instead
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=300,
                   cwd=str(tmp_path))
    traces = []
    for f in sorted(glob.glob(prefix + ".*")):
        with open(f) as fh:
            traces.append(fh.read().splitlines())
    return traces


def _source_fds(traces, src):
    pat = re.compile(r'openat\(AT_FDCWD, "%s", [^)]*\) = (\d+)' % re.escape(src))
    return {int(m.group(1)) for lines in traces for line in lines for m in [pat.search(line)] if m}


@pytest.fixture(params=[(f, l) for f in sorted(FORMATS) for l in ("backwards", "strided")],
                ids=lambda p: "%s-%s" % p)
def scattered(request, tmp_path):
    fmt, layout = request.param
    path = _make(str(tmp_path / ("%s.%s" % (layout, fmt))), fmt, layout)
    runs = _host_runs(path)
    unit = FORMATS[fmt][1]
    assert len(runs) == SIZE // unit, runs  # every unit its own run
    for _ in range(3):
        evict(path)
        if is_cold(path, runs[len(runs) // 2]):
            break
    else:
        pytest.skip("the page cache here cannot be emptied of the image (tmpfs?)")
    return fmt, layout, path, runs, REQUEST // unit


READ = re.compile(r"^(pread64|preadv|preadv2)\((\d+), (.*), (\d+)(, RWF_NOWAIT)?\) = (-?\d+)")
WILLNEED = re.compile(r"^fadvise64\((\d+), (\d+), (\d+), POSIX_FADV_WILLNEED\)")


def test_runs_reach_the_disk_together(scattered, tmp_path):
    """At each read that waits for the disk, the data runs in flight (the
    ones it reads, and the ones announced and not read yet) are the
    request's, not one."""
    fmt, layout, src, runs, per_request = scattered
    traces = _trace(tmp_path, src, fmt, [])
    fds = _source_fds(traces, src)
    assert fds, "the source was never opened?"

    def covered(off, length):
        return {r for r in runs if off <= r < off + length}

    together, waits = 0, 0
    for lines in traces:
        announced, done = set(), set()
        for line in lines:
            m = WILLNEED.match(line)
            if m and int(m.group(1)) in fds:
                announced |= covered(int(m.group(2)), int(m.group(3))) - done
                continue
            m = READ.match(line)
            if not m or int(m.group(2)) not in fds or int(m.group(6)) <= 0:
                continue
            got = covered(int(m.group(4)), int(m.group(6)))
            if not got:
                continue  # metadata
            if not m.group(5):  # a read that waited
                waits += 1
                together = max(together, len(got | announced))
            done |= got
            announced -= got
    assert waits > 0, "no data run was read from the disk: was the cache cold?"
    # readahead of the image's metadata may bring in a few runs
    assert together >= max(2, per_request // 2), (layout, together, per_request)


def test_direct_runs_submitted_together(scattered, tmp_path):
    fmt, layout, src, runs, per_request = scattered
    traces = _trace(tmp_path, src, fmt, ["-T", "none"])
    lines = [ln for t in traces for ln in t]
    uring = any(re.match(r"^io_uring_setup\(.*\) = \d+", ln) for ln in lines)
    if layout == "strided" and not uring:
        pytest.skip("no io_uring here: scattered O_DIRECT runs are read one after another")
    # runs in one io_uring_enter, or buffers in one vectored read
    together = [int(m.group(1)) for ln in lines
                for m in [re.match(r"^io_uring_enter\(\d+, (\d+), ", ln)] if m]
    together += [int(m.group(4)) for ln in lines for m in [READ.match(ln)]
                 if m and m.group(1) == "preadv"]
    assert together and max(together) >= per_request, (layout, together)
