#!/usr/bin/env python3
"""Verification tools against the usual ways of checking an image.

Checksum section: ``imgcopy checksum`` (blkhash, sha256, 64 KiB blocks)
against ``sha256sum`` and against Python's hashlib reading the file (1 MiB
reads, one sha256 over everything), on the corpus's sparse-6g.raw (6 GiB
virtual, ~1.2 GiB data: the extent map makes the holes free) and
full-1g.raw (1 GiB of random data: pure hashing throughput).  The values
differ by design (blkhash is not a plain sha256 of the bytes); what is
compared is the time to get a checksum of the image.

Method: warm page cache (one untimed run of every command first), then
``--runs`` rounds alternating A B C D A B C D ..., median / min / max per
command and the ratio median / sha256sum's median (< 1: faster than
sha256sum).  Commands:
    A  python -m imgcopy checksum FILE          (the CLI, interpreter start included)
    B  sha256sum FILE
    C  python -c "hashlib.sha256 over FILE"     (interpreter start included)
    D  imgcopy.checksum(FILE)                   (in-process library call)
``--check``: also computes the blkhash of each image with a plain hashlib
reference (reading every byte) and checks imgcopy's value against it.

The images come from benchmarks/make_corpus.py (built into ``--corpus``
when missing).  ``--json FILE`` writes the results.

Usage: bench_verify.py [--corpus DIR] [--runs N] [--check] [--json FILE]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Callable, Dict, List

try:
    import imgcopy
except ImportError as exc:  # pragma: no cover - depends on the environment
    sys.exit(f"bench_verify: cannot import imgcopy ({exc}); install it first")

HERE = os.path.dirname(os.path.abspath(__file__))
IMAGES = ["sparse-6g.raw", "full-1g.raw"]
HASHLIB_READ = ("import hashlib, sys\n"
                "h = hashlib.sha256()\n"
                "with open(sys.argv[1], 'rb') as f:\n"
                "    for chunk in iter(lambda: f.read(1 << 20), b''):\n"
                "        h.update(chunk)\n"
                "print(h.hexdigest())\n")


def ensure_corpus(corpus: str) -> None:
    missing = [name for name in IMAGES if not os.path.exists(os.path.join(corpus, name))]
    if missing:
        subprocess.run([sys.executable, os.path.join(HERE, "make_corpus.py"), corpus,
                        "--only", ",".join(missing)], check=True)


def run_command(argv: List[str]) -> Callable[[], str]:
    def go() -> str:
        p = subprocess.run(argv, capture_output=True, text=True)
        if p.returncode != 0:
            raise SystemExit(f"bench_verify: {' '.join(argv)} failed: {p.stderr.strip()}")
        return p.stdout.split()[0] if p.stdout.strip() else ""
    return go


def reference_blkhash(path: str, block: int = 65536) -> str:
    """The construction read straight from the file, every byte."""
    outer = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(block), b""):
            outer.update(hashlib.sha256(chunk).digest())
            size += len(chunk)
    outer.update(size.to_bytes(8, "little"))
    return outer.hexdigest()


def timed(commands: Dict[str, Callable[[], str]], runs: int) -> Dict[str, Dict]:
    outputs = {name: cmd() for name, cmd in commands.items()}  # warm-up, untimed
    times: Dict[str, List[float]] = {name: [] for name in commands}
    for _ in range(runs):
        for name, cmd in commands.items():
            t0 = time.perf_counter()
            cmd()
            times[name].append(time.perf_counter() - t0)
    return {name: {"median": statistics.median(t), "min": min(t), "max": max(t),
                   "runs": t, "output": outputs[name]} for name, t in times.items()}


def checksum_section(corpus: str, runs: int, check: bool) -> Dict[str, Dict]:
    results: Dict[str, Dict] = {}
    for name in IMAGES:
        path = os.path.join(corpus, name)
        commands = {
            "imgcopy checksum": run_command([sys.executable, "-m", "imgcopy", "checksum",
                                             path]),
            "sha256sum": run_command(["sha256sum", path]),
            "python hashlib": run_command([sys.executable, "-c", HASHLIB_READ, path]),
            "imgcopy.checksum()": lambda path=path: imgcopy.checksum(path),
        }
        r = timed(commands, runs)
        base = r["sha256sum"]["median"]
        print(f"\n{name} ({os.path.getsize(path) / 2**30:.2f} GiB virtual, "
              f"{os.stat(path).st_blocks * 512 / 2**30:.2f} GiB allocated), {runs} runs, "
              "warm cache")
        print(f"  {'command':<22} {'median':>8} {'min':>8} {'max':>8}  vs sha256sum")
        for cmd, t in r.items():
            print(f"  {cmd:<22} {t['median']:8.3f} {t['min']:8.3f} {t['max']:8.3f}  "
                  f"{t['median'] / base:6.2f}x")
        if r["imgcopy checksum"]["output"] != r["imgcopy.checksum()"]["output"]:
            raise SystemExit("bench_verify: the CLI and the library disagree")
        entry = {"commands": r, "ratio_cli_vs_sha256sum": r["imgcopy checksum"]["median"] / base}
        if check:
            want = reference_blkhash(path)
            entry["reference_ok"] = want == r["imgcopy.checksum()"]["output"]
            print(f"  hashlib blkhash reference: {'OK' if entry['reference_ok'] else 'MISMATCH'}")
            if not entry["reference_ok"]:
                raise SystemExit("bench_verify: imgcopy's blkhash differs from the reference")
        results[name] = entry
    return results


# ---- compare section ------------------------------------------------------
# >>> the compare helper's section goes here (imgcopy compare against
# >>> qemu-img compare); the lead merges it, and main() calls it below.
# ----------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default=os.path.join(HERE, "..", ".corpus", "full"),
                    help="directory of make_corpus.py's images (built when missing)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--check", action="store_true",
                    help="check imgcopy's checksum against a plain hashlib blkhash")
    ap.add_argument("--json", default=None, metavar="FILE")
    args = ap.parse_args()
    ensure_corpus(args.corpus)
    print(f"bench_verify: {platform.node()}, {os.cpu_count()} CPUs, "
          f"imgcopy {imgcopy.__version__}")
    out = {"checksum": checksum_section(args.corpus, args.runs, args.check)}
    # compare section: out["compare"] = compare_section(args.corpus, args.runs)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
