"""Seeded random raw image builders for the imgcopy test-suite.

Every builder is a pure function of ``(path, seed)``: the same seed always
produces the same logical layout (bytes + which ranges were written), so a
failing parametrized test can be reproduced with::

    python3 tests/imagegen.py KIND SEED /tmp/out.img

Sparse files are built with ``os.ftruncate`` + ``os.pwrite``; the ``qemu_io``
kind uses ``qemu-io -f raw -c "write -P ..." -c "write -z ..."`` instead.
Nothing here decides what the *map* of an image is: the file system decides
(SEEK_DATA/SEEK_HOLE granularity, punching, ...) and ``qemu-img map`` is the
oracle for the tests.
"""

import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
from typing import List, NamedTuple, Optional

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB
BLOCK = 4096

# The layout families.  Each name maps to a builder below.
KINDS = (
    "empty",            # 0-byte file
    "all_hole",         # ftruncate only, odd size
    "all_data",         # every byte written, odd size
    "last_byte",        # a hole with data only in the very last byte
    "first_byte",       # data only in the first byte, then a hole
    "holes_and_data",   # random mix of data runs and holes
    "alloc_zeros",      # data runs containing runs of *written* zeros
    "odd_size",         # size not a multiple of 512 (nor 4096), data near EOF
    "small_extents",    # alternating 4k data / 4k hole
    "unaligned",        # small writes at unaligned offsets
    "qemu_io",          # built with qemu-io write -P / write -z
    "fallocated",       # posix_fallocate'd (unwritten) ranges mixed with data
    "tiny",             # < 512 bytes
    "big_sparse",       # > 4 GiB virtual size, a little data around 2/4 GiB
)

# Kinds whose virtual size is small enough for exhaustive per-4096 probing.
SMALL_LIMIT = 8 * MiB


def _rng(kind, seed):
    # Independent stream per (kind, seed); str seeds are hashed stably.
    return random.Random("imgcopy-%s-%d" % (kind, seed))


