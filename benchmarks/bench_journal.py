#!/usr/bin/env python3
"""Resumable copies (issue 27): what ``--journal`` costs a copy that does
not fail, and what a kill loses with it.

Part 1, the cost.  The corpus's ``full-1g.raw`` (make_corpus.py: 1 GiB of
random data; ``--image`` takes another corpus image) copied, alternating,
each command once per round, the first one rotating, medians of ``--runs``
(9; ``--quick`` 2), each timed as ``CMD && sync``:

  file -> file   PYTHON -m imgcopy convert -f raw -O raw SRC DST (a new
                 file in CORPUS/bench-dst, deleted before each run, with
                 the journal and any ``.partial`` file; the source read
                 once before each run: warm)
  file -> NBD    PYTHON -m imgcopy convert -n -f raw -O raw SRC URI, URI a
                 fresh ``nbdkit --filter=log --filter=delay memory SIZE``
                 (no delay) for every run

each as ``plain`` (no journal), ``journal`` (``--journal PATH``: a
checkpoint every 5 s, the default) and ``journal-1s`` (``--journal PATH
--journal-interval 1``).  Printed: medians, min, max, the ``sync`` part,
the copy's own seconds (``--stats json`` elapsed), and journal / plain
(issue 27's aim: <= 1.03, i.e. at most 3% slower).

Part 2, the work lost to a kill.  The same image served by ``nbdkit -r
--threads=1 --filter=log --filter=noparallel --filter=multi-conn
--filter=delay file`` (serialize=all-requests, multi-conn-mode=disable: one
request at a time, as a VDDK source serves) with ``delay-read`` and
``delay-extents`` chosen so that the copy takes about ``--kill-seconds``
(20; ``--quick`` 6; one server thread: nbdkit before 1.33.10 dies when a
killed client leaves replies its other threads still write), copied to a
new local file with ``-p --stats json --journal PATH --journal-interval I``
for each I of ``--intervals`` (5 s, the default; 1 s; 256M, a size: once
that much more is done).  First one uninterrupted run per interval (its
rate calibrates the bound), then for each of ``--kills`` seeded points in
15 .. 85% of the copy: run, SIGKILL once its ``-p`` progress on stderr
reaches the point, run the same command again to the end, read its
``bytes_resumed``.  Printed per kill: the progress seen at the kill (a
lower bound of what was done), what the journal held (bytes_resumed), the
work lost (done at the kill - resumed: what the second run copied again),
in MiB and in seconds at the copy's rate, the bound (the interval's worth:
I seconds x the rate, or I bytes) and lost / bound; the resumed run's
seconds against the uninterrupted run's; the output checked with
``qemu-img compare``, the journal and the ``.partial`` file gone.

``--quick``: scale 1/16 (64 MiB), 2 rounds, intervals 1 s and 8M, one kill
each (under a minute or so).  ``--json FILE``: every run.  Exit status 1 if
a command fails or a copy differs.  Servers and commands are stopped
whatever happens.
"""
from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_convert import (QUICK_SCALE, REPO, build_corpus, data_extents, fmt_ratio,  # noqa: E402
                           fmt_s, human, imgcopy_core, log, med, pin_imgcopy, rm, warm)
from bench_nbd import run_timed  # noqa: E402
from nbd_servers import NbdkitServer, target_export  # noqa: E402

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
IMAGE = "full-1g.raw"
REQUEST = 2 * MiB
AIM = 1.03
PROGRESS = re.compile(r"\((\d+\.\d+)/100%\)")


