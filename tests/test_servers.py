"""The NBD servers of tests/servers.py, checked with real clients (qemu-img,
nbdinfo, nbdcopy, libnbd through ctypes; never imgcopy): what the log filter
records is what was sent, the filters do what the NBD tests will rely on,
and every server is stopped and reaped whatever happens."""

import datetime
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from .gen.sparse import make_sparse, seeded_bytes
from .oracles import assert_same_content, needs_qemu, qemu_img, qemu_io, run
from .servers import (NBDCOPY, NBDINFO, NbdClient, NbdError, ServerError, needs_libnbd,
                      needs_nbd_tools, needs_nbdkit, needs_qemu_nbd, nbd_servers, nbdkit,  # noqa: F401
                      parse_log, qemu_nbd, server_children)
from .units import KiB, MiB

pytestmark = needs_nbdkit

SIZE = 8 * MiB
# the source of the copy tests: data runs (random bytes, no zero block) and holes
DATA_RUNS = [(0, 64 * KiB), (1 * MiB, 192 * KiB), (3 * MiB + 64 * KiB, 1 * MiB),
             (SIZE - 128 * KiB, 128 * KiB)]


@pytest.fixture
def source(tmp_path):
    path = str(tmp_path / "src.raw")
    make_sparse(path, SIZE, [(off, seeded_bytes(n, seed=off)) for off, n in DATA_RUNS])
    return path


def ranges(requests):
    """[(start, end)] of the requests, sorted, neighbours merged."""
    out = []
    for r in sorted(requests, key=lambda r: r.offset):
        if out and out[-1][1] == r.offset:
            out[-1][1] = r.offset + r.count
        else:
            out.append([r.offset, r.offset + r.count])
    return [tuple(x) for x in out]


def assert_tiles(writes, zeros, size):
    """Writes and zero requests cover [0, size) exactly once."""
    spans = sorted((r.offset, r.offset + r.count) for r in writes + zeros)
    pos = 0
    for a, b in spans:
        assert a == pos, "gap or overlap at %d: next request covers [%d, %d)" % (pos, a, b)
        pos = b
    assert pos == size, "requests end at %d, the export at %d" % (pos, size)


# --------------------------------------------------------------------------
# the log filter

@needs_libnbd
def test_log_records_exactly_what_a_client_sent():
    """Request by request, the log is what libnbd sent: kind, offset, count,
    flags, answer; the counters and the stats filter agree with it."""
    with nbdkit("memory", "1M", stats=True) as srv:
        with NbdClient(srv.uri) as c:
            assert c.size() == MiB
            c.pwrite(b"a" * 4096, 0)
            c.pwrite(b"b" * 512, 8192, NbdClient.FUA)
            c.zero(64 * KiB, 64 * KiB)
            c.zero(4096, 256 * KiB, NbdClient.NO_HOLE | NbdClient.FAST_ZERO)
            assert c.pread(4, 8192) == b"bbbb"
            c.trim(4096, 512 * KiB)
            c.flush()
            # answered requests are logged before the answer: visible while connected
            seen = [(r.kind, r.offset, r.count) for r in srv.requests(settle=False)]
            assert len(seen) == 7, seen
        got = [(r.kind, r.offset, r.count, sorted(r.flags), r.ok) for r in srv.requests()]
        assert got == [
            ("Write", 0, 4096, [], True),
            ("Write", 8192, 512, ["fua"], True),
            ("Zero", 64 * KiB, 64 * KiB, ["trim"], True),         # trim: may punch a hole
            ("Zero", 256 * KiB, 4096, ["fast"], True),            # NO_HOLE: no trim flag
            ("Read", 8192, 4, [], True),
            ("Trim", 512 * KiB, 4096, [], True),
            ("Flush", None, None, [], True),
        ], got
        assert srv.count("Write") == 2 and srv.bytes("Write") == 4096 + 512
        assert srv.count("Zero") == 2 and srv.bytes("Zero") == 64 * KiB + 4096
        assert srv.summary() == {"Write": (2, 4608), "Zero": (2, 68 * KiB), "Read": (1, 4),
                                 "Trim": (1, 4096), "Flush": (1, 0)}, srv.summary()
        conn, = srv.connections()
        assert conn["size"] == MiB and conn["zero"] > 0 and conn["fast_zero"] == 1, conn
    assert srv.returncode == 0, srv.output()
    stats = srv.stats()
    for kind, ops in (("write", 2), ("zero", 2), ("read", 1), ("trim", 1), ("flush", 1)):
        assert stats[kind]["ops"] == ops, (kind, stats)
    # the log outlives the server
    assert srv.count("Write") == 2


