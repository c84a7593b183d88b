#!/usr/bin/env python3
"""Side-by-side benchmark: ``imgcopy convert`` against ``qemu-img convert`` and
``nbdcopy``, raw -> raw, on the corpus images, in one run.

What it does:

* builds (or reuses: the generator checks its manifest) the corpus with
  ``make_corpus.py DIR --scale S --only sparse-6g.raw,random-third.raw,
  full-1g.raw,empty-10g.raw``; the default DIR is ``/tmp/imgcopy-corpus`` at
  scale 1 and ``/tmp/imgcopy-corpus-s<S>`` at other scales, so a quick run
  never throws away the full-size corpus;
* checks ``df`` first: the corpus (if not built yet) plus one destination;
* times each command as ``CMD && sync`` (wall clock of both), each a
  subprocess, the destination in ``--dst-dir`` (default ``DIR/bench-dst``,
  the same filesystem), deleted before every run (not timed):

    qemu-img          qemu-img convert -f raw -O raw SRC DST
    qemu-img-W-m8     qemu-img convert -W -m 8 -f raw -O raw SRC DST
    nbdcopy           nbdcopy SRC DST
    nbdcopy-2M        nbdcopy --request-size=2097152 --queue-size=134217728 SRC DST
    imgcopy           python -m imgcopy convert SRC DST
    imgcopy-m8        python -m imgcopy convert -m 8 SRC DST

  (nbdcopy opens local files itself and creates the destination at the
  source's size, so every tool gets a destination that does not exist);
* cold source: ``sync`` then ``posix_fadvise(DONTNEED)`` on the source
  before each run (``/proc/sys/vm/drop_caches`` is not needed); warm source:
  the source's data extents (SEEK_DATA/SEEK_HOLE) are read once before each
  run, untimed.  The source's resident page count (``mincore``) just before
  each run is recorded, so a run that did not get the cache state it asked
  for is visible in the JSON;
* ``--runs`` rounds (default 5); in each round every command runs once,
  round-robin, the starting command rotating from round to round; prints
  median / min / max and ``tool_median / imgcopy_median`` (> 1: imgcopy is
  faster than that tool), one table per image and cache state, then a
  summary: image x cache -> imgcopy median, best anchor, ratio;
* in the first round of each image, every output is checked with
  ``qemu-img compare -f raw -F raw SRC DST`` and its extent count
  (``qemu-img map --output=json DST | wc -l``) and allocated size
  (st_blocks) are reported: the tools differ in sparseness;
* a start-up table: every command on a 1 MiB one-extent file (its fixed
  cost; ``python -m imgcopy`` pays for the interpreter);
* ``--profile [IMAGE]``: every command once (cold) under ``strace -c -f``
  and ``/usr/bin/time -v``: system-call counts, RSS, context switches.

``--quick``: scale 0.0625 and 3 runs.  ``--only IMAGE,...``, ``--tools
KEY,...`` and ``--cache cold,warm`` filter; ``--json FILE`` writes every raw
timing.  Exit status 0 on success, 1 when an output differs or a command
fails.  The imgcopy run is ``--python -m imgcopy`` (default: the
repository's ``.venv/bin/python``; ``make build`` creates it), started
outside the source tree so that the installed package is used.
"""
from __future__ import annotations

import argparse
import atexit
import ctypes
import ctypes.util
import hashlib
import json
import os
import platform
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
IMAGES = ["sparse-6g.raw", "random-third.raw", "full-1g.raw", "empty-10g.raw"]
CORPUS_GB_FULL = 9.5     # corpus of IMAGES at scale 1 (allocated), with margin
DST_GB_FULL = 3.2        # the largest destination at scale 1 (random-third)
KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
QUICK_SCALE = 0.0625


# --------------------------------------------------------------------------
# the commands

def tool_table(python: str) -> List[Tuple[str, str, List[str]]]:
    """(key, label, argv with SRC / DST placeholders)."""
    return [
        ("qemu-img", "qemu-img", ["qemu-img", "convert", "-f", "raw", "-O", "raw", "SRC", "DST"]),
        ("qemu-img-W-m8", "qemu-img -W -m 8",
         ["qemu-img", "convert", "-W", "-m", "8", "-f", "raw", "-O", "raw", "SRC", "DST"]),
        ("nbdcopy", "nbdcopy", ["nbdcopy", "SRC", "DST"]),
        ("nbdcopy-2M", "nbdcopy 2M/128M",
         # nbdcopy 1.14 takes no size suffixes: 2 MiB requests, 128 MiB queue
         ["nbdcopy", "--request-size=%d" % (2 * MiB), "--queue-size=%d" % (128 * MiB), "SRC", "DST"]),
        ("imgcopy", "imgcopy", [python, "-m", "imgcopy", "convert", "SRC", "DST"]),
        ("imgcopy-m8", "imgcopy -m 8", [python, "-m", "imgcopy", "convert", "-m", "8", "SRC", "DST"]),
    ]


BASELINE = "baseline"


def baseline_tool(python: str) -> Tuple[str, str, List[str]]:
    """Another build of imgcopy (``--baseline PYTHON``), timed in the same
    rounds: before/after a change without trusting an earlier number."""
    return (BASELINE, "imgcopy baseline", [python, "-m", "imgcopy", "convert", "SRC", "DST"])


def is_imgcopy(key: str) -> bool:
    return key.startswith("imgcopy")


def is_anchor(key: str) -> bool:
    return not is_imgcopy(key) and key != BASELINE


