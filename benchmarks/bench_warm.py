#!/usr/bin/env python3
"""Warm copies over NBD (issue 26): after a full copy, copy only what a dirty
bitmap says changed, into a target 5 ms away, against a full nbdcopy and a
serial changed-area loop, in one run, alternating.

The disk (built once per ``--workdir``, seeded, reused while its stamp
matches):

  full.raw     2 GiB virtual, ~800 MiB of data in ~2,000 lognormal runs
               between holes (half text-like, half random content; a third
               of the larger runs hold a written zero run): the earlier full
               copy, and the source's content before the rewrites
  src.qcow2    ``qemu-img convert -f raw -O qcow2 full.raw src.qcow2``, then
               ``qemu-img bitmap --add src.qcow2 warm`` (64 KiB granules),
               then ~1% of the disk (20 MiB) rewritten by ``qemu-io``: seeded
               writes of 4 KiB .. 256 KiB at 4 KiB-aligned offsets, one in ten
               ``write -z``, the others ``write -P N``; the bitmap records
               them

The source: ``qemu-nbd --read-only --persistent --shared=0 -B warm -f qcow2
src.qcow2`` (no added latency), one server for the whole run.  The target:
a copy of full.raw (target.raw), served for every run by a fresh ``nbdkit
--filter=log --filter=delay file file=target.raw`` with every request
delayed ``--delay-ms`` (5): delay-read, delay-write, delay-zero, delay-trim
and delay-extents.  Before each run the target is put back to full.raw
(the dirty ranges copied back and punched as full.raw has them; after a full
copy the whole file), then ``sync``, untimed.

Commands (``--tools``), each once per round, round-robin, the first one
rotating; each timed as ``CMD && sync`` (the target is a file behind
nbdkit), medians of ``--runs`` (5):

  imgcopy-bitmap   PYTHON -m imgcopy convert -n --bitmap warm -f raw SRC DST
                   (issue 26's warm sync: the bitmap read over NBD,
                   qemu:dirty-bitmap:warm; the API's convert(src, dst,
                   create=False, bitmap="warm"))
  imgcopy-changed  imgcopy.convert(SRC, DST, create=False, changed=RANGES),
                   RANGES the dirty extents ``nbdinfo --json
                   --map=qemu:dirty-bitmap:warm SRC`` lists (the same copy
                   with the map read by nbdinfo; nbdinfo's run is timed)
  imgcopy-qcow2    PYTHON -m imgcopy convert -n --bitmap warm -f qcow2
                   src.qcow2 DST (bitmap and data read from the file itself,
                   qemu-nbd sharing it read-only)
  nbdcopy          nbdcopy SRC DST (a full copy)
  serial           the changed-area loop as CDI runs it: the dirty extents
                   from the source's qemu:dirty-bitmap:warm context (NBD
                   block status), then for each, in pieces of at most 2 MiB,
                   one request at a time: read from the source, write (or
                   zero, when the piece reads as zeros) to the target; a
                   flush at the end.  libnbd's Python bindings
                   (python3-libnbd) when an interpreter here has them, else
                   imgcopy.convert(changed=RANGES, concurrency=1,
                   connections=1, requests_in_flight=1)

SRC and DST are ``nbd+unix:///?socket=PATH``.  Per command: median, min,
max, the ``sync`` part, ``inner`` (the copy's own seconds as it reports
them: imgcopy's ``--stats json`` elapsed, CopyResult.elapsed; the serial
loop's from its first connect; so the interpreter's start-up, printed
once, is what lies between), the target's writes, zeroes (+ trims), MiB
written and connections (nbdkit's log filter), peak RSS (GNU time), the
ratio to nbdcopy and to the bound.  The bound (d): the dirty
requests (each dirty extent in pieces of 2 MiB, imgcopy's request size) x
the latency / the target's concurrency (nbdkit's 16 threads on each of the
4 connections imgcopy opens to a multi-conn export); also the same requests
one at a time (the serial loop's bound).  Each command's first successful
run is checked: ``qemu-img compare -f qcow2 -F raw src.qcow2 target.raw``;
in the first round, the target's reset is checked against full.raw.

Issue 26's aim, printed: warm (imgcopy-bitmap; imgcopy-changed where the
bitmap cannot be read over NBD) <= 0.1 x the full nbdcopy.  A command that
fails on its first run is reported and left out of the later rounds.

``--quick``: 1/8 of the disk (256 MiB virtual, 100 MiB of data), 2 rounds
(well under a minute).  ``--json FILE``: every run.  Exit status 1 if a
command (other than one reported unsupported) fails or a copy differs.
Servers are stopped whatever happens (Ctrl-C and SIGTERM included).
"""
from __future__ import annotations

