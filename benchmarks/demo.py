#!/usr/bin/env python3
"""`make demo`: imgcopy's main job on a generated OS-like image, beside
`qemu-img convert`, with every copy checked by `qemu-img compare`.

    demo.py OUTDIR [--scale S] [--rounds N]

For raw -> raw and raw -> qcow2 it copies the sample image three ways:
``imgcopy.convert()`` called in this process (what a Python pipeline that
imports imgcopy sees: no interpreter to start), ``qemu-img convert`` as a
process, and the ``imgcopy convert`` command (a Python interpreter starting
first: its time is on a line of its own).  Each time is of `copy && sync`,
the median of N rounds (3) that take turns, on an image large enough (1/4
of the 6 GiB corpus image by default) that the copy is what is measured,
not a process starting.  For each it prints the write and zero requests
that reached the destination file (counted by strace the same way for both
tools; imgcopy's own counters beside them), the extents of the output
(`qemu-img map`), its allocated size, and the verdicts of `qemu-img
compare` (and `qemu-img check` for qcow2) on every copy.  A demonstration:
benchmarks/ measure more runs and more images."""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # the checkout's imgcopy, as `make demo` built it
import imgcopy  # noqa: E402

SAMPLE = "sparse-6g.raw"
MiB = 1 << 20
LIBRARY, QEMU, COMMAND = "imgcopy.convert()", "qemu-img convert", "imgcopy convert"

# system calls that write or zero a file's range
WRITES = ("pwrite64", "pwritev", "pwritev2", "write", "writev", "copy_file_range")
ZEROES = ("fallocate",)
_CALL = re.compile(r"^(?:\d+\s+)?(\w+)\((\d+)<([^>]*)>")


class Run(NamedTuple):
    seconds: float  # median of the rounds
    times: List[float]
    writes: int
    zeroes: int
    extents: int
    allocated: int


def command_line() -> List[str]:
    """The imgcopy command next to this interpreter, else python -m imgcopy."""
    script = os.path.join(os.path.dirname(sys.executable), "imgcopy")
    return [script] if os.access(script, os.X_OK) else [sys.executable, "-m", "imgcopy"]


def run(cmd: List[str]) -> None:
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        sys.exit(f"demo: {' '.join(cmd)} failed:\n{proc.stdout}{proc.stderr}")


def durable(path: str) -> None:
    """fsync the file and its directory: what `sync` would do for it alone
    (a whole-system sync would also wait for other processes' writes)."""
    for p, flags in ((path, os.O_RDONLY), (os.path.dirname(path) or ".", os.O_DIRECTORY)):
        fd = os.open(p, flags)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def timed(copy: Callable[[str], Any], dst: str) -> Tuple[float, Any]:
    """(seconds of `copy && sync` into a fresh dst, what copy returned)."""
    if os.path.exists(dst):
        os.unlink(dst)
        durable(os.path.dirname(dst) or ".")
    t0 = time.monotonic()
    got = copy(dst)
    durable(dst)
    return time.monotonic() - t0, got


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


def copiers(src: str, fmt: str) -> Dict[str, Callable[[str], Any]]:
    return {
        LIBRARY: lambda dst: imgcopy.convert(src, dst, src_format="raw", dst_format=fmt),
        QEMU: lambda dst: run(["qemu-img", "convert", "-f", "raw", "-O", fmt, src, dst]),
        COMMAND: lambda dst: run(command_line() + ["convert", "-f", "raw", "-O", fmt, src, dst]),
    }


def turns(tools: List[str], rounds: int) -> List[List[str]]:
    """The order of each round: every tool once, each round starting with
    the next tool (so none always runs first, on the coldest caches)."""
    return [tools[r % len(tools):] + tools[:r % len(tools)] for r in range(rounds)]


def demo_format(src: str, fmt: str, outdir: str, rounds: int) -> bool:
    """One format's copies, table and verdicts; False on a mismatch."""
    print(f"\n== raw -> {fmt} ==")
    copy = copiers(src, fmt)
    names = {LIBRARY: "imgcopy", QEMU: "qemu-img", COMMAND: "imgcopy-command"}
    dsts = {tool: os.path.join(outdir, f"copy-{names[tool]}.{fmt}") for tool in copy}
    times: Dict[str, List[float]] = {tool: [] for tool in copy}
    result: Optional[imgcopy.CopyResult] = None  # the library's: imgcopy's own counters
    for tools in turns(list(copy), rounds):
        for tool in tools:
            seconds, got = timed(copy[tool], dsts[tool])
            times[tool].append(seconds)
            result = got if tool == LIBRARY else result
    if result is None:
        sys.exit("demo: --rounds must be at least 1")
    ok = True
    for tool in copy:
        said = verdicts(src, dsts[tool], fmt)
        ok &= said[-1] != "MISMATCH"
        print(f"  {tool + ':':18} " + "; ".join(said))
    runs = {}
    for tool in (LIBRARY, QEMU):
        extents, allocated = output_facts(dsts[tool], fmt)
        scratch = os.path.join(outdir, "counted." + fmt)
        cmd = (command_line() + ["convert"] if tool == LIBRARY else ["qemu-img", "convert"]) + \
            ["-f", "raw", "-O", fmt, src, scratch]
        writes, zeroes = count_requests(cmd, scratch, outdir)
        os.unlink(scratch)
        runs[tool] = Run(statistics.median(times[tool]), times[tool], writes, zeroes, extents,
                         allocated)
    print(f"  {'':18}{'time':>9}{'writes':>9}{'falloc':>9}{'extents':>9}{'allocated':>12}")
    for tool, r in runs.items():
        print(f"  {tool:18}{r.seconds:8.2f}s{r.writes:9d}{r.zeroes:9d}{r.extents:9d}"
              f"{r.allocated / MiB:9.1f} MiB   ({_times(r.times)})")
    cli = times[COMMAND]
    print(f"  {COMMAND:18}{statistics.median(cli):8.2f}s   the command: a Python interpreter "
          f"starts first   ({_times(cli)})")
    print(f"  imgcopy's own counters: {result.write_requests} writes, "
          f"{result.zero_requests} zeroes, {result.bytes_written / MiB:.1f} MiB "
          f"written, {result.bytes_skipped / MiB:.1f} MiB skipped, "
          f"{result.extents} source extents")
    if fmt == "qcow2":
        print("  (qcow2 writes include metadata: L1/L2 tables, refcounts, header)")
    return ok


def _times(times: List[float]) -> str:
    return ", ".join(f"{t:.2f}" for t in times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir")
    ap.add_argument("--scale", type=float, default=0.25)
    ap.add_argument("--rounds", type=int, default=3)
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
        failed |= not demo_format(src, fmt, args.outdir, args.rounds)
    rounds = f"{args.rounds} round{'s' if args.rounds != 1 else ''}"
    print(f"\nTimes are of `copy && sync`: the median of {rounds} in which the "
          "three take turns\n(each round's in brackets). imgcopy.convert() runs in this "
          "process, as in a pipeline that\nimports imgcopy; the command adds a Python "
          "interpreter's start. strace counted the\nwrite and fallocate calls each tool made "
          "to its output file (fallocate zeroes or\npunches ranges of a raw output, and gives "
          "a qcow2 output's new clusters disk space).")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
