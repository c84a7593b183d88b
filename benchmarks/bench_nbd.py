#!/usr/bin/env python3
"""Copies from, to and between NBD exports with a round trip on every
request: imgcopy against nbdcopy and qemu-img convert, in one run,
alternating, counting the requests on the wire (issue 25's benchmark).

Directions (``--directions``):

  file-nbd   a local raw file (read once before each run: warm) into an
             nbdkit memory export; latency on the target's writes and zeroes
  nbd-file   an nbdkit file export of that image into a local raw file (a
             sparse file of the source's size, made before each run; the
             run is timed as ``CMD && sync``); latency on the source's reads
             and block status
  nbd-nbd    export to export, latency on both ends

The servers (nbd_servers.py), started afresh for every run, the log filter
first (it counts what the client sent), the delay filter after it::

  source  nbdkit -r -U S --filter=log [--filter=noparallel --filter=multi-conn]
              --filter=delay file FILE [serialize=all-requests
              multi-conn-mode=disable] delay-read=D delay-extents=D logfile=L
  target  nbdkit -U S --filter=log --filter=delay memory SIZE delay-write=D
              delay-zero=D delay-trim=D logfile=L

A source is ``multi`` (nbdkit's default: multi-conn, 16 threads per
connection) or ``single`` (``--sources``): one connection, multi-conn not
offered, one request at a time over all connections, as a VDDK source
serves.  The target is always multi-conn.  Latency D: ``--delays`` (0, 1,
5, 20 ms); cells at ``--slow-ms`` (20) or more use the image at
``--slow-scale`` (1/4: a quarter of the bytes and runs) and ``--slow-runs``
rounds, and say so.

Images (``--only``): ``ref-640m.raw`` (default; issue 25's 640 MiB with
1,800 data runs, 320 MiB of data; run_images.py), ``mixed-1g.raw``
(run_images.py) and the corpus's ``sparse-6g.raw`` (make_corpus.py); all
seeded, built once per corpus directory (``--scale`` and ``--corpus`` as in
bench_convert.py).

Commands (``--tools`` keys, or ``all``), SRC and DST a path or
``nbd+unix:///?socket=PATH``; each once per round, round-robin, the first one
rotating from round to round; medians of ``--runs`` rounds:

  imgcopy          PYTHON -m imgcopy convert -n -f raw -O raw SRC DST
  nbdcopy          nbdcopy SRC DST
  nbdcopy-4M       nbdcopy --request-size=4194304 SRC DST
  nbdcopy-c1       nbdcopy --connections=1 SRC DST  (single sources only)
  qemu-img-W-m16   qemu-img convert -n -f raw -O raw -W -m 16 -S 64k SRC DST
  (not by default: qemu-img, qemu-img-S64k: -n without / with -S 64k only;
  imgcopy-S64k)
  baseline         PYTHON -m imgcopy ... with --baseline PYTHON (another
                   build, run as it is, in the same rounds)

imgcopy runs from a private copy of the venv's package taken at the start,
byte-compiled as pip compiles an installed package.
Each run: wall time from the command's start to its exit (then ``sync``'s,
for a file destination), the peak RSS of the command's process (wait4's
ru_maxrss), and from the servers' logs: reads, block-status queries,
writes, zeroes (and trims), their bytes, and the connections that sent a
request.  The first successful run of each command in each (image,
direction, source) is checked with ``qemu-img compare`` (servers still
running).

The physical bound of a run: the round trips its requests need on the
busier server, requests x D / the server's concurrency (16 threads on each
connection the command used; 1 for a single source), plus the data bytes
at this machine's copy bandwidth, measured in the same run: a plain local
copy of the image's data extents (read from the page cache, written at
the same offsets into /dev/shm for an NBD target, into a file on the
corpus's filesystem and fdatasync'ed for a file target; median of 3).
The two servers wait in parallel, so the larger of their two round-trip
terms counts.  A cell's bound is the lowest of its commands' bounds (the
fewest requests anyone needed); imgcopy / bound says how close imgcopy
comes to what the round trips allow.

What the servers allow besides: each run's CPU seconds, the command's
(GNU time) and the servers' (/proc, read once the client has gone), over
the command's wall time ("cores": 2 on two cores is a copy with every core
busy, which fewer round trips cannot speed up), and each cell's 0 ms floor,
the fastest command in the cell without latency of the same image,
direction and source (the bound counts the bytes at a plain local copy's
speed; the floor, what moving them through nbdkit costs too).

Issue 25's aims, printed for every cell, met or not:
  at D >= 1 ms    imgcopy <= 0.8 x the best anchor (nbdcopy or qemu-img)
  at D = 0        imgcopy no slower than the fastest nbdcopy
  at D = 5 ms     imgcopy <= 1.3 x the cell's bound
  every cell      imgcopy's peak RSS <= 64 MiB + ``--in-flight-mib`` (the
                  bytes imgcopy may have in flight; default 64)

Then, unless ``--no-frag``, the local case of the issue
(bench_convert.run_frag): frag-backward.qcow2 at 1/2 scale to raw, cold and
warm, imgcopy against qemu-img -W -m 8.

``--quick``: scale 1/16, 2 rounds, 1 and 5 ms, frag at 1/16 (~2 minutes).
``--json FILE``: every run, every cell.  Exit status 1 if a command fails
or an output differs.  Servers are stopped whatever happens (Ctrl-C and
SIGTERM included).
"""
from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run_images  # noqa: E402
from bench_convert import (BASELINE, REPO, add_common_arguments, argv_for, build_corpus,  # noqa: E402
                           common_choices, data_extents, fmt_ratio, fmt_s, human,
                           imgcopy_core, is_anchor, is_imgcopy, log, med, pin_imgcopy, rm,
                           FRAG, run_frag, warm)
