"""One rule decides what a copy reports: its outcome.  Until the destination
is committed, the progress callback (its 100% report included) and Ctrl-C
cancel the copy, and convert() raises with no new file in place; once it
is committed, convert() returns and the command exits 0, whenever a Ctrl-C
comes."""
import os
import random
import signal
import subprocess
import sys
import time

import pytest

import imgcopy

from .gen.sparse import make_sparse
from .oracles import qemu_img, qemu_info
from .units import MiB


class Stop(Exception):
    pass


@pytest.fixture
def small_source(tmp_path):
    """A copy that ends well within the first 100 ms progress interval."""
    src = str(tmp_path / "small.raw")
    make_sparse(src, 4 * MiB, [(0, b"\x11" * 65536), (2 * MiB, b"\x22" * 65536)])
    return src


def test_final_report_can_cancel_a_short_copy(tmp_path, small_source):
    calls = []

    def progress(done, total):
        calls.append((done, total))
        if done == total:
            raise Stop

    dst = str(tmp_path / "out.raw")
    with pytest.raises(Stop):
        imgcopy.convert(small_source, dst, progress=progress)
    assert calls and calls[-1] == (4 * MiB, 4 * MiB)
    assert not os.path.exists(dst)
    assert [n for n in os.listdir(str(tmp_path)) if n.startswith(".out.raw")] == []


def test_final_report_cancels_into_an_existing_qcow2(tmp_path, small_source):
    """-n writes in place: the image stays flagged, never looks complete."""
    dst = str(tmp_path / "existing.qcow2")
    qemu_img("create", "-f", "qcow2", dst, str(4 * MiB))

    def progress(done, total):
        if done == total:
            raise Stop

    with pytest.raises(Stop):
        imgcopy.convert(small_source, dst, dst_format="qcow2", create=False, progress=progress)
    assert qemu_info(dst)["format-specific"]["data"]["corrupt"] is True


def test_a_completed_copy_reports_100_percent_once(tmp_path, small_source):
    calls = []
    r = imgcopy.convert(small_source, str(tmp_path / "out.raw"),
                        progress=lambda d, t: calls.append((d, t)))
    assert calls.count((4 * MiB, 4 * MiB)) == 1 and calls[-1] == (4 * MiB, 4 * MiB)
    assert r.bytes_written + r.bytes_zeroed + r.bytes_skipped == 4 * MiB


def test_sigint_at_any_moment_agrees_with_the_destination(tmp_path, small_source, imgcopy_env):
    """SIGINT sent at random moments around the end of short copies: exit 0
    with the complete copy in place, or 130 with "interrupted" and nothing
    in place; never killed by the signal (-2), never 130 with a copy."""
    # the command line's main(), once Python has started and imported it
    # (a Ctrl-C during start-up is Python's, not the copy's); one that lands
    # between the handshake and main()'s own handler is answered as the
    # command's entry (imgcopy._program) answers it
    code = ("import os, sys\nfrom imgcopy.cli import main\n"
            "try:\n    os.write(1, b'R')\n    rc = main()\n"
            "except KeyboardInterrupt:\n"
            "    sys.stderr.write('imgcopy: interrupted\\n')\n    rc = 130\n"
            "sys.exit(rc)\n")

    def start(dst):
        proc = subprocess.Popen([sys.executable, "-c", code, "convert", small_source, dst],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=imgcopy_env)
        assert proc.stdout.read(1) == b"R"
        return proc

    # how long a copy runs on this machine now: signals fall before, during
    # and after it (however loaded the machine is)
    durations = []
    for i in range(3):
        t0 = time.monotonic()
        proc = start(str(tmp_path / ("timing%d.raw" % i)))
        proc.communicate(timeout=30)
        durations.append(time.monotonic() - t0)
    span = 1.5 * sorted(durations)[1]
    rng = random.Random(11)
    seen = set()
    for i in range(60):
        dst = str(tmp_path / ("out%d.raw" % i))
        proc = start(dst)
        time.sleep(rng.uniform(0.0, span))
        try:
            proc.send_signal(signal.SIGINT)
        except ProcessLookupError:
            pass
        out, err = proc.communicate(timeout=30)
        rc = proc.returncode
        seen.add(rc)
        assert rc in (0, 130), (rc, err)
        if rc == 0:
            assert os.path.exists(dst) and os.path.getsize(dst) == 4 * MiB, err
            with open(dst, "rb") as f:
                assert f.read(65536) == b"\x11" * 65536
        else:
            assert b"imgcopy: interrupted" in err
            assert not os.path.exists(dst), err
        leftovers = [n for n in os.listdir(str(tmp_path)) if ".imgcopy-" in n]
        assert leftovers == [], leftovers
    assert seen == {0, 130}, "the signals never fell on both sides of the end: %s" % seen
