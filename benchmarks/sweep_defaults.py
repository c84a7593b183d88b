#!/usr/bin/env python3
"""Sweep imgcopy convert's concurrency and request size on corpus images,
to choose the defaults (imgcopy/convert.py).  Each configuration is timed
as `convert && sync` (flush included), cold source, alternating the
configurations round-robin; medians are printed.

  sweep_defaults.py [--corpus DIR] [--scale S] [--runs N] [--images a,b]
"""
import argparse
import itertools
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_convert import evict  # noqa: E402  (same directory)


def timed_copy(src, dst, concurrency, request_size):
    if os.path.exists(dst):
        os.unlink(dst)
    evict(src)
    cmd = [sys.executable, "-m", "imgcopy", "convert", "-m", str(concurrency),
           "--request-size", str(request_size), src, dst]
    t0 = time.monotonic()
    subprocess.run(cmd, check=True)
    subprocess.run(["sync"], check=True)
    return time.monotonic() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default="/tmp/imgcopy-corpus")
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--images", default="sparse-6g.raw,random-third.raw")
    ap.add_argument("--concurrency", default="1,2,4,8,16")
    ap.add_argument("--request-sizes", default="262144,1048576,2097152,4194304,8388608")
    a = ap.parse_args()
    images = a.images.split(",")
    subprocess.run([sys.executable, os.path.join(HERE, "make_corpus.py"), a.corpus,
                    "--scale", str(a.scale), "--only", ",".join(images)], check=True)
    configs = list(itertools.product([int(x) for x in a.concurrency.split(",")],
                                     [int(x) for x in a.request_sizes.split(",")]))
    dst = os.path.join(a.corpus, "sweep-out.raw")
    for image in images:
        src = os.path.join(a.corpus, image)
        times = {c: [] for c in configs}
        for _ in range(a.runs):
            for c in configs:
                times[c].append(timed_copy(src, dst, *c))
        os.unlink(dst)
        print(f"\n{image}: median seconds of `convert && sync`, cold source, {a.runs} runs")
        sizes = sorted({r for _, r in configs})
        print("threads " + "".join(f"{r // 1024:>9}k" for r in sizes))
        for n in sorted({c for c, _ in configs}):
            row = "".join(f"{statistics.median(times[(n, r)]):>10.3f}" for r in sizes)
            print(f"{n:>7} {row}")


if __name__ == "__main__":
    main()
