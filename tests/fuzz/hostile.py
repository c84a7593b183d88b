"""Hand-made hostile qcow2 files, built byte by byte (no qemu needed).

`base_image()` lays out a small, valid v3 image (qemu-img check finds no
error in it; tests/test_qcow2_hostile.py checks that when qemu-img is
there); every hostile case is that image, or another small one, with
fields overwritten.  Each case says what a reader must do with it:

    "error"  opening, mapping or reading must raise ImageFormatError or
             OSError (imgcopy must notice the damage)
    "any"    any outcome but a crash, a hang or a runaway allocation
             (the damage is legal to read, or qemu reads it too)

Run as a script to (re)write the cases into tests/fuzz/regressions/:

    python3 tests/fuzz/hostile.py [OUTDIR]

Files are named hostile-<case>.qcow2.  Backing file names in them follow
the fuzz harness's private directory: "input.qcow2" is the image itself,
"base.qcow2" a copy of it, "base.raw" a small raw file.
"""
from __future__ import annotations

import os
import struct
import sys
import zlib
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

MAGIC = b"QFI\xfb"
COPIED = 1 << 63
COMPRESSED = 1 << 62
ZERO = 1
FEATURE_TABLE = 0x6803F857
BACKING_FORMAT = 0xE2792ACA

# header field offsets (docs/interop/qcow2.txt)
OFF_VERSION = 4
OFF_BACKING_OFFSET = 8
OFF_BACKING_SIZE = 16
OFF_CLUSTER_BITS = 20
OFF_SIZE = 24
OFF_CRYPT = 32
OFF_L1_SIZE = 36
OFF_L1_OFFSET = 40
OFF_REFTABLE_OFFSET = 48
OFF_REFTABLE_CLUSTERS = 56
OFF_NB_SNAPSHOTS = 60
OFF_SNAPSHOTS_OFFSET = 64
OFF_INCOMPAT = 72
OFF_COMPAT = 80
OFF_AUTOCLEAR = 88
OFF_REFCOUNT_ORDER = 96
OFF_HEADER_LENGTH = 100
OFF_COMPRESSION_TYPE = 104
HEADER_LENGTH = 112


def deflate_raw(data: bytes) -> bytes:
    """zlib without header or trailer, window 4 KiB: what qemu writes."""
    c = zlib.compressobj(9, zlib.DEFLATED, -12)
    return c.compress(data) + c.flush()


def compressed_entry(host: int, nbytes: int, cluster_bits: int) -> int:
    """An L2 entry for `nbytes` of compressed data at host offset `host`."""
    x = 62 - (cluster_bits - 8)
    sectors = (host + nbytes - 1) // 512 - host // 512 + 1
    return COMPRESSED | (sectors - 1) << x | host


@dataclass
class Layout:
    """Where base_image() put things, for the cases that patch them."""
    cluster_bits: int
    cluster_size: int
    size: int
    l1_offset: int
    l1_size: int
    l2_offset: int
    reftable_offset: int
    refblock_offset: int
    data_offset: int        # guest cluster 0
    compressed_offset: int  # guest cluster 2
    compressed_len: int
    ext_offset: int         # first header extension


# what base_image() stores: guest cluster -> fill byte (None: zero cluster)
BASE_PATTERN: Dict[int, Any] = {0: 0x5A, 1: None, 2: 0x33, 3: 0xC3}


