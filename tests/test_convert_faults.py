"""imgcopy.convert() when things go wrong: missing files, write errors
(ENOSPC, EFBIG), read errors, cancellation from the progress callback and
from a signal.  Every failure raises (never looks like success), names the
right file, and leaves no worker thread behind (the workers are C threads:
/proc/self/task is counted, not threading.active_count())."""

import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from .convert_helpers import task_count, wait_task_count
from .gen.sparse import make_sparse, seeded_bytes
from .servers import slow_export
from .units import MiB

imgcopy = pytest.importorskip("imgcopy")


@pytest.fixture
def threads():
    """Checks after the test that the process has as many threads as before."""
    before = task_count()
    yield before
    after = wait_task_count(before)
    assert after == before, "threads left running: %d before, %d after" % (before, after)


class Boom(Exception):
    pass


# ---------------------------------------------------------------------------
# missing files

def test_missing_source(tmp_path, threads):
    src = str(tmp_path / "missing.raw")
    dst = tmp_path / "out.raw"
    with pytest.raises(FileNotFoundError) as ei:
        imgcopy.convert(src, str(dst))
    assert ei.value.filename == src
    assert ei.value.errno == errno.ENOENT
    assert not dst.exists(), "a destination was created for a missing source"


def test_missing_source_bytes_path(tmp_path, threads):
    src = os.fsencode(str(tmp_path / "missing.raw"))
    with pytest.raises(FileNotFoundError) as ei:
        imgcopy.convert(src, str(tmp_path / "out.raw"))
    assert os.fsencode(ei.value.filename) == src


def test_missing_destination_directory(tmp_path, threads):
    src = str(tmp_path / "src.raw")
    make_sparse(src, 1 * MiB, [(0, seeded_bytes(4096))])
    dst = str(tmp_path / "no" / "such" / "dir" / "out.raw")
    with pytest.raises(FileNotFoundError) as ei:
        imgcopy.convert(src, dst)
    assert ei.value.filename == dst
    assert not os.path.exists(os.path.dirname(dst))


def test_source_is_a_directory(tmp_path, threads):
    with pytest.raises(IsADirectoryError):
        imgcopy.convert(str(tmp_path), str(tmp_path / "out.raw"))
    assert not (tmp_path / "out.raw").exists()


def test_destination_is_a_directory(tmp_path, threads):
    src = str(tmp_path / "src.raw")
    make_sparse(src, 1 * MiB, [(0, seeded_bytes(4096))])
    d = tmp_path / "adir"
    d.mkdir()
    with pytest.raises(IsADirectoryError) as ei:
        imgcopy.convert(src, str(d))
    assert ei.value.filename == str(d)
    assert d.is_dir()


# ---------------------------------------------------------------------------
# write errors

@pytest.mark.parametrize("kind", ["data", "zeros-S0", "existing", "offload"])
def test_enospc(tmp_path, small_tmpfs, threads, kind):
    src = str(tmp_path / "src.raw")
    size = 16 * MiB
    dst = str(small_tmpfs / "out.raw")
    opts = {}
    if kind == "zeros-S0":
        make_sparse(src, size)                # all hole, written as zeros
        opts["sparse_threshold"] = 0
    else:
        make_sparse(src, size, [(0, seeded_bytes(size))])
    if kind == "existing":
        make_sparse(dst, size)
        opts["create"] = False
    if kind == "offload":
        opts["offload"] = True
    with pytest.raises(OSError) as ei:
        imgcopy.convert(src, dst, **opts)
    assert ei.value.errno == errno.ENOSPC, ei.value
    assert ei.value.filename == dst, ei.value


_EFBIG_SCRIPT = textwrap.dedent("""
    import json, os, resource, signal, sys
    import imgcopy
    src, dst, create, limit = sys.argv[1], sys.argv[2], sys.argv[3] == "1", int(sys.argv[4])
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    before = len(os.listdir("/proc/self/task"))
    try:
        imgcopy.convert(src, dst, create=create)
    except OSError as e:
        out = {"type": type(e).__name__, "errno": e.errno, "filename": e.filename,
               "message": str(e)}
    else:
        out = {"type": None}
    out["threads"] = [before, len(os.listdir("/proc/self/task"))]
    print(json.dumps(out))
""")


