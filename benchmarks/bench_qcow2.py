#!/usr/bin/env python3
"""qcow2 side by side: imgcopy against qemu-img convert and nbdcopy (through
qemu-nbd), in one run, on the corpus's qcow2 and raw images.

  qcow2 -> raw   sparse-6g.qcow2, sparse-6g-compressed.qcow2, frag-backward.qcow2
  raw -> qcow2   sparse-6g.raw: plain and compressed (-c), qemu-img with and without -W
  map            frag-backward/forward.qcow2: imgcopy map vs qemu-img map

Each command is timed as `CMD && sync`, cold source (its pages dropped),
commands alternated round-robin, medians printed with ratios
(anchor median / imgcopy median: > 1 means imgcopy is faster); for qcow2
outputs, `qemu-img check` fragmentation is printed too.

  bench_qcow2.py [--corpus DIR] [--scale S] [--runs N] [--quick] [--baseline PYTHON]

--baseline PYTHON times another build of imgcopy (PYTHON -m imgcopy, e.g. a
worktree of an older commit) in the same rounds as "imgcopy baseline".
"""
import argparse
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_convert import evict, timed  # noqa: E402  (same directory)

HERE = os.path.dirname(os.path.abspath(__file__))
IMAGES = ["sparse-6g.raw", "sparse-6g.qcow2", "sparse-6g-compressed.qcow2",
          "frag-backward.qcow2", "frag-forward.qcow2"]


def nbd_copy(src, dst, fmt_out):
    """nbdcopy reading SRC through qemu-nbd into DST (raw file), or writing
    into a qcow2 DST through qemu-nbd."""
    sock = tempfile.mktemp(prefix="imgcopy-bench-", suffix=".sock")
    if fmt_out == "raw":
        server = ["qemu-nbd", "-r", "-f", "qcow2", "-k", sock, "-t", src]
        tail = ["nbd+unix:///?socket=" + sock, dst]
    else:
        server = ["qemu-nbd", "-f", "qcow2", "-k", sock, "-t", dst]
        tail = [src, "nbd+unix:///?socket=" + sock]
    return sock, server, ["nbdcopy", "--request-size=2097152", "--queue-size=134217728"] + tail


def run_nbd(src, dst, fmt_out, size):
    if fmt_out == "qcow2":
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", dst, str(size)], check=True)
    else:
        with open(dst, "wb") as f:
            f.truncate(size)
    sock, server, client = nbd_copy(src, dst, fmt_out)
    srv = subprocess.Popen(server, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):
            if os.path.exists(sock):
                break
            time.sleep(0.01)
        t0 = time.perf_counter()
        subprocess.run(client, check=True, stdout=subprocess.DEVNULL)
        subprocess.run(["sync"], check=True)
        return time.perf_counter() - t0
    finally:
        srv.terminate()
        srv.wait()
        if os.path.exists(sock):
            os.unlink(sock)


def fragmentation(path):
    out = subprocess.run(["qemu-img", "check", path], capture_output=True, text=True).stdout
    m = re.search(r"([\d.]+)% fragmented", out)
    return m.group(1) + "%" if m else "?"


