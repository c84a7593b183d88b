"""Seeded raw images of every layout family (``KINDS``): the sources of the
map, block-status, plan and convert tests.

Every builder is a pure function of ``(path, seed)``: the same seed always
produces the same logical layout (bytes + which ranges were written), so a
failing parametrized test can be reproduced with::

    python3 -m tests.gen.raw_kinds KIND SEED /tmp/out.img

Sparse files are built with ``os.ftruncate`` + ``os.pwrite``; the ``qemu_io``
kind uses ``qemu-io -f raw -c "write -P ..." -c "write -z ..."`` instead.
Nothing here decides what the *map* of an image is: the file system decides
(SEEK_DATA/SEEK_HOLE granularity, punching, ...) and ``qemu-img map`` is the
oracle for the tests.
"""

import os
import random
import sys
from typing import NamedTuple

from ..oracles import qemu_io
from ..units import GiB, KiB, MiB
from .sparse import BLOCK, SparseFile, pattern

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


def _odd_size(rng, lo, hi):
    """A size in [lo, hi] that is not a multiple of 512."""
    while True:
        s = rng.randint(lo, hi)
        if s % 512:
            return s


# --------------------------------------------------------------------------
# builders: each returns the image size in bytes

def build_empty(path, rng):
    with SparseFile(path, 0):
        pass
    return 0


def build_all_hole(path, rng):
    size = _odd_size(rng, 1, 6 * MiB)
    with SparseFile(path, size):
        pass
    return size


def build_all_data(path, rng):
    size = _odd_size(rng, 1, 1 * MiB + 12345)
    with SparseFile(path, size) as f:
        f.write(0, pattern(rng, size))
    return size