def parse_size(text: str) -> Optional[int]:
    """"256M" -> bytes; a plain number (seconds) -> None."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgG])i?[bB]?", text.strip())
    if not m:
        return None
    return int(float(m.group(1)) * {"k": KiB, "m": MiB, "g": GiB}[m.group(2).lower()])


def stats_of(text: Optional[str]) -> Dict[str, Any]:
    if not text or "{" not in text:
        return {}
    try:
        return json.loads(text[text.index("{"):text.rindex("}") + 1])
    except ValueError:
        return {}


# --------------------------------------------------------------------------
# part 1: the cost

VARIANTS = [("plain", []), ("journal", ["--journal", "JOURNAL"]),
            ("journal-1s", ["--journal", "JOURNAL", "--journal-interval", "1"])]


def cost(python: str, env: Dict[str, str], src: str, dst_dir: str, runs: int,
         directions: List[str], timeout: float) -> Tuple[Dict, List[Dict], bool]:
    size = os.path.getsize(src)
    extents = data_extents(src)
    dst = os.path.join(dst_dir, "journal-out.raw")
    journal = os.path.join(dst_dir, "journal-out.journal")
    atexit.register(rm, dst)
    atexit.register(rm, journal)
    out: Dict[str, Dict[str, List[Dict]]] = {}
    runs_log: List[Dict] = []
    failed = False
    for direction in directions:
        cells = out.setdefault(direction, {k: [] for k, _ in VARIANTS})
        for rnd in range(runs):
            order = VARIANTS[rnd % len(VARIANTS):] + VARIANTS[:rnd % len(VARIANTS)]
            for key, extra in order:
                rm(dst)
                rm(journal)
                for n in os.listdir(dst_dir):
                    if n.endswith(".partial"):
                        rm(os.path.join(dst_dir, n))
                warm(src, extents)
                subprocess.run(["sync"], check=True)
                with contextlib.ExitStack() as stack:
                    if direction == "file-nbd":
                        srv = stack.enter_context(target_export(size, 0))
                        target, n_flag = srv.uri, ["-n"]
                    else:
                        target, n_flag = dst, []
                    argv = ([python, "-m", "imgcopy", "convert"] + n_flag +
                            ["-f", "raw", "-O", "raw", "--stats", "json"] +
                            [journal if a == "JOURNAL" else a for a in extra] + [src, target])
                    rec = run_timed(argv, env, timeout, sync=True, stdout=True)
                    if direction == "file-nbd":
                        srv.totals()
                rec["stats"] = stats_of(rec.pop("stdout", ""))
                rec.update(direction=direction, variant=key, round=rnd,
                           load=" ".join(open("/proc/loadavg").read().split()[:3]))
                runs_log.append(rec)
                if rec["rc"] != 0:
                    failed = True
                    log("  FAILED %s %s: %s" % (direction, key, rec["stderr"][-500:]))
                    continue
                if os.path.exists(journal):
                    failed = True
                    log("  %s %s: the journal is still there after a successful copy" % (
                        direction, key))
                cells[key].append(rec)
                log("  %s %-10s round %d: %s s (copy %s s)" % (
                    direction, key, rnd + 1, fmt_s(rec["seconds"]),
                    fmt_s(rec["stats"].get("elapsed"))))
    return out, runs_log, failed


def print_cost(out: Dict, size: int, runs: int, load: str) -> Dict:
    summary: Dict[str, Dict] = {}
    print()
    print("== part 1: the cost of --journal on a copy that does not fail; %s of data; %d rounds; "
          "seconds of `CMD && sync`; load %s ==" % (human(size), runs, load))
    print("%-12s %-11s %7s %7s %7s %6s %7s %9s  %s" % (
        "direction", "journal", "median", "min", "max", "sync", "copy", "/plain", "aim <= %.2f"
        % AIM))
    for direction, cells in out.items():
        plain = med([r["seconds"] for r in cells.get("plain", [])])
        for key, _ in VARIANTS:
            rs = cells.get(key, [])
            if not rs:
                print("%-12s %-11s no successful run" % (direction, key))
                continue
            v = [r["seconds"] for r in rs]
            m = statistics.median(v)
            ratio = m / plain if plain and key != "plain" else None
            summary.setdefault(direction, {})[key] = {
                "median": m, "min": min(v), "max": max(v), "ratio": ratio,
                "copy": med([r["stats"]["elapsed"] for r in rs if "elapsed" in r["stats"]])}
            print("%-12s %-11s %7s %7s %7s %6s %7s %9s  %s" % (
                {"file-file": "file -> file", "file-nbd": "file -> NBD"}[direction],
                {"plain": "none", "journal": "5 s", "journal-1s": "1 s"}[key],
                fmt_s(m), fmt_s(min(v)), fmt_s(max(v)),
                fmt_s(med([r["sync_seconds"] for r in rs])),
                fmt_s(summary[direction][key]["copy"]), fmt_ratio(ratio),
                "" if ratio is None else ("met" if ratio <= AIM else "NOT met")))
    return summary


# --------------------------------------------------------------------------
# part 2: kills

def slow_source(path: str, delay_ms: float) -> NbdkitServer:
    """`path` read-only, one request at a time over all connections
    (noparallel serialize=all-requests, multi-conn not offered, one server
    thread), every read and block-status request delayed `delay_ms`."""
    return NbdkitServer("file", ["file=" + path, "serialize=all-requests",
                                 "multi-conn-mode=disable", "delay-read=%gms" % delay_ms,
                                 "delay-extents=%gms" % delay_ms],
                        filters=["noparallel", "multi-conn", "delay"],
                        options=["-r", "--threads=1"], serialised=True)


def run_until(argv: List[str], env: Dict[str, str], at: Optional[float],
              timeout: float) -> Dict[str, Any]:
    """Run `argv`; with `at`, SIGKILL it once its -p progress reaches `at`
    (a fraction).  Seconds, the last progress it printed, rc, stdout."""
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, cwd="/", stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=env, start_new_session=True)
    text = ""
    last = 0.0
    killed_at = None
    try:
        assert p.stderr is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            chunk = os.read(p.stderr.fileno(), 4096)
            if not chunk:
                break
            text += chunk.decode(errors="replace")
            found = PROGRESS.findall(text[-4096:])
            if found:
                last = float(found[-1]) / 100
            if at is not None and last >= at:
                killed_at = time.perf_counter() - t0
                os.killpg(p.pid, signal.SIGKILL)
                break
        out, err = p.communicate(timeout=timeout)
        text += err.decode(errors="replace")
    finally:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    t1 = time.perf_counter()
    return {"seconds": t1 - t0, "killed_after": killed_at, "progress": last, "rc": p.returncode,
            "stdout": out.decode(errors="replace"), "stderr": text[-1500:]}


def kills(python: str, env: Dict[str, str], src: str, dst_dir: str, intervals: List[str],
          n_kills: int, seconds: float, seed: int, timeout: float) -> Tuple[List[Dict], bool]:
    size = os.path.getsize(src)
    reads = -(-size // REQUEST)
    delay_ms = max(1.0, seconds * 1000 / reads - 1)
    dst = os.path.join(dst_dir, "resume-out.raw")
    journal = os.path.join(dst_dir, "resume-out.journal")
    atexit.register(rm, dst)
    atexit.register(rm, journal)
    rng = random.Random(seed)
    out: List[Dict] = []
    failed = False

    def clean() -> None:
        rm(dst)
        rm(journal)
        for n in os.listdir(dst_dir):
            if n.endswith(".partial"):
                rm(os.path.join(dst_dir, n))

    log("part 2: source %d reads of 2 MiB at %.1f ms each, one at a time" % (reads, delay_ms))
    for interval in intervals:
        points = sorted(rng.uniform(0.15, 0.85) for _ in range(n_kills))
        ref: Optional[Dict] = None
        for at in [None] + points:
            clean()
            with slow_source(src, delay_ms) as srv:
                argv = [python, "-m", "imgcopy", "convert", "-f", "raw", "-O", "raw", "-p",
                        "--stats", "json", "--journal", journal, "--journal-interval", interval,
                        srv.uri, dst]
                first = run_until(argv, env, at, timeout)
                rec: Dict[str, Any] = {"interval": interval, "at": at, "first": first}
                if at is None:
                    st = stats_of(first["stdout"])
                    if first["rc"] != 0 or not st:
                        failed = True
                        log("  FAILED uninterrupted run (%s): %s" % (interval, first["stderr"]))
                        break
                    rec["rate"] = size / st["elapsed"]
                    rec["stats"] = st
                    ref = rec
                    log("  interval %s: uninterrupted %s s (copy %s s, %s/s)" % (
                        interval, fmt_s(first["seconds"]), fmt_s(st["elapsed"]),
                        human(rec["rate"])))
                else:
                    if first["rc"] != -signal.SIGKILL:
                        failed = True
                        log("  the run to kill at %.0f%% ended with %s: %s" % (
                            at * 100, first["rc"], first["stderr"]))
                        continue
                    had_journal = os.path.exists(journal)
                    second = run_until(argv, env, None, timeout)
                    st = stats_of(second["stdout"])
                    rec.update(second=second, stats=st, had_journal=had_journal)
                    if second["rc"] != 0 or not st:
                        failed = True
                        log("  FAILED resume (%s, %.0f%%): %s" % (interval, at * 100,
                                                                  second["stderr"]))
                        continue
                    resumed = st.get("bytes_resumed", 0)
                    moved = st["bytes_written"] + st["bytes_zeroed"] + st["bytes_skipped"]
                    done = first["progress"] * size
                    rec.update(resumed=resumed, moved=moved, done=done, lost=done - resumed,
                               consistent=moved == size - resumed)
                    c = subprocess.run(["qemu-img", "compare", "-f", "raw", "-F", "raw", src,
                                        dst], capture_output=True, text=True)
                    rec["identical"] = c.returncode == 0 and "identical" in c.stdout
                    rec["leftovers"] = [n for n in os.listdir(dst_dir)
                                        if n.endswith(".partial")] + (
                        [os.path.basename(journal)] if os.path.exists(journal) else [])
                    if not rec["identical"] or rec["leftovers"] or not rec["consistent"]:
                        failed = True
                        log("  WRONG after resume (%s, %.0f%%): identical %s, leftovers %s, "
                            "moved %d + resumed %d vs size %d" % (
                                interval, at * 100, rec["identical"], rec["leftovers"], moved,
                                resumed, size))
                    rate = ref["rate"] if ref else None
                    size_iv = parse_size(interval)
                    bound = size_iv if size_iv else (float(interval) * rate if rate else None)
                    rec.update(rate=rate, bound=bound)
                    log("  interval %s, kill at %.0f%% (progress %.1f%% after %s s): resumed %s, "
                        "lost %s; resume %s s" % (
                            interval, at * 100, first["progress"] * 100,
                            fmt_s(first["killed_after"]), human(resumed), human(max(0, done -
                                                                                     resumed)),
                            fmt_s(second["seconds"])))
                srv.totals()
            out.append(rec)
    return out, failed


def print_kills(recs: List[Dict], size: int, load: str) -> None:
    print()
    print("== part 2: SIGKILL at seeded progress, then the same command again; %s source, one "
          "read at a time; load %s ==" % (human(size), load))
    print("%-8s %6s %8s %8s %8s %9s %8s %8s %7s %8s %8s  %s" % (
        "interval", "kill", "seen %", "killed s", "resumed", "lost MiB", "lost s", "bound",
        "/bound", "resume s", "full s", "check"))
    refs = {r["interval"]: r for r in recs if r["at"] is None}
    for r in recs:
        if r["at"] is None or "lost" not in r:
            continue
        ref = refs.get(r["interval"])
        full_s = ref["first"]["seconds"] if ref else None
        rate = r.get("rate")
        lost = r["lost"]
        bound = r.get("bound")
        print("%-8s %5.0f%% %7.1f%% %8s %8s %9.1f %8s %8s %7s %8s %8s  %s" % (
            r["interval"], r["at"] * 100, r["first"]["progress"] * 100,
            fmt_s(r["first"]["killed_after"]), "%.0f MiB" % (r["resumed"] / MiB), lost / MiB,
            fmt_s(lost / rate) if rate else "-",
            "%.0f MiB" % (bound / MiB) if bound else "-",
            fmt_ratio(lost / bound if bound else None), fmt_s(r["second"]["seconds"]),
            fmt_s(full_s),
            "identical" if r.get("identical") and not r.get("leftovers") and r.get("consistent")
            else "WRONG"))
    print("(seen: the last -p progress before the SIGKILL, a lower bound of what was done; "
          "resumed: bytes_resumed of the second run; lost = seen x size - resumed: copied again; "
          "bound: the interval's worth, its seconds x the uninterrupted run's rate, or its size)")


# --------------------------------------------------------------------------

def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--scale", type=float, help="corpus scale (default 1; --quick 0.0625)")
    ap.add_argument("--corpus", help="default /tmp/imgcopy-corpus[-s<scale>]")
    ap.add_argument("--image", default=IMAGE, help="corpus image (default %s)" % IMAGE)
    ap.add_argument("--runs", type=int, help="rounds of part 1 (default 9; --quick 2)")
    ap.add_argument("--directions", default="file-file,file-nbd")
    ap.add_argument("--intervals", help="part 2's --journal-interval values (default 5,1,256M; "
                    "--quick 1,8M)")
    ap.add_argument("--kills", type=int, help="kills per interval (default 3; --quick 1)")
    ap.add_argument("--kill-seconds", type=float,
                    help="how long part 2's uninterrupted copy should take (default 20; --quick 6)")
    ap.add_argument("--seed", type=int, default=27)
    ap.add_argument("--no-cost", action="store_true", help="skip part 1")
    ap.add_argument("--no-kills", action="store_true", help="skip part 2")
    ap.add_argument("--python", help="interpreter with imgcopy (default the repository's .venv)")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--json", help="write every run here")
    a = ap.parse_args(argv)
    scale = a.scale if a.scale is not None else (QUICK_SCALE if a.quick else 1.0)
    runs = a.runs if a.runs is not None else (2 if a.quick else 9)
    intervals = [i.strip() for i in (a.intervals or ("1,8M" if a.quick else "5,1,256M")).split(",")
                 if i.strip()]
    n_kills = a.kills if a.kills is not None else (1 if a.quick else 3)
    kill_seconds = a.kill_seconds or (6.0 if a.quick else 20.0)
    corpus = a.corpus or ("/tmp/imgcopy-corpus" if scale == 1 else "/tmp/imgcopy-corpus-s%g" % scale)
    python = a.python or os.path.join(REPO, ".venv", "bin", "python")
    if not os.access(python, os.X_OK):
        python = sys.executable
    directions = [d.strip() for d in a.directions.split(",") if d.strip()]
    for prog in ("nbdkit", "qemu-img"):
        if not shutil.which(prog):
            sys.exit("bench_journal: %s not found (apt-get install -y nbdkit qemu-utils)" % prog)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    pypath, pin_dir = pin_imgcopy(python)
    atexit.register(shutil.rmtree, pin_dir, True)
    env = dict(os.environ, PYTHONPATH=pypath)

    build_corpus(python, corpus, scale, [a.image])
    src = os.path.join(corpus, a.image)
    size = os.path.getsize(src)
    dst_dir = os.path.join(corpus, "bench-dst")
    os.makedirs(dst_dir, exist_ok=True)
    load_start = " ".join(open("/proc/loadavg").read().split()[:3])
    git = subprocess.run(["git", "-C", REPO, "describe", "--always", "--dirty"],
                         capture_output=True, text=True).stdout.strip()
    print("journal (issue 27): %s (%s, %s of data); load %s, %d CPUs; imgcopy %s (_core %s)" % (
        src, human(size), human(sum(n for _, n in data_extents(src))), load_start,
        os.cpu_count(), git or "?", imgcopy_core(python, env)[1]))
    failed = False
    result: Dict[str, Any] = {"image": src, "size": size, "load_start": load_start}
    if not a.no_cost:
        out, runs_log, f = cost(python, env, src, dst_dir, runs, directions, a.timeout)
        failed |= f
        result["cost"] = print_cost(out, size, runs, "%s -> %s" % (
            load_start, " ".join(open("/proc/loadavg").read().split()[:3])))
        result["cost_runs"] = runs_log
    if not a.no_kills:
        load_k = " ".join(open("/proc/loadavg").read().split()[:3])
        recs, f = kills(python, env, src, dst_dir, intervals, n_kills, kill_seconds, a.seed,
                        a.timeout)
        failed |= f
        print_kills(recs, size, "%s -> %s" % (load_k, " ".join(
            open("/proc/loadavg").read().split()[:3])))
        result["kills"] = recs
    load_end = " ".join(open("/proc/loadavg").read().split()[:3])
    print("load average: start %s, end %s" % (load_start, load_end))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1, default=str)
        print("raw runs: %s" % a.json)
    if failed:
        print("FAILED: a command failed or a copy differs (see above)")
    return 1 if failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit("bench_journal: interrupted")
