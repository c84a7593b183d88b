"""A small nbdkit launcher for the benchmarks (they do not import tests/;
tests/servers.py is the full version): ``with NbdkitServer(...) as srv``
starts nbdkit on a private Unix socket, returns once it listens (its pid
file is written), and stops it on the way out, Ctrl-C included; the log
filter's file is counted by :meth:`NbdkitServer.totals`.

:func:`source_export` and :func:`target_export` build the two ends of a
copy with a round trip added by the delay filter (the log filter first, so
it counts what the client sent): a file served read-only with delayed reads
and block status, multi-conn or one serialising connection (VDDK-like), and
a memory disk with delayed writes and zeroes.

:class:`QemuNbdServer` serves a qcow2 image with qemu-nbd the same way (a
private socket, started once its pid file is written, always stopped): the
warm-copy benchmark's source, its dirty bitmap exported with ``-B NAME``."""
import ctypes
import ctypes.util
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from typing import Dict, List, Optional, Sequence, Tuple

# "connection=N Kind id=N offset=0x.. count=0x.. ..." (a command as it arrives)
_CMD = re.compile(r" connection=\d+ (\w+) id=\d+ offset=(0x[0-9a-f]+) count=(0x[0-9a-f]+)")
_DISCONNECT = re.compile(r" connection=\d+ Disconnect transactions=(\d+)")
# nbdkit's default --threads: requests handled at once on each connection
THREADS = 16