def build_last_byte(path, rng):
    size = rng.choice([_odd_size(rng, 513, 5 * MiB), rng.randint(1, 3 * MiB // BLOCK) * BLOCK])
    with SparseFile(path, size) as f:
        f.write(size - 1, bytes([rng.randint(1, 255)]))
    return size


def build_first_byte(path, rng):
    size = _odd_size(rng, 2 * BLOCK, 3 * MiB)
    with SparseFile(path, size) as f:
        f.write(0, bytes([rng.randint(1, 255)]))
    return size


def build_holes_and_data(path, rng):
    size = _odd_size(rng, 512 * KiB, 6 * MiB)
    with SparseFile(path, size) as f:
        pos = rng.choice([0, rng.randint(0, 64 * KiB)])
        while pos < size:
            n = min(size - pos, rng.choice([1, 100, BLOCK, 3 * BLOCK + 17, 64 * KiB, rng.randint(1, 300 * KiB)]))
            f.write(pos, pattern(rng, n))
            pos += n + rng.choice([BLOCK, 2 * BLOCK, 5000, 64 * KiB, rng.randint(1, 1 * MiB)])
    return size


def build_alloc_zeros(path, rng):
    size = _odd_size(rng, 256 * KiB, 3 * MiB)
    with SparseFile(path, size) as f:
        pos = rng.randint(0, 3) * BLOCK
        while pos < size:
            n = min(size - pos, rng.randint(BLOCK, 256 * KiB))
            r = rng.random()
            if r < 0.3:
                data = bytes(n)  # a whole run of written (allocated) zeros
            else:
                data = pattern(rng, n, zero_runs=True)
            f.write(pos, data)
            pos += n + rng.choice([0, BLOCK, 3 * BLOCK, rng.randint(1, 200 * KiB)])
    return size


def build_odd_size(path, rng):
    size = _odd_size(rng, 3 * BLOCK, 2 * MiB)
    with SparseFile(path, size) as f:
        # Data in the last partial 4k block (and maybe the partial sector),
        # plus something somewhere in the middle.
        tail = rng.randint(1, min(size, 3 * BLOCK))
        f.write(size - tail, pattern(rng, tail))
        mid = rng.randint(0, max(0, size - tail - 2 * BLOCK))
        f.write(mid, pattern(rng, rng.randint(1, BLOCK)))
    return size


def build_small_extents(path, rng):
    nblocks = rng.randint(32, 256)
    tail = rng.choice([0, 0, rng.randint(1, BLOCK - 1)])
    size = nblocks * BLOCK + tail
    first = rng.randint(0, 1)
    with SparseFile(path, size) as f:
        for b in range(nblocks):
            if b % 2 == first:
                f.write(b * BLOCK, pattern(rng, BLOCK))
        if tail and nblocks % 2 == first:
            f.write(nblocks * BLOCK, pattern(rng, tail))
    return size


def build_unaligned(path, rng):
    size = _odd_size(rng, 1 * MiB, 4 * MiB)
    with SparseFile(path, size) as f:
        for _ in range(rng.randint(3, 20)):
            off = rng.randint(0, size - 1)
            if off % 512 == 0:
                off += rng.randint(1, 511)
            off = min(off, size - 1)
            n = min(size - off, rng.choice([1, 7, 13, 511, 513, 4095, 4097, rng.randint(1, 20000)]))
            f.write(off, pattern(rng, n))
    return size


def build_qemu_io(path, rng):
    # qemu's "write -z" on a raw file may leave *unwritten* extents (zero
    # range / punch + fallocate), which ext4's SEEK_DATA reports as data once
    # their pages are cached, i.e. after anybody reads them.  Format probing
    # reads the first sector, so the first 256 KiB are plain written data and
    # zero writes stay behind them (see build_fallocated).
    size = rng.choice([4 * MiB, 4 * MiB + 512, _odd_size(rng, 2 * MiB, 4 * MiB)])
    head = 256 * KiB
    with SparseFile(path, size) as f:
        f.write(0, pattern(rng, head))
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
    qemu_io(path, cmds, fmt="raw")
    return size


def build_fallocated(path, rng):
    # NB: on ext4, SEEK_DATA reports an unwritten (fallocated) extent as data
    # once its pages are in the page cache, i.e. after anybody *read* it.
    # Format probing reads the first sector (plus readahead), so the first
    # 256 KiB are always written data; nothing else in the map tests reads
    # these images.
    size = _odd_size(rng, 768 * KiB, 4 * MiB)
    with SparseFile(path, size) as f:
        head = 256 * KiB
        f.write(0, pattern(rng, head))
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
                f.write(pos, pattern(rng, n))
            pos += n + rng.choice([0, BLOCK, rng.randint(1, 128 * KiB)])
    return size


def build_tiny(path, rng):
    size = rng.randint(1, 511)
    variant = rng.randint(0, 2)
    with SparseFile(path, size) as f:
        if variant == 1:    # data somewhere up to EOF
            off = rng.randint(0, size - 1)
            f.write(off, pattern(rng, size - off))
        elif variant == 2:  # a few bytes in the middle
            off = rng.randint(0, size - 1)
            f.write(off, pattern(rng, rng.randint(1, size - off)))
        # variant 0: all hole
    return size


def build_big_sparse(path, rng):
    size = 4 * GiB + rng.randint(1, 3 * MiB)
    if size % 512 == 0:
        size += 1
    with SparseFile(path, size) as f:
        for base in (0, 2 * GiB - BLOCK, 4 * GiB - 10, size - 1):
            off = max(0, base + rng.randint(-2 * BLOCK, 2 * BLOCK))
            off = min(off, size - 1)
            f.write(off, pattern(rng, min(size - off, rng.randint(1, 3 * BLOCK))))
    return size


BUILDERS = {k: globals()["build_" + k] for k in KINDS}


# --------------------------------------------------------------------------

def make_image(path, kind, seed):
    """Build image `kind` with `seed` at `path`; return its size in bytes."""
    if kind not in BUILDERS:
        raise ValueError("unknown image kind %r" % (kind,))
    size = BUILDERS[kind](os.fspath(path), _rng(kind, seed))
    st = os.stat(path)
    assert st.st_size == size, (kind, seed, st.st_size, size)
    return size


def needs_qemu_io(kind):
    return kind == "qemu_io"


class GenImage(NamedTuple):
    path: str
    size: int
    kind: str
    seed: int


if __name__ == "__main__":  # pragma: no cover - manual reproduction helper
    k, s, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    print(make_image(out, k, s))
