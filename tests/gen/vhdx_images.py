"""VHDX images written byte by byte from [MS-VHDX] (qemu 7.2 cannot make
differencing ones, nor read them): the file identifier, two headers and
region tables with CRC-32C checksums, the metadata region, the BAT with
its sector bitmap entries, payload blocks and sector bitmap blocks.

- :func:`crc32c`: CRC-32C as VHDX stores it;
- :class:`Block`: what one payload block holds (a BAT state, its bytes,
  for a partially present block the sectors it holds);
- :func:`write_vhdx`: an image from a disk size, block size and blocks;
  returns a :class:`Layout` (where everything went, for hostile patches);
- :func:`guest_bytes`: the bytes a reader must see, given the parent's.

Tests check dynamic images from here against qemu-img (it reads those),
then trust the same writer for the differencing ones.
"""

import hashlib
import struct
import uuid
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

MiB = 1 << 20
KiB = 1 << 10

NOT_PRESENT, UNDEFINED, ZERO, UNMAPPED, FULLY_PRESENT, PARTIALLY_PRESENT = 0, 1, 2, 3, 6, 7
SB_PRESENT = 6


def _crc_table():
    t = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        t.append(c)
    return t


_TABLE = _crc_table()


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    t = _TABLE
    for b in data:
        crc = (crc >> 8) ^ t[(crc ^ b) & 0xFF]
    return crc ^ 0xFFFFFFFF


def with_checksum(buf: bytes, off: int = 4) -> bytes:
    """buf with its checksum field at `off` filled in."""
    b = bytearray(buf)
    b[off:off + 4] = b"\0\0\0\0"
    b[off:off + 4] = struct.pack("<I", crc32c(bytes(b)))
    return bytes(b)


def seeded_guid(*labels) -> bytes:
    """A GUID derived from `labels`: the same image every run."""
    return hashlib.sha256(repr(labels).encode()).digest()[:16]


def guid(s: str) -> bytes:
    """A GUID as VHDX stores it (Microsoft's mixed-endian layout)."""
    return uuid.UUID(s).bytes_le


BAT_GUID = guid("2dc27766-f623-4200-9d64-115e9bfd4a08")
METADATA_GUID = guid("8b7ca206-4790-4b9a-b8fe-575f050f886e")
FILE_PARAMS = guid("caa16737-fa36-4d43-b3b6-33f0aa44e76b")
DISK_SIZE = guid("2fa54224-cd1b-4876-b211-5dbed83bf4b8")
PAGE83 = guid("beca12ab-b2e6-4523-93ef-c309e000c746")
LOGICAL_SECTOR = guid("8141bf1d-a96f-4709-ba47-f233a8faab5f")
PHYSICAL_SECTOR = guid("cda348c7-445d-4471-9cc9-e9885251c556")
PARENT_LOCATOR = guid("a8d35f2d-b30b-454d-abf7-d3d84834ab0c")
PARENT_VHDX = guid("b04aefb7-d19e-4a81-b789-25b8e9445913")


@dataclass
class Block:
    """A payload block: its BAT state, its bytes (FULLY/PARTIALLY_PRESENT;
    shorter than the block: zeros after) and, when partially present, the
    sectors (indices inside the block) it holds."""
    state: int
    data: bytes = b""
    sectors: Tuple[int, ...] = ()


@dataclass
class Layout:
    """Where write_vhdx put things (file offsets)."""
    header1: int = 64 * KiB
    header2: int = 128 * KiB
    region_table: int = 192 * KiB
    region_table2: int = 256 * KiB
    log_offset: int = 1 * MiB
    log_length: int = 1 * MiB
    metadata: int = 2 * MiB
    metadata_length: int = 1 * MiB
    bat: int = 3 * MiB
    bat_length: int = 1 * MiB
    bat_entries: int = 0
    chunk_ratio: int = 0
    # metadata item name -> (offset in the region, length)
    items: Dict[str, Tuple[int, int]] = field(default_factory=dict)
    blocks: Dict[int, int] = field(default_factory=dict)   # payload block -> file offset
    bitmaps: Dict[int, int] = field(default_factory=dict)  # chunk -> file offset
    file_size: int = 0


