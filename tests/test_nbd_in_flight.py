"""Requests in flight to remote endpoints (issue 25): reads of an NBD
source are submitted ahead and wait in no thread, so their number does not
depend on the worker threads; a costly source's short holes are read
through, without changing a single request the destination sees."""
import os
import random

import pytest

import imgcopy

from .oracles import assert_same_content, qemu_img
from .servers import needs_nbdkit, nbdkit

KiB, MiB = 1 << 10, 1 << 20


def max_overlap(requests, kind):
    """The most requests of `kind` the server held at once (by the log's
    start and end times)."""
    events = []
    for r in requests:
        if r.kind == kind and r.done:
            events += [(r.start, 1), (r.end, -1)]
    events.sort(key=lambda e: (e[0], e[1]))
    most = now = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


def runs_file(path, size, data, hole, seed):
    """`size` bytes: `data` bytes of random data every `data + hole`."""
    rng = random.Random(seed)
    with open(path, "wb") as f:
        f.truncate(size)
        for off in range(0, size - data + 1, data + hole):
            f.seek(off)
            f.write(rng.randbytes(data))
    return path


def source_export(path, delay_ms):
    return nbdkit("file", str(path), "delay-read=%dms" % delay_ms,
                  "delay-extents=%dms" % delay_ms, filters=["delay"], extra=["-r"])


@needs_nbdkit
def test_reads_in_flight_do_not_wait_for_threads(tmp_path):
    """One worker thread, 20 ms a read: the copy still keeps many reads at
    the server at once (before, one)."""
    src = tmp_path / "src.raw"
    with open(src, "wb") as f:
        f.write(random.Random(1).randbytes(4 * MiB))
    with source_export(src, 20) as srv:
        res = imgcopy.convert(srv.uri, tmp_path / "out.raw", src_format="raw",
                              concurrency=1, request_size="64k")
        reads = srv.requests("Read")
    assert_same_content(src, tmp_path / "out.raw", "raw", "raw")
    assert res.read_requests == len(reads) == 64
    assert max_overlap(reads, "Read") >= 8


@needs_nbdkit
def test_checksum_and_compare_read_ahead(tmp_path):
    src = tmp_path / "src.raw"
    with open(src, "wb") as f:  # 8 reads of 2 MiB: 4 at once leaves room for a loaded machine
        f.write(random.Random(2).randbytes(16 * MiB))
    with source_export(src, 20) as srv:
        assert imgcopy.checksum(srv.uri, format="raw", threads=1) == imgcopy.checksum(src)
        in_checksum = max_overlap(srv.requests("Read"), "Read")
    with source_export(src, 20) as srv:
        result = imgcopy.compare(srv.uri, src, a_format="raw", b_format="raw", concurrency=1)
        in_compare = max_overlap(srv.requests("Read"), "Read")
    assert result.identical
    assert in_checksum >= 4 and in_compare >= 3


@needs_nbdkit
def test_compare_of_remote_images_finds_the_first_difference(tmp_path):
    """Steps answered out of order still report the first difference."""
    a = tmp_path / "a.raw"
    rng = random.Random(3)
    with open(a, "wb") as f:
        f.write(rng.randbytes(16 * MiB))
    b = tmp_path / "b.raw"
    b.write_bytes(a.read_bytes())
    with open(b, "r+b") as f:
        for off in (13 * MiB + 4097, 5 * MiB + 700, 9 * MiB):
            f.seek(off)
            f.write(b"\xff")
    expected = imgcopy.compare(a, b, a_format="raw", b_format="raw")
    with source_export(a, 5) as sa, source_export(b, 5) as sb:
        got = imgcopy.compare(sa.uri, sb.uri, a_format="raw", b_format="raw")
    assert not got.identical and got.offset == expected.offset == 5 * MiB + 512


@needs_nbdkit
@pytest.mark.parametrize("delay_ms", [0, 20])
def test_short_holes_read_through_change_no_write(tmp_path, delay_ms):
    """At 20 ms a round trip, 48 KiB holes between 64 KiB runs are read
    through: fewer reads than runs, and the destination gets exactly the
    requests a copy of the file itself sends.  On a local socket (no
    delay) nothing is read through: no hole is read."""
    src = runs_file(tmp_path / "src.raw", 8 * MiB, 64 * KiB, 48 * KiB, seed=4)
    runs = len([e for e in imgcopy.map(src) if e.data])

    def writes(source, fmt):
        with nbdkit("memory", "8M") as dst:
            imgcopy.convert(source, dst.uri, src_format=fmt, dst_format="raw", create=False)
            reqs = [(r.kind, r.offset, r.count) for r in dst.requests()
                    if r.kind in ("Write", "Zero", "Trim")]
            qemu_img("compare", "-f", "raw", "-F", "raw", str(src), dst.uri)
        return sorted(reqs)

    direct = writes(src, "raw")
    with source_export(src, delay_ms) as srv:
        through = writes(srv.uri, "raw")
        reads = srv.requests("Read")
    assert through == direct
    read_bytes = sum(r.count for r in reads)
    if delay_ms:
        assert len(reads) < runs / 2
        assert read_bytes > runs * 64 * KiB  # holes too
    else:
        assert len(reads) == runs and read_bytes == runs * 64 * KiB


