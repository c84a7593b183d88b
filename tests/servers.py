"""NBD servers for the tests: nbdkit and qemu-nbd, started on a private
Unix socket (or a TCP port) and always stopped, whatever the test does.

- :func:`nbdkit` and :func:`qemu_nbd` make a server; ``with`` starts it
  (returning once it accepts connections) and stops it on the way out, an
  exception or Ctrl-C included::

      with nbdkit("memory", "64M", "delay-write=5ms", filters=["delay"]) as srv:
          qemu_img("convert", "-n", "-O", "raw", src, srv.uri)
          assert srv.count("Write") > 0

- :class:`Nbdkit` reads its log filter: :meth:`Nbdkit.requests` (one
  :class:`Request` per NBD command), :meth:`Nbdkit.count`,
  :meth:`Nbdkit.bytes`, :meth:`Nbdkit.connections`; and, with
  ``stats=True``, the stats filter's summary (:meth:`Nbdkit.stats`,
  written when the server exits).
- the ``nbd_servers`` fixture starts servers that live until the test ends
  (import it into the test module: ``from .servers import nbd_servers``).
- :class:`NbdClient`: a few libnbd calls through ctypes, for requests no
  command-line client sends (an oversized write, a fast zero).
- ``needs_nbdkit``, ``needs_qemu_nbd``, ``needs_libnbd``, ``needs_nbd_tools``
  (nbdinfo and nbdcopy) skip a test whose tool is missing.

How a server is run: in the foreground (nbdkit ``-f``), in its own session
(the terminal's Ctrl-C reaches the test, whose ``finally`` stops it), killed
by the kernel if the thread that started it dies (nbdkit
``--exit-with-parent``; ``PR_SET_PDEATHSIG`` for qemu-nbd), stdout and
stderr into a file of its private directory.  It is ready when it has
written its pid file: both write it once they listen (nbdkit documents it;
qemu-nbd writes it right after its listener).  Stopping: SIGTERM to its
process group, SIGKILL after ``STOP_TIMEOUT`` seconds, always reaped; then
its log and stats are read and its directory (socket, pid file, log) is
removed.  Sockets live in a short private directory under ``socket_dir``
(default the temporary directory): ``sun_path`` holds 107 bytes.

Nothing here imports imgcopy.
"""

import atexit
import ctypes
import ctypes.util
import dataclasses
import datetime
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Dict, FrozenSet, List, NamedTuple, Optional, Sequence, Tuple, TypeVar

import pytest

from .oracles import NBDKIT, QEMU_NBD, command_line

NBDINFO = shutil.which("nbdinfo")
NBDCOPY = shutil.which("nbdcopy")

START_TIMEOUT = 20.0      # seconds until a server must listen
STOP_TIMEOUT = 5.0        # seconds between SIGTERM and SIGKILL
SETTLE_TIMEOUT = 10.0     # seconds for a log to show every request answered
SUN_PATH_MAX = 107        # bytes of a Unix socket's path


def _find_libnbd() -> Optional[str]:
    for name in (ctypes.util.find_library("nbd"), "libnbd.so.0"):
        if name:
            try:
                ctypes.CDLL(name)
                return name
            except OSError:
                pass
    return None


LIBNBD = _find_libnbd()

NO_NBDKIT = "nbdkit not found on PATH (apt-get install nbdkit)"
NO_QEMU_NBD = "qemu-nbd not found on PATH (apt-get install qemu-utils)"
NO_LIBNBD = "libnbd.so.0 not found (apt-get install libnbd0)"
NO_NBD_TOOLS = "nbdinfo/nbdcopy not found on PATH (apt-get install libnbd-bin)"

needs_nbdkit = pytest.mark.skipif(NBDKIT is None, reason=NO_NBDKIT)
needs_qemu_nbd = pytest.mark.skipif(QEMU_NBD is None, reason=NO_QEMU_NBD)
needs_libnbd = pytest.mark.skipif(LIBNBD is None, reason=NO_LIBNBD)
needs_nbd_tools = pytest.mark.skipif(NBDINFO is None or NBDCOPY is None, reason=NO_NBD_TOOLS)


