"""Images of foreign formats written byte by byte from the formats'
descriptions (where qemu-img cannot make them), and raw data that looks
like some format but is none: the probing tests' images.

- :func:`lcg_bytes`: deterministic pseudo-random bytes (no magic shows up);
- :func:`bochs`, :func:`cloop`, :func:`dmg`, :func:`vmdk3`, :func:`luks2`:
  small images of those formats;
- :func:`mbr`, :func:`gpt`, :func:`ext4`, :func:`iso9660`,
  :func:`text_with_magics`, :func:`bad_vhd_trailer`, :func:`bad_koly_trailer`:
  raw data that only resembles an image.
"""

import struct


def lcg_bytes(n, seed=1):
    """n deterministic pseudo-random bytes (an LCG; no magic of interest shows up in them)."""
    out = bytearray(n)
    x = seed & 0xFFFFFFFF
    for i in range(n):
        x = (x * 1103515245 + 12345) & 0xFFFFFFFF
        out[i] = (x >> 16) & 0xFF
    return bytes(out)


def cstr(s, size):
    """s NUL-padded to a fixed-size field."""
    b = s.encode() if isinstance(s, str) else s
    assert len(b) < size
    return b + b"\0" * (size - len(b))


BOCHS_MAGIC = "Bochs Virtual HD Image"


def bochs(version, subtype="Growing", data=None):
    """A bochs growing redolog: 512-byte header, catalog, one allocated extent holding `data`
    in its first sector (if given).  Virtual size 64 KiB in 32 KiB extents."""
    disk, extent = 64 << 10, 32 << 10
    catalog = disk // extent
    bitmap = extent // 512 // 8                  # one bit per sector
    hdr = cstr(BOCHS_MAGIC, 32) + cstr("Redolog", 16) + cstr(subtype, 16)
    hdr += struct.pack("<IIIII", version, 512, catalog, bitmap, extent)
    if version == 0x00020000:
        hdr += struct.pack("<IQ", 0, disk)       # timestamp, disk size
    else:
        hdr += struct.pack("<Q", disk)           # v1: disk size right after extent
    hdr += b"\0" * (512 - len(hdr))
    entries = [0 if data is not None else 0xFFFFFFFF] + [0xFFFFFFFF] * (catalog - 1)
    out = hdr + struct.pack("<%dI" % catalog, *entries)
    if data is not None:
        assert len(data) == 512
        out += b"\x01" + b"\0" * 511            # extent 0's bitmap: sector 0 present
        out += data
    return out


CLOOP_V2 = ("#!/bin/sh\n#V2.0 Format\n"
            "modprobe cloop file=$0 && mount -r -t iso9660 /dev/cloop $1\n").encode()
CLOOP_V4 = ("#!/bin/sh\n#V4.0 Format\n"
            "modprobe cloop file=$0 && mount -r -t iso9660 /dev/cloop $1\nexit $?\n").encode()


def adler32(data):
    a, b = 1, 0
    for byte in data:
        a = (a + byte) % 65521
        b = (b + a) % 65521
    return (b << 16) | a


def zlib_stored(data):
    """A zlib stream holding `data` in one stored (uncompressed) deflate block."""
    n = len(data)
    return (b"\x78\x01" + b"\x01" + struct.pack("<HH", n, n ^ 0xFFFF) + data
            + struct.pack(">I", adler32(data)))


def cloop(blocks, preamble=CLOOP_V2, block_size=512):
    """A cloop image: 128-byte shell preamble, block size and count (big-endian), n+1 offsets,
    then one zlib stream per block."""
    head = preamble + b"\0" * (128 - len(preamble))
    streams = [zlib_stored(b) for b in blocks]
    first = 128 + 8 + 8 * (len(blocks) + 1)
    offsets = [first]
    for s in streams:
        offsets.append(offsets[-1] + len(s))
    return (head + struct.pack(">II", block_size, len(blocks))
            + struct.pack(">%dQ" % len(offsets), *offsets) + b"".join(streams))