class NbdkitServer:
    """nbdkit -f --exit-with-parent -P PID -U SOCK [OPTIONS] --filter=log
    [--filter=F ...] PLUGIN ARGS... logfile=LOG, in its own session (the terminal's Ctrl-C
    goes to us; our finally stops it; if we are killed, --exit-with-parent)."""

    def __init__(self, plugin: str, args: Sequence[str] = (), filters: Sequence[str] = (),
                 timeout: float = 20.0, options: Sequence[str] = (), serialised: bool = False):
        self.dir = tempfile.mkdtemp(prefix="bench-nbd-", dir="/tmp")   # sun_path is short
        self.socket = os.path.join(self.dir, "sock")
        self.log = os.path.join(self.dir, "log")
        self.uri = "nbd+unix:///?socket=" + self.socket
        self.argv = (["nbdkit", "-f", "--exit-with-parent", "-P", os.path.join(self.dir, "pid"),
                      "-U", self.socket] + list(options) + ["--filter=log"]
                     + ["--filter=" + f for f in filters] + [plugin] + list(args) + ["logfile=" + self.log])
        self.timeout = timeout
        # serialised: one request at a time over all connections (noparallel
        # serialize=all-requests); else THREADS at a time on each connection
        self.serialised = serialised
        self.proc: Optional[subprocess.Popen] = None

    def __enter__(self):
        try:
            with open(os.path.join(self.dir, "output"), "wb") as out:
                self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=out,
                                             stderr=subprocess.STDOUT, start_new_session=True)
            self._until(self._listening, "nbdkit did not start")
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc):
        self.stop()
        return False

    def _listening(self) -> bool:
        p = self.proc
        assert p is not None
        if p.poll() is not None:
            raise RuntimeError("nbdkit exited (%d): %s\n%s" % (
                p.returncode, " ".join(self.argv), self.output()))
        try:
            with open(os.path.join(self.dir, "pid")) as f:
                return f.read().strip() == str(p.pid)
        except FileNotFoundError:
            return False

    def _until(self, cond, what):
        deadline = time.monotonic() + self.timeout
        while not cond():
            if time.monotonic() > deadline:
                raise RuntimeError("%s in %.0f s: %s" % (what, self.timeout, self.output()))
            time.sleep(0.005)

    def output(self) -> str:
        try:
            with open(os.path.join(self.dir, "output"), errors="replace") as f:
                return f.read()[-2000:]
        except FileNotFoundError:
            return ""

    def _log_text(self) -> str:
        try:
            with open(self.log, errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def _closed(self) -> bool:
        text = self._log_text()
        return text.count(" Connect ") == text.count(" Disconnect ")

    def totals(self) -> Tuple[int, Dict[str, List[int]]]:
        """(connections, {kind: [commands, bytes]}) once every client has
        disconnected (nbdkit logs a Disconnect after the client has gone)."""
        self._until(self._closed, "a client is still connected")
        text = self._log_text()
        out: Dict[str, List[int]] = {}
        for kind, _off, count in _CMD.findall(text):
            t = out.setdefault(kind, [0, 0])
            t[0] += 1
            t[1] += int(count, 16)
        return text.count(" Connect "), out

    def active_connections(self) -> int:
        """Connections that sent at least one request (qemu-img probes first)."""
        self._until(self._closed, "a client is still connected")
        return sum(1 for n in _DISCONNECT.findall(self._log_text()) if int(n) > 0)

    def cpu_seconds(self) -> float:
        """The server's CPU time so far (user + system, its threads included;
        0.0 once it is gone)."""
        p = self.proc
        try:
            with open("/proc/%d/stat" % p.pid) as f:   # type: ignore[union-attr]
                fields = f.read().rsplit(")", 1)[1].split()
        except (AttributeError, OSError, IndexError):
            return 0.0
        # utime and stime: fields 14 and 15 of stat, 12 and 13 after the name
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def server_concurrency(self, connections: int) -> int:
        """Requests the server can have in progress at once for a client that
        used `connections` connections."""
        return 1 if self.serialised else THREADS * max(1, connections)

    def stop(self):
        """SIGTERM, SIGKILL after 5 s, reaped; the directory removed."""
        p, self.proc = self.proc, None
        try:
            if p is not None and p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                try:
                    p.wait(5)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
        except BaseException:
            if p is not None and p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
            raise
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


def source_export(path: str, delay_ms: float, single: bool = False) -> NbdkitServer:
    """`path` served read-only by the file plugin, every read and block-status
    request delayed `delay_ms`.  single: one connection (multi-conn not
    offered) and one request at a time over all connections, as a VDDK
    source serves (noparallel serialize=all-requests)."""
    filters, args = [], ["file=" + path]
    if single:
        filters += ["noparallel", "multi-conn"]
        args += ["serialize=all-requests", "multi-conn-mode=disable"]
    filters.append("delay")
    args += ["delay-read=%gms" % delay_ms, "delay-extents=%gms" % delay_ms]
    return NbdkitServer("file", args, filters=filters, options=["-r"],
                        serialised=single)


def target_export(size: int, delay_ms: float) -> NbdkitServer:
    """A fresh all-zero memory disk of `size` bytes, every write, zero and
    trim request delayed `delay_ms` (multi-conn, nbdkit's threads)."""
    return NbdkitServer("memory", [str(size), "delay-write=%gms" % delay_ms,
                                   "delay-zero=%gms" % delay_ms, "delay-trim=%gms" % delay_ms],
                        filters=["delay"])


_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the benchmark dies (qemu-nbd
    has no --exit-with-parent)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


class QemuNbdServer(NbdkitServer):
    """qemu-nbd --persistent --shared=0 --pid-file=PID -k SOCK [-r] [-B NAME ...]
    -f FMT IMAGE, in its own session, stopped as nbdkit is (SIGTERM, then
    SIGKILL); no log filter, so no :meth:`totals`.  --persistent: it serves
    client after client; --shared=0: any number at once (nbdcopy and imgcopy
    open several connections)."""

    def __init__(self, image: str, fmt: str = "qcow2", read_only: bool = True,
                 bitmaps: Sequence[str] = (), timeout: float = 20.0):
        super().__init__("", timeout=timeout)
        self.argv = (["qemu-nbd", "--persistent", "--shared=0",
                      "--pid-file=" + os.path.join(self.dir, "pid"), "-k", self.socket,
                      "--format=" + fmt] + (["--read-only"] if read_only else [])
                     + [a for name in bitmaps for a in ("-B", name)] + [image])

    def __enter__(self):
        try:
            with open(os.path.join(self.dir, "output"), "wb") as out:
                self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=out,
                                             stderr=subprocess.STDOUT, start_new_session=True,
                                             preexec_fn=_die_with_parent)
            self._until(self._listening, "qemu-nbd did not start")
        except BaseException:
            self.stop()
            raise
        return self

    def totals(self):
        raise NotImplementedError("qemu-nbd keeps no request log")