class ServerError(AssertionError):
    """A server did not start, or stopped on its own: what ran, how it
    ended, the end of what it printed."""

    def __init__(self, server, why):
        self.server = server
        super().__init__("%s\n  %s\n  output: %s" % (
            command_line(server.argv), why, server.output()[-3000:].rstrip() or "(nothing)"))


# --------------------------------------------------------------------------
# nbdkit's log filter

# the NBD commands the log filter logs as "Kind id=N ... " / "...Kind id=N return=R"
REQUEST_KINDS = ("Read", "Write", "Zero", "Trim", "Flush", "Extents", "Cache")


@dataclasses.dataclass(frozen=True)
class Request:
    """One NBD command as nbdkit's log filter saw it.

    kind: Read, Write, Zero, Trim, Flush, Extents or Cache; offset and count
    are None for Flush; flags: the flags that were set, by the log's names
    (``fua``; for Zero ``trim`` = NBD_CMD_FLAG_NO_HOLE clear, i.e. may trim,
    and ``fast``; for Extents ``req_one``); error: the errno name (``EIO``)
    of a failed command, None otherwise; done: its answer was logged (a
    command still running, or cut off by a kill, has none); extents: for
    Extents, the answer as (offset, length, type) with type the log's
    words (``"hole,zero"``, ``""`` for data); start/end: the log's times
    (seconds since the epoch; end None while not done)."""
    connection: int
    id: int
    kind: str
    offset: Optional[int]
    count: Optional[int]
    flags: FrozenSet[str]
    error: Optional[str]
    done: bool
    extents: Optional[Tuple[Tuple[int, int, str], ...]]
    start: float
    end: Optional[float]

    @property
    def ok(self) -> bool:
        return self.done and self.error is None

    @property
    def seconds(self) -> Optional[float]:
        return None if self.end is None else self.end - self.start


_STAMP = r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+)"
_ENTER = re.compile(_STAMP + r" connection=(\d+) (%s) id=(\d+)(.*?) \.\.\.$" % "|".join(REQUEST_KINDS))
_LEAVE = re.compile(_STAMP + r" connection=(\d+) \.\.\.(\w+) id=(\d+)(.*)$")
_CONNECT = re.compile(_STAMP + r" connection=(\d+) Connect (.*)$")
_DISCONNECT = re.compile(_STAMP + r" connection=(\d+) Disconnect")
_KEYVAL = re.compile(r"(\w+)=(\S+)")


def _when(stamp: str) -> float:
    return datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S.%f").timestamp()


def _value(v: str):
    try:
        return int(v, 0)
    except ValueError:
        return shlex.split(v)[0] if v.startswith('"') else v


class LogParse(NamedTuple):
    requests: List[Request]
    connections: List[dict]      # the Connect lines: {"connection": N, "size": ..., "zero": ...}
    disconnected: List[int]      # connections whose Disconnect is logged


