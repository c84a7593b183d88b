"""Hand-made hostile VHDX files: a small valid image from
tests/gen/vhdx_images.py with fields overwritten (checksums made right
again where the damage is behind them, so that the check behind is what
is tested).  Each case says what a reader must do with it:

    "error"  opening, mapping or reading must raise ImageFormatError
    "any"    any outcome but a crash, a hang or a runaway allocation

Run as a script to (re)write the cases into tests/fuzz/regressions/vhdx/:

    python3 tests/fuzz/hostile_vhdx.py [OUTDIR]

A VHDX file is at least a few MiB, mostly zeros, so the fuzz harness
(fuzz_vhdx.c) takes its input as segments: an 8-byte record (u32 offset in
512-byte units, u32 length, little endian) followed by that many bytes, to be
placed at that offset of a sparse file; `to_segments` writes a file that
way.  Parent names in the cases follow the harness's private directory:
"input.vhdx" is the image itself, "base.vhdx" a copy of it.
"""
from __future__ import annotations

import os
import struct
import sys
import tempfile
from typing import Callable, Dict, List, Tuple

try:
    from ..gen import vhdx_images as vx
except ImportError:  # run as a script
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from tests.gen import vhdx_images as vx

MiB, KiB = vx.MiB, vx.KiB
PAGE = 512


def to_segments(image: bytes) -> bytes:
    """The harness's input for `image`: its non-zero 512-byte sectors, runs of
    them as one segment, and a last empty segment at the file's end (its
    size, in whole pages)."""
    out = bytearray()
    n = len(image)
    pages = -(-n // PAGE)
    i = 0
    while i < pages:
        if not any(image[i * PAGE:(i + 1) * PAGE]):
            i += 1
            continue
        j = i
        while j < pages and any(image[j * PAGE:(j + 1) * PAGE]):
            j += 1
        data = image[i * PAGE:min(j * PAGE, n)]
        out += struct.pack("<II", i, len(data)) + data
        i = j
    out += struct.pack("<II", pages, 0)
    return bytes(out)


def base(diff: bool = False, parent: str = "base.vhdx", **kw) -> Tuple[bytearray, vx.Layout]:
    """A valid image: 3 MiB + 512 in 1 MiB blocks (data, zero, partial or
    unmapped, data at the end), as bytes, and its layout."""
    blocks = {0: vx.Block(vx.FULLY_PRESENT, b"\x11" * 4096),
              1: vx.Block(vx.ZERO),
              3: vx.Block(vx.FULLY_PRESENT, b"\x33" * 512)}
    if diff:
        blocks[2] = vx.Block(vx.PARTIALLY_PRESENT, b"\x22" * 2048, (0, 2, 3))
    else:
        blocks[2] = vx.Block(vx.UNMAPPED)
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "x.vhdx")
        lay = vx.write_vhdx(p, 3 * MiB + 512, blocks,
                            parent={"relative_path": parent} if diff else None, **kw)
        with open(p, "rb") as f:
            return bytearray(f.read()), lay


def put(b: bytearray, off: int, fmt: str, *vals) -> None:
    struct.pack_into(fmt, b, off, *vals)


def fix_header(b: bytearray, off: int) -> None:
    b[off:off + 4096] = vx.with_checksum(bytes(b[off:off + 4096]))


def fix_regions(b: bytearray, lay: vx.Layout) -> None:
    table = vx.with_checksum(bytes(b[lay.region_table:lay.region_table + 64 * KiB]))
    for off in (lay.region_table, lay.region_table2):
        b[off:off + 64 * KiB] = table


def region_entry(lay: vx.Layout, i: int) -> int:
    return lay.region_table + 16 + 32 * i


def meta_entry(lay: vx.Layout, i: int) -> int:
    return lay.metadata + 32 + 32 * i


def item(lay: vx.Layout, name: str) -> int:
    return lay.metadata + lay.items[name][0]


def both_headers(b: bytearray, lay: vx.Layout, fmt: str, field: int, *vals) -> None:
    for h in (lay.header1, lay.header2):
        put(b, h + field, fmt, *vals)
        fix_header(b, h)


