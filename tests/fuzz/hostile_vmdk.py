"""Hand-made hostile vmdk files, built byte by byte (no qemu needed).

`sparse()` lays out a small valid hosted sparse extent (monolithicSparse,
or streamOptimized with compressed grains and markers, optionally with
its header in a footer); every hostile case is such a file or a
descriptor text with fields overwritten.  Each case says what a reader
must do with it:

    "error"  opening, mapping or reading must raise ImageFormatError or
             OSError (imgcopy must notice the damage)
    "any"    any outcome but a crash, a hang or a runaway allocation
             (the damage is legal to read, or qemu reads it too)

The files a case may name are those the fuzz harness lays out beside its
input (tests/fuzz/fuzz_vmdk.c): "input.vmdk" (the input itself),
"base.vmdk" (a copy of it), "flat.vmdk" (1 MiB of raw data) and
"sparse.vmdk" (a valid sparse extent of 1 MiB); `helper_files()` gives
the test the same layout.

Run as a script to (re)write the cases into tests/fuzz/regressions/vmdk/:

    python3 tests/fuzz/hostile_vmdk.py [OUTDIR]
"""
from __future__ import annotations

import os
import struct
import sys
import zlib
from typing import Dict, Optional, Tuple

SECTOR = 512
GD_AT_END = (1 << 64) - 1
FLAG_NL = 1
FLAG_ZERO_GRAIN = 1 << 2
FLAG_COMPRESS = 1 << 16
FLAG_MARKER = 1 << 17


def header(*, version=1, flags=FLAG_NL, capacity=2048, granularity=8, desc_offset=1,
           desc_size=20, gtes=512, rgd_offset=0, gd_offset=21, grain_offset=32,
           compress=0) -> bytes:
    h = struct.pack("<4sIIQQQQIQQQB4sH", b"KDMV", version, flags, capacity, granularity,
                    desc_offset, desc_size, gtes, rgd_offset, gd_offset, grain_offset, 0,
                    b"\n \r\n", compress)
    return h.ljust(SECTOR, b"\0")


def descriptor(create_type="monolithicSparse", extents=('RW 2048 SPARSE "input.vmdk"',),
               cid="1234abcd", parent_cid="ffffffff", hint=None, eol="\n") -> bytes:
    lines = ["# Disk DescriptorFile", "version=1", "CID=" + cid, "parentCID=" + parent_cid,
             'createType="%s"' % create_type]
    if hint is not None:
        lines.append('parentFileNameHint="%s"' % hint)
    lines += ["", "# Extent description", *extents, "", "# The Disk Data Base", "#DDB", "",
              'ddb.virtualHWVersion = "4"', 'ddb.adapterType = "ide"']
    return (eol.join(lines) + eol).encode()


def pad(b: bytes, n=SECTOR) -> bytes:
    return b + b"\0" * (-len(b) % n)