def argv_for(template: List[str], src: str, dst: str) -> List[str]:
    return [src if a == "SRC" else dst if a == "DST" else a for a in template]


# --------------------------------------------------------------------------
# page cache

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
PAGE = os.sysconf("SC_PAGE_SIZE")
PROT_READ, MAP_SHARED = 1, 1
MAP_FAILED = ctypes.c_void_p(-1).value


def resident_bytes(path: str) -> int:
    """Bytes of `path` in the page cache (mincore), -1 if unknown."""
    size = os.path.getsize(path)
    if size == 0:
        return 0
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = _libc.mmap(None, size, PROT_READ, MAP_SHARED, fd, 0)
        if addr is None or addr == MAP_FAILED:
            return -1
        try:
            pages = (size + PAGE - 1) // PAGE
            vec = ctypes.create_string_buffer(pages)
            if _libc.mincore(addr, size, vec) != 0:
                return -1
            return (pages - vec.raw[:pages].count(0)) * PAGE
        finally:
            _libc.munmap(addr, size)
    finally:
        os.close(fd)


def evict(path: str) -> None:
    """Drop `path`'s clean pages (after a sync, all of them)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def data_extents(path: str) -> List[Tuple[int, int]]:
    """(offset, length) of every data extent, by SEEK_DATA / SEEK_HOLE."""
    out = []
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        pos = 0
        while pos < size:
            try:
                d = os.lseek(fd, pos, os.SEEK_DATA)
            except OSError:            # ENXIO: no data after pos
                break
            h = os.lseek(fd, d, os.SEEK_HOLE)
            out.append((d, h - d))
            pos = h
    finally:
        os.close(fd)
    return out


def warm(path: str, extents: List[Tuple[int, int]]) -> None:
    """Read the data extents once (only the data pages matter to the tools)."""
    buf = bytearray(8 * MiB)
    fd = os.open(path, os.O_RDONLY)
    try:
        for off, length in extents:
            end = off + length
            while off < end:
                n = os.preadv(fd, [memoryview(buf)[:min(len(buf), end - off)]], off)
                if n <= 0:
                    break
                off += n
    finally:
        os.close(fd)


# --------------------------------------------------------------------------
# helpers

def human(n: float) -> str:
    for unit, f in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if abs(n) >= f:
            return "%.2f %s" % (n / f, unit)
    return "%d B" % n


def fmt_s(x: Optional[float]) -> str:
    return "-" if x is None else "%.3f" % x


def fmt_ratio(x: Optional[float]) -> str:
    return "-" if x is None else "%.2f" % x


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def rm(path: str) -> None:
    evict(path)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def file_digest(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()[:16]
    except OSError:
        return "?"


def imgcopy_core(python: str, env: Optional[Dict[str, str]] = None) -> Tuple[str, str]:
    """(path of the _core extension, short sha256) as `python` (with `env`) sees it."""
    r = subprocess.run([python, "-c", "import imgcopy._core as c; print(c.__file__)"],
                       capture_output=True, text=True, cwd="/", env=env)
    if r.returncode != 0:
        return "", ""
    path = r.stdout.strip()
    return path, file_digest(path)


def cpu_times() -> Tuple[float, float, float]:
    """(busy, iowait, total) seconds of all CPUs from /proc/stat (busy excludes
    idle and iowait)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    hz = os.sysconf("SC_CLK_TCK")
    user, nice, system, idle, iowait, irq, softirq, steal = (v + [0] * 8)[:8]
    busy = user + nice + system + irq + softirq + steal
    return busy / hz, iowait / hz, (busy + idle + iowait) / hz


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def background(interval: float = 0.5) -> Tuple[float, float]:
    """(busy, iowait) fractions of the machine over `interval` while we sleep."""
    b0, w0, t0 = cpu_times()
    time.sleep(interval)
    b1, w1, t1 = cpu_times()
    dt = max(t1 - t0, 1e-9)
    return (b1 - b0) / dt, (w1 - w0) / dt


def wait_quiet(limit: Optional[float], max_wait: float) -> Tuple[float, float, float]:
    """Sample the background load; with `limit`, keep sampling (up to
    `max_wait` seconds) until busy + iowait < limit. (busy, iowait, waited)."""
    t0 = time.monotonic()
    while True:
        busy, iow = background()
        waited = time.monotonic() - t0
        if limit is None or busy + iow < limit or waited >= max_wait:
            return busy, iow, waited


