"""Helpers for tests/test_qcow2_write.py: qcow2 images written by imgcopy,
checked with qemu-img as the oracle.

Nothing here imports imgcopy at import time.  Every helper takes plain paths
and runs ``qemu-img`` (check / compare / info / map / convert) or reads the
qcow2 header and metadata tables itself (to count refcount blocks and L2
tables, and to evaluate qemu's metadata-preallocation heuristic).
"""

import json
import os
import random
import re
import shutil
import struct
import subprocess
from typing import List, NamedTuple

import pytest

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

QEMU_IMG = shutil.which("qemu-img")
NO_QEMU_REASON = "qemu-img not found on PATH (install qemu-utils); it is the test oracle"


def require_qemu_img():
    if QEMU_IMG is None:
        pytest.skip(NO_QEMU_REASON)


def qemu_img(*args, check=True) -> subprocess.CompletedProcess:
    p = subprocess.run([QEMU_IMG] + [os.fspath(a) if not isinstance(a, str) else a for a in args],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if check and p.returncode != 0:
        raise AssertionError("qemu-img %s failed (rc=%d):\n%s%s" % (
            " ".join(map(str, args)), p.returncode, p.stdout[-3000:], p.stderr[-3000:]))
    return p


def round_up(n, a):
    return (n + a - 1) // a * a


# --------------------------------------------------------------------------
# source images

def padded_size(size):
    """The virtual size qemu gives a raw file: rounded up to 512 bytes."""
    return round_up(size, 512)


def pad_to_sector(path):
    """Extend a raw file to a multiple of 512 bytes (the extension reads as
    zeros, as qemu reads the tail past EOF); returns the new size."""
    size = os.path.getsize(path)
    if size % 512:
        os.truncate(path, padded_size(size))
    return padded_size(size)


def _blob(rng, n):
    return rng.randbytes(n).replace(b"\0", b"\x5a")


def _text(rng, n):
    """Compressible, zero-free bytes (deflate shrinks them)."""
    alpha = b"the quick brown fox jumps over a lazy dog 0123456789\n"
    return bytes(rng.choices(alpha, k=min(n, 4096))) * (n // 4096 + 1)


def write_runs(path, size, runs):
    """A sparse file of `size` bytes with [(offset, bytes), ...] written."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.ftruncate(fd, size)
        for off, buf in runs:
            assert off + len(buf) <= size
            os.pwrite(fd, buf, off)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return size


def build_many_extents(path, seed=1, runs=5000, max_run=1536, gap=(4096, 8192)):
    """~`runs` small data runs (1..max_run bytes, random and compressible
    content), each in its own 4 KiB file-system block, separated by holes of
    at least one block: thousands of extents, a few MiB of data."""
    rng = random.Random("qcow2-write-many-%d" % seed)
    out = []
    pos = rng.randint(0, 3) * 4096
    for i in range(runs):
        n = rng.randint(1, max_run)
        start = pos + rng.randint(0, 4096 - n) if n < 4096 else pos
        data = _blob(rng, n) if i % 3 else _text(rng, n)[:n]
        out.append((start, data))
        pos = round_up(start + n, 4096) + rng.randrange(gap[0], gap[1] + 1, 4096)
    size = round_up(pos, 64 * KiB)
    return write_runs(path, size, out)


def build_dense(path, seed=2, size=48 * MiB, data=40 * MiB):
    """`size` bytes, about `data` of them data (random / compressible /
    written zeros) in runs of 4 KiB .. 1 MiB, the rest holes."""
    rng = random.Random("qcow2-write-dense-%d" % seed)
    out = []
    pos, written = 0, 0
    hole_budget = size - data
    while pos < size and written < data:
        n = min(size - pos, rng.randrange(4096, 1 * MiB + 1, 512))
        r = rng.random()
        if r < 0.6:
            buf = _blob(rng, n)
        elif r < 0.9:
            buf = _text(rng, n)[:n]
        else:
            buf = bytes(n)
        out.append((pos, buf))
        written += n
        pos += n
        if hole_budget > 0 and rng.random() < 0.5:
            h = min(hole_budget, rng.randrange(4096, 512 * KiB + 1, 4096))
            hole_budget -= h
            pos += h
    return write_runs(path, max(size, round_up(pos, 512)), [(o, b[:size - o]) for o, b in out
                                                            if o < size])


def build_partial_clusters(path, seed=3, size=4 * MiB):
    """Data runs that start and end inside 64 KiB clusters (4 KiB aligned),
    with holes of 4..60 KiB between them: every cluster is written by two
    or more requests (the shape that needs the writer's per-cluster care)."""
    rng = random.Random("qcow2-write-partial-%d" % seed)
    out = []
    pos = rng.randrange(0, 64 * KiB, 4096)
    while pos < size:
        n = min(size - pos, rng.randrange(4096, 100 * KiB, 4096))
        out.append((pos, _blob(rng, n)))
        pos += n + rng.randrange(4096, 61 * KiB, 4096)
    return write_runs(path, size, out)


# --------------------------------------------------------------------------
# the oracle

class Check(NamedTuple):
    text: str           # qemu-img check (human)
    data: dict          # qemu-img check --output=json
    fragmented: float   # percent, from the human output


def qemu_check(path) -> Check:
    """`qemu-img check` must exit 0 and report no leak, corruption or
    OFLAG_COPIED error, in both output formats."""
    p = qemu_img("check", "-f", "qcow2", path, check=False)
    text = p.stdout + p.stderr
    assert p.returncode == 0, "qemu-img check %s: rc=%d\n%s" % (path, p.returncode, text[-3000:])
    assert "No errors were found on the image." in p.stdout, text[-3000:]
    for bad in ("leaked", "Leaked", "ERROR", "corrupt", "OFLAG_COPIED", "Warning"):
        assert bad not in text, (bad, text[-3000:])
    j = qemu_img("check", "-f", "qcow2", "--output=json", path, check=False)
    assert j.returncode == 0, (j.returncode, j.stdout, j.stderr)
    data = json.loads(j.stdout)
    for key in ("leaks", "corruptions", "check-errors", "leaks-fixed", "corruptions-fixed"):
        assert data.get(key, 0) == 0, (key, data)
    m = re.search(r"([0-9.]+)% fragmented", p.stdout)
    frag = float(m.group(1)) if m else 0.0
    return Check(p.stdout, data, frag)


def qemu_info(path, fmt=None) -> dict:
    args = ["info", "-U", "--output=json"]
    if fmt:
        args += ["-f", fmt]
    return json.loads(qemu_img(*(args + [path])).stdout)


def assert_same_content(src, dst, src_fmt="raw"):
    """qemu-img compare SRC(src_fmt) DST(qcow2): identical."""
    p = qemu_img("compare", "-U", "-f", src_fmt, "-F", "qcow2", src, dst, check=False)
    assert p.returncode == 0 and "Images are identical" in p.stdout, (
        "qemu-img compare %s %s: rc=%d %s%s" % (src, dst, p.returncode, p.stdout, p.stderr))


def assert_converts_back(src, dst, tmpdir, src_fmt="raw"):
    """qemu-img converts imgcopy's image back to raw, identical to the source."""
    back = os.path.join(os.fspath(tmpdir), os.path.basename(os.fspath(dst)) + ".back.raw")
    try:
        qemu_img("convert", "-f", "qcow2", "-O", "raw", dst, back)
        p = qemu_img("compare", "-U", "-f", "raw", "-F", src_fmt, back, src, check=False)
        assert p.returncode == 0, ("round trip", p.stdout, p.stderr)
    finally:
        if os.path.exists(back):
            os.unlink(back)


def verify_image(src, dst, *, virtual_size, cluster_size=64 * KiB, compat="1.1",
                 src_fmt="raw", tmpdir=None, roundtrip=False, compressed=False) -> Check:
    """Everything every image imgcopy writes must satisfy.  Compressed
    images are compared through ``qemu-img convert -O raw`` (qemu-img
    compare of a raw file against a compressed image takes seconds)."""
    info = qemu_info(dst)
    assert info["format"] == "qcow2", info
    assert info["virtual-size"] == virtual_size, (info["virtual-size"], virtual_size)
    assert info["cluster-size"] == cluster_size, info
    fs = info["format-specific"]["data"]
    assert fs["compat"] == compat, fs
    if compat == "1.1":
        assert fs.get("corrupt") is False, fs
    assert "backing-filename" not in info, info
    c = qemu_check(dst)
    if compressed:
        assert_converts_back(src, dst, tmpdir or os.path.dirname(os.fspath(dst)), src_fmt)
        return c
    assert_same_content(src, dst, src_fmt)
    if roundtrip:
        assert_converts_back(src, dst, tmpdir or os.path.dirname(os.fspath(dst)), src_fmt)
    return c


# -- maps --------------------------------------------------------------------

LAYOUT_FIELDS = ("start", "length", "depth", "present", "zero", "data")


def qemu_map(path, fmt="qcow2") -> List[dict]:
    return json.loads(qemu_img("map", "-U", "-f", fmt, "--output=json", path).stdout)


def layout(entries) -> List[tuple]:
    """Map entries on start/length/depth/present/zero/data (offsets dropped),
    neighbours with equal flags merged (qemu merges only host-contiguous ones)."""
    out: List[list] = []
    for d in entries:
        t = [d[f] for f in LAYOUT_FIELDS]
        if out and out[-1][0] + out[-1][1] == t[0] and out[-1][2:] == t[2:]:
            out[-1][1] += t[1]
        else:
            out.append(t)
    return [tuple(t) for t in out]


def cluster_layout(entries, cluster_size, size) -> List[tuple]:
    """For every cluster, the sorted set of (present, zero, data) states
    that qemu-img map reports inside it."""
    n = (size + cluster_size - 1) // cluster_size
    out: List[set] = [set() for _ in range(n)]
    for d in entries:
        if d["start"] >= size:
            continue
        first = d["start"] // cluster_size
        last = (min(d["start"] + d["length"], size) - 1) // cluster_size
        state = (d["present"], d["zero"], d["data"])
        for c in range(first, last + 1):
            out[c].add(state)
    return [tuple(sorted(s)) for s in out]


def diff_layouts(a, b, limit=5) -> str:
    lines = ["%d vs %d entries" % (len(a), len(b))]
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            lines.append("#%d: %r != %r" % (i, x, y))
            if len(lines) > limit:
                break
    return "\n".join(lines)


def host_order_violations(entries) -> List[tuple]:
    """Pairs of guest-ordered data extents whose host offsets go backwards
    or overlap (compressed extents have no offset and are skipped)."""
    bad = []
    prev = None
    for d in sorted(entries, key=lambda e: e["start"]):
        if "offset" not in d or not d["data"]:
            continue
        if prev is not None and d["offset"] < prev["offset"] + prev["length"]:
            bad.append((prev, d))
        prev = d
    return bad


# -- the file's own metadata -------------------------------------------------

class Header(NamedTuple):
    version: int
    cluster_bits: int
    size: int
    l1_size: int
    l1_offset: int
    rc_table_offset: int
    rc_table_clusters: int
    incompatible: int
    refcount_order: int

    @property
    def cluster_size(self):
        return 1 << self.cluster_bits


def read_header(path) -> Header:
    with open(path, "rb") as f:
        h = f.read(104)
    (magic, version, _bo, _bs, cbits, size, _crypt, l1_size, l1_off, rt_off, rt_cl,
     _nsnap, _snap_off) = struct.unpack(">4sIQIIQIIQQIIQ", h[:72])
    assert magic == b"QFI\xfb", magic
    incompat, order = 0, 4
    if version >= 3:
        incompat = struct.unpack(">Q", h[72:80])[0]
        order = struct.unpack(">I", h[96:100])[0]
    return Header(version, cbits, size, l1_size, l1_off, rt_off, rt_cl, incompat, order)


class Tables(NamedTuple):
    header: Header
    l2_tables: int            # L1 entries pointing at an L2 table
    refcount_blocks: int      # refcount table entries pointing at a block
    refcounted_clusters: int  # host clusters with a refcount > 0


def read_tables(path) -> Tables:
    h = read_header(path)
    cs = h.cluster_size
    assert h.refcount_order == 4, "only 16-bit refcounts are decoded here"
    with open(path, "rb") as f:
        f.seek(h.l1_offset)
        l1 = struct.unpack(">%dQ" % h.l1_size, f.read(8 * h.l1_size))
        l2_tables = sum(1 for e in l1 if e & 0x00FFFFFFFFFFFE00)
        f.seek(h.rc_table_offset)
        n = h.rc_table_clusters * cs // 8
        rt = struct.unpack(">%dQ" % n, f.read(8 * n))
        blocks = [e & ~0x1FF for e in rt if e & ~0x1FF]
        counted = 0
        for b in blocks:
            f.seek(b)
            counted += sum(1 for r in struct.unpack(">%dH" % (cs // 2), f.read(cs)) if r)
    return Tables(h, l2_tables, len(blocks), counted)


def qemu_thinks_preallocated(path) -> bool:
    """qemu's qcow2_detect_metadata_preallocation() (block/qcow2-refcount.c):
    more refcounted clusters than ~the host file's allocated clusters means
    "metadata preallocation", and qemu then reports data clusters over host
    holes as zero.  Evaluated the way qemu does, from st_blocks."""
    t = read_tables(path)
    real_clusters = os.stat(path).st_blocks * 512 // t.header.cluster_size
    threshold = max(real_clusters * 10 // 9, real_clusters + 2)
    return t.refcounted_clusters >= threshold


# --------------------------------------------------------------------------
# tmpfs for ENOSPC

class Tmpfs:
    """A small tmpfs mounted at `path` (root only); unmounted on exit."""

    def __init__(self, path, size="16m"):
        self.path = os.fspath(path)
        self.size = size
        self.mounted = False

    def __enter__(self):
        os.makedirs(self.path, exist_ok=True)
        if os.geteuid() != 0 or shutil.which("mount") is None:
            pytest.skip("mounting a tmpfs needs root")
        p = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=%s" % self.size, "tmpfs",
                            self.path], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
        if p.returncode != 0:
            pytest.skip("cannot mount a tmpfs: %s" % p.stderr.strip())
        self.mounted = True
        return self

    def __exit__(self, *exc):
        if self.mounted:
            p = subprocess.run(["umount", self.path], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
            if p.returncode != 0:
                subprocess.run(["umount", "-l", self.path])
        return False