from nbd_servers import THREADS, NbdkitServer, source_export, target_export  # noqa: E402

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
OS_IMAGE, MIXED, REF = "sparse-6g.raw", run_images.MIXED, run_images.REF
IMAGES = [REF, MIXED, OS_IMAGE]
DIRECTIONS = ["file-nbd", "nbd-file", "nbd-nbd"]
DIRECTION_LABEL = {"file-nbd": "file -> NBD", "nbd-file": "NBD -> file", "nbd-nbd": "NBD -> NBD"}
SOURCES = ["multi", "single"]
DELAYS = [0, 1, 5, 20]
QUICK_DELAYS = [1, 5]
DEFAULT_TOOLS = ["imgcopy", "nbdcopy", "nbdcopy-4M", "nbdcopy-c1", "qemu-img-W-m16"]
AIM_BEST, AIM_BOUND, AIM_RSS_MIB = 0.8, 1.3, 64
FRAG_SCALE = 0.5


# --------------------------------------------------------------------------
# the commands

def tool_table(python: str) -> List[Tuple[str, str, List[str]]]:
    """(key, label, argv with SRC / DST placeholders)."""
    qemu = ["qemu-img", "convert", "-n", "-f", "raw", "-O", "raw"]
    imgcopy = [python, "-m", "imgcopy", "convert", "-n", "-f", "raw", "-O", "raw"]
    return [
        ("imgcopy", "imgcopy", imgcopy + ["SRC", "DST"]),
        ("imgcopy-S64k", "imgcopy -S 64k", imgcopy + ["-S", "64k", "SRC", "DST"]),
        ("nbdcopy", "nbdcopy", ["nbdcopy", "SRC", "DST"]),
        # nbdcopy 1.14 takes no size suffix
        ("nbdcopy-4M", "nbdcopy 4M", ["nbdcopy", "--request-size=%d" % (4 * MiB), "SRC", "DST"]),
        ("nbdcopy-c1", "nbdcopy --connections=1", ["nbdcopy", "--connections=1", "SRC", "DST"]),
        ("qemu-img-W-m16", "qemu-img -W -m16 -S64k",
         qemu + ["-W", "-m", "16", "-S", "64k", "SRC", "DST"]),
        ("qemu-img", "qemu-img", qemu + ["SRC", "DST"]),
        ("qemu-img-S64k", "qemu-img -S 64k", qemu + ["-S", "64k", "SRC", "DST"]),
    ]


def applies(key: str, cell: "Cell") -> bool:
    """nbdcopy --connections=1 only where the source has one connection."""
    return key != "nbdcopy-c1" or cell.source == "single"


# --------------------------------------------------------------------------
# cells and images

class Cell(NamedTuple):
    image: str
    direction: str
    source: Optional[str]        # "multi" / "single" for an NBD source, None for a file
    delay: float                 # ms per request
    scale: float
    runs: int

    @property
    def src_nbd(self) -> bool:
        return self.direction.startswith("nbd")

    @property
    def dst_nbd(self) -> bool:
        return self.direction.endswith("nbd")

    def name(self) -> str:
        return "%s %s%s %gms" % (self.image, self.direction,
                                 "/" + self.source if self.source else "", self.delay)


class Image:
    """An image at one scale: path, size, data extents, the machine's copy
    bandwidths for its data (measured on first use)."""

    def __init__(self, path: str, runs: int):
        self.path = path
        self.size = os.path.getsize(path)
        self.extents = data_extents(path)
        self.data = sum(n for _, n in self.extents)
        self.runs = runs or len(self.extents)
        self.bw: Dict[str, float] = {}
        self.bw_runs: Dict[str, List[float]] = {}

    def bandwidth(self, disk: bool, dst_dir: str) -> float:
        """Bytes per second of a plain copy of the data extents: into
        /dev/shm (memory), or into `dst_dir` and fdatasync'ed (disk)."""
        kind = "disk" if disk else "memory"
        if kind not in self.bw:
            where = dst_dir
            if not disk and os.path.isdir("/dev/shm"):
                st = os.statvfs("/dev/shm")
                if st.f_bavail * st.f_frsize > 2 * self.data:
                    where = "/dev/shm"
            v = [copy_seconds(self.path, self.extents, where, disk) for _ in range(3)]
            self.bw_runs[kind] = v
            self.bw[kind] = self.data / statistics.median(v)
            log("copy bandwidth (%s, %s): %s/s (%s in %s s)" % (
                kind, where, human(self.bw[kind]), human(self.data),
                ", ".join(fmt_s(x) for x in v)))
        return self.bw[kind]


