"""NBD URIs as sources and destinations, against real servers (nbdkit,
qemu-nbd) started and stopped by each test.  Content is checked with
qemu-img compare, requests with nbdkit's own log."""
import errno
import json
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time

import pytest

import imgcopy
from .convert_helpers import check_result, imgcopy_cmd
from .gen.sparse import make_sparse, seeded_bytes
from .oracles import (assert_same_content, qemu_img, qemu_info, qemu_io, qemu_map,
                      qemu_map_human)
from .servers import nbdkit, needs_libnbd, needs_nbdkit, needs_qemu_nbd, qemu_nbd
from .units import GiB, KiB, MiB

pytestmark = [needs_nbdkit, needs_libnbd]

SIZE = 24 * MiB + 3 * 4096


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A sparse raw image: data runs of several lengths, written zeros,
    holes of several lengths."""
    path = str(tmp_path_factory.mktemp("nbd-src") / "src.raw")
    chunks = [(0, b"\x01" * 65536), (200 * KiB, b"\x02" * 5000),
              (1 * MiB, b"\x03" * (3 * MiB)), (5 * MiB, bytes(256 * KiB)),
              (6 * MiB, b"\x04" * 4096 + bytes(128 * KiB) + b"\x05" * 4096),
              (12 * MiB + 512, b"\x06" * 70000), (SIZE - 4096, b"\x07" * 4096)]
    make_sparse(path, SIZE, chunks)
    return path


def without_offsets(entries):
    return [{k: v for k, v in e.items() if k != "offset"} for e in entries]


# --------------------------------------------------------------------------
# sources: map, info, read

@pytest.mark.parametrize("tcp", [False, True], ids=["unix", "tcp"])
def test_map_and_info_as_qemu_img_says(source, tcp):
    with nbdkit("file", source, tcp=tcp, log=False) as srv:
        m = imgcopy.map(srv.uri)
        assert m.to_json() == qemu_map(srv.uri).text
        assert m.to_human(srv.uri) == qemu_map_human(srv.uri)
        i = imgcopy.info(srv.uri)
        assert i.to_dict() == qemu_info(srv.uri)
        assert i.to_human() == qemu_img("info", srv.uri).stdout
        with imgcopy.open(srv.uri) as img:
            assert img.size == SIZE and img.format == "raw"
            assert img.read(MiB, 4) == b"\x03" * 4
            assert img.read(5 * MiB, 8) == bytes(8)


def test_cli_map_and_info(source, imgcopy_env, tmp_path):
    with nbdkit("file", source, log=False) as srv:
        for args in (["map", srv.uri], ["map", "--output=json", srv.uri], ["info", srv.uri]):
            ours = subprocess.run([sys.executable, "-m", "imgcopy"] + args, env=imgcopy_env,
                                  cwd=str(tmp_path), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
            assert ours.returncode == 0, ours.stderr
            assert ours.stdout == qemu_img(*args).stdout


@needs_qemu_nbd
def test_allocation_depth_as_qemu_img_map_of_the_image(tmp_path):
    """qemu-nbd -A exports qemu:allocation-depth: the map of the URI says
    what qemu-img map of the exported qcow2 chain says (depth included;
    host offsets are the server's business)."""
    base, top = str(tmp_path / "base.qcow2"), str(tmp_path / "top.qcow2")
    qemu_img("create", "-q", "-f", "qcow2", base, str(16 * MiB))
    qemu_img("create", "-q", "-f", "qcow2", "-b", base, "-F", "qcow2", top)
    qemu_io(base, ["write -P 1 0 1M", "write -P 2 8M 64k"], fmt="qcow2")
    qemu_io(top, ["write -P 3 512k 1M", "write -z 8M 4k", "write -P 4 15M 4k"], fmt="qcow2")
    with qemu_nbd(top, "qcow2", read_only=True, allocation_depth=True) as srv:
        ours = json.loads(imgcopy.map(srv.uri).to_json())
        assert without_offsets(ours) == without_offsets(qemu_map(top, "qcow2").extents)
        assert_same_content(top, srv.uri, "qcow2", "raw")


@needs_qemu_nbd
def test_qcow2_file_exported_raw_is_probed(tmp_path):
    """A qcow2 file exported byte for byte: imgcopy opens the qcow2 format on
    the NBD protocol, as on a local file (host offsets included)."""
    q = str(tmp_path / "img.qcow2")
    qemu_img("create", "-q", "-f", "qcow2", q, str(8 * MiB))
    qemu_io(q, ["write -P 9 1M 300k", "write -c -P 8 4M 64k"], fmt="qcow2")
    with qemu_nbd(q, "raw", read_only=True) as srv:
        m = imgcopy.map(srv.uri)
        assert m.format == "qcow2"
        assert json.loads(m.to_json()) == qemu_map(q, "qcow2").extents
        out = str(tmp_path / "out.raw")
        imgcopy.convert(srv.uri, out)
        assert_same_content(q, out, "qcow2", "raw")


def test_failed_block_status_reads_as_data(source, tmp_path):
    """An export whose block status fails is copied whole, as data."""
    with nbdkit("file", source, "error-extents=EIO", "error-extents-rate=100%",
                filters=["error"], log=False) as srv:
        out = str(tmp_path / "out.raw")
        res = imgcopy.convert(srv.uri, out)
        assert res.bytes_read == SIZE
        assert_same_content(source, out, "raw", "raw")


# --------------------------------------------------------------------------
# destinations

def qemu_requests(source, *opts, filters=()):
    """(writes, zeros) qemu-img convert -n sends into a memory export."""
    with nbdkit("memory", str(SIZE), filters=list(filters)) as srv:
        qemu_img("convert", "-n", "-f", "raw", "-O", "raw", *opts, source, srv.uri)
        return srv.count("Write"), srv.count("Zero")


@pytest.mark.parametrize("threshold", ["4k", "64k"])
def test_copy_into_memory_export(source, threshold):
    """The export reads as zeros where it was never written: no zero request
    at all; no more writes than qemu-img at the same -S."""
    with nbdkit("memory", str(SIZE)) as srv:
        res = imgcopy.convert(source, srv.uri, sparse_threshold=threshold)
        check_result(res, SIZE)
        assert_same_content(source, srv.uri, "raw", "raw")
        writes, zeros = srv.count("Write"), srv.count("Zero")
        assert srv.count("Write", ok=False) == 0
    qemu_writes, _ = qemu_requests(source, "-S", threshold)
    assert zeros == 0 and res.zero_requests == 0, res
    assert res.bytes_already_zero == res.bytes_skipped == SIZE - res.bytes_written, res
    assert writes <= qemu_writes, (writes, qemu_writes)
    assert res.write_requests <= writes  # the server's maximum may split one


@pytest.mark.parametrize("threshold", ["4k", "64k", "1M"])
def test_no_more_requests_than_qemu_img(corpus_raw, threshold):
    """The corpus's OS-like image into an export that cannot say what it
    reads (noextents): writes and zeros no more than qemu-img's at the
    same -S, byte for byte the same output."""
    src, size = corpus_raw
    counts = {}
    for tool in ("qemu-img", "imgcopy"):
        with nbdkit("memory", str(size), filters=["noextents"]) as srv:
            if tool == "qemu-img":
                qemu_img("convert", "-n", "-f", "raw", "-O", "raw", "-S", threshold, src, srv.uri)
            else:
                imgcopy.convert(src, srv.uri, sparse_threshold=threshold)
            assert_same_content(src, srv.uri, "raw", "raw")
            counts[tool] = (srv.count("Write"), srv.count("Zero"))
    assert counts["imgcopy"][0] <= counts["qemu-img"][0], counts
    assert counts["imgcopy"][1] <= counts["qemu-img"][1], counts


def test_destination_that_cannot_say_gets_zeroed(source):
    """Without block status (noextents) zero ranges are zeroed, in no more
    requests than qemu-img sends; --target-is-zero sends none."""
    with nbdkit("memory", str(SIZE), filters=["noextents"]) as srv:
        res = imgcopy.convert(source, srv.uri)
        assert_same_content(source, srv.uri, "raw", "raw")
        writes, zeros = srv.count("Write"), srv.count("Zero")
    qemu_writes, qemu_zeros = qemu_requests(source, filters=["noextents"])
    assert res.bytes_already_zero == 0 and res.bytes_zeroed > 0, res
    assert 0 < zeros <= qemu_zeros and writes <= qemu_writes, (writes, zeros, qemu_writes,
                                                               qemu_zeros)
    with nbdkit("memory", str(SIZE), filters=["noextents"]) as srv:
        res = imgcopy.convert(source, srv.uri, target_is_zero=True)
        assert srv.count("Zero") == 0 and res.zero_requests == 0
        assert_same_content(source, srv.uri, "raw", "raw")


def test_fully_allocated_sends_zero_requests_not_zeros(tmp_path):
    """-S 0 into an export: a 2 GiB source holding 2 bytes costs two small
    writes and a few WRITE_ZEROES that keep the range allocated
    (NBD_CMD_FLAG_NO_HOLE: never may-trim), as nbdcopy --allocated sends,
    never 2 GiB of zeros on the wire; a server without WRITE_ZEROES gets
    zeros written, as it has no such request."""
    src = str(tmp_path / "two-bytes.raw")
    make_sparse(src, 2 * GiB, [(4096, b"\x01"), (GiB + 17, b"\x02")])
    with nbdkit("memory", "2G") as srv:
        res = imgcopy.convert(src, srv.uri, sparse_threshold=0)
        writes, zeros = srv.requests("Write"), srv.requests("Zero")
        assert_same_content(src, srv.uri, "raw", "raw")
    assert sum(w.count for w in writes) == res.bytes_written == 8192, writes
    assert 0 < len(zeros) <= 4 and all(z.ok for z in zeros), zeros
    assert all("trim" not in z.flags for z in zeros), [sorted(z.flags) for z in zeros]
    assert sum(z.count for z in zeros) == res.bytes_zeroed == 2 * GiB - 8192
    assert res.bytes_skipped == 0
    small = str(tmp_path / "small.raw")
    make_sparse(small, 64 * MiB, [(4096, b"\x01")])
    with nbdkit("memory", "64M", filters=["nozero"]) as srv:
        res = imgcopy.convert(small, srv.uri, sparse_threshold=0)
        assert srv.count("Zero") == 0 and srv.bytes("Write") == 64 * MiB
        assert res.bytes_skipped == 0
        assert_same_content(small, srv.uri, "raw", "raw")


def test_empty_disk_costs_three_zero_requests_at_most(tmp_path):
    """An empty 8 GiB disk: zero requests as long as NBD carries (32-bit
    lengths), never one per request_size; none when the export says it
    reads zeros."""
    empty = str(tmp_path / "empty.raw")
    make_sparse(empty, 8 * GiB)
    with nbdkit("memory", "8G", filters=["noextents"]) as srv:
        res = imgcopy.convert(empty, srv.uri)
        zeros = srv.requests("Zero")
    assert len(zeros) <= 3 and sum(z.count for z in zeros) == 8 * GiB, zeros
    assert res.zero_requests == len(zeros)
    with nbdkit("memory", "8G") as srv:
        res = imgcopy.convert(empty, srv.uri)
        assert srv.count("Zero") == 0 and srv.count("Write") == 0
    assert res.bytes_already_zero == 8 * GiB


def test_server_maximum_block_size_obeyed(source):
    """blocksize-policy refuses requests over 64 KiB: imgcopy's 2 MiB
    requests are cut to the server's maximum, nothing fails."""
    with nbdkit("memory", str(SIZE), "blocksize-maximum=64K", "blocksize-error-policy=error",
                filters=["blocksize-policy", "noextents"]) as srv:
        imgcopy.convert(source, srv.uri, request_size="2M")
        assert_same_content(source, srv.uri, "raw", "raw")
        data = [r for r in srv.requests() if r.kind in ("Write", "Read")]
        assert data and all(r.count <= 64 * KiB and r.ok for r in data), data
        assert all(r.ok for r in srv.requests())


def test_server_without_write_zeroes(source):
    """nozero: the server has no WRITE_ZEROES; zeros it does not read
    already are written as data."""
    with nbdkit("memory", str(SIZE), filters=["nozero", "noextents"]) as srv:
        res = imgcopy.convert(source, srv.uri)
        assert srv.count("Zero") == 0
        assert_same_content(source, srv.uri, "raw", "raw")
    assert res.bytes_written + res.bytes_zeroed == SIZE


def test_flushed_once_per_connection(source):
    with nbdkit("memory", str(SIZE)) as srv:
        imgcopy.convert(source, srv.uri)
        conns = {r.connection for r in srv.requests("Write")}
        flushes = srv.requests("Flush")
    assert sorted(f.connection for f in flushes) == sorted({c["connection"] for c in
                                                            srv.connections()} | conns)
    with nbdkit("memory", str(SIZE)) as srv:
        imgcopy.convert(source, srv.uri, flush=False)
        assert srv.count("Flush") == 0


def test_several_connections_only_with_multi_conn(source, tmp_path):
    with nbdkit("memory", str(SIZE)) as srv:  # memory: multi-conn
        imgcopy.convert(source, srv.uri)
        assert len({r.connection for r in srv.requests("Write")}) > 1
        assert_same_content(source, srv.uri, "raw", "raw")
    with nbdkit("memory", str(SIZE), "multi-conn-mode=disable",
                filters=["multi-conn"]) as srv:
        imgcopy.convert(source, srv.uri)
        assert len(srv.connections()) == 1
        assert_same_content(source, srv.uri, "raw", "raw")


@needs_qemu_nbd
def test_into_qcow2_through_qemu_nbd(source, tmp_path):
    q = str(tmp_path / "dst.qcow2")
    qemu_img("create", "-q", "-f", "qcow2", q, str(SIZE))
    with qemu_nbd(q, "qcow2") as srv:
        res = imgcopy.convert(source, srv.uri)
        check_result(res, SIZE)
    assert_same_content(source, q, "raw", "qcow2")
    assert qemu_img("check", q).returncode == 0


def test_smaller_export_is_refused_untouched(source):
    with nbdkit("memory", str(SIZE - 4096)) as srv:
        with pytest.raises(OSError) as e:
            imgcopy.convert(source, srv.uri)
        assert e.value.errno == errno.ENOSPC and e.value.filename == srv.uri
        assert srv.count("Write") == 0 and srv.count("Zero") == 0


# --------------------------------------------------------------------------
# errors: never a success after a failed request, never a hang

@pytest.mark.parametrize("err,rate", [("EIO", "100%"), ("EIO", "30%"), ("ENOSPC", "100%")])
def test_failed_writes_fail_the_copy(source, err, rate):
    with nbdkit("memory", str(SIZE), "error-pwrite=%s" % err, "error-pwrite-rate=%s" % rate,
                filters=["error"]) as srv:
        with pytest.raises(OSError) as e:
            # every byte written, in 64 KiB requests: ~400 writes, so that
            # at 30% some surely fail
            imgcopy.convert(source, srv.uri, concurrency=2, sparse_threshold=0,
                            request_size="64k")
        assert srv.count("Write", ok=False) > 0
    assert e.value.errno == getattr(errno, err), e.value
    assert e.value.filename == srv.uri and "offset" in str(e.value)


def test_failed_reads_fail_the_copy(source, tmp_path):
    out = str(tmp_path / "out.raw")
    with nbdkit("file", source, "error-pread=EIO", "error-pread-rate=100%",
                filters=["error"], log=False) as srv:
        with pytest.raises(OSError) as e:
            imgcopy.convert(srv.uri, out, src_format="raw")
    assert e.value.errno == errno.EIO and not os.path.exists(out)


def test_server_gone_mid_copy_is_an_error_not_a_hang(source):
    with nbdkit("memory", str(SIZE), "delay-write=1", "delay-zero=1",
                filters=["delay", "noextents"], log=False) as srv:
        killer = threading.Timer(0.5, srv.stop)
        killer.start()
        t0 = time.monotonic()
        try:
            with pytest.raises(OSError):
                imgcopy.convert(source, srv.uri)
        finally:
            killer.join()
    assert time.monotonic() - t0 < 20


def _sigint_to_exit(argv, env, cwd):
    """Run `imgcopy convert -p ARGV`, SIGINT it once its progress shows (on
    stdout, as qemu-img's when stdout is no terminal) and requests are in
    flight; (seconds from SIGINT to exit, status, stderr)."""
    proc = subprocess.Popen(imgcopy_cmd() + ["convert", "-p"] + argv, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, cwd=cwd)
    try:
        seen, deadline = b"", time.monotonic() + 20
        while b"%" not in seen and time.monotonic() < deadline:
            if select.select([proc.stdout], [], [], 1)[0]:
                chunk = os.read(proc.stdout.fileno(), 4096)
                assert chunk, "exited (%s) before it copied: %r" % (proc.wait(),
                                                                      proc.stderr.read())
                seen += chunk
        assert b"%" in seen, "no progress within 20 s"
        time.sleep(0.3)  # well into the copy: the server holds many requests
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pytest.fail("imgcopy did not stop within 20 s of SIGINT")
        return time.monotonic() - t0, proc.returncode, proc.stderr.read().decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


@pytest.mark.parametrize("way", ["into", "from"])
def test_ctrl_c_does_not_wait_for_a_slow_server(tmp_path, imgcopy_env, way):
    """Ctrl-C against a server that takes seconds to answer what is in
    flight (rate-limited to 100 Mbit/s: 64 MiB of writes queued, or four
    8 MiB reads): imgcopy exits within a tenth of a second or so, the
    connections shut down rather than drained, in either direction."""
    dst = str(tmp_path / "out.raw")
    # one thread per connection: nbdkit before 1.33.10 asserts when a client
    # hangs up while two of its threads have replies to send (its commit
    # 9d82aa4f; nbdcopy's Ctrl-C does it too)
    one = ["--threads=1"]
    for run in range(3):
        with nbdkit("pattern", "1G", "rate=100M", filters=["rate"], log=False, extra=one) as slow, \
                nbdkit("pattern", "1G", log=False, extra=one) as fast, \
                nbdkit("memory", "1G", "rate=100M", filters=["rate"], log=False,
                       extra=one) as slow_dst:
            # from: 8 MiB reads, one per worker, in flight: seconds of them
            argv = ([fast.uri, slow_dst.uri] if way == "into"
                    else ["--request-size", "8M", slow.uri, dst])
            elapsed, status, err = _sigint_to_exit(argv, imgcopy_env, str(tmp_path))
        assert status == 130 and "interrupted" in err, (status, err[-500:])
        assert elapsed < 0.5, "run %d: %.2f s from SIGINT to exit" % (run, elapsed)
        assert not os.path.exists(dst)


@pytest.mark.parametrize("connections", [1, None], ids=["one-connection", "multi-conn"])
def test_dead_server_is_blamed_on_the_first_request_in_flight(tmp_path, connections):
    """kill -9 of the destination's server mid-copy, every write taking
    half a second (dozens in flight): the error names the write of lowest
    offset the server held unanswered, not the last one issued (which
    libnbd happened to fail first, or one refused after the death)."""
    src = str(tmp_path / "data.raw")
    piece = seeded_bytes(MiB)
    make_sparse(src, 64 * MiB, [(off, piece) for off in range(0, 64 * MiB, MiB)])
    killed = []

    def kill(srv):
        killed.append(time.time())
        os.kill(srv.pid, signal.SIGKILL)

    with nbdkit("memory", "64M", "delay-write=500ms", filters=["delay"]) as srv:
        killer = threading.Timer(0.7, kill, (srv,))
        killer.start()
        try:
            with pytest.raises(OSError) as e:
                imgcopy.convert(src, srv.uri, request_size="256k", connections=connections,
                                concurrency=1 if connections == 1 else 4)
        finally:
            killer.join()
        writes = srv.requests("Write", settle=False)
        srv.stop()
    blamed = re.search(r"NBD write at offset (\d+)", str(e.value))
    assert blamed and e.value.filename == srv.uri, e.value
    pending = sorted(w.offset for w in writes if not w.done)
    assert killed and pending, writes
    # (a write the server answered a moment before it died may still have
    # been on its way back)
    just_answered = {w.offset for w in writes if w.done and w.end > killed[0] - 0.05}
    # (or one sent that the server never read: every thread of its
    # connection held a write, and it waited in the socket)
    never_read = {off for off in [int(blamed.group(1))] if off not in {w.offset for w in writes}}
    offset = int(blamed.group(1))
    assert offset == pending[0] or offset in just_answered or \
        (offset in never_read and offset < pending[0]), (offset, pending[:8])


def test_without_libnbd(source, tmp_path, imgcopy_env):
    """No libnbd: NBD URIs fail, naming the package; files still work."""
    env = dict(imgcopy_env, IMGCOPY_LIBNBD="/nonexistent/libnbd.so.0")
    code = ("import imgcopy, sys\n"
            "try:\n"
            "    imgcopy.map('nbd+unix:///?socket=/nonexistent')\n"
            "except OSError as e:\n"
            "    print(e)\n"
            "print(imgcopy.map(sys.argv[1]).data_bytes)\n")
    p = subprocess.run([sys.executable, "-c", code, source], env=env, cwd=str(tmp_path),
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.returncode == 0, p.stderr
    first, second = p.stdout.splitlines()
    assert "libnbd0" in first and "libnbd" in first, first
    assert int(second) > 0


def test_copy_from_export_never_reads_holes(source, tmp_path):
    """A copy from NBD reads only what block status says is data; plan()
    of the URI makes the same requests."""
    out = str(tmp_path / "out.raw")
    with nbdkit("file", source) as srv:
        # (the format named: probing would read a few bytes more)
        res = imgcopy.convert(srv.uri, out, src_format="raw")
        planned = imgcopy.plan(srv.uri, src_format="raw").totals()
        read = srv.bytes("Read")
    assert_same_content(source, out, "raw", "raw")
    data = imgcopy.map(source).data_bytes
    # the copy and the plan each read the data, and nothing else
    assert res.bytes_read == planned["bytes_read"] == data and read == 2 * data
    assert {k: planned[k] for k in ("bytes_written", "write_requests")} == \
        {"bytes_written": res.bytes_written, "write_requests": res.write_requests}


@pytest.mark.parametrize("extra", [[], ["-n"], ["-n", "--target-is-zero"]])
def test_cli_convert_into_export(source, imgcopy_env, tmp_path, extra):
    with nbdkit("memory", str(SIZE)) as srv:
        p = subprocess.run([sys.executable, "-m", "imgcopy", "convert", *extra, "--stats=json",
                            source, srv.uri], env=imgcopy_env, cwd=str(tmp_path),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert p.returncode == 0, p.stderr
        assert_same_content(source, srv.uri, "raw", "raw")
        assert srv.count("Zero") == 0


def test_target_is_zero_into_export_needs_no_n(source, imgcopy_env, tmp_path):
    """An NBD export is always an existing destination (-n implied):
    --target-is-zero needs no -n there, and neither the CLI nor convert()
    zeroes anything in an export that cannot say it reads zeros."""
    for how in ("cli", "python"):
        with nbdkit("memory", str(SIZE), filters=["noextents"]) as srv:
            if how == "cli":
                p = subprocess.run([sys.executable, "-m", "imgcopy", "convert",
                                    "--target-is-zero", "--stats=json", source, srv.uri],
                                   env=imgcopy_env, cwd=str(tmp_path), stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)
                assert p.returncode == 0, p.stderr
                res = json.loads(p.stdout)
            else:
                res = imgcopy.convert(source, srv.uri, target_is_zero=True).to_dict()
            assert_same_content(source, srv.uri, "raw", "raw")
            assert srv.count("Zero") == 0 and res["zero_requests"] == 0, (how, res)
            assert res["bytes_skipped"] > 0, (how, res)


@pytest.mark.parametrize("connections,requests", [(1, 1), (2, 4), (None, 64)])
def test_connections_and_requests_in_flight(source, connections, requests):
    """The knobs: connections to a multi-conn server (default 4) and
    requests in flight per connection, as the server's log saw them."""
    with nbdkit("memory", str(SIZE), filters=["noextents"]) as srv:
        imgcopy.convert(source, srv.uri, connections=connections, requests_in_flight=requests,
                        sparse_threshold=0, request_size="256k")
        assert_same_content(source, srv.uri, "raw", "raw")
        reqs = [r for r in srv.requests() if r.kind in ("Write", "Zero")]
        used = {r.connection for r in reqs}
    assert len(used) == (connections or 4), used
    for conn in used:  # the most requests of one connection the server held at once
        events = sorted([(r.start, 1) for r in reqs if r.connection == conn] +
                        [(r.end, -1) for r in reqs if r.connection == conn],
                        key=lambda e: (e[0], e[1]))
        depth = peak = 0
        for _, step in events:
            depth += step
            peak = max(peak, depth)
        assert peak <= requests, (conn, peak)


def test_no_multi_conn_means_one_connection_whatever_asked(source):
    with nbdkit("memory", str(SIZE), "multi-conn-mode=disable", filters=["multi-conn"]) as srv:
        imgcopy.convert(source, srv.uri, connections=8)
        assert len(srv.connections()) == 1


def test_server_preferred_block_size_raises_threshold_and_requests(corpus_raw):
    """A server that prefers 64 KiB requests gets holes and requests of at
    least that: as many writes as qemu-img -S 64k sends, none shorter than
    the preference except at the data's edges."""
    src, size = corpus_raw
    with nbdkit("memory", str(size), filters=["noextents"]) as srv:
        qemu_img("convert", "-n", "-f", "raw", "-O", "raw", "-S", "64k", src, srv.uri)
        qemu_writes = srv.count("Write")
    with nbdkit("memory", str(size), "blocksize-preferred=64K", "blocksize-minimum=512",
                "blocksize-maximum=4M", filters=["blocksize-policy", "noextents"]) as srv:
        imgcopy.convert(src, srv.uri)  # -S 4k asked: raised to 64k
        assert srv.connections()[0]["prefsize"] == 64 * KiB
        assert_same_content(src, srv.uri, "raw", "raw")
        writes = srv.count("Write")
    assert writes <= qemu_writes, (writes, qemu_writes)


def test_options_reported_are_the_ones_used(source):
    """An export preferring 64 KiB requests: the copy's holes and requests
    are raised to that, and CopyResult.options says so (not the 4 KiB
    asked); the same options asked for, into an export without a
    preference, make exactly the same requests."""
    def writes(srv):
        return sorted((r.offset, r.count) for r in srv.requests("Write"))

    with nbdkit("memory", str(SIZE), "blocksize-preferred=64K", "blocksize-minimum=512",
                "blocksize-maximum=4M", filters=["blocksize-policy", "noextents"]) as srv:
        res = imgcopy.convert(source, srv.uri, request_size="4k", sparse_threshold="4k")
        assert_same_content(source, srv.uri, "raw", "raw")
        raised = writes(srv)
    used = res.options
    assert (used.sparse_threshold, used.request_size) == (64 * KiB, 64 * KiB), used
    assert used.target_is_zero is False  # an export: decided, not None
    with nbdkit("memory", str(SIZE), filters=["noextents"]) as srv:
        again = imgcopy.convert(source, srv.uri, options=used)
        assert writes(srv) == raised
    assert again.options == used


def test_tls_with_a_pre_shared_key(source, tmp_path):
    """nbds+unix:// with tls-psk-file: the copy and the map go through TLS;
    the same server refuses a plain connection."""
    keys = tmp_path / "keys.psk"
    keys.write_text("alice:%s\n" % os.urandom(32).hex())
    with nbdkit("memory", str(SIZE), extra=["--tls=require", "--tls-psk=%s" % keys],
                log=False) as srv:
        uri = "nbds+unix://alice@/?socket=%s&tls-psk-file=%s" % (srv.socket, keys)
        res = imgcopy.convert(source, uri)
        check_result(res, SIZE)
        assert imgcopy.info(uri).virtual_size == SIZE
        out = str(tmp_path / "back.raw")
        imgcopy.convert(uri, out)
        assert_same_content(source, out, "raw", "raw")
        with pytest.raises(OSError):
            imgcopy.map(srv.uri)


def test_server_that_serialises_requests(source):
    """noparallel: the server handles one request at a time; requests in
    flight queue on its side, the copy is whole."""
    with nbdkit("memory", str(SIZE), "serialize=requests", filters=["noparallel"]) as srv:
        res = imgcopy.convert(source, srv.uri)
        check_result(res, SIZE)
        assert_same_content(source, srv.uri, "raw", "raw")
        assert srv.count("Write", ok=False) == 0


def test_captive_nbdkit_runs_the_command_line(source, imgcopy_env, tmp_path):
    """nbdkit --run: the server lives as long as the command it runs, which
    gets the export's URI as $uri (how v2v pipelines chain them)."""
    out = tmp_path / "out.raw"
    # under make test-sanitize, imgcopy needs the ASan preload nbdkit's shim took away
    python = 'LD_PRELOAD="${IMGCOPY_ASAN_PRELOAD:-}" %s' % sys.executable
    command = "%s -m imgcopy convert -n %s \"$uri\" && %s -m imgcopy convert \"$uri\" %s" % (
        python, source, python, out)
    p = subprocess.run(["nbdkit", "-U", "-", "memory", str(SIZE), "--run", command],
                       env=imgcopy_env, cwd=str(tmp_path), stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert_same_content(source, str(out), "raw", "raw")


def test_server_minimum_block_size_obeyed(source, tmp_path):
    """blocksize-policy refuses requests smaller than 4 KiB: probing's
    512-byte reads and a read of a few bytes go as whole blocks; copies
    both ways work."""
    with nbdkit("memory", str(SIZE), "blocksize-minimum=4096", "blocksize-error-policy=error",
                filters=["blocksize-policy"]) as srv:
        imgcopy.convert(source, srv.uri)
        assert imgcopy.map(srv.uri).to_json() == qemu_map(srv.uri).text
        with imgcopy.open(srv.uri) as img:
            assert img.read(MiB + 100, 10) == b"\x03" * 10
        out = str(tmp_path / "back.raw")
        imgcopy.convert(srv.uri, out)
        assert_same_content(source, out, "raw", "raw")
        assert all(r.ok and (r.count is None or r.count % 4096 == 0) for r in srv.requests())


def test_export_ending_inside_a_minimum_block_refused(tmp_path):
    """An export whose size is not whole minimum blocks cannot have its
    last block read or written: refused when opened, with what is wrong
    (qemu-img refuses to open it too), and no write sent."""
    size = 460 * 4096 + 512
    src = str(tmp_path / "src.raw")
    with open(src, "wb") as f:
        f.write(b"\x07" * size)
    with nbdkit("memory", str(size), "blocksize-minimum=4096", "blocksize-error-policy=error",
                filters=["blocksize-policy"]) as srv:
        with pytest.raises(ValueError, match="not a multiple of its minimum block size"):
            imgcopy.convert(src, srv.uri, create=False)
        with pytest.raises(ValueError, match="not a multiple of its minimum block size"):
            imgcopy.map(srv.uri)
        assert not [r for r in srv.requests() if r.kind in ("Write", "Zero", "Trim")]