def parse_log(text: str) -> LogParse:
    """nbdkit log filter's file, parsed (lines it does not know are skipped;
    an unfinished last line too)."""
    started: Dict[Tuple[int, int], dict] = {}
    order: List[Tuple[int, int]] = []
    conns: List[dict] = []
    gone: List[int] = []
    for line in text.splitlines():
        m = _ENTER.match(line)
        if m:
            stamp, conn, kind, rid, rest = m.groups()
            args = {k: _value(v) for k, v in _KEYVAL.findall(rest)}
            key = (int(conn), int(rid))
            started[key] = dict(connection=key[0], id=key[1], kind=kind,
                                offset=args.pop("offset", None), count=args.pop("count", None),
                                flags=frozenset(k for k, v in args.items() if v == 1),
                                error=None, done=False, extents=None, start=_when(stamp), end=None)
            order.append(key)
            continue
        m = _LEAVE.match(line)
        if m:
            stamp, conn, kind, rid, rest = m.groups()
            r = started.get((int(conn), int(rid)))
            if r is None or r["kind"] != kind:
                continue
            r["done"], r["end"] = True, _when(stamp)
            e = re.search(r"error=(\w+)", rest)
            ret = re.search(r"return=(-?\d+)", rest)
            if e or (ret and int(ret.group(1)) < 0):
                r["error"] = e.group(1) if e else "error"
            x = re.search(r"extents=\((.*?)\)", rest)
            if x:
                w = shlex.split(x.group(1))
                r["extents"] = tuple((int(w[i], 0), int(w[i + 1], 0), w[i + 2])
                                     for i in range(0, len(w) - 2, 3))
            continue
        m = _CONNECT.match(line)
        if m:
            d = {k: _value(v) for k, v in _KEYVAL.findall(m.group(3))}
            d["connection"] = int(m.group(2))
            d["at"] = _when(m.group(1))
            conns.append(d)
            continue
        m = _DISCONNECT.match(line)
        if m:
            gone.append(int(m.group(2)))
    return LogParse([Request(**started[k]) for k in order], conns, gone)


