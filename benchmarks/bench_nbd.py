#!/usr/bin/env python3
"""Copying a sparse raw image into an NBD export: imgcopy against qemu-img
convert and nbdcopy, in one run, counting the requests on the wire.

The target is an nbdkit memory export the size of the source, started
afresh (all zero) for every run, behind two filters::

    nbdkit -U SOCK --filter=log --filter=delay memory SIZE \\
           logfile=LOG delay-write=Dms delay-zero=Dms

the log filter first (it counts what the client sent: Write / Zero / Trim
commands and their bytes), the delay filter after it: D = 0 ms (the copy's
own cost) and D = 5 ms per write and zero request (a remote, slow target,
where the number of requests and how many are in flight decide).  A memory
target holds nothing to sync: a run is timed as the command alone (no
``&& sync``); the source's data is read once before each run (warm cache:
the NBD side is what is measured).

Sources (``make_corpus.py``, ``--scale`` like bench_convert.py, same corpus
directory; built or reused):

  sparse-6g.raw   OS-like: 6 GiB virtual, 1.2 GiB data in 107 runs, 615
                  allocated zero runs inside them (make_corpus.py)
  mixed-1g.raw    1 GiB virtual, ~172 MiB allocated in 400 lognormal runs
                  (4 KiB .. tens of MiB), a third of the larger ones with a
                  written zero run (4-256 KiB); half text-like, half random
                  content; built here, seeded

Commands (``--tools`` keys), each once per round, round-robin, the first one
rotating from round to round; medians of ``--runs`` rounds:

  qemu-img          qemu-img convert -n -f raw -O raw SRC URI
  qemu-img-S64k     ... -S 64k
  qemu-img-W-m16    ... -W -m 16 -S 64k
  nbdcopy           nbdcopy SRC URI
  nbdcopy-4M        nbdcopy --request-size=4194304 SRC URI
  imgcopy           PYTHON -m imgcopy convert -n -f raw -O raw SRC URI
  baseline          the same with --baseline PYTHON (another build)

An imgcopy that fails without ever connecting to the server does not speak
NBD yet: "imgcopy: not supported yet" is printed and the run goes on without
it (a failure after connecting is a failure).  In the first round of each
image, every output is checked with ``qemu-img compare -f raw -F raw SRC
URI`` while its server still runs.

Tables: per image and delay, median / min / max seconds, the Write and Zero
commands, bytes written (Write payload on the wire) and zeroed, connections,
and median / best anchor's median (> 1: slower than the fastest of qemu-img
and nbdcopy).  ``--quick``: scale 0.0625 and 2 runs; ``--json FILE``: every
run.  Exit status 1 if a command fails or an output differs.  Servers are
stopped whatever happens (Ctrl-C included).
"""
from __future__ import annotations

import argparse
import atexit
import json
import math
import os
import platform
import random
import shutil
import signal
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_convert import (BASELINE, REPO, add_common_arguments, argv_for, build_corpus,  # noqa: E402
                           common_choices, data_extents, fmt_ratio, fmt_s, human, imgcopy_core,
                           is_anchor, is_imgcopy, log, med, pin_imgcopy, warm)
from make_corpus import BLK, ContentGen, align_down, split_total, write_layout  # noqa: E402
from nbd_servers import NbdkitServer  # noqa: E402

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
OS_IMAGE, MIXED = "sparse-6g.raw", "mixed-1g.raw"
IMAGES = [OS_IMAGE, MIXED]
DELAYS = [0, 5]
MIXED_VERSION = 1


# --------------------------------------------------------------------------
# the mixed image