def dmg(sector0):
    """A UDIF (.dmg) image of 2 sectors: sector 0 stored raw ("copy" chunk), sector 1 a zero
    chunk.  Data fork, then a resource fork holding the "mish" block table, then the 512-byte
    "koly" trailer at the very end of the file.  The first bytes are guest data: only the
    trailer says what this file is."""
    assert len(sector0) == 512
    chunks = [(0x00000001, 0, 1, 0, 512),          # type, first sector, sectors, offset, length
              (0x00000002, 1, 1, 512, 0),
              (0xFFFFFFFF, 2, 0, 512, 0)]          # terminator
    mish = b"mish" + struct.pack(">IQQQII", 1, 0, 2, 0, 0, len(chunks)) + b"\0" * 24
    mish += struct.pack(">II", 0, 0) + b"\0" * 128     # checksum type, bits, data
    mish += struct.pack(">I", len(chunks))
    for t, sector, count, off, length in chunks:
        mish += struct.pack(">IIQQQQ", t, 0, sector, count, off, length)
    data_len = 4 + len(mish)
    # resource fork: data offset, map offset, data length, map length; one resource
    rsrc = struct.pack(">IIII", 16, 16 + data_len, data_len, 0)
    rsrc += struct.pack(">I", len(mish)) + mish
    body = sector0 + rsrc
    body += b"\0" * (-len(body) % 512)
    koly = b"koly" + struct.pack(">III", 4, 512, 1)
    koly += struct.pack(">QQQQQ", 0, 0, 512, 512, len(rsrc))   # running, data fork, rsrc fork
    koly += struct.pack(">II", 1, 1) + b"\0" * 16              # segment number/count, id
    koly += struct.pack(">II", 0, 0) + b"\0" * 128             # data checksum
    koly += struct.pack(">QQ", 0, 0) + b"\0" * 120             # XML plist offset/length
    koly += struct.pack(">II", 0, 0) + b"\0" * 128             # master checksum
    koly += struct.pack(">IQ", 1, 2) + b"\0" * 12              # image variant, sector count
    assert len(koly) == 512
    return body + koly


def vmdk3():
    """A VMDK3 ("COWD", ESX vmfsSparse) image of 1 MiB with an empty 64-entry L1 table."""
    hdr = b"COWD" + struct.pack("<IIIIIIIIII", 1, 3, 2048, 8, 1, 64, 2, 2, 16, 63)
    return hdr + b"\0" * (512 - len(hdr)) + b"\0" * 512


def luks2():
    """A LUKS2 header (binary header, JSON area, secondary header).  No tool here reads LUKS2
    (qemu 7.2 probes it as raw, cryptsetup is not needed): only its magic and version matter."""
    hdr_size = 16384

    def binary(offset, magic):
        h = magic + struct.pack(">HQQ", 2, hdr_size, 1) + cstr("", 48) + cstr("sha256", 32)
        h += lcg_bytes(64, 7) + cstr("2f0c6b52-8d35-4e0c-9b8c-5c1d7a1e4c11", 40) + cstr("", 48)
        h += struct.pack(">Q", offset)
        return h + b"\0" * (4096 - len(h))

    js = (b'{"keyslots":{},"tokens":{},"segments":{},"digests":{},'
          b'"config":{"json_size":"12288","keyslots_size":"16384"}}')
    area = js + b"\0" * (hdr_size - 4096 - len(js))
    return binary(0, b"LUKS\xba\xbe") + area + binary(hdr_size, b"SKUL\xba\xbe") + area


# ---- still raw -----------------------------------------------------------------------------------

def mbr():
    boot = lcg_bytes(446, 3)
    part = struct.pack("<B3sB3sII", 0x80, b"\x20\x21\x00", 0x83, b"\xfe\xff\xff", 2048, 129024)
    return boot + part + bytes(48) + b"\x55\xaa" + bytes(64 << 10)


def gpt():
    return (bytes(446) + struct.pack("<B3sB3sII", 0, b"\0\x02\0", 0xEE, b"\xff\xff\xff", 1,
                                     0xFFFFFFFF) + bytes(48) + b"\x55\xaa"
            + b"EFI PART" + struct.pack("<II", 0x00010000, 92) + bytes(500) + bytes(32 << 10))


def ext4():
    sb = struct.pack("<IIII", 4096, 16384, 0, 1000) + bytes(40) + struct.pack("<H", 0xEF53)
    return bytes(1024) + sb + bytes(4096 - 1024 - len(sb)) + lcg_bytes(8192, 5)


def iso9660():
    return bytes(32768) + b"\x01CD001\x01" + bytes(2041) + lcg_bytes(2048, 6)


def text_with_magics():
    lines = ["line %d: nothing to see here\n" % i for i in range(200)]
    lines[3] = "a VHD footer starts with conectix, a VMDK header with KDMV\n"
    lines[50] = "KDMV conectix vhdxfile QFI\xfb LUKS QED koly <<< \n"
    return "".join(lines).encode("latin-1")


def bad_vhd_trailer():
    """Raw data whose last 512 bytes start with "conectix" but are no valid VHD footer
    (the checksum does not match)."""
    footer = b"conectix" + lcg_bytes(504, 8)
    return lcg_bytes(8192, 9) + footer


def bad_koly_trailer():
    """Raw data whose last 512 bytes start with "koly" but no UDIF trailer (version, size)."""
    return lcg_bytes(8192, 10) + b"koly" + lcg_bytes(508, 11)
