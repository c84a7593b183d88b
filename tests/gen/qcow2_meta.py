"""qcow2 metadata read and patched by hand: the header and the tables
qemu-img does not show (to count refcount blocks and L2 tables, and to
evaluate qemu's metadata-preallocation heuristic), and patches that make
images qemu can no longer be asked to create.
"""

import os
import shutil
import struct
from typing import NamedTuple

from .sparse import dig_holes


# --------------------------------------------------------------------------
# reading

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
# patching (features qemu can no longer be asked to create)

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
# persistent bitmaps: the directory, tables and clusters of bits

class BitmapEntry(NamedTuple):
    name: str
    table_offset: int
    table_size: int
    flags: int
    granularity_bits: int
    position: int             # of the directory entry in the file


def bitmap_directory(path) -> list:
    """The bitmap directory's entries (none without a bitmaps extension)."""
    with open(path, "rb") as f:
        head = f.read(65536)
        off = struct.unpack(">I", head[100:104])[0]
        while True:
            t, ln = struct.unpack(">II", head[off:off + 8])
            if t == 0:
                return []
            if t == 0x23852875:
                nb, _, dsize, doff = struct.unpack(">IIQQ", head[off + 8:off + 32])
                break
            off += 8 + (ln + 7) // 8 * 8
        f.seek(doff)
        d = f.read(dsize)
    out, pos = [], 0
    for _ in range(nb):
        toff, tsize, flags, _typ, gran, nsize, extra = struct.unpack(">QIIBBHI", d[pos:pos + 24])
        out.append(BitmapEntry(d[pos + 24:pos + 24 + nsize].decode(), toff, tsize, flags, gran,
                               doff + pos))
        pos += (24 + nsize + extra + 7) // 8 * 8
    return out


def bitmap_entry(path, name) -> BitmapEntry:
    (e,) = [e for e in bitmap_directory(path) if e.name == name]
    return e


def bitmap_table(path, name) -> list:
    """Bitmap `name`'s table entries."""
    e = bitmap_entry(path, name)
    with open(path, "rb") as f:
        f.seek(e.table_offset)
        return list(struct.unpack(">%dQ" % e.table_size, f.read(8 * e.table_size)))


def bitmap_patch(path, name, *, table_size=None, table_entry=None, bits=None):
    """Patch bitmap `name` in place: its directory entry's table size;
    `table_entry=(index, value)` into its table; `bits=(index, data)`:
    `data` written at the start of the cluster of bits table entry `index`
    names (which must name one)."""
    e = bitmap_entry(path, name)
    with open(path, "r+b") as f:
        if table_size is not None:
            f.seek(e.position + 8)
            f.write(struct.pack(">I", table_size))
        if table_entry is not None:
            index, value = table_entry
            f.seek(e.table_offset + 8 * index)
            f.write(struct.pack(">Q", value))
        if bits is not None:
            index, data = bits
            f.seek(e.table_offset + 8 * index)
            host = struct.unpack(">Q", f.read(8))[0] & 0x00FFFFFFFFFFFE00
            assert host, "entry %d of bitmap %r names no cluster" % (index, name)
            f.seek(host)
            f.write(data)
