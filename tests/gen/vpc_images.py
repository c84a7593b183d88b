"""VHD (qemu's "vpc") images written byte by byte, for what qemu-img cannot
make: dynamic disks with small blocks, other creators' size rules, and the
hostile variants of tests/fuzz/hostile_vpc.py.  Nothing here decides what
a reader must make of an image: the tests ask qemu-img.

- :func:`footer`, :func:`dyn_header`: the two structures, checksummed
  unless told otherwise;
- :func:`dynamic`: a dynamic disk (footer copy, header, BAT, blocks of a
  sector bitmap and data, footer);
- :func:`fixed`: a fixed disk (the guest bytes, then the footer);
- :func:`checksum`, :func:`patch`: recomputing and overwriting fields.
"""
import struct
from typing import Dict, Optional, Tuple, Union

SECTOR = 512
UNALLOCATED = 0xFFFFFFFF
FIXED, DYNAMIC, DIFFERENCING = 2, 3, 4
NO_OFFSET = 0xFFFFFFFFFFFFFFFF
MAX_GEOMETRY = (65535, 16, 255)

# footer field offsets (Microsoft's "Virtual Hard Disk Image Format Specification")
F_DATA_OFFSET = 16
F_CREATOR_APP = 28
F_CURRENT_SIZE = 48
F_GEOMETRY = 56
F_TYPE = 60
F_CHECKSUM = 64
# dynamic header field offsets
H_TABLE_OFFSET = 16
H_MAX_ENTRIES = 28
H_BLOCK_SIZE = 32
H_CHECKSUM = 36


def checksum(buf: Union[bytes, bytearray], at: int) -> int:
    """One's complement of the byte sum, the 4-byte field at `at` counted as zero."""
    return ~(sum(buf) - sum(buf[at:at + 4])) & 0xFFFFFFFF


def _sealed(buf: bytearray, at: int, value: Optional[int]) -> bytes:
    struct.pack_into(">I", buf, at, checksum(buf, at) if value is None else value)
    return bytes(buf)


def footer(*, disk_type: int, current_size: int, data_offset: int = NO_OFFSET,
           creator_app: bytes = b"qem2", geometry: Tuple[int, int, int] = MAX_GEOMETRY,
           check: Optional[int] = None) -> bytes:
    """A 512-byte footer; `check` overrides the checksum."""
    f = bytearray(SECTOR)
    f[0:8] = b"conectix"
    struct.pack_into(">IIQI", f, 8, 2, 0x00010000, data_offset, 0)
    f[F_CREATOR_APP:F_CREATOR_APP + 4] = creator_app
    struct.pack_into(">HH", f, 32, 5, 3)
    f[36:40] = b"Wi2k"
    struct.pack_into(">QQHBBI", f, 40, current_size, current_size, *geometry, disk_type)
    f[68:84] = bytes(range(1, 17))
    return _sealed(f, F_CHECKSUM, check)


def dyn_header(*, table_offset: int, entries: int, block_size: int,
               check: Optional[int] = None) -> bytes:
    """A 1024-byte dynamic disk header ("cxsparse")."""
    h = bytearray(1024)
    h[0:8] = b"cxsparse"
    struct.pack_into(">QQIII", h, 8, NO_OFFSET, table_offset, 0x00010000, entries, block_size)
    return _sealed(h, H_CHECKSUM, check)