import argparse
import atexit
import ctypes
import ctypes.util
import json
import math
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
BITMAP = "warm"
REQUEST = 2 * MiB          # imgcopy's request size; the serial loop's pieces
TARGET_CONNECTIONS = 4     # imgcopy's connections to a multi-conn export
AIM = 0.1
VERSION = 2


# --------------------------------------------------------------------------
# child modes (run as their own processes, timed from outside)

def dirty_ranges_nbdinfo(src: str, name: str) -> List[Tuple[int, int]]:
    """The dirty extents of qemu:dirty-bitmap:NAME as nbdinfo lists them."""
    out = subprocess.run(["nbdinfo", "--json", "--map=qemu:dirty-bitmap:" + name, src],
                         check=True, capture_output=True, text=True).stdout
    return [(e["offset"], e["length"]) for e in json.loads(out) if e["type"] & 1]


def child_changed(src: str, dst: str, name: str, serial: bool) -> int:
    """imgcopy.convert(changed=nbdinfo's dirty extents): the warm copy with
    the map read by nbdinfo; `serial`: one request at a time."""
    import imgcopy
    ranges = dirty_ranges_nbdinfo(src, name)
    knobs: Dict[str, Any] = dict(concurrency=1, connections=1, requests_in_flight=1) \
        if serial else {}
    r = imgcopy.convert(src, dst, src_format="raw", create=False, changed=ranges, **knobs)
    json.dump({"ranges": len(ranges), "elapsed": r.elapsed, "bytes_changed": r.bytes_changed,
               "bytes_written": r.bytes_written, "bytes_zeroed": r.bytes_zeroed}, sys.stdout)
    return 0


def child_serial_nbd(src: str, dst: str, name: str) -> int:
    """The changed-area loop with libnbd's bindings, one request at a time."""
    import nbd
    t0 = time.perf_counter()
    context = "qemu:dirty-bitmap:" + name
    s = nbd.NBD()
    s.add_meta_context(context)
    s.connect_uri(src)
    if not s.can_meta_context(context):
        sys.exit("serial: the source has no %s" % context)
    d = nbd.NBD()
    d.connect_uri(dst)
    size = s.get_size()
    extents: List[Tuple[int, int]] = []
    pos = 0
    while pos < size:
        seen = [pos]

        def cb(meta: str, offset: int, entries: List[int], err: Any) -> int:
            if meta != context:
                return 0
            at = offset
            for i in range(0, len(entries) - 1, 2):
                length, flags = entries[i], entries[i + 1]
                length = min(length, size - at)
                if length <= 0:
                    break
                if flags & 1:
                    if extents and extents[-1][0] + extents[-1][1] == at:
                        extents[-1] = (extents[-1][0], extents[-1][1] + length)
                    else:
                        extents.append((at, length))
                at += length
            seen[0] = max(seen[0], at)
            return 0
        s.block_status(min(size - pos, 1 << 30), pos, cb)
        if seen[0] <= pos:
            sys.exit("serial: block status made no progress at %d" % pos)
        pos = seen[0]
    zero = bytes(REQUEST)
    reads = writes = zeros = 0
    for off, length in extents:
        end = off + length
        while off < end:
            n = min(REQUEST, end - off)
            buf = s.pread(n, off)
            reads += 1
            if buf == zero[:n]:
                d.zero(n, off)
                zeros += 1
            else:
                d.pwrite(buf, off)
                writes += 1
            off += n
    d.flush()
    d.shutdown()
    s.shutdown()
    json.dump({"extents": len(extents), "reads": reads, "writes": writes, "zeros": zeros,
               "elapsed": time.perf_counter() - t0}, sys.stdout)
    return 0


def child_main(argv: List[str]) -> int:
    mode, src, dst, name = argv[:4]
    if mode == "--child-changed":
        return child_changed(src, dst, name, serial=False)
    if mode == "--child-serial-api":
        return child_changed(src, dst, name, serial=True)
    if mode == "--child-serial-nbd":
        return child_serial_nbd(src, dst, name)
    sys.exit("unknown child mode %s" % mode)


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1].startswith("--child-"):
    sys.exit(child_main(sys.argv[1:]))

