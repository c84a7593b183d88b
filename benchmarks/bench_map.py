#!/usr/bin/env python3
"""Side-by-side benchmark: mapping a sparse raw image with ~100,000 extents,
imgcopy against ``qemu-img map``.

What it does:

* builds once (cached in ``--workdir``) a sparse raw file: a hole, then
  ``--data-runs`` data runs each followed by a hole, seeded random lengths
  (data 4 KiB .. 64 KiB, holes 4 KiB .. 1 MiB, all multiples of 4 KiB), so
  2 * data_runs + 1 extents; verifies the count with
  ``qemu-img map -f raw --output=json FILE | wc -l``;
* times, alternating A B C A B C ... after one untimed warm-up each:
    A  qemu-img map -f raw --output=json FILE > /dev/null
    B  python -m imgcopy map -f raw --output=json FILE > /dev/null
    C  imgcopy.map(FILE).to_json()        (library, in-process)
  plus A and B on a one-extent file (their fixed start-up cost), and prints
  median / min / max and the ratio qemu_median / median (> 1 means faster
  than qemu-img), and both medians net of start-up;
* checks that the JSON of A, B and C is identical (warm-up outputs);
* counts lseek calls: A and B under ``strace -f -c -e trace=lseek``, net of the
  same command on a one-extent file (so interpreter start-up is not counted),
  and the library's own counter ``img.cache_stats()["lseek_calls"]``;
* queries every extent start with ``img.block_status(start)`` on a fresh
  image in forward, backward and random order: elapsed and lseek calls, which
  must stay O(extents) whatever the order.

``--quick``: ~10k extents, 3 runs (the test suite's smoke test).
``--json FILE`` writes everything as JSON.  Exit status 0 on success, 1 when
the outputs differ or a command fails.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import shutil
import statistics
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional

try:
    import imgcopy
except ImportError as exc:  # pragma: no cover - depends on the environment
    sys.exit(f"bench_map: cannot import imgcopy ({exc}); install it first, e.g.\n"
             "  python3 -m venv /tmp/bench-venv && /tmp/bench-venv/bin/pip install /work/main\n"
             "and run this script with /tmp/bench-venv/bin/python")

KiB = 1024
BLOCK = 4 * KiB
FULL_DATA_RUNS = 50_000     # -> 100,001 extents
QUICK_DATA_RUNS = 5_000     # -> 10,001 extents
LAYOUT_VERSION = 1          # bump when the layout algorithm changes


# --------------------------------------------------------------------------
# the test image

def layout(data_runs: int, seed: int):
    """(offset, length) of every data run, and the file size: hole, data,
    hole, ..., data, hole."""
    rng = random.Random(seed)
    runs = []
    pos = 0
    for _ in range(data_runs):
        pos += rng.randint(1, 256) * BLOCK          # hole 4 KiB .. 1 MiB
        length = rng.randint(1, 16) * BLOCK         # data 4 KiB .. 64 KiB
        runs.append((pos, length))
        pos += length
    pos += rng.randint(1, 256) * BLOCK              # trailing hole
    return runs, pos


def build_image(workdir: str, data_runs: int, seed: int, rebuild: bool) -> Dict:
    """Create (or reuse) the sparse image; returns a description of it."""
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, f"sparse-{data_runs}runs-seed{seed}.raw")
    meta_path = path + ".meta.json"
    runs, size = layout(data_runs, seed)
    meta = {"layout_version": LAYOUT_VERSION, "data_runs": data_runs, "seed": seed,
            "size": size, "data_bytes": sum(n for _, n in runs),
            "expected_extents": 2 * data_runs + 1}
    if not rebuild and os.path.exists(path) and os.path.exists(meta_path):
        try:
            with open(meta_path) as f:
                old = json.load(f)
            if old == meta and os.path.getsize(path) == size:
                return dict(meta, path=path, built=False, build_seconds=0.0)
        except (OSError, ValueError):
            pass
    t0 = time.perf_counter()
    tmp = f"{path}.{os.getpid()}.tmp"
    buf = bytes([0xA5]) * (16 * BLOCK)
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.ftruncate(fd, size)
        for off, length in runs:
            if os.pwrite(fd, buf[:length], off) != length:
                raise OSError(f"short write at {off}")
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    with open(f"{meta_path}.{os.getpid()}.tmp", "w") as f:
        json.dump(meta, f)
    os.replace(f"{meta_path}.{os.getpid()}.tmp", meta_path)
    return dict(meta, path=path, built=True, build_seconds=time.perf_counter() - t0)


def build_tiny(workdir: str) -> str:
    """A one-extent image: the baseline for start-up lseek calls."""
    path = os.path.join(workdir, "tiny-1extent.raw")
    if not os.path.exists(path) or os.path.getsize(path) != BLOCK:
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            f.write(bytes([0xA5]) * BLOCK)
        os.replace(tmp, path)
    return path


# --------------------------------------------------------------------------
# commands

def child_env() -> Dict[str, str]:
    """Make ``python -m imgcopy`` import the very package this script imported."""
    env = dict(os.environ)
    pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(imgcopy.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_parent, env.get("PYTHONPATH")) if p)
    return env


class Command:
    def __init__(self, key: str, label: str, run: Callable[[], None],
                 argv: Optional[List[str]] = None):
        self.key, self.label, self.run, self.argv = key, label, run, argv
        self.samples: List[float] = []

    def time_once(self) -> float:
        t0 = time.perf_counter()
        self.run()
        dt = time.perf_counter() - t0
        self.samples.append(dt)
        return dt


def subprocess_runner(argv: List[str], env: Dict[str, str], cwd: str) -> Callable[[], None]:
    def run() -> None:
        r = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           env=env, cwd=cwd)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({r.returncode}): "
                               f"{r.stderr.decode(errors='replace').strip()}")
    return run


def capture(argv: List[str], env: Dict[str, str], cwd: str) -> str:
    r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=cwd)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({r.returncode}): "
                           f"{r.stderr.decode(errors='replace').strip()}")
    return r.stdout.decode()


# --------------------------------------------------------------------------
# strace

_STRACE_HINT = "strace not found; install it with: apt-get install -y strace (lseek counts skipped)"


def strace_supports_seccomp(strace: str) -> bool:
    r = subprocess.run([strace, "--seccomp-bpf", "-f", "-c", "-o", os.devnull, "true"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return r.returncode == 0


def strace_lseeks(strace: str, seccomp: bool, argv: List[str], env: Dict[str, str],
                  cwd: str, out_path: str) -> int:
    """lseek calls made by ``argv`` and its threads/children."""
    cmd = [strace, "-f", "-c", "-e", "trace=lseek", "-o", out_path]
    if seccomp:
        cmd.insert(1, "--seccomp-bpf")
    r = subprocess.run(cmd + argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                       env=env, cwd=cwd)
    if r.returncode != 0:
        raise RuntimeError(f"strace {' '.join(argv)} failed ({r.returncode}): "
                           f"{r.stderr.decode(errors='replace').strip()}")
    with open(out_path) as f:
        return parse_strace_calls(f.read(), "lseek")


def parse_strace_calls(summary: str, syscall: str) -> int:
    """The "calls" column of ``strace -c`` for ``syscall`` (0 if absent).
    Rows: % time, seconds, usecs/call, calls, [errors], syscall."""
    header = None
    for line in summary.splitlines():
        tokens = line.split()
        if not tokens:
            continue
        if "calls" in tokens and "syscall" in tokens:
            header = tokens
            continue
        if tokens[-1] == syscall and header is not None:
            # "% time" is two header tokens but one value: shift by one
            idx = header.index("calls") - 1
            return int(tokens[idx])
    if header is None:
        raise RuntimeError(f"cannot parse strace summary:\n{summary}")
    return 0


# --------------------------------------------------------------------------
# library query orders

def query_orders(path: str, starts: List[int], forward_extents, seed: int) -> List[Dict]:
    orders = [("forward", list(starts)), ("backward", list(reversed(starts)))]
    shuffled = list(starts)
    random.Random(seed + 1).shuffle(shuffled)
    orders.append(("random", shuffled))
    by_start = {e.start: (e.length, e.data, e.zero) for e in forward_extents}
    results = []
    for name, order in orders:
        with imgcopy.open(path, "raw") as img:
            t0 = time.perf_counter()
            got = [img.block_status(s) for s in order]
            dt = time.perf_counter() - t0
            stats = img.cache_stats()
        mismatches = sum(1 for e in got if by_start.get(e.start) != (e.length, e.data, e.zero))
        results.append({"order": name, "queries": len(order), "seconds": dt,
                        "lseek_calls": stats.get("lseek_calls"), "cache_stats": stats,
                        "lseeks_per_extent": stats.get("lseek_calls", 0) / max(1, len(order)),
                        "mismatches_vs_forward_map": mismatches})
    return results


# --------------------------------------------------------------------------
# main

def fmt_s(x: float) -> str:
    return f"{x:.4f}"


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", default="/tmp/imgcopy-bench",
                    help="where the test image is built and cached (default %(default)s)")
    ap.add_argument("--runs", type=int, default=None,
                    help="timed runs of each command (default 7, --quick 3)")
    ap.add_argument("--quick", action="store_true",
                    help=f"~{2 * QUICK_DATA_RUNS // 1000}k extents and 3 runs (smoke test)")
    ap.add_argument("--data-runs", type=int, default=None,
                    help=f"data runs in the image (default {FULL_DATA_RUNS}, "
                         f"--quick {QUICK_DATA_RUNS}); extents = 2 * N + 1")
    ap.add_argument("--seed", type=int, default=1, help="layout seed (default %(default)s)")
    ap.add_argument("--rebuild", action="store_true", help="rebuild the cached image")
    ap.add_argument("--no-strace", action="store_true", help="skip the strace lseek counts")
    ap.add_argument("--qemu-img", default="qemu-img", help="qemu-img binary")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = ap.parse_args(argv)

    runs = args.runs if args.runs is not None else (3 if args.quick else 7)
    data_runs = args.data_runs if args.data_runs is not None else (
        QUICK_DATA_RUNS if args.quick else FULL_DATA_RUNS)
    if runs < 1 or data_runs < 1:
        ap.error("--runs and --data-runs must be positive")
    qemu_img = shutil.which(args.qemu_img)
    if qemu_img is None:
        print(f"bench_map: {args.qemu_img} not found (apt-get install -y qemu-utils)",
              file=sys.stderr)
        return 1

    workdir = os.path.abspath(args.workdir)
    env = child_env()
    ok = True
    results: Dict = {"benchmark": "map", "quick": args.quick, "runs": runs}

    # -- environment ------------------------------------------------------
    qemu_version = capture([qemu_img, "--version"], env, workdir if os.path.isdir(workdir)
                           else "/").splitlines()[0]
    results["environment"] = {
        "python": sys.version.split()[0], "python_executable": sys.executable,
        "imgcopy_version": getattr(imgcopy, "__version__", "?"),
        "imgcopy_path": os.path.dirname(os.path.abspath(imgcopy.__file__)),
        "qemu_img": qemu_img, "qemu_img_version": qemu_version,
        "platform": platform.platform(), "cpus": os.cpu_count(),
        "loadavg_before": os.getloadavg(),
    }
    print("== imgcopy map benchmark ==")
    print(f"imgcopy {results['environment']['imgcopy_version']} from "
          f"{results['environment']['imgcopy_path']}")
    print(f"python  {results['environment']['python']} ({sys.executable})")
    print(f"{qemu_version} ({qemu_img})")
    print(f"cpus {os.cpu_count()}, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print()

    # -- image ------------------------------------------------------------
    img_info = build_image(workdir, data_runs, args.seed, args.rebuild)
    path = img_info["path"]
    tiny = build_tiny(workdir)
    results["image"] = img_info
    how = (f"built in {img_info['build_seconds']:.1f} s" if img_info["built"]
           else "cached, reused")
    print(f"image   {path} ({how})")
    print(f"        virtual size {img_info['size']:,} bytes, data {img_info['data_bytes']:,} "
          f"bytes in {data_runs:,} runs, expected extents {img_info['expected_extents']:,}")

    qemu_argv = [qemu_img, "map", "-f", "raw", "--output=json", path]
    imgcopy_argv = [sys.executable, "-m", "imgcopy", "map", "-f", "raw", "--output=json", path]

    # -- warm-up (untimed) + output check + extent count ------------------
    qemu_out = capture(qemu_argv, env, workdir)
    imgcopy_out = capture(imgcopy_argv, env, workdir)
    lib_out = imgcopy.map(path, "raw").to_json()
    extents = qemu_out.count("\n")          # == qemu-img map ... | wc -l
    results["extents"] = {"qemu_img_wc_l": extents, "expected": img_info["expected_extents"],
                          "imgcopy_cli_lines": imgcopy_out.count("\n"),
                          "library_len": len(imgcopy.map(path, "raw"))}
    print(f"extents qemu-img map -f raw --output=json FILE | wc -l  ->  {extents:,}"
          + ("" if extents == img_info["expected_extents"]
             else f"   (NOTE: layout predicts {img_info['expected_extents']:,})"))
    same_cli, same_lib = imgcopy_out == qemu_out, lib_out == qemu_out
    results["outputs_identical"] = {"cli": same_cli, "library": same_lib}
    print(f"output  imgcopy CLI JSON == qemu-img JSON: {'yes' if same_cli else 'NO'}; "
          f"library to_json() == qemu-img JSON: {'yes' if same_lib else 'NO'}")
    if not (same_cli and same_lib):
        ok = False
        print("        WARNING: outputs differ; the timings below compare different work")
    print()

    # -- timed runs, alternating -------------------------------------------
    def run_library() -> None:
        imgcopy.map(path, "raw").to_json()

    commands = [
        Command("qemu-img", "qemu-img map -f raw --output=json FILE",
                subprocess_runner(qemu_argv, env, workdir), qemu_argv),
        Command("imgcopy-cli", "python -m imgcopy map -f raw --output=json FILE",
                subprocess_runner(imgcopy_argv, env, workdir), imgcopy_argv),
        Command("imgcopy-library", "library, in-process: imgcopy.map(FILE).to_json()",
                run_library),
        # fixed costs (process start-up, imports, opening): the same commands on a
        # one-extent file
        Command("qemu-img-startup", "start-up: qemu-img map, 1-extent file",
                subprocess_runner(qemu_argv[:-1] + [tiny], env, workdir)),
        Command("imgcopy-cli-startup", "start-up: python -m imgcopy map, 1-extent file",
                subprocess_runner(imgcopy_argv[:-1] + [tiny], env, workdir)),
    ]
    for c in commands:              # warm-up, untimed (outputs already checked above)
        c.run()
    for _ in range(runs):
        for c in commands:
            c.time_once()
    qemu_median = statistics.median(commands[0].samples)
    rows = []
    for c in commands:
        med = statistics.median(c.samples)
        rows.append({"key": c.key, "command": c.label, "median": med, "min": min(c.samples),
                     "max": max(c.samples), "ratio_vs_qemu": qemu_median / med if med else None,
                     "samples": c.samples})
    results["timings"] = rows
    w = max(len(r["command"]) for r in rows)
    print(f"timings: {runs} runs each, alternated, after one untimed warm-up; stdout to "
          f"/dev/null; ratio = qemu-img median / median (>1: faster than qemu-img)")
    print(f"  {'command':<{w}}  {'median s':>9}  {'min s':>9}  {'max s':>9}  {'ratio':>7}")
    for i, r in enumerate(rows):
        if i in (2, 3):
            print(f"  {'-' * w}")
        ratio = f"{r['ratio_vs_qemu']:>6.2f}x" if i < 3 else f"{'':>7}"
        print(f"  {r['command']:<{w}}  {fmt_s(r['median']):>9}  {fmt_s(r['min']):>9}  "
              f"{fmt_s(r['max']):>9}  {ratio}")
    by_key = {r["key"]: r for r in rows}
    qemu_net = by_key["qemu-img"]["median"] - by_key["qemu-img-startup"]["median"]
    cli_net = by_key["imgcopy-cli"]["median"] - by_key["imgcopy-cli-startup"]["median"]
    results["net_of_startup"] = {"qemu-img": qemu_net, "imgcopy-cli": cli_net,
                                 "ratio_vs_qemu": qemu_net / cli_net if cli_net > 0 else None}
    net_ratio = f"{qemu_net / cli_net:.2f}x" if cli_net > 0 else "n/a"
    print(f"  net of start-up (median - 1-extent median): qemu-img {fmt_s(qemu_net)} s, "
          f"imgcopy CLI {fmt_s(cli_net)} s, ratio {net_ratio}")
    print()

    # -- lseek counts ------------------------------------------------------
    lseek: Dict = {"extents": extents}
    strace = None if args.no_strace else shutil.which("strace")
    if args.no_strace:
        print("lseek counts under strace: skipped (--no-strace)")
        lseek["strace"] = None
    elif strace is None:
        print(_STRACE_HINT)
        lseek["strace"] = None
    else:
        seccomp = strace_supports_seccomp(strace)
        out_path = os.path.join(workdir, f"strace.{os.getpid()}.out")
        try:
            counts = {}
            for key, big_argv in (("qemu-img", qemu_argv), ("imgcopy-cli", imgcopy_argv)):
                total = strace_lseeks(strace, seccomp, big_argv, env, workdir, out_path)
                base = strace_lseeks(strace, seccomp, big_argv[:-1] + [tiny], env, workdir,
                                     out_path)
                counts[key] = {"total": total, "baseline_1_extent": base, "net": total - base,
                               "net_per_extent": (total - base) / max(1, extents)}
            lseek["strace"] = counts
        except (RuntimeError, OSError) as exc:
            print(f"lseek counts under strace: skipped ({exc})")
            lseek["strace"] = None
        finally:
            if os.path.exists(out_path):
                os.unlink(out_path)
    with imgcopy.open(path, "raw") as img:
        t0 = time.perf_counter()
        fwd = img.extents()
        dt = time.perf_counter() - t0
        stats = img.cache_stats()
    lseek["library_extents"] = {"lseek_calls": stats.get("lseek_calls"), "seconds": dt,
                                "cache_stats": stats,
                                "per_extent": stats.get("lseek_calls", 0) / max(1, extents)}
    results["lseek"] = lseek

    print(f"lseek calls for {extents:,} extents")
    print(f"  {'who':<44}  {'lseeks':>9}  {'per extent':>10}")
    if lseek.get("strace"):
        for key, label in (("qemu-img", "qemu-img map (strace -f -c)"),
                           ("imgcopy-cli", "python -m imgcopy map (strace -f -c)")):
            c = lseek["strace"][key]
            print(f"  {label:<44}  {c['net']:>9,}  {c['net_per_extent']:>10.3f}"
                  f"   (total {c['total']:,} - start-up baseline {c['baseline_1_extent']:,})")
    le = lseek["library_extents"]
    print(f"  {'library: img.extents(), cache_stats()':<44}  {le['lseek_calls']:>9,}  "
          f"{le['per_extent']:>10.3f}   ({fmt_s(le['seconds'])} s, stats {stats})")
    print()

    # -- query orders (library) ---------------------------------------------
    starts = [e.start for e in fwd]
    orders = query_orders(path, starts, fwd, args.seed)
    results["query_orders"] = orders
    print(f"library: img.block_status(start) for each of the {len(starts):,} extent starts, "
          f"fresh image per order")
    print(f"  {'order':<9}  {'seconds':>9}  {'lseeks':>9}  {'per extent':>10}  "
          f"{'misses':>7}  {'hits':>9}  {'wrong':>6}")
    for o in orders:
        s = o["cache_stats"]
        print(f"  {o['order']:<9}  {fmt_s(o['seconds']):>9}  {o['lseek_calls']:>9,}  "
              f"{o['lseeks_per_extent']:>10.3f}  {s.get('misses', '?'):>7}  "
              f"{s.get('hits', '?'):>9}  {o['mismatches_vs_forward_map']:>6}")
        if o["mismatches_vs_forward_map"]:
            ok = False
    print()

    # -- notes ---------------------------------------------------------------
    notes = []
    for r in rows[1:3]:
        if r["ratio_vs_qemu"] is not None and r["ratio_vs_qemu"] < 1:
            notes.append(f"{r['command']} is slower than qemu-img "
                         f"(median {fmt_s(r['median'])} s vs {fmt_s(qemu_median)} s)")
    per_ext = [("library img.extents()", le["per_extent"])]
    per_ext += [(f"library {o['order']} block_status", o["lseeks_per_extent"]) for o in orders]
    if lseek.get("strace"):
        per_ext.append(("imgcopy CLI", lseek["strace"]["imgcopy-cli"]["net_per_extent"]))
    for who, n in per_ext:
        if n > 2:
            notes.append(f"{who}: {n:.2f} lseeks per extent (> 2)")
    if any(o["mismatches_vs_forward_map"] for o in orders):
        notes.append("block_status answers differ from the forward map (see 'wrong')")
    results["notes"] = notes
    results["ok"] = ok
    results["environment"]["loadavg_after"] = os.getloadavg()
    for n in notes:
        print(f"NOTE: {n}")
    print(f"result: {'OK' if ok else 'FAILED'}")

    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
            f.write("\n")
        print(f"JSON written to {args.json}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