def header(seq: int, log_guid: bytes = b"\0" * 16, log_offset: int = MiB,
           log_length: int = MiB, version: int = 1, log_version: int = 0,
           seed: object = 0) -> bytes:
    h = struct.pack("<4sIQ16s16s16sHHIQ", b"head", 0, seq, seeded_guid(seed, "file", seq),
                    seeded_guid(seed, "data"), log_guid, log_version, version, log_length,
                    log_offset)
    return with_checksum(h + b"\0" * (4096 - len(h)))


def region_table(entries: List[Tuple[bytes, int, int, int]]) -> bytes:
    """entries: (guid, file offset, length, required)."""
    t = struct.pack("<4sIII", b"regi", 0, len(entries), 0)
    for g, off, length, req in entries:
        t += struct.pack("<16sQII", g, off, length, req)
    return with_checksum(t + b"\0" * (64 * KiB - len(t)))


def locator(entries: Dict[str, str], type_guid: bytes = PARENT_VHDX) -> bytes:
    """A parent locator holding key/value pairs (UTF-16LE)."""
    head = struct.pack("<16sHH", type_guid, 0, len(entries))
    table, strings = b"", b""
    base = len(head) + 12 * len(entries)
    for k, v in entries.items():
        kb, vb = k.encode("utf-16-le"), v.encode("utf-16-le")
        ko = base + len(strings)
        strings += kb
        vo = base + len(strings)
        strings += vb
        table += struct.pack("<IIHH", ko, vo, len(kb), len(vb))
    return head + table + strings


def metadata_region(disk_size: int, block_size: int, lss: int, pss: int, flags: int,
                    parent: Optional[bytes], layout: Layout, seed: object = 0) -> bytes:
    items = [(FILE_PARAMS, struct.pack("<II", block_size, flags), 4, "params"),
             (DISK_SIZE, struct.pack("<Q", disk_size), 6, "disk_size"),
             (PAGE83, seeded_guid(seed, "page83"), 6, "page83"),
             (LOGICAL_SECTOR, struct.pack("<I", lss), 6, "logical_sector"),
             (PHYSICAL_SECTOR, struct.pack("<I", pss), 6, "physical_sector")]
    if parent is not None:
        items.append((PARENT_LOCATOR, parent, 4, "parent_locator"))
    table = struct.pack("<8sHH20s", b"metadata", 0, len(items), b"")
    data = b""
    for g, value, fl, name in items:
        off = 64 * KiB + len(data)
        layout.items[name] = (off, len(value))
        table += struct.pack("<16sIIII", g, off, len(value), fl, 0)
        data += value + b"\0" * (-len(value) % 8)
    region = table + b"\0" * (64 * KiB - len(table)) + data
    return region + b"\0" * (layout.metadata_length - len(region))