_STATS_LINE = re.compile(r"^(\w+): (\d+) ops, ([0-9.]+) s, ([0-9.]+) (bytes|KiB|MiB|GiB|TiB)")
_UNIT = {"bytes": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


def parse_stats(text: str) -> Dict[str, dict]:
    """nbdkit stats filter's file: {"write": {"ops": N, "seconds": S, "bytes": B}, ...}
    ("total" too).  Its bytes are rounded (``264.00 KiB``): count exact bytes
    from the log filter."""
    out = {}
    for line in text.splitlines():
        m = _STATS_LINE.match(line)
        if m:
            name, ops, secs, amount, unit = m.groups()
            out[name] = {"ops": int(ops), "seconds": float(secs),
                         "bytes": int(round(float(amount) * _UNIT[unit]))}
    return out


# --------------------------------------------------------------------------
# servers

_LIVE: "set" = set()      # started and not yet stopped: stopped at exit, whatever happened


@atexit.register
def _stop_all_at_exit():
    for s in list(_LIVE):
        s.stop()


_libc = ctypes.CDLL(None, use_errno=True)
PR_SET_PDEATHSIG = 1


def _die_with_parent():
    """In the child before exec: SIGTERM when the thread that started us dies."""
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def _listening_tcp() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    s.listen(64)
    return s


class Server:
    """A server process on a private socket.  ``with`` starts and stops it;
    :meth:`start` and :meth:`stop` do it by hand (stop is idempotent).

    uri: ``nbd+unix:///EXPORT?socket=PATH`` (``nbd://127.0.0.1:PORT/EXPORT``
    with tcp=True); socket: the Unix socket's path (None with tcp); port:
    the TCP port (None without); pid; returncode once stopped; workdir: the
    private directory (gone once stopped)."""

    name = "server"

    def __init__(self, *, socket_dir=None, tcp=False, export="", start_timeout=START_TIMEOUT):
        self.socket_dir = os.fspath(socket_dir) if socket_dir is not None else None
        self.tcp = tcp
        self.export = export
        self.start_timeout = start_timeout
        self.workdir: Optional[str] = None
        self.socket: Optional[str] = None
        self.port: Optional[int] = None
        self.argv: List[str] = []
        self.proc: Optional[subprocess.Popen] = None
        self.returncode: Optional[int] = None
        self.exited_by_itself = False
        self._output = ""

    # -- what a subclass says
    def _server_argv(self, endpoint: List[str], pidfile: str) -> List[str]:
        raise NotImplementedError

    def _endpoint_args(self, path: str) -> List[str]:
        raise NotImplementedError

    def _collect(self):
        """Read what the server wrote (before its directory goes)."""

    # -- public
    @property
    def uri(self) -> str:
        if self.tcp:
            assert self.port is not None, "%s not started" % self.name
            return "nbd://127.0.0.1:%d/%s" % (self.port, self.export)
        return "nbd+unix:///%s?socket=%s" % (self.export, self.socket)

    @property
    def pid(self) -> Optional[int]:
        return None if self.proc is None else self.proc.pid

    @property
    def running(self) -> bool:
        return self.proc is not None and self.returncode is None and self.proc.poll() is None

    def path(self, name) -> str:
        assert self.workdir is not None, "%s not started" % self.name
        return os.path.join(self.workdir, name)

    def output(self) -> str:
        """What the server printed (stdout and stderr) so far."""
        if self.workdir and os.path.exists(self.path("output")):
            with open(self.path("output"), errors="replace") as f:
                return f.read()
        return self._output

    def start(self):
        assert self.proc is None, "%s started twice" % self.name
        self.workdir = tempfile.mkdtemp(prefix="nbd-", dir=self.socket_dir or _socket_root())
        _LIVE.add(self)
        try:
            self._launch()
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, timeout=STOP_TIMEOUT) -> Optional[int]:
        """SIGTERM, SIGKILL after `timeout` s, reaped; its files read and
        removed.  Returns the exit status (negative: the signal)."""
        try:
            if self.proc is not None and self.returncode is None:
                self.exited_by_itself = self.proc.poll() is not None
                self.returncode = _terminate(self.proc, timeout)
        finally:
            _LIVE.discard(self)
            if self.workdir is not None:
                try:
                    self._output = self.output()
                    self._collect()
                finally:
                    shutil.rmtree(self.workdir, ignore_errors=True)
                    self.workdir = None
        return self.returncode

    def __enter__(self):
        return self.start()

    def __exit__(self, exc_type, exc, tb):
        ours = self.returncode is None      # not stopped by the test itself
        self.stop()
        if exc_type is None and ours and self.exited_by_itself:
            raise ServerError(self, "%s exited by itself during the test (status %s)" % (
                self.name, self.returncode))
        return False

    # -- machinery
    def _launch(self):
        pidfile = self.path("pid")
        pass_fds: Tuple[int, ...] = ()
        listener = None
        if self.tcp:
            # socket activation: the port is ours before the server runs (no race for a
            # free port), listening already (no wait for readiness on it)
            listener = _listening_tcp()
            self.port = listener.getsockname()[1]
            pass_fds = (listener.fileno(),)
            prefix = [sys.executable, "-I", "-S", "-c", _ACTIVATE, str(listener.fileno())]
            endpoint: List[str] = []
        else:
            self.socket = self.path("sock")
            if len(os.fsencode(self.socket)) > SUN_PATH_MAX:
                raise ServerError(self, "socket path %s is longer than %d bytes: give a shorter "
                                  "socket_dir" % (self.socket, SUN_PATH_MAX))
            prefix, endpoint = [], self._endpoint_args(self.socket)
        self.argv = [str(a) for a in prefix + self._server_argv(endpoint, pidfile)]
        try:
            with open(self.path("output"), "wb") as out:
                self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=out,
                                             stderr=subprocess.STDOUT, pass_fds=pass_fds,
                                             start_new_session=True, preexec_fn=_die_with_parent)
        finally:
            if listener is not None:
                listener.close()

    def _wait_ready(self):
        deadline = time.monotonic() + self.start_timeout
        pidfile = self.path("pid")
        while True:
            if self.proc.poll() is not None:
                raise ServerError(self, "%s exited with status %d before it listened" % (
                    self.name, self.proc.returncode))
            if _read_pid(pidfile) == self.proc.pid:
                break
            if time.monotonic() > deadline:
                raise ServerError(self, "%s did not write its pid file in %.0f s" % (
                    self.name, self.start_timeout))
            time.sleep(0.005)
        if self.socket is not None and not os.path.exists(self.socket):
            raise ServerError(self, "%s is ready but %s does not exist" % (self.name, self.socket))