@needs_nbdkit
def test_remote_source_into_qcow2_in_guest_order(tmp_path):
    """Many items in flight, few threads, host clusters placed in guest
    order: the image checks clean, its data clusters lie in guest order."""
    src = runs_file(tmp_path / "src.raw", 16 * MiB, 192 * KiB, 64 * KiB, seed=5)
    out = tmp_path / "out.qcow2"
    with source_export(src, 2) as srv:
        imgcopy.convert(srv.uri, out, src_format="raw", dst_format="qcow2", concurrency=2,
                        request_size="256k")
    qemu_img("check", str(out))
    assert_same_content(src, out, "raw", "qcow2")
    hosts = [e.host_offset for e in imgcopy.map(out) if e.data]
    assert hosts == sorted(hosts)


@needs_nbdkit
def test_remote_to_remote_in_order_writes(tmp_path):
    """NBD to NBD, writes in guest order (-W off), the read buffers going
    out as the writes' bytes: the target equals the source."""
    src = runs_file(tmp_path / "src.raw", 8 * MiB, 100 * KiB, 28 * KiB, seed=6)
    with source_export(src, 3) as s, nbdkit("memory", "8M", "delay-write=3ms",
                                            filters=["delay"]) as d:
        res = imgcopy.convert(s.uri, d.uri, src_format="raw", dst_format="raw", create=False,
                              out_of_order=False, concurrency=1)
        qemu_img("compare", "-f", "raw", "-F", "raw", str(src), d.uri)
        writes = [r for r in d.requests("Write")]
    assert res.write_requests == len(writes)
    assert max_overlap(writes, "Write") >= 2
    assert os.path.getsize(src) == 8 * MiB


@needs_nbdkit
def test_block_status_asked_ahead_when_answers_are_short(tmp_path):
    """A server that answers block status 1 MiB at a time (nbdkit's
    blocksize filter, maxlen): after the first short answer, regions
    further on are asked at the same time, so the walk does not pay a
    round trip per answer in turn; no range is asked twice over."""
    src = runs_file(tmp_path / "src.raw", 64 * MiB, 96 * KiB, 160 * KiB, seed=7)
    with nbdkit("file", str(src), "maxlen=1M", "delay-extents=10ms",
                filters=["blocksize", "delay"], extra=["-r"]) as srv:
        got = imgcopy.map(srv.uri, format="raw")
        asked = srv.requests("Extents")
        out = tmp_path / "out.raw"
        imgcopy.convert(srv.uri, out, src_format="raw")
    want = imgcopy.map(src)
    assert [(e.start, e.length, e.data) for e in got] == \
        [(e.start, e.length, e.data) for e in want]
    assert_same_content(src, out, "raw", "raw")
    assert max_overlap(asked, "Extents") >= 4
    # one question per MiB, and a few where a region's first answer starts
    assert len(asked) <= 64 + 16


@needs_nbdkit
@pytest.mark.parametrize("serialised", [True, False], ids=["noparallel", "parallel"])
def test_a_serialising_source_is_read_in_long_requests(tmp_path, serialised):
    """A server that answers one request after another (VDDK; nbdkit's
    noparallel filter) is measured as such: its round trip is paid whole,
    so requests grow to 16 round trips' worth, up to 16 MiB, and holes
    shorter than one are read through.  A server that answers requests
    together at the same latency keeps the requests asked for."""
    src = runs_file(tmp_path / "src.raw", 32 * MiB, 64 * KiB, 192 * KiB, seed=7)
    filters = ["noparallel", "multi-conn", "delay"] if serialised else ["delay"]
    params = ["serialize=all-requests", "multi-conn-mode=disable"] if serialised else []
    # 5 ms: a loaded machine's scheduling delays (a few ms) blur neither
    # the one-after-another answers nor the holes' read-through threshold
    with nbdkit("file", str(src), *params, "delay-read=5ms", "delay-extents=5ms",
                filters=filters, extra=["-r"]) as srv:
        res = imgcopy.convert(srv.uri, tmp_path / "out.raw", src_format="raw")
        reads = srv.requests("Read")
    assert_same_content(src, tmp_path / "out.raw", "raw", "raw")
    assert res.read_requests == len(reads)
    runs = 32 * MiB // (256 * KiB)  # 128 data runs of 64 KiB
    if serialised:
        assert res.options.request_size == 16 * MiB, res.options
        assert len(reads) <= 4, len(reads)  # 32 MiB in 16 MiB reads, holes read through
    else:
        assert res.options.request_size == 2 * MiB, res.options
        # 192 KiB holes, more than a round trip's share of 16 threads on each
        # of 4 connections (80 KiB)
        assert len(reads) == runs, len(reads)