Case = Tuple[str, Callable[[], bytes]]
CASES: Dict[str, Tuple[str, Callable[[], bytes]]] = {}


def case(name: str, expect: str = "error"):
    def deco(fn):
        CASES[name] = (expect, fn)
        return fn
    return deco


@case("signature")
def _():
    b, _ = base()
    b[7:8] = b"X"
    return b


@case("headers-both-bad-crc")
def _():
    b, lay = base()
    b[lay.header1 + 100] ^= 1
    b[lay.header2 + 100] ^= 1
    return b


@case("header1-bad-crc", "any")
def _():
    b, lay = base()
    b[lay.header1 + 100] ^= 1
    return b


@case("headers-same-sequence")
def _():
    b, lay = base()
    both_headers(b, lay, "<Q", 8, 7)
    return b


@case("header-version-2")
def _():
    b, lay = base()
    both_headers(b, lay, "<H", 66, 2)
    return b


def log_entry(b: bytearray, lay: vx.Layout, guid: bytes, at: int = 0, sectors: int = 1) -> None:
    """An entry of the log `guid` names, `at` bytes into the log (it wraps
    around its end): the header of one with no descriptors, its checksum
    over all its sectors."""
    n = sectors * 4096
    e = bytearray(n)
    struct.pack_into("<4sIIIQII16sQQ", e, 0, b"loge", 0, n, 0, 1, 0, 0, guid,
                     len(b), len(b))
    e = bytearray(vx.with_checksum(bytes(e)))
    for i in range(n):
        b[lay.log_offset + (at + i) % lay.log_length] = e[i]


@case("log-to-replay")
def _():
    b, lay = base()
    both_headers(b, lay, "16s", 48, b"\x5a" * 16)
    log_entry(b, lay, b"\x5a" * 16)
    return b


@case("log-to-replay-wrapping")
def _():
    b, lay = base()
    both_headers(b, lay, "16s", 48, b"\x5a" * 16)
    log_entry(b, lay, b"\x5a" * 16, at=lay.log_length - 4096, sectors=3)
    return b


# a log GUID with nothing of its log in the log: closed cleanly, as qemu
# reads it (and so does imgcopy: test_vhdx checks it is read); entries of
# another GUID, or whose checksum fails, are nothing to replay either
@case("log-guid-empty-log", "any")
def _():
    b, lay = base()
    both_headers(b, lay, "16s", 48, b"\x5a" * 16)
    return b


@case("log-entry-of-another-log", "any")
def _():
    b, lay = base()
    both_headers(b, lay, "16s", 48, b"\x5a" * 16)
    log_entry(b, lay, b"\x5b" * 16)
    return b


@case("log-entry-bad-checksum", "any")
def _():
    b, lay = base()
    both_headers(b, lay, "16s", 48, b"\x5a" * 16)
    log_entry(b, lay, b"\x5a" * 16, at=8192)
    b[lay.log_offset + 8192 + 100] ^= 1
    return b


@case("log-offset-unaligned")
def _():
    b, lay = base()
    both_headers(b, lay, "<Q", 72, MiB + 512)
    return b


@case("log-overlaps-bat")
def _():
    b, lay = base()
    both_headers(b, lay, "<IQ", 68, 2 * MiB, 2 * MiB)
    return b


@case("regions-bad-crc")
def _():
    b, lay = base()
    b[lay.region_table + 40] ^= 1
    return b


@case("regions-count-huge")
def _():
    b, lay = base()
    put(b, lay.region_table + 8, "<I", 0xFFFFFFFF)
    fix_regions(b, lay)
    return b


@case("region-unknown-required")
def _():
    b, lay = base()
    put(b, lay.region_table + 8, "<I", 3)
    put(b, region_entry(lay, 2), "<16sQII", b"\x77" * 16, 40 * MiB, MiB, 1)
    fix_regions(b, lay)
    return b


@case("region-unknown-optional", "any")
def _():
    b, lay = base()
    put(b, lay.region_table + 8, "<I", 3)
    put(b, region_entry(lay, 2), "<16sQII", b"\x77" * 16, 40 * MiB, MiB, 0)
    fix_regions(b, lay)
    return b