def test_parse_log_failed_and_unanswered_requests():
    text = "\n".join([
        "2026-01-01 00:00:00.000001 connection=2 Connect export=\"\" size=0x1000 zero=0",
        "2026-01-01 00:00:00.000002 connection=2 Write id=1 offset=0x200 count=0x200 fua=0 ...",
        "2026-01-01 00:00:00.000003 connection=2 Extents id=2 offset=0x0 count=0x1000 req_one=1 ...",
        "2026-01-01 00:00:00.000004 connection=2 ...Write id=1 return=-1 error=EIO",
        "2026-01-01 00:00:00.000005 connection=2 ...Extents id=2 extents=(0x0 0x800 \"\" "
        "0x800 0x800 \"hole,zero\") return=0",
        "2026-01-01 00:00:00.250000 connection=2 Read id=3 offset=0x0 count=0x10 ...",
        "2026-01-01 00:00:00.300000 connection=2 Disconnect transactions=3",
        "2026-01-01 00:00:00.300001 connection=3 Write id=1 offset=",    # cut off by a kill
    ])
    p = parse_log(text)
    w, x, r = p.requests
    assert (w.kind, w.offset, w.count, w.error, w.done, w.ok) == ("Write", 512, 512, "EIO", True, False)
    assert x.extents == ((0, 2048, ""), (2048, 2048, "hole,zero")) and x.flags == {"req_one"}
    assert (r.done, r.ok, r.end, r.seconds) == (False, False, None, None)
    assert abs(w.seconds - 2e-6) < 1e-6, w
    at = datetime.datetime(2026, 1, 1, 0, 0, 0, 1).timestamp()
    assert p.connections == [{"connection": 2, "export": "", "size": 4096, "zero": 0, "at": at}]
    assert p.disconnected == [2]


@needs_qemu
@needs_nbd_tools
@pytest.mark.parametrize("tool", ["qemu-img", "nbdcopy"])
def test_copy_into_memory_export(source, tool):
    """qemu-img convert -n / nbdcopy into a memory export: the logged writes
    are the source's data runs, writes and zeroes tile the export, one flush
    at least, and the export holds the source."""
    with nbdkit("memory", str(SIZE), stats=True) as srv:
        if tool == "qemu-img":
            qemu_img("convert", "-n", "-f", "raw", "-O", "raw", source, srv.uri)
        else:
            run([NBDCOPY, source, srv.uri])
        reqs = srv.requests()
        writes, zeros = srv.requests("Write"), srv.requests("Zero")
        assert all(r.ok for r in reqs), [r for r in reqs if not r.ok]
        assert ranges(writes) == [(o, o + n) for o, n in DATA_RUNS], ranges(writes)
        assert_tiles(writes, zeros, SIZE)
        assert srv.bytes("Write") == sum(n for _, n in DATA_RUNS)
        if tool == "qemu-img":
            assert srv.count("Flush") >= 1      # nbdcopy flushes only with --flush
        assert_same_content(source, srv.uri, "raw", "raw")
        n_writes, n_zeros = len(writes), len(zeros)
    stats = srv.stats()
    assert stats["write"]["ops"] == n_writes and stats["zero"]["ops"] == n_zeros, stats


# --------------------------------------------------------------------------
# filters

