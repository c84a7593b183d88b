#!/usr/bin/env python3
"""Compressed qcow2 side by side: imgcopy against qemu-img convert, in one
run, for both compression types (zlib, zstd), on two images:

  os-like    the corpus's sparse-6g.raw (6 GiB virtual, 1.2 GiB of data
             that compresses to about 80%, like installed software)
  text-like  generated here: 1 GiB virtual, 512 MiB of prose-like text in
             runs between holes (compresses to about 30%)

  compress     raw -> qcow2 -c: imgcopy against qemu-img convert -c -W and
               -c -W -m 8
  decompress   the qcow2 qemu-img compressed -> raw: imgcopy against
               qemu-img convert -W

Each command is timed as `CMD && sync`, cold source, alternated
round-robin; medians of wall time and CPU time (user + system of the
command) and the output's size, with imgcopy's ratio to each anchor
(< 1: imgcopy is faster or smaller).  Every output is checked once:
qemu-img check for qcow2, qemu-img compare against the source.

  bench_compress.py [--corpus DIR] [--scale S] [--runs N] [--types zlib,zstd]
                    [--images os-like,text-like] [--python PY]
"""
import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_convert import evict  # noqa: E402  (same directory)

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS_SCRIPT = os.path.join(HERE, "..", "..", "shared", "corpus", "make_corpus.py")
MiB = 1 << 20
GiB = 1 << 30


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def text_block(seed: int, n: int) -> bytes:
    """Prose-like text: words with English letter frequencies, drawn with
    Zipf's law (as tests/test_qcow2_compression.py makes it)."""
    rng = random.Random(seed)
    letters = "etaoinshrdlucmfwypvbgkjqxz"
    vocab = ["".join(rng.choice(letters[:rng.randint(8, 26)])
                     for _ in range(rng.randint(1, 10))) for _ in range(3000)]
    weights = [1 / (r + 1) for r in range(len(vocab))]
    out = bytearray()
    while len(out) < n:
        out += (" ".join(rng.choices(vocab, weights, k=200)) + ".\n").encode()
    return bytes(out[:n])