def copy_seconds(src: str, extents: List[Tuple[int, int]], where: str, sync: bool) -> float:
    """Seconds to copy `src`'s data extents (warm) into a new sparse file in
    `where` at the same offsets, 2 MiB at a time, with fdatasync if `sync`."""
    warm(src, extents)
    fd_out, tmp = tempfile.mkstemp(prefix="imgcopy-bench-bw-", dir=where)
    fd_in = os.open(src, os.O_RDONLY)
    buf = bytearray(2 * MiB)
    mv = memoryview(buf)
    try:
        os.ftruncate(fd_out, os.fstat(fd_in).st_size)
        t0 = time.perf_counter()
        for off, length in extents:
            end = off + length
            while off < end:
                n = os.preadv(fd_in, [mv[:min(len(buf), end - off)]], off)
                if n <= 0:
                    break
                os.pwrite(fd_out, mv[:n], off)
                off += n
        if sync:
            os.fdatasync(fd_out)
        return time.perf_counter() - t0
    finally:
        os.close(fd_in)
        os.close(fd_out)
        rm(tmp)


# --------------------------------------------------------------------------
# one run

TIME = "/usr/bin/time"


def run_timed(argv: List[str], env: Optional[Dict[str, str]], timeout: float,
              sync: bool, stdout: bool = False) -> Dict[str, Any]:
    """`argv` (then `sync` if asked, when it succeeded): seconds of both, of
    the sync, return code, stderr's tail, the command's peak RSS (KiB, from
    GNU time's %M: a process forked from this one would start with our RSS as
    its peak); with `stdout`, what it printed there (else it is discarded).
    The command, in its own process group, is killed if it outlasts
    `timeout` or we are interrupted.  Also the command's CPU seconds (user +
    system, GNU time's %U and %S)."""
    with tempfile.NamedTemporaryFile(prefix="imgcopy-bench-rss-") as rss_file, \
            tempfile.TemporaryFile() as err, tempfile.TemporaryFile() as out:
        wrap = [TIME, "-f", "%M %U %S", "-o", rss_file.name] if os.access(TIME, os.X_OK) else []
        t0 = time.perf_counter()
        p = subprocess.Popen(wrap + argv, cwd="/", stdin=subprocess.DEVNULL,
                             stdout=out if stdout else subprocess.DEVNULL, stderr=err, env=env,
                             start_new_session=True)
        killed: List[bool] = []

        def kill() -> None:
            killed.append(True)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
        timer = threading.Timer(timeout, kill)
        timer.start()
        try:
            rc = p.wait()
        finally:
            timer.cancel()
            if p.returncode is None:
                kill()
                p.wait()
        t1 = time.perf_counter()
        if rc == 0 and sync:
            subprocess.run(["sync"], check=True)
        t2 = time.perf_counter()
        err.seek(0)
        text = err.read().decode(errors="replace").strip()
        rss, cpu = time_output(open(rss_file.name).read()) if wrap else (None, None)
        out.seek(0)
        printed = out.read().decode(errors="replace") if stdout else None
    if killed:
        text = ("timed out after %.0f s; " % timeout) + text
    rec = {"seconds": t2 - t0, "sync_seconds": t2 - t1, "rc": rc, "stderr": text[-2000:],
           "rss_kib": rss, "cpu_seconds": cpu}
    if stdout:
        rec["stdout"] = printed
    return rec


def time_output(text: str) -> Tuple[Optional[int], Optional[float]]:
    """(peak RSS KiB, CPU seconds) from GNU time's last line "%M %U %S" (a
    line before it may say the command's exit status)."""
    lines = text.strip().splitlines()
    fields = lines[-1].split() if lines else []
    try:
        return int(fields[0]), float(fields[1]) + float(fields[2])
    except (IndexError, ValueError):
        return None, None


def cores_busy(rec: Dict) -> Optional[float]:
    """The command's and the servers' CPU seconds over the command's wall
    time (the sync after it not counted): 2 on this machine's 2 cores means
    the copy had every core busy, and only less work per byte (not fewer
    round trips) can make it faster."""
    wall = rec["seconds"] - rec["sync_seconds"]
    if rec.get("cpu_seconds") is None or wall <= 0:
        return None
    return (rec["cpu_seconds"] + rec.get("server_cpu_seconds", 0.0)) / wall


def compare(src: str, dst: str) -> Dict:
    r = subprocess.run(["qemu-img", "compare", "-f", "raw", "-F", "raw", src, dst],
                       capture_output=True, text=True)
    return {"identical": r.returncode == 0 and "identical" in r.stdout,
            "compare": (r.stdout + r.stderr).strip()[-500:]}


def server_counts(srv: NbdkitServer, kinds: Tuple[str, ...]) -> Tuple[Dict[str, int], int, int]:
    """({kind: commands, kind_bytes: bytes}, connections, connections that sent a request)."""
    conns, totals = srv.totals()
    out: Dict[str, int] = {}
    for kind in kinds:
        n, b = totals.get(kind, (0, 0))
        out[kind.lower()] = n
        out[kind.lower() + "_bytes"] = b
    return out, conns, srv.active_connections()