# socket activation (sd_listen_fds(3)): the listening socket as fd 3, LISTEN_PID our pid
# (kept by exec), then the server; sh's redirections take no fd above 9
_ACTIVATE = """import os, sys
fd = int(sys.argv[1])
if fd != 3:
    os.dup2(fd, 3)
    os.close(fd)
os.environ.update(LISTEN_PID=str(os.getpid()), LISTEN_FDS="1")
os.execvp(sys.argv[2], sys.argv[2:])
"""


def _socket_root() -> str:
    root = tempfile.gettempdir()
    # room for /nbd-XXXXXXXX/sock
    return root if len(os.fsencode(root)) <= SUN_PATH_MAX - 20 else "/tmp"


def _read_pid(path) -> Optional[int]:
    """The pid in a pid file, once written whole (the line ends)."""
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        return None
    return int(text) if text.endswith("\n") and text.strip().isdigit() else None


def _terminate(proc: subprocess.Popen, timeout: float) -> int:
    """SIGTERM to proc's process group (it leads one), SIGKILL after
    `timeout` s, and reap it, whatever interrupts us meanwhile."""
    if proc.poll() is not None:
        return proc.returncode
    try:
        _signal_group(proc, signal.SIGTERM)
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
    except BaseException:
        _signal_group(proc, signal.SIGKILL)
        proc.wait()
        raise
    _signal_group(proc, signal.SIGKILL)
    return proc.wait()


def _signal_group(proc: subprocess.Popen, sig):
    # the group id is the pid, still ours while the process is unreaped
    if proc.returncode is None:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass


class Nbdkit(Server):
    """An nbdkit server; see :func:`nbdkit`."""

    name = "nbdkit"

    def __init__(self, plugin, *args, filters=(), log=True, stats=False, extra=(), **kw):
        super().__init__(**kw)
        self.plugin = plugin
        self.args = [os.fspath(a) if isinstance(a, os.PathLike) else str(a) for a in args]
        self.filters = list(filters)
        self.log = log
        self.stats_enabled = stats
        self.extra = [str(a) for a in extra]
        self.log_path: Optional[str] = None
        self._log_text: Optional[str] = None
        self._stats_text: Optional[str] = None

    def _endpoint_args(self, path):
        return ["-U", path]

    def _server_argv(self, endpoint, pidfile):
        filters = list(self.filters)
        params = []
        # the log filter first (outermost): it sees what the client sent and what it got
        # back, after every other filter; "log" among `filters` puts it there instead
        if self.log:
            if "log" not in filters:
                filters.insert(0, "log")
            self.log_path = self.path("log")
            params.append("logfile=" + self.log_path)
        if self.stats_enabled:
            if "stats" not in filters:
                filters.insert(1 if self.log else 0, "stats")
            params.append("statsfile=" + self.path("stats"))
        return ([NBDKIT or "nbdkit", "-f", "--exit-with-parent", "-P", pidfile] + endpoint
                + (["-e", self.export] if self.export else []) + self.extra
                + ["--filter=" + f for f in filters] + [self.plugin] + self.args + params)

    def _collect(self):
        self._log_text = self._read("log") if self.log else None
        self._stats_text = self._read("stats") if self.stats_enabled else None

    def _read(self, name) -> Optional[str]:
        try:
            with open(self.path(name), errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return None

    # -- the log
    def log_text(self) -> str:
        assert self.log, "nbdkit started with log=False"
        text = self._read("log") if self.workdir else self._log_text
        return text or ""

    def parse(self, settle=True, timeout=SETTLE_TIMEOUT) -> LogParse:
        """The log, parsed.  While the server runs and `settle`, first wait
        until every logged command is answered and every connection closed
        (a client that has exited may still be closing: nbdkit logs its
        commands before it answers them, its Disconnect afterwards)."""
        if not (settle and self.running):
            return parse_log(self.log_text())
        deadline = time.monotonic() + timeout
        while True:
            p = parse_log(self.log_text())
            open_conns = {c["connection"] for c in p.connections} - set(p.disconnected)
            busy = [r for r in p.requests if not r.done]
            if not open_conns and not busy:
                return p
            if time.monotonic() > deadline:
                raise ServerError(self, "nbdkit's log did not settle in %.0f s: connections %s "
                                  "open, %d commands unanswered (a client still connected? "
                                  "requests(settle=False))" % (timeout, sorted(open_conns), len(busy)))
            time.sleep(0.005)

    def requests(self, kind=None, settle=True) -> List[Request]:
        """Every NBD command logged (of `kind` if given), in the order they started."""
        return [r for r in self.parse(settle).requests if kind is None or r.kind == kind]

    def connections(self, settle=True) -> List[dict]:
        """The Connect lines: what the server offered each client (size, minsize,
        prefsize, maxsize, write, flush, trim, zero, fua, extents, cache, fast_zero),
        and when ("at", seconds since the epoch)."""
        return self.parse(settle).connections

    def count(self, kind, ok=None, settle=True) -> int:
        """Commands of `kind`; ok=True: those that succeeded, ok=False: those that failed."""
        return sum(1 for r in self.requests(kind, settle) if ok is None or r.ok == ok)

    def bytes(self, kind, settle=True) -> int:
        """Bytes that the successful commands of `kind` covered."""
        return sum(r.count or 0 for r in self.requests(kind, settle) if r.ok)

    def summary(self, settle=True) -> Dict[str, Tuple[int, int]]:
        """{kind: (commands, bytes of the successful ones)} of the kinds logged."""
        out: Dict[str, Tuple[int, int]] = {}
        for r in self.requests(settle=settle):
            n, b = out.get(r.kind, (0, 0))
            out[r.kind] = (n + 1, b + (r.count or 0 if r.ok else 0))
        return out

    def stats(self) -> Dict[str, dict]:
        """The stats filter's summary (stats=True): nbdkit writes it when it
        exits, so only once stopped."""
        assert self.stats_enabled, "nbdkit started without stats=True"
        assert not self.running, "nbdkit writes its stats file when it exits: stop() first"
        if not self._stats_text:
            raise ServerError(self, "nbdkit left no stats file (killed? status %s)" % self.returncode)
        return parse_stats(self._stats_text)


class QemuNbd(Server):
    """A qemu-nbd server; see :func:`qemu_nbd`."""

    name = "qemu-nbd"

    def __init__(self, image, fmt="qcow2", read_only=False, allocation_depth=False, shared=0,
                 extra=(), **kw):
        super().__init__(**kw)
        self.image = os.fspath(image)
        self.fmt = fmt
        self.read_only = read_only
        self.allocation_depth = allocation_depth
        self.shared = shared
        self.extra = [str(a) for a in extra]

    def _endpoint_args(self, path):
        return ["-k", path]

    def _server_argv(self, endpoint, pidfile):
        # --persistent: it stays for the next client; --shared=0: any number at once
        # (nbdcopy opens several connections)
        argv = [QEMU_NBD or "qemu-nbd", "--persistent", "--shared=%d" % self.shared,
                "--pid-file=" + pidfile] + endpoint
        if self.export:
            argv += ["--export-name=" + self.export]
        if self.fmt:
            argv += ["--format=" + self.fmt]
        if self.read_only:
            argv.append("--read-only")
        if self.allocation_depth:
            argv.append("--allocation-depth")
        return argv + self.extra + [self.image]


def nbdkit(plugin, *args, filters: Sequence[str] = (), socket_dir=None, log=True, stats=False,
           extra: Sequence[str] = (), tcp=False, export="",
           start_timeout=START_TIMEOUT) -> Nbdkit:
    """``nbdkit -f --exit-with-parent -P PIDFILE -U SOCKET [EXTRA] --filter=...
    PLUGIN ARGS... [logfile=...] [statsfile=...]``, started by ``with``.

    args: the plugin's and the filters' parameters (``"64M"``,
    ``"delay-write=5ms"``); filters: in order, the first closest to the
    client; log: the log filter first of all (or where ``"log"`` stands in
    filters); stats: the stats filter after it; extra: server options
    (``["-r"]``, ``["--threads=4"]``); tcp: listen on 127.0.0.1 (a port
    taken by us and handed over by socket activation) instead of a Unix
    socket; export: the export name in the URI (nbdkit serves any name)."""
    if NBDKIT is None:
        pytest.skip(NO_NBDKIT)
    return Nbdkit(plugin, *args, filters=filters, log=log, stats=stats, extra=extra,
                  socket_dir=socket_dir, tcp=tcp, export=export, start_timeout=start_timeout)


def slow_export(size="20G", **kw) -> Nbdkit:
    """A source that takes long to copy and costs no disk: nbdkit's memory
    plugin behind noextents, so that every byte is data to read (zeros, in
    round trips: some 40 MB/s in 4 KiB requests), started by ``with``.
    What long copies are made of, now that zeros cost a copy next to
    nothing (fully allocated output allocates them in a few requests).
    One server thread (``--threads=1``): nbdkit before 1.33.10 (Debian 12
    has 1.32.5) asserts and dies when a client hangs up on replies its
    other threads still write (connections.c raw_send_socket), and a
    cancelled copy hangs up at once, by design."""
    extra = list(kw.pop("extra", ())) + ["--threads=1"]
    return nbdkit("memory", size, filters=["noextents"], log=False, extra=extra, **kw)


def qemu_nbd(image, fmt="qcow2", read_only=False, *, allocation_depth=False, shared=0,
             extra: Sequence[str] = (), socket_dir=None, tcp=False, export="",
             start_timeout=START_TIMEOUT) -> QemuNbd:
    """``qemu-nbd --persistent --shared=SHARED --pid-file=... -k SOCKET
    [--export-name=EXPORT] --format=FMT [--read-only] [--allocation-depth]
    [EXTRA] IMAGE``, started by ``with``.  allocation_depth: offer the
    ``qemu:allocation-depth`` meta context (0 absent, 1 this image, N the
    N-1th backing file)."""
    if QEMU_NBD is None:
        pytest.skip(NO_QEMU_NBD)
    return QemuNbd(image, fmt, read_only, allocation_depth=allocation_depth, shared=shared,
                   extra=extra, socket_dir=socket_dir, tcp=tcp, export=export,
                   start_timeout=start_timeout)


S = TypeVar("S", bound=Server)


class ServerPool:
    """Servers that live until :meth:`stop_all` (the ``nbd_servers`` fixture's teardown)."""

    def __init__(self):
        self.servers: List[Server] = []

    def _start(self, server: S) -> S:
        self.servers.append(server)
        return server.start()

    def nbdkit(self, plugin, *args, **kw) -> Nbdkit:
        return self._start(nbdkit(plugin, *args, **kw))

    def qemu_nbd(self, image, *args, **kw) -> QemuNbd:
        return self._start(qemu_nbd(image, *args, **kw))

    def stop_all(self):
        for s in reversed(self.servers):
            s.stop()


@pytest.fixture
def nbd_servers():
    """ServerPool: nbd_servers.nbdkit(...) / .qemu_nbd(...) return started
    servers, all stopped when the test ends."""
    pool = ServerPool()
    try:
        yield pool
    finally:
        pool.stop_all()


def server_children(names=("nbdkit", "qemu-nbd")) -> List[Tuple[int, str, str]]:
    """(pid, name, state) of this process's children called one of `names`,
    zombies included: after every server stopped, none."""
    me = os.getpid()
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d) as f:
                stat = f.read()
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may hold spaces and parentheses
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        state, ppid = stat[stat.rindex(")") + 2:].split()[:2]
        if int(ppid) == me and comm in names:
            out.append((int(d), comm, state))
    return out