@case("region-bat-twice")
def _():
    b, lay = base()
    put(b, lay.region_table + 8, "<I", 3)
    put(b, region_entry(lay, 2), "<16sQII", vx.BAT_GUID, lay.blocks[3], 4096, 1)
    fix_regions(b, lay)
    return b


@case("region-bat-overlaps-metadata")
def _():
    b, lay = base()
    put(b, region_entry(lay, 0) + 16, "<Q", lay.metadata + 4096)
    fix_regions(b, lay)
    return b


@case("region-bat-past-eof")
def _():
    b, lay = base()
    put(b, region_entry(lay, 0) + 16, "<QI", 1 << 40, 0xFFF00000)
    fix_regions(b, lay)
    return b


@case("region-bat-in-header")
def _():
    b, lay = base()
    put(b, region_entry(lay, 0) + 16, "<Q", 512 * KiB)
    fix_regions(b, lay)
    return b


@case("region-offset-overflow")
def _():
    b, lay = base()
    put(b, region_entry(lay, 0) + 16, "<QI", 0xFFFFFFFFFFFFF000, 0x100000)
    fix_regions(b, lay)
    return b


@case("metadata-signature")
def _():
    b, lay = base()
    b[lay.metadata] ^= 0xFF
    return b


@case("metadata-count-huge")
def _():
    b, lay = base()
    put(b, lay.metadata + 10, "<H", 0xFFFF)
    return b


@case("metadata-item-past-region")
def _():
    b, lay = base()
    put(b, meta_entry(lay, 1) + 16, "<I", 0xFFFFFFF0)
    return b


@case("metadata-item-in-table")
def _():
    b, lay = base()
    put(b, meta_entry(lay, 1) + 16, "<I", 0)
    return b


@case("metadata-items-overlap")
def _():
    b, lay = base()
    put(b, meta_entry(lay, 1) + 16, "<I", lay.items["params"][0] + 4)
    return b


@case("metadata-item-twice")
def _():
    b, lay = base()
    b[meta_entry(lay, 1):meta_entry(lay, 1) + 16] = vx.FILE_PARAMS
    return b


@case("metadata-no-disk-size")
def _():
    b, lay = base()
    b[meta_entry(lay, 1):meta_entry(lay, 1) + 16] = b"\x66" * 16
    put(b, meta_entry(lay, 1) + 24, "<I", 0)
    return b


@case("metadata-unknown-required")
def _():
    b, lay = base()
    b[meta_entry(lay, 2):meta_entry(lay, 2) + 16] = b"\x66" * 16  # page 83: optional here
    put(b, meta_entry(lay, 2) + 24, "<I", 4)
    return b


@case("block-size-3m")
def _():
    b, lay = base()
    put(b, item(lay, "params"), "<I", 3 * MiB)
    return b


@case("block-size-512m")
def _():
    b, lay = base()
    put(b, item(lay, "params"), "<I", 512 * MiB)
    return b


@case("logical-sector-1000")
def _():
    b, lay = base()
    put(b, item(lay, "logical_sector"), "<I", 1000)
    return b


@case("disk-size-2p63")
def _():
    b, lay = base()
    put(b, item(lay, "disk_size"), "<Q", 1 << 63)
    return b


@case("disk-size-64t-small-bat")
def _():
    b, lay = base()
    put(b, item(lay, "disk_size"), "<Q", 64 << 40)
    return b


@case("disk-size-0", "any")
def _():
    b, lay = base()
    put(b, item(lay, "disk_size"), "<Q", 0)
    return b


@case("disk-size-odd", "any")
def _():
    b, lay = base()
    put(b, item(lay, "disk_size"), "<Q", 3 * MiB + 777)
    return b


@case("bat-entry-past-eof")
def _():
    b, lay = base()
    put(b, lay.bat, "<Q", vx.FULLY_PRESENT | (1 << 50))
    return b


@case("bat-entry-in-header")
def _():
    b, lay = base()
    put(b, lay.bat, "<Q", vx.FULLY_PRESENT)
    return b


@case("bat-entry-on-metadata")
def _():
    b, lay = base()
    put(b, lay.bat, "<Q", vx.FULLY_PRESENT | lay.metadata)
    return b


