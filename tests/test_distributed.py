"""Fleets and shards on Dask (issue 28): a LocalCluster of worker processes
runs the jobs; a sharded convert into an nbdkit export makes the disk and
its checksum; a worker killed mid-shard changes nothing of the result."""
import os
import random
import signal
import subprocess
import sys
import threading
import time

import pytest

import imgcopy

from .oracles import assert_same_content
from .servers import needs_nbdkit, nbdkit

distributed = pytest.importorskip("distributed")

KiB, MiB = 1 << 10, 1 << 20


@pytest.fixture(scope="module")
def client():
    import dask

    with dask.config.set({"distributed.scheduler.allowed-failures": 5,
                          "distributed.worker.daemon": False}):
        cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=2, processes=True,
                                           dashboard_address=None, silence_logs=40)
        c = distributed.Client(cluster)
        try:
            yield c
        finally:
            c.close()
            cluster.close()


def data_disk(path, size, seed, every=2 * MiB, piece=512 * KiB):
    rng = random.Random(seed)
    with open(path, "wb") as f:
        f.truncate(size)
        for off in range(0, size - piece + 1, every):
            f.seek(off)
            f.write(rng.randbytes(piece))
    return path


def test_import_error_names_the_extra():
    code = ("import sys; sys.modules['distributed'] = None\n"
            "try:\n    import imgcopy.distributed\n"
            "except ImportError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                         check=True).stdout
    assert "imgcopy[distributed]" in out


def test_copy_many_on_worker_processes(client, tmp_path):
    from imgcopy import distributed as idist

    jobs = [imgcopy.CopyJob(data_disk(tmp_path / f"s{i}.raw", 8 * MiB, i), tmp_path / f"d{i}.qcow2",
                            dst_format="qcow2") for i in range(6)]
    jobs.append(imgcopy.CopyJob(tmp_path / "missing.raw", tmp_path / "x.raw"))
    events = []
    results = idist.copy_many(jobs, client=client, max_parallel=3, on_event=events.append)
    for i in range(6):
        assert isinstance(results[i], imgcopy.CopyResult), results[i]
        assert_same_content(jobs[i].src, jobs[i].dst, "raw", "qcow2")
    assert isinstance(results[6], FileNotFoundError)
    done = [e for e in events if e["event"] == "done"]
    assert sorted(e["job"] for e in done) == list(range(6))
    assert any(e["event"] == "failed" and e["job"] == 6 for e in events)
    # the workers' own events came through the scheduler (start, progress)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not any("worker" in e for e in events):
        time.sleep(0.1)
    workers = {e["worker"] for e in events if "worker" in e}
    assert workers and all(w.startswith("tcp://") for w in workers)
    pids = set(client.run(os.getpid).values())
    assert os.getpid() not in pids  # processes, not threads


@needs_nbdkit
def test_sharded_convert_into_an_export(client, tmp_path):
    from imgcopy import distributed as idist

    size = 48 * MiB + 64 * KiB
    src = data_disk(tmp_path / "src.raw", size, 42, every=3 * MiB, piece=MiB)
    with nbdkit("memory", str(size)) as target:
        res = idist.convert(src, target.uri, client=client, create=False, shard_size="8M")
        assert_same_content(src, target.uri, "raw", "raw")
    assert res.checksum == res.dst_checksum == imgcopy.checksum(src)
    assert len(res.shards) >= 3
    assert sum(n for _, n in res.shards) == size
    with pytest.raises(ValueError, match="one writer"):
        idist.convert(src, tmp_path / "x.qcow2", client=client, dst_format="qcow2")


@needs_nbdkit
def test_worker_killed_mid_shard(client, tmp_path):
    """A worker process dies while it copies a shard (a slow source): Dask
    runs its shard again elsewhere; the disk and its checksum are exact."""
    from imgcopy import distributed as idist

    size = 32 * MiB
    src = data_disk(tmp_path / "src.raw", size, 7, every=MiB, piece=MiB)
    dst = tmp_path / "dst.raw"
    started = threading.Event()
    killed = []

    def on_event(event):
        if event["event"] == "progress" and not started.is_set():
            started.set()

    def killer():
        if started.wait(60):
            time.sleep(0.2)
            pid = next(iter(client.run(os.getpid).values()))
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    # one server thread: nbdkit before 1.33.10 dies of a client that hangs
    # up with replies pending (the killed worker does)
    with nbdkit("file", str(src), "delay-read=20ms", filters=["delay"],
                extra=["-r", "--threads=1"]) as slow:
        t = threading.Thread(target=killer)
        t.start()
        try:
            res = idist.convert(slow.uri, dst, client=client, src_format="raw",
                                shard_size="4M", request_size="256k", on_event=on_event)
        finally:
            t.join()
    assert killed
    assert_same_content(src, dst, "raw", "raw")
    assert res.checksum == res.dst_checksum == imgcopy.checksum(src)
    client.wait_for_workers(2, timeout=60)