# --------------------------------------------------------------------------
# a libnbd client

class NbdError(OSError):
    """A libnbd call failed: errno (EINVAL for a refused request, EIO...) and libnbd's message."""


class NbdClient:
    """One libnbd connection through ctypes: exactly the requests asked for,
    one at a time.  Use as a context manager (shutdown and close)."""

    FUA, NO_HOLE, DF, REQ_ONE, FAST_ZERO = 1, 2, 4, 8, 16

    def __init__(self, uri):
        if LIBNBD is None:
            pytest.skip(NO_LIBNBD)
        lib = self._lib = ctypes.CDLL(LIBNBD)
        h, u64, u32, sz = ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_size_t
        sigs = {"nbd_create": ([], h), "nbd_close": ([h], None), "nbd_get_error": ([], ctypes.c_char_p),
                "nbd_get_errno": ([], ctypes.c_int),
                "nbd_connect_uri": ([h, ctypes.c_char_p], ctypes.c_int),
                "nbd_shutdown": ([h, u32], ctypes.c_int), "nbd_get_size": ([h], ctypes.c_int64),
                "nbd_pread": ([h, ctypes.c_void_p, sz, u64, u32], ctypes.c_int),
                "nbd_pwrite": ([h, ctypes.c_char_p, sz, u64, u32], ctypes.c_int),
                "nbd_zero": ([h, u64, u64, u32], ctypes.c_int),
                "nbd_trim": ([h, u64, u64, u32], ctypes.c_int),
                "nbd_flush": ([h, u32], ctypes.c_int),
                "nbd_can_zero": ([h], ctypes.c_int), "nbd_can_fast_zero": ([h], ctypes.c_int),
                "nbd_get_block_size": ([h, ctypes.c_int], ctypes.c_int64)}
        for name, (args, res) in sigs.items():
            f = getattr(lib, name)
            f.argtypes, f.restype = args, res
        self.h = lib.nbd_create()
        if not self.h:
            self._fail("nbd_create")
        if hasattr(lib, "nbd_set_strict_mode"):     # libnbd >= 1.16 checks sizes itself
            lib.nbd_set_strict_mode.argtypes = [h, u32]
            lib.nbd_set_strict_mode(self.h, 0)
        self._check("nbd_connect_uri", self.h, uri.encode())

    def _fail(self, what):
        err = self._lib.nbd_get_error()
        raise NbdError(self._lib.nbd_get_errno(), "%s: %s" % (what, (err or b"?").decode()))

    def _check(self, name, *args) -> int:
        r = getattr(self._lib, name)(*args)
        if r < 0:
            self._fail(name)
        return r

    def size(self) -> int:
        return self._check("nbd_get_size", self.h)

    def block_size(self, which) -> int:
        """which: "minimum", "preferred" or "maximum" (0: the server says nothing)."""
        kinds = ("minimum", "preferred", "maximum")
        return self._check("nbd_get_block_size", self.h, kinds.index(which))

    def can_zero(self) -> bool:
        return bool(self._check("nbd_can_zero", self.h))

    def pread(self, count, offset, flags=0) -> bytes:
        buf = ctypes.create_string_buffer(count)
        self._check("nbd_pread", self.h, buf, count, offset, flags)
        return buf.raw

    def pwrite(self, data: bytes, offset, flags=0):
        self._check("nbd_pwrite", self.h, data, len(data), offset, flags)

    def zero(self, count, offset, flags=0):
        self._check("nbd_zero", self.h, count, offset, flags)

    def trim(self, count, offset, flags=0):
        self._check("nbd_trim", self.h, count, offset, flags)

    def flush(self):
        self._check("nbd_flush", self.h, 0)

    def close(self):
        if self.h:
            self._lib.nbd_shutdown(self.h, 0)
            self._lib.nbd_close(self.h)
            self.h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