def run_once(argv: List[str], cell: Cell, img: Image, dst_file: str, check: bool,
             env: Optional[Dict[str, str]], timeout: float) -> Dict:
    """One copy between fresh servers: the timed run, its requests, its
    bound's round-trip terms, and with `check` qemu-img compare."""
    rec: Dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        src_srv = dst_srv = None
        if cell.src_nbd:
            src_srv = stack.enter_context(source_export(img.path, cell.delay,
                                                        cell.source == "single"))
        if cell.dst_nbd:
            dst_srv = stack.enter_context(target_export(img.size, cell.delay))
        src = src_srv.uri if src_srv else img.path
        if dst_srv:
            dst = dst_srv.uri
        else:
            rm(dst_file)
            with open(dst_file, "wb") as f:
                f.truncate(img.size)
            dst = dst_file
        warm(img.path, img.extents)
        rec.update(run_timed(argv_for(argv, src, dst), env, timeout, sync=dst_srv is None))
        rt = {"src": 0.0, "dst": 0.0}
        rec["src_conns"] = rec["dst_conns"] = 0
        rec["server_cpu_seconds"] = 0.0
        if src_srv:
            c, n, active = server_counts(src_srv, ("Read", "Extents"))
            rec.update(c, src_conns=active, src_connects=n)
            rec["server_cpu_seconds"] += src_srv.cpu_seconds()
            rt["src"] = ((c["read"] + c["extents"]) * cell.delay / 1000
                         / src_srv.server_concurrency(active))
        if dst_srv:
            c, n, active = server_counts(dst_srv, ("Write", "Zero", "Trim"))
            rec.update(c, dst_conns=active, dst_connects=n)
            rec["server_cpu_seconds"] += dst_srv.cpu_seconds()
            rt["dst"] = ((c["write"] + c["zero"] + c["trim"]) * cell.delay / 1000
                         / dst_srv.server_concurrency(active))
        rec["round_trips"] = rt
        if rec["rc"] == 0 and check:
            rec["check"] = compare(img.path, dst)
    if dst_srv is None:
        rm(dst_file)
    return rec


# --------------------------------------------------------------------------
# tables

COUNTS = ("read", "extents", "write", "zero", "trim", "read_bytes", "write_bytes", "zero_bytes",
          "src_conns", "dst_conns", "rss_kib", "sync_seconds", "cpu_seconds",
          "server_cpu_seconds", "cores")


def peak(v: List[float]) -> Optional[float]:
    return max(v) if v else None


def cell_summary(cell: Cell, img: Image, tools, times, counts, bounds, checks,
                 in_flight_mib: int) -> Dict:
    """Medians, bounds, ratios and aims of one cell."""
    anchors = [(med(times[k]), k) for k, _, _ in tools if is_anchor(k) and times.get(k)]
    best = min(anchors) if anchors else None
    nbdcopies = [(med(times[k]), k) for k, _, _ in tools if k.startswith("nbdcopy") and times.get(k)]
    tool_bounds = {k: med(v) for k, v in bounds.items() if v}
    bound = min(tool_bounds.values()) if tool_bounds else None
    im = med(times.get("imgcopy", []))
    rss = peak(counts["imgcopy"]["rss_kib"]) if times.get("imgcopy") else None
    s: Dict[str, Any] = {
        "cell": cell._asdict(), "image_path": img.path, "data_bytes": img.data,
        "data_runs": img.runs, "medians": {k: med(v) for k, v in times.items()},
        "min": {k: min(v) for k, v in times.items() if v},
        "max": {k: max(v) for k, v in times.items() if v},
        "counts": {k: {f: med(c[f]) for f in COUNTS if c[f]} for k, c in counts.items()},
        "peak_rss_kib": {k: peak(c["rss_kib"]) for k, c in counts.items()},
        "bounds": tool_bounds, "bound": bound, "best": best[1] if best else None,
        "best_median": best[0] if best else None, "checks": checks,
        "imgcopy_over_best": im / best[0] if im and best else None,
        "imgcopy_over_bound": im / bound if im and bound else None,
        "imgcopy_rss_kib": rss, "aims": {}}
    if im is not None:
        aims = s["aims"]
        if cell.delay >= 1 and best:
            aims["best"] = {"want": "<= %.1fx the best anchor" % AIM_BEST,
                            "value": im / best[0], "met": im / best[0] <= AIM_BEST}
        if cell.delay == 0 and nbdcopies:
            aims["nbdcopy"] = {"want": "<= the fastest nbdcopy", "value": im / min(nbdcopies)[0],
                               "met": im <= min(nbdcopies)[0]}
        if cell.delay == 5 and bound:
            aims["bound"] = {"want": "<= %.1fx the bound" % AIM_BOUND, "value": im / bound,
                             "met": im / bound <= AIM_BOUND}
        if rss is not None:
            limit = AIM_RSS_MIB + in_flight_mib
            aims["rss"] = {"want": "RSS <= %d + %d MiB" % (AIM_RSS_MIB, in_flight_mib),
                           "value": rss / KiB, "met": rss / KiB <= limit}
    return s


def aims_text(aims: Dict) -> str:
    out = []
    for key in ("best", "nbdcopy", "bound"):
        a = aims.get(key)
        if a:
            out.append("imgcopy %s: %.2fx, %s" % (a["want"], a["value"],
                                                  "met" if a["met"] else "NOT met"))
    a = aims.get("rss")
    if a:
        out.append("%s: %.0f MiB, %s" % (a["want"], a["value"], "met" if a["met"] else "NOT met"))
    return "; ".join(out)