def table(title, rows, anchor_names):
    print("\n== %s ==" % title)
    ic = statistics.median(rows["imgcopy"][0])
    print("%-34s %9s %9s %9s  %s" % ("tool", "median s", "min", "max", "vs imgcopy / check"))
    for name, (times, note) in rows.items():
        med = statistics.median(times)
        ratio = "" if name == "imgcopy" else "%.2fx" % (med / ic)
        print("%-34s %9.3f %9.3f %9.3f  %s %s" % (name, med, min(times), max(times), ratio, note))


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default="/tmp/imgcopy-corpus")
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="scale 0.0625, 2 runs")
    ap.add_argument("--baseline", metavar="PYTHON",
                    help="also time PYTHON -m imgcopy (another build) in the same rounds")
    a = ap.parse_args()
    if a.quick:
        a.scale, a.runs = 0.0625, 2
        a.corpus = a.corpus + "-quick"
    subprocess.run([sys.executable, os.path.join(HERE, "make_corpus.py"), a.corpus, "--scale",
                    str(a.scale), "--only", ",".join(IMAGES)], check=True,
                   stderr=subprocess.DEVNULL)
    py = sys.executable
    out_dir = os.path.join(a.corpus, "bench-qcow2")
    os.makedirs(out_dir, exist_ok=True)
    dst_raw = os.path.join(out_dir, "out.raw")
    dst_q = os.path.join(out_dir, "out.qcow2")
    print("imgcopy %s vs %s; %d runs, scale %g, load %s" % (
        py, subprocess.run(["qemu-img", "--version"], capture_output=True,
                           text=True).stdout.splitlines()[0], a.runs, a.scale,
        " ".join("%.2f" % x for x in os.getloadavg())))

    def rm(p):
        if os.path.exists(p):
            os.unlink(p)

    def imgcopy(*args):
        """The imgcopy commands: this build, and the baseline's when given."""
        cmds = {"imgcopy": [py, "-m", "imgcopy"] + list(args)}
        if a.baseline:
            cmds["imgcopy baseline"] = [a.baseline, "-m", "imgcopy"] + list(args)
        return cmds

    # qcow2 -> raw
    for image in ["sparse-6g.qcow2", "sparse-6g-compressed.qcow2", "frag-backward.qcow2"]:
        src = os.path.join(a.corpus, image)
        size = int(subprocess.run(["qemu-img", "info", "--output=json", src],
                                  capture_output=True, text=True).stdout.split(
            '"virtual-size": ')[1].split(",")[0])
        cmds = {
            **imgcopy("convert", "-O", "raw", src, dst_raw),
            "qemu-img convert -O raw": ["qemu-img", "convert", "-O", "raw", src, dst_raw],
            "qemu-img convert -W -m 8": ["qemu-img", "convert", "-W", "-m", "8", "-O", "raw",
                                         src, dst_raw],
        }
        rows = {k: ([], "") for k in list(cmds) + ["nbdcopy <- qemu-nbd"]}
        for _ in range(a.runs):
            for name, argv in cmds.items():
                rm(dst_raw)
                evict(src)
                t, _, rc, err = timed(argv, out_dir)
                assert rc == 0, err
                rows[name][0].append(t)
            rm(dst_raw)
            evict(src)
            rows["nbdcopy <- qemu-nbd"][0].append(run_nbd(src, dst_raw, "raw", size))
        table("%s -> raw, cold source" % image, rows, None)
    rm(dst_raw)

    # raw -> qcow2
    src = os.path.join(a.corpus, "sparse-6g.raw")
    size = os.path.getsize(src)
    for compressed in (False, True):
        c = ["-c"] if compressed else []
        cmds = {
            **imgcopy("convert", "-O", "qcow2", *c, src, dst_q),
            "qemu-img convert -O qcow2": ["qemu-img", "convert", "-O", "qcow2"] + c +
            [src, dst_q],
            "qemu-img convert -W -O qcow2": ["qemu-img", "convert", "-W", "-O", "qcow2"] + c +
            [src, dst_q],
        }
        rows = {k: ([], "") for k in cmds}
        if not compressed:
            rows["nbdcopy -> qemu-nbd"] = ([], "")
        for r in range(a.runs):
            for name, argv in cmds.items():
                rm(dst_q)
                evict(src)
                t, _, rc, err = timed(argv, out_dir)
                assert rc == 0, err
                frag = fragmentation(dst_q)
                rows[name] = (rows[name][0] + [t], "fragmented " + frag)
            if not compressed:
                rm(dst_q)
                evict(src)
                t = run_nbd(src, dst_q, "qcow2", size)
                rows["nbdcopy -> qemu-nbd"] = (rows["nbdcopy -> qemu-nbd"][0] + [t],
                                               "fragmented " + fragmentation(dst_q))
        table("sparse-6g.raw -> qcow2%s, cold source" % (" -c" if compressed else ""), rows,
              None)
    rm(dst_q)

    # map of fragmented images
    for image in ["frag-backward.qcow2", "frag-forward.qcow2"]:
        src = os.path.join(a.corpus, image)
        cmds = {**imgcopy("map", "--output=json", src),
                "qemu-img map": ["qemu-img", "map", "--output=json", src]}
        rows = {k: ([], "") for k in cmds}
        for _ in range(max(a.runs, 3)):
            for name, argv in cmds.items():
                t, _, rc, err = timed(argv, out_dir)
                assert rc == 0, err
                rows[name][0].append(t)
        table("map %s (warm)" % image, rows, None)
    shutil.rmtree(out_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
