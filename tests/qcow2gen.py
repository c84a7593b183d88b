"""qcow2 test images built with qemu-img / qemu-io, shared by tests/test_qcow2_*.py.

qemu is both the builder and the oracle: every image here is made with
``qemu-img create`` / ``qemu-io`` / ``qemu-img convert`` (or a corpus recipe
from benchmarks/make_corpus.py), and the expected answers are whatever
``qemu-img map`` / ``qemu-img convert -O raw`` say about it.

A single :class:`Store` per test session (``store(tmp_path_factory)``) builds
images lazily, by name, and memoizes qemu's answers, so the three test
modules share both the images and the oracle output.  Tests must never
modify a stored image.

Reproduce an image by hand::

    python3 tests/qcow2gen.py NAME OUTDIR      # prints the path and qemu-img map

Image families (``NAMES``; builders in ``_SPECS`` below):

  uni-c{512,4096,65536,2097152}-{v2,v3}  the same guest writes (pattern,
        unaligned zero writes, 2 MiB compressed writes, discards) for every
        cluster size and compat level: identical guest bytes
  odd-64k[-v2], odd-64k-tail   virtual size 1000448 (not a cluster multiple),
        compressed / written partial last cluster
  frag-{backward,forward}      64k clusters written last-to-first / even-then-odd
  conv-*, convc-*              qemu-img convert [-c] of a seeded raw file with
        random, text-like (compressible), zero and hole runs
  chain-mid/top/small/probe    raw base (odd size) <- v2 qcow2 <- v3 qcow2,
        overlays larger and smaller than their backing; "probe" hides the
        backing format extension
  tree-over                    sub/deeper/over.qcow2 -> ../top.qcow2 -> base.qcow2
  prealloc-*                   preallocation=metadata (+ writes, 4k/2M clusters,
        v2, refcount_bits 1/64), falloc, full
  snapshot                     internal snapshots, COW after them
  petabyte                     1 PiB, one 64k cluster at 500 TiB
  corpus-*                     benchmarks/make_corpus.py images at --scale 0.0625

Host files get real holes instead of ext4 unwritten extents (``dig_holes``),
so their maps never change when somebody reads them.
"""

import json
import os
import random
import shutil
import struct
import subprocess
import sys
import threading
from typing import Dict, List, NamedTuple, Optional, Tuple

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB
TiB = 1024 * GiB
PiB = 1024 * TiB

QEMU_IMG = shutil.which("qemu-img")
QEMU_IO = shutil.which("qemu-io")
NO_QEMU_REASON = "qemu-img/qemu-io not found on PATH (install qemu-utils); they are the test oracle"
HAVE_QEMU = QEMU_IMG is not None and QEMU_IO is not None

_HERE = os.path.dirname(os.path.abspath(__file__))
_REPO = os.path.dirname(_HERE)
MAKE_CORPUS = os.path.join(_REPO, "benchmarks", "make_corpus.py")
CORPUS_SCALE = 0.0625
CORPUS_SEED = 4


# --------------------------------------------------------------------------
# running qemu