def conns_text(c: Dict, cell: Cell) -> str:
    s = "%d" % c.get("src_conns", 0) if cell.src_nbd else "-"
    d = "%d" % c.get("dst_conns", 0) if cell.dst_nbd else "-"
    return s + "/" + d


def print_cell(cell: Cell, img: Image, tools, times, counts, summary, notes, load,
               full_scale: float) -> None:
    lat = {"file-nbd": "write/zero", "nbd-file": "read/block status",
           "nbd-nbd": "read/block status and write/zero"}[cell.direction]
    src = {"multi": ", source multi-conn (%d threads per connection)" % THREADS,
           "single": ", source one connection, serialised", None: ""}[cell.source]
    small = " [smaller image: scale %g, %d rounds]" % (cell.scale, cell.runs) \
        if cell.scale != full_scale else ""
    print()
    print("== %s (%s virtual, %s data in %d runs): %s%s; %g ms per %s; %d rounds; load %s%s ==" % (
        cell.image, human(img.size), human(img.data), img.runs, DIRECTION_LABEL[cell.direction],
        src, cell.delay, lat, cell.runs, load, small))
    print("%-24s %7s %7s %7s %6s %6s %6s %6s %5s %9s %5s %7s %9s %5s %7s %6s %6s  %s" % (
        "tool", "median", "min", "max", "sync", "reads", "bstat", "writes", "zeros", "MiB rd/wr",
        "conns", "RSS MiB", "CPU c/srv", "cores", "bound", "/best", "/bound", "check"))
    best = summary["best_median"]
    bound = summary["bound"]
    for key, label, _ in tools:
        v = times.get(key)
        if not v:
            if key in times or key in notes:
                print("%-24s %s" % (label, notes.get(key, "no successful run")))
            continue
        c = {f: med(counts[key][f]) or 0 for f in COUNTS}
        rss = peak(counts[key]["rss_kib"])
        m = statistics.median(v)
        chk = summary["checks"].get(key)
        print("%-24s %7s %7s %7s %6s %6s %6s %6s %5s %9s %5s %7s %9s %5s %7s %6s %6s  %s" % (
            label, fmt_s(m), fmt_s(min(v)), fmt_s(max(v)),
            fmt_s(c["sync_seconds"]) if not cell.dst_nbd else "-",
            "%d" % c["read"] if cell.src_nbd else "-", "%d" % c["extents"] if cell.src_nbd else "-",
            "%d" % c["write"] if cell.dst_nbd else "-",
            "%d" % (c["zero"] + c["trim"]) if cell.dst_nbd else "-",
            "%s/%s" % ("%.0f" % (c["read_bytes"] / MiB) if cell.src_nbd else "-",
                       "%.0f" % (c["write_bytes"] / MiB) if cell.dst_nbd else "-"),
            conns_text(c, cell),
            "-" if rss is None else "%.0f" % (rss / KiB),
            "%.2f/%.2f" % (c["cpu_seconds"], c["server_cpu_seconds"]),
            "%.2f" % c["cores"] if c["cores"] else "-", fmt_s(summary["bounds"].get(key)),
            fmt_ratio(m / best if best else None), fmt_ratio(m / bound if bound else None),
            "-" if chk is None else "identical" if chk["identical"] else "DIFFERS"))
    kind = "memory" if cell.dst_nbd else "disk"
    bw = img.bw.get(kind)
    print("(bound: the busier server's requests x %g ms / (%s) + %s of data at %s/s, a plain %s "
          "copy here (%s s); cell bound %s s)" % (
              cell.delay, "16 x connections used" if cell.source != "single"
              else "1 on the source, 16 x connections on the target", human(img.data),
              human(bw) if bw else "?", "in-memory" if kind == "memory" else "fdatasync'ed",
              fmt_s(img.data / bw) if bw else "?", fmt_s(bound)))
    text = aims_text(summary["aims"])
    if text:
        print("aims: " + text)


def add_floors(cells: List[Dict]) -> None:
    """Each cell's 0 ms floor: the fastest median of any command in the cell
    of the same image, scale, direction and source without latency (when
    it ran): what these servers, this machine's two cores shared by client
    and servers, and its disk allow before any round trip costs.  The
    bound counts the bytes at a plain local copy's speed; the floor counts
    what moving them through the servers costs too."""
    floors = {}
    for s in cells:
        c = s["cell"]
        if c["delay"] == 0 and s["medians"]:
            floors[(c["image"], c["scale"], c["direction"], c["source"])] = min(
                v for v in s["medians"].values() if v is not None)
    for s in cells:
        c = s["cell"]
        f = floors.get((c["image"], c["scale"], c["direction"], c["source"]))
        im, best = s["medians"].get("imgcopy"), s["best_median"]
        s["floor"] = f
        s["imgcopy_over_floor"] = im / f if im and f else None
        s["best_over_floor"] = best / f if best and f else None
        cores = s["counts"].get("imgcopy", {}).get("cores")
        s["imgcopy_cores"] = cores


