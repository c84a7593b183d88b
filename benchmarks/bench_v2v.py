#!/usr/bin/env python3
"""v2v sources side by side: imgcopy against qemu-img convert reading other
hypervisors' disks, in one run, on the corpus's OS-like image.

The corpus's sparse-6g.raw (6 GiB virtual, ~1.2 GiB of data at scale 1) is
written once by qemu-img as each source kind:

  stream.vmdk   streamOptimized vmdk (deflate grains: what an OVA holds)
  sparse.vmdk   monolithicSparse vmdk
  dynamic.vhdx  dynamic vhdx
  dynamic.vhd   dynamic vhd (vpc)

and each is converted to raw and to qcow2 by imgcopy and by
`qemu-img convert -W` (and plain `qemu-img convert` for the stream vmdk).
Every command is timed as `CMD && sync` with the source's pages dropped
first (cold) or kept (warm), commands alternated round-robin, medians
printed with the ratio imgcopy / anchor (< 1: imgcopy is faster) and the
CPU time (user + system) of each command.

  bench_v2v.py [--corpus DIR] [--scale S] [--runs N] [--quick] [--warm]
               [--only stream.vmdk,...] [--baseline PYTHON]

--baseline PYTHON times another build of imgcopy (PYTHON -m imgcopy) in the
same rounds as "imgcopy baseline".
"""
import argparse
import os
import resource
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_convert import evict  # noqa: E402  (same directory)

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = {
    "stream.vmdk": ["-O", "vmdk", "-o", "subformat=streamOptimized"],
    "sparse.vmdk": ["-O", "vmdk", "-o", "subformat=monolithicSparse"],
    "dynamic.vhdx": ["-O", "vhdx", "-o", "subformat=dynamic"],
    "dynamic.vhd": ["-O", "vpc", "-o", "subformat=dynamic"],
}
FORMAT_OF = {"vmdk": "vmdk", "vhdx": "vhdx", "vhd": "vpc"}


def timed_cpu(argv, cwd):
    """(wall seconds of `argv && sync`, CPU seconds of argv)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run(argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE)
    if r.returncode != 0:
        raise SystemExit("%s failed: %s" % (" ".join(argv), r.stderr.decode(errors="replace")))
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(["sync"], check=True)
    wall = time.perf_counter() - t0
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def identical(a, fa, b, fb):
    r = subprocess.run(["qemu-img", "compare", "-f", fa, "-F", fb, a, b],
                       capture_output=True, text=True)
    return r.returncode == 0


def table(title, rows):
    print("\n== %s ==" % title)
    ic = statistics.median(rows["imgcopy"]["wall"])
    print("%-30s %9s %9s %9s %9s  %s" % ("tool", "median s", "min", "max", "cpu s",
                                          "imgcopy/tool"))
    for name, r in rows.items():
        med = statistics.median(r["wall"])
        ratio = "" if name == "imgcopy" else "%.2f" % (ic / med)
        print("%-30s %9.3f %9.3f %9.3f %9.3f  %s%s" % (
            name, med, min(r["wall"]), max(r["wall"]), statistics.median(r["cpu"]), ratio,
            "" if r["ok"] else "  DIFFERS"))


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default="/tmp/imgcopy-corpus")
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="scale 0.0625, 2 runs")
    ap.add_argument("--warm", action="store_true", help="keep the source's pages cached")
    ap.add_argument("--only", help="comma-separated source kinds (%s)" % ",".join(SOURCES))
    ap.add_argument("--baseline", metavar="PYTHON",
                    help="also time PYTHON -m imgcopy (another build) in the same rounds")
    a = ap.parse_args()
    if a.quick:
        a.scale, a.runs = 0.0625, 2
        a.corpus = a.corpus + "-quick"
    kinds = a.only.split(",") if a.only else list(SOURCES)
    for k in kinds:
        if k not in SOURCES:
            ap.error("unknown source kind %r" % k)
    subprocess.run([sys.executable, os.path.join(HERE, "make_corpus.py"), a.corpus, "--scale",
                    str(a.scale), "--only", "sparse-6g.raw"], check=True,
                   stderr=subprocess.DEVNULL)
    raw = os.path.join(a.corpus, "sparse-6g.raw")
    out_dir = os.path.join(a.corpus, "bench-v2v")
    os.makedirs(out_dir, exist_ok=True)
    py = sys.executable
    print("imgcopy %s vs %s; %d runs, scale %g, %s source, load %s" % (
        py, subprocess.run(["qemu-img", "--version"], capture_output=True,
                           text=True).stdout.splitlines()[0], a.runs, a.scale,
        "warm" if a.warm else "cold", " ".join("%.2f" % x for x in os.getloadavg())))

    for kind in kinds:
        src = os.path.join(out_dir, kind)
        fmt = FORMAT_OF[kind.rsplit(".", 1)[1]]
        if not os.path.exists(src) or os.path.getmtime(src) < os.path.getmtime(raw):
            subprocess.run(["qemu-img", "convert", "-f", "raw"] + SOURCES[kind] + [raw, src],
                           check=True)
        for out_fmt in ("raw", "qcow2"):
            dst = os.path.join(out_dir, "out." + out_fmt)
            cmds = {"imgcopy": [py, "-m", "imgcopy", "convert", "-f", fmt, "-O", out_fmt,
                                src, dst]}
            if a.baseline:
                cmds["imgcopy baseline"] = [a.baseline] + cmds["imgcopy"][1:]
            cmds["qemu-img convert -W"] = ["qemu-img", "convert", "-W", "-f", fmt, "-O",
                                           out_fmt, src, dst]
            if kind == "stream.vmdk":
                cmds["qemu-img convert"] = ["qemu-img", "convert", "-f", fmt, "-O", out_fmt,
                                            src, dst]
            rows = {k: {"wall": [], "cpu": [], "ok": True} for k in cmds}
            for _ in range(a.runs):
                for name, argv in cmds.items():
                    if os.path.exists(dst):
                        os.unlink(dst)
                    if not a.warm:
                        evict(src)
                    wall, cpu = timed_cpu(argv, out_dir)
                    rows[name]["wall"].append(wall)
                    rows[name]["cpu"].append(cpu)
                    rows[name]["ok"] &= identical(raw, "raw", dst, out_fmt)
            table("%s (%s) -> %s, %s source, %d MiB file" % (
                kind, fmt, out_fmt, "warm" if a.warm else "cold",
                os.path.getsize(src) >> 20), rows)
            os.unlink(dst)
    # the sources stay for the next run (rebuilt when the corpus changes)


if __name__ == "__main__":
    main()