# the benchmark proper (imports that a child does not need)
import run_images  # noqa: E402
from bench_convert import (REPO, data_extents, fmt_ratio, fmt_s, human, imgcopy_core,  # noqa: E402
                           log, med, pin_imgcopy)
from bench_nbd import run_timed  # noqa: E402
from make_corpus import BLK, ContentGen, align_down, write_layout  # noqa: E402
from nbd_servers import THREADS, NbdkitServer, QemuNbdServer  # noqa: E402


# --------------------------------------------------------------------------
# the disk

def rewrites(rng: random.Random, size: int, fraction: float) -> List[Tuple[str, int, int, int]]:
    """Seeded writes adding up to `fraction` of `size`: (kind, offset,
    length, pattern), 4 KiB .. 256 KiB each (log-uniform), 4 KiB aligned,
    one in ten zeroes."""
    out: List[Tuple[str, int, int, int]] = []
    total, want = 0, int(size * fraction)
    while total < want:
        n = align_down(int(math.exp(rng.uniform(math.log(4 * KiB), math.log(256 * KiB)))), BLK)
        n = max(BLK, min(n, want - total + BLK))
        off = align_down(rng.randrange(size - n), BLK)
        if rng.random() < 0.1:
            out.append(("zero", off, n, 0))
        else:
            out.append(("write", off, n, rng.randrange(1, 256)))
        total += n
    return out


def build(workdir: str, scale: float, seed: int, fraction: float) -> Dict:
    """full.raw (the earlier full copy) and src.qcow2 (the same, with bitmap
    BITMAP and the rewrites it recorded), unless the stamp matches."""
    os.makedirs(workdir, exist_ok=True)
    full, src = os.path.join(workdir, "full.raw"), os.path.join(workdir, "src.qcow2")
    meta_path = os.path.join(workdir, "warm.json")
    stamp = {"scale": scale, "seed": seed, "fraction": fraction, "version": VERSION}
    try:
        with open(meta_path) as f:
            meta = json.load(f)
        if meta["stamp"] == stamp and os.path.exists(full) and os.path.exists(src):
            return meta
    except (OSError, ValueError, KeyError):
        pass
    for p in (meta_path, full, src):
        if os.path.exists(p):
            os.unlink(p)
    rng = random.Random(seed * 1000003 + 26)
    size = align_down(int(2 * GiB * scale), MiB)
    data = align_down(int(800 * MiB * scale))
    n = max(50, int(round(2000 * scale)))
    lay = run_images.runs_layout(rng, size, data, n)
    log("warm: building %s (%s virtual, %s of data in %d runs)" % (
        full, human(size), human(data), n))
    t0 = time.monotonic()
    write_layout(full, lay, ContentGen(seed * 7 + 26, text_fraction=0.5))
    subprocess.run(["qemu-img", "convert", "-f", "raw", "-O", "qcow2", full, src], check=True)
    subprocess.run(["qemu-img", "bitmap", "--add", src, BITMAP], check=True)
    writes = rewrites(rng, size, fraction)
    script = "".join("write -z %d %d\n" % (o, n) if k == "zero" else
                     "write -P %d %d %d\n" % (p, o, n) for k, o, n, p in writes)
    subprocess.run(["qemu-io", "-f", "qcow2", src], input=script.encode(), check=True,
                   stdout=subprocess.DEVNULL)
    log("warm: %d rewrites (%s) by qemu-io in %.1f s" % (
        len(writes), human(sum(w[2] for w in writes)), time.monotonic() - t0))
    meta = {"stamp": stamp, "size": size, "data_bytes": data, "data_runs": n,
            "rewrites": len(writes), "rewritten_bytes": sum(w[2] for w in writes),
            "zero_rewrites": sum(1 for w in writes if w[0] == "zero")}
    with open(meta_path, "w") as f:
        json.dump(meta, f)
    return meta


# --------------------------------------------------------------------------
# putting the target back

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE = 1, 2


