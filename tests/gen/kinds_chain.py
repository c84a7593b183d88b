"""A qcow2 chain holding every kind of range an extent map draws, built with
qemu-img and qemu-io, and where each kind is (the views' tests).

    base.qcow2  8 MiB, 64 KiB clusters: data in [0, 4M)
    top.qcow2   over base:
      [0, 512K)        data written in top                   -> data
      [512K, 1M)       base's data                           -> backing
      [1M, 1.5M)       write -z over base's data             -> zeroed
      [1.5M, 2M)       base's data                           -> backing
      [2M, 2M+256K)    discard over base's data              -> zeroed
      [2M+256K, 4M)    base's data                           -> backing
      [4M, 5M)         nothing in either                     -> hole
      [5M, 5.5M)       write -c (compressed clusters)        -> data, compressed
      [5.5M, 6M)       nothing                               -> hole
      [6M, 6M+256K)    written, then its host clusters       -> allocated zeros
                       punched out of top's file
      [6M+256K, 8M-64K) nothing                              -> hole
      [8M-64K, 8M)     written                               -> data

Run as ``python3 -m tests.gen.kinds_chain DIR`` to build one by hand.
"""
import os
import sys

from ..oracles import qemu_img, qemu_io, qemu_map

KiB, MiB = 1 << 10, 1 << 20
CLUSTER = 64 * KiB
SIZE = 8 * MiB

# kind -> [(start, end)] of top.qcow2 (depth 0 view)
EXPECTED = {
    "data": [(0, 512 * KiB), (5 * MiB, 5 * MiB + 512 * KiB), (SIZE - CLUSTER, SIZE)],
    "backing": [(512 * KiB, MiB), (MiB + 512 * KiB, 2 * MiB), (2 * MiB + 256 * KiB, 4 * MiB)],
    "zeroed": [(MiB, MiB + 512 * KiB), (2 * MiB, 2 * MiB + 256 * KiB)],
    "zero": [(6 * MiB, 6 * MiB + 256 * KiB)],
    "hole": [(4 * MiB, 5 * MiB), (5 * MiB + 512 * KiB, 6 * MiB),
             (6 * MiB + 256 * KiB, SIZE - CLUSTER)],
}
COMPRESSED = [(5 * MiB, 5 * MiB + 512 * KiB)]

# A tiny run: 4 KiB data in a 2 GiB raw-backed qcow2 (views must show it)
TINY_SIZE = 2 << 30


def punch(path: str, offset: int, length: int) -> None:
    """A hole in a file's storage (fallocate PUNCH_HOLE | KEEP_SIZE)."""
    import ctypes
    import ctypes.util

    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
    fd = os.open(path, os.O_RDWR)
    try:
        if libc.fallocate(fd, 0x02 | 0x01, offset, length) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), path)
    finally:
        os.close(fd)


def build(directory: str) -> str:
    """Build base.qcow2 and top.qcow2 in ``directory``; returns top's path."""
    base = os.path.join(directory, "base.qcow2")
    top = os.path.join(directory, "top.qcow2")
    qemu_img("create", "-q", "-f", "qcow2", "-o", "cluster_size=65536", base, str(SIZE))
    qemu_io(base, ["write -P 0x11 0 4M"], fmt="qcow2")
    qemu_img("create", "-q", "-f", "qcow2", "-o", "cluster_size=65536", "-b", base,
             "-F", "qcow2", top)
    qemu_io(top, ["write -P 0x22 0 512k",
                  "write -z 1M 512k",
                  "discard 2M 256k",
                  "write -c -P 0x33 5M 512k",
                  "write -P 0x44 6M 256k",
                  "write -P 0x55 8128k 64k"], fmt="qcow2")
    # punch the host clusters of [6M, 6M+256K) out of top's file: qemu
    # then reports them as allocated zeros (data and zero)
    for e in qemu_map(top, "qcow2").extents:
        if e["depth"] == 0 and e["data"] and e["start"] <= 6 * MiB < e["start"] + e["length"]:
            skip = 6 * MiB - e["start"]
            punch(top, e["offset"] + skip, 256 * KiB)
            break
    else:
        raise AssertionError("qemu-img map shows no data at 6 MiB in " + top)
    return top


def build_tiny(directory: str) -> str:
    """A 2 GiB qcow2 with one 4 KiB data run at 1 GiB."""
    path = os.path.join(directory, "tiny.qcow2")
    qemu_img("create", "-q", "-f", "qcow2", path, str(TINY_SIZE))
    qemu_io(path, ["write -P 0x66 1G 4k"], fmt="qcow2")
    return path


if __name__ == "__main__":
    print(build(sys.argv[1]))