@needs_nbdkit
def test_holes_left_unread_from_a_parallel_source(tmp_path):
    """A server that answers requests together, 5 ms a round trip, over
    four connections: an item carries several runs, each read on its own,
    and the 160 KiB holes between them are not read (a round trip costs
    its share of 64 requests in flight, 80 KiB at 1 GiB/s, less than the
    hole's bytes); a checksum of the copy and compare mode, which use the
    whole buffer, still see zeros in them."""
    src = runs_file(tmp_path / "src.raw", 16 * MiB, 64 * KiB, 160 * KiB, seed=8)
    runs = len([e for e in imgcopy.map(src) if e.data])
    out = tmp_path / "out.raw"
    with source_export(src, 5) as srv:
        res = imgcopy.convert(srv.uri, out, src_format="raw", checksum=True)
        reads = srv.requests("Read")
    assert_same_content(src, out, "raw", "raw")
    assert res.checksum == imgcopy.checksum(src)
    assert res.read_requests == len(reads) == runs
    assert res.bytes_read == sum(r.count for r in reads) == runs * 64 * KiB

    # compare mode: a destination that differs in a data run and in a hole
    with open(out, "r+b") as f:
        for off in (5 * 224 * KiB + 100, 9 * 224 * KiB + 128 * KiB):
            f.seek(off)
            f.write(b"\xff" * 4096)
    with source_export(src, 5) as srv:
        res = imgcopy.convert(srv.uri, out, src_format="raw", create=False,
                              changed="compare", checksum=True)
    assert_same_content(src, out, "raw", "raw")
    assert res.checksum == imgcopy.checksum(src)
    assert 0 < res.bytes_written <= 2 * 64 * KiB


@needs_nbdkit
def test_connections_made_side_by_side(tmp_path):
    """A handshake costs round trips (here 300 ms: nbdkit's delay-open):
    the connections after the first are made at once, not one after
    another (three would cost 0.9 s more)."""
    src = runs_file(tmp_path / "src.raw", 4 * MiB, 64 * KiB, 64 * KiB, seed=9)
    with nbdkit("file", str(src), "delay-open=300ms", filters=["delay"], extra=["-r"]) as srv:
        imgcopy.convert(srv.uri, tmp_path / "out.raw", src_format="raw", connections=4)
        opened = sorted(c["at"] for c in srv.connections())
    assert_same_content(src, tmp_path / "out.raw", "raw", "raw")
    assert len(opened) == 4, opened
    later = opened[1:]
    assert later[-1] - later[0] < 0.15, opened


@needs_nbdkit
def test_round_trip_priced_again_as_answers_come(tmp_path):
    """A server whose block status is slow (30 ms, as VDDK's allocation
    queries are) and whose reads are not: the first answers, all block
    status, price a round trip at 30 ms, worth reading 480 KiB holes
    through.  The small reads that follow answer at once, and the copy
    prices its round trip again as they come: far into the disk the 48 KiB
    holes between 16 KiB runs are not read (before, every item there was
    one read, holes and all)."""
    # first, 16 KiB runs 2 MiB apart: items of their own, each a small read
    # whatever the price (and however many connections are up yet)
    far = 256 * MiB
    src = tmp_path / "src.raw"
    rng = random.Random(10)
    with open(src, "wb") as f:
        f.truncate(far + 16 * MiB)
        for off in range(0, far, 2 * MiB):
            f.seek(off)
            f.write(rng.randbytes(16 * KiB))
        for off in range(far, far + 16 * MiB, 64 * KiB):
            f.seek(off)
            f.write(rng.randbytes(16 * KiB))
    out = tmp_path / "out.raw"
    with nbdkit("file", str(src), "delay-extents=30ms", filters=["delay"],
                extra=["-r"]) as srv:
        imgcopy.convert(srv.uri, out, src_format="raw")
        reads = [r for r in srv.requests("Read") if r.offset >= far]
    assert_same_content(src, out, "raw", "raw")
    runs = 16 * MiB // (64 * KiB)  # 256 runs of 16 KiB far into the disk
    through = [r for r in reads if r.count > 16 * KiB]
    assert len(reads) >= runs * 3 // 4, len(reads)
    assert len(through) <= runs // 4, len(through)