def mixed_layout(scale: float, seed: int) -> Dict:
    """1 GiB x scale, 172 MiB x scale allocated in lognormal runs, holes
    between; one written zero run in a third of the runs >= 64 KiB."""
    rng = random.Random(seed * 1000003 + 7)
    size = align_down(int(GiB * scale), MiB)
    data_total = align_down(int(172 * MiB * scale))
    n = max(8, int(round(400 * min(1.0, scale * 16))))
    lengths = split_total(rng, data_total, n, 1.3, BLK)
    holes = split_total(rng, size - data_total, n, 1.0, BLK)      # the last one trails
    data, zeros, off = [], [], 0
    for ln, hole in zip(lengths, holes):
        data.append((off, ln))
        if ln >= 64 * KiB and rng.random() < 1 / 3:
            z = align_down(int(math.exp(rng.uniform(math.log(4 * KiB), math.log(256 * KiB)))))
            z = max(BLK, min(z, align_down(ln // 4)))
            zeros.append((off + BLK + align_down(rng.randrange(ln - z - 2 * BLK)), z))
        off += ln + hole
    assert off == size, (off, size)
    return {"size": size, "data": data, "zeros": zeros}


def build_mixed(corpus: str, scale: float, seed: int = 4) -> str:
    path = os.path.join(corpus, MIXED)
    stamp = {"scale": scale, "seed": seed, "version": MIXED_VERSION}
    try:
        with open(path + ".json") as f:
            if json.load(f)["stamp"] == stamp and os.path.exists(path):
                return path
    except (OSError, ValueError, KeyError):
        pass
    lay = mixed_layout(scale, seed)
    log("%s: building (%s virtual, %s allocated in %d runs, %d zero runs)" % (
        MIXED, human(lay["size"]), human(sum(n for _, n in lay["data"])), len(lay["data"]),
        len(lay["zeros"])))
    write_layout(path, lay, ContentGen(seed * 7 + 17, text_fraction=0.5))
    with open(path + ".json", "w") as f:
        json.dump({"stamp": stamp, "layout": lay}, f)
    return path


# --------------------------------------------------------------------------
# the commands

def tool_table(python: str) -> List[Tuple[str, str, List[str]]]:
    """(key, label, argv with SRC / DST placeholders); DST is the export's URI."""
    qemu = ["qemu-img", "convert", "-n", "-f", "raw", "-O", "raw"]
    return [
        ("qemu-img", "qemu-img", qemu + ["SRC", "DST"]),
        ("qemu-img-S64k", "qemu-img -S 64k", qemu + ["-S", "64k", "SRC", "DST"]),
        ("qemu-img-W-m16", "qemu-img -W -m16 -S64k",
         qemu + ["-W", "-m", "16", "-S", "64k", "SRC", "DST"]),
        ("nbdcopy", "nbdcopy", ["nbdcopy", "SRC", "DST"]),
        # nbdcopy 1.14 takes no size suffix
        ("nbdcopy-4M", "nbdcopy 4M", ["nbdcopy", "--request-size=%d" % (4 * MiB), "SRC", "DST"]),
        ("imgcopy", "imgcopy", [python, "-m", "imgcopy", "convert", "-n", "-f", "raw", "-O", "raw",
                                "SRC", "DST"]),
        ("imgcopy-S64k", "imgcopy -S 64k", [python, "-m", "imgcopy", "convert", "-n", "-f", "raw",
                                            "-O", "raw", "-S", "64k", "SRC", "DST"]),
    ]


def compare(src: str, uri: str) -> Dict:
    r = subprocess.run(["qemu-img", "compare", "-f", "raw", "-F", "raw", src, uri],
                       capture_output=True, text=True)
    return {"identical": r.returncode == 0 and "identical" in r.stdout,
            "compare": (r.stdout + r.stderr).strip()[-500:]}


def run_once(argv: List[str], src: str, size: int, delay_ms: int, check: bool,
             env: Optional[Dict[str, str]], timeout: float) -> Dict:
    """One copy into a fresh memory export: seconds, the commands it sent,
    and with check, qemu-img compare of the export against the source."""
    args = [str(size), "delay-write=%dms" % delay_ms, "delay-zero=%dms" % delay_ms]
    with NbdkitServer("memory", args, filters=["delay"]) as srv:
        argv = [srv.uri if a == "DST" else a for a in argv]
        t0 = time.perf_counter()
        try:
            r = subprocess.run(argv, cwd="/", stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, env=env, timeout=timeout)
            rc, err = r.returncode, r.stderr.decode(errors="replace").strip()
        except subprocess.TimeoutExpired:
            rc, err = -1, "timed out after %.0f s" % timeout
        secs = time.perf_counter() - t0
        conns, totals = srv.totals()
        rec = {"seconds": secs if rc == 0 else None, "rc": rc, "connections": conns}
        for kind in ("Write", "Zero", "Trim"):
            n, b = totals.get(kind, (0, 0))
            rec[kind.lower() + "s"], rec[kind.lower() + "_bytes"] = n, b
        if rc != 0:
            rec["stderr"] = err[-2000:]
        elif check:
            rec["check"] = compare(src, srv.uri)
    return rec


# --------------------------------------------------------------------------
# tables

COUNTS = ("writes", "zeros", "write_bytes", "zero_bytes", "connections")


def print_table(image, size, data, delay, tools, times, counts, checks, notes, runs):
    print()
    print("== %s (%s virtual, %s data) -> nbdkit memory, delay %d ms per write/zero, %d rounds ==" % (
        image, human(size), human(data), delay, runs))
    anchors = [med(times[k]) for k, _, _ in tools if is_anchor(k) and times[k]]
    best = min(anchors) if anchors else None
    print("%-24s %8s %8s %8s %7s %7s %11s %11s %5s %6s  %s" % (
        "tool", "median", "min", "max", "writes", "zeros", "written", "zeroed", "conns",
        "/best", "check"))
    for key, label, _ in tools:
        v = times[key]
        if not v:
            print("%-24s %s" % (label, notes.get(key, "no successful run")))
            continue
        c = {f: int(statistics.median(counts[key][f])) for f in COUNTS}
        m = statistics.median(v)
        chk = checks.get(key)
        print("%-24s %8s %8s %8s %7d %7d %11s %11s %5d %6s  %s" % (
            label, fmt_s(m), fmt_s(min(v)), fmt_s(max(v)), c["writes"], c["zeros"],
            human(c["write_bytes"]), human(c["zero_bytes"]), c["connections"],
            fmt_ratio(m / best if best else None),
            "-" if chk is None else "identical" if chk["identical"] else "DIFFERS"))
    print("(/best: median / the fastest anchor's median, > 1 = slower; writes, zeros: NBD "
          "commands, median over the rounds; written: Write payload on the wire)")


def print_summary(results, tools) -> None:
    labels = {k: l for k, l, _ in tools}
    has_base = any(k == BASELINE for k, _, _ in tools)
    print()
    print("== summary: medians in seconds; ratio = best anchor / imgcopy (> 1 = imgcopy faster) ==")
    print("%-15s %6s  %-24s %8s %9s %7s%s" % ("image", "delay", "best anchor", "median", "imgcopy",
                                             "ratio", "  baseline/imgcopy" if has_base else ""))
    for (image, delay), times in results.items():
        anchors = [(statistics.median(v), k) for k, v in times.items() if is_anchor(k) and v]
        best = min(anchors) if anchors else None
        im, base = med(times.get("imgcopy", [])), med(times.get(BASELINE, []))
        print("%-15s %4d ms  %-24s %8s %9s %7s%s" % (
            image, delay, labels[best[1]] if best else "-", fmt_s(best[0] if best else None),
            fmt_s(im), fmt_ratio(best[0] / im if best and im else None),
            "  %s" % fmt_ratio(base / im if base and im else None) if has_base else ""))


# --------------------------------------------------------------------------
# main

def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_arguments(ap, IMAGES, quick_runs=2)
    ap.add_argument("--delays", default=",".join(map(str, DELAYS)),
                    help="milliseconds per write and zero request, comma separated (default 0,5)")
    ap.add_argument("--tools", default="", help="tool keys, comma separated (default: all): "
                    + ",".join(k for k, _, _ in tool_table("python")))
    ap.add_argument("--python", help="interpreter with imgcopy installed "
                    "(default %s/.venv/bin/python)" % REPO)
    ap.add_argument("--baseline", metavar="PYTHON",
                    help="also time PYTHON -m imgcopy convert (another build) in the same rounds")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds a command may take")
    ap.add_argument("--json", help="write every run here")
    a = ap.parse_args(argv)

    scale, runs, corpus, images, python = common_choices(ap, a, IMAGES, quick_runs=2)
    delays = [int(d) for d in a.delays.split(",") if d.strip()]
    tools = tool_table(python)
    if a.tools:
        want = [t.strip() for t in a.tools.split(",") if t.strip()]
        for t in want:
            if t not in [k for k, _, _ in tools]:
                ap.error("unknown tool %r" % t)
        tools = [t for t in tools if t[0] in want]
    if a.baseline:
        plain = {k: t for k, _, t in tool_table("")}["imgcopy"]
        tools.append((BASELINE, "imgcopy baseline", [a.baseline] + plain[1:]))
    for prog in ["nbdkit", "qemu-img"] + [t[2][0] for t in tools if is_anchor(t[0])]:
        if not shutil.which(prog):
            sys.exit("bench_nbd: %s not found (apt-get install -y nbdkit qemu-utils libnbd-bin)" % prog)

    # imgcopy from a private copy of the venv's package: a rebuild meanwhile cannot mix builds
    pin_env = None
    if any(k == "imgcopy" for k, _, _ in tools):
        pypath, pin_dir = pin_imgcopy(python)
        atexit.register(shutil.rmtree, pin_dir, True)
        pin_env = dict(os.environ, PYTHONPATH=pypath)
    # a plain `kill` unwinds too: servers stopped, the private copy removed
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    os.makedirs(corpus, exist_ok=True)
    if OS_IMAGE in images:
        build_corpus(python, corpus, scale, [OS_IMAGE])
    paths = {OS_IMAGE: os.path.join(corpus, OS_IMAGE)}
    if MIXED in images:
        paths[MIXED] = build_mixed(corpus, scale)

    def version(cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True).stdout.splitlines()[0]
        except (OSError, IndexError):
            return "?"
    meta: Dict[str, Any] = {
            "host": platform.node(), "kernel": platform.release(), "cpus": os.cpu_count(),
            "scale": scale, "runs": runs, "corpus": corpus, "delays_ms": delays,
            "versions": {"qemu-img": version(["qemu-img", "--version"]),
                         "nbdcopy": version(["nbdcopy", "--version"]),
                         "nbdkit": version(["nbdkit", "--version"]),
                         "imgcopy": "%s (_core %s)" % (python, imgcopy_core(python, pin_env)[1])},
            "loadavg_start": open("/proc/loadavg").read().split()[:3],
            "tools": {k: " ".join(t) for k, _, t in tools}}
    print("copies into an nbdkit memory export (log + delay filters); wall time of the command, "
          "seconds (no sync: a memory target)")
    print("scale %g, %d rounds, delays %s ms, %s CPUs, load %s" % (
        scale, runs, ",".join(map(str, delays)), meta["cpus"], " ".join(meta["loadavg_start"])))
    for k, v in meta["versions"].items():
        print("  %-9s %s" % (k, v))
    for k, l, t in tools:
        print("  %-24s %s" % (l, " ".join(t)))

    runs_log: List[Dict] = []
    results: Dict[Tuple[str, int], Dict[str, List[float]]] = {}
    unsupported: Dict[str, str] = {}
    failed = False
    for image in images:
        src = paths[image]
        size = os.path.getsize(src)
        extents = data_extents(src)
        data = sum(n for _, n in extents)
        checks: Dict[str, Dict] = {}
        for delay in delays:
            times: Dict[str, List[float]] = {k: [] for k, _, _ in tools}
            counts: Dict[str, Dict[str, List[int]]] = {k: {f: [] for f in COUNTS} for k, _, _ in tools}
            results[(image, delay)] = times
            log("%s, delay %d ms: %d rounds x %d tools" % (image, delay, runs, len(tools)))
            for rnd in range(runs):
                order = tools[rnd % len(tools):] + tools[:rnd % len(tools)]
                for key, label, tmpl in order:
                    if key in unsupported:
                        continue
                    warm(src, extents)
                    rec = run_once(argv_for(tmpl, src, "DST"), src, size, delay,
                                   key not in checks, pin_env if key == "imgcopy" else None,
                                   a.timeout)
                    rec.update(image=image, delay_ms=delay, round=rnd, tool=key)
                    runs_log.append(rec)
                    if rec["rc"] != 0:
                        last = rec["stderr"].splitlines()[-1] if rec["stderr"] else "rc %d" % rec["rc"]
                        if is_imgcopy(key) or key == BASELINE:
                            if rec["connections"] == 0:
                                unsupported[key] = "not supported yet (never connected: %s)" % last
                                print("%s: not supported yet (%s)" % (label, last), flush=True)
                                continue
                        failed = True
                        log("  FAILED %s (rc %d): %s" % (label, rec["rc"], rec["stderr"][-500:]))
                        continue
                    times[key].append(rec["seconds"])
                    for f in COUNTS:
                        counts[key][f].append(rec[f])
                    if "check" in rec:
                        checks[key] = rec["check"]
                        if not rec["check"]["identical"]:
                            failed = True
                            log("  DIFFERS: %s: %s" % (label, rec["check"]["compare"]))
                    log("  round %d %-24s %s s  %d writes, %d zeros, %d connections" % (
                        rnd + 1, label, fmt_s(rec["seconds"]), rec["writes"], rec["zeros"],
                        rec["connections"]))
            print_table(image, size, data, delay, tools, times, counts, checks, unsupported, runs)
    print_summary(results, tools)
    for key, why in unsupported.items():
        print("%s: %s" % (key, why))

    if a.json:
        with open(a.json, "w") as out:
            json.dump({"meta": meta, "runs": runs_log, "unsupported": unsupported,
                       "medians": {"%s/%dms" % k: {t: med(v) for t, v in times.items()}
                                   for k, times in results.items()}}, out, indent=1)
        print("raw runs: %s" % a.json)
    if failed:
        print("FAILED: a command failed or an output differs (see above)")
    return 1 if failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:      # the servers are stopped already (their finally ran)
        sys.exit("bench_nbd: interrupted")