def _pattern(rng, n, zero_runs=False):
    """Return n bytes of non-zero-ish random data (optionally with zero runs)."""
    if n <= 0:
        return b""
    # 1..255 so that a data run never accidentally ends in a zero byte
    # unless we ask for zeros explicitly.
    buf = bytearray(rng.randbytes(n).replace(b"\0", b"\xa5"))
    if zero_runs and n > 2:
        for _ in range(rng.randint(1, 4)):
            zlen = rng.randint(1, max(1, min(n // 2, 3 * BLOCK)))
            zoff = rng.randint(0, n - zlen)
            buf[zoff:zoff + zlen] = bytes(zlen)
    return bytes(buf)


class _File:
    """Tiny helper: a file opened for building, closed (and fsynced) at exit."""

    def __init__(self, path, size):
        self.path = os.fspath(path)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        os.ftruncate(self.fd, size)
        self.size = size

    def write(self, off, data):
        assert 0 <= off and off + len(data) <= self.size, (off, len(data), self.size)
        n = os.pwrite(self.fd, data, off)
        assert n == len(data)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        try:
            os.fsync(self.fd)
            # start from a clean page cache (only clean pages are dropped)
            os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(self.fd)
        return False


def _odd_size(rng, lo, hi):
    """A size in [lo, hi] that is not a multiple of 512."""
    while True:
        s = rng.randint(lo, hi)
        if s % 512:
            return s


# --------------------------------------------------------------------------
# builders: each returns the image size in bytes

def build_empty(path, rng):
    with _File(path, 0):
        pass
    return 0


def build_all_hole(path, rng):
    size = _odd_size(rng, 1, 6 * MiB)
    with _File(path, size):
        pass
    return size


def build_all_data(path, rng):
    size = _odd_size(rng, 1, 1 * MiB + 12345)
    with _File(path, size) as f:
        f.write(0, _pattern(rng, size))
    return size


def build_last_byte(path, rng):
    size = rng.choice([_odd_size(rng, 513, 5 * MiB), rng.randint(1, 3 * MiB // BLOCK) * BLOCK])
    with _File(path, size) as f:
        f.write(size - 1, bytes([rng.randint(1, 255)]))
    return size


def build_first_byte(path, rng):
    size = _odd_size(rng, 2 * BLOCK, 3 * MiB)
    with _File(path, size) as f:
        f.write(0, bytes([rng.randint(1, 255)]))
    return size


def build_holes_and_data(path, rng):
    size = _odd_size(rng, 512 * KiB, 6 * MiB)
    with _File(path, size) as f:
        pos = rng.choice([0, rng.randint(0, 64 * KiB)])
        while pos < size:
            n = min(size - pos, rng.choice([1, 100, BLOCK, 3 * BLOCK + 17, 64 * KiB, rng.randint(1, 300 * KiB)]))
            f.write(pos, _pattern(rng, n))
            pos += n + rng.choice([BLOCK, 2 * BLOCK, 5000, 64 * KiB, rng.randint(1, 1 * MiB)])
    return size


def build_alloc_zeros(path, rng):
    size = _odd_size(rng, 256 * KiB, 3 * MiB)
    with _File(path, size) as f:
        pos = rng.randint(0, 3) * BLOCK
        while pos < size:
            n = min(size - pos, rng.randint(BLOCK, 256 * KiB))
            r = rng.random()
            if r < 0.3:
                data = bytes(n)  # a whole run of written (allocated) zeros
            else:
                data = _pattern(rng, n, zero_runs=True)
            f.write(pos, data)
            pos += n + rng.choice([0, BLOCK, 3 * BLOCK, rng.randint(1, 200 * KiB)])
    return size


def build_odd_size(path, rng):
    size = _odd_size(rng, 3 * BLOCK, 2 * MiB)
    with _File(path, size) as f:
        # Data in the last partial 4k block (and maybe the partial sector),
        # plus something somewhere in the middle.
        tail = rng.randint(1, min(size, 3 * BLOCK))
        f.write(size - tail, _pattern(rng, tail))
        mid = rng.randint(0, max(0, size - tail - 2 * BLOCK))
        f.write(mid, _pattern(rng, rng.randint(1, BLOCK)))
    return size


def build_small_extents(path, rng):
    nblocks = rng.randint(32, 256)
    tail = rng.choice([0, 0, rng.randint(1, BLOCK - 1)])
    size = nblocks * BLOCK + tail
    first = rng.randint(0, 1)
    with _File(path, size) as f:
        for b in range(nblocks):
            if b % 2 == first:
                f.write(b * BLOCK, _pattern(rng, BLOCK))
        if tail and nblocks % 2 == first:
            f.write(nblocks * BLOCK, _pattern(rng, tail))
    return size


def build_unaligned(path, rng):
    size = _odd_size(rng, 1 * MiB, 4 * MiB)
    with _File(path, size) as f:
        for _ in range(rng.randint(3, 20)):
            off = rng.randint(0, size - 1)
            if off % 512 == 0:
                off += rng.randint(1, 511)
            off = min(off, size - 1)
            n = min(size - off, rng.choice([1, 7, 13, 511, 513, 4095, 4097, rng.randint(1, 20000)]))
            f.write(off, _pattern(rng, n))
    return size


def build_qemu_io(path, rng):
    # qemu's "write -z" on a raw file may leave *unwritten* extents (zero
    # range / punch + fallocate), which ext4's SEEK_DATA reports as data once
    # their pages are cached, i.e. after anybody reads them.  Format probing
    # reads the first sector, so the first 256 KiB are plain written data and
    # zero writes stay behind them (see build_fallocated).
    size = rng.choice([4 * MiB, 4 * MiB + 512, _odd_size(rng, 2 * MiB, 4 * MiB)])
    head = 256 * KiB
    with _File(path, size) as f:
        f.write(0, _pattern(rng, head))
    cmds = []
    for _ in range(rng.randint(2, 8)):
        off = rng.randint(head, size - 1)
        if rng.random() < 0.5:
            off -= off % 512
        n = min(size - off, rng.choice([512, BLOCK, 64 * KiB, rng.randint(1, 512 * KiB)]))
        if n <= 0:
            continue
        if rng.random() < 0.65:
            cmds.append("write -P 0x%02x %d %d" % (rng.randint(1, 255), off, n))
        else:
            cmds.append("write -z %d %d" % (off, n))
    # Always at least one zero write over written data.
    off = rng.randint(head, size // 2 + head)
    off -= off % BLOCK
    n = min(size - off, rng.randint(1, 64) * BLOCK)
    cmds.append("write -P 0xab %d %d" % (off, n))
    z = max(BLOCK, n // 2)
    z -= z % BLOCK
    cmds.append("write -z %d %d" % (off, min(z, size - off)))
    qemu_io(path, cmds)
    return size


def build_fallocated(path, rng):
    # NB: on ext4, SEEK_DATA reports an unwritten (fallocated) extent as data
    # once its pages are in the page cache, i.e. after anybody *read* it.
    # Format probing reads the first sector (plus readahead), so the first
    # 256 KiB are always written data; nothing else in the map tests reads
    # these images.
    size = _odd_size(rng, 768 * KiB, 4 * MiB)
    with _File(path, size) as f:
        head = 256 * KiB
        f.write(0, _pattern(rng, head))
        pos = head + rng.choice([0, BLOCK, rng.randint(1, 64 * KiB)])
        while pos < size:
            n = min(size - pos, rng.randint(BLOCK, 256 * KiB))
            r = rng.random()
            if r < 0.4:
                try:
                    os.posix_fallocate(f.fd, pos, n)
                except OSError:
                    f.write(pos, bytes(n))
            elif r < 0.8:
                f.write(pos, _pattern(rng, n))
            pos += n + rng.choice([0, BLOCK, rng.randint(1, 128 * KiB)])
    return size


def build_tiny(path, rng):
    size = rng.randint(1, 511)
    variant = rng.randint(0, 2)
    with _File(path, size) as f:
        if variant == 1:    # data somewhere up to EOF
            off = rng.randint(0, size - 1)
            f.write(off, _pattern(rng, size - off))
        elif variant == 2:  # a few bytes in the middle
            off = rng.randint(0, size - 1)
            f.write(off, _pattern(rng, rng.randint(1, size - off)))
        # variant 0: all hole
    return size


def build_big_sparse(path, rng):
    size = 4 * GiB + rng.randint(1, 3 * MiB)
    if size % 512 == 0:
        size += 1
    with _File(path, size) as f:
        for base in (0, 2 * GiB - BLOCK, 4 * GiB - 10, size - 1):
            off = max(0, base + rng.randint(-2 * BLOCK, 2 * BLOCK))
            off = min(off, size - 1)
            f.write(off, _pattern(rng, min(size - off, rng.randint(1, 3 * BLOCK))))
    return size


BUILDERS = {k: globals()["build_" + k] for k in KINDS}


# --------------------------------------------------------------------------

def qemu_io(path, commands):
    """Run qemu-io on a raw image with a list of -c commands."""
    exe = shutil.which("qemu-io")
    if exe is None:
        raise RuntimeError("qemu-io not installed")
    args = [exe, "-f", "raw"]
    for c in commands:
        args += ["-c", c]
    args.append(os.fspath(path))
    p = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0 or "error" in p.stderr.lower() or "failed" in p.stdout.lower():
        raise RuntimeError("qemu-io %r failed (rc=%d): %s %s" % (commands, p.returncode, p.stdout, p.stderr))
    return p.stdout


def make_image(path, kind, seed):
    """Build image `kind` with `seed` at `path`; return its size in bytes."""
    if kind not in BUILDERS:
        raise ValueError("unknown image kind %r" % (kind,))
    size = BUILDERS[kind](os.fspath(path), _rng(kind, seed))
    st = os.stat(path)
    assert st.st_size == size, (kind, seed, st.st_size, size)
    return size


def make_sparse(path, size, data=()):
    """Build a sparse file of `size` bytes with `data` = [(offset, bytes), ...]."""
    with _File(path, size) as f:
        for off, buf in data:
            f.write(off, buf)
    return size


def needs_qemu_io(kind):
    return kind == "qemu_io"


# --------------------------------------------------------------------------
# qemu-img oracle helpers (re-exported by conftest.py as fixtures)

QEMU_IMG = shutil.which("qemu-img")
QEMU_IO = shutil.which("qemu-io")
NO_QEMU_REASON = "qemu-img not found on PATH (install qemu-utils); it is the test oracle"
NO_QEMU_IO_REASON = "qemu-io not found on PATH (install qemu-utils)"


class QemuMap(NamedTuple):
    """Result of ``qemu-img map --output=json``: parsed list and raw stdout."""
    extents: list
    text: str


# Field order of imgcopy.Extent
FIELDS = ("start", "length", "depth", "present", "zero", "data", "offset")


def _require_qemu_img():
    if QEMU_IMG is None:
        import pytest

        pytest.skip(NO_QEMU_REASON)


def qemu_img(*args, check=True):
    """Run qemu-img with args; return CompletedProcess (text mode)."""
    _require_qemu_img()
    p = subprocess.run([QEMU_IMG] + [os.fsdecode(a) if isinstance(a, bytes) else str(a) for a in args],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if check and p.returncode != 0:
        raise AssertionError("qemu-img %s failed (rc=%d): %s" % (" ".join(map(str, args)), p.returncode, p.stderr))
    return p


def map_args(path, fmt="raw", start=None, length=None, output=None):
    """Argument list for ``qemu-img map`` (without the program name)."""
    args = ["map", "-U"]
    if fmt is not None:
        args += ["-f", fmt]
    if output is not None:
        args.append("--output=%s" % output)
    if start is not None:
        args += ["--start-offset", str(start)]
    if length is not None:
        args += ["--max-length", str(length)]
    args.append(os.fspath(path))
    return args


def qemu_map(path, fmt="raw", start=None, length=None) -> QemuMap:
    """``qemu-img map -f FMT --output=json [--start-offset S] [--max-length L] PATH``.

    Returns QemuMap(extents=<parsed JSON list>, text=<stdout, exactly>).
    """
    p = qemu_img(*map_args(path, fmt, start, length, output="json"))
    return QemuMap(json.loads(p.stdout), p.stdout)


def qemu_map_human(path, fmt="raw", start=None, length=None) -> str:
    """stdout of ``qemu-img map -f FMT [...] PATH`` (human format)."""
    return qemu_img(*map_args(path, fmt, start, length)).stdout


def entry_tuple(d) -> tuple:
    """qemu JSON entry -> tuple in imgcopy.Extent field order (offset None if absent)."""
    return (d["start"], d["length"], d["depth"], d["present"], d["zero"], d["data"], d.get("offset"))


def extent_tuple(e) -> tuple:
    """imgcopy.Extent (by field name) or a 7-sequence -> plain tuple with normalised types."""
    if hasattr(e, "start"):
        s, l, depth, present, zero, data, off = (getattr(e, f) for f in FIELDS)
    else:
        s, l, depth, present, zero, data, off = e
    return (int(s), int(l), int(depth), bool(present), bool(zero), bool(data), None if off is None else int(off))


def clip_entries(entries, size, start=0, length=None) -> List[tuple]:
    """Clip qemu's JSON entries to [start, min(start+length, size)).

    qemu rounds a raw file's size up to 512 and reports the tail past EOF; the
    empty-range placeholder entry (length 0, present false) is dropped too.
    Offsets move with the clipped start when valid.
    """
    end = size if length is None else min(size, start + length)
    out = []
    for d in entries:
        s, l, depth, present, zero, data, off = entry_tuple(d)
        a, b = max(s, start), min(s + l, end)
        if b <= a:
            continue
        if off is not None:
            off += a - s
        out.append((a, b - a, depth, present, zero, data, off))
    return out


def find_covering(tuples, offset) -> Optional[tuple]:
    """The clipped qemu extent containing byte `offset`, or None."""
    for t in tuples:
        if t[0] <= offset < t[0] + t[1]:
            return t
    return None


def sha256_file(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class GenImage(NamedTuple):
    path: str
    size: int
    kind: str
    seed: int



if __name__ == "__main__":  # pragma: no cover - manual reproduction helper
    k, s, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    print(make_image(out, k, s))