def pin_imgcopy(python: str) -> Tuple[str, str]:
    """Copy the installed imgcopy package into a private directory, so a
    rebuild of the venv during the run cannot mix two builds; (PYTHONPATH
    for the copy, its directory to delete at the end)."""
    r = subprocess.run([python, "-c", "import imgcopy, os; print(os.path.dirname(imgcopy.__file__))"],
                       capture_output=True, text=True, cwd="/", check=True)
    pkg = r.stdout.strip()
    tmp = tempfile.mkdtemp(prefix="imgcopy-bench-pin-")
    shutil.copytree(pkg, os.path.join(tmp, "imgcopy"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    # byte-compiled as pip compiles an installed package: without it (and
    # with PYTHONDONTWRITEBYTECODE set) every run compiled ~30 modules
    # (~25 ms) that no installed imgcopy compiles
    subprocess.run([python, "-m", "compileall", "-q", os.path.join(tmp, "imgcopy")],
                   cwd="/", check=True, stdout=subprocess.DEVNULL)
    return tmp, tmp


def timed(argv: List[str], cwd: str,
          env: Optional[Dict[str, str]] = None) -> Tuple[float, float, int, str]:
    """Wall clock of `argv && sync`; (seconds, of which sync, returncode, stderr)."""
    t0 = time.perf_counter()
    r = subprocess.run(argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, env=env)
    t1 = time.perf_counter()
    if r.returncode == 0:
        subprocess.run(["sync"], check=True)
    t2 = time.perf_counter()
    return t2 - t0, t2 - t1, r.returncode, r.stderr.decode(errors="replace").strip()


def verify(src: str, dst: str) -> Dict:
    """qemu-img compare, extent count and allocated size of the output."""
    out: Dict = {}
    r = subprocess.run(["qemu-img", "compare", "-f", "raw", "-F", "raw", src, dst],
                       capture_output=True, text=True)
    out["compare_rc"] = r.returncode
    out["compare"] = (r.stdout + r.stderr).strip()
    out["identical"] = r.returncode == 0 and "identical" in r.stdout
    evict(dst)      # an on-disk view (ext4 reports cached unwritten extents as data)
    r = subprocess.run(["qemu-img", "map", "-f", "raw", "--output=json", dst],
                       capture_output=True, text=True)
    out["extents"] = len(r.stdout.splitlines()) if r.returncode == 0 else None
    st = os.stat(dst)
    out["size"] = st.st_size
    out["allocated"] = st.st_blocks * 512
    return out


def disk_free(path: str) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def df_line(path: str) -> str:
    r = subprocess.run(["df", "-h", path], capture_output=True, text=True)
    return r.stdout.strip().splitlines()[-1] if r.returncode == 0 else "?"


# --------------------------------------------------------------------------
# corpus

def build_corpus(python: str, corpus: str, scale: float, images: List[str]) -> Dict:
    os.makedirs(corpus, exist_ok=True)
    manifest_path = os.path.join(corpus, "manifest.json")
    have = {}
    if os.path.exists(manifest_path):
        with open(manifest_path) as f:
            m = json.load(f)
        if m.get("scale") == scale:
            have = {n: i for n, i in m.get("images", {}).items()
                    if os.path.exists(os.path.join(corpus, n))}
    missing = [n for n in images if n not in have]
    need = (CORPUS_GB_FULL * scale * len(missing) / len(IMAGES) + DST_GB_FULL * scale + 0.5) * 1e9
    free = disk_free(corpus)
    log("df: %s" % df_line(corpus))
    log("disk: %s free, ~%s needed (%s images to build + one destination)" % (
        human(free), human(need), len(missing)))
    if free < need:
        sys.exit("bench_convert: not enough disk space in %s: %s free, ~%s needed" % (
            corpus, human(free), human(need)))
    cmd = [python, os.path.join(HERE, "make_corpus.py"), corpus, "--scale", repr(scale),
           "--only", ",".join(images)]
    log("corpus: %s" % " ".join(cmd))
    t0 = time.monotonic()
    subprocess.run(cmd, check=True, cwd="/")
    log("corpus: ready in %.1fs" % (time.monotonic() - t0))
    with open(manifest_path) as f:
        return json.load(f)


# --------------------------------------------------------------------------
# profile: strace -c -f and /usr/bin/time -v

STRACE_SHOW = ["read", "pread64", "preadv", "write", "pwrite64", "pwritev", "lseek",
               "fallocate", "ftruncate", "copy_file_range", "fsync", "fdatasync",
               "futex", "poll", "ppoll", "io_uring_enter", "mmap", "munmap", "madvise",
               "mincore", "fadvise64", "sync_file_range", "ioctl", "openat", "newfstatat"]
TIMEV_SHOW = [("Maximum resident set size (kbytes)", "maxRSS KiB"),
              ("Voluntary context switches", "vol cs"),
              ("Involuntary context switches", "invol cs"),
              ("User time (seconds)", "user s"),
              ("System time (seconds)", "sys s"),
              ("Percent of CPU this job got", "CPU"),
              ("File system inputs", "fs in"),
              ("File system outputs", "fs out"),
              ("Minor (reclaiming a frame) page faults", "minflt")]


def parse_strace(path: str) -> Dict[str, Dict[str, float]]:
    calls: Dict[str, Dict[str, float]] = {}
    with open(path) as f:
        for line in f:
            p = line.split()
            # % time  seconds  usecs/call  calls  [errors]  syscall
            if len(p) >= 5 and p[0].replace(".", "").isdigit() and p[-1] != "total":
                try:
                    secs, n = float(p[1]), int(p[3])
                except ValueError:
                    continue
                errors = int(p[4]) if len(p) == 6 else 0
                calls[p[-1]] = {"calls": n, "seconds": secs, "errors": errors}
    return calls


def parse_timev(text: str) -> Dict[str, str]:
    out = {}
    for line in text.splitlines():
        k, _, v = line.strip().rpartition(": ")
        for name, short in TIMEV_SHOW:
            if k == name:
                out[short] = v
        if k.startswith("Elapsed (wall clock) time"):
            out["elapsed"] = v
    return out


def profile(tools, src: str, dst: str, cwd: str, pin_env: Optional[Dict[str, str]],
            quiet: Optional[float], quiet_max: float) -> Dict:
    res: Dict = {}
    strace = shutil.which("strace")
    timev = "/usr/bin/time" if os.access("/usr/bin/time", os.X_OK) else None
    if not strace or not timev:
        log("profile: needs strace and /usr/bin/time (apt-get install -y strace time)")
    for key, label, tmpl in tools:
        argv = argv_for(tmpl, src, dst)
        env = pin_env if is_imgcopy(key) else None
        r_all: Dict = {}
        if timev:
            rm(dst)
            os.sync()
            evict(src)
            wait_quiet(quiet, quiet_max)
            r = subprocess.run([timev, "-v"] + argv, cwd=cwd, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True, env=env)
            r_all["time_v"] = parse_timev(r.stderr)
        if strace:
            rm(dst)
            os.sync()
            evict(src)
            out = os.path.join(cwd, "strace-%s.txt" % key)
            wait_quiet(quiet, quiet_max)
            subprocess.run([strace, "-f", "-c", "-o", out] + argv, cwd=cwd,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
            r_all["strace"] = parse_strace(out)
            os.unlink(out)
        rm(dst)
        res[key] = r_all
    return res


def print_profile(tools, prof: Dict, image: str) -> None:
    keys = [k for k, _, _ in tools if k in prof]
    labels = {k: l for k, l, _ in tools}
    print()
    print("== profile: %s, cold source, one run each (strace -c -f, /usr/bin/time -v) ==" % image)
    w = 17
    print("%-18s" % "" + "".join("%*s" % (w, labels[k]) for k in keys))
    if any("time_v" in prof[k] for k in keys):
        for _, short in TIMEV_SHOW + [("", "elapsed")]:
            print("%-18s" % short + "".join(
                "%*s" % (w, prof[k].get("time_v", {}).get(short, "-")) for k in keys))
    if any("strace" in prof[k] for k in keys):
        allcalls = set()
        for k in keys:
            allcalls |= set(prof[k].get("strace", {}))
        total = {k: sum(v["calls"] for v in prof[k].get("strace", {}).values()) for k in keys}
        print("%-18s" % "syscalls total" + "".join("%*d" % (w, total[k]) for k in keys))
        shown = [s for s in STRACE_SHOW if s in allcalls]
        shown += sorted(s for s in allcalls if s not in shown and
                        max(prof[k].get("strace", {}).get(s, {}).get("calls", 0) for k in keys) >= 50)
        for s in shown:
            cells = []
            for k in keys:
                v = prof[k].get("strace", {}).get(s)
                cells.append("%*s" % (w, "-" if v is None else
                                      "%d%s" % (v["calls"], " (%de)" % v["errors"] if v["errors"] else "")))
            print("%-18s" % s + "".join(cells))
        print("(strace -c counts calls of all threads; its 'seconds' are syscall time, in the JSON)")


# --------------------------------------------------------------------------
# the fragmented qcow2 (issue 25): scattered cluster reads from a cold cache

FRAG = "frag-backward.qcow2"
# both fragmented corpus images: clusters last to first, and even clusters then odd ones
FRAGS = [FRAG, "frag-forward.qcow2"]
FRAG_SCALE = 0.5          # the 1/2 scale: 8,192 clusters of 64 KiB in reverse order
FRAG_AIM = 0.9            # imgcopy's median / qemu-img -W -m 8's, cold


def frag_tools(python: str, baseline: Optional[str]) -> List[Tuple[str, str, List[str]]]:
    conv = ["-m", "imgcopy", "convert", "-f", "qcow2", "-O", "raw"]
    tools = [
        ("imgcopy", "imgcopy", [python] + conv + ["SRC", "DST"]),
        ("imgcopy-m8", "imgcopy -m 8", [python] + conv + ["-m", "8", "SRC", "DST"]),
        ("qemu-img-W-m8", "qemu-img -W -m 8",
         ["qemu-img", "convert", "-W", "-m", "8", "-f", "qcow2", "-O", "raw", "SRC", "DST"]),
        ("qemu-img", "qemu-img", ["qemu-img", "convert", "-f", "qcow2", "-O", "raw", "SRC", "DST"]),
    ]
    if baseline:
        tools.append((BASELINE, "imgcopy baseline", [baseline] + conv + ["SRC", "DST"]))
    return tools


def run_frag(python: str, pin_env: Optional[Dict[str, str]], baseline: Optional[str],
             scale: float, runs: int, caches: List[str], corpus: Optional[str] = None,
             images: Optional[List[str]] = None) -> Dict:
    """The fragmented qcow2 images (make_corpus.py: every 64 KiB cluster
    written, last to first, or even ones then odd ones; default both)
    converted to a new raw file, `CMD && sync`, alternating, the source's
    pages dropped (cold) or read (warm) before each run; the first output of
    each command checked with qemu-img compare.  Prints a table per image
    and cache state, with the load average before and after; returns the
    runs and medians (medians[image][cache][tool])."""
    images = images or FRAGS
    corpus = corpus or ("/tmp/imgcopy-corpus" if scale == 1.0 else "/tmp/imgcopy-corpus-s%g" % scale)
    build_corpus(python, corpus, scale, images)
    dst_dir = os.path.join(corpus, "bench-dst")
    os.makedirs(dst_dir, exist_ok=True)
    dst = os.path.join(dst_dir, "frag-out.raw")
    tools = frag_tools(python, baseline)
    out: Dict = {"images": images, "scale": scale, "runs": [], "medians": {}, "checks": {},
                 "loadavg": {}}
    try:
        for image in images:
            src = os.path.join(corpus, image)
            whole = [(0, os.path.getsize(src))]
            out["medians"][image] = {}
            for cache in caches:
                times: Dict[str, List[float]] = {k: [] for k, _, _ in tools}
                load_start = open("/proc/loadavg").read().split()[:3]
                log("%s at scale %g, %s source: %d rounds x %d tools" % (image, scale, cache, runs,
                                                                         len(tools)))
                for rnd in range(runs):
                    for key, label, tmpl in tools[rnd % len(tools):] + tools[:rnd % len(tools)]:
                        rm(dst)
                        os.sync()
                        if cache == "cold":
                            evict(src)
                        else:
                            warm(src, whole)
                        s, _, rc, err = timed(argv_for(tmpl, src, dst), dst_dir,
                                              pin_env if is_imgcopy(key) else None)
                        rec = {"image": image, "cache": cache, "round": rnd, "tool": key,
                               "seconds": s if rc == 0 else None, "rc": rc}
                        check_key = "%s:%s" % (image, key)
                        if rc != 0:
                            rec["stderr"] = err[-2000:]
                            log("  FAILED %s (rc %d): %s" % (label, rc, err[-500:]))
                        else:
                            times[key].append(s)
                            if check_key not in out["checks"]:
                                r = subprocess.run(["qemu-img", "compare", "-f", "qcow2", "-F",
                                                    "raw", src, dst], capture_output=True,
                                                   text=True)
                                out["checks"][check_key] = rec["identical"] = (
                                    r.returncode == 0 and "identical" in r.stdout)
                        out["runs"].append(rec)
                        log("  round %d %-16s %s" % (rnd + 1, label, fmt_s(rec["seconds"])))
                out["medians"][image][cache] = {k: med(v) for k, v in times.items()}
                load = (load_start, open("/proc/loadavg").read().split()[:3])
                out["loadavg"]["%s:%s" % (image, cache)] = load
                print_frag_table(src, scale, cache, tools, times,
                                 {k.split(":", 1)[1]: v for k, v in out["checks"].items()
                                  if k.startswith(image + ":")}, runs, load)
    finally:
        rm(dst)
    return out


def print_frag_table(src, scale, cache, tools, times, checks, runs, load) -> None:
    ref = med(times.get("qemu-img-W-m8", []))
    order = "in reverse order" if "backward" in src else "even ones, then odd ones"
    print()
    print("== %s at scale %g (%s, %d clusters of 64 KiB, %s) -> new raw file; %s "
          "source, %d rounds; `CMD && sync`; load average %s -> %s ==" % (
              os.path.basename(src), scale, human(os.path.getsize(src)),
              int(GiB * scale) // (64 * KiB), order, cache, runs, " ".join(load[0]),
              " ".join(load[1])))
    print("%-18s %8s %8s %8s %12s  %s" % ("tool", "median", "min", "max", "/qemu -W -m8", "check"))
    for key, label, _ in tools:
        v = times[key]
        m = med(v)
        chk = checks.get(key)
        print("%-18s %8s %8s %8s %12s  %s" % (
            label, fmt_s(m), fmt_s(min(v) if v else None), fmt_s(max(v) if v else None),
            fmt_ratio(m / ref if m and ref else None),
            "-" if chk is None else "identical" if chk else "DIFFERS"))
    im = med(times.get("imgcopy", []))
    if cache == "cold" and im and ref:
        print("aim: imgcopy <= %.1fx qemu-img -W -m 8 cold: %.2f, %s" % (
            FRAG_AIM, im / ref, "met" if im / ref <= FRAG_AIM else "NOT met"))


# --------------------------------------------------------------------------
# main

def add_common_arguments(ap: argparse.ArgumentParser, known_images: List[str],
                         quick_runs: int) -> None:
    """--corpus, --scale, --runs, --quick and --only, as the benchmarks here take them."""
    ap.add_argument("--corpus", help="corpus directory (default /tmp/imgcopy-corpus, "
                    "/tmp/imgcopy-corpus-s<S> at other scales)")
    ap.add_argument("--scale", type=float, help="corpus scale (default 1.0; --quick 0.0625)")
    ap.add_argument("--runs", type=int, help="rounds (default 5; --quick %d)" % quick_runs)
    ap.add_argument("--quick", action="store_true", help="scale 0.0625, %d runs" % quick_runs)
    ap.add_argument("--only", default="",
                    help="images, comma separated (default: %s)" % ",".join(known_images))


def common_choices(ap: argparse.ArgumentParser, a: argparse.Namespace, known_images: List[str],
                   quick_runs: int) -> Tuple[float, int, str, List[str], str]:
    """--scale, --runs, --corpus, --only and --python as the benchmarks here
    read them: (scale, runs, corpus directory, images, python)."""
    scale = a.scale if a.scale is not None else (QUICK_SCALE if a.quick else 1.0)
    runs = a.runs if a.runs is not None else (quick_runs if a.quick else 5)
    if runs < 1:
        ap.error("--runs must be >= 1")
    corpus = a.corpus or ("/tmp/imgcopy-corpus" if scale == 1.0 else "/tmp/imgcopy-corpus-s%g" % scale)
    images = [n.strip() for n in a.only.split(",") if n.strip()] or list(known_images)
    for n in images:
        if n not in known_images:
            ap.error("unknown image %r (known: %s)" % (n, ", ".join(known_images)))
    python = a.python or os.path.join(REPO, ".venv", "bin", "python")
    if not os.access(python, os.X_OK):
        python = sys.executable
    return scale, runs, corpus, images, python


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_arguments(ap, IMAGES, quick_runs=3)
    ap.add_argument("--tools", default="", help="tool keys, comma separated (default: all): "
                    + ",".join(k for k, _, _ in tool_table("python")))
    ap.add_argument("--cache", default="cold,warm", help="cold,warm (default both)")
    ap.add_argument("--dst-dir", help="destination directory (default CORPUS/bench-dst)")
    ap.add_argument("--python", help="interpreter with imgcopy installed "
                    "(default %s/.venv/bin/python)" % REPO)
    ap.add_argument("--baseline", metavar="PYTHON",
                    help="also time PYTHON -m imgcopy convert (another build, e.g. a worktree of "
                         "an older commit) in the same rounds; the summary prints its ratio")
    ap.add_argument("--no-verify", action="store_true", help="skip qemu-img compare / map")
    ap.add_argument("--no-pin", action="store_true", help="run the venv's imgcopy as it is at "
                    "each run (default: a private copy of it taken at the start)")
    ap.add_argument("--wait-quiet", type=float, metavar="FRACTION",
                    help="before each run, wait (up to --wait-max s) until the machine's busy + "
                    "iowait fraction (0.5 s sample) is below FRACTION, e.g. 0.2")
    ap.add_argument("--wait-max", type=float, default=120.0,
                    help="longest wait for --wait-quiet, seconds (default 120)")
    ap.add_argument("--profile", nargs="?", const="sparse-6g.raw", default=None, metavar="IMAGE",
                    help="also run every tool once under strace -c -f and /usr/bin/time -v "
                    "(default image sparse-6g.raw)")
    ap.add_argument("--frag", action="store_true",
                    help="only the fragmented qcow2 images of issue 25 (%s; --only picks one) at "
                    "scale %g (--scale) to raw, against qemu-img -W -m 8, cold and warm (--cache)"
                    % (", ".join(FRAGS), FRAG_SCALE))
    ap.add_argument("--json", help="write all raw timings here")
    a = ap.parse_args(argv)

    if a.frag and a.scale is None:
        a.scale = FRAG_SCALE
    scale, runs, corpus, images, python = common_choices(ap, a, FRAGS if a.frag else IMAGES,
                                                         quick_runs=3)
    caches = [c.strip() for c in a.cache.split(",") if c.strip()]
    for c in caches:
        if c not in ("cold", "warm"):
            ap.error("--cache takes cold and/or warm")
    tools = tool_table(python)
    if a.tools:
        want = [t.strip() for t in a.tools.split(",") if t.strip()]
        known = [k for k, _, _ in tools]
        for t in want:
            if t not in known:
                ap.error("unknown tool %r (known: %s)" % (t, ", ".join(known)))
        tools = [t for t in tools if t[0] in want]
    if a.baseline:
        tools.append(baseline_tool(a.baseline))
    for key, _, tmpl in tools:
        if not is_imgcopy(key) and not shutil.which(tmpl[0]):
            sys.exit("bench_convert: %s not found (apt-get install -y qemu-utils libnbd-bin)" % tmpl[0])
    if not shutil.which("qemu-img"):
        sys.exit("bench_convert: qemu-img not found (apt-get install -y qemu-utils)")

    core_path, core_hash = imgcopy_core(python)
    if any(is_imgcopy(k) for k, _, _ in tools):
        r = subprocess.run([python, "-m", "imgcopy", "convert", "--help"], cwd="/",
                           capture_output=True, text=True)
        if r.returncode != 0 or not core_path:
            sys.exit("bench_convert: %s -m imgcopy convert does not work; build it with\n"
                     "  make -C %s build\n%s" % (python, REPO, r.stderr.strip()))

    venv_core = core_hash
    pin_env: Optional[Dict[str, str]] = None
    pin_dir = None
    if any(is_imgcopy(k) for k, _, _ in tools) and not a.no_pin:
        pypath, pin_dir = pin_imgcopy(python)
        atexit.register(shutil.rmtree, pin_dir, True)
        pin_env = dict(os.environ, PYTHONPATH=pypath)
        core_path, core_hash = imgcopy_core(python, pin_env)
        if not core_path.startswith(pin_dir) or core_hash != venv_core:
            sys.exit("bench_convert: pinning imgcopy failed (%s)" % core_path)

    if a.frag:
        res = run_frag(python, pin_env, a.baseline, scale, runs, caches, a.corpus, images)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(res, f, indent=1)
        return 0 if all(res["checks"].values()) and all(
            r["rc"] == 0 for r in res["runs"]) else 1
    manifest = build_corpus(python, corpus, scale, images)
    dst_dir = a.dst_dir or os.path.join(corpus, "bench-dst")
    os.makedirs(dst_dir, exist_ok=True)
    if os.stat(dst_dir).st_dev != os.stat(corpus).st_dev:
        log("warning: %s is not on the corpus's filesystem" % dst_dir)
    dst = os.path.join(dst_dir, "out.raw")
    atexit.register(rm, dst)
    # a plain `kill` still removes the destination and the private copy of imgcopy
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    def versions() -> Dict[str, str]:
        v = {}
        for name, cmd in (("qemu-img", ["qemu-img", "--version"]), ("nbdcopy", ["nbdcopy", "--version"])):
            try:
                v[name] = subprocess.run(cmd, capture_output=True, text=True).stdout.splitlines()[0]
            except (OSError, IndexError):
                v[name] = "?"
        v["imgcopy"] = "%s -m imgcopy, _core sha256 %s%s" % (
            python, core_hash, ", a private copy of the venv's package" if pin_dir else "")
        r = subprocess.run(["git", "-C", REPO, "describe", "--always", "--dirty"],
                           capture_output=True, text=True)
        v["repo"] = r.stdout.strip() or "?"
        return v

    meta = {
        "host": platform.node(), "kernel": platform.release(), "cpus": os.cpu_count(),
        "scale": scale, "runs": runs, "corpus": corpus, "dst_dir": dst_dir,
        "filesystem": subprocess.run(["findmnt", "-n", "-o", "FSTYPE", "-T", dst_dir],
                                     capture_output=True, text=True).stdout.strip(),
        "versions": versions(), "loadavg_start": open("/proc/loadavg").read().split()[:3],
        "tools": {k: " ".join(argv_for(t, "SRC", "DST")) for k, _, t in tools},
    }
    print("imgcopy convert vs qemu-img convert / nbdcopy, raw -> raw; time of `CMD && sync`, seconds")
    print("scale %g, %d rounds, corpus %s, destination %s (%s), %s CPUs, load %s" % (
        scale, runs, corpus, dst_dir, meta["filesystem"], meta["cpus"],
        " ".join(meta["loadavg_start"])))
    for k, v in meta["versions"].items():
        print("  %-9s %s" % (k, v))
    for k, l, t in tools:
        print("  %-15s %s" % (l, " ".join(argv_for(t, "SRC", "DST"))))

    runs_log: List[Dict] = []
    checks: Dict[str, Dict[str, Dict]] = {}
    failed = False

    # ---- start-up cost: a 1 MiB one-extent file
    tiny = os.path.join(dst_dir, "tiny-1m.raw")
    with open(tiny, "wb") as f:
        f.write(b"\x01" * MiB)
    startup: Dict[str, List[float]] = {k: [] for k, _, _ in tools}
    for rnd in range(max(3, runs)):
        for key, _, tmpl in tools:
            rm(dst)
            s, _, rc, err = timed(argv_for(tmpl, tiny, dst), dst_dir,
                                  pin_env if is_imgcopy(key) else None)
            if rc == 0:
                startup[key].append(s)
    rm(dst)
    os.unlink(tiny)

    # ---- the images
    results: Dict[Tuple[str, str], Dict[str, List[float]]] = {}
    for image in images:
        src = os.path.join(corpus, image)
        info = manifest["images"].get(image, {})
        extents = data_extents(src)
        data_bytes = sum(l for _, l in extents)
        checks[image] = {}
        for cache in caches:
            times: Dict[str, List[float]] = {k: [] for k, _, _ in tools}
            syncs: Dict[str, List[float]] = {k: [] for k, _, _ in tools}
            bgs: Dict[str, List[float]] = {k: [] for k, _, _ in tools}
            builds: Dict[str, set] = {k: set() for k, _, _ in tools}
            results[(image, cache)] = times
            log("%s, %s source: %d rounds x %d tools" % (image, cache, runs, len(tools)))
            for rnd in range(runs):
                order = tools[rnd % len(tools):] + tools[:rnd % len(tools)]
                for key, label, tmpl in order:
                    rm(dst)
                    os.sync()
                    if cache == "cold":
                        evict(src)
                    else:
                        warm(src, extents)
                    resident = resident_bytes(src)
                    busy0, iow0, waited = wait_quiet(a.wait_quiet, a.wait_max)
                    argv = argv_for(tmpl, src, dst)
                    c0, (b0, _, t0) = children_cpu(), cpu_times()
                    s, s_sync, rc, err = timed(argv, dst_dir, pin_env if is_imgcopy(key) else None)
                    c1, (b1, _, t1) = children_cpu(), cpu_times()
                    # CPU the rest of the machine used meanwhile, as a fraction of all CPUs
                    # (kernel writeback threads working for us count here too)
                    bg = max(0.0, (b1 - b0) - (c1 - c0)) / max(t1 - t0, 1e-9)
                    rec = {"image": image, "cache": cache, "round": rnd, "tool": key,
                           "seconds": s if rc == 0 else None,
                           "sync_seconds": s_sync if rc == 0 else None, "rc": rc,
                           "src_resident": resident, "src_data": data_bytes,
                           "busy_before": round(busy0, 3), "iowait_before": round(iow0, 3),
                           "waited": round(waited, 1), "bg_cpu_during": round(bg, 3),
                           "child_cpu": round(c1 - c0, 3)}
                    if is_imgcopy(key):
                        rec["imgcopy_core"] = core_hash if pin_dir else imgcopy_core(python)[1]
                        builds[key].add(rec["imgcopy_core"])
                    if rc == 0:
                        bgs[key].append(bg)
                    if rc != 0:
                        failed = True
                        rec["stderr"] = err[-2000:]
                        log("  FAILED %s (rc %d): %s" % (" ".join(argv), rc, err[-500:]))
                    else:
                        times[key].append(s)
                        syncs[key].append(s_sync)
                    if rc == 0 and not a.no_verify and key not in checks[image]:
                        c = verify(src, dst)
                        checks[image][key] = c
                        rec["check"] = c
                        if not c["identical"]:
                            failed = True
                            log("  DIFFERS: %s: %s" % (" ".join(argv), c["compare"]))
                    runs_log.append(rec)
                    log("  round %d %-16s %s  (source resident %s of %s data; machine busy "
                        "%.0f%% + iowait %.0f%% before, others' CPU %.0f%% during)" % (
                        rnd + 1, label, fmt_s(rec["seconds"]), human(max(resident, 0)),
                        human(data_bytes), 100 * busy0, 100 * iow0, 100 * bg))
            rm(dst)
            print_table(image, cache, info, data_bytes, tools, times, syncs, bgs, builds,
                        checks[image], runs)

    prof = None
    if a.profile:
        pimg = a.profile
        if pimg not in images:
            log("profile: %s is not among the images run; using %s" % (pimg, images[0]))
            pimg = images[0]
        log("profile: %s" % pimg)
        prof = profile(tools, os.path.join(corpus, pimg), dst, dst_dir, pin_env,
                       a.wait_quiet, a.wait_max)

    print_summary(images, caches, tools, results)
    print()
    print("== start-up: each command on a 1 MiB one-extent file (warm), median of %d ==" % max(3, runs))
    for key, label, _ in tools:
        st = startup[key]
        print("  %-16s %s s" % (label, fmt_s(statistics.median(st)) if st else "-"))
    if prof is not None:
        print_profile(tools, prof, pimg)

    core_path2, core_hash2 = imgcopy_core(python)
    if pin_dir:
        shutil.rmtree(pin_dir, ignore_errors=True)
    meta["loadavg_end"] = open("/proc/loadavg").read().split()[:3]
    print()
    print("load average: start %s, end %s" % (" ".join(meta["loadavg_start"]),
                                              " ".join(meta["loadavg_end"])))
    if core_hash2 != venv_core:
        meta["imgcopy_core_changed"] = [venv_core, core_hash2]
        if pin_dir:
            print("note: the venv's imgcopy was rebuilt during the run (%s -> %s); this run "
                  "used its copy taken at the start" % (venv_core, core_hash2))
        else:
            print("WARNING: the installed imgcopy core changed during the run (%s -> %s); "
                  "imgcopy timings may mix two builds" % (venv_core, core_hash2))

    if a.json:
        doc = {"meta": meta, "runs": runs_log, "checks": checks,
               "startup": startup, "profile": prof,
               "medians": {"%s/%s" % k: {t: (statistics.median(v) if v else None)
                                         for t, v in times.items()}
                           for k, times in results.items()}}
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=1)
        print("raw timings: %s" % a.json)
    if failed:
        print("FAILED: a command failed or an output differs (see above)")
    return 1 if failed else 0


def med(v: List[float]) -> Optional[float]:
    return statistics.median(v) if v else None


def print_table(image, cache, info, data_bytes, tools, times, syncs, bgs, builds, checks,
                runs) -> None:
    print()
    print("== %s: %s virtual, %s data; %s source cache, %d rounds ==" % (
        image, human(info.get("virtual_size", 0)), human(data_bytes), cache, runs))
    refs = [k for k, _, _ in tools if is_imgcopy(k) and times.get(k)]
    labels = {k: l for k, l, _ in tools}
    hdr = "%-16s %8s %8s %8s %6s %4s" % ("tool", "median", "min", "max", "sync", "bg%")
    for r in refs:
        hdr += " %11s" % ("/" + labels[r].replace(" ", ""))
    hdr += " %8s %11s  %s" % ("extents", "allocated", "check")
    print(hdr)
    for key, label, _ in tools:
        v = times[key]
        m = med(v)
        b = med(bgs[key])
        row = "%-16s %8s %8s %8s %6s %4s" % (label, fmt_s(m), fmt_s(min(v) if v else None),
                                             fmt_s(max(v) if v else None), fmt_s(med(syncs[key])),
                                             "-" if b is None else "%.0f" % (100 * b))
        for r in refs:
            row += " %11s" % fmt_ratio(m / med(times[r]) if m and med(times[r]) else None)
        c = checks.get(key)
        if c:
            row += " %8s %11s  %s" % (c["extents"], human(c["allocated"]),
                                      "identical" if c["identical"] else "DIFFERS")
        if len(builds.get(key, ())) > 1:
            row += "  (%d imgcopy builds!)" % len(builds[key])
        print(row)
    if refs:
        print("(/imgcopy: tool median / imgcopy median, > 1 = imgcopy faster; sync: median of "
              "the `sync` part; bg%: median CPU used by everything else during the run, % of all "
              "CPUs, kernel writeback included)")


def print_summary(images, caches, tools, results) -> None:
    anchors = [k for k, _, _ in tools if is_anchor(k)]
    labels = {k: l for k, l, _ in tools}
    has_baseline = any(k == BASELINE for k, _, _ in tools)
    print()
    print("== summary: medians in seconds; ratio = best anchor / imgcopy (> 1 = imgcopy faster) ==")
    print("%-17s %-5s %9s %9s  %-17s %8s %8s %8s%s" % (
        "image", "cache", "imgcopy", "-m 8", "best anchor", "median", "ratio", "ratio-m8",
        "  baseline/imgcopy" if has_baseline else ""))
    for image in images:
        for cache in caches:
            t = results.get((image, cache))
            if not t:
                continue
            im, im8 = med(t.get("imgcopy", [])), med(t.get("imgcopy-m8", []))
            best = None
            for k in anchors:
                m = med(t[k])
                if m is not None and (best is None or m < best[1]):
                    best = (k, m)
            base = med(t.get(BASELINE, []))
            print("%-17s %-5s %9s %9s  %-17s %8s %8s %8s%s" % (
                image, cache, fmt_s(im), fmt_s(im8),
                labels[best[0]] if best else "-", fmt_s(best[1]) if best else "-",
                fmt_ratio(best[1] / im if best and im else None),
                fmt_ratio(best[1] / im8 if best and im8 else None),
                "  %s" % fmt_ratio(base / im if base and im else None) if has_baseline else ""))


if __name__ == "__main__":
    sys.exit(main())