def run(args, cwd=None, input=None, check=True) -> subprocess.CompletedProcess:
    p = subprocess.run([str(a) for a in args], cwd=cwd, input=input, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
    if check and p.returncode != 0:
        raise RuntimeError("%s failed (rc=%d, cwd=%s):\n%s%s" % (
            " ".join(map(str, args)), p.returncode, cwd, p.stdout[-2000:], p.stderr[-2000:]))
    return p


def qemu_img(*args, cwd=None, check=True) -> subprocess.CompletedProcess:
    return run([QEMU_IMG] + list(args), cwd=cwd, check=check)


def qemu_io(path, cmds, fmt="qcow2", cwd=None):
    """Run qemu-io commands on an image (cache=unsafe: fast, same layout)."""
    args = [QEMU_IO, "-t", "unsafe", "-f", fmt]
    script = "".join(c + "\n" for c in cmds)
    p = run(args + [path], cwd=cwd, input=script)
    low = (p.stdout + p.stderr).lower()
    if "error" in low or "failed" in low or "invalid" in low or "usage" in low:
        raise RuntimeError("qemu-io %s: %r:\n%s%s" % (path, cmds, p.stdout[-3000:], p.stderr))
    return p.stdout


def create(path, size, cluster_size=64 * KiB, compat="1.1", backing=None, backing_fmt=None,
           prealloc=None, cwd=None, extra=()):
    opts = ["cluster_size=%d" % cluster_size, "compat=%s" % compat]
    if prealloc:
        opts.append("preallocation=%s" % prealloc)
    opts += list(extra)
    args = ["create", "-q", "-f", "qcow2", "-o", ",".join(opts)]
    if backing is not None:
        args += ["-b", backing, "-F", backing_fmt]
    qemu_img(*(args + [path, str(size)]), cwd=cwd)


def convert_to_qcow2(src, dst, src_fmt="raw", compress=False, cluster_size=64 * KiB,
                     compat="1.1"):
    args = ["convert", "-f", src_fmt, "-O", "qcow2", "-o",
            "cluster_size=%d,compat=%s" % (cluster_size, compat)]
    if compress:
        args.append("-c")
    qemu_img(*(args + [src, dst]))


# --------------------------------------------------------------------------
# deterministic host files

def dig_holes(path, block=4096):
    """Punch every all-zero 4 KiB block of `path` into a real hole (like
    ``fallocate --dig-holes``).

    qemu fills the untouched part of a newly allocated cluster with
    write-zeroes, i.e. FALLOC_FL_ZERO_RANGE: *unwritten* extents, which
    ext4's SEEK_DATA reports as holes until somebody reads their pages, then
    as data.  Where qemu consults the host file (its metadata-preallocation
    heuristic), the map of such an image would change as soon as any test
    reads it.  Real holes never change, so every image built here gets them.
    """
    import ctypes
    import ctypes.util

    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong]
    zero = bytes(block)
    fd = os.open(path, os.O_RDWR)
    try:
        size = os.fstat(fd).st_size
        runs, start, pos = [], None, 0
        while pos < size:
            buf = os.pread(fd, 1 << 20, pos)
            if not buf:
                break
            for i in range(0, len(buf), block):
                z = buf[i:i + block] == zero[:len(buf) - i] if i + block > len(buf) else \
                    buf[i:i + block] == zero
                if z and start is None:
                    start = pos + i
                elif not z and start is not None:
                    runs.append((start, pos + i - start))
                    start = None
            pos += len(buf)
        if start is not None:
            runs.append((start, size - start))
        for off, ln in runs:
            if libc.fallocate(fd, 3, off, ln) != 0:        # PUNCH_HOLE | KEEP_SIZE
                e = ctypes.get_errno()
                raise OSError(e, "fallocate(PUNCH_HOLE) failed", path)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


# --------------------------------------------------------------------------
# raw sources with compressible, incompressible, zero and hole runs