@case("bat-entry-state-4")
def _():
    b, lay = base()
    put(b, lay.bat + 8, "<Q", 4)
    return b


@case("bat-partial-without-parent")
def _():
    b, lay = base()
    put(b, lay.bat + 16, "<Q", vx.PARTIALLY_PRESENT | lay.blocks[0])
    return b


@case("bat-last-block-truncated")
def _():
    b, lay = base()
    return b[:lay.blocks[3]]


@case("bat-blocks-alias", "any")
def _():
    b, lay = base()
    put(b, lay.bat + 24, "<Q", vx.FULLY_PRESENT | lay.blocks[0])
    return b


@case("diff-valid-self-loop")
def _():
    b, _ = base(diff=True, parent="input.vhdx")
    return b


@case("diff-valid-copy-loop")
def _():
    b, _ = base(diff=True, parent="base.vhdx")
    return b


@case("diff-parent-missing")
def _():
    b, _ = base(diff=True, parent="nothing-here.vhdx")
    return b


@case("diff-parent-outside")
def _():
    b, _ = base(diff=True, parent="..\\..\\..\\etc\\passwd")
    return b


@case("diff-no-locator")
def _():
    b, lay = base(diff=True)
    b[meta_entry(lay, 5):meta_entry(lay, 5) + 16] = b"\x66" * 16
    put(b, meta_entry(lay, 5) + 24, "<I", 0)
    return b


@case("diff-locator-type")
def _():
    b, lay = base(diff=True)
    b[item(lay, "parent_locator")] ^= 0xFF
    return b


@case("diff-locator-count-huge")
def _():
    b, lay = base(diff=True)
    put(b, item(lay, "parent_locator") + 18, "<H", 0xFFFF)
    return b


@case("diff-locator-key-outside")
def _():
    b, lay = base(diff=True)
    put(b, item(lay, "parent_locator") + 20, "<I", 0xFFFFFFF0)
    return b


@case("diff-locator-value-lone-surrogate")
def _():
    b, lay = base(diff=True)
    off = item(lay, "parent_locator")
    voff = struct.unpack_from("<I", b, off + 24)[0]
    put(b, off + voff, "<H", 0xD800)
    return b


@case("diff-bitmap-missing")
def _():
    b, lay = base(diff=True)
    put(b, lay.bat + 8 * lay.chunk_ratio, "<Q", 0)
    return b


@case("diff-bitmap-state-3")
def _():
    b, lay = base(diff=True)
    put(b, lay.bat + 8 * lay.chunk_ratio, "<Q", 3 | lay.bitmaps[0])
    return b


@case("diff-bitmap-past-eof")
def _():
    b, lay = base(diff=True)
    put(b, lay.bat + 8 * lay.chunk_ratio, "<Q", vx.SB_PRESENT | (1 << 45))
    return b


@case("bat-34MiB-in-holes", "any")
def _():
    """A 4 TiB disk of 1 MiB blocks: a BAT of 4 Mi entries (34 MiB), its
    region at the end of the file, all holes (zeros: not present) but for
    the base image's four entries.  The file holds 40 MiB, a few KiB of
    them data: the BAT is read as far as the file holds data."""
    b, lay = base()
    blocks = (4 << 40) // MiB
    entries = blocks + (blocks - 1) // lay.chunk_ratio
    length = -(-entries * 8 // MiB) * MiB
    at = len(b)
    put(b, item(lay, "disk_size"), "<Q", 4 << 40)
    put(b, region_entry(lay, 0) + 16, "<QI", at, length)
    fix_regions(b, lay)
    return b + b[lay.bat:lay.bat + MiB] + bytes(length - MiB)


# read in windows by the tests (a disk too big to read whole)
HUGE = {"bat-34MiB-in-holes"}


def write_all(outdir: str) -> List[str]:
    os.makedirs(outdir, exist_ok=True)
    names = []
    for name, (_, fn) in sorted(CASES.items()):
        p = os.path.join(outdir, "hostile-%s.seg" % name)
        with open(p, "wb") as f:
            f.write(to_segments(bytes(fn())))
        names.append(p)
    return names


if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "regressions", "vhdx")
    print("%d cases in %s" % (len(write_all(out)), out))
