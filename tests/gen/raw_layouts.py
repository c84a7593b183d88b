"""Named raw layouts built for particular questions (each a pure function
of its arguments and seed); the layout families of tests/gen/raw_kinds.py
are the general ones.

- :func:`odd_1000001`: 1000001 bytes, written zeros of every size around
  the thresholds, a real hole;
- :func:`mixed_raw`: random (incompressible) runs, text-like (compressible)
  runs, written zeros and holes at unaligned offsets;
- :func:`random_runs`: random data, written zeros and holes of 512 B..300 KiB;
- :func:`zero_runs`: one data extent (< 2 MiB) with zero runs of many lengths;
- :func:`zeros_around_thresholds`: written zeros of every length around the
  sparse thresholds, between data;
- :func:`many_extents`, :func:`dense`, :func:`partial_clusters`: thousands
  of tiny extents; 40 of 48 MiB data; runs that start and end inside
  64 KiB clusters;
- :func:`segments_file` with :func:`mixed_segments` / :func:`zero_run_segments`:
  large files of data, written-zero and hole runs of 4 KiB..32 MiB.
"""

import os
import random

from ..units import KiB, MiB, round_up
from .sparse import blob, make_sparse, text


def odd_1000001(path, seed):
    """1000001 bytes: data at both ends, written zeros of every size in the
    middle (shorter and longer than each threshold), a real hole."""
    rng = random.Random("convert-odd-%d" % seed)
    size = 1000001
    data = [(0, blob(rng, 70000))]
    # written zeros inside a data run: 512, 1000, 4096, 8192, 65536 (+ odd)
    pos = 70000
    for z in (512, 1000, 4096, 4097, 8192, 65536, 70001):
        data.append((pos, bytes(z) + blob(rng, 3000)))
        pos += z + 3000
    # a hole from pos+? to 800000, then data up to the last byte
    data.append((800000, blob(rng, size - 800000 - 1) + b"\x01"))
    make_sparse(path, size, data)
    return size


def mixed_raw(path, size, seed):
    """Seeded raw file: random runs (incompressible), text-like runs
    (compressible), written zeros and holes, at unaligned offsets."""
    rng = random.Random("qcow2gen-mixed-%d" % seed)   # (its old name: the same bytes)
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


def random_runs(path, size, seed):
    """Random data (45%), written zeros (15%) and holes in runs of
    512 B..300 KiB, with gaps between them."""
    rng = random.Random(seed)
    with open(path, "wb") as f:
        f.truncate(size)
        pos = 0
        while pos < size:
            n = min(size - pos, rng.choice([512, 4096, 20000, 65536, 300000]))
            kind = rng.random()
            if kind < 0.45:
                f.seek(pos)
                f.write(rng.randbytes(n))
            elif kind < 0.6:
                f.seek(pos)
                f.write(bytes(n))
            pos += n + rng.choice([0, 512, 4096, 70000])
    return path


def zero_runs(path, seed):
    """One data extent (< 2 MiB, so qemu-img handles it in one buffer) of
    data with zero runs of many lengths at 512-byte aligned offsets."""
    rng = random.Random("zero-runs-%d" % seed)
    buf = bytearray()
    while len(buf) < 1800 * KiB:
        buf += rng.randbytes(rng.choice([512, 1536, 4096, 8192, 12288, 20480])).replace(
            b"\0", b"\3")
        buf += bytes(rng.choice([512, 1024, 4096, 8192, 12288, 16384, 32768, 61440, 65536,
                                 69632, 131072]))
    buf += b"\7" * 4096
    with open(path, "wb") as f:
        f.write(buf)
    return len(buf)


def many_extents(path, seed=1, runs=5000, max_run=1536, gap=(4096, 8192)):
    """~`runs` small data runs (1..max_run bytes, random and compressible
    content), each in its own 4 KiB file-system block, separated by holes of
    at least one block: thousands of extents, a few MiB of data."""
    rng = random.Random("qcow2-write-many-%d" % seed)
    out = []
    pos = rng.randint(0, 3) * 4096
    for i in range(runs):
        n = rng.randint(1, max_run)
        start = pos + rng.randint(0, 4096 - n) if n < 4096 else pos
        data = blob(rng, n) if i % 3 else text(rng, n)[:n]
        out.append((start, data))
        pos = round_up(start + n, 4096) + rng.randrange(gap[0], gap[1] + 1, 4096)
    size = round_up(pos, 64 * KiB)
    return make_sparse(path, size, out)


