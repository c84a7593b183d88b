#!/usr/bin/env python3
"""What starting imgcopy costs: ``import imgcopy``, ``imgcopy --version`` and
each command on a tiny image (so the start, not the work, is what is timed),
against the bare interpreter (``python -c pass``), medians of many runs.

    .venv/bin/python benchmarks/bench_startup.py                 # 40 rounds
    .venv/bin/python benchmarks/bench_startup.py --before DIR    # and DIR's imgcopy, alternating
    .venv/bin/python benchmarks/bench_startup.py --runs 10 --cases version,info

"after" is the imgcopy this interpreter imports; ``--before DIR`` puts DIR
(a checkout or an unpacked tree whose imgcopy/ has its _core built, e.g.
``git archive BASE imgcopy | tar -x -C DIR`` plus the built .so) first on
PYTHONPATH for the "before" column.  Every round runs every (case, tree) once,
in an order that rotates, so a loaded machine hits both alike.  Reported per
case: the median wall time and the median CPU time (user + sys, from
wait4()) of the process, each also net of the bare interpreter's median;
and, from one more run, how many of imgcopy's modules and which heavy
standard modules the case imports (sys.modules as it exits, written by a
sitecustomize: ``-X importtime`` misses what ``from . import x`` imports).  Each tree's package is compiled
first (``compileall``): runs read bytecode as an installed package's do, even
under PYTHONDONTWRITEBYTECODE."""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HEAVY = ("argparse", "dataclasses", "inspect", "typing", "json", "re", "shutil", "difflib",
         "struct", "signal", "threading", "enum")


def cases(d: str) -> dict:
    """name: argv (the interpreter's cases start with sys.executable)."""
    raw, qcow2 = os.path.join(d, "a.raw"), os.path.join(d, "a.qcow2")
    out = os.path.join(d, "out.raw")
    m = [sys.executable, "-m", "imgcopy"]
    table = {
        "bare": [sys.executable, "-c", "pass"],
        "import": [sys.executable, "-c", "import imgcopy"],
        "version": m + ["--version"],
        "help": m + ["--help"],
        "info": m + ["info", qcow2],
        "map": m + ["map", qcow2],
        "convert": m + ["convert", "-O", "raw", qcow2, out],
        "checksum": m + ["checksum", raw],
        "compare": m + ["compare", raw, qcow2],
        "check": m + ["check", qcow2],
        "measure": m + ["measure", "-O", "qcow2", raw],
    }
    if shutil.which("qemu-img"):  # the anchor: a C program's whole start
        table["qemu-img info"] = ["qemu-img", "info", qcow2]
        table["qemu-img convert"] = ["qemu-img", "convert", "-O", "raw", qcow2, out]
    return table


def make_images(d: str) -> None:
    raw = os.path.join(d, "a.raw")
    with open(raw, "wb") as f:
        f.truncate(4 << 20)
        for off in (0, 1 << 20, 3 << 20):
            f.seek(off)
            f.write(bytes(range(1, 256)) * 257)
    subprocess.run([sys.executable, "-m", "imgcopy", "convert", "-O", "qcow2", raw,
                    os.path.join(d, "a.qcow2")], check=True)


def run_once(argv: list, env: dict, cwd: str) -> tuple:
    """(wall seconds, cpu seconds, exit status) of one run."""
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    return wall, usage.ru_utime + usage.ru_stime, p.returncode


HOOK = """import atexit, os, sys
def _dump(path=os.environ.pop("BENCH_MODULES_OUT", None)):
    if path:
        with open(path, "w") as f:
            f.write("\\n".join(sys.modules))
atexit.register(_dump)
"""


def imports(argv: list, env: dict, cwd: str) -> list:
    """The modules in sys.modules when ``argv`` exits."""
    hook = os.path.join(cwd, "hook")
    os.makedirs(hook, exist_ok=True)
    with open(os.path.join(hook, "sitecustomize.py"), "w") as f:
        f.write(HOOK)
    out = os.path.join(cwd, "modules.txt")
    env = dict(env, BENCH_MODULES_OUT=out, PYTHONPATH=os.pathsep.join(
        [hook] + [p for p in [env.get("PYTHONPATH")] if p]))
    subprocess.run(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(out) as f:
        return f.read().split("\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--before", metavar="DIR", help="a tree with imgcopy/ (built) to compare with")
    ap.add_argument("--cases", help="comma-separated, of: " + ", ".join(cases("")))
    ap.add_argument("--no-anchor", action="store_true", help="without qemu-img's info and convert")
    args = ap.parse_args()

    work = tempfile.mkdtemp(prefix="imgcopy-startup-")
    make_images(work)
    table = cases(work)
    names = ["bare"] + [c for c in (args.cases.split(",") if args.cases else table) if c != "bare"
                        and not (args.no_anchor and c.startswith("qemu-img"))]
    trees = {"after": dict(os.environ)}
    if args.before:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([os.path.abspath(args.before)] +
                                            [p for p in [env.get("PYTHONPATH")] if p])
        trees = {"before": env, "after": dict(os.environ)}
    for env in trees.values():  # bytecode, as pip leaves an installed package
        where = subprocess.run([sys.executable, "-c", "import imgcopy; print(imgcopy.__path__[0])"],
                               env=env, cwd=work, check=True, capture_output=True, text=True)
        subprocess.run([sys.executable, "-m", "compileall", "-q", where.stdout.strip()],
                       check=True)
    last = list(trees)[-1]
    jobs = [(c, t) for c in names for t in trees  # an anchor once: it is the same for both
            if table[c][0] == sys.executable or t == last]
    times: dict = {j: [] for j in jobs}
    for c, t in jobs:  # warm-up, and the exit status each must have
        w = run_once(table[c], trees[t], work)
        if w[2] not in (0, 63):  # check of a raw image: qemu-img's 63
            print(f"{c} ({t}) exits {w[2]}", file=sys.stderr)
            return 1
    for r in range(args.runs):
        k = r % len(jobs)
        for c, t in jobs[k:] + jobs[:k]:
            times[(c, t)].append(run_once(table[c], trees[t], work))

    def med(c: str, t: str, i: int) -> float:
        return statistics.median(x[i] for x in times[(c, t)]) * 1000

    print(f"{sys.executable}, {args.runs} rounds, medians in ms (net: minus `python -c pass`)")
    head = f"{'case':<16}"
    for t in trees:
        head += f" {t + ' wall':>12} {'net':>6} {'cpu':>6} {'net':>6}"
    print(head + "   imports: imgcopy modules (" + "/".join(trees) + "), heavy stdlib (after)")
    for c in names:
        line = f"{c:<16}"
        for t in trees:
            if (c, t) not in times:
                line += " " * 34
                continue
            wall, cpu = med(c, t, 0), med(c, t, 1)
            line += (f" {wall:>12.1f} {wall - med('bare', t, 0):>6.1f}"
                     f" {cpu:>6.1f} {cpu - med('bare', t, 1):>6.1f}")
        if table[c][0] != sys.executable:
            print(line)
            continue
        counts = []
        for t in trees:
            mods = imports(table[c], trees[t], work)
            counts.append(str(sum(m == "imgcopy" or m.startswith("imgcopy.") for m in mods)))
        heavy = [h for h in HEAVY if h in mods]
        print(f"{line}   {'/'.join(counts):>5}  {' '.join(heavy)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
