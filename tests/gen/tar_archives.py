"""Tar archives holding disk images (OVA-like), for reading members in place.

- :func:`build`: an archive of files in Python's tarfile USTAR, GNU or PAX
  format, made sparse afterwards (every all-zero 4 KiB block punched), with
  members' data optionally 4 KiB-aligned in the archive (a filler member
  before each), so that the archive's holes are the member's own holes
  where they are in the file;
- :func:`header`: a hand-built header block (what tarfile cannot make: a
  base-256 size written over a sparse file, a GNU sparse type, a bad
  checksum, sizes past the end of the archive);
- :func:`build_big`: a hand-built archive whose one member is a sparse file
  larger than 8 GiB (a base-256 size), without writing its holes;
- :func:`extract`: a member copied out sparsely (its zero 4 KiB blocks left
  as holes), the file qemu-img is asked about.
"""

import os
import tarfile

from .sparse import dig_holes

BLOCK = 512
ALIGN = 4096
FORMATS = {"ustar": tarfile.USTAR_FORMAT, "gnu": tarfile.GNU_FORMAT, "pax": tarfile.PAX_FORMAT}


def _info(name, size):
    ti = tarfile.TarInfo(name)
    ti.size = size
    ti.mode = 0o644
    ti.mtime = 1700000000
    return ti


def build(path, members, fmt="gnu", align=True, sparse=True):
    """Write a tar archive at `path` of `members` = [(arcname, file path), ...]
    in tarfile's format `fmt` ("ustar", "gnu", "pax").  align: each member's
    data starts at a multiple of 4 KiB (a filler member "pad-N" before it
    when needed).  sparse: punch the archive's zero blocks into holes.
    Returns {arcname: offset of its data}."""
    offsets = {}
    tfmt = FORMATS[fmt]
    with tarfile.open(path, "w", format=tfmt, encoding="utf-8") as tf:
        for i, (arcname, src) in enumerate(members):
            info = _info(arcname, os.path.getsize(src))
            hdr = len(info.tobuf(tfmt, "utf-8", "surrogateescape"))
            if align and (tf.offset + hdr) % ALIGN:
                pad_name = "pad-%d" % i
                pad_hdr = len(_info(pad_name, 0).tobuf(tfmt, "utf-8", "surrogateescape"))
                need = (-(tf.offset + pad_hdr + hdr)) % ALIGN
                tf.addfile(_info(pad_name, need), _Zeros(need))
            offsets[arcname] = tf.offset + hdr
            with open(src, "rb") as f:
                tf.addfile(info, f)
    if sparse:
        dig_holes(path)
    return offsets


class _Zeros:
    def __init__(self, n):
        self.left = n

    def read(self, n=-1):
        n = self.left if n < 0 else min(n, self.left)
        self.left -= n
        return bytes(n)


def _octal(value, width):
    return ("%0*o" % (width - 1, value)).encode() + b"\0"


def header(name, size, *, typeflag=b"0", base256=False, magic="gnu", prefix=b"",
           checksum_delta=0, signed_checksum=False, extra=None):
    """One 512-byte header block.  base256: the size in GNU's base-256 form;
    magic "gnu" ("ustar  \\0"), "posix" ("ustar\\000", with `prefix`) or "v7"
    (none); checksum_delta: a wrong checksum; signed_checksum: the sum of
    the bytes as signed chars (historic tars; meaningful with bytes > 127);
    extra: {offset: bytes} patched in before the checksum."""
    h = bytearray(BLOCK)
    name = name.encode() if isinstance(name, str) else name
    h[0:len(name)] = name
    h[100:108] = _octal(0o644, 8)
    h[108:116] = _octal(0, 8)
    h[116:124] = _octal(0, 8)
    if base256:
        h[124:136] = b"\x80" + size.to_bytes(11, "big")
    else:
        h[124:136] = _octal(size, 12)
    h[136:148] = _octal(1700000000, 12)
    h[156:157] = typeflag
    if magic == "gnu":
        h[257:265] = b"ustar  \0"
    elif magic == "posix":
        h[257:265] = b"ustar\x0000"
        h[345:345 + len(prefix)] = prefix
    for off, data in (extra or {}).items():
        h[off:off + len(data)] = data
    h[148:156] = b" " * 8
    total = sum((b - 256 if b > 127 else b) for b in h) if signed_checksum else sum(h)
    h[148:156] = ("%06o" % (total + checksum_delta)).encode() + b"\0 "
    return bytes(h)


def pad(n):
    return bytes(-n % BLOCK)


def end_blocks():
    return bytes(2 * BLOCK)


def build_big(path, member, size, data, filler=True):
    """An archive of one member `member` of `size` bytes (> 8 GiB: a base-256
    size) whose bytes are zero but for `data` = [(offset, bytes), ...],
    written sparsely; with `filler`, a small member first puts the data at
    4 KiB.  Returns the offset of the member's data."""
    with open(path, "wb") as f:
        pos = 0
        if filler:
            f.write(header("filler", 6 * BLOCK, magic="gnu"))
            f.write(b"\x5a" * (6 * BLOCK))
            pos = 7 * BLOCK
        f.write(header(member, size, base256=size >= 8 << 30))
        start = pos + BLOCK
        for off, buf in data:
            f.seek(start + off)
            f.write(buf)
        end = start + size + (-size % BLOCK)
        f.seek(end)
        f.write(end_blocks())
    return start


def extract(archive, name, out):
    """Member `name` copied to `out`, its all-zero 4 KiB blocks left as holes."""
    zero = bytes(ALIGN)
    with tarfile.open(archive) as tf, open(out, "wb") as f:
        m = tf.getmember(name)
        src = tf.extractfile(m)
        pos = 0
        while True:
            buf = src.read(ALIGN)
            if not buf:
                break
            # a partial last block shares its archive block with what
            # follows (padding, headers): data in the archive, so here too
            if buf != zero[:len(buf)] or len(buf) < ALIGN:
                f.seek(pos)
                f.write(buf)
            pos += len(buf)
        f.truncate(pos)
    return out


def write_sparse_copy(src, out):
    """`src` copied to `out` with its all-zero 4 KiB blocks as holes."""
    with open(src, "rb") as s, open(out, "wb") as f:
        size = os.fstat(s.fileno()).st_size
        zero = bytes(ALIGN)
        pos = 0
        while pos < size:
            buf = s.read(ALIGN)
            if buf != zero[:len(buf)]:
                f.seek(pos)
                f.write(buf)
            pos += len(buf)
        f.truncate(size)
    return out


__all__ = ["build", "build_big", "header", "pad", "end_blocks", "extract", "write_sparse_copy",
           "dig_holes"]
