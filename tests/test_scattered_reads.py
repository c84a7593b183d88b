"""A format's scattered host reads are in flight together (issue 25).

An image whose clusters (grains, blocks) lie in the file last to first is
copied from a cold page cache by one worker, under ``strace -ff``: each
request's data runs that the page cache does not hold must all be announced
to the kernel (``fadvise64(..., POSIX_FADV_WILLNEED)``) before the first of
them is waited for (``pread64``), so that the disk sees them together.  With
O_DIRECT (``-T none``), where no hint helps, they go to io_uring in one
``io_uring_enter``.  Losing either (reads one after another again, as
before) fails here, whatever the machine's speed.
"""

import glob
import os
import re
import shutil
import subprocess
import sys

import pytest

import imgcopy

from .oracles import needs_qemu, qemu_img, qemu_io
from .units import KiB, MiB

pytestmark = [needs_qemu,
              pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")]

SIZE = 8 * MiB
REQUEST = 2 * MiB


def _backwards(path, fmt, unit, create_opts=()):
    """A `fmt` image of SIZE whose units of `unit` bytes are written last to
    first (a different byte each), so each is allocated before the one in
    front of it."""
    qemu_img("create", "-f", fmt, *create_opts, path, str(SIZE))
    n = SIZE // unit
    qemu_io(path, ["write -P 0x%02x %d %d" % (i % 251 + 1, i * unit, unit)
                   for i in range(n - 1, -1, -1)], fmt=fmt)
    return path


IMAGES = {
    # format: (create options, the unit written, runs in one 2 MiB request)
    "qcow2": ((), 64 * KiB, 32),
    "vmdk": (("-o", "subformat=monolithicSparse"), 64 * KiB, 32),
    "vhdx": (("-o", "block_size=1M"), 1 * MiB, 2),
}


def _evict(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _cold(path, host_offset):
    """Whether the page cache let go of the image (tmpfs keeps everything:
    nothing there is ever read from a disk).  One run is asked: a miss
    starts a read of it, which the trace's own eviction drops again."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.preadv(fd, [bytearray(4096)], host_offset, os.RWF_NOWAIT)
        return False
    except BlockingIOError:
        return True
    except OSError:
        return False  # no RWF_NOWAIT here: cannot tell
    finally:
        os.close(fd)


def _host_runs(path):
    """Host offset -> length of each data run (imgcopy's map: qemu maps a
    vhdx without host offsets)."""
    return {e.host_offset: e.length for e in imgcopy.map(path)
            if e.data and not e.zero and e.host_offset is not None}


def _trace(tmp_path, src, fmt, extra):
    prefix = str(tmp_path / "trace")
    for f in glob.glob(prefix + ".*"):
        os.unlink(f)
    _evict(src)
    cmd = ["strace", "-ff", "-qq", "-o", prefix,
           "-e", "trace=openat,pread64,preadv2,fadvise64,io_uring_setup,io_uring_enter",
           sys.executable, "-m", "imgcopy", "convert", "-f", fmt, "-O", "raw", "-m", "1",
           "--request-size", str(REQUEST), *extra, src, "null:"]
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    traces = {}
    for f in glob.glob(prefix + ".*"):
        with open(f) as fh:
            traces[f] = fh.read().splitlines()
    return traces


def _source_fds(traces, src):
    fds = set()
    pat = re.compile(r'openat\(AT_FDCWD, "%s", [^)]*\) = (\d+)' % re.escape(src))
    for lines in traces.values():
        for line in lines:
            m = pat.search(line)
            if m:
                fds.add(int(m.group(1)))
    return fds


@pytest.fixture(params=sorted(IMAGES))
def backwards(request, tmp_path):
    fmt = request.param
    opts, unit, per_request = IMAGES[fmt]
    path = _backwards(str(tmp_path / ("backwards." + fmt)), fmt, unit, opts)
    runs = _host_runs(path)
    assert len(runs) == SIZE // unit, runs  # every unit its own run: fragmented
    _evict(path)
    if not _cold(path, sorted(runs)[len(runs) // 2]):
        pytest.skip("the page cache here cannot be emptied of the image (tmpfs?)")
    return fmt, path, runs, per_request


def test_runs_announced_before_the_first_is_read(backwards, tmp_path):
    fmt, src, runs, per_request = backwards
    traces = _trace(tmp_path, src, fmt, [])
    fds = _source_fds(traces, src)
    assert fds, "the source was never opened?"
    fd_alt = "|".join(str(fd) for fd in fds)
    willneed = re.compile(r"^fadvise64\((%s), (\d+), (\d+), POSIX_FADV_WILLNEED\)" % fd_alt)
    pread = re.compile(r"^pread64\((%s), .*, (\d+), (\d+)\) = " % fd_alt)
    announced_together = 0
    data_preads = 0
    for lines in traces.values():
        pending = set()
        for line in lines:
            m = willneed.match(line)
            if m:
                pending.add(int(m.group(2)))
                announced_together = max(announced_together, len(pending))
                continue
            m = pread.match(line)
            if m and int(m.group(3)) in runs:
                off = int(m.group(3))
                data_preads += 1
                # a data run the cache did not hold was announced first
                assert off in pending, "data run at %d read without being announced:\n%s" % (
                    off, line)
                pending.discard(off)
    assert data_preads > 0, "no data run was read from the disk: was the cache cold?"
    # every run of a request the cache missed was announced before the first
    # was read (readahead of the image's metadata may have brought a few in)
    assert announced_together >= per_request // 2, announced_together


def test_direct_runs_submitted_together(backwards, tmp_path):
    fmt, src, runs, per_request = backwards
    traces = _trace(tmp_path, src, fmt, ["-T", "none"])
    lines = [ln for t in traces.values() for ln in t]
    if not any(re.match(r"^io_uring_setup\(.*\) = \d+", ln) for ln in lines):
        pytest.skip("no io_uring here: O_DIRECT runs are read one after another")
    submitted = [int(m.group(1)) for ln in lines
                 for m in [re.match(r"^io_uring_enter\(\d+, (\d+), ", ln)] if m]
    assert submitted and max(submitted) == per_request, submitted