def punch(fd: int, off: int, length: int) -> None:
    if _libc.fallocate(fd, FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE, off, length) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def restore(target: str, full: str, ranges: List[Tuple[int, int]]) -> None:
    """Make `ranges` of `target` what they are in `full`: data copied, holes
    punched; fdatasync."""
    fs = os.open(full, os.O_RDONLY)
    fd = os.open(target, os.O_WRONLY)
    try:
        for off, length in ranges:
            end = off + length
            pos = off
            while pos < end:
                try:
                    d = os.lseek(fs, pos, os.SEEK_DATA)
                except OSError:
                    d = end
                d = min(d, end)
                if d > pos:
                    punch(fd, pos, d - pos)
                if d >= end:
                    break
                h = min(os.lseek(fs, d, os.SEEK_HOLE), end)
                while d < h:
                    buf = os.pread(fs, min(8 * MiB, h - d), d)
                    os.pwrite(fd, buf, d)
                    d += len(buf)
                pos = h
        os.fdatasync(fd)
    finally:
        os.close(fs)
        os.close(fd)


def reset(target: str, full: str) -> None:
    """The whole target made a sparse copy of `full` again."""
    tmp = target + ".tmp"
    subprocess.run(["cp", "--sparse=always", full, tmp], check=True)
    os.replace(tmp, target)


def merged(ranges: List[Tuple[int, int]]) -> List[Tuple[int, int]]:
    """Sorted ranges with the touching ones joined (a dirty map is also cut
    where the allocation changes; nbdinfo's is not)."""
    out: List[Tuple[int, int]] = []
    for off, n in sorted(ranges):
        if out and out[-1][0] + out[-1][1] >= off:
            out[-1] = (out[-1][0], max(out[-1][1], off + n - out[-1][0]))
        else:
            out.append((off, n))
    return out


def compare(a: str, fa: str, b: str, fb: str) -> Dict:
    r = subprocess.run(["qemu-img", "compare", "-f", fa, "-F", fb, a, b],
                       capture_output=True, text=True)
    return {"identical": r.returncode == 0 and "identical" in r.stdout,
            "compare": (r.stdout + r.stderr).strip()[-500:]}


# --------------------------------------------------------------------------
# the commands

def nbd_python(venv_python: str) -> Optional[str]:
    """An interpreter that imports libnbd's bindings (python3-libnbd), or None."""
    for py in (venv_python, "/usr/bin/python3", shutil.which("python3") or ""):
        if py and os.access(py, os.X_OK) and subprocess.run(
                [py, "-c", "import nbd"], capture_output=True).returncode == 0:
            return py
    return None


def tool_table(python: str, nbdpy: Optional[str], src_qcow2: str) -> List[Tuple[str, str, List[str]]]:
    me = os.path.abspath(__file__)
    serial = ([nbdpy, me, "--child-serial-nbd", "SRC", "DST", BITMAP] if nbdpy else
              [python, me, "--child-serial-api", "SRC", "DST", BITMAP])
    return [
        ("imgcopy-bitmap", "imgcopy --bitmap (NBD)",
         [python, "-m", "imgcopy", "convert", "-n", "--bitmap", BITMAP, "-f", "raw",
          "--stats", "json", "SRC", "DST"]),
        ("imgcopy-changed", "imgcopy changed=nbdinfo",
         [python, me, "--child-changed", "SRC", "DST", BITMAP]),
        ("imgcopy-qcow2", "imgcopy --bitmap (qcow2)",
         [python, "-m", "imgcopy", "convert", "-n", "--bitmap", BITMAP, "-f", "qcow2",
          "--stats", "json", src_qcow2, "DST"]),
        ("nbdcopy", "nbdcopy (full)", ["nbdcopy", "SRC", "DST"]),
        ("serial", "serial loop (libnbd)" if nbdpy else "serial loop (imgcopy, 1 req)", serial),
    ]


def inner_seconds(text: Optional[str]) -> Optional[float]:
    """The copy's own seconds as the command printed them (imgcopy's --stats
    json and the child modes: "elapsed"), None if it printed none."""
    if not text or "{" not in text:
        return None
    try:
        return float(json.loads(text[text.index("{"):text.rindex("}") + 1])["elapsed"])
    except (ValueError, KeyError, TypeError):
        return None


def argv_for(t: List[str], src: str, dst: str) -> List[str]:
    return [src if a == "SRC" else dst if a == "DST" else a for a in t]