@needs_libnbd
@needs_qemu
def test_blocksize_policy_rejects_oversized_requests(source):
    """blocksize-maximum=64K with blocksize-error-policy=error: the limit is
    advertised, a 128 KiB write fails with EINVAL (logged as such, nothing
    written), and qemu-img, which honours the limit, copies in <= 64 KiB writes."""
    with nbdkit("memory", str(SIZE), "blocksize-maximum=64K", "blocksize-error-policy=error",
                filters=["blocksize-policy"]) as srv:
        with NbdClient(srv.uri) as c:
            assert c.block_size("maximum") == 64 * KiB
            with pytest.raises(NbdError) as e:
                c.pwrite(b"x" * (128 * KiB), 0)
            assert e.value.errno == 22, e.value
            c.pwrite(b"y" * (64 * KiB), 0)
            assert c.pread(1, 64 * KiB) == b"\0", "the refused write changed the export"
        big, ok = srv.requests("Write")
        assert (big.count, big.error) == (128 * KiB, "EINVAL"), big
        assert (ok.count, ok.error) == (64 * KiB, None), ok
        assert srv.connections()[0]["maxsize"] == 64 * KiB
    with nbdkit("memory", str(SIZE), "blocksize-maximum=64K", "blocksize-error-policy=error",
                filters=["blocksize-policy"]) as srv:
        qemu_img("convert", "-n", "-f", "raw", "-O", "raw", source, srv.uri)
        reqs = srv.requests()
        assert all(r.ok for r in reqs), [r for r in reqs if not r.ok][:3]
        assert max(r.count for r in srv.requests("Write")) <= 64 * KiB
        assert srv.bytes("Write") == sum(n for _, n in DATA_RUNS)


@needs_libnbd
def test_delay_filter_delays_each_write():
    """delay-write=20ms: every write is answered 20 ms or more after it came
    (the log filter, outermost, brackets the delay); reads are not delayed
    (no bound on them: the machine may be slow)."""
    delay = 0.020
    with nbdkit("memory", "1M", "delay-write=20ms", filters=["delay"]) as srv:
        with NbdClient(srv.uri) as c:
            t0 = time.monotonic()
            for i in range(5):
                c.pwrite(b"d" * 4096, i * 4096)
            elapsed = time.monotonic() - t0
            c.pread(4096, 0)
        writes = srv.requests("Write")
        assert len(writes) == 5
        assert all(r.seconds >= delay for r in writes), [r.seconds for r in writes]
        assert elapsed >= 5 * delay, elapsed


@needs_libnbd
def test_error_filter_injects_eio_at_a_rate(tmp_path):
    """error-pwrite-rate=50%: about half the writes fail with EIO; the client
    sees exactly the failures the log shows.  error-pwrite-file: errors only
    while the file exists."""
    n = 200
    with nbdkit("memory", "1M", "error-pwrite=EIO", "error-pwrite-rate=50%", filters=["error"]) as srv:
        failed = []
        with NbdClient(srv.uri) as c:
            for i in range(n):
                try:
                    c.pwrite(b"e" * 512, i * 512)
                except NbdError as e:
                    assert e.errno == 5, e
                    failed.append(i * 512)
        logged = [r.offset for r in srv.requests("Write") if r.error == "EIO"]
        assert logged == failed, "the client and the log disagree on which writes failed"
        # binomial(200, 0.5): outside [40, 160] with probability < 1e-17
        assert 40 <= len(failed) <= 160, len(failed)
        assert srv.count("Write", ok=True) == n - len(failed)

    trigger = tmp_path / "fail-now"
    with nbdkit("memory", "1M", "error-pwrite-rate=100%", "error-pwrite-file=%s" % trigger,
                filters=["error"]) as srv:
        with NbdClient(srv.uri) as c:
            c.pwrite(b"1" * 512, 0)
            trigger.touch()
            with pytest.raises(NbdError):
                c.pwrite(b"2" * 512, 512)
            trigger.unlink()
            c.pwrite(b"3" * 512, 1024)
        assert [r.ok for r in srv.requests("Write")] == [True, False, True]


@needs_qemu
@needs_libnbd
def test_nozero_filter_removes_write_zeroes(source):
    """The nozero filter: WRITE_ZEROES is not offered, so qemu-img writes the
    holes as data: no Zero request, every byte of the export written."""
    with nbdkit("memory", str(SIZE), filters=["nozero"]) as srv:
        with NbdClient(srv.uri) as c:
            assert not c.can_zero()
        qemu_img("convert", "-n", "-f", "raw", "-O", "raw", source, srv.uri)
        assert srv.count("Zero") == 0, srv.summary()
        assert srv.bytes("Write") == SIZE, srv.summary()
        assert all(conn["zero"] == 0 for conn in srv.connections()), srv.connections()
        assert_same_content(source, srv.uri, "raw", "raw")