def make_text_image(path: str, scale: float) -> None:
    """Data runs of 1-16 MiB between holes of the same sizes; 64 MiB of
    text written over and over from shifting offsets (each cluster is
    compressed on its own: repeats far apart change nothing)."""
    size = int(GiB * scale) // MiB * MiB
    block = text_block(1, 64 * MiB)
    rng = random.Random(2)
    with open(path, "wb") as f:
        f.truncate(size)
        off = 0
        while off < size:
            n = min(rng.randint(1, 16) * MiB, size - off)
            f.seek(off)
            start = rng.randrange(0, len(block) - n) if n < len(block) else 0
            f.write(block[start:start + n])
            off += n + rng.randint(1, 16) * MiB
    log("%s: %d MiB virtual" % (path, size // MiB))


def run_timed(argv, cwd):
    """(wall seconds of argv && sync, CPU seconds of argv)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run(argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        sys.exit("%s failed: %s" % (" ".join(argv), r.stderr.decode(errors="replace")))
    subprocess.run(["sync"], check=True)
    wall = time.perf_counter() - t0
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def check_output(src, dst, fmt):
    if fmt == "qcow2":
        r = subprocess.run(["qemu-img", "check", dst], capture_output=True, text=True)
        if r.returncode != 0 or "No errors" not in r.stdout:
            sys.exit("qemu-img check %s: %s%s" % (dst, r.stdout, r.stderr))
    r = subprocess.run(["qemu-img", "compare", src, dst], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("qemu-img compare %s %s: %s%s" % (src, dst, r.stdout, r.stderr))


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default=os.path.join(HERE, "..", ".corpus", "bench"))
    ap.add_argument("--scale", type=float, default=1.0,
                    help="corpus scale and text image size in GiB (default 1)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--types", default="zlib,zstd")
    ap.add_argument("--images", default="os-like,text-like")
    ap.add_argument("--python", default=sys.executable,
                    help="the Python that runs imgcopy (default: this one)")
    ap.add_argument("--workdir", default=None, help="where outputs go (default: a temp dir "
                    "beside the corpus)")
    a = ap.parse_args()
    types = [t for t in a.types.split(",") if t]
    images = [i for i in a.images.split(",") if i]
    os.makedirs(a.corpus, exist_ok=True)
    sources = {}
    if "os-like" in images:
        src = os.path.join(a.corpus, "sparse-6g.raw")
        if not os.path.exists(src):
            subprocess.run([sys.executable, CORPUS_SCRIPT, a.corpus, "--scale", str(a.scale),
                            "--only", "sparse-6g.raw"], check=True)
        sources["os-like"] = src
    if "text-like" in images:
        src = os.path.join(a.corpus, "text-like-%g.raw" % a.scale)
        if not os.path.exists(src):
            make_text_image(src, a.scale)
        sources["text-like"] = src
    libs = json.loads(subprocess.run(
        [a.python, "-c", "import imgcopy, json; print(json.dumps(imgcopy.compression_libraries()))"],
        check=True, capture_output=True, text=True).stdout)
    qemu_version = subprocess.run(["qemu-img", "--version"], capture_output=True,
                                  text=True).stdout.splitlines()[0]
    log("imgcopy compression libraries: %s; %s" % (libs, qemu_version))
    work = tempfile.mkdtemp(prefix="bench-compress-", dir=a.workdir or a.corpus)
    imgcopy = [a.python, "-m", "imgcopy", "convert"]

    # (group, label, argv template, output format); {src} {dst} {t} filled in
    jobs = []
    for image, src in sources.items():
        for t in types:
            if libs.get(t) is None:
                log("skipping %s: imgcopy has no %s" % (t, t))
                continue
            o = ["-o", "compression_type=" + t]
            group = (image, t, "compress")
            jobs += [
                (group, "imgcopy -c", imgcopy + ["-O", "qcow2", "-c"] + o, "qcow2"),
                (group, "qemu-img -c -W", ["qemu-img", "convert", "-O", "qcow2", "-c", "-W"] + o,
                 "qcow2"),
                (group, "qemu-img -c -W -m 8",
                 ["qemu-img", "convert", "-O", "qcow2", "-c", "-W", "-m", "8"] + o, "qcow2"),
            ]
            group = (image, t, "decompress")
            jobs += [
                (group, "imgcopy", imgcopy + ["-O", "raw"], "raw"),
                (group, "qemu-img -W", ["qemu-img", "convert", "-O", "raw", "-W"], "raw"),
            ]
    # the compressed sources of the decompress jobs, made by qemu-img
    compressed = {}
    for image, src in sources.items():
        for t in types:
            if libs.get(t) is None:
                continue
            path = os.path.join(work, "%s-%s-source.qcow2" % (image, t))
            subprocess.run(["qemu-img", "convert", "-O", "qcow2", "-c", "-W", "-o",
                            "compression_type=" + t, src, path], check=True)
            compressed[(image, t)] = path

    results = {}
    checked = set()
    for run in range(a.runs):
        log("round %d/%d" % (run + 1, a.runs))
        for i, (group, label, argv, fmt) in enumerate(jobs):
            image, t, kind = group
            src = sources[image] if kind == "compress" else compressed[(image, t)]
            dst = os.path.join(work, "out-%d.%s" % (i, fmt))
            if os.path.exists(dst):
                os.unlink(dst)
            evict(src)
            wall, cpu = run_timed(argv + [src, dst], work)
            size = os.path.getsize(dst) if fmt == "qcow2" else None
            results.setdefault((group, label), []).append((wall, cpu, size))
            log("  %-28s %-22s %6.2f s  cpu %6.2f s%s" % (
                "/".join(group), label, wall, cpu,
                "  %d MiB" % (size // MiB) if size else ""))
            if (group, label) not in checked:
                check_output(sources[image], dst, fmt)
                checked.add((group, label))
            os.unlink(dst)

    print("\nimgcopy %s / %s; %s; medians of %d runs, cold source, `cmd && sync`" % (
        libs.get("zlib"), libs.get("zstd"), qemu_version, a.runs))
    groups = []
    for group, _, _, _ in jobs:
        if group not in groups:
            groups.append(group)
    print("\n| image | type | job | command | time s | CPU s | size MiB | imgcopy time x | "
          "CPU x | size x |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for group in groups:
        rows = [(label, results[(g, label)]) for g, label, _, _ in jobs if g == group]
        mine = rows[0][1]
        m_wall = statistics.median(r[0] for r in mine)
        m_cpu = statistics.median(r[1] for r in mine)
        m_size = mine[0][2]
        for label, rs in rows:
            wall = statistics.median(r[0] for r in rs)
            cpu = statistics.median(r[1] for r in rs)
            size = rs[0][2]
            ratios = ("", "", "") if label.startswith("imgcopy") else (
                "%.2f" % (m_wall / wall), "%.2f" % (m_cpu / cpu),
                "%.3f" % (m_size / size) if size else "")
            print("| %s | %s | %s | %s | %.2f | %.2f | %s | %s | %s | %s |" % (
                group[0], group[1], group[2], label, wall, cpu,
                "%.0f" % (size / MiB) if size else "", *ratios))
    print("\n(ratios: imgcopy's median over the anchor's on that row; < 1 is faster or "
          "smaller)")
    subprocess.run(["rm", "-rf", work])
    return 0


if __name__ == "__main__":
    sys.exit(main())
