"""Resumable copies (issue 27): convert(journal=PATH) / --journal records
what is durable in the destination; the same copy run again after SIGKILL,
Ctrl-C or an exception copies only what the journal does not hold, ends
byte-identical (qemu-img compare) and with the checksum of the whole copy.
Journals of other copies, and damaged ones, are refused."""
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from typing import NamedTuple

import pytest

import imgcopy

from .gen.sparse import make_sparse, seeded_bytes
from .oracles import assert_same_content, qemu_check, require_qemu_img
from .servers import NBDKIT, nbdkit

MiB = 1 << 20
SIZE = 40 * MiB
INTERVAL = 4 * MiB  # --journal-interval: a checkpoint once this much more is done
# items a checkpoint does not see: finished while it flushes (slow on a loaded
# machine: the source gives some 10 MiB/s), or in flight
SLACK = 12 * MiB
# ... and more when items finish in a burst: a compressed qcow2's clusters
# are placed in guest order, so the items behind a slow one finish at once,
# and a kill that comes as the progress shows them comes before the
# checkpoint they started can record them (the work lost is then at most
# INTERVAL + SLACK + the largest step the progress took)

needs_nbdkit = pytest.mark.skipif(NBDKIT is None, reason="needs nbdkit")


def make_source(path, size=SIZE, seed=7):
    """Data and holes: 1 MiB runs of data (seeded), every third a hole."""
    rng = random.Random(seed)
    runs = [(off, seeded_bytes(MiB, seed=rng.randrange(1 << 30)))
            for off in range(0, size, MiB) if (off // MiB) % 3]
    make_sparse(path, size, runs)
    return path


def slow_source(path):
    """The file behind nbdkit's delay filter: each read waits 100 ms (one
    server thread: nbdkit before 1.33.10 dies when a killed client leaves
    replies its other threads still write)."""
    return nbdkit("file", path, "rdelay=100ms", filters=["delay"], log=False,
                  extra=["--threads=1"])


def convert_argv(src, dst, journal, *extra):
    return [sys.executable, "-m", "imgcopy", "convert", "-f", "raw", "-p", "--stats", "json",
            "--journal", journal, "--journal-interval", f"{INTERVAL // MiB}M",
            "--request-size", "1M", *extra, src, dst]


def progress_of(text):
    """The last percentage -p printed (the bytes done, over the run's total)."""
    found = re.findall(r"\((\d+\.\d+)/100%\)", text)
    return float(found[-1]) / 100 if found else 0.0


def largest_step(text):
    """The largest step between two percentages -p printed (from 0), as a
    fraction of the run's work."""
    found = [0.0] + [float(f) / 100 for f in re.findall(r"\((\d+\.\d+)/100%\)", text)]
    return max((b - a for a, b in zip(found, found[1:])), default=0.0)


class Killed(NamedTuple):
    fraction: float  # the last progress printed before the signal
    step: float  # the largest step the progress took (largest_step)


def run_killed(argv, at, sig=signal.SIGKILL):
    """Start, send `sig` once its progress (-p, on stderr) reaches `at` (a
    fraction of its work); the last progress it printed."""
    return kill_at_progress(argv, at, sig).fraction


def kill_at_progress(argv, at, sig=signal.SIGKILL) -> Killed:
    """run_killed(), with the largest step the progress took."""
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert p.stderr is not None
    text, deadline = "", time.monotonic() + 120
    try:
        while progress_of(text) < at and time.monotonic() < deadline:
            chunk = os.read(p.stderr.fileno(), 4096)
            if not chunk:
                break
            text += chunk.decode(errors="replace")
    finally:
        p.send_signal(sig)
        rest = p.communicate(timeout=60)[1]
    expected = 130 if sig == signal.SIGINT else -sig
    assert p.returncode == expected, text + rest.decode(errors="replace")
    return Killed(progress_of(text), largest_step(text))


def run_to_end(argv):
    p = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    out = p.stdout  # --stats json: one object, after whatever else it printed
    return json.loads(out[out.index("{"):out.rindex("}") + 1])


@needs_nbdkit
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_sigkill_then_resume(tmp_path, seed):
    """A copy SIGKILLed at a seeded moment resumes: the resuming run copies
    exactly what the journal does not hold, the work lost is at most one
    interval (and what was in flight), and the result is identical, with
    the whole source's checksum."""
    require_qemu_img()
    src = make_source(str(tmp_path / "src.raw"))
    dst, journal = str(tmp_path / "dst.raw"), str(tmp_path / "copy.journal")
    kill_at = random.Random(seed).uniform(0.15, 0.85)
    with slow_source(src) as server:
        argv = convert_argv(server.uri, dst, journal, "--checksum=sha256")
        killed = kill_at_progress(argv, kill_at)
        assert os.path.exists(journal) and not os.path.exists(dst)
        stats = run_to_end(argv)
    resumed = stats["bytes_resumed"]
    moved = stats["bytes_written"] + stats["bytes_zeroed"] + stats["bytes_skipped"]
    assert moved == SIZE - resumed  # nothing recorded is copied again
    assert resumed % (64 << 10) == 0  # whole blkhash blocks
    done_at_kill = killed.fraction * SIZE
    assert done_at_kill - resumed <= INTERVAL + SLACK + killed.step * SIZE, (killed, resumed)
    assert not os.path.exists(journal)
    assert [n for n in os.listdir(tmp_path) if n.endswith(".partial")] == []
    assert_same_content(src, dst)
    assert stats["checksum"] == imgcopy.checksum(src)


@needs_nbdkit
def test_killed_again_and_again(tmp_path):
    """Killed four times at seeded moments, every run resuming the last:
    one identical copy in the end, whose checksum is the source's."""
    require_qemu_img()
    src = make_source(str(tmp_path / "src.raw"), seed=11)
    dst, journal = str(tmp_path / "dst.raw"), str(tmp_path / "j")
    rng = random.Random(42)
    with slow_source(src) as server:
        argv = convert_argv(server.uri, dst, journal, "--checksum=sha256")
        for _ in range(4):
            run_killed(argv, rng.uniform(0.1, 0.3))
        stats = run_to_end(argv)
    assert stats["bytes_resumed"] > 0
    assert_same_content(src, dst)
    assert stats["checksum"] == imgcopy.checksum(src)


@needs_nbdkit
def test_existing_destination_resumes(tmp_path):
    """create=False (-n): the existing destination is written in place and
    resumed in place; bytes outside the copy are never touched."""
    require_qemu_img()
    src = make_source(str(tmp_path / "src.raw"), seed=5)
    dst, journal = str(tmp_path / "dst.raw"), str(tmp_path / "j")
    with open(dst, "wb") as f:
        f.truncate(SIZE)
    with slow_source(src) as server:
        argv = convert_argv(server.uri, dst, journal, "-n")
        run_killed(argv, 0.4)
        stats = run_to_end(argv)
    assert stats["bytes_resumed"] > 0
    assert_same_content(src, dst)


@needs_nbdkit
def test_sigint_records_what_finished(tmp_path):
    """Ctrl-C: the copy stops and what its items finished is recorded
    before it returns, so the next run loses nothing to it."""
    src = make_source(str(tmp_path / "src.raw"), seed=9)
    dst, journal = str(tmp_path / "dst.raw"), str(tmp_path / "j")
    with slow_source(src) as server:
        argv = convert_argv(server.uri, dst, journal)
        done_at_stop = run_killed(argv, 0.5, signal.SIGINT) * SIZE
        stats = run_to_end(argv)
    assert stats["bytes_resumed"] >= done_at_stop > 0
    assert_same_content(src, dst)


def test_journal_of_another_copy_is_refused(tmp_path):
    """A journal names its copy: another source, size, destination or
    output option is refused, naming what differs; the destination is
    not touched."""
    src = make_source(str(tmp_path / "src.raw"), size=4 * MiB)
    other = make_source(str(tmp_path / "other.raw"), size=4 * MiB, seed=3)
    dst, journal = str(tmp_path / "dst.raw"), str(tmp_path / "j")
    j = imgcopy._core.Journal(journal, source="x", destination="y", size=1, options="")
    j.close()  # a journal of some other copy
    with pytest.raises(ValueError, match="source"):
        imgcopy.convert(src, dst, journal=journal)
    assert not os.path.exists(dst)
    os.unlink(journal)

    # an interrupted copy of src leaves its journal (an exception in progress)
    def stop(done, total):
        if done:
            raise RuntimeError("stop")

    with pytest.raises(RuntimeError, match="stop"):
        imgcopy.convert(src, dst, journal=journal, request_size="256k", progress=stop)
    assert os.path.exists(journal)
    for keywords, what in [(dict(src=other), "source"),
                           (dict(sparse_threshold="64k"), "options"),
                           (dict(checksum=True), "algorithm"),
                           (dict(dst_format="qcow2"), "destination"),
                           (dict(dst=str(tmp_path / "elsewhere.raw")), "destination")]:
        args = dict(src=src, dst=dst)
        args.update(keywords)
        with pytest.raises(ValueError, match=what):
            imgcopy.convert(args.pop("src"), args.pop("dst"), journal=journal, **args)
    # the right copy resumes
    result = imgcopy.convert(src, dst, journal=journal)
    assert result.bytes_resumed >= 0 and not os.path.exists(journal)
    with open(src, "rb") as a, open(dst, "rb") as b:
        assert a.read() == b.read()


def test_changed_source_is_another_source(tmp_path):
    """A source written since the journal was made (its mtime) is refused:
    resuming would mix two versions of the disk."""
    src = make_source(str(tmp_path / "src.raw"), size=4 * MiB)
    dst, journal = str(tmp_path / "dst.raw"), str(tmp_path / "j")

    def stop(done, total):
        if done:
            raise RuntimeError("stop")

    with pytest.raises(RuntimeError):
        imgcopy.convert(src, dst, journal=journal, request_size="256k", progress=stop)
    os.utime(src, ns=(time.time_ns(), time.time_ns() + 10**9))
    with pytest.raises(ValueError, match="source"):
        imgcopy.convert(src, dst, journal=journal)


def _interrupted_copy(tmp_path, **keywords):
    src = make_source(str(tmp_path / "src.raw"), size=8 * MiB)
    dst, journal = str(tmp_path / "dst.raw"), str(tmp_path / "j")
    calls = []

    def stop(done, total):
        calls.append(done)
        time.sleep(0.02)  # checkpoints (every 1 MiB) have their time
        if done >= 4 * MiB:
            raise RuntimeError("stop")

    with pytest.raises(RuntimeError):
        imgcopy.convert(src, dst, journal=journal, request_size="256k", progress=stop,
                        concurrency=1, journal_interval="1M", **keywords)
    return src, dst, journal


def test_torn_tail_is_dropped_middle_damage_refused(tmp_path):
    """A journal cut in its last record (a crash while appending) resumes
    from the records before; damage before a whole record is refused as
    corrupt."""
    src, dst, journal = _interrupted_copy(tmp_path, checksum=True)
    data = open(journal, "rb").read()
    size = len(data)
    assert size > 200
    with open(journal, "r+b") as f:  # a torn tail
        f.truncate(size - 5)
    result = imgcopy.convert(src, dst, journal=journal, checksum=True)
    assert result.checksum == imgcopy.checksum(src)
    with open(src, "rb") as a, open(dst, "rb") as b:
        assert a.read() == b.read()

    os.unlink(dst)
    src, dst, journal = _interrupted_copy(tmp_path, checksum=True)
    data = bytearray(open(journal, "rb").read())
    header_end = int.from_bytes(data[12:16], "little")
    data[header_end + 20] ^= 0xFF  # inside the first record, whole ones follow
    open(journal, "wb").write(bytes(data))
    with pytest.raises(imgcopy.ImageFormatError, match="corrupt journal"):
        imgcopy.convert(src, dst, journal=journal, checksum=True)


def test_resumed_checksum_and_verify(tmp_path):
    """An interrupted copy with a checksum resumes with the whole copy's
    checksum (the journal's digests for the blocks recorded); verify reads
    the destination back."""
    src, dst, journal = _interrupted_copy(tmp_path, checksum="sha256",
                                          checksum_block_size="128k")
    result = imgcopy.convert(src, dst, journal=journal, checksum="sha256",
                             checksum_block_size="128k", verify=True)
    assert result.bytes_resumed > 0
    assert result.checksum == result.dst_checksum == imgcopy.checksum(src, block_size="128k")


def test_partial_file_named_from_the_journal(tmp_path):
    """A new destination lives in .<name>.<journal>.partial until complete:
    dst never holds an incomplete copy."""
    src, dst, journal = _interrupted_copy(tmp_path)
    partial = tmp_path / ".dst.raw.j.partial"
    assert partial.exists() and not os.path.exists(dst)
    imgcopy.convert(src, dst, journal=journal)
    assert not partial.exists() and os.path.exists(dst)


def test_journal_refusals(tmp_path):
    src = make_source(str(tmp_path / "src.raw"), size=MiB)
    existing = str(tmp_path / "existing.raw")
    with open(existing, "wb") as f:
        f.truncate(MiB)
    dst = str(tmp_path / "dst.raw")
    j = str(tmp_path / "j")
    with pytest.raises(ValueError, match="shard"):
        imgcopy.convert(src, existing, create=False, offset=0, length=MiB, journal=j)
    with pytest.raises(ValueError, match="compare"):
        imgcopy.convert(src, existing, create=False, changed="compare", journal=j)
    with pytest.raises(ValueError, match="null"):
        imgcopy.convert(src, "null:", journal=j)
    for bad, error in [(0, ValueError), (-1, ValueError), (True, TypeError),
                       ("0", ValueError), ([], TypeError)]:
        with pytest.raises(error, match="journal_interval"):
            imgcopy.convert(src, dst, journal=j, journal_interval=bad)
    assert not os.path.exists(j) and not os.path.exists(dst)


def test_qcow2_destination_resumes(tmp_path):
    """A new qcow2 destination interrupted and resumed passes qemu-img
    check and holds the source."""
    require_qemu_img()
    src, _, journal = _interrupted_copy(tmp_path, dst_format="qcow2")
    dst = str(tmp_path / "dst.raw")
    result = imgcopy.convert(src, dst, dst_format="qcow2", journal=journal)
    assert result.bytes_resumed > 0
    qemu_check(dst, "qcow2", strict=True)
    assert_same_content(src, dst, "raw", "qcow2")


@needs_nbdkit
def test_nbd_target_killed_then_resumed(tmp_path):
    """Into an NBD export: the target server is killed mid-copy (the copy
    fails: no retries), started again on the same socket, and the same
    copy resumes from its journal; the export's file holds the source."""
    from .test_nbd_retries import Restartable

    require_qemu_img()
    src = make_source(str(tmp_path / "src.raw"), size=16 * MiB, seed=21)
    target = str(tmp_path / "target.raw")
    with open(target, "wb") as f:
        f.truncate(16 * MiB)
    journal = str(tmp_path / "j")
    with Restartable("--filter=delay", "file", target, "delay-write=300ms") as srv:
        srv.start("--threads=1")
        # one connection, two writes in flight: a checkpoint's flush waits
        # behind those only
        argv = convert_argv(src, srv.uri, journal, "-O", "raw", "--connections", "1",
                            "--requests", "2")
        p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        text = ""
        while progress_of(text) < 0.85:
            chunk = os.read(p.stderr.fileno(), 4096)
            assert chunk, text
            text += chunk.decode(errors="replace")
        srv.kill()
        err = p.communicate(timeout=60)[1].decode(errors="replace")
        assert p.returncode == 1, err
        assert os.path.exists(journal)
        srv.start("--threads=1")
        stats = run_to_end(argv)
    assert stats["bytes_resumed"] > 0
    assert stats["bytes_written"] + stats["bytes_zeroed"] + stats["bytes_skipped"] == \
        16 * MiB - stats["bytes_resumed"]
    assert_same_content(src, target)
