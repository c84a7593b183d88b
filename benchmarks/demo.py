#!/usr/bin/env python3
"""`make demo`: imgcopy's main job on a generated OS-like image, beside
`qemu-img convert`, with every copy checked by `qemu-img compare`.

    demo.py OUTDIR [--scale S]

For raw -> raw and raw -> qcow2 it copies the sample image with imgcopy
(progress bar shown) and with qemu-img convert, and prints for each: the
time of `command && sync`, the write and zero requests that reached the
destination file (counted by strace the same way for both tools; imgcopy's
own counters beside them), the extents of the output (`qemu-img map`), its
allocated size, and the verdicts of `qemu-img compare` (and `qemu-img
check` for qcow2).  One run each on a small image: a demonstration, not a
benchmark (benchmarks/ measure medians of alternating runs)."""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from typing import Dict, List, NamedTuple, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
SAMPLE = "sparse-6g.raw"
MiB = 1 << 20

# system calls that write or zero a file's range
WRITES = ("pwrite64", "pwritev", "pwritev2", "write", "writev", "copy_file_range")
ZEROES = ("fallocate",)
_CALL = re.compile(r"^(?:\d+\s+)?(\w+)\((\d+)<([^>]*)>")


class Run(NamedTuple):
    seconds: float
    writes: int
    zeroes: int
    extents: int
    allocated: int
    counters: Optional[Dict[str, int]]  # imgcopy's own report


def run_timed(cmd: List[str], show_stderr: bool = False) -> tuple:
    """Run `cmd && sync`; (seconds, stdout)."""
    t0 = time.monotonic()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE,
                          stderr=None if show_stderr else subprocess.PIPE, text=True)
    if proc.returncode != 0:
        sys.exit(f"demo: {' '.join(cmd)} failed:\n{proc.stderr or ''}")
    os.sync()
    return time.monotonic() - t0, proc.stdout


def count_requests(cmd: List[str], dest: str, workdir: str) -> tuple:
    """(writes, zeroes) that `cmd` makes to files named like `dest`
    (imgcopy writes a temporary file beside it, renamed at the end)."""
    log = os.path.join(workdir, "strace.log")
    trace = ["strace", "-f", "-qq", "-y", "-o", log, "-e", "trace=" + ",".join(WRITES + ZEROES)]
    proc = subprocess.run(trace + cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True)
    if proc.returncode != 0:
        sys.exit(f"demo: strace {' '.join(cmd)} failed:\n{proc.stderr}")
    base = os.path.basename(dest)
    writes = zeroes = 0
    with open(log) as f:
        for line in f:
            m = _CALL.match(line)
            if not m or base not in os.path.basename(m.group(3)):
                continue
            if m.group(1) in ZEROES:
                zeroes += 1
            else:
                writes += 1
    os.unlink(log)
    return writes, zeroes


def output_facts(path: str, fmt: str) -> tuple:
    out = subprocess.run(["qemu-img", "map", "-f", fmt, "--output=json", path],
                         capture_output=True, text=True, check=True).stdout
    return len(json.loads(out)), os.stat(path).st_blocks * 512


def verdicts(src: str, dst: str, fmt: str) -> List[str]:
    said = []
    cmp = subprocess.run(["qemu-img", "compare", "-f", "raw", "-F", fmt, src, dst],
                         capture_output=True, text=True)
    said.append(f"qemu-img compare: {(cmp.stdout + cmp.stderr).strip()} (exit {cmp.returncode})")
    ok = cmp.returncode == 0
    if fmt == "qcow2":
        chk = subprocess.run(["qemu-img", "check", "-f", "qcow2", dst], capture_output=True,
                             text=True)
        said.append("qemu-img check: " + (chk.stdout.strip().splitlines() or ["?"])[0] +
                    f" (exit {chk.returncode})")
        ok = ok and chk.returncode == 0
    if not ok:
        said.append("MISMATCH")
    return said


def copy_with(tool: str, src: str, dst: str, fmt: str, workdir: str) -> Run:
    if tool == "imgcopy":
        cmd = [sys.executable, "-m", "imgcopy", "convert", "-p", "-O", fmt, "--stats", "json",
               src, dst]
    else:
        cmd = ["qemu-img", "convert", "-f", "raw", "-O", fmt, src, dst]
    seconds, out = run_timed(cmd, show_stderr=tool == "imgcopy")
    counters = json.loads(out) if tool == "imgcopy" else None
    extents, allocated = output_facts(dst, fmt)
    scratch = os.path.join(workdir, "counted." + fmt)
    quiet = [c for c in cmd if c != "-p"]
    writes, zeroes = count_requests(quiet[:-1] + [scratch], scratch, workdir)
    os.unlink(scratch)
    return Run(seconds, writes, zeroes, extents, allocated, counters)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir")
    ap.add_argument("--scale", type=float, default=0.0625)
    args = ap.parse_args()
    for tool in ("qemu-img", "strace"):
        if shutil.which(tool) is None:
            sys.exit(f"demo: {tool} is missing (make demo installs it)")
    os.makedirs(args.outdir, exist_ok=True)
    subprocess.run([sys.executable, os.path.join(HERE, "make_corpus.py"), args.outdir,
                    "--scale", str(args.scale), "--only", SAMPLE], check=True)
    src = os.path.join(args.outdir, SAMPLE)
    src_extents, src_allocated = output_facts(src, "raw")
    print(f"\n{SAMPLE}: {os.path.getsize(src) / MiB:.0f} MiB virtual, "
          f"{src_allocated / MiB:.1f} MiB allocated, {src_extents} extents (qemu-img map)")

    failed = False
    for fmt in ("raw", "qcow2"):
        print(f"\n== raw -> {fmt} ==")
        runs = {}
        for tool in ("imgcopy", "qemu-img"):
            dst = os.path.join(args.outdir, f"copy-{tool}.{fmt}")
            runs[tool] = copy_with(tool, src, dst, fmt, args.outdir)
            said = verdicts(src, dst, fmt)
            failed |= said[-1] == "MISMATCH"
            print(f"  {tool}: " + "; ".join(said))
        print(f"  {'':18}{'time':>9}{'writes':>9}{'falloc':>9}{'extents':>9}{'allocated':>12}")
        for tool, r in runs.items():
            name = tool if tool == "imgcopy" else "qemu-img convert"
            print(f"  {name:18}{r.seconds:8.2f}s{r.writes:9d}{r.zeroes:9d}{r.extents:9d}"
                  f"{r.allocated / MiB:9.1f} MiB")
        c = runs["imgcopy"].counters or {}
        print(f"  imgcopy's own counters: {c.get('write_requests')} writes, "
              f"{c.get('zero_requests')} zeroes, {c.get('bytes_written', 0) / MiB:.1f} MiB "
              f"written, {c.get('bytes_skipped', 0) / MiB:.1f} MiB skipped, "
              f"{c.get('extents')} source extents")
        if fmt == "qcow2":
            print("  (qcow2 writes include metadata: L1/L2 tables, refcounts, header)")
    print("\nstrace counted the write and fallocate calls each tool made to its output file "
          "(fallocate\nzeroes or punches ranges of a raw output, and gives a qcow2 output's new "
          "clusters disk\nspace); times are one run of `command && sync` each.")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
