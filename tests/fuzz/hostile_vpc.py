"""Hand-made hostile VHD (vpc) files, built byte by byte (no qemu needed)
from small valid images of tests/gen/vpc_images.py with fields overwritten.

Each case says what a reader must do with it:

    "error"  opening must raise ImageFormatError
    "any"    any outcome but a crash, a hang or a runaway allocation;
             tests/test_vpc.py checks that imgcopy reads these as qemu-img does

and whether qemu-img 7.2 opens it (`qemu_opens`): where imgcopy refuses
what qemu opens, it is on purpose (a differencing disk read without its
parent; disk types the specification does not define).

Run as a script to (re)write the cases into tests/fuzz/regressions/vpc/:

    python3 tests/fuzz/hostile_vpc.py [OUTDIR]

Files are named hostile-<case>.vhd.
"""
import os
import struct
import sys
from typing import Callable, Dict, NamedTuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from tests.gen import vpc_images as v  # noqa: E402

SIZE = 5 * 4096 + 1536        # a partial last block
BS = 4096


def base() -> bytearray:
    """A valid dynamic disk: blocks 0, 2 and 5 (the partial last one) allocated."""
    blocks = {0: b"\x11" * 4096, 2: b"\x22" * 1000, 5: b"\x55" * 1536}
    return v.dynamic(SIZE, blocks, block_size=BS)


def base_fixed() -> bytearray:
    return v.fixed(b"\x77" * 3000, 8192)


HDR = 512          # the dynamic header in base()
BAT = 1536         # its BAT


def footers(img: bytearray, fmt: str, at: int, *values) -> bytearray:
    """Both footers of a dynamic disk changed, and resealed."""
    for off in (0, len(img) - 512):
        v.patch(img, off + at, fmt, *values)
        v.reseal_footer(img, off)
    return img


def bat_entry(i: int, value: int) -> Callable[[], bytearray]:
    return lambda: v.patch(base(), BAT + 4 * i, "I", value)


def header_cut() -> bytearray:
    """A 1024-byte disk of 512-byte blocks whose file ends halfway through
    the dynamic header, the BAT (unallocated) kept in its parent name field."""
    ft = v.footer(disk_type=v.DYNAMIC, current_size=1024, data_offset=HDR)
    h = bytearray(v.dyn_header(table_offset=HDR + 64, entries=2, block_size=512))
    h[64:72] = b"\xff" * 8
    return bytearray(ft) + h[:512]