# --------------------------------------------------------------------------
# qemu-nbd

@needs_qemu
@needs_qemu_nbd
@needs_nbd_tools
def test_qemu_nbd_backing_chain_maps(tmp_path, nbd_servers):
    """A qcow2 overlay over a qcow2 base: base:allocation shows data and the
    overlay's zeroes; qemu:allocation-depth (allocation_depth=True) says
    where each range lives; without it the context is not offered."""
    base, top = str(tmp_path / "base.qcow2"), str(tmp_path / "top.qcow2")
    qemu_img("create", "-q", "-f", "qcow2", base, "4M")
    qemu_io(base, ["write -P 1 0 1M"], fmt="qcow2")
    qemu_img("create", "-q", "-f", "qcow2", "-b", base, "-F", "qcow2", top)
    qemu_io(top, ["write -P 2 2M 512k", "write -z 512k 64k"], fmt="qcow2")

    srv = nbd_servers.qemu_nbd(top, read_only=True, allocation_depth=True)
    alloc = json.loads(run([NBDINFO, "--map", "--json", srv.uri]).stdout)
    depth = json.loads(run([NBDINFO, "--map=qemu:allocation-depth", "--json", srv.uri]).stdout)
    K = KiB
    assert [(e["offset"], e["length"], e["type"]) for e in alloc] == [
        (0, 512 * K, 0), (512 * K, 64 * K, 3), (576 * K, 448 * K, 0), (1024 * K, 1024 * K, 3),
        (2048 * K, 512 * K, 0), (2560 * K, 1536 * K, 3)], alloc
    assert [(e["offset"], e["length"], e["type"]) for e in depth] == [
        (0, 512 * K, 2), (512 * K, 64 * K, 1), (576 * K, 448 * K, 2), (1024 * K, 1024 * K, 0),
        (2048 * K, 512 * K, 1), (2560 * K, 1536 * K, 0)], depth
    assert_same_content(top, srv.uri, "qcow2", "raw")

    plain = nbd_servers.qemu_nbd(top, read_only=True)
    p = run([NBDINFO, "--map=qemu:allocation-depth", plain.uri], check=False)
    assert p.returncode != 0 and "allocation-depth" in p.stderr, p


@needs_nbd_tools
@needs_qemu_nbd
def test_tcp_servers(tmp_path, nbd_servers):
    """tcp=True: nbd://127.0.0.1:PORT/ by socket activation, both servers."""
    img = str(tmp_path / "disk.raw")
    make_sparse(img, 3 * MiB)
    for srv in (nbd_servers.nbdkit("memory", "2M", tcp=True),
                nbd_servers.qemu_nbd(img, fmt="raw", tcp=True)):
        assert srv.uri.startswith("nbd://127.0.0.1:") and srv.socket is None, srv.uri
        size = run([NBDINFO, "--size", srv.uri]).stdout.strip()
        assert size == str(2 * MiB if srv.name == "nbdkit" else 3 * MiB), (srv.name, size)


# --------------------------------------------------------------------------
# start and stop

def assert_no_leftovers(socket_dir, pids):
    """No server process of ours (zombie or not) and nothing in socket_dir."""
    assert server_children() == [], "children left: %s" % server_children()
    for pid in pids:
        assert not os.path.exists("/proc/%d" % pid) or _ppid(pid) != os.getpid(), pid
    left = os.listdir(socket_dir)
    assert left == [], "left in %s: %s" % (socket_dir, left)