WARM_KEYS = ("imgcopy-bitmap", "imgcopy-changed", "imgcopy-qcow2")
FULL_KEYS = ("nbdcopy",)


# --------------------------------------------------------------------------
# main

def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="scale 1/8, 2 rounds")
    ap.add_argument("--scale", type=float, help="of the 2 GiB disk (default 1; --quick 0.125)")
    ap.add_argument("--runs", type=int, help="rounds (default 5; --quick 2)")
    ap.add_argument("--delay-ms", type=float, default=5.0, help="per target request (5)")
    ap.add_argument("--fraction", type=float, default=0.01,
                    help="of the disk rewritten after the full copy (0.01)")
    ap.add_argument("--seed", type=int, default=26)
    ap.add_argument("--workdir", help="default /tmp/imgcopy-bench-warm[-s<scale>]")
    ap.add_argument("--tools", default="all",
                    help="comma separated keys (default all: %s)" % ",".join(
                        WARM_KEYS + FULL_KEYS + ("serial",)))
    ap.add_argument("--python", help="interpreter with imgcopy (default the repository's .venv)")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--json", help="write every run here")
    a = ap.parse_args(argv)
    scale = a.scale if a.scale is not None else (0.125 if a.quick else 1.0)
    runs = a.runs if a.runs is not None else (2 if a.quick else 5)
    workdir = a.workdir or ("/tmp/imgcopy-bench-warm" if scale == 1 else
                            "/tmp/imgcopy-bench-warm-s%g" % scale)
    python = a.python or os.path.join(REPO, ".venv", "bin", "python")
    if not os.access(python, os.X_OK):
        python = sys.executable
    for prog in ("qemu-img", "qemu-io", "qemu-nbd", "nbdkit", "nbdcopy", "nbdinfo"):
        if not shutil.which(prog):
            sys.exit("bench_warm: %s not found (apt-get install -y qemu-utils nbdkit libnbd-bin)"
                     % prog)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    pypath, pin_dir = pin_imgcopy(python)
    atexit.register(shutil.rmtree, pin_dir, True)
    env = dict(os.environ, PYTHONPATH=pypath)

    meta = build(workdir, scale, a.seed, a.fraction)
    full, src_qcow2 = os.path.join(workdir, "full.raw"), os.path.join(workdir, "src.qcow2")
    target = os.path.join(workdir, "target.raw")
    atexit.register(lambda: os.path.exists(target) and os.unlink(target))
    sys.path.insert(0, pypath)
    import imgcopy
    dmap = imgcopy.dirty_map(src_qcow2, BITMAP)
    dirty = merged([(e.start, e.length) for e in dmap if e.dirty])
    dirty_bytes = sum(n for _, n in dirty)
    dirty_requests = sum(-(-n // REQUEST) for _, n in dirty)
    full_extents = data_extents(full)

    nbdpy = nbd_python(python)
    tools = tool_table(python, nbdpy, src_qcow2)
    if a.tools != "all":
        want = [t.strip() for t in a.tools.split(",") if t.strip()]
        for t in want:
            if t not in [k for k, _, _ in tools]:
                ap.error("unknown tool %r" % t)
        tools = [t for t in tools if t[0] in want]
    labels = {k: l for k, l, _ in tools}
    load_start = open("/proc/loadavg").read().split()[:3]
    delay = a.delay_ms

    def version(cmd: List[str]) -> str:
        try:
            return subprocess.run(cmd, capture_output=True, text=True).stdout.splitlines()[0]
        except (OSError, IndexError):
            return "?"
    git = subprocess.run(["git", "-C", REPO, "describe", "--always", "--dirty"],
                         capture_output=True, text=True).stdout.strip()
    print("warm copy (issue 26): changed areas by dirty bitmap, qemu-nbd source -> nbdkit file "
          "target at %g ms per request; seconds of `CMD && sync`, medians of %d rounds" % (
              delay, runs))
    print("disk: %s virtual, %s of data in %d runs; %d rewrites (%s, %d of them zeroes) recorded "
          "by bitmap %r: %d dirty extents, %s" % (
              human(meta["size"]), human(meta["data_bytes"]), meta["data_runs"],
              meta["rewrites"], human(meta["rewritten_bytes"]), meta["zero_rewrites"], BITMAP,
              len(dirty), human(dirty_bytes)))
    print("load %s, %d CPUs; imgcopy %s (_core %s), %s; %s; %s; %s" % (
        " ".join(load_start), os.cpu_count(), git or "?", imgcopy_core(python, env)[1],
        version(["nbdcopy", "--version"]), version(["nbdkit", "--version"]),
        version(["qemu-img", "--version"]), "libnbd bindings: %s" % (nbdpy or "none")))
    for k, l, t in tools:
        print("  %-28s %s" % (l, " ".join(t)))

    startup = [run_timed([python, "-m", "imgcopy", "--version"], env, 60, sync=False)["seconds"]
               for _ in range(5)]
    print("  start-up: python -m imgcopy --version %s s (median of 5)" % fmt_s(med(startup)))

    runs_log: List[Dict] = []
    times: Dict[str, List[float]] = {k: [] for k, _, _ in tools}
    counts: Dict[str, Dict[str, List[float]]] = {k: {} for k, _, _ in tools}
    checks: Dict[str, Dict] = {}
    unsupported: Dict[str, str] = {}
    failed = False
    reset(target, full)
    subprocess.run(["sync"], check=True)
    whole_reset_needed = False
    with QemuNbdServer(src_qcow2, "qcow2", read_only=True, bitmaps=[BITMAP]) as src_srv:
        qemu_dirty = merged(dirty_ranges_nbdinfo(src_srv.uri, BITMAP))
        agree = qemu_dirty == dirty
        print("  dirty map: nbdinfo --map=qemu:dirty-bitmap:%s (qemu) %s imgcopy.dirty_map "
              "(%d extents)" % (BITMAP, "==" if agree else "DIFFERS from", len(qemu_dirty)))
        if not agree:
            failed = True
        for rnd in range(runs):
            order = tools[rnd % len(tools):] + tools[:rnd % len(tools)]
            load = " ".join(open("/proc/loadavg").read().split()[:3])
            log("round %d (load %s)" % (rnd + 1, load))
            for key, label, tmpl in order:
                if key in unsupported:
                    continue
                # the target back to the earlier full copy, durable, untimed
                if whole_reset_needed:
                    reset(target, full)
                else:
                    restore(target, full, dirty)
                subprocess.run(["sync"], check=True)
                if rnd == 0:
                    c = compare(full, "raw", target, "raw")
                    if not c["identical"]:
                        failed = True
                        log("  target reset DIFFERS from full.raw: %s" % c["compare"])
                whole_reset_needed = key in FULL_KEYS
                dst = NbdkitServer("file", ["file=" + target] + [
                    "delay-%s=%gms" % (k, delay) for k in ("read", "write", "zero", "trim",
                                                            "extents")], filters=["delay"])
                with dst:
                    rec = run_timed(argv_for(tmpl, src_srv.uri, dst.uri),
                                    env if key != "nbdcopy" else None, a.timeout, sync=True,
                                    stdout=True)
                    conns, tot = dst.totals()
                    active = dst.active_connections()
                rec["inner"] = inner_seconds(rec.pop("stdout", ""))
                rec.update(tool=key, round=rnd, load=load, connections=active)
                for kind in ("Read", "Write", "Zero", "Trim", "Extents"):
                    n, b = tot.get(kind, (0, 0))
                    rec[kind.lower()] = n
                    rec[kind.lower() + "_bytes"] = b
                runs_log.append(rec)
                if rec["rc"] != 0:
                    msg = rec["stderr"].splitlines()[-1] if rec["stderr"] else "rc %d" % rec["rc"]
                    if not times[key]:
                        unsupported[key] = msg
                        print("%s: fails on its first run, left out: %s" % (label, msg),
                              flush=True)
                        whole_reset_needed = True     # what it wrote, if anything, undone
                        continue
                    failed = True
                    log("  FAILED %s: %s" % (label, rec["stderr"][-500:]))
                    whole_reset_needed = True
                    continue
                times[key].append(rec["seconds"])
                for f in ("inner", "sync_seconds", "write", "zero", "trim", "write_bytes", "read",
                          "extents", "connections", "rss_kib"):
                    if rec.get(f) is not None:
                        counts[key].setdefault(f, []).append(rec[f])
                if key not in checks:
                    checks[key] = compare(src_qcow2, "qcow2", target, "raw")
                    if not checks[key]["identical"]:
                        failed = True
                        log("  DIFFERS: %s: %s" % (label, checks[key]["compare"]))
                log("  %-28s %s s  writes %d, zeros %d, conns %d, RSS %s MiB" % (
                    label, fmt_s(rec["seconds"]), rec["write"], rec["zero"] + rec["trim"],
                    active, "?" if rec["rss_kib"] is None else rec["rss_kib"] // KiB))
    load_end = open("/proc/loadavg").read().split()[:3]

    # the table
    concurrency = THREADS * TARGET_CONNECTIONS
    bound = dirty_requests * delay / 1000 / concurrency
    bound_serial = dirty_requests * delay / 1000
    full_med = med(times.get("nbdcopy", []))
    print()
    print("== %s virtual (%s data), %s dirty in %d extents = %d requests of <= 2 MiB; target %g ms "
          "per request; %d rounds; load %s -> %s ==" % (
              human(meta["size"]), human(meta["data_bytes"]), human(dirty_bytes), len(dirty),
              dirty_requests, delay, runs, " ".join(load_start), " ".join(load_end)))
    print("%-28s %7s %7s %7s %6s %7s %7s %6s %7s %5s %5s %8s %7s  %s" % (
        "command", "median", "min", "max", "sync", "inner", "writes", "zeros", "MiB wr", "conns",
        "RSS", "/nbdcopy", "/bound", "check"))
    for key, label, _ in tools:
        v = times[key]
        if not v:
            print("%-28s %s" % (label, "not run: " + unsupported[key] if key in unsupported
                                else "no successful run"))
            continue
        c = {f: med(x) for f, x in counts[key].items()}
        m = statistics.median(v)
        rss = max(counts[key].get("rss_kib", [0]) or [0])
        print("%-28s %7s %7s %7s %6s %7s %7d %6d %7.1f %5d %5.0f %8s %7s  %s" % (
            label, fmt_s(m), fmt_s(min(v)), fmt_s(max(v)), fmt_s(c.get("sync_seconds")),
            fmt_s(c.get("inner")),
            c.get("write", 0), c.get("zero", 0) + c.get("trim", 0),
            c.get("write_bytes", 0) / MiB, c.get("connections", 0), rss / KiB,
            fmt_ratio(m / full_med if full_med else None), fmt_ratio(m / bound if bound else None),
            "identical" if checks.get(key, {}).get("identical") else
            "DIFFERS" if key in checks else "-"))
    print("%-28s %7s   (d) %d dirty requests x %g ms / (%d threads x %d connections)" % (
        "bound", fmt_s(bound), dirty_requests, delay, THREADS, TARGET_CONNECTIONS))
    print("%-28s %7s   the same requests one at a time" % ("bound, serial", fmt_s(bound_serial)))
    print("(start-up of python -m imgcopy: %s s, part of every imgcopy row; inner: the copy's "
          "own seconds as it reports them, CopyResult.elapsed, the serial loop's from its "
          "connect)" % fmt_s(med(startup)))
    aim: Dict[str, Any] = {}
    warm_key = next((k for k in ("imgcopy-bitmap", "imgcopy-changed") if times.get(k)), None)
    if warm_key and full_med:
        r = med(times[warm_key]) / full_med
        aim = {"tool": warm_key, "ratio": r, "met": r <= AIM}
        print("aim: warm (%s) <= %.1fx the full nbdcopy: %.3fx, %s" % (
            labels[warm_key], AIM, r, "met" if r <= AIM else "NOT met"))
    if "imgcopy-bitmap" in unsupported:
        print("note: imgcopy --bitmap over NBD failed: %s" % unsupported["imgcopy-bitmap"])
    print("load average: start %s, end %s" % (" ".join(load_start), " ".join(load_end)))
    if a.json:
        with open(a.json, "w") as out:
            json.dump({"meta": meta, "dirty_extents": len(dirty), "dirty_bytes": dirty_bytes,
                       "dirty_requests": dirty_requests, "bound": bound,
                       "bound_serial": bound_serial, "startup": startup, "runs": runs_log,
                       "checks": checks, "unsupported": unsupported, "aim": aim,
                       "load": [load_start, load_end],
                       "full_data_extents": len(full_extents)}, out, indent=1)
        print("raw runs: %s" % a.json)
    if failed:
        print("FAILED: a command failed or a copy differs (see above)")
    return 1 if failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit("bench_warm: interrupted")
