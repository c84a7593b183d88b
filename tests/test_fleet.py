"""Fleets (issue 28): many disks in one call on one pool, caps observed from
the events, failures isolated, memory bounded, Ctrl-C and fail_fast."""
import json
import os
import pickle
import random
import resource
import subprocess
import sys
import threading
import time

import pytest

import imgcopy
from imgcopy.fleet import source_host

from .oracles import assert_same_content, qemu_img
from .servers import needs_nbdkit, nbdkit

KiB, MiB = 1 << 10, 1 << 20


def small_disk(path, seed, size=4 * MiB):
    rng = random.Random(seed)
    with open(path, "wb") as f:
        f.truncate(size)
        for _ in range(4):
            f.seek(rng.randrange(0, size - 64 * KiB) // 4096 * 4096)
            f.write(rng.randbytes(rng.choice([4 * KiB, 60 * KiB])))
    return path


def max_running(events):
    running = most = 0
    for e in events:
        if e["event"] == "start":
            running += 1
            most = max(most, running)
        elif e["event"] in ("done", "failed"):
            running -= 1
    return most


def test_copy_job_is_frozen_picklable_and_checked():
    job = imgcopy.CopyJob("a.raw", "b.qcow2", dst_format="qcow2", sparse_threshold="64k")
    assert pickle.loads(pickle.dumps(job)) == job and hash(job) == hash(pickle.loads(
        pickle.dumps(job)))
    with pytest.raises(AttributeError):
        job.src = "c.raw"
    with pytest.raises(TypeError, match="sparse_threshold"):
        imgcopy.CopyJob("a", "b", sparse_treshold=1)
    with pytest.raises(TypeError):
        imgcopy.copy_many(["a.raw"])
    with pytest.raises(ValueError):
        imgcopy.copy_many([job], max_parallel=0)


@needs_nbdkit
def test_fifty_disks_of_every_format(tmp_path):
    jobs, sources = [], []
    for i in range(50):
        raw = small_disk(tmp_path / f"s{i}.raw", i)
        fmt = ["raw", "qcow2", "vmdk", "vhdx", "vpc"][i % 5]
        src = raw
        if fmt != "raw":
            src = tmp_path / f"s{i}.{fmt}"
            qemu_img("convert", "-O", fmt, str(raw), str(src))
        sources.append((src, fmt))
        out_fmt = "qcow2" if i % 3 == 0 else "raw"
        kw = {"dst_format": out_fmt}
        if i % 4 == 1:
            kw["sparse_threshold"] = "64k"
        if i % 7 == 2:
            kw["checksum"] = True
        jobs.append(imgcopy.CopyJob(src, tmp_path / f"d{i}.{out_fmt}", **kw))
    jobs.append(imgcopy.CopyJob(tmp_path / "missing.raw", tmp_path / "never.raw"))
    events = []
    with nbdkit("memory", "4M", "error-pwrite=EIO", "error-pwrite-rate=100%",
                filters=["error"], log=False) as bad:
        jobs.append(imgcopy.CopyJob(tmp_path / "s0.raw", bad.uri, create=False))
        results = imgcopy.copy_many(jobs, max_parallel=5, on_event=events.append)
    assert len(results) == 52
    for i, (src, fmt) in enumerate(sources):
        assert isinstance(results[i], imgcopy.CopyResult), results[i]
        assert_same_content(src, jobs[i].dst, fmt, jobs[i].keywords["dst_format"])
    assert isinstance(results[50], FileNotFoundError)
    assert isinstance(results[51], OSError) and results[51].errno == 5
    assert max_running(events) == 5
    kinds = {e["event"] for e in events}
    assert kinds == {"start", "progress", "done", "failed"}
    failed = [e for e in events if e["event"] == "failed"]
    assert sorted(e["job"] for e in failed) == [50, 51]
    assert all(e["error"] and e["message"] for e in failed)
    done = [e for e in events if e["event"] == "done"]
    assert len(done) == 50 and all(e["done_bytes"] == e["total_bytes"] for e in done)


def test_events_come_from_one_thread_at_a_time(tmp_path):
    jobs = [imgcopy.CopyJob(small_disk(tmp_path / f"s{i}.raw", i, 16 * MiB),
                            tmp_path / f"d{i}.raw") for i in range(8)]
    inside, overlaps = [0], []
    lock = threading.Lock()

    def on_event(event):
        with lock:
            inside[0] += 1
            if inside[0] > 1:
                overlaps.append(event)
        time.sleep(0.001)
        with lock:
            inside[0] -= 1

    imgcopy.copy_many(jobs, max_parallel=8, on_event=on_event)
    assert not overlaps


def test_per_source_caps(tmp_path):
    jobs = []
    with nbdkit("memory", "8M", log=False) as a, nbdkit("memory", "8M", log=False) as b:
        for i in range(6):
            srv = a if i % 2 else b
            jobs.append(imgcopy.CopyJob(srv.uri, tmp_path / f"d{i}.raw", src_format="raw"))
        events = []
        imgcopy.copy_many(jobs, max_parallel=6, per_source={a.uri: 1, b.uri: 2},
                          on_event=events.append)
    for uri, cap in ((a.uri, 1), (b.uri, 2)):
        mine = [e for e in events if e["src"] == uri]
        assert 1 <= max_running(mine) <= cap
    assert source_host(a.uri) != source_host(b.uri)


def test_fail_fast_and_cancelled(tmp_path):
    from .servers import slow_export
    with slow_export("2G") as slow:
        jobs = [imgcopy.CopyJob(tmp_path / "missing.raw", tmp_path / "x.raw")]
        jobs += [imgcopy.CopyJob(slow.uri, "null:", src_format="raw") for _ in range(3)]
        t0 = time.monotonic()
        results = imgcopy.copy_many(jobs, max_parallel=2, fail_fast=True)
    assert time.monotonic() - t0 < 20
    assert isinstance(results[0], FileNotFoundError)
    assert all(isinstance(r, imgcopy.Cancelled) for r in results[1:])


def test_memory_limit_bounds_the_buffers(tmp_path):
    """Eight NBD copies at once keep far fewer bytes in flight with a
    16 MiB limit than without (peak RSS of a child process)."""
    script = """
import imgcopy, sys
jobs = [imgcopy.CopyJob(sys.argv[1], "null:", src_format="raw") for _ in range(8)]
limit = sys.argv[2] if sys.argv[2] != "none" else None
imgcopy.copy_many(jobs, max_parallel=8, memory_limit=limit)
# VmHWM, not ru_maxrss: Linux carries ru_maxrss over exec from the forked
# parent, so a large pytest process would set both peaks
print(next(l.split()[1] for l in open("/proc/self/status") if l.startswith("VmHWM:")))
"""
    with nbdkit("pattern", "256M", log=False) as src:
        peaks = {}
        for limit in ("none", "16M"):
            p = subprocess.run([sys.executable, "-c", script, src.uri, limit],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               timeout=300)
            assert p.returncode == 0, p.stderr
            peaks[limit] = int(p.stdout.strip()) * KiB
    base = peaks["16M"]
    assert peaks["none"] - base > 64 * MiB, peaks


def test_ctrl_c_cancels_all(tmp_path):
    from .servers import slow_export
    script = """
import imgcopy, sys
jobs = [imgcopy.CopyJob(sys.argv[1], "null:", src_format="raw") for _ in range(4)]
print("started", flush=True)
try:
    imgcopy.copy_many(jobs, max_parallel=4)
except KeyboardInterrupt:
    print("interrupted", flush=True)
    sys.exit(130)
"""
    import signal
    with slow_export("4G") as slow:
        p = subprocess.Popen([sys.executable, "-c", script, slow.uri], stdout=subprocess.PIPE,
                             text=True)
        assert p.stdout.readline().strip() == "started"
        time.sleep(1.0)
        p.send_signal(signal.SIGINT)
        out, _ = p.communicate(timeout=30)
    assert p.returncode == 130 and "interrupted" in out


def test_cli_convert_many(tmp_path):
    jobs = [{"src": str(small_disk(tmp_path / f"s{i}.raw", i)), "dst": str(tmp_path / f"d{i}.qcow2"),
             "dst_format": "qcow2"} for i in range(5)]
    jobs.append({"src": str(tmp_path / "missing.raw"), "dst": str(tmp_path / "x.raw")})
    spec = tmp_path / "jobs.json"
    spec.write_text(json.dumps(jobs))
    p = subprocess.run([sys.executable, "-m", "imgcopy", "convert-many", str(spec),
                        "--max-parallel", "2", "--events=json"], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
    assert p.returncode == 1 and "job 5" in p.stderr
    events = [json.loads(line) for line in p.stdout.splitlines()]
    assert max_running(events) <= 2
    assert {e["job"] for e in events if e["event"] == "done"} == set(range(5))
    for i in range(5):
        assert_same_content(jobs[i]["src"], jobs[i]["dst"], "raw", "qcow2")
    bad = tmp_path / "bad.json"
    bad.write_text('[{"src": "a"}]')
    p = subprocess.run([sys.executable, "-m", "imgcopy", "convert-many", str(bad)],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.returncode == 1 and "needs src and dst" in p.stderr
