#!/usr/bin/env python3
"""Fleets (issue 28): 20 disks copied to 20 NBD targets 5 ms away, one after
another with imgcopy.convert, at once with imgcopy.copy_many (with and
without a memory limit), and as 20 nbdcopy processes at once: wall time,
peak memory, requests; then a sizing model for 1,000 disks.

The disks (built once per ``--workdir``, seeded, reused while their stamp
matches): ``--disks`` (20) raw files of 256 MiB, each ~96 MiB of data in
~120 lognormal runs between holes (half text-like, half random content; a
third of the larger runs hold a written zero run; run_images.runs_layout),
a different seed for each.  Read once before every run (warm: the copies,
not the disk, are measured).

The targets: for every run, ``--disks`` fresh ``nbdkit --filter=log
--filter=delay memory 256M`` servers (nbd_servers.target_export: write,
zero and trim delayed ``--delay-ms``, 5), one per disk; stopped after the
run, their logs counted (writes, zeroes, bytes, connections).

Commands (``--tools``), each once per round, round-robin, the first one
rotating, medians of ``--runs`` (5; ``--quick`` 2); every Python one is its
own process (PYTHON this file --child ...), timed from outside as ``CMD &&
sync`` like the other benchmarks here (the targets are in memory: the sync
has little to do):

  loop          for each disk: imgcopy.convert(DISK, URI, src_format="raw")
  many          imgcopy.copy_many(jobs, max_parallel=--max-parallel (20))
  many-64M      the same with memory_limit="64M" (--memory-limit)
  many-4        copy_many(jobs) with its default max_parallel=4 (not by
                default)
  nbdcopy       --disks ``nbdcopy DISK URI`` processes started at once;
                wall time from the first start to the last exit

Memory: a Python command's peak is its VmHWM (/proc/self/status, read at
its end; also its VmRSS after ``import imgcopy``, before any copy: the
interpreter's and the package's share); nbdcopy's the sum (and the
largest) of every process's peak RSS (GNU time's %M).  The fixed cost of a
copy in a fleet: (VmHWM - VmRSS after import - the buffers) / disks at once,
where the buffers are at most memory_limit (the many-64M run), which gives a
range.  The first run of each command is checked: every target read back
over NBD and compared with its disk (``qemu-img compare``).

The sizing model, printed for ``--model-disks`` (1,000) such disks:
  time    ~ max(total requests x latency / (disks at once x connections x
            requests in flight, the server's threads capping the last),
            total data bytes / the bandwidth this machine reached here)
  memory  ~ VmRSS after import + memory_limit + disks at once x the fixed
            cost per copy measured here

``--quick``: 1/8 of each disk (32 MiB), 2 rounds (under a minute).
``--json FILE``: every run.  Exit status 1 if a command fails or a copy
differs.  Servers and commands are stopped whatever happens.
"""
from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
VERSION = 1


# --------------------------------------------------------------------------
# the child: one fleet in this process, its memory read at the end