def bitmap_size(block_size: int) -> int:
    return (block_size // (8 * SECTOR) + SECTOR - 1) // SECTOR * SECTOR


def dynamic(size: int, blocks: Dict[int, bytes], *, block_size: int = 4096,
            creator_app: bytes = b"qem2", geometry: Tuple[int, int, int] = MAX_GEOMETRY,
            entries: Optional[int] = None, bitmap_byte: int = 0xFF,
            disk_type: int = DYNAMIC) -> bytearray:
    """A dynamic disk of `size` bytes (footer current_size) whose block i
    holds blocks[i] (padded with zeros); blocks are stored in reverse order
    of their index, so the host offsets do not follow the guest's."""
    n = entries if entries is not None else -(-size // block_size)
    bat_bytes = -(-n * 4 // SECTOR) * SECTOR
    data_start = 1536 + bat_bytes
    bat = [UNALLOCATED] * n
    body = bytearray()
    for i in sorted(blocks, reverse=True):
        bat[i] = (data_start + len(body)) // SECTOR
        body += bytes([bitmap_byte]) * bitmap_size(block_size)
        body += blocks[i].ljust(block_size, b"\0")
    ft = footer(disk_type=disk_type, current_size=size, data_offset=512,
                creator_app=creator_app, geometry=geometry)
    out = bytearray(ft)
    out += dyn_header(table_offset=1536, entries=n, block_size=block_size)
    out += struct.pack(">%dI" % n, *bat).ljust(bat_bytes, b"\xff")
    out += body
    out += ft
    return out


def fixed(data: bytes, size: int, *, creator_app: bytes = b"qem2",
          geometry: Tuple[int, int, int] = MAX_GEOMETRY) -> bytearray:
    """A fixed disk: `data` padded to `size` bytes, then the footer."""
    out = bytearray(data.ljust(size, b"\0"))
    out += footer(disk_type=FIXED, current_size=size, creator_app=creator_app,
                  geometry=geometry)
    return out


def patch(img: bytearray, at: int, fmt: str, *values) -> bytearray:
    """img with struct `fmt` (big-endian) written at `at`."""
    struct.pack_into(">" + fmt.lstrip(">"), img, at, *values)
    return img


def reseal_footer(img: bytearray, at: int) -> bytearray:
    """Recompute the checksum of the footer at `at`."""
    f = img[at:at + SECTOR]
    struct.pack_into(">I", img, at + F_CHECKSUM, checksum(f, F_CHECKSUM))
    return img


_VALUES = [0, 1, 2, 3, 4, 5, 511, 512, 513, 1024, 4096, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFE,
           0xFFFFFFFF]
_APPS = [b"vpc ", b"qemu", b"qem2", b"win ", b"d2v ", b"tap\0", b"CTXS", b"xxxx"]


def mutate(img: bytes, rng) -> bytearray:
    """img with one to three of: a field of the footer copy at 0 or of the
    last footer changed (and the footer resealed), a field of a dynamic
    header at 512 changed, a BAT entry at 1536 changed, the file cut, a
    byte changed.  Seeded by `rng` (random.Random)."""
    b = bytearray(img)
    for _ in range(rng.randint(1, 3)):
        kind = rng.randrange(6)
        if kind in (0, 4) and len(b) >= SECTOR:
            at = 0 if kind == 0 else len(b) - SECTOR
            field = rng.choice([F_DATA_OFFSET + 4, F_CREATOR_APP, F_CURRENT_SIZE + 4,
                                F_GEOMETRY, F_GEOMETRY + 2, F_TYPE])
            if field == F_CREATOR_APP:
                b[at + field:at + field + 4] = rng.choice(_APPS)
            elif field == F_GEOMETRY:
                struct.pack_into(">H", b, at + field, rng.choice([0, 1, 65535, rng.randrange(65536)]))
            elif field == F_GEOMETRY + 2:
                struct.pack_into(">BB", b, at + field, rng.randrange(256), rng.randrange(256))
            else:
                struct.pack_into(">I", b, at + field, rng.choice(_VALUES + [rng.randrange(1 << 32)]))
            reseal_footer(b, at)
        elif kind == 1 and len(b) >= 1024:
            field = rng.choice([H_TABLE_OFFSET, H_TABLE_OFFSET + 4, H_MAX_ENTRIES, H_BLOCK_SIZE])
            struct.pack_into(">I", b, 512 + field, rng.choice(_VALUES + [rng.randrange(1 << 32)]))
        elif kind == 2 and len(b) > 1536 + 4:
            i = rng.randrange(min(64, (len(b) - 1536) // 4))
            struct.pack_into(">I", b, 1536 + 4 * i,
                             rng.choice(_VALUES + [rng.randrange(len(b) // SECTOR + 2)]))
        elif kind == 3:
            del b[rng.randrange(1, len(b) + 1):]
        elif b:
            b[rng.randrange(len(b))] = rng.randrange(256)
    return b