def print_summary(cells: List[Dict], labels: Dict[str, str], has_base: bool,
                  in_flight_mib: int) -> None:
    print()
    print("== summary: medians in seconds; /best = imgcopy / the fastest anchor (< 1: imgcopy "
          "faster); /bound = imgcopy / the cell's bound ==")
    print("%-13s %-12s %-6s %5s %8s %8s %8s %8s %-30s %7s %6s %6s %6s %6s %5s %5s %5s%s  %s" % (
        "image", "direction", "source", "ms", "imgcopy", "nbdcopy", "nbdc 4M", "qemu -W",
        "best anchor", "bound", "/best", "/bound", "floor", "/floor", "b/flr", "cores", "RSS",
        "  base/im" if has_base else "", "aims"))
    for s in cells:
        c = s["cell"]
        m = s["medians"]
        im = m.get("imgcopy")
        flags = []
        for key, short in (("best", "0.8x best"), ("nbdcopy", "<= nbdcopy"), ("bound", "1.3x bound"),
                           ("rss", "RSS")):
            a = s["aims"].get(key)
            if a:
                flags.append("%s %s" % (short, "met" if a.get("met") else "NOT"))
        base = m.get(BASELINE)
        print("%-13s %-12s %-6s %5s %8s %8s %8s %8s %-30s %7s %6s %6s %6s %6s %5s %5s %5s%s  %s" % (
            c["image"] + ("*" if s.get("smaller") else ""), DIRECTION_LABEL[c["direction"]],
            c["source"] or "-", "%g" % c["delay"], fmt_s(im), fmt_s(m.get("nbdcopy")),
            fmt_s(m.get("nbdcopy-4M")), fmt_s(m.get("qemu-img-W-m16")),
            "%s %s" % (labels.get(s["best"], "-"), fmt_s(s["best_median"])), fmt_s(s["bound"]),
            fmt_ratio(s["imgcopy_over_best"]), fmt_ratio(s["imgcopy_over_bound"]),
            fmt_s(s.get("floor")), fmt_ratio(s.get("imgcopy_over_floor")),
            fmt_ratio(s.get("best_over_floor")),
            "%.2f" % s["imgcopy_cores"] if s.get("imgcopy_cores") else "-",
            "%.0f" % (s["imgcopy_rss_kib"] / KiB) if s["imgcopy_rss_kib"] else "-",
            "  %7s" % fmt_ratio(base / im if base and im else None) if has_base else "",
            ", ".join(flags)))
    if any(s.get("smaller") for s in cells):
        print("(* the smaller image of the slow cells: see their tables for scale and rounds)")
    print("(RSS: imgcopy's peak over the rounds, MiB; aim <= %d MiB + %d MiB in flight)" % (
        AIM_RSS_MIB, in_flight_mib))
    print("(floor: the fastest command of the same image, direction and source at 0 ms; /floor "
          "imgcopy's, b/flr the best anchor's ratio to it; cores: imgcopy's and the servers' CPU "
          "seconds per second of the command, median, of %d)" % (os.cpu_count() or 0))


# --------------------------------------------------------------------------
# main