def status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def child_main(argv: List[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=("loop", "many"))
    ap.add_argument("jobs")
    ap.add_argument("--max-parallel", type=int, default=None)
    ap.add_argument("--memory-limit", default=None)
    a = ap.parse_args(argv)
    import imgcopy
    base = status_kib("VmRSS")
    with open(a.jobs) as f:
        pairs = json.load(f)
    t0 = time.perf_counter()
    results: List[Any] = []
    if a.mode == "loop":
        for src, dst in pairs:
            try:
                results.append(imgcopy.convert(src, dst, src_format="raw"))
            except Exception as exc:   # reported, as copy_many reports it
                results.append(exc)
    else:
        jobs = [imgcopy.CopyJob(src, dst, src_format="raw") for src, dst in pairs]
        kw: Dict[str, Any] = {}
        if a.max_parallel:
            kw["max_parallel"] = a.max_parallel
        if a.memory_limit:
            kw["memory_limit"] = a.memory_limit
        results = imgcopy.copy_many(jobs, **kw)
    seconds = time.perf_counter() - t0
    errors = [repr(r) for r in results if isinstance(r, BaseException)]
    done = [r for r in results if not isinstance(r, BaseException)]
    json.dump({"elapsed": seconds, "vmhwm_kib": status_kib("VmHWM"), "base_rss_kib": base,
               "ok": len(done), "errors": errors,
               "bytes_written": sum(r.bytes_written for r in done),
               "write_requests": sum(r.write_requests for r in done),
               "zero_requests": sum(r.zero_requests for r in done),
               "options": done[0].options.to_dict() if done and hasattr(done[0].options, "to_dict")
               else None}, sys.stdout, default=str)
    return 1 if errors else 0


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "--child":
    sys.exit(child_main(sys.argv[2:]))

import run_images  # noqa: E402
from bench_convert import (REPO, data_extents, fmt_ratio, fmt_s, human, imgcopy_core,  # noqa: E402
                           log, med, pin_imgcopy, warm)
from bench_nbd import TIME, run_timed  # noqa: E402
from make_corpus import ContentGen, align_down, write_layout  # noqa: E402
from nbd_servers import THREADS, NbdkitServer, target_export  # noqa: E402


# --------------------------------------------------------------------------
# the disks

def build(workdir: str, disks: int, scale: float, seed: int) -> List[str]:
    os.makedirs(workdir, exist_ok=True)
    size = align_down(int(256 * MiB * scale), MiB)
    data = align_down(int(96 * MiB * scale))
    runs = max(16, int(round(120 * scale)))
    paths = []
    for i in range(disks):
        path = os.path.join(workdir, "disk-%02d.raw" % i)
        stamp = {"size": size, "data": data, "runs": runs, "seed": seed, "disk": i,
                 "version": VERSION}
        paths.append(path)
        try:
            with open(path + ".json") as f:
                if json.load(f) == stamp and os.path.exists(path):
                    continue
        except (OSError, ValueError):
            pass
        rng = random.Random(seed * 1000003 + 28 * 1009 + i)
        lay = run_images.runs_layout(rng, size, data, runs)
        write_layout(path, lay, ContentGen(seed * 7919 + i, text_fraction=0.5))
        with open(path + ".json", "w") as f:
            json.dump(stamp, f)
    log("fleet: %d disks of %s (%s of data each) in %s" % (disks, human(size), human(data),
                                                             workdir))
    return paths


# --------------------------------------------------------------------------
# one run

def start_targets(stack: contextlib.ExitStack, n: int, size: int,
                  delay: float) -> List[NbdkitServer]:
    return [stack.enter_context(target_export(size, delay)) for _ in range(n)]


def run_nbdcopies(pairs: List[Tuple[str, str]], timeout: float) -> Dict[str, Any]:
    """Every `nbdcopy SRC DST` at once, each under GNU time for its peak RSS;
    wall time from the first start to the last exit, then `sync`."""
    tmp = tempfile.mkdtemp(prefix="imgcopy-bench-fleet-")
    procs: List[subprocess.Popen] = []
    errs = []
    killed: List[bool] = []
    try:
        wrap = os.access(TIME, os.X_OK)
        t0 = time.perf_counter()
        for i, (src, dst) in enumerate(pairs):
            argv = ["nbdcopy", src, dst]
            if wrap:
                argv = [TIME, "-f", "%M", "-o", os.path.join(tmp, "rss-%d" % i)] + argv
            err = open(os.path.join(tmp, "err-%d" % i), "wb")
            errs.append(err)
            procs.append(subprocess.Popen(argv, cwd="/", stdin=subprocess.DEVNULL,
                                          stdout=subprocess.DEVNULL, stderr=err,
                                          start_new_session=True))

        def kill() -> None:
            killed.append(True)
            for p in procs:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
        timer = threading.Timer(timeout, kill)
        timer.start()
        try:
            rcs = [p.wait() for p in procs]
        finally:
            timer.cancel()
        t1 = time.perf_counter()
        if all(rc == 0 for rc in rcs):
            subprocess.run(["sync"], check=True)
        t2 = time.perf_counter()
        rss = []
        for i in range(len(pairs)):
            try:
                v = open(os.path.join(tmp, "rss-%d" % i)).read().split()
                rss.append(int(v[-1]))
            except (OSError, IndexError, ValueError):
                pass
        stderr = ""
        for i, rc in enumerate(rcs):
            if rc != 0:
                stderr += open(os.path.join(tmp, "err-%d" % i), errors="replace").read()[-300:]
        return {"seconds": t2 - t0, "sync_seconds": t2 - t1,
                "rc": 0 if all(rc == 0 for rc in rcs) else max(abs(rc) for rc in rcs),
                "stderr": ("timed out; " if killed else "") + stderr,
                "rss_kib": sum(rss) if len(rss) == len(pairs) else None,
                "rss_max_kib": max(rss) if rss else None, "rss_each": rss}
    finally:
        for p in procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        for e in errs:
            e.close()
        shutil.rmtree(tmp, ignore_errors=True)


def check_targets(pairs: List[Tuple[str, str]]) -> Tuple[bool, str]:
    """Every target read back over NBD equals its disk (qemu-img compare)."""
    for src, uri in pairs:
        r = subprocess.run(["qemu-img", "compare", "-f", "raw", "-F", "raw", src, uri],
                           capture_output=True, text=True)
        if r.returncode != 0 or "identical" not in r.stdout:
            return False, "%s: %s" % (src, (r.stdout + r.stderr).strip()[-300:])
    return True, "identical"


TOOLS = ["loop", "many", "many-64M", "many-4", "nbdcopy"]
DEFAULT_TOOLS = ["loop", "many", "many-64M", "nbdcopy"]


def tool_argv(key: str, python: str, jobs: str, max_parallel: int,
              memory_limit: str) -> Optional[List[str]]:
    me = os.path.abspath(__file__)
    if key == "loop":
        return [python, me, "--child", "loop", jobs]
    if key == "many":
        return [python, me, "--child", "many", jobs, "--max-parallel", str(max_parallel)]
    if key == "many-64M":
        return [python, me, "--child", "many", jobs, "--max-parallel", str(max_parallel),
                "--memory-limit", memory_limit]
    if key == "many-4":
        return [python, me, "--child", "many", jobs]
    return None


def labels_for(max_parallel: int, memory_limit: str) -> Dict[str, str]:
    return {"loop": "convert() loop, one at a time",
            "many": "copy_many(max_parallel=%d)" % max_parallel,
            "many-64M": "copy_many(%d, memory_limit=%s)" % (max_parallel, memory_limit),
            "many-4": "copy_many(max_parallel=4)",
            "nbdcopy": "nbdcopy x N at once"}


# --------------------------------------------------------------------------
# main

def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="disks at 1/8 (32 MiB), 2 rounds")
    ap.add_argument("--scale", type=float, help="of each 256 MiB disk (default 1; --quick 0.125)")
    ap.add_argument("--disks", type=int, default=20)
    ap.add_argument("--runs", type=int, help="rounds (default 5; --quick 2)")
    ap.add_argument("--delay-ms", type=float, default=5.0, help="per target request (5)")
    ap.add_argument("--max-parallel", type=int, default=20, help="copy_many's (default 20)")
    ap.add_argument("--memory-limit", default="64M", help="of the many-64M run (64M)")
    ap.add_argument("--model-disks", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=28)
    ap.add_argument("--workdir", help="default /tmp/imgcopy-bench-fleet[-s<scale>]")
    ap.add_argument("--tools", default=",".join(DEFAULT_TOOLS),
                    help="comma separated (default %s; known %s)" % (
                        ",".join(DEFAULT_TOOLS), ",".join(TOOLS)))
    ap.add_argument("--python", help="interpreter with imgcopy (default the repository's .venv)")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--json", help="write every run here")
    a = ap.parse_args(argv)
    scale = a.scale if a.scale is not None else (0.125 if a.quick else 1.0)
    runs = a.runs if a.runs is not None else (2 if a.quick else 5)
    workdir = a.workdir or ("/tmp/imgcopy-bench-fleet" if scale == 1 else
                            "/tmp/imgcopy-bench-fleet-s%g" % scale)
    python = a.python or os.path.join(REPO, ".venv", "bin", "python")
    if not os.access(python, os.X_OK):
        python = sys.executable
    tools = [t.strip() for t in a.tools.split(",") if t.strip()]
    for t in tools:
        if t not in TOOLS:
            ap.error("unknown tool %r (known %s)" % (t, ", ".join(TOOLS)))
    for prog in ("nbdkit", "nbdcopy", "qemu-img"):
        if not shutil.which(prog):
            sys.exit("bench_fleet: %s not found (apt-get install -y nbdkit libnbd-bin qemu-utils)"
                     % prog)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    pypath, pin_dir = pin_imgcopy(python)
    atexit.register(shutil.rmtree, pin_dir, True)
    env = dict(os.environ, PYTHONPATH=pypath)
    labels = labels_for(a.max_parallel, a.memory_limit)

    disks = build(workdir, a.disks, scale, a.seed)
    size = os.path.getsize(disks[0])
    extents = {d: data_extents(d) for d in disks}
    data_total = sum(n for ex in extents.values() for _, n in ex)
    jobs_file = os.path.join(workdir, "jobs.json")

    load_start = open("/proc/loadavg").read().split()[:3]
    git = subprocess.run(["git", "-C", REPO, "describe", "--always", "--dirty"],
                         capture_output=True, text=True).stdout.strip()
    nbdcopy_v = subprocess.run(["nbdcopy", "--version"], capture_output=True,
                               text=True).stdout.splitlines()[0]
    print("fleet (issue 28): %d disks of %s (%s of data in all) into %d nbdkit memory targets at "
          "%g ms per write/zero; seconds of `CMD && sync`, medians of %d rounds" % (
              a.disks, human(size), human(data_total), a.disks, a.delay_ms, runs))
    print("load %s, %d CPUs; imgcopy %s (_core %s); %s" % (
        " ".join(load_start), os.cpu_count(), git or "?", imgcopy_core(python, env)[1], nbdcopy_v))
    for t in tools:
        argv_t = tool_argv(t, python, "JOBS.json", a.max_parallel, a.memory_limit)
        print("  %-34s %s" % (labels[t], " ".join(argv_t) if argv_t else
                              "nbdcopy DISK nbd+unix:///?socket=... (x %d, at once)" % a.disks))

    runs_log: List[Dict] = []
    times: Dict[str, List[float]] = {t: [] for t in tools}
    recs: Dict[str, List[Dict]] = {t: [] for t in tools}
    checks: Dict[str, Tuple[bool, str]] = {}
    failed = False
    for rnd in range(runs):
        order = tools[rnd % len(tools):] + tools[:rnd % len(tools)]
        load = " ".join(open("/proc/loadavg").read().split()[:3])
        log("round %d (load %s)" % (rnd + 1, load))
        for key in order:
            for d in disks:
                warm(d, extents[d])
            with contextlib.ExitStack() as stack:
                targets = start_targets(stack, a.disks, size, a.delay_ms)
                pairs = [(d, t.uri) for d, t in zip(disks, targets)]
                with open(jobs_file, "w") as f:
                    json.dump(pairs, f)
                if key == "nbdcopy":
                    rec = run_nbdcopies(pairs, a.timeout)
                else:
                    argv_t = tool_argv(key, python, jobs_file, a.max_parallel, a.memory_limit)
                    assert argv_t
                    rec = run_timed(argv_t, env, a.timeout, sync=True, stdout=True)
                    out = rec.pop("stdout", "") or ""
                    try:
                        rec["child"] = json.loads(out[out.index("{"):out.rindex("}") + 1])
                    except ValueError:
                        rec["child"] = {}
                w = z = wb = conns = 0
                for t in targets:        # before the check's own connections
                    n, tot = t.totals()
                    w += tot.get("Write", [0, 0])[0]
                    wb += tot.get("Write", [0, 0])[1]
                    z += tot.get("Zero", [0, 0])[0] + tot.get("Trim", [0, 0])[0]
                    conns += t.active_connections()
                if rec["rc"] == 0 and key not in checks:
                    checks[key] = check_targets(pairs)
                    if not checks[key][0]:
                        failed = True
                        log("  DIFFERS: %s: %s" % (labels[key], checks[key][1]))
            rec.update(tool=key, round=rnd, load=load, writes=w, zeros=z, write_bytes=wb,
                       connections=conns)
            runs_log.append(rec)
            if rec["rc"] != 0:
                failed = True
                log("  FAILED %s: %s" % (labels[key], rec["stderr"][-800:]))
                continue
            times[key].append(rec["seconds"])
            recs[key].append(rec)
            child = rec.get("child", {})
            log("  %-34s %s s (inner %s)  writes %d, zeros %d, conns %d, peak %s MiB" % (
                labels[key], fmt_s(rec["seconds"]), fmt_s(child.get("elapsed")), w, z, conns,
                "%.0f" % (peak_kib(rec) / KiB) if peak_kib(rec) else "?"))
    load_end = open("/proc/loadavg").read().split()[:3]

    # the table
    print()
    print("== %d disks x %s (%s of data in all), targets at %g ms per request; %d rounds; load "
          "%s -> %s ==" % (a.disks, human(size), human(data_total), a.delay_ms, runs,
                           " ".join(load_start), " ".join(load_end)))
    print("%-34s %7s %7s %7s %7s %7s %7s %5s %9s %9s %8s  %s" % (
        "command", "median", "min", "max", "inner", "writes", "zeros", "conns", "peak MiB",
        "base MiB", "/nbdcopy", "check"))
    nbd_med = med(times.get("nbdcopy", []))
    summary: Dict[str, Dict[str, Any]] = {}
    for key in tools:
        v = times[key]
        if not v:
            print("%-34s no successful run" % labels[key])
            continue
        rs = recs[key]
        m = statistics.median(v)
        peak = max(peak_kib(r) or 0 for r in rs)
        base = med([r["child"]["base_rss_kib"] for r in rs if r.get("child", {}).get("base_rss_kib")])
        inner = med([r["child"]["elapsed"] for r in rs if r.get("child", {}).get("elapsed")])
        s = {"median": m, "min": min(v), "max": max(v), "inner": inner, "peak_kib": peak,
             "base_kib": base, "writes": med([r["writes"] for r in rs]),
             "zeros": med([r["zeros"] for r in rs]),
             "connections": med([r["connections"] for r in rs])}
        if key == "nbdcopy":
            s["largest_kib"] = max(r.get("rss_max_kib") or 0 for r in rs)
        summary[key] = s
        print("%-34s %7s %7s %7s %7s %7d %7d %5d %9s %9s %8s  %s" % (
            labels[key], fmt_s(m), fmt_s(min(v)), fmt_s(max(v)), fmt_s(inner), s["writes"],
            s["zeros"], s["connections"], "%.0f" % (peak / KiB) if peak else "-",
            "%.0f" % (base / KiB) if base else "-", fmt_ratio(m / nbd_med if nbd_med else None),
            checks.get(key, (None, "-"))[1] if checks.get(key, (True,))[0] else "DIFFERS"))
    print("(peak: VmHWM of the Python process (copy_many, the loop); for nbdcopy the sum of the "
          "%d processes' peak RSS%s; base: VmRSS after `import imgcopy`; inner: the fleet's own "
          "seconds in the process)" % (
              a.disks, ", the largest %.0f MiB" % (summary["nbdcopy"]["largest_kib"] / KiB)
              if "nbdcopy" in summary else ""))

    # the fixed cost of a copy, and the model
    model = sizing(summary, a, data_total, size)
    if a.json:
        with open(a.json, "w") as out:
            json.dump({"disks": a.disks, "size": size, "data_total": data_total,
                       "runs": runs_log, "summary": summary, "model": model,
                       "checks": checks, "load": [load_start, load_end]}, out, indent=1,
                      default=str)
        print("raw runs: %s" % a.json)
    print("load average: start %s, end %s" % (" ".join(load_start), " ".join(load_end)))
    if failed:
        print("FAILED: a command failed or a copy differs (see above)")
    return 1 if failed else 0