def mixed_raw(path, size, seed):
    """Seeded raw file: random runs (incompressible), text-like runs
    (compressible), written zeros and holes, at unaligned offsets."""
    rng = random.Random("qcow2gen-mixed-%d" % seed)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.ftruncate(fd, size)
        pos = rng.randint(0, 3000)
        while pos < size:
            n = min(size - pos, rng.choice([1, 333, 4096, 20000, 64 * KiB + 7,
                                            rng.randint(1, 400 * KiB)]))
            kind = rng.random()
            if kind < 0.35:
                buf = rng.randbytes(n)
            elif kind < 0.75:
                buf = bytes(rng.choice(b"abcdefgh \n") for _ in range(min(n, 997)))
                buf = (buf * (n // len(buf) + 1))[:n]
            else:
                buf = bytes(n)
            os.pwrite(fd, buf, pos)
            pos += n + rng.choice([0, 0, 512, 4096, 70000, rng.randint(1, 600 * KiB)])
        os.fsync(fd)
    finally:
        os.close(fd)
    return size


# --------------------------------------------------------------------------
# header patching (features qemu can no longer be asked to create)

def header_patch(src, dst, **fields):
    """Copy qcow2 image `src` to `dst` and patch header fields.

    fields: crypt_method=int, incompatible_set=bit (or list of bits),
    compression_type=int (also makes a v3 header 112 bytes long),
    drop_backing_format=True (hide the backing-format header extension).
    """
    shutil.copyfile(src, dst)
    with open(dst, "r+b") as f:
        head = bytearray(f.read(4096))
        if "crypt_method" in fields:
            head[32:36] = struct.pack(">I", fields["crypt_method"])
        if "incompatible_set" in fields:
            bits = fields["incompatible_set"]
            bits = bits if isinstance(bits, (list, tuple)) else [bits]
            v = struct.unpack(">Q", head[72:80])[0]
            for b in bits:
                v |= 1 << b
            head[72:80] = struct.pack(">Q", v)
        if "compression_type" in fields:
            hl = struct.unpack(">I", head[100:104])[0]
            assert hl >= 112, "header_length %d: create with compat=1.1" % hl
            head[104] = fields["compression_type"]
        if fields.get("drop_backing_format"):
            off = struct.unpack(">I", head[100:104])[0]
            while True:
                t, ln = struct.unpack(">II", head[off:off + 8])
                if t == 0:
                    break
                if t == 0xE2792ACA:
                    head[off:off + 4] = struct.pack(">I", 0x0BADF00D)  # unknown ext: ignored
                off += 8 + (ln + 7) // 8 * 8
        f.seek(0)
        f.write(head)
    dig_holes(dst)
    return dst


def l2_patch(path, guest_cluster, or_bits):
    """OR `or_bits` into the L2 entry of guest cluster `guest_cluster`
    (which must have an L2 table); returns the old entry."""
    with open(path, "r+b") as f:
        h = f.read(72)
        cbits = struct.unpack(">I", h[20:24])[0]
        l1_off = struct.unpack(">Q", h[40:48])[0]
        per_l2 = (1 << cbits) // 8
        f.seek(l1_off + 8 * (guest_cluster // per_l2))
        l2_off = struct.unpack(">Q", f.read(8))[0] & 0x00FFFFFFFFFFFE00
        assert l2_off, "no L2 table for cluster %d" % guest_cluster
        pos = l2_off + 8 * (guest_cluster % per_l2)
        f.seek(pos)
        old = struct.unpack(">Q", f.read(8))[0]
        f.seek(pos)
        f.write(struct.pack(">Q", old | or_bits))
    return old


# --------------------------------------------------------------------------
# the image catalogue

class Built(NamedTuple):
    name: str
    path: str               # absolute
    size: int               # virtual size
    compressed: bool        # holds compressed clusters (somewhere in the chain)
    chain: List[Tuple[str, str]]   # expected backing_chain (absolute paths), nearest first
    cluster_size: int


UNI_SIZE = 6 * MiB + 3 * 512


def uni_commands(size=UNI_SIZE):
    """The same guest writes for every cluster size / compat: compressed
    writes and discards are 2 MiB aligned, so they are cluster-aligned
    everywhere (a partial-cluster discard is advisory: content would differ)."""
    return [
        "write -P 0x41 0 1049000",
        "write -P 0x42 1300000 70000",
        "write -c -P 0x43 %d %d" % (2 * MiB, 2 * MiB),
        "write -P 0x44 %d 5000" % (3 * MiB + 777),         # partial overwrite of compressed data
        "write -z 400000 300000",                          # unaligned zeroes over data
        "write -P 0x48 %d %d" % (4 * MiB, 2 * MiB),
        "discard %d %d" % (4 * MiB, 2 * MiB),
        "write -z %d %d" % (4 * MiB + 64 * KiB, 1 * MiB),
        "write -P 0x45 %d 4096" % (4 * MiB + 512 * KiB),
        "write -P 0x46 %d 1000" % (size - 1000),          # the tail
        "write -P 0x47 %d 1" % (5 * MiB + 100 * KiB),
        "write -z -u %d %d" % (1 * MiB, 64 * KiB),
        "write -z -u %d %d" % (5 * MiB + 200 * KiB, 128 * KiB),
    ]


UNI_CLUSTERS = (512, 4 * KiB, 64 * KiB, 2 * MiB)
UNI_COMPATS = ("0.10", "1.1")
UNI_NAMES = ["uni-c%d-%s" % (c, "v2" if v == "0.10" else "v3") for c in UNI_CLUSTERS
             for v in UNI_COMPATS]

ODD_SIZE = 1000448   # 15.26 clusters of 64k


def _uni(store, name):
    _, c, v = name.split("-")
    cs = int(c[1:])
    p = store.path(name + ".qcow2")
    create(p, UNI_SIZE, cs, "0.10" if v == "v2" else "1.1")
    qemu_io(p, uni_commands())
    # with 2 MiB clusters the partial overwrite decompresses the only compressed cluster
    return Built(name, p, UNI_SIZE, cs < 2 * MiB, [], cs)


def _odd(store, name):
    compat = "0.10" if name.endswith("v2") else "1.1"
    p = store.path(name + ".qcow2")
    create(p, ODD_SIZE, 64 * KiB, compat)
    last = ODD_SIZE // (64 * KiB) * 64 * KiB          # start of the partial cluster
    qemu_io(p, [
        "write -P 0x51 1000 70000",
        "write -c -P 0x52 %d %d" % (last, ODD_SIZE - last),   # compressed partial last cluster
        "write -P 0x53 %d 100" % (ODD_SIZE - 100),            # ...then partly overwritten
        "write -c -P 0x54 %d %d" % (5 * 64 * KiB, 2 * 64 * KiB),
        "write -z %d %d" % (8 * 64 * KiB, 3 * 64 * KiB),
        "write -P 0x55 %d %d" % (11 * 64 * KiB - 3, 7),
    ])
    return Built(name, p, ODD_SIZE, True, [], 64 * KiB)


def _odd_tail_only(store, name):
    """Only the partial last cluster is written (plain data)."""
    p = store.path(name + ".qcow2")
    create(p, ODD_SIZE, 64 * KiB, "1.1")
    qemu_io(p, ["write -P 0x61 %d %d" % (ODD_SIZE - 5000, 5000)])
    return Built(name, p, ODD_SIZE, False, [], 64 * KiB)


def _frag(store, name):
    size = 8 * MiB
    n = size // (64 * KiB)
    p = store.path(name + ".qcow2")
    create(p, size)
    idx = list(range(n - 1, -1, -1)) if "backward" in name else \
        list(range(0, n, 2)) + list(range(1, n, 2))
    qemu_io(p, ["write -P 0x%02x %d 64k" % (i % 251 + 1, i * 64 * KiB) for i in idx])
    return Built(name, p, size, False, [], 64 * KiB)


MIXED_SIZE = 5 * MiB + 1234


_SOURCE_LOCK = threading.Lock()
_CORPUS_LOCK = threading.Lock()


def _mixed_source(store):
    p = store.path("mixed.raw")
    with _SOURCE_LOCK:
        if not os.path.exists(p):
            mixed_raw(p + ".tmp", MIXED_SIZE, 1)
            os.rename(p + ".tmp", p)
    return p


def _conv(store, name):
    # conv-4k / convc-64k / convc-64k-v2 ...
    parts = name.split("-")
    compress = parts[0] == "convc"
    cs = {"512": 512, "4k": 4 * KiB, "64k": 64 * KiB, "2m": 2 * MiB}[parts[1]]
    compat = "0.10" if parts[-1] == "v2" else "1.1"
    p = store.path(name + ".qcow2")
    convert_to_qcow2(_mixed_source(store), p, compress=compress, cluster_size=cs, compat=compat)
    size = (MIXED_SIZE + 511) // 512 * 512
    return Built(name, p, size, compress, [], cs)


CONV_NAMES = ["conv-512", "conv-4k", "conv-64k", "conv-2m", "convc-4k", "convc-64k",
              "convc-64k-v2", "convc-2m"]

# backing chains: chain-base.raw <- chain-mid.qcow2 (v2) <- chain-top.qcow2 (v3)
CHAIN_BASE_SIZE = 3 * MiB + 700          # odd raw size
CHAIN_MID_SIZE = 4 * MiB                 # larger than its backing
CHAIN_TOP_SIZE = 5 * MiB + 3 * 512       # larger again, not a cluster multiple
CHAIN_SMALL_SIZE = 2 * MiB + 512         # smaller than its backing


def _chain_dir(store):
    d = store.path("chain")
    os.makedirs(d, exist_ok=True)
    return d


def _chain_base(store):
    d = _chain_dir(store)
    p = os.path.join(d, "chain-base.raw")
    if not os.path.exists(p):
        mixed_raw(p, CHAIN_BASE_SIZE, 2)
    return p


def _chain_mid(store, name):
    d = _chain_dir(store)
    base = _chain_base(store)
    p = os.path.join(d, "chain-mid.qcow2")
    create("chain-mid.qcow2", CHAIN_MID_SIZE, 32 * KiB, "0.10", "chain-base.raw", "raw", cwd=d)
    qemu_io(p, [
        "write -P 0x71 %d %d" % (1 * MiB, 512 * KiB),
        "write -P 0x72 %d %d" % (200000, 3000),                  # COW of backing data
        "write -z %d %d" % (600 * KiB, 96 * KiB),                # v2: written zeroes
        "discard %d %d" % (1 * MiB + 256 * KiB, 64 * KiB),       # v2: backing shows through
        "write -P 0x73 %d %d" % (3 * MiB + 300, 400 * KiB),      # across the backing's end
        "write -c -P 0x74 %d %d" % (2 * MiB, 64 * KiB),
    ])
    return Built(name, p, CHAIN_MID_SIZE, True, [(base, "raw")], 32 * KiB)


def _chain_top(store, name):
    mid = store.get("chain-mid")
    d = _chain_dir(store)
    p = os.path.join(d, "chain-top.qcow2")
    create("chain-top.qcow2", CHAIN_TOP_SIZE, 4 * KiB, "1.1", "chain-mid.qcow2", "qcow2", cwd=d)
    qemu_io(p, [
        "write -P 0x81 %d %d" % (100, 9000),
        "write -z %d %d" % (1 * MiB + 64 * KiB, 128 * KiB),      # zero clusters over backing data
        "discard %d %d" % (250 * KiB, 32 * KiB),                 # v3 discard over backing
        "write -c -P 0x82 %d %d" % (2 * MiB + 32 * KiB, 16 * KiB),
        "write -P 0x83 %d %d" % (3 * MiB + 100 * KiB + 5, 10000),
        "write -P 0x84 %d %d" % (CHAIN_TOP_SIZE - 4000, 4000),  # beyond every backing file
        "write -P 0x85 %d %d" % (4 * MiB - 2048, 4096),          # across mid's end
    ])
    return Built(name, p, CHAIN_TOP_SIZE, True, [(mid.path, "qcow2")] + mid.chain, 4 * KiB)


def _chain_small(store, name):
    mid = store.get("chain-mid")
    d = _chain_dir(store)
    p = os.path.join(d, "chain-small.qcow2")
    create("chain-small.qcow2", CHAIN_SMALL_SIZE, 64 * KiB, "1.1", "chain-mid.qcow2", "qcow2",
           cwd=d)
    qemu_io(p, ["write -P 0x91 %d %d" % (5000, 70000),
                "write -z %d %d" % (1 * MiB, 64 * KiB)])
    return Built(name, p, CHAIN_SMALL_SIZE, True, [(mid.path, "qcow2")] + mid.chain, 64 * KiB)


def _chain_probe(store, name):
    """chain-top with its backing format extension hidden: qemu and imgcopy probe."""
    top = store.get("chain-top")
    p = os.path.join(_chain_dir(store), "chain-probe.qcow2")
    header_patch(top.path, p, drop_backing_format=True)
    return top._replace(name=name, path=p)


CHAIN_NAMES = ["chain-mid", "chain-top", "chain-small", "chain-probe"]

# a tree: tree/sub/deeper/over.qcow2 -> ../top.qcow2 -> base.qcow2 (relative names)


def _tree(store, name):
    root = store.path("tree")
    sub = os.path.join(root, "sub")
    deeper = os.path.join(sub, "deeper")
    os.makedirs(deeper, exist_ok=True)
    base = os.path.join(sub, "base.qcow2")
    top = os.path.join(sub, "top.qcow2")
    over = os.path.join(deeper, "over.qcow2")
    create("base.qcow2", 2 * MiB, 4 * KiB, "1.1", cwd=sub)
    qemu_io(base, ["write -P 0xa1 0 300000", "write -P 0xa2 1500000 20000"])
    create("top.qcow2", 3 * MiB, 64 * KiB, "0.10", "base.qcow2", "qcow2", cwd=sub)
    qemu_io(top, ["write -P 0xa3 100000 200000", "write -P 0xa4 %d 4096" % (2 * MiB + 5)])
    create("over.qcow2", 3 * MiB, 64 * KiB, "1.1", "../top.qcow2", "qcow2", cwd=deeper)
    qemu_io(over, ["write -P 0xa5 250000 100", "write -z 1400000 300000"])
    dig_holes(base)
    dig_holes(top)
    # the chain as imgcopy and qemu name it: joined to the overlay's directory
    chain = [(os.path.join(deeper, "../top.qcow2"), "qcow2"),
             (os.path.join(deeper, "../base.qcow2"), "qcow2")]
    return Built(name, over, 3 * MiB, False, chain, 64 * KiB)


def _prealloc(store, name):
    # prealloc-MODE[-4k|-2m][-v2][-rcBITS][-written]
    parts = name.split("-")
    mode = parts[1]
    cs = 4 * KiB if "4k" in parts else 2 * MiB if "2m" in parts else 64 * KiB
    compat = "0.10" if "v2" in parts else "1.1"
    extra = ["refcount_bits=%s" % x[2:] for x in parts if x.startswith("rc")]
    size = 4 * MiB if cs < 2 * MiB else 9 * MiB
    p = store.path(name + ".qcow2")
    create(p, size, cs, compat, prealloc=mode, extra=extra)
    if parts[-1] == "written":
        qemu_io(p, [
            "write -P 0xb1 %d %d" % (64 * KiB, 100 * KiB),
            "write -P 0xb2 %d %d" % (1 * MiB + 5, 3000),
            "write -z %d %d" % (2 * MiB, 128 * KiB),
            "discard %d %d" % (3 * MiB, 256 * KiB),
            "write -P 0xb3 %d %d" % (size - 512, 512),
        ])
    return Built(name, p, size, False, [], cs)


PREALLOC_NAMES = ["prealloc-metadata", "prealloc-metadata-written",
                  "prealloc-metadata-4k-v2-written", "prealloc-metadata-2m-written",
                  "prealloc-metadata-4k-rc1-written", "prealloc-metadata-rc64-written",
                  "prealloc-falloc-written", "prealloc-full-written"]


def _snapshot(store, name):
    """Internal snapshots: shared clusters (refcount 2, no COPIED flag), COW
    after the snapshot; the active L1 table is what counts."""
    p = store.path(name + ".qcow2")
    create(p, 2 * MiB, 4 * KiB)
    qemu_io(p, ["write -P 0xc1 0 100k", "write -c -P 0xc2 1M 8k"])
    qemu_img("snapshot", "-c", "s1", p)
    qemu_io(p, ["write -P 0xc3 50k 10k", "write -z 80k 8k", "discard 1M 4k"])
    qemu_img("snapshot", "-c", "s2", p)
    qemu_io(p, ["write -P 0xc4 0 4k", "write -P 0xc5 %d 3000" % (2 * MiB - 3000)])
    return Built(name, p, 2 * MiB, True, [], 4 * KiB)


def _petabyte(store, name):
    p = store.path("petabyte.qcow2")
    create(p, "1P")
    qemu_io(p, ["write -P 0x77 %d 64k" % PB_DATA_OFFSET])
    return Built(name, p, PiB, False, [], 64 * KiB)


PB_DATA_OFFSET = 500 * TiB

# benchmarks/make_corpus.py images at --scale 0.0625

CORPUS_NAMES = ["corpus-sparse-6g", "corpus-sparse-6g-compressed", "corpus-frag-backward",
                "corpus-frag-forward", "corpus-prealloc-meta"]


def corpus_dir(store):
    """Build (once) the corpus images this suite uses; return the directory."""
    with _CORPUS_LOCK:
        return _corpus_dir(store)


def _corpus_dir(store):
    d = store.path("corpus")
    if not os.path.exists(os.path.join(d, "sparse-6g-compressed.qcow2")):
        os.makedirs(d, exist_ok=True)
        run([sys.executable, MAKE_CORPUS, d, "--scale", str(CORPUS_SCALE), "--seed",
             str(CORPUS_SEED), "--only",
             "sparse-6g.raw,sparse-6g.qcow2,sparse-6g-compressed.qcow2,prealloc-meta.qcow2"])
        # make_corpus's frag recipe, with qemu-io in cache=unsafe mode (identical
        # image, 100x faster than the default cache mode)
        size = int(1 * GiB * CORPUS_SCALE) // MiB * MiB
        n = size // (64 * KiB)
        for order in ("backward", "forward"):
            p = os.path.join(d, "frag-%s.qcow2" % order)
            qemu_img("create", "-q", "-f", "qcow2", p, str(size))
            idx = list(range(n - 1, -1, -1)) if order == "backward" else \
                list(range(0, n, 2)) + list(range(1, n, 2))
            qemu_io(p, ["write %d 64k" % (i * 64 * KiB) for i in idx])
    return d


def _corpus(store, name):
    d = corpus_dir(store)
    fname = {"corpus-prealloc-meta": "prealloc-meta"}.get(name, name[len("corpus-"):]) + ".qcow2"
    p = os.path.join(d, fname)
    size = json.loads(qemu_img("info", "--output=json", p).stdout)["virtual-size"]
    return Built(name, p, size, "compressed" in name, [], 64 * KiB)


_SPECS = {}
for _n in UNI_NAMES:
    _SPECS[_n] = _uni
_SPECS["odd-64k"] = _odd
_SPECS["odd-64k-v2"] = _odd
_SPECS["odd-64k-tail"] = _odd_tail_only
_SPECS["frag-backward"] = _frag
_SPECS["frag-forward"] = _frag
for _n in CONV_NAMES:
    _SPECS[_n] = _conv
_SPECS["chain-mid"] = _chain_mid
_SPECS["chain-top"] = _chain_top
_SPECS["chain-small"] = _chain_small
_SPECS["chain-probe"] = _chain_probe
_SPECS["tree-over"] = _tree
for _n in PREALLOC_NAMES:
    _SPECS[_n] = _prealloc
_SPECS["snapshot"] = _snapshot
_SPECS["petabyte"] = _petabyte
for _n in CORPUS_NAMES:
    _SPECS[_n] = _corpus

NAMES = list(_SPECS)
# everything small enough to read whole / convert in a blink
SMALL_NAMES = [n for n in NAMES if n != "petabyte" and not n.startswith("corpus-")]
CORPUS = CORPUS_NAMES


# --------------------------------------------------------------------------
# the store

class Store:
    """Lazily built images plus memoized qemu answers (never modify an image)."""

    def __init__(self, root):
        self.root = os.path.abspath(os.fspath(root))
        self._built: Dict[str, Built] = {}
        self._json: Dict[tuple, str] = {}
        self._human: Dict[tuple, subprocess.CompletedProcess] = {}
        self._raw: Dict[str, str] = {}
        self._bytes: Dict[str, bytes] = {}
        self._lock = threading.Lock()
        self._name_locks: Dict[str, threading.Lock] = {}

    def path(self, *parts):
        return os.path.join(self.root, *parts)

    def get(self, name) -> Built:
        if name not in _SPECS:
            raise KeyError(name)
        with self._lock:
            lock = self._name_locks.setdefault(name, threading.Lock())
        with lock:
            if name not in self._built:
                b = _SPECS[name](self, name)
                if not name.startswith(("corpus-", "prealloc-falloc", "prealloc-full")):
                    # (falloc/full: qemu's heuristic never asks the host
                    # file about them, and their unwritten extents are the point)
                    dig_holes(b.path)
                self._built[name] = b
        return self._built[name]

    def build_all(self, names=None, workers=4):
        """Build many images at once (qemu spends most of its time waiting)."""
        from concurrent.futures import ThreadPoolExecutor

        names = list(NAMES if names is None else names)
        # the slow corpus first, so that it overlaps with everything else
        names.sort(key=lambda n: not n.startswith("corpus-"))
        with ThreadPoolExecutor(workers) as ex:
            for f in [ex.submit(self.get, n) for n in names]:
                f.result()

    # -- oracle ---------------------------------------------------------
    def qemu_json(self, path, start=None, length=None, cwd=None) -> str:
        key = (path, start, length, cwd)
        if key not in self._json:
            args = ["map", "--output=json"]
            if start is not None:
                args += ["--start-offset", str(start)]
            if length is not None:
                args += ["--max-length", str(length)]
            self._json[key] = qemu_img(*(args + [path]), cwd=cwd).stdout
        return self._json[key]

    def qemu_human(self, path, start=None, length=None, cwd=None) -> subprocess.CompletedProcess:
        """CompletedProcess of ``qemu-img map`` (human); may fail (compressed clusters)."""
        key = (path, start, length, cwd)
        if key not in self._human:
            args = ["map"]
            if start is not None:
                args += ["--start-offset", str(start)]
            if length is not None:
                args += ["--max-length", str(length)]
            self._human[key] = qemu_img(*(args + [path]), cwd=cwd, check=False)
        return self._human[key]

    def prefetch(self, json_keys=(), human_keys=(), workers=4):
        """Run many ``qemu-img map`` calls in parallel (each is ~90% waiting):
        keys are (path, start, length[, cwd]) tuples."""
        from concurrent.futures import ThreadPoolExecutor

        jobs = [(self.qemu_json, k) for k in json_keys] + [(self.qemu_human, k) for k in human_keys]
        with ThreadPoolExecutor(workers) as ex:
            for f in [ex.submit(fn, *k) for fn, k in jobs]:
                f.result()

    def raw(self, name) -> str:
        """Path of ``qemu-img convert -O raw`` of the image (its guest bytes)."""
        if name not in self._raw:
            b = self.get(name)
            out = self.path("oracle-raw", name + ".raw")
            os.makedirs(os.path.dirname(out), exist_ok=True)
            qemu_img("convert", "-O", "raw", b.path, out)
            self._raw[name] = out
        return self._raw[name]

    def raw_bytes(self, name) -> bytes:
        """The guest bytes, in memory (small images only)."""
        if name not in self._bytes:
            with open(self.raw(name), "rb") as f:
                data = f.read()
            assert len(data) == self.get(name).size, (name, len(data))
            self._bytes[name] = data
        return self._bytes[name]

    def raw_read(self, name, off, n) -> bytes:
        if name in self._bytes:
            return self._bytes[name][off:off + n]
        with open(self.raw(name), "rb") as f:
            f.seek(off)
            return f.read(n)


_STORE: Optional[Store] = None


def store(tmp_path_factory) -> Store:
    """The session's Store (one per process, shared by every test module)."""
    global _STORE
    if _STORE is None:
        _STORE = Store(tmp_path_factory.mktemp("qcow2-images"))
    return _STORE


# --------------------------------------------------------------------------
# helpers shared by the tests

def parse_json(text):
    return json.loads(text)


def covering(entries, offset):
    for d in entries:
        if d["start"] <= offset < d["start"] + d["length"]:
            return d
    return None


def qemu_chain(path, cwd=None):
    """[(filename, format), ...] of the backing files, as qemu-img info names them."""
    info = json.loads(qemu_img("info", "--backing-chain", "--output=json", path, cwd=cwd).stdout)
    return [(d["filename"], d["format"]) for d in info[1:]]


if __name__ == "__main__":  # pragma: no cover - manual reproduction helper
    name, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    st = Store(out)
    b = st.get(name)
    print(b)
    print(qemu_img("map", "--output=json", b.path).stdout)