def grain_bytes(i: int, grain: int) -> bytes:
    return bytes((i * 37 + j) % 251 + 1 for j in range(256)) * (grain // 256)


def sparse(*, grains=(0, 3, 17), capacity=2048, granularity=8, gtes=512, stream=False,
           footer=False, zeroed=(), hint=None, desc: Optional[bytes] = None,
           patch_gte: Optional[Dict[int, int]] = None, marker=None, version=1,
           **hdr) -> bytes:
    """A sparse extent: header, embedded descriptor (sectors 1..20), grain
    directory at sector 21, grain tables after it, then the grains (compressed
    with markers when `stream`).  `zeroed`: grain indices with GTE 1 (and the
    zeroed-grain flag); `marker(i, lba, size, data)` may rewrite a grain's
    marker and data."""
    grain = granularity * SECTOR
    ngt = -(-capacity // (gtes * granularity)) if capacity else 0
    gt_sectors = -(-gtes * 4 // SECTOR)
    gd_sectors = max(1, -(-ngt * 4 // SECTOR))
    gd_off = 21
    gt_off = gd_off + gd_sectors
    data_off = max(32, gt_off + ngt * gt_sectors)
    data_off = -(-data_off // granularity) * granularity if not stream else data_off
    body = bytearray()
    gte = [0] * (ngt * gtes)
    for i in grains:
        g = grain_bytes(i, grain)
        sec = data_off + len(body) // SECTOR
        if stream:
            z = zlib.compress(g)
            lba, size, data = i * granularity, len(z), z
            if marker:
                lba, size, data = marker(i, lba, size, data)
            body += pad(struct.pack("<QI", lba, size) + data)
        else:
            body += g
        gte[i] = sec
    for i in zeroed:
        gte[i] = 1
    for i, v in (patch_gte or {}).items():
        gte[i] = v
    flags = FLAG_NL | (FLAG_ZERO_GRAIN if zeroed else 0)
    if stream:
        flags |= FLAG_COMPRESS | FLAG_MARKER
    fields = dict(version=version, flags=flags, capacity=capacity, granularity=granularity,
                  gtes=gtes, gd_offset=gd_off, grain_offset=data_off,
                  compress=1 if stream else 0)
    fields.update(hdr)
    real = dict(fields)
    if footer:
        fields["gd_offset"] = GD_AT_END
    out = bytearray(header(**fields))
    if desc is None:
        desc = descriptor("streamOptimized" if stream else "monolithicSparse", hint=hint)
    out += pad(desc).ljust(20 * SECTOR, b"\0")[:20 * SECTOR]
    gd = [gt_off + k * gt_sectors for k in range(ngt)]
    out += pad(struct.pack("<%dI" % ngt, *gd)).ljust(gd_sectors * SECTOR, b"\0")
    for k in range(ngt):
        out += pad(struct.pack("<%dI" % gtes, *gte[k * gtes:(k + 1) * gtes]))
    out = out.ljust(data_off * SECTOR, b"\0")
    out += body
    if footer:
        out += struct.pack("<QII", 0, 0, 3).ljust(SECTOR, b"\0")
        out += header(**real)
        out += struct.pack("<QII", 0, 0, 0).ljust(SECTOR, b"\0")
    return bytes(out)


def helper_files() -> Dict[str, bytes]:
    """What the fuzz harness puts beside its input (but base.vmdk, its copy)."""
    flat = b"".join(bytes([(i % 200) + 1]) * 4096 if i % 3 else bytes(4096)
                    for i in range(256))
    return {"flat.vmdk": flat, "sparse.vmdk": sparse(desc=descriptor(extents=()))}


def _desc(**kw) -> bytes:
    kw.setdefault("create_type", "twoGbMaxExtentFlat")
    kw.setdefault("extents", ('RW 2048 FLAT "flat.vmdk" 0',))
    return descriptor(**kw)


def _set(b: bytes, off: int, fmt: str, *v) -> bytes:
    out = bytearray(b)
    struct.pack_into(fmt, out, off, *v)
    return bytes(out)


def _bad_stream(kind):
    def marker(i, lba, size, data):
        if i != 3:
            return lba, size, data
        if kind == "size0":
            return lba, 0, data
        if kind == "size-huge":
            return lba, 0xFFFFFFF0, data
        if kind == "short":
            return lba, size, zlib.compress(b"\x11" * 1000)
        if kind == "long":
            return lba, size, zlib.compress(b"\x11" * (8 * SECTOR + 512))
        if kind == "garbage":
            return lba, size, bytes(range(1, 200)) * 4
        if kind == "lba":
            return lba + 999, size, data
        if kind == "raw-deflate":
            c = zlib.compressobj(9, zlib.DEFLATED, -15)
            return lba, size, c.compress(grain_bytes(3, 8 * SECTOR)) + c.flush()
        raise KeyError(kind)
    return marker


# name: (bytes of input.vmdk, expectation)
CASES: Dict[str, Tuple[bytes, str]] = {}


def case(name, data, expect):
    CASES[name] = (data, expect)


# sparse headers
case("version-4", sparse(version=4), "error")
case("version-3", sparse(version=3), "any")
case("gtes-0", _set(sparse(), 44, "<I", 0), "error")
case("gtes-513", _set(sparse(), 44, "<I", 513), "error")
case("gtes-ffffffff", _set(sparse(), 44, "<I", 0xFFFFFFFF), "error")
case("granularity-0", _set(sparse(), 20, "<Q", 0), "error")
case("granularity-too-big", _set(sparse(), 20, "<Q", 0x200001), "error")
case("granularity-2-63", _set(sparse(), 20, "<Q", 1 << 63), "error")
case("granularity-3", _set(sparse(), 20, "<Q", 3), "any")
case("capacity-2-63", _set(sparse(), 12, "<Q", 1 << 63), "error")
case("capacity-2-62-big-grains", _set(_set(sparse(), 12, "<Q", 1 << 62), 20, "<Q", 0x200000),
     "error")
case("capacity-past-gd", _set(sparse(), 12, "<Q", 1 << 40), "any")
# 94,489,282,560 sectors (44 TiB) of 8-sector grains, 512 per table: a
# grain directory of 23 Mi entries (92 MB) claimed by a file of 27 KB;
# past the end of the file its entries read as zeros (unallocated), as qemu
# reads them
case("capacity-gd-92MB-past-eof", _set(sparse(), 12, "<Q", 94489282560), "any")
case("gd-past-eof", _set(sparse(), 56, "<Q", 1 << 30), "any")
case("gd-offset-2-60", _set(sparse(), 56, "<Q", 1 << 60), "error")
case("gt-past-eof", _set(sparse(), 21 * SECTOR, "<I", 0xFFFFFFF0), "any")
case("grain-past-eof", sparse(patch_gte={5: 0xFFFFFF00}), "any")
case("grain-in-header", sparse(patch_gte={6: 1}), "any")
case("grain-offset-past-eof", _set(sparse(), 64, "<Q", 1 << 40), "error")
case("desc-offset-huge", _set(sparse(), 28, "<Q", 1 << 62), "any")
case("desc-size-huge", _set(sparse(), 36, "<Q", 1 << 62), "any")
case("no-cid", sparse(desc=b"# nothing\n"), "error")
case("cid-not-hex", sparse(desc=b"CID=zz\nparentCID=ffffffff\n"), "error")
case("desc-no-nul", sparse(desc=b"x" * (20 * SECTOR)), "error")
case("zeroed-grains", sparse(zeroed=(1, 2, 30)), "any")
case("many-gts", sparse(gtes=16, grains=(0, 3, 17, 40, 255), zeroed=(100,)), "any")
case("stream-many-gts", sparse(gtes=16, grains=(0, 3, 17, 40, 255), stream=True), "any")
case("gte-1-without-flag", sparse(patch_gte={1: 1}), "any")
case("cowd-magic", b"COWD" + sparse()[4:], "error")
case("tiny", b"KDM", "error")
case("capacity-0-self-descriptor",
     _set(sparse(desc=descriptor("twoGbMaxExtentSparse", extents=('RW 2048 SPARSE '
                                                                  '"input.vmdk"',))),
          12, "<Q", 0), "error")
case("capacity-0-descriptor-flat",
     _set(sparse(desc=_desc()), 12, "<Q", 0), "any")
case("parent-is-self", sparse(hint="input.vmdk"), "error")
case("parent-is-copy", sparse(hint="base.vmdk"), "error")
case("parent-unterminated", sparse(desc=b'CID=1\nparentCID=2\nparentFileNameHint="abc\n'),
     "error")

# streams
case("stream", sparse(stream=True), "any")
case("stream-footer", sparse(stream=True, footer=True), "any")
case("stream-footer-missing", _set(sparse(stream=True), 56, "<Q", GD_AT_END), "error")
case("stream-footer-gd-at-end",
     sparse(stream=True, footer=True)[:-1024] +
     _set(sparse(stream=True, footer=True)[-1024:], 56 + 0, "<Q", GD_AT_END), "error")
for kind in ("size0", "size-huge", "short", "long", "garbage", "raw-deflate"):
    case("stream-marker-" + kind, sparse(stream=True, marker=_bad_stream(kind)), "error")
case("stream-marker-lba", sparse(stream=True, marker=_bad_stream("lba")), "any")
case("stream-grain-past-eof", sparse(stream=True, patch_gte={9: 0xFFFFFF00}), "error")
case("stream-huge-grains", _set(sparse(stream=True), 20, "<Q", 0x100000), "error")

# descriptor files
case("desc-flat", _desc(), "any")
case("desc-two-extents", _desc(extents=('RW 1000 FLAT "flat.vmdk" 0',
                                        'RW 2048 SPARSE "sparse.vmdk"',
                                        'RW 1048 FLAT "flat.vmdk" 1000')), "any")
case("desc-crlf", _desc(eol="\r\n"), "any")
case("desc-no-create-type", b'CID=1\nparentCID=ffffffff\nRW 8 FLAT "flat.vmdk" 0\n', "error")
case("desc-monolithic-sparse", _desc(create_type="monolithicSparse"), "error")
case("desc-vmfs-sparse", _desc(create_type="vmfsSparse"), "error")
case("desc-se-sparse", _desc(create_type="seSparse"), "error")
case("desc-custom", _desc(create_type="custom"), "error")
case("desc-no-quotes", _desc(extents=("RW 2048 FLAT flat.vmdk 0",)), "error")
case("desc-unterminated-quote", _desc(extents=('RW 2048 FLAT "flat.vmdk 0',)), "error")
case("desc-huge-sectors", _desc(extents=('RW 99999999999999999999 FLAT "flat.vmdk" 0',)),
     "error")
case("desc-sectors-2-60", _desc(extents=('RW %d FLAT "flat.vmdk" 0' % (1 << 60),)), "error")
case("desc-negative-sectors", _desc(extents=('RW -5 FLAT "flat.vmdk" 0',)), "error")
case("desc-flat-no-offset", _desc(extents=('RW 2048 FLAT "flat.vmdk"',)), "error")
case("desc-flat-offset-huge", _desc(extents=('RW 2048 FLAT "flat.vmdk" %d' % (1 << 60),)),
     "error")
case("desc-flat-offset-past-eof", _desc(extents=('RW 2048 FLAT "flat.vmdk" 100000',)), "any")
case("desc-vmfs-offset", _desc(create_type="vmfs", extents=('RW 2048 VMFS "flat.vmdk" 0',)),
     "error")
case("desc-vmfs", _desc(create_type="vmfs", extents=('RW 2048 VMFS "flat.vmdk"',)), "any")
case("desc-sparse-offset", _desc(extents=('RW 2048 SPARSE "sparse.vmdk" 0',)), "error")
case("desc-zero-extent", _desc(extents=("RW 2048 ZERO",)), "error")
case("desc-vmfssparse-extent", _desc(extents=('RW 2048 VMFSSPARSE "sparse.vmdk"',)), "error")
case("desc-unknown-extent", _desc(extents=('RW 2048 WEIRD "flat.vmdk"',)), "error")
case("desc-rdonly", _desc(extents=('RDONLY 2048 FLAT "flat.vmdk" 0',)), "error")
case("desc-outside", _desc(extents=('RW 2048 FLAT "../flat.vmdk" 0',)), "error")
case("desc-absolute", _desc(extents=('RW 2048 FLAT "/etc/passwd" 0',)), "error")
case("desc-missing-file", _desc(extents=('RW 2048 FLAT "nothere.vmdk" 0',)), "error")
case("desc-long-name", _desc(extents=('RW 2048 FLAT "%s" 0' % ("a" * 600),)), "error")
case("desc-self-sparse", _desc(extents=('RW 2048 SPARSE "input.vmdk"',)), "error")
case("desc-self-flat", _desc(extents=('RW 2048 FLAT "input.vmdk" 0',)), "any")
case("desc-sparse-is-flat", _desc(extents=('RW 2048 SPARSE "flat.vmdk"',)), "error")
case("desc-no-extents", _desc(extents=()), "error")
case("desc-many-extents", _desc(extents=['RW 1 FLAT "flat.vmdk" %d' % i
                                         for i in range(1100)]), "error")
case("desc-1000-extents", _desc(extents=['RW 2 FLAT "flat.vmdk" %d' % i
                                         for i in range(1000)]), "any")
case("desc-huge-line", _desc(extents=("#" + "x" * 200000,
                                      'RW 2048 FLAT "flat.vmdk" 0')), "any")
case("desc-parent-copy", _desc(hint="base.vmdk"), "error")
case("desc-parent-flat", _desc(hint="flat.vmdk"), "error")
case("desc-parent-sparse", _desc(hint="sparse.vmdk"), "any")
case("desc-encrypted", _desc()[:-1] + b'\nencryption.keySafe = "vmware:key/list/(pair/(phrase/x))"\n',
     "error")
case("sparse-encrypted", sparse(desc=descriptor() + b'encryption.data = "abc"\n'), "error")
case("desc-nul-inside", _desc()[:40] + b"\0" + _desc()[40:], "error")


def main(argv):
    out = argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                     "regressions", "vmdk")
    os.makedirs(out, exist_ok=True)
    for name, (data, _) in sorted(CASES.items()):
        with open(os.path.join(out, "hostile-%s.vmdk" % name), "wb") as f:
            f.write(data)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