def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_arguments(ap, IMAGES, quick_runs=2)
    ap.add_argument("--directions", default=",".join(DIRECTIONS),
                    help="comma separated (default %s)" % ",".join(DIRECTIONS))
    ap.add_argument("--sources", default=",".join(SOURCES),
                    help="NBD source kinds, comma separated (default multi,single)")
    ap.add_argument("--delays", help="milliseconds per request, comma separated (default %s; "
                    "--quick %s)" % (",".join(map(str, DELAYS)), ",".join(map(str, QUICK_DELAYS))))
    ap.add_argument("--slow-ms", type=float, default=20,
                    help="cells at this latency or more use --slow-scale and --slow-runs (20)")
    ap.add_argument("--slow-scale", type=float, default=0.25,
                    help="their image's scale, relative to --scale (default 0.25)")
    ap.add_argument("--slow-runs", type=int, help="their rounds (default min(--runs, 3))")
    ap.add_argument("--tools", default=",".join(DEFAULT_TOOLS),
                    help="tool keys, comma separated, or all (default %s; known: %s)" % (
                        ",".join(DEFAULT_TOOLS), ",".join(k for k, _, _ in tool_table("python"))))
    ap.add_argument("--python", help="interpreter with imgcopy installed "
                    "(default %s/.venv/bin/python)" % REPO)
    ap.add_argument("--baseline", metavar="PYTHON",
                    help="also time PYTHON -m imgcopy convert (another build) in the same rounds")
    ap.add_argument("--in-flight-mib", type=int, default=64,
                    help="bytes imgcopy may hold in flight, MiB, for the RSS aim (default 64)")
    ap.add_argument("--no-frag", action="store_true", help="skip the fragmented qcow2 case")
    ap.add_argument("--frag-scale", type=float,
                    help="its scale (default %g; --quick 0.0625)" % FRAG_SCALE)
    ap.add_argument("--timeout", type=float, default=900, help="seconds a command may take")
    ap.add_argument("--json", help="write every run and cell here")
    a = ap.parse_args(argv)

    scale, runs, corpus, images, python = common_choices(ap, a, IMAGES, quick_runs=2)
    if not a.only:
        images = [REF]
    delays = [float(d) for d in (a.delays or ",".join(map(str, QUICK_DELAYS if a.quick else DELAYS))
                                 ).split(",") if d.strip()]
    directions = [d.strip() for d in a.directions.split(",") if d.strip()]
    sources = [s.strip() for s in a.sources.split(",") if s.strip()]
    for d in directions:
        if d not in DIRECTIONS:
            ap.error("unknown direction %r (known: %s)" % (d, ", ".join(DIRECTIONS)))
    for s in sources:
        if s not in SOURCES:
            ap.error("unknown source kind %r (known: %s)" % (s, ", ".join(SOURCES)))
    slow_runs = a.slow_runs or min(runs, 3)
    tools = tool_table(python)
    known = [k for k, _, _ in tools]
    want = known if a.tools == "all" else [t.strip() for t in a.tools.split(",") if t.strip()]
    for t in want:
        if t not in known:
            ap.error("unknown tool %r (known: %s)" % (t, ", ".join(known)))
    tools = [t for t in tools if t[0] in want]
    if a.baseline:
        plain = {k: t for k, _, t in tool_table("")}["imgcopy"]
        tools.append((BASELINE, "imgcopy baseline", [a.baseline] + plain[1:]))
    labels = {k: l for k, l, _ in tools}
    for prog in ["nbdkit", "qemu-img"] + [t[2][0] for t in tools if is_anchor(t[0])]:
        if not shutil.which(prog):
            sys.exit("bench_nbd: %s not found (apt-get install -y nbdkit qemu-utils libnbd-bin)"
                     % prog)

    # imgcopy from a private copy of the venv's package: a rebuild meanwhile cannot mix builds
    pin_env = None
    if any(is_imgcopy(k) for k, _, _ in tools):
        pypath, pin_dir = pin_imgcopy(python)
        atexit.register(shutil.rmtree, pin_dir, True)
        pin_env = dict(os.environ, PYTHONPATH=pypath)
    # a plain `kill` unwinds too: servers stopped, the private copy removed
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    # the images, each scale in its own corpus directory
    def corpus_for(s: float) -> str:
        if s == scale:
            return corpus
        return os.path.join(a.corpus, "s%g" % s) if a.corpus else "/tmp/imgcopy-corpus-s%g" % s

    built: Dict[Tuple[str, float], Image] = {}

    def image(name: str, s: float) -> Image:
        if (name, s) not in built:
            d = corpus_for(s)
            if name == OS_IMAGE:
                build_corpus(python, d, s, [OS_IMAGE])
                path = os.path.join(d, OS_IMAGE)
            else:
                path = run_images.build(d, name, s)
            built[(name, s)] = Image(path, run_images.data_runs(path))
        return built[(name, s)]

    cells: List[Cell] = []
    for name in images:
        for direction in directions:
            for kind in (sources if direction.startswith("nbd") else [None]):
                for d in delays:
                    slow = d >= a.slow_ms
                    cells.append(Cell(name, direction, kind, d, scale * a.slow_scale if slow
                                      else scale, slow_runs if slow else runs))
    if not cells:
        ap.error("no cells: --sources names no kind for an NBD source")
    for c in cells:                       # every image first, so that no build is timed
        image(c.image, c.scale)
    dst_dir = os.path.join(corpus, "bench-dst")
    os.makedirs(dst_dir, exist_ok=True)
    dst_file = os.path.join(dst_dir, "nbd-out.raw")
    atexit.register(rm, dst_file)

    def version(cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True).stdout.splitlines()[0]
        except (OSError, IndexError):
            return "?"
    git = subprocess.run(["git", "-C", REPO, "describe", "--always", "--dirty"],
                         capture_output=True, text=True).stdout.strip()
    meta: Dict[str, Any] = {
        "host": platform.node(), "kernel": platform.release(), "cpus": os.cpu_count(),
        "scale": scale, "runs": runs, "slow_ms": a.slow_ms, "slow_scale": a.slow_scale,
        "slow_runs": slow_runs, "corpus": corpus, "delays_ms": delays, "directions": directions,
        "sources": sources, "in_flight_mib": a.in_flight_mib,
        "versions": {"qemu-img": version(["qemu-img", "--version"]),
                     "nbdcopy": version(["nbdcopy", "--version"]),
                     "nbdkit": version(["nbdkit", "--version"]),
                     "imgcopy": "%s (_core %s), repository %s" % (
                         python, imgcopy_core(python, pin_env)[1], git or "?")},
        "loadavg_start": open("/proc/loadavg").read().split()[:3],
        "tools": {k: " ".join(t) for k, _, t in tools}}
    if a.baseline:
        meta["versions"]["baseline"] = "%s (_core %s)" % (a.baseline, imgcopy_core(a.baseline)[1])
    print("imgcopy against nbdcopy and qemu-img from, to and between nbdkit exports (log + delay "
          "filters); seconds from the command's start to its exit, `&& sync` for a file "
          "destination")
    print("scale %g, %d rounds%s, delays %s ms, %s CPUs, load %s" % (
        scale, runs, " (cells at >= %g ms: scale %g, %d rounds)" % (
            a.slow_ms, scale * a.slow_scale, slow_runs) if max(delays) >= a.slow_ms else "",
        ",".join("%g" % d for d in delays), meta["cpus"], " ".join(meta["loadavg_start"])))
    for k, v in meta["versions"].items():
        print("  %-9s %s" % (k, v))
    for k, l, t in tools:
        print("  %-24s %s" % (l, " ".join(t)))

    # the interpreter's share of every imgcopy run: start-up and imports
    startup = []
    for _ in range(5):
        if any(is_imgcopy(k) for k, _, _ in tools):
            r = run_timed([python, "-m", "imgcopy", "--version"], pin_env, 60, sync=False)
            if r["rc"] == 0:
                startup.append(r["seconds"])
    meta["imgcopy_version_seconds"] = startup
    if startup:
        print("  start-up: %s -m imgcopy --version takes %s s (median of %d)" % (
            python, fmt_s(med(startup)), len(startup)))

    runs_log: List[Dict] = []
    summaries: List[Dict] = []
    unsupported: Dict[str, str] = {}
    checked: Dict[Tuple[str, float, str, Optional[str]], Dict[str, Dict]] = {}
    failed = False
    for cell in cells:
        img = image(cell.image, cell.scale)
        img.bandwidth(disk=not cell.dst_nbd, dst_dir=dst_dir)
        ctools = [t for t in tools if applies(t[0], cell)]
        times: Dict[str, List[float]] = {k: [] for k, _, _ in ctools}
        counts: Dict[str, Dict[str, List[float]]] = {k: {f: [] for f in COUNTS}
                                                     for k, _, _ in ctools}
        bounds: Dict[str, List[float]] = {k: [] for k, _, _ in ctools}
        checks = checked.setdefault((cell.image, cell.scale, cell.direction, cell.source), {})
        load = " ".join(open("/proc/loadavg").read().split()[:3])
        log("%s: %d rounds x %d tools (load %s)" % (cell.name(), cell.runs, len(ctools), load))
        for rnd in range(cell.runs):
            order = ctools[rnd % len(ctools):] + ctools[:rnd % len(ctools)]
            for key, label, tmpl in order:
                if key in unsupported:
                    continue
                rec = run_once(tmpl, cell, img, dst_file, key not in checks,
                               pin_env if is_imgcopy(key) else None, a.timeout)
                rec.update(cell=cell._asdict(), round=rnd, tool=key)
                runs_log.append(rec)
                if rec["rc"] != 0:
                    last = rec["stderr"].splitlines()[-1] if rec["stderr"] else "rc %d" % rec["rc"]
                    if (is_imgcopy(key) or key == BASELINE) and \
                            rec["src_conns"] + rec["dst_conns"] == 0 and \
                            rec.get("src_connects", 0) + rec.get("dst_connects", 0) == 0:
                        unsupported[key] = "not supported yet (never connected: %s)" % last
                        print("%s: not supported yet (%s)" % (label, last), flush=True)
                        continue
                    failed = True
                    log("  FAILED %s (rc %d): %s" % (label, rec["rc"], rec["stderr"][-500:]))
                    continue
                copy = img.data / img.bw["memory" if cell.dst_nbd else "disk"]
                rec["bound"] = max(rec["round_trips"].values()) + copy
                rec["cores"] = cores_busy(rec)
                times[key].append(rec["seconds"])
                bounds[key].append(rec["bound"])
                for f in COUNTS:
                    if rec.get(f, 0) is not None:
                        counts[key][f].append(rec.get(f, 0))
                if "check" in rec:
                    checks[key] = rec["check"]
                    if not rec["check"]["identical"]:
                        failed = True
                        log("  DIFFERS: %s: %s" % (label, rec["check"]["compare"]))
                log("  round %d %-24s %s s  reads %s, bstat %s, writes %s, zeros %s, conns %s, "
                    "RSS %s MiB" % (rnd + 1, label, fmt_s(rec["seconds"]), rec.get("read", "-"),
                                    rec.get("extents", "-"), rec.get("write", "-"),
                                    rec.get("zero", "-"), conns_text(rec, cell),
                                    "?" if rec["rss_kib"] is None else rec["rss_kib"] // KiB))
        s = cell_summary(cell, img, ctools, times, counts, bounds, dict(checks), a.in_flight_mib)
        s["smaller"] = cell.scale != scale
        s["load"] = load
        s["copy_bandwidth"] = dict(img.bw)
        summaries.append(s)
        print_cell(cell, img, ctools, times, counts, s, unsupported, load, scale)
        sys.stdout.flush()
    add_floors(summaries)
    print_summary(summaries, labels, bool(a.baseline), a.in_flight_mib)
    for key, why in unsupported.items():
        print("%s: %s" % (key, why))

    frag = None
    if not a.no_frag:
        fscale = a.frag_scale or (0.0625 if a.quick else FRAG_SCALE)
        frag = run_frag(python, pin_env, a.baseline, fscale, runs, ["cold", "warm"],
                        os.path.join(a.corpus, "s%g" % fscale) if a.corpus else None, [FRAG])
        if not all(frag["checks"].values()) or any(r["rc"] != 0 for r in frag["runs"]):
            failed = True
    meta["loadavg_end"] = open("/proc/loadavg").read().split()[:3]
    print()
    print("load average: start %s, end %s" % (" ".join(meta["loadavg_start"]),
                                              " ".join(meta["loadavg_end"])))

    if a.json:
        with open(a.json, "w") as out:
            json.dump({"meta": meta, "runs": runs_log, "cells": summaries, "frag": frag,
                       "unsupported": unsupported}, out, indent=1)
        print("raw runs: %s" % a.json)
    if failed:
        print("FAILED: a command failed or an output differs (see above)")
    return 1 if failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:      # the servers are stopped already (their finally ran)
        sys.exit("bench_nbd: interrupted")