def bat_in_holes(entries: int = 48 << 10) -> bytearray:
    """base() with its BAT moved past its blocks and grown to `entries`
    entries: those past the sixth are zeros (holes of a sparse file), each
    a block at sector 0 (0xffffffff is unallocated), inside the file: legal,
    and past the virtual size."""
    b = base()
    body, end_footer = b[:-512], b[-512:]
    at = -(-len(body) // 4096) * 4096
    table = bytes(b[BAT:BAT + 4 * 6]).ljust(4 * entries, b"\0")
    out = body.ljust(at, b"\0") + table + end_footer
    v.patch(out, HDR + 16, "Q", at)
    return v.patch(out, HDR + 28, "I", entries)


class Case(NamedTuple):
    make: Callable[[], bytearray]
    expect: str          # "error" or "any"
    qemu_opens: bool


CASES: Dict[str, Case] = {
    "tiny-file": Case(lambda: bytearray(b"conectix"), "error", False),
    "no-magic": Case(lambda: bytearray(4096), "error", False),
    "footer0-bad-checksum": Case(lambda: v.patch(base(), 64, "I", 0x12345678), "error", False),
    "fixed-bad-checksum": Case(
        lambda: (lambda b: v.patch(b, len(b) - 512 + 64, "I", 0))(base_fixed()), "error", False),
    "footer0-damaged": Case(lambda: v.patch(base(), 0, "8s", b"conectiy"), "error", False),
    # qemu never reads a dynamic disk's last footer
    "end-footer-damaged": Case(
        lambda: (lambda b: v.patch(b, len(b) - 512, "8s", b"\0" * 8))(base()), "any", True),
    "end-footer-missing": Case(lambda: base()[:-512], "any", True),
    "header-bad-checksum": Case(lambda: v.patch(base(), HDR + 36, "I", 7), "any", True),
    "header-bad-magic": Case(lambda: v.patch(base(), HDR, "8s", b"cxsparsf"), "error", False),
    "header-past-eof": Case(lambda: footers(base(), "Q", 16, 1 << 40), "error", False),
    "header-offset-max": Case(lambda: footers(base(), "Q", 16, 2**64 - 1), "error", False),
    "header-straddles-eof": Case(
        lambda: (lambda b: footers(b, "Q", 16, len(b) - 600))(base()), "error", False),
    # a header cut inside its last sector: what it holds is enough
    "header-cut": Case(
        lambda: header_cut(), "any", True),
    "block-size-0": Case(lambda: v.patch(base(), HDR + 32, "I", 0), "error", False),
    "block-size-256": Case(lambda: v.patch(base(), HDR + 32, "I", 256), "error", False),
    "block-size-3000": Case(lambda: v.patch(base(), HDR + 32, "I", 3000), "error", False),
    "block-size-2g": Case(lambda: v.patch(base(), HDR + 32, "I", 1 << 31), "error", False),
    "block-size-8k": Case(lambda: v.patch(base(), HDR + 32, "I", 8192), "error", False),
    "bat-too-small": Case(lambda: v.patch(base(), HDR + 28, "I", 5), "error", False),
    "bat-entries-int-max": Case(lambda: v.patch(base(), HDR + 28, "I", 0x7FFFFFFF), "error",
                                False),
    "bat-entries-max": Case(lambda: v.patch(base(), HDR + 28, "I", 0xFFFFFFFF), "error", False),
    "bat-entries-past-eof": Case(lambda: v.patch(base(), HDR + 28, "I", 0x1FFFFFFF), "error",
                                 False),
    "bat-offset-past-eof": Case(lambda: v.patch(base(), HDR + 16, "Q", 1 << 40), "error",
                                False),
    "bat-offset-max": Case(lambda: v.patch(base(), HDR + 16, "Q", 2**64 - 4), "error", False),
    "bat-entry-past-eof": Case(bat_entry(1, 0x10000), "error", False),
    "bat-entry-max": Case(bat_entry(1, 0xFFFFFFFE), "error", False),
    "bat-entry-block-straddles-eof": Case(
        lambda: (lambda b: v.patch(b, BAT + 4, "I", (len(b) - 4096) // 512))(base()), "error",
        False),
    # legal to read: blocks over the metadata, two entries on one block
    "bat-entry-zero": Case(bat_entry(1, 0), "any", True),
    "bat-entries-shared": Case(
        lambda: (lambda b: v.patch(b, BAT + 4, "I", struct.unpack_from(">I", b, BAT)[0]))(
            base()), "any", True),
    # BAT entries past the virtual size, and one more than needed
    "bat-extra-entries": Case(lambda: v.patch(base(), HDR + 28, "I", 8), "any", True),
    "block-size-512": Case(
        lambda: v.dynamic(3000, {0: b"\x01" * 512, 4: b"\x04" * 512}, block_size=512), "any",
        True),
    "bitmap-zero": Case(
        lambda: v.dynamic(SIZE, {1: b"\x31" * 4096}, block_size=BS, bitmap_byte=0), "any",
        True),
    "size-over-2040g": Case(lambda: footers(base(), "Q", 48, 2041 << 30), "error", False),
    "size-max": Case(lambda: footers(base(), "Q", 48, 2**64 - 1), "error", False),
    "size-zero": Case(lambda: v.dynamic(0, {}, block_size=BS, entries=1), "any", True),
    # Virtual PC's rule: the size is the CHS geometry, not current_size
    "chs-larger-than-bat": Case(
        lambda: v.dynamic(SIZE, {0: b"\x01"}, block_size=BS, creator_app=b"vpc ",
                          geometry=(4, 4, 17)), "error", False),
    "chs-smaller": Case(
        lambda: v.dynamic(SIZE, {0: b"\x01" * 4096, 5: b"\x05" * 100}, block_size=BS,
                          creator_app=b"vpc ", geometry=(1, 2, 17)), "any", True),
    "chs-zero-heads": Case(
        lambda: v.dynamic(SIZE, {0: b"\x01"}, block_size=BS, creator_app=b"vpc ",
                          geometry=(100, 0, 17)), "any", True),
    # qemu opens these as dynamic disks; imgcopy refuses them by name
    "differencing": Case(lambda: v.dynamic(SIZE, {0: b"\x01"}, block_size=BS,
                                           disk_type=v.DIFFERENCING), "error", True),
    "type-0": Case(lambda: v.dynamic(SIZE, {0: b"\x01"}, block_size=BS, disk_type=0), "error",
                   True),
    "type-5": Case(lambda: v.dynamic(SIZE, {0: b"\x01"}, block_size=BS, disk_type=5), "error",
                   True),
    # a footer copy at 0 saying "fixed": qemu checks the dynamic header
    # and BAT, then reads the file as a fixed disk, from offset 0
    "fixed-type-dynamic-layout": Case(lambda: footers(base(), "I", 60, v.FIXED), "any", True),
    "fixed-footer-at-0": Case(
        lambda: bytearray(v.footer(disk_type=v.FIXED, current_size=4096)) + bytes(4096), "error",
        False),
    "fixed-end-footer-dynamic": Case(
        lambda: v.reseal_footer(v.patch(base_fixed(), 8192 + 60, "I", 3), 8192), "error",
        False),
    # a fixed footer claiming more than the file holds: qemu reads the
    # footer as data, then zeros
    "fixed-size-past-eof": Case(
        lambda: v.fixed(b"\x66" * 1000, 1024)[:-512] + v.footer(
            disk_type=v.FIXED, current_size=1 << 20), "any", True),
    # the file is its footer, so it starts with "conectix": a dynamic disk's
    # footer copy, without a dynamic header
    # qemu sees the file in whole sectors, zeros past its end: a last block
    # cut inside its last sector still opens, a BAT in a cut sector too
    "last-sector-cut": Case(lambda: base()[:-512 - 100], "any", True),
    "bat-in-cut-sector": Case(
        lambda: v.patch(v.dynamic(512, {}, block_size=512)[:1536 + 2], 1536, "H", 0),
        "any", True),
    # ... and a fixed footer that does not end a whole sector is not found
    # a BAT of 48 Ki entries, all but 6 in holes: read as far as the file
    # holds data (tests/test_table_bounds.py times one of 16 Mi entries)
    "bat-48k-entries-in-holes": Case(bat_in_holes, "any", True),
    "fixed-footer-unaligned": Case(lambda: v.fixed(b"\x12" * 1000, 1000), "error", False),
    "fixed-size-zero": Case(lambda: v.fixed(b"", 0), "error", False),
}


def write_all(outdir: str) -> None:
    os.makedirs(outdir, exist_ok=True)
    for name, case in sorted(CASES.items()):
        with open(os.path.join(outdir, "hostile-%s.vhd" % name), "wb") as f:
            f.write(bytes(case.make()))


if __name__ == "__main__":
    write_all(sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "regressions", "vpc"))