def peak_kib(rec: Dict) -> Optional[int]:
    child = rec.get("child") or {}
    return child.get("vmhwm_kib") or rec.get("rss_kib")


def parse_mib(text: str) -> float:
    units = {"k": KiB, "m": MiB, "g": GiB}
    t = text.strip().lower().rstrip("ib").rstrip("b")
    if t and t[-1] in units:
        return float(t[:-1]) * units[t[-1]] / MiB
    return float(t) / MiB


def sizing(summary: Dict[str, Dict[str, Any]], a: argparse.Namespace, data_total: int,
           size: int) -> Dict[str, Any]:
    """The per-copy fixed cost measured here and the model for --model-disks."""
    out: Dict[str, Any] = {}
    n, p, lat = a.disks, a.max_parallel, a.delay_ms / 1000
    print()
    print("== sizing ==")
    limited = summary.get("many-64M")
    free = summary.get("many")
    limit_mib = parse_mib(a.memory_limit)
    at_once = min(p, n)
    if limited and limited.get("base_kib"):
        hwm = limited["peak_kib"] / KiB
        base = limited["base_kib"] / KiB
        lo = max(0.0, (hwm - base - limit_mib) / at_once)
        hi = (hwm - base) / at_once
        out.update(fixed_lo_mib=lo, fixed_hi_mib=hi, base_mib=base, limited_peak_mib=hwm)
        print("fixed cost of a copy: (VmHWM %.0f - VmRSS after import %.0f - buffers <= %.0f MiB) "
              "/ %d at once = %.1f .. %.1f MiB" % (hwm, base, limit_mib, at_once, lo, hi))
    if free and free.get("base_kib"):
        hwm = free["peak_kib"] / KiB
        out["unlimited_peak_mib"] = hwm
        print("without a memory limit: VmHWM %.0f MiB for %d at once (%.1f MiB a copy above the "
              "import)" % (hwm, at_once, (hwm - free["base_kib"] / KiB) / at_once))
    best = min((s["median"], k) for k, s in summary.items()) if summary else None
    ref = free or limited
    if ref:
        reqs = (ref["writes"] + ref["zeros"]) / n
        conns = max(1.0, ref["connections"] / n)
        per_disk_data = data_total / n
        in_flight = THREADS                # nbdkit serves 16 requests at once per connection
        lat_term = a.model_disks * reqs * lat / (at_once * conns * in_flight)
        bw = data_total / (ref["inner"] or ref["median"])
        bw_term = a.model_disks * per_disk_data / bw
        out.update(requests_per_disk=reqs, connections_per_copy=conns, bandwidth=bw,
                   latency_term_s=lat_term, bandwidth_term_s=bw_term)
        print("measured: %.0f requests a disk (writes + zeroes), %.1f connections a copy, "
              "%s/s of data through copy_many(%d) here" % (reqs, conns, human(bw), p))
        print("model for %d disks like these (%s virtual, %s data each), %d at once:" % (
            a.model_disks, human(size), human(per_disk_data), at_once))
        print("  time   ~ max(%d x %.0f requests x %g ms / (%d x %.0f connections x %d in flight), "
              "%s / %s/s) = max(%.1f s, %.1f s) = %.1f s" % (
                  a.model_disks, reqs, a.delay_ms, at_once, conns, in_flight,
                  human(a.model_disks * per_disk_data), human(bw), lat_term, bw_term,
                  max(lat_term, bw_term)))
        if "fixed_hi_mib" in out:
            print("  memory ~ %.0f MiB (interpreter + imgcopy) + memory_limit %.0f MiB + %d x "
                  "%.1f .. %.1f MiB = %.0f .. %.0f MiB (independent of the number of disks: "
                  "max_parallel bounds it)" % (
                      out["base_mib"], limit_mib, at_once, out["fixed_lo_mib"], out["fixed_hi_mib"],
                      out["base_mib"] + limit_mib + at_once * out["fixed_lo_mib"],
                      out["base_mib"] + limit_mib + at_once * out["fixed_hi_mib"]))
    if best:
        out["fastest"] = best[1]
    return out


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit("bench_fleet: interrupted")