def dense(path, seed=2, size=48 * MiB, data=40 * MiB):
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
            buf = blob(rng, n)
        elif r < 0.9:
            buf = text(rng, n)[:n]
        else:
            buf = bytes(n)
        out.append((pos, buf))
        written += n
        pos += n
        if hole_budget > 0 and rng.random() < 0.5:
            h = min(hole_budget, rng.randrange(4096, 512 * KiB + 1, 4096))
            hole_budget -= h
            pos += h
    return make_sparse(path, max(size, round_up(pos, 512)), [(o, b[:size - o]) for o, b in out
                                                             if o < size])


def partial_clusters(path, seed=3, size=4 * MiB):
    """Data runs that start and end inside 64 KiB clusters (4 KiB aligned),
    with holes of 4..60 KiB between them: every cluster is written by two
    or more requests (the shape that needs the writer's per-cluster care)."""
    rng = random.Random("qcow2-write-partial-%d" % seed)
    out = []
    pos = rng.randrange(0, 64 * KiB, 4096)
    while pos < size:
        n = min(size - pos, rng.randrange(4096, 100 * KiB, 4096))
        out.append((pos, blob(rng, n)))
        pos += n + rng.randrange(4096, 61 * KiB, 4096)
    return make_sparse(path, size, out)


# --------------------------------------------------------------------------
# segment layouts: [(kind, length)], kind in data / zeros (written) / hole

def _log_uniform(rng, lo, hi, unit):
    """lo..hi bytes, log-uniformly, in whole units."""
    lo_exp, hi_exp = lo.bit_length() - 1, hi.bit_length() - 1
    return max(unit, int(2 ** rng.uniform(lo_exp, hi_exp)) // unit * unit)


def _sector_data(rng, n):
    """n bytes of random data with no all-zero 512-byte sector."""
    b = bytearray(rng.randbytes(n))
    b[::512] = b"\1" * len(range(0, n, 512))
    return bytes(b)


def segments_file(path, size, segments, rng):
    """A file of `size` bytes laid out as `segments` (cut at `size`); data
    has no all-zero sector."""
    with open(path, "wb") as f:
        f.truncate(size)
        pos = 0
        for kind, n in segments:
            n = min(n, size - pos)
            if n <= 0:
                break
            if kind != "hole":
                f.seek(pos)
                f.write(_sector_data(rng, n) if kind == "data" else bytes(n))
            pos += n


def mixed_segments(rng, size):
    """Data, written zeros and holes of 4 KiB..32 MiB in random order: data
    extents start and end at arbitrary 4 KiB offsets."""
    segs, total, prev = [("data", 1 * MiB)], 1 * MiB, "data"
    while total < size:
        r = rng.random()
        kind = "data" if r < 0.45 else "zeros" if r < 0.8 else "hole"
        if kind == prev:
            continue
        n = _log_uniform(rng, 4 * KiB, 32 * MiB, 4 * KiB)
        segs.append((kind, n))
        total += n
        prev = kind
    return segs


def zero_run_segments(rng, size):
    """Short data runs (4..256 KiB) between written-zero runs of 4 KiB..32 MiB,
    all in one data extent that starts at an odd offset (after a hole)."""
    segs = [("data", 64 * KiB), ("hole", 1 * MiB + 36 * KiB)]
    total = 64 * KiB + 1 * MiB + 36 * KiB
    while total < size:
        d = _log_uniform(rng, 4 * KiB, 256 * KiB, 4 * KiB)
        z = _log_uniform(rng, 4 * KiB, 32 * MiB, 4 * KiB)
        segs += [("data", d), ("zeros", z)]
        total += d + z
    return segs


def zeros_around_thresholds(path):
    """Written zeros of every length around the sparse thresholds (512 B ..
    3 MiB), each after 5000 bytes of data, some with holes between; returns
    the size."""
    rng = random.Random("test-plan-zeros")
    data, pos = [], 0
    for z in [512, 4096, 4097, 8192, 12288, 16384, 65536, 65536 + 4096, 131072, 1 << 20,
              (1 << 20) + 512, 3 << 20]:
        data.append((pos, rng.randbytes(5000).replace(b"\0", b"\1") + bytes(z)))
        pos += 5000 + z + rng.choice([0, 4096, 100000])
    data.append((pos, b"\x7f" * 3000))
    return make_sparse(path, pos + 3000 + 8192, data)