def base_image(cluster_bits: int = 9, size: int = 256 << 10, version: int = 3,
               backing: Optional[bytes] = None, backing_fmt: Optional[bytes] = None):
    """A valid image: guest cluster 0 data (0x5a), 1 a zero cluster (v3; v2:
    unallocated), 2 compressed (0x33), 3 data (0xc3); the rest unallocated.
    Returns (bytearray, Layout)."""
    cs = 1 << cluster_bits
    l2_entries = cs // 8
    clusters = -(-size // cs)
    l1_size = max(1, -(-clusters // l2_entries))
    l1_clusters = -(-l1_size * 8 // cs)
    # cluster 0 header, 1 refcount table, 2 refcount block, 3.. L1, then
    # L2, data, compressed, data
    reftable = 1 * cs
    refblock = 2 * cs
    l1_off = 3 * cs
    l2_off = l1_off + l1_clusters * cs
    data0 = l2_off + cs
    comp = data0 + cs
    data3 = comp + cs
    nclusters = data3 // cs + 1
    buf = bytearray(nclusters * cs)

    # header
    h = buf
    h[0:4] = MAGIC
    struct.pack_into(">I", h, OFF_VERSION, version)
    struct.pack_into(">I", h, OFF_CLUSTER_BITS, cluster_bits)
    struct.pack_into(">Q", h, OFF_SIZE, size)
    struct.pack_into(">I", h, OFF_L1_SIZE, l1_size)
    struct.pack_into(">Q", h, OFF_L1_OFFSET, l1_off)
    struct.pack_into(">Q", h, OFF_REFTABLE_OFFSET, reftable)
    struct.pack_into(">I", h, OFF_REFTABLE_CLUSTERS, 1)
    if version == 3:
        struct.pack_into(">I", h, OFF_REFCOUNT_ORDER, 4)
        struct.pack_into(">I", h, OFF_HEADER_LENGTH, HEADER_LENGTH)
        pos = HEADER_LENGTH
    else:
        pos = 72
    ext_offset = pos
    if backing_fmt is not None:
        struct.pack_into(">II", h, pos, BACKING_FORMAT, len(backing_fmt))
        h[pos + 8:pos + 8 + len(backing_fmt)] = backing_fmt
        pos += 8 + (len(backing_fmt) + 7) // 8 * 8
    if version == 3:
        # the incompatible features only: 512-byte header clusters must
        # hold it, a backing format and a backing file name
        names = [(0, 0, b"dirty bit"), (0, 1, b"corrupt bit"), (0, 2, b"external data file"),
                 (0, 3, b"compression type"), (0, 4, b"extended L2 entries")]
        table = b"".join(struct.pack(">BB46s", t, b, n) for t, b, n in names)
        struct.pack_into(">II", h, pos, FEATURE_TABLE, len(table))
        h[pos + 8:pos + 8 + len(table)] = table
        pos += 8 + len(table)
    struct.pack_into(">II", h, pos, 0, 0)  # end of extensions
    pos += 8
    if backing is not None:
        struct.pack_into(">Q", h, OFF_BACKING_OFFSET, pos)
        struct.pack_into(">I", h, OFF_BACKING_SIZE, len(backing))
        h[pos:pos + len(backing)] = backing

    # refcounts: every cluster of the file once
    struct.pack_into(">Q", buf, reftable, refblock)
    for c in range(nclusters):
        struct.pack_into(">H", buf, refblock + 2 * c, 1)

    # L1 -> one L2 table
    struct.pack_into(">Q", buf, l1_off, COPIED | l2_off)
    struct.pack_into(">Q", buf, l2_off + 0, COPIED | data0)
    if version == 3:
        struct.pack_into(">Q", buf, l2_off + 8, ZERO)
    payload = deflate_raw(bytes([BASE_PATTERN[2]]) * cs)
    buf[comp:comp + len(payload)] = payload
    struct.pack_into(">Q", buf, l2_off + 16, compressed_entry(comp, len(payload), cluster_bits))
    struct.pack_into(">Q", buf, l2_off + 24, COPIED | data3)
    buf[data0:data0 + cs] = bytes([BASE_PATTERN[0]]) * cs
    buf[data3:data3 + cs] = bytes([BASE_PATTERN[3]]) * cs
    # the compressed cluster's own refcount is 1 as well: it is allocated
    # like the others, and the rest of its host cluster stays zeros
    return buf, Layout(cluster_bits, cs, size, l1_off, l1_size, l2_off, reftable, refblock,
                       data0, comp, len(payload), ext_offset)


def put(buf: bytearray, fmt: str, off: int, value: int) -> bytearray:
    struct.pack_into(fmt, buf, off, value)
    return buf


@dataclass
class Case:
    name: str
    expect: str  # "error" or "any"
    build: Callable[[], bytes]
    why: str = ""
    format: Optional[str] = "qcow2"  # what to open it as; None probes


def _truncated(n: int) -> Callable[[], bytes]:
    return lambda: bytes(base_image()[0][:n])


def _patched(fmt: str, field: int, value: int, **kw) -> Callable[[], bytes]:
    def build():
        buf, _ = base_image(**kw)
        return bytes(put(buf, fmt, field, value))
    return build


def _l1_entry(value, **kw) -> Callable[[], bytes]:
    """value: an int, or a function of the Layout."""
    def build():
        buf, lay = base_image(**kw)
        v = value(lay) if callable(value) else value
        return bytes(put(buf, ">Q", lay.l1_offset, v))
    return build


def _l2_entry(index: int, value, **kw) -> Callable[[], bytes]:
    """value: an int, or a function of the Layout."""
    def build():
        buf, lay = base_image(**kw)
        v = value(lay) if callable(value) else value
        return bytes(put(buf, ">Q", lay.l2_offset + 8 * index, v))
    return build


def _backing_size(n: int) -> Callable[[], bytes]:
    def build():
        buf, _ = base_image(backing=b"base.raw", backing_fmt=b"raw")
        return bytes(put(buf, ">I", OFF_BACKING_SIZE, n))
    return build


def _extension_length(n: int) -> Callable[[], bytes]:
    def build():
        buf, lay = base_image()
        return bytes(put(buf, ">I", lay.ext_offset + 4, n))
    return build


def _garbage_compressed(cluster_bits: int = 9) -> bytes:
    """A compressed cluster descriptor over bytes that are no deflate stream."""
    buf, lay = base_image(cluster_bits=cluster_bits)
    junk = bytes((i * 167 + 13) & 0xFF for i in range(lay.cluster_size))
    buf[lay.compressed_offset:lay.compressed_offset + lay.cluster_size] = junk
    return bytes(buf)


def _short_compressed() -> bytes:
    """A valid deflate stream that inflates to half a cluster."""
    buf, lay = base_image()
    payload = deflate_raw(b"\x44" * (lay.cluster_size // 2))
    c = lay.compressed_offset
    buf[c:c + lay.cluster_size] = bytes(lay.cluster_size)
    buf[c:c + len(payload)] = payload
    put(buf, ">Q", lay.l2_offset + 16, compressed_entry(c, len(payload), lay.cluster_bits))
    return bytes(buf)


def _compressed_max_sectors() -> bytes:
    """The sector count field all ones: the descriptor claims more compressed
    bytes than two clusters, reaching past the end of the file."""
    buf, lay = base_image()
    x = 62 - (lay.cluster_bits - 8)
    entry = COMPRESSED | ((1 << (lay.cluster_bits - 8)) - 1) << x | lay.compressed_offset
    return bytes(put(buf, ">Q", lay.l2_offset + 16, entry))


def _compressed_beyond_eof() -> bytes:
    buf, lay = base_image()
    return bytes(put(buf, ">Q", lay.l2_offset + 16,
                     compressed_entry(1 << 40, 600, lay.cluster_bits)))


def _l1_in_header() -> bytes:
    buf, _ = base_image()
    return bytes(put(buf, ">Q", OFF_L1_OFFSET, 0))


def _prealloc_reftable_beyond_eof() -> bytes:
    """Looks metadata-preallocated (every guest cluster has a data cluster,
    most of them past the end of the file) with the refcount table past
    the end of the file: the preallocation detector must give up cleanly."""
    buf, lay = base_image(cluster_bits=9, size=64 << 10)
    cs = lay.cluster_size
    end = len(buf)
    for i in range(lay.size // cs):
        put(buf, ">Q", lay.l2_offset + 8 * i, COPIED | (end + i * cs))
    put(buf, ">Q", OFF_REFTABLE_OFFSET, 1 << 40)
    return bytes(buf)


def _prealloc_refblock_beyond_eof() -> bytes:
    buf, lay = base_image(cluster_bits=9, size=64 << 10)
    cs = lay.cluster_size
    end = len(buf)
    for i in range(lay.size // cs):
        put(buf, ">Q", lay.l2_offset + 8 * i, COPIED | (end + i * cs))
    put(buf, ">Q", lay.reftable_offset, 1 << 40)
    return bytes(buf)


def _prealloc_refcount_order(order: int) -> Callable[[], bytes]:
    """Every refcount entry set, of an unusual width: the detector reads the
    refcount block at that width (1 bit .. 64 bits)."""
    def build():
        buf, lay = base_image(cluster_bits=9, size=64 << 10)
        cs = lay.cluster_size
        end = len(buf)
        for i in range(lay.size // cs):
            put(buf, ">Q", lay.l2_offset + 8 * i, COPIED | (end + i * cs))
        buf[lay.refblock_offset:lay.refblock_offset + cs] = b"\xff" * cs
        return bytes(put(buf, ">I", OFF_REFCOUNT_ORDER, order))
    return build


def _all_l1_same_l2(cluster_bits: int, l1_size: int, refcount_order: int = 4,
                    data_is_l1: bool = False) -> Callable[[], bytes]:
    """Extent amplification: every L1 entry points at the same L2 table,
    whose entries alternate zero and data clusters (all data at one host
    cluster past the end of the file, so no two extents merge).  A file of
    three parts (header cluster, L1, L2) describes a disk of
    l1_size * (cluster_size/8) alternating clusters.  Block status at the
    end of the disk, or a map of its last 64 MiB, must cost work and memory
    about the clusters asked for, not about everything before them.  The
    refcount table (one cluster) is empty: qemu opens the image, nothing
    looks preallocated.  `data_is_l1`: the data cluster is the L1 table's
    first cluster, inside the file, whose reference count a check raises
    (to its maximum at once with refcount_order 0: every reference after
    the L1 table's own is an overflow)."""
    def build():
        cs = 1 << cluster_bits
        l2_entries = cs // 8
        size = l1_size * l2_entries * cs
        hdr = bytearray(cs)
        hdr[0:4] = MAGIC
        l1_off = cs
        l1_clusters = -(-l1_size * 8 // cs)
        l2_off = l1_off + l1_clusters * cs
        reftable = l2_off + cs
        data = l1_off if data_is_l1 else reftable + 16 * cs
        for fmt, off, v in ((">I", OFF_VERSION, 3), (">I", OFF_CLUSTER_BITS, cluster_bits),
                            (">Q", OFF_SIZE, size), (">I", OFF_L1_SIZE, l1_size),
                            (">Q", OFF_L1_OFFSET, l1_off), (">Q", OFF_REFTABLE_OFFSET, reftable),
                            (">I", OFF_REFTABLE_CLUSTERS, 1),
                            (">I", OFF_REFCOUNT_ORDER, refcount_order),
                            (">I", OFF_HEADER_LENGTH, HEADER_LENGTH)):
            put(hdr, fmt, off, v)
        l1 = b"".join(struct.pack(">Q", COPIED | l2_off) for _ in range(l1_size))
        l1 += bytes(l1_clusters * cs - len(l1))
        l2 = b"".join(struct.pack(">Q", ZERO if i % 2 else COPIED | data)
                      for i in range(l2_entries))
        return bytes(hdr) + l1 + l2 + bytes(cs)
    return build


def _small_header(cluster_bits: int, size: int, l1_size: int, l1_offset: int,
                  reftable: int, reftable_clusters: int = 1, refcount_order: int = 4,
                  nb_snapshots: int = 0, snapshots_offset: int = 0) -> bytearray:
    """A v3 header cluster with these fields, no extension."""
    hdr = bytearray(1 << cluster_bits)
    hdr[0:4] = MAGIC
    for fmt, off, v in ((">I", OFF_VERSION, 3), (">I", OFF_CLUSTER_BITS, cluster_bits),
                        (">Q", OFF_SIZE, size), (">I", OFF_L1_SIZE, l1_size),
                        (">Q", OFF_L1_OFFSET, l1_offset), (">Q", OFF_REFTABLE_OFFSET, reftable),
                        (">I", OFF_REFTABLE_CLUSTERS, reftable_clusters),
                        (">I", OFF_REFCOUNT_ORDER, refcount_order),
                        (">I", OFF_NB_SNAPSHOTS, nb_snapshots),
                        (">Q", OFF_SNAPSHOTS_OFFSET, snapshots_offset),
                        (">I", OFF_HEADER_LENGTH, HEADER_LENGTH)):
        put(hdr, fmt, off, v)
    return hdr


def _l2_tables_in_turn(ntables: int = 100, l1_size: int = 8192) -> bytes:
    """64-bit refcounts (a refcount block covers 64 clusters of 512 bytes):
    L1 entries name `ntables` L2 tables in turn, whose entries name data
    clusters of the file's 8 refcount blocks in turn.  A check that looks
    the stored refcounts up again per entry reads a block per entry (qemu
    reads them through its cache); one that scans a table each time it is
    named does `l1_size` scans."""
    cb, cs, nblocks = 9, 512, 8
    l2_first = 2 + nblocks
    l1_first = l2_first + ntables
    l1_clusters = -(-l1_size * 8 // cs)
    hdr = _small_header(cb, l1_size * (cs // 8) * cs, l1_size, l1_first * cs, cs, 1, 6)
    reftable = b"".join(struct.pack(">Q", (2 + b) * cs) for b in range(nblocks)).ljust(cs, b"\0")
    blocks = struct.pack(">Q", 1) * 64 * nblocks
    # entry j of table t: a cluster of block j % 8 (never 0, the header)
    tables = b"".join(
        struct.pack(">Q", COPIED | ((j % nblocks) * 64 + 1 + (t + j) % 63) * cs)
        for t in range(ntables) for j in range(cs // 8))
    l1 = b"".join(struct.pack(">Q", COPIED | (l2_first + i % ntables) * cs)
                  for i in range(l1_size))
    image = bytes(hdr) + reftable + blocks + tables + l1.ljust(l1_clusters * cs, b"\0")
    return image.ljust(64 * nblocks * cs, b"\0")  # the blocks' clusters: the file's


def _overlapping_l2_tables(ntables: int = 100) -> bytes:
    """64 KiB clusters, a file of 256 KiB: the L1 table fills the file past
    the header, its entries name `ntables` L2 tables in turn, each at
    another 512-byte offset inside the L1 table itself (not cluster
    aligned: qemu says so, and checks them anyway).  Each table holds up to
    8192 entries (L1 entries, read as L2 entries: misaligned data
    clusters)."""
    cb, cs = 16, 1 << 16
    n = (CORPUS_MAX - cs) // 8
    hdr = _small_header(cb, n * (cs // 8) * cs, n, cs, cs)
    l1 = b"".join(struct.pack(">Q", COPIED | (cs + 512 * (i % ntables))) for i in range(n))
    return bytes(hdr) + l1


def _snapshots_naming_one_l1(nsnapshots: int = 1500, l1_size: int = 16384) -> bytes:
    """512-byte clusters: an active L1 table of `l1_size` entries naming one
    L2 table, and `nsnapshots` snapshots whose L1 table is the active one:
    nsnapshots * l1_size L1 entries to walk in a file of 214 KB."""
    cb, cs = 9, 512
    l2_off, l1_off = 2 * cs, 3 * cs
    l1_bytes = -(-l1_size * 8 // cs) * cs
    snap_off = l1_off + l1_bytes
    hdr = _small_header(cb, l1_size * (cs // 8) * cs, l1_size, l1_off, cs, 1, 4,
                        nsnapshots, snap_off)
    l2 = b"".join(struct.pack(">Q", COPIED | (l1_off + cs * (i % 4))) for i in range(cs // 8))
    l1 = struct.pack(">Q", COPIED | l2_off) * l1_size
    # l1_table_offset, l1_size, id_str_size, name_size, date, vm clock,
    # vm state size, extra data size (16: a complete v3 entry)
    entry = struct.pack(">QIHHIIQII", l1_off, l1_size, 0, 0, 0, 0, 0, 0, 16) + bytes(16)
    return bytes(hdr) + bytes(cs) + l2 + l1.ljust(l1_bytes, b"\0") + entry * nsnapshots


def _reftable_beyond_eof(with_data: bool = False) -> bytes:
    """The largest refcount table qemu takes (8 MiB), in a file of 2 KiB:
    one entry inside the file, 1 Mi entries past its end (zeros).
    `with_data`: one data cluster, so that block status asks whether the
    image looks metadata-preallocated (the refcounts of the file's
    clusters)."""
    cb, cs = 9, 512
    hdr = _small_header(cb, 1 << 20, (1 << 20) // cs // (cs // 8), 2 * cs, cs,
                        (8 << 20) // cs)
    if with_data:
        reftable = struct.pack(">Q", 4 * cs).ljust(cs, b"\0")
        l1 = struct.pack(">Q", COPIED | 3 * cs).ljust(cs, b"\0")
        l2 = struct.pack(">Q", COPIED | 5 * cs).ljust(cs, b"\0")
        refblock = (struct.pack(">H", 1) * 6).ljust(cs, b"\0")
        return bytes(hdr) + reftable + l1 + l2 + refblock + b"\x5a" * cs
    reftable = struct.pack(">Q", 3 * cs).ljust(cs, b"\0")
    return bytes(hdr) + reftable + bytes(cs) + b"\0\1" * (cs // 2)


def _bitmaps_beyond_eof(nbitmaps: int = 2000, in_use: bool = False, cluster_bits: int = 12,
                        size: int = 1 << 40, table_size: int = 0, zeros: int = 0) -> bytes:
    """`nbitmaps` dirty bitmaps (granularity 512 bytes, named b00000...),
    each with a table of `table_size` entries (0: what the disk needs, 64 Ki
    for 1 TiB of 4 KiB clusters) at 1 TiB: past the end of the file, zeros
    (valid entries).  In use, a bitmap need not cover the disk and open
    does not read its table; a check reads them all.  `zeros`: that many
    zero bytes end the file, where every table lies instead (they all
    overlap)."""
    cs = 1 << cluster_bits
    per_l2 = (cs // 8) * cs
    l1_size = -(-size // per_l2)
    if not table_size:
        table_size = -(-(-(-size // 512) // 8) // cs)
    dir_off, dir_len = 4 * cs, 32 * nbitmaps
    hdr = _small_header(cluster_bits, size, l1_size, 3 * cs, cs)
    put(hdr, ">Q", OFF_AUTOCLEAR, 1)  # the bitmaps extension is valid
    ext = struct.pack(">IIIIQQ", 0x23852875, 24, nbitmaps, 0, dir_len, dir_off)
    hdr[HEADER_LENGTH:HEADER_LENGTH + len(ext) + 8] = ext + bytes(8)
    reftable = struct.pack(">Q", 2 * cs).ljust(cs, b"\0")
    refblock = struct.pack(">H", 1) * 5
    image = bytes(hdr) + reftable + refblock.ljust(cs, b"\0") + bytes(cs)
    tables = len(image) + -(-dir_len // cs) * cs if zeros else (1 << 40) + 4 * cs
    directory = b"".join(
        struct.pack(">QIIBBHI", tables, table_size, 1 if in_use else 0, 1, 9, 6, 0)
        + (b"b%05d" % i).ljust(8, b"\0") for i in range(nbitmaps))
    return image + directory.ljust(-(-dir_len // cs) * cs, b"\0") + bytes(zeros)


def _bitmap_bits(entries=None) -> bytes:
    """512-byte clusters, a disk of 8 MiB + 512 bytes (its L1 table past the
    end of the file: nothing allocated) and one bitmap of 512-byte granules
    ("b") whose table has the 5 entries such a disk needs, by default: a
    metadata cluster (the refcount block) as bits, a cluster of ones, a
    cluster far past the end of the file (zeros), a cluster of 0x55 bytes
    (runs of one granule), none.  qemu opens it, reads the bitmap and
    exports it (qemu-nbd -B b)."""
    cb, cs, size = 9, 512, (8 << 20) + 512
    if entries is None:
        entries = [2 * cs, 1, 1 << 40, 5 * cs, 0]
    hdr = _small_header(cb, size, -(-size // (64 * cs)), 1 << 30, cs)
    put(hdr, ">Q", OFF_AUTOCLEAR, 1)  # the bitmaps extension is valid
    directory = struct.pack(">QIIBBHI", 4 * cs, len(entries), 0, 1, 9, 1, 0) + b"b"
    ext = struct.pack(">IIIIQQ", 0x23852875, 24, 1, 0, 32, 3 * cs)
    hdr[HEADER_LENGTH:HEADER_LENGTH + len(ext) + 8] = ext + bytes(8)
    reftable = struct.pack(">Q", 2 * cs).ljust(cs, b"\0")
    refblock = (struct.pack(">H", 1) * 6).ljust(cs, b"\0")
    table = b"".join(struct.pack(">Q", e) for e in entries).ljust(cs, b"\0")
    return (bytes(hdr) + reftable + refblock + directory.ljust(cs, b"\0") + table
            + b"\x55" * cs)


def _snapshots_beyond_eof(nsnapshots: int = 65535) -> bytes:
    """A v2 image (no snapshot entry needs extra data) of three 64 KiB
    clusters whose snapshot table, `nsnapshots` entries, starts at its end:
    each entry reads as zeros (40 bytes, no L1 table)."""
    cb, cs = 16, 1 << 16
    hdr = _small_header(cb, 1 << 20, 1, 2 * cs, cs, 1, 4, nsnapshots, 3 * cs)
    put(hdr, ">I", OFF_VERSION, 2)
    put(hdr, ">I", OFF_REFCOUNT_ORDER, 0)
    put(hdr, ">I", OFF_HEADER_LENGTH, 0)
    return bytes(hdr) + bytes(2 * cs)


def _feature_bit(bit: int, named: bool) -> Callable[[], bytes]:
    def build():
        buf, lay = base_image()
        if named:
            # rename the last entry of the feature table to name this bit
            entry = lay.ext_offset + 8 + 4 * 48
            struct.pack_into(">BB46s", buf, entry, 0, bit, b"frobnicated clusters")
        return bytes(put(buf, ">Q", OFF_INCOMPAT, 1 << bit))
    return build


def _backing_name(name: bytes, fmt: Optional[bytes] = b"raw") -> Callable[[], bytes]:
    return lambda: bytes(base_image(backing=name, backing_fmt=fmt)[0])


def _backing_fmt_too_long() -> bytes:
    buf, lay = base_image(backing=b"base.raw", backing_fmt=b"raw")
    return bytes(put(buf, ">I", lay.ext_offset + 4, 64))


def _backing_name_with_nul() -> bytes:
    return bytes(base_image(backing=b"base\0raw", backing_fmt=b"raw")[0])


def _backing_overlapping_header() -> bytes:
    buf, _ = base_image(backing=b"base.raw", backing_fmt=b"raw")
    put(buf, ">Q", OFF_BACKING_OFFSET, 8)  # the name is the header itself
    return bytes(put(buf, ">I", OFF_BACKING_SIZE, 16))


def _backing_offset_past_cluster() -> bytes:
    buf, lay = base_image(backing=b"base.raw", backing_fmt=b"raw")
    return bytes(put(buf, ">Q", OFF_BACKING_OFFSET, lay.cluster_size - 4))


def _v2_header_only() -> bytes:
    """72 bytes of v2 header, an empty disk: legal (no L1 needed)."""
    buf, _ = base_image(version=2)
    put(buf, ">Q", OFF_SIZE, 0)
    put(buf, ">I", OFF_L1_SIZE, 0)
    return bytes(buf[:72])


def _size_and_l1(size: int, l1_size: int, cluster_bits: int = 16) -> Callable[[], bytes]:
    """Only the header cluster's first 4 KiB: the header must be refused
    before anything else is read."""
    def build():
        buf, _ = base_image(cluster_bits=cluster_bits)
        put(buf, ">Q", OFF_SIZE, size)
        return bytes(put(buf, ">I", OFF_L1_SIZE, l1_size)[:4096])
    return build


def _empty_l1_huge_disk() -> bytes:
    """A 1 PiB-ish disk (2 MiB clusters, L1 of 4096 entries, all empty) in a
    file of a few clusters' worth of header: must open and map at once."""
    buf = bytearray(4096)
    buf[0:4] = MAGIC
    cb = 21
    l2_entries = (1 << cb) // 8
    l1_size = 4096
    for fmt, off, v in ((">I", OFF_VERSION, 3), (">I", OFF_CLUSTER_BITS, cb),
                        (">Q", OFF_SIZE, l1_size * l2_entries << cb), (">I", OFF_L1_SIZE, l1_size),
                        (">Q", OFF_L1_OFFSET, 1 << cb), (">Q", OFF_REFTABLE_OFFSET, 2 << cb),
                        (">I", OFF_REFTABLE_CLUSTERS, 1), (">I", OFF_REFCOUNT_ORDER, 4),
                        (">I", OFF_HEADER_LENGTH, HEADER_LENGTH)):
        put(buf, fmt, off, v)
    # the L1 table sits in a hole of the file: it must still be inside it
    return bytes(buf) + bytes((1 << cb) - 4096) + bytes(l1_size * 8)


CASES: List[Case] = []


def case(name, expect, build, why="", format="qcow2"):
    CASES.append(Case(name, expect, build, why, format))


# -- the header itself --------------------------------------------------
for n in (0, 1, 3, 4, 8, 20, 48, 71, 72, 73, 100, 103):
    case(f"truncated-{n}", "error", _truncated(n), f"the first {n} bytes of a v3 header")
case("truncated-one-cluster", "any", lambda: bytes(base_image()[0][:512]),
     "the header cluster alone: L1 table past the end of the file, read as zeros (as qemu)")
case("version-0", "error", _patched(">I", OFF_VERSION, 0))
case("version-4", "error", _patched(">I", OFF_VERSION, 4))
case("version-ffffffff", "error", _patched(">I", OFF_VERSION, 0xFFFFFFFF))
for cb in (0, 8, 22, 31, 32, 63, 64, 0xFFFFFFFF):
    case(f"cluster-bits-{cb}", "error", _patched(">I", OFF_CLUSTER_BITS, cb))
case("cluster-bits-9-l1-too-small", "error", _patched(">I", OFF_CLUSTER_BITS, 9, cluster_bits=12),
     "4 KiB clusters read as 512-byte ones: one L2 table no longer covers the disk")
for hl in (0, 7, 72, 103, 4097, 0xFFFFFFF8, 0xFFFFFFFF):
    case(f"header-length-{hl}", "error", _patched(">I", OFF_HEADER_LENGTH, hl))
case("header-length-105", "any", _patched(">I", OFF_HEADER_LENGTH, 105),
     "not a multiple of 8: qemu reads extensions from byte 105")
case("refcount-order-7", "error", _patched(">I", OFF_REFCOUNT_ORDER, 7))
case("refcount-order-ffffffff", "error", _patched(">I", OFF_REFCOUNT_ORDER, 0xFFFFFFFF))
case("crypt-aes", "error", _patched(">I", OFF_CRYPT, 1))
case("crypt-luks", "error", _patched(">I", OFF_CRYPT, 2))
case("crypt-ffffffff", "error", _patched(">I", OFF_CRYPT, 0xFFFFFFFF))
case("compression-type-without-bit", "error", _patched(">B", OFF_COMPRESSION_TYPE, 1))
case("compression-type-zstd", "error",
     lambda: bytes(put(put(base_image()[0], ">Q", OFF_INCOMPAT, 1 << 3),
                       ">B", OFF_COMPRESSION_TYPE, 1)))
case("compression-type-ff", "error",
     lambda: bytes(put(put(base_image()[0], ">Q", OFF_INCOMPAT, 1 << 3),
                       ">B", OFF_COMPRESSION_TYPE, 0xFF)))
case("incompat-dirty", "error", _patched(">Q", OFF_INCOMPAT, 1))
case("incompat-corrupt", "error", _patched(">Q", OFF_INCOMPAT, 2))
case("incompat-data-file", "error", _patched(">Q", OFF_INCOMPAT, 4))
case("incompat-extl2", "error", _patched(">Q", OFF_INCOMPAT, 16))
case("incompat-bit-63-named", "error", _feature_bit(63, True))
case("incompat-bit-5-unnamed", "error", _feature_bit(5, False))
case("incompat-all-bits", "error", _patched(">Q", OFF_INCOMPAT, 0xFFFFFFFFFFFFFFFF))
case("compat-autoclear-all-bits", "any",
     lambda: bytes(put(put(base_image()[0], ">Q", OFF_COMPAT, 0xFFFFFFFFFFFFFFFF),
                       ">Q", OFF_AUTOCLEAR, 0xFFFFFFFFFFFFFFFF)),
     "unknown compatible/autoclear bits are ignorable by definition")
case("v2-header-only-empty-disk", "any", _v2_header_only, "72 bytes: a legal empty v2 image")
case("snapshots-garbage", "any",
     lambda: bytes(put(put(base_image()[0], ">I", OFF_NB_SNAPSHOTS, 0xFFFFFFFF),
                       ">Q", OFF_SNAPSHOTS_OFFSET, 0xFFFFFFFFFFFFFFFF)),
     "imgcopy does not read snapshots")

# -- sizes and the L1 table ---------------------------------------------
case("l1-size-ffffffff", "error", _patched(">I", OFF_L1_SIZE, 0xFFFFFFFF))
case("l1-size-32MiB-plus-1", "error", _patched(">I", OFF_L1_SIZE, (32 << 20) // 8 + 1))
case("l1-size-32MiB-beyond-eof", "any", _patched(">I", OFF_L1_SIZE, (32 << 20) // 8),
     "the largest L1 qemu allows, mostly past the end of the file (zeros, as qemu)")
case("l1-size-0-with-disk", "error", _patched(">I", OFF_L1_SIZE, 0))
case("l1-offset-beyond-eof", "any", _patched(">Q", OFF_L1_OFFSET, 1 << 40),
     "an L1 table past the end of the file reads as zeros, as in qemu")
case("l1-offset-far-beyond-eof", "error", _patched(">Q", OFF_L1_OFFSET, 0xFFFFFFFFFFFFF000))
case("l1-offset-0", "any", _l1_in_header, "the L1 table is the header: qemu reads it so")
case("l1-offset-misaligned", "error", _patched(">Q", OFF_L1_OFFSET, 3 * 4096 + 8, cluster_bits=12))
case("l1-straddles-eof", "any", _patched(">I", OFF_L1_SIZE, 4096),
     "the L1 table starts inside the file and ends past it (zeros there, as qemu)")
case("virtual-size-2^63-1", "error", _patched(">Q", OFF_SIZE, (1 << 63) - 1))
case("virtual-size-2^64-1", "error", _patched(">Q", OFF_SIZE, (1 << 64) - 1))
case("virtual-size-2^63-1-max-l1", "error",
     _size_and_l1((1 << 63) - 1, (32 << 20) // 8, cluster_bits=21))
case("virtual-size-2^64-1-max-l1-2M", "error",
     _size_and_l1((1 << 64) - 1, 0xFFFFFFFF, cluster_bits=21))
case("virtual-size-larger-than-l1", "error", _patched(">Q", OFF_SIZE, 4 << 30),
     "one L1 entry cannot map 4 GiB of 4 KiB clusters")
case("virtual-size-0", "any", _patched(">Q", OFF_SIZE, 0))
case("virtual-size-odd", "any", _patched(">Q", OFF_SIZE, (256 << 10) - 1))
case("huge-disk-empty-l1", "any", _empty_l1_huge_disk,
     "1 PiB of 2 MiB clusters with an empty L1: opens and maps at once")

# -- L1 and L2 entries --------------------------------------------------
case("l2-offset-header", "any", _l1_entry(COPIED | 0),
     "an L1 entry of offset 0 (the header cluster) means unallocated, as in qemu")
case("l2-offset-in-header-cluster", "error", _l1_entry(COPIED | 2048, cluster_bits=12),
     "512-aligned (what the L1 offset mask keeps) but inside the 4 KiB header cluster")
case("l2-offset-misaligned", "error", _l1_entry(COPIED | (4 * 4096 + 512), cluster_bits=12))
case("l2-offset-beyond-eof", "any", _l1_entry(COPIED | 1 << 40),
     "L2 tables past the end of the file read as zeros, as in qemu")
case("l2-offset-max", "any", _l1_entry(0xFFFFFFFFFFFFFFFF))
case("l2-is-the-l1-table", "any", _l1_entry(lambda lay: COPIED | lay.l1_offset),
     "metadata aliasing: legal to read, the L2 table is garbage")
case("l2-is-the-refcount-table", "any", _l1_entry(lambda lay: COPIED | lay.reftable_offset))
case("data-cluster-in-header", "error", _l2_entry(0, COPIED | 2048, cluster_bits=12))
case("data-cluster-is-header", "any", _l2_entry(0, COPIED),
     "COPIED with offset 0: unallocated, as qemu reads it (its check finds nothing wrong)")
case("data-cluster-misaligned", "error", _l2_entry(0, COPIED | (5 * 4096 + 1024),
                                                  cluster_bits=12))
case("data-cluster-beyond-eof", "any", _l2_entry(0, COPIED | 1 << 40),
     "data past the end of the file reads as zeros, as in qemu")
case("data-cluster-max-offset", "any", _l2_entry(0, COPIED | 0x00FFFFFFFFFFF000 & ~0xFFF))
case("data-cluster-is-l2-table", "any", _l2_entry(0, lambda lay: COPIED | lay.l2_offset))
case("data-cluster-reserved-bits", "any", _l2_entry(0, lambda lay: 0x3F00000000000000
                                                    | lay.data_offset))
case("zero-cluster-misaligned", "error", _l2_entry(1, ZERO | (5 * 4096 + 512), cluster_bits=12))
case("zero-cluster-v2", "any", _l2_entry(1, ZERO, version=2),
     "v2 has no zero flag: an entry of 1 is unallocated")

# -- compressed clusters ------------------------------------------------
case("compressed-garbage", "error", _garbage_compressed,
     "a compressed descriptor over bytes that do not inflate")
case("compressed-short", "error", _short_compressed,
     "a deflate stream that ends after half a cluster")
case("compressed-in-header", "error",
     _l2_entry(2, lambda lay: compressed_entry(100, 600, lay.cluster_bits)))
case("compressed-beyond-eof", "error", _compressed_beyond_eof,
     "zeros past the end of the file are no deflate stream")
case("compressed-max-sectors", "any", _compressed_max_sectors,
     "the data is valid, only its claimed length runs past the end of the file")
case("compressed-all-ones", "error", _l2_entry(2, 0xFFFFFFFFFFFFFFFF))
case("compressed-garbage-4k", "error", lambda: _garbage_compressed(cluster_bits=12))

# -- the refcount structures (only the preallocation detector reads them)
case("reftable-offset-beyond-eof", "any", _patched(">Q", OFF_REFTABLE_OFFSET, 1 << 40))
case("reftable-clusters-ffffffff", "error", _patched(">I", OFF_REFTABLE_CLUSTERS, 0xFFFFFFFF))
case("reftable-misaligned", "error", _patched(">Q", OFF_REFTABLE_OFFSET, 512 + 8))
case("prealloc-reftable-beyond-eof", "any", _prealloc_reftable_beyond_eof,
     "looks metadata-preallocated, refcount table past the end of the file")
case("prealloc-refblock-beyond-eof", "any", _prealloc_refblock_beyond_eof)
for order in (0, 1, 2, 3, 5, 6):
    case(f"prealloc-refcount-order-{order}", "any", _prealloc_refcount_order(order))

# -- header extensions and the backing file name ------------------------
case("extension-length-ffffffff", "error", _extension_length(0xFFFFFFFF))
case("extension-length-past-cluster", "error", _extension_length(512))
case("extension-length-unaligned-end", "any", _extension_length(512 - HEADER_LENGTH - 8 - 1),
     "an extension filling the header cluster, no end marker")
case("backing-file-size-5000", "error", _backing_size(5000))
case("backing-file-size-ffffffff", "error", _backing_size(0xFFFFFFFF))
case("backing-file-size-0", "any", _backing_size(0), "an empty name: no backing file (qemu)")
case("backing-file-size-1023-past-cluster", "error",
     lambda: bytes(put(put(base_image(backing=b"base.raw", backing_fmt=b"raw")[0], ">I",
                           OFF_BACKING_SIZE, 1023), ">Q", OFF_BACKING_OFFSET, 512 - 100)))
case("backing-offset-past-cluster", "error", _backing_offset_past_cluster)
case("backing-offset-max", "error", _patched(">Q", OFF_BACKING_OFFSET, 0xFFFFFFFFFFFFFFFF))
case("backing-name-overlaps-header", "any", _backing_overlapping_header,
     "the name is header bytes; a NUL ends it, as in qemu")
case("backing-name-with-nul", "error", _backing_name_with_nul)
case("backing-format-too-long", "error", _backing_fmt_too_long)
case("backing-format-vmdk", "error", _backing_name(b"base.raw", b"vmdk"))
case("backing-missing", "error", _backing_name(b"no-such-file.qcow2", b"qcow2"))
case("backing-is-a-directory", "error", _backing_name(b".", b"raw"))
case("backing-is-a-char-device", "error", _backing_name(b"/dev/zero", b"raw"))
case("backing-is-null-protocol", "error", _backing_name(b"null:", b"raw"),
     "imgcopy's own null: target name, read relative to the image (in the harness:"
     " a missing file; opened by a relative path from its directory: the null image)")
case("backing-self-loop", "error", _backing_name(b"input.qcow2", b"qcow2"),
     "the image is its own backing file")
case("backing-copy-loop", "error", _backing_name(b"base.qcow2", b"qcow2"),
     "input -> base.qcow2 (a copy of input) -> base.qcow2: a loop one level down")
case("backing-self-probed", "error", _backing_name(b"input.qcow2", None),
     "no backing format: the loop must be caught when probing too")
case("backing-raw", "any", _backing_name(b"base.raw", b"raw"),
     "a legal chain (the harness's base.raw), for coverage")

# -- amplification: small files describing huge numbers of extents ------
case("amplify-512-l1-8k", "any", _all_l1_same_l2(9, 8192),
     "512 B clusters, 8192 L1 entries -> one L2 table: 512 Ki alternating clusters")
case("amplify-64k-l1-8k", "any", _all_l1_same_l2(16, 8192),
     "64 KiB clusters, 8192 L1 entries -> one L2 table: 64 Mi alternating clusters, 4 TiB")
case("check-amplify-saturated-refcount", "any", _all_l1_same_l2(16, 8192, 0, True),
     "as amplify-64k-l1-8k, 1-bit refcounts, the data cluster is the L1 table's: a check "
     "finds 32 Mi references to a cluster whose count is at its maximum (qemu's overflow, "
     "each); the passes over the table are the same, each costs no scan")


# -- a check's work bounded by what the file holds ------------------------
case("check-l2-tables-in-turn", "any", lambda: _l2_tables_in_turn(),
     "8192 L1 entries name 100 L2 tables in turn, their entries name clusters of 8 "
     "refcount blocks in turn: each table's passes are remembered, the stored refcounts "
     "read once")
case("check-overlapping-l2-tables", "any", lambda: _overlapping_l2_tables(),
     "a 256 KiB file, 24 Ki L1 entries naming 100 L2 tables of 8192 entries that overlap "
     "each other (and the L1 table): more L2 entries than the file holds, a check stops")
case("check-snapshots-naming-one-l1", "any", lambda: _snapshots_naming_one_l1(),
     "1500 snapshots whose L1 table is the active one (16 Ki entries): 24 Mi L1 entries "
     "in a 214 KB file, a check stops")
case("check-reftable-8MiB-beyond-eof", "any", _reftable_beyond_eof,
     "an 8 MiB refcount table in a 2 KiB file: read as far as the file goes")
case("reftable-8MiB-beyond-eof-with-data", "any", lambda: _reftable_beyond_eof(True),
     "an 8 MiB refcount table in a 3 KiB file with a data cluster: the test for metadata "
     "preallocation reads the entries of the file's clusters, not the table")
case("check-snapshots-beyond-eof", "any", _snapshots_beyond_eof,
     "65535 snapshots, all past the end of the file: a check counts them, it does not read "
     "them one by one (qemu-img check agrees)")
case("check-bitmaps-in-use-tables-beyond-eof", "any",
     lambda: _bitmaps_beyond_eof(2000, True, 9, 32 << 10, 1 << 16),
     "2000 bitmaps in use, each with a table of 64 Ki entries past the end of a 66 KB "
     "file: a check reads them as far as the file goes (qemu-img check agrees)")
case("bitmaps-tables-overlapping", "error", lambda: _bitmaps_beyond_eof(2000, zeros=64 << 10),
     "2000 bitmaps of a 1 TiB disk whose tables all start in the last 64 KiB of the file: "
     "more entries than the file holds, refused at open")
case("bitmaps-tables-beyond-eof", "any", lambda: _bitmaps_beyond_eof(2000),
     "2000 bitmaps of a 1 TiB disk, each with a table of 64 Ki entries past the end of the "
     "file: open checks them as far as the file goes (qemu loads 256 MiB per bitmap)")

case("bitmap-bits-anywhere", "any", _bitmap_bits,
     "a bitmap whose table names a refcount block, a cluster of ones, a cluster far past "
     "the end of the file and a cluster of alternating granules: its dirty map is qemu's "
     "(tests/test_dirty_map.py compares it with qemu-nbd -B)")
case("bitmap-entry-reserved-bits", "error", lambda: _bitmap_bits([0, 1 << 60, 0, 0, 0]),
     "a bitmap table entry with reserved bits set: qemu refuses the image at open")
case("bitmap-ones-with-offset", "error", lambda: _bitmap_bits([0, 5 * 512 | 1, 0, 0, 0]),
     "a bitmap table entry naming a cluster and saying all ones: qemu refuses it at open")

CASES_BY_NAME: Dict[str, Case] = {c.name: c for c in CASES}
assert len(CASES_BY_NAME) == len(CASES), "duplicate case names"


# the fuzzer's -max_len: larger inputs would be cut, so they stay out of
# the corpus (tests/test_qcow2_hostile.py still runs them)
CORPUS_MAX = 262144


def write_all(outdir: str) -> List[str]:
    os.makedirs(outdir, exist_ok=True)
    paths = []
    for c in CASES:
        data = c.build()
        if len(data) > CORPUS_MAX:
            print(f"hostile-{c.name}: {len(data)} bytes, left out of the corpus")
            continue
        p = os.path.join(outdir, f"hostile-{c.name}.qcow2")
        with open(p, "wb") as f:
            f.write(data)
        paths.append(p)
    return paths


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "regressions", "qcow2")
    paths = write_all(out)
    total = sum(os.path.getsize(p) for p in paths)
    print(f"{len(paths)} hostile inputs, {total} bytes in {out}")