def _ppid(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


@needs_nbd_tools
@needs_qemu_nbd
def test_twenty_servers_leave_nothing(tmp_path):
    socks = tmp_path / "s"
    socks.mkdir()
    img = str(tmp_path / "disk.raw")
    make_sparse(img, MiB)
    pids = []
    for i in range(20):
        srv = (nbdkit("memory", "1M", socket_dir=socks) if i % 2 == 0
               else qemu_nbd(img, fmt="raw", socket_dir=socks))
        with srv:
            pids.append(srv.pid)
            assert os.path.exists(srv.socket)
            assert run([NBDINFO, "--size", srv.uri]).stdout.strip() == str(MiB)
        assert srv.returncode == 0, (srv.name, srv.returncode, srv.output())
        assert not os.path.exists(srv.socket)
    assert len(set(pids)) == 20
    assert_no_leftovers(socks, pids)


@pytest.mark.parametrize("exc", [RuntimeError, KeyboardInterrupt])
def test_server_stopped_when_the_body_raises(tmp_path, exc):
    socks = tmp_path / "s"
    socks.mkdir()
    with pytest.raises(exc):
        with nbdkit("memory", "1M", socket_dir=socks) as srv:
            pid = srv.pid
            raise exc("the test failed")
    assert srv.returncode == 0 and not srv.running
    assert_no_leftovers(socks, [pid])


def test_fixture_pool_stops_everything(tmp_path):
    from .servers import ServerPool
    socks = tmp_path / "s"
    socks.mkdir()
    pool = ServerPool()
    with pytest.raises(ZeroDivisionError):
        try:
            pool.nbdkit("memory", "1M", socket_dir=socks)
            pool.nbdkit("null", "1M", socket_dir=socks)
            1 / 0
        finally:
            pool.stop_all()
    assert all(s.returncode == 0 for s in pool.servers)
    assert_no_leftovers(socks, [s.pid for s in pool.servers])


def test_start_failure_says_why_and_leaves_nothing(tmp_path):
    socks = tmp_path / "s"
    socks.mkdir()
    with pytest.raises(ServerError) as e:
        with nbdkit("memory", "not-a-size", socket_dir=socks):
            pytest.fail("started with a bad size")
    msg = str(e.value)
    assert "exited with status 1 before it listened" in msg and "not-a-size" in msg, msg
    assert_no_leftovers(socks, [])


def test_server_that_ignores_sigterm_is_killed(tmp_path):
    socks = tmp_path / "s"
    socks.mkdir()
    srv = nbdkit("memory", "1M", socket_dir=socks)
    with srv:
        os.kill(srv.pid, signal.SIGSTOP)      # SIGTERM stays pending
        assert srv.stop(timeout=0.2) == -signal.SIGKILL
    assert_no_leftovers(socks, [srv.pid])


def test_server_that_dies_fails_the_test(tmp_path):
    with pytest.raises(ServerError) as e:
        with nbdkit("memory", "1M", socket_dir=tmp_path) as srv:
            os.kill(srv.pid, signal.SIGKILL)
            srv.proc.wait()
    assert "exited by itself" in str(e.value), e.value


_ORPHAN = """
import sys, time
sys.path.insert(0, sys.argv[1])
from tests.servers import nbdkit, qemu_nbd
s = (nbdkit("memory", "1M", socket_dir=sys.argv[2]) if sys.argv[3] == "nbdkit"
     else qemu_nbd(sys.argv[4], fmt="raw", socket_dir=sys.argv[2]))
s.start()
print(s.pid, flush=True)
time.sleep(120)
"""


@needs_qemu_nbd
@pytest.mark.parametrize("name", ["nbdkit", "qemu-nbd"])
def test_server_dies_with_a_killed_parent(tmp_path, name):
    """The parent killed outright (no finally runs): the server goes too
    (nbdkit --exit-with-parent, PR_SET_PDEATHSIG for qemu-nbd)."""
    img = str(tmp_path / "disk.raw")
    make_sparse(img, MiB)
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parent = subprocess.Popen([sys.executable, "-c", _ORPHAN, repo, str(tmp_path), name, img],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = parent.stdout.readline()
        assert line.strip().isdigit(), (line, parent.stderr.read() if parent.poll() is not None else "")
        pid = int(line)
        assert _ppid(pid) == parent.pid
    finally:
        parent.kill()
        parent.wait()
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not _alive(pid), "%s %d outlived its killed parent" % (name, pid)


def _alive(pid):
    """pid runs (a zombie waiting for init to reap it does not)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