@pytest.mark.parametrize("create", [True, False], ids=["create", "existing"])
def test_efbig(tmp_path, imgcopy_env, create):
    src = str(tmp_path / "src.raw")
    size = 4 * MiB
    make_sparse(src, size, [(0, seeded_bytes(size))])
    dst = str(tmp_path / "out.raw")
    if not create:
        make_sparse(dst, size)  # made before the limit: only the writes fail
    p = subprocess.run([sys.executable, "-c", _EFBIG_SCRIPT, src, dst, "1" if create else "0",
                        str(1 * MiB)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, env=imgcopy_env, cwd=str(tmp_path), timeout=60)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["type"] is not None, "the copy succeeded past RLIMIT_FSIZE"
    assert out["errno"] == errno.EFBIG, out
    assert out["filename"] == dst, out
    assert out["threads"][0] == out["threads"][1], out


# ---------------------------------------------------------------------------
# read errors

def data_source(path, size):
    """A file of data, read 4 KiB at a time for a few tenths of a second
    (the pieces are one seeded MiB over and over)."""
    piece = seeded_bytes(MiB)
    make_sparse(path, size, [(off, piece) for off in range(0, size, MiB)])


def test_source_shrinks_during_copy(tmp_path, threads):
    """Data read 4 KiB at a time into null:, and the first progress call
    cuts the source to a quarter.  The planned reads past the cut then hit
    end of file."""
    src = str(tmp_path / "src.raw")
    size = 256 * MiB
    data_source(src, size)
    calls = []

    def progress(done, total):
        if not calls:
            os.truncate(src, size // 4)
        calls.append(done)

    try:
        imgcopy.convert(src, "null:", request_size=4096, progress=progress)
    except OSError as e:
        assert e.errno == errno.EIO, e
        assert e.filename == src, e
        assert "end of file" in str(e), e
    else:
        if calls and calls[0] < size - 4 * MiB:
            pytest.fail("the copy succeeded although its source was cut at %d bytes when "
                        "%d bytes were done" % (size // 4, calls[0]))
        pytest.skip("the copy read the data before the first progress call")


@pytest.mark.parametrize("offload", [False, True], ids=["rw", "offload"])
def test_source_shrinks_during_copy_to_file(tmp_path, threads, offload):
    """The same into a file, with reads in flight when the source is emptied."""
    src = str(tmp_path / "src.raw")
    size = 256 * MiB
    data_source(src, size)
    dst = str(tmp_path / "out.raw")
    calls = []

    def progress(done, total):
        if not calls:
            os.truncate(src, 0)
        calls.append(done)

    # 4 KiB at a time: the data slows it
    try:
        imgcopy.convert(src, dst, request_size=4096, concurrency=2,
                        flush=False, offload=offload, progress=progress)
    except OSError as e:
        assert e.errno == errno.EIO, e
        assert e.filename == src, e
    else:
        if calls and calls[0] < size - 4 * MiB:
            pytest.fail("the copy succeeded although its source was emptied at %d of %d "
                        "bytes" % (calls[0], size))
        pytest.skip("the copy finished before the first progress call")
    finally:
        if os.path.exists(dst):
            os.unlink(dst)


# ---------------------------------------------------------------------------
# cancellation

@pytest.fixture
def huge_hole():
    """20 GiB of data to read (an NBD export of zeros that cannot say so),
    4 KiB at a time: many seconds of copying."""
    with slow_export() as srv:
        yield srv.uri


SLOW = dict(request_size=4096)


CANCEL_MODES = {
    "default": {},
    "in-order": dict(out_of_order=False, concurrency=8),
    "one-thread": dict(concurrency=1),
    "direct": dict(direct=True),
}


@pytest.mark.parametrize("mode", sorted(CANCEL_MODES))
def test_progress_exception_cancels(huge_hole, threads, mode):
    raised = []

    def progress(done, total):
        if done > 0:
            raised.append(time.monotonic())
            raise Boom("stop at %d" % done)

    t0 = time.monotonic()
    with pytest.raises(Boom) as ei:
        imgcopy.convert(huge_hole, "null:", progress=progress, **SLOW, **CANCEL_MODES[mode])
    t1 = time.monotonic()
    assert len(raised) == 1, "progress called again after raising"
    assert t1 - raised[0] < 1.0, "cancel took %.2f s" % (t1 - raised[0])
    assert t1 - t0 < 5, t1 - t0
    assert str(ei.value).startswith("stop at ")


def test_progress_object_exception_cancels(huge_hole, threads):
    class Bar:
        def __init__(self):
            self.n = 0
            self.at = None

        def update(self, n):
            self.n += n
            if self.n > 0:
                self.at = time.monotonic()
                raise Boom("bar")

    bar = Bar()
    with pytest.raises(Boom):
        imgcopy.convert(huge_hole, "null:", progress=bar, **SLOW)
    assert time.monotonic() - bar.at < 1.0


def test_progress_exception_cancels_file_copy(huge_hole, tmp_path, threads):
    dst = str(tmp_path / "out.raw")
    raised = []

    def progress(done, total):
        raised.append(time.monotonic())
        raise Boom("first call")

    try:
        with pytest.raises(Boom):
            imgcopy.convert(huge_hole, dst, progress=progress)
        assert time.monotonic() - raised[0] < 1.0
        assert len(raised) == 1
    finally:
        if os.path.exists(dst):
            os.unlink(dst)


def test_progress_exception_at_the_end(tmp_path, threads):
    src = str(tmp_path / "src.raw")
    make_sparse(src, 1 * MiB, [(4096, seeded_bytes(4096))])

    def progress(done, total):
        if done == total:
            raise Boom("end")

    with pytest.raises(Boom):
        imgcopy.convert(src, str(tmp_path / "out.raw"), progress=progress)


def test_signal_cancels(huge_hole, threads):
    """A Python signal handler that raises cancels the copy like Ctrl-C."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals are handled in the main thread only")
    sent = []

    def handler(signum, frame):
        raise Boom("signal %d" % signum)

    def send():
        sent.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGUSR1)

    old = signal.signal(signal.SIGUSR1, handler)
    timer = threading.Timer(0.3, send)
    try:
        timer.start()
        with pytest.raises(Boom):
            imgcopy.convert(huge_hole, "null:", **SLOW)
        t1 = time.monotonic()
        assert sent and t1 - sent[0] < 1.0, "cancel took %.2f s" % (t1 - sent[0])
    finally:
        timer.cancel()
        timer.join()
        signal.signal(signal.SIGUSR1, old)


def test_errors_do_not_leak_threads_over_many_copies(tmp_path):
    src = str(tmp_path / "src.raw")
    make_sparse(src, 4 * MiB, [(0, seeded_bytes(1 * MiB))])
    before = task_count()
    for i in range(20):
        with pytest.raises(FileNotFoundError):
            imgcopy.convert(src, str(tmp_path / "nodir" / "x.raw"), concurrency=8)
        res = imgcopy.convert(src, "null:", concurrency=8)
        assert res.bytes_written + res.bytes_zeroed + res.bytes_skipped == 4 * MiB
    assert wait_task_count(before) == before


def test_failed_copy_is_not_success(tmp_path, small_tmpfs, threads):
    """A failure after a progress call must still raise: done < total."""
    src = str(tmp_path / "src.raw")
    make_sparse(src, 16 * MiB, [(0, seeded_bytes(16 * MiB))])
    dst = str(small_tmpfs / "out.raw")
    calls = []
    with pytest.raises(OSError):
        imgcopy.convert(src, dst, progress=lambda d, t: calls.append((d, t)))
    assert all(d < t for d, t in calls), "progress reported 100%% for a failed copy: %s" % calls
