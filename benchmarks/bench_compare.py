#!/usr/bin/env python3
"""Side-by-side benchmark: ``imgcopy compare`` against ``qemu-img compare``.

Pairs (the corpus of benchmarks/make_corpus.py, built or reused in
``--corpus``):

* sparse-6g.raw vs sparse-6g.qcow2 (its qemu-img conversion): 6 GiB
  virtual, ~1.2 GiB data, holes;
* full-1g.raw vs a copy of it (``cp``): 1 GiB, all data.

Warm cache: every file is read once first, and each command runs once
untimed.  Then the commands alternate (qemu-img, imgcopy CLI, imgcopy
library, qemu-img, ...) ``--runs`` times; medians, min and max are printed
with the ratio imgcopy / qemu-img (< 1: imgcopy is faster).  The outputs of
qemu-img and imgcopy must be identical (exit code and text), else exit 1.

  python benchmarks/bench_compare.py [--corpus DIR] [--scale S] [--runs N]
                                     [--threads N] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from typing import Dict, List, Tuple

try:
    import imgcopy
except ImportError as exc:  # pragma: no cover - depends on the environment
    sys.exit(f"bench_compare: cannot import imgcopy ({exc}); install it first")

HERE = os.path.dirname(os.path.abspath(__file__))


def corpus_script() -> str:
    for p in (os.path.join(HERE, "make_corpus.py"), "/work/shared/corpus/make_corpus.py"):
        if os.path.exists(p):
            return p
    sys.exit("bench_compare: make_corpus.py not found")


def build_corpus(corpus: str, scale: float) -> None:
    os.makedirs(corpus, exist_ok=True)
    subprocess.run([sys.executable, corpus_script(), corpus, "--scale", str(scale),
                    "--only", "sparse-6g.raw,sparse-6g.qcow2,full-1g.raw"], check=True)
    full, copy = os.path.join(corpus, "full-1g.raw"), os.path.join(corpus, "full-1g-copy.raw")
    if not os.path.exists(copy) or os.path.getsize(copy) != os.path.getsize(full):
        shutil.copyfile(full, copy + ".tmp")
        os.rename(copy + ".tmp", copy)


def warm(path: str) -> None:
    """Read the allocated data once, so that every run finds it cached."""
    with imgcopy.open(path) as img:
        for e in img.extents():
            if e.data:
                off = e.start
                while off < e.start + e.length:
                    n = min(8 << 20, e.start + e.length - off)
                    img.read(off, n)
                    off += n


def timed(fn) -> Tuple[float, object]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def run_cmd(argv: List[str]) -> Tuple[int, str]:
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return p.returncode, p.stdout.replace("imgcopy:", "qemu-img:")


def bench_pair(a: str, b: str, runs: int, threads: int) -> Dict:
    qemu = ["qemu-img", "compare", a, b]
    cli = [sys.executable, "-m", "imgcopy", "compare", "-m", str(threads), a, b]

    def lib():
        r = imgcopy.compare(a, b, concurrency=threads)
        return (0 if r else 1), "".join(line + "\n" for line in r.lines)

    for path in (a, b):
        warm(path)
    cases = {"qemu-img": lambda: run_cmd(qemu), "imgcopy CLI": lambda: run_cmd(cli),
             "imgcopy library": lib}
    outputs = {name: fn() for name, fn in cases.items()}   # untimed warm-up
    times: Dict[str, List[float]] = {name: [] for name in cases}
    for _ in range(runs):
        for name, fn in cases.items():
            t, out = timed(fn)
            times[name].append(t)
            if out != outputs[name]:
                outputs[name + " (changed)"] = out
    res = imgcopy.compare(a, b, concurrency=threads)
    summary = {name: {"median": statistics.median(ts), "min": min(ts), "max": max(ts)}
               for name, ts in times.items()}
    return {"a": a, "b": b, "outputs": outputs, "times": summary,
            "bytes_read": res.bytes_read,
            "agree": len({json.dumps(o) for o in outputs.values()}) == 1}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default=None,
                    help="corpus directory (default /tmp/imgcopy-corpus, or -s<S> at scale S)")
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args()
    corpus = args.corpus or ("/tmp/imgcopy-corpus" if args.scale == 1
                             else f"/tmp/imgcopy-corpus-s{args.scale:g}")
    build_corpus(corpus, args.scale)
    pairs = [("sparse-6g.raw", "sparse-6g.qcow2"), ("full-1g.raw", "full-1g-copy.raw")]
    results = []
    ok = True
    print(f"# {platform.node()} {os.cpu_count()} CPUs, {args.runs} runs, "
          f"{args.threads} threads, medians (min..max) in seconds")
    for a, b in pairs:
        r = bench_pair(os.path.join(corpus, a), os.path.join(corpus, b), args.runs,
                       args.threads)
        results.append(r)
        ok &= r["agree"]
        q = r["times"]["qemu-img"]["median"]
        print(f"{a} vs {b}: {r['outputs']['qemu-img'][1].strip()!r} "
              f"(imgcopy read {r['bytes_read'] / 2**20:.0f} MiB)"
              f"{'' if r['agree'] else '  OUTPUTS DIFFER: ' + repr(r['outputs'])}")
        for name, t in r["times"].items():
            print(f"  {name:16s} {t['median']:7.3f}  ({t['min']:.3f}..{t['max']:.3f})"
                  f"  x{t['median'] / q:.2f} of qemu-img")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"scale": args.scale, "runs": args.runs, "threads": args.threads,
                       "pairs": results}, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
