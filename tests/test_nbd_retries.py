"""Reconnecting (issue 27): a copy with ``retries`` survives its NBD server
being killed and started again on the same socket, sending again what was
left unanswered; an error the server answers is never retried."""
import errno
import os
import random
import shutil
import signal
import subprocess
import tempfile
import threading
import time

import pytest

import imgcopy

from .oracles import assert_same_content
from .servers import NBDKIT, nbdkit

pytestmark = pytest.mark.skipif(NBDKIT is None, reason="needs nbdkit")

MiB = 1 << 20


class Restartable:
    """nbdkit on a socket of our own, killed and started again at will
    (always stopped at the end)."""

    def __init__(self, *args):
        self.dir = tempfile.mkdtemp(prefix="nbdr-", dir="/tmp")
        self.socket = os.path.join(self.dir, "sock")
        self.args = list(args)
        self.proc = None

    @property
    def uri(self):
        return "nbd+unix:///?socket=" + self.socket

    def start(self, *extra):
        if os.path.exists(self.socket):
            os.unlink(self.socket)
        pid = os.path.join(self.dir, "pid")
        if os.path.exists(pid):
            os.unlink(pid)
        self.proc = subprocess.Popen([NBDKIT, "-f", "--exit-with-parent", "-P", pid, "-U",
                                      self.socket, *extra, *self.args],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while not (os.path.exists(pid) and os.path.getsize(pid)):
            assert self.proc.poll() is None and time.monotonic() < deadline, "nbdkit did not start"
            time.sleep(0.02)

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


def random_file(path, size, seed):
    with open(path, "wb") as f:
        f.write(random.Random(seed).randbytes(size))
    return path


def copy_in_thread(**kw):
    out = {}

    def run():
        try:
            out["result"] = imgcopy.convert(**kw)
        except BaseException as exc:  # reported by the test
            out["error"] = exc

    t = threading.Thread(target=run)
    t.start()
    return t, out


def test_target_killed_and_started_again(tmp_path):
    src = random_file(tmp_path / "src.raw", 32 * MiB, 1)
    dst = tmp_path / "dst.raw"
    with open(dst, "wb") as f:
        f.truncate(32 * MiB)
    with Restartable("--filter=delay", "file", str(dst), "delay-write=100ms") as srv:
        # one thread: nbdkit before 1.33.10 dies of clients that hang up
        srv.start("--threads=1")
        t, out = copy_in_thread(src=src, dst=srv.uri, create=False, dst_format="raw",
                                request_size="256k", retries=10, retry_delay=0.1)
        time.sleep(1.0)
        srv.kill()
        time.sleep(0.5)
        srv.start("--threads=1")
        t.join(120)
        assert not t.is_alive()
        assert "error" not in out, out.get("error")
    assert_same_content(src, dst, "raw", "raw")


def test_source_killed_and_started_again(tmp_path):
    src = random_file(tmp_path / "src.raw", 32 * MiB, 2)
    dst = tmp_path / "dst.raw"
    with Restartable("-r", "--filter=delay", "file", str(src), "delay-read=100ms") as srv:
        srv.start("--threads=1")
        t, out = copy_in_thread(src=srv.uri, dst=dst, src_format="raw", request_size="256k",
                                retries=10, retry_delay=0.1, checksum=True)
        time.sleep(1.0)
        srv.kill()
        time.sleep(0.5)
        srv.start("--threads=1")
        t.join(120)
        assert not t.is_alive()
        assert "error" not in out, out.get("error")
    assert_same_content(src, dst, "raw", "raw")
    assert out["result"].checksum == imgcopy.checksum(src)


def test_server_gone_for_good_fails_after_the_retries(tmp_path):
    src = random_file(tmp_path / "src.raw", 16 * MiB, 3)
    dst = tmp_path / "dst.raw"
    with open(dst, "wb") as f:
        f.truncate(16 * MiB)
    with Restartable("--filter=delay", "file", str(dst), "delay-write=100ms") as srv:
        srv.start("--threads=1")
        t, out = copy_in_thread(src=src, dst=srv.uri, create=False, dst_format="raw",
                                request_size="256k", retries=3, retry_delay=0.05)
        time.sleep(0.7)
        srv.kill()
        t0 = time.monotonic()
        t.join(60)
        assert not t.is_alive()
    assert isinstance(out.get("error"), OSError), out
    assert out["error"].filename == srv.uri and "offset" in str(out["error"])
    assert time.monotonic() - t0 < 30


def test_answered_errors_are_not_retried(tmp_path):
    src = random_file(tmp_path / "src.raw", 4 * MiB, 4)
    with nbdkit("memory", "4M", "error-pwrite=ENOSPC", "error-pwrite-rate=100%",
                filters=["error"]) as srv:
        t0 = time.monotonic()
        with pytest.raises(OSError) as e:
            imgcopy.convert(src, srv.uri, create=False, dst_format="raw", retries=5,
                            retry_delay=2)
        assert time.monotonic() - t0 < 5
        assert e.value.errno == errno.ENOSPC
        assert srv.count("Write") <= 64  # each sent once