def write_vhdx(path, disk_size: int, blocks: Dict[int, Block], *, block_size: int = MiB,
               lss: int = 512, pss: int = 4096, parent: Optional[Dict[str, str]] = None,
               leave_allocated: bool = False, log_guid: bytes = b"\0" * 16,
               seed: object = 0) -> Layout:
    """A VHDX image; blocks not in `blocks` are NOT_PRESENT.  With
    `parent` (locator keys), a differencing image.  Its GUIDs come from
    `seed`."""
    lay = Layout()
    chunk = (1 << 23) * lss // block_size
    nblocks = -(-disk_size // block_size)
    if parent is not None:
        entries = -(-nblocks // chunk) * (chunk + 1)
    else:
        entries = nblocks + (nblocks - 1) // chunk if nblocks else 0
    lay.bat_entries, lay.chunk_ratio = entries, chunk
    lay.bat_length = max(MiB, -(-entries * 8 // MiB) * MiB)
    flags = (1 if leave_allocated else 0) | (2 if parent is not None else 0)
    loc = locator(parent) if parent is not None else None
    meta = metadata_region(disk_size, block_size, lss, pss, flags, loc, lay, seed)
    bat = [0] * entries
    body: List[Tuple[int, bytes]] = []
    pos = lay.bat + lay.bat_length
    bitmaps: Dict[int, bytearray] = {}
    for b in sorted(blocks):
        blk = blocks[b]
        idx = b + b // chunk
        off = 0
        if blk.state in (FULLY_PRESENT, PARTIALLY_PRESENT):
            off = pos
            lay.blocks[b] = off
            body.append((off, blk.data))
            pos += block_size
        bat[idx] = blk.state | off
        if blk.state == PARTIALLY_PRESENT:
            bm = bitmaps.setdefault(b // chunk, bytearray(MiB))
            first = (b % chunk) * (block_size // lss)
            for s in blk.sectors:
                bit = first + s
                bm[bit // 8] |= 1 << (bit % 8)
    for c, bm in sorted(bitmaps.items()):
        lay.bitmaps[c] = pos
        bat[c * (chunk + 1) + chunk] = SB_PRESENT | pos
        body.append((pos, bytes(bm)))
        pos += MiB
    lay.file_size = max(pos, lay.bat + lay.bat_length)
    ident = b"vhdxfile" + "imgcopy tests".encode("utf-16-le")
    regions = region_table([(BAT_GUID, lay.bat, lay.bat_length, 1),
                            (METADATA_GUID, lay.metadata, lay.metadata_length, 1)])
    with open(path, "wb") as f:
        f.truncate(lay.file_size)
        for off, data in [(0, ident), (lay.header1, header(1, log_guid, seed=seed)),
                          (lay.header2, header(2, log_guid, seed=seed)),
                          (lay.region_table, regions),
                          (lay.region_table2, regions), (lay.metadata, meta),
                          (lay.bat, struct.pack("<%dQ" % entries, *bat))] + body:
            f.seek(off)
            f.write(data)
    return lay


def guest_bytes(disk_size: int, blocks: Dict[int, Block], parent: Optional[bytes] = None, *,
                block_size: int = MiB, lss: int = 512) -> bytes:
    """What a reader must return for the image write_vhdx made: the
    parent's bytes (zeros without one) where this layer holds nothing;
    UNDEFINED is the parent's in a differencing image, zeros otherwise."""
    out = bytearray(parent if parent is not None else bytes(disk_size))
    out = out[:disk_size] + bytearray(max(0, disk_size - len(out)))
    for b, blk in blocks.items():
        start = b * block_size
        end = min(start + block_size, disk_size)
        data = blk.data + bytes(block_size - len(blk.data))
        if blk.state == FULLY_PRESENT:
            out[start:end] = data[:end - start]
        elif blk.state in (ZERO, UNMAPPED) or (blk.state == UNDEFINED and parent is None):
            out[start:end] = bytes(end - start)
        elif blk.state == PARTIALLY_PRESENT:
            for s in blk.sectors:
                a = start + s * lss
                if a < end:
                    out[a:min(a + lss, end)] = data[s * lss:s * lss + min(lss, end - a)]
    return bytes(out)


def data_write_guid(path) -> str:
    """The active header's data write GUID, as a parent locator's
    parent_linkage spells it ("{...}")."""
    with open(path, "rb") as f:
        best = None
        for off in (64 * KiB, 128 * KiB):
            f.seek(off)
            h = f.read(4096)
            seq = struct.unpack_from("<Q", h, 8)[0]
            if h[:4] == b"head" and (best is None or seq > best[0]):
                best = (seq, h[32:48])
    assert best is not None, path
    return "{%s}" % uuid.UUID(bytes_le=best[1])
