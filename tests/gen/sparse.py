"""Sparse raw files and the bytes written into them: the bottom layer of
every generator in tests/gen/.

- :class:`SparseFile` / :func:`make_sparse`: a file of a given size, holes
  everywhere but where bytes are written, fsynced and dropped from the page
  cache when done;
- :func:`write_file`: a file holding given bytes;
- :func:`garbage`: a file of seeded random bytes (an old destination);
- :func:`dig_holes`: every all-zero 4 KiB block punched into a real hole;
- :func:`pad_to_sector`: a raw file extended to qemu's 512-byte virtual size;
- :func:`pattern`, :func:`blob`, :func:`seeded_bytes`, :func:`text`: seeded
  bytes with no zero byte (optionally with zero runs), and compressible ones.
"""

import os
import random

from ..units import round_up

BLOCK = 4096


class SparseFile:
    """A file opened for building, closed (fsynced, its clean pages dropped) at exit."""

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


def make_sparse(path, size, data=()):
    """A sparse file of `size` bytes with `data` = [(offset, bytes), ...] written."""
    with SparseFile(path, size) as f:
        for off, buf in data:
            f.write(off, buf)
    return size


def write_file(path, data):
    """A file holding `data`, every byte written; returns path."""
    with open(path, "wb") as f:
        f.write(data)
    return path


def garbage(path, size, seed):
    """`size` seeded random bytes, every one written (no hole)."""
    rng = random.Random(seed)
    with open(path, "wb") as f:
        left = size
        while left:
            n = min(left, 1 << 20)
            f.write(rng.randbytes(n))
            left -= n
    return size


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


def dig_holes(path, block=BLOCK):
    """Punch every all-zero 4 KiB block of `path` into a real hole (like
    ``fallocate --dig-holes``).

    qemu fills the untouched part of a newly allocated cluster with
    write-zeroes, i.e. FALLOC_FL_ZERO_RANGE: *unwritten* extents, which
    ext4's SEEK_DATA reports as holes until somebody reads their pages, then
    as data.  Where qemu consults the host file (its metadata-preallocation
    heuristic), the map of such an image would change as soon as any test
    reads it.  Real holes never change.
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
# bytes

def pattern(rng, n, zero_runs=False):
    """n bytes of random data with no zero byte (optionally with zero runs)."""
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


def blob(rng, n):
    """n random (incompressible) bytes with no zero byte."""
    return rng.randbytes(n).replace(b"\0", b"\x5a")


def seeded_bytes(n, seed=1):
    """n random bytes with no zero byte, the same for the same seed."""
    return blob(random.Random(seed), n)


def text(rng, n):
    """Compressible, zero-free bytes (deflate shrinks them): at least n."""
    alpha = b"the quick brown fox jumps over a lazy dog 0123456789\n"
    return bytes(rng.choices(alpha, k=min(n, 4096))) * (n // 4096 + 1)
