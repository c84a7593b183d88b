"""Open-time checks of qcow2 metadata, with qemu-img 7.2 as the oracle.

Every case starts from a tiny image made by qemu-img and patches one field
(big-endian, with struct) so that exactly one of the checks QEMU's
qcow2_do_open() and the functions it calls (qcow2_validate_table,
qcow2_read_extensions, qcow2_read_snapshots, qcow2_load_dirty_bitmaps) make
on a read-only open is violated.  Each rejected case asserts that

  * ``qemu-img info -f qcow2`` fails with exit status 1 and QEMU's message
    for that check (the oracle: if qemu accepts the patched image, or
    refuses it for another reason, the case is wrong, not imgcopy), and
  * ``imgcopy.open()`` raises ``imgcopy.ImageFormatError`` whose message
    names the field as docs/interop/qcow2.txt spells it (per-entry
    snapshot-table problems: "snapshot").

The accepted cases sit exactly at a limit QEMU still accepts (or are odd
images QEMU opens on purpose) and must open in both.

QEMU reads metadata past the end of the file as zeros and checks nothing
against the file's size at open, so every case whose table would reach
past the end of the file grows the file (sparse) to cover it: each case
violates one check only, whatever order imgcopy checks in.
"""
import json
import os
import struct

import pytest

import imgcopy

from .gen.qcow2_images import build_named
from .oracles import qemu_img
from .units import KiB, MiB

INT64_MAX = (1 << 63) - 1
# qemu's BDRV_MAX_LENGTH: INT64_MAX aligned down to 1 GiB; reading at or
# past it fails with EIO
BDRV_MAX_LENGTH = (1 << 63) - (1 << 30)

# header field offsets (docs/interop/qcow2.txt)
MAGIC, VERSION, BACKING_OFF, BACKING_SIZE, CLUSTER_BITS, SIZE = 0, 4, 8, 16, 20, 24
CRYPT, L1_SIZE, L1_OFF, RT_OFF, RT_CLUSTERS, NB_SNAP, SNAP_OFF = 32, 36, 40, 48, 56, 60, 64
INCOMPAT, COMPAT, AUTOCLEAR, REFCOUNT_ORDER, HEADER_LENGTH, COMPRESSION = 72, 80, 88, 96, 100, 104
# header extension types
EXT_END = 0
EXT_BACKING_FORMAT = 0xE2792ACA
EXT_FEATURE_TABLE = 0x6803F857
EXT_BITMAPS = 0x23852875
EXT_CRYPTO = 0x0537BE77
EXT_UNKNOWN = 0x12345678
SNAPSHOT_HEADER = struct.Struct(">QIHHIIQII")          # 40 bytes
FREE_AREA = 0x100000        # past everything qemu-img create writes: new tables go here


def qemu_info_result(path):
    """(exit status, stdout, stderr) of ``qemu-img info -f qcow2 --output=json``."""
    p = qemu_img("info", "-f", "qcow2", "--output=json", path, check=False)
    return p.returncode, p.stdout, p.stderr


class Qcow2File:
    """Patches one qcow2 file in place (big-endian fields)."""

    def __init__(self, path):
        self.path = path

    def get(self, off, fmt):
        with open(self.path, "rb") as f:
            f.seek(off)
            data = f.read(struct.calcsize(">" + fmt))
        data += b"\0" * (struct.calcsize(">" + fmt) - len(data))
        return struct.unpack(">" + fmt, data)[0]

    def put(self, off, fmt, *values):
        self.write(off, struct.pack(">" + fmt, *values))

    def write(self, off, data):
        with open(self.path, "r+b") as f:
            f.seek(off)
            f.write(data)

    def grow(self, size):
        """Extend the file (sparse) to at least ``size`` bytes."""
        if os.path.getsize(self.path) < size:
            os.truncate(self.path, size)

    @property
    def cluster_size(self):
        return 1 << self.get(CLUSTER_BITS, "I")

    def snapshot_entries(self):
        """Offsets of the snapshot table's entries."""
        off = self.get(SNAP_OFF, "Q")
        out = []
        for _ in range(self.get(NB_SNAP, "I")):
            off = -(-off // 8) * 8
            out.append(off)
            with open(self.path, "rb") as f:
                f.seek(off)
                fields = SNAPSHOT_HEADER.unpack(f.read(SNAPSHOT_HEADER.size))
            off += SNAPSHOT_HEADER.size + fields[8] + fields[2] + fields[3]
        return out

    def set_extensions(self, exts):
        """Replace the header extensions (a list of (type, data)) and end them."""
        version = self.get(VERSION, "I")
        at = self.get(HEADER_LENGTH, "I") if version >= 3 else 72
        buf = b""
        for kind, data in exts:
            buf += struct.pack(">II", kind, len(data)) + data + b"\0" * (-len(data) % 8)
        self.write(at, buf + b"\0" * 8)


def snapshot_entry(extra=b"", id_size=None, name_size=None, id_str=b"", name=b"",
                   l1_table_offset=0, l1_size=0):
    """One snapshot table entry, padded to 8 bytes.  id_size/name_size may
    claim more bytes than given (the rest must then be zeros in the file)."""
    id_size = len(id_str) if id_size is None else id_size
    name_size = len(name) if name_size is None else name_size
    e = SNAPSHOT_HEADER.pack(l1_table_offset, l1_size, id_size, name_size, 0, 0, 0, 0,
                             len(extra)) + extra + id_str + name
    return e + b"\0" * (-len(e) % 8)


def max_size_entries(q, count):
    """``count`` snapshot table entries of the largest size QEMU reads one
    entry at (1024 bytes of extra data, 65535-byte ID and name), written at
    FREE_AREA into a sparse file: only the 40-byte fixed parts are written,
    the extra data, IDs and names are holes (zeros)."""
    entry_len = SNAPSHOT_HEADER.size + 1024 + 65535 + 65535
    stride = -(-entry_len // 8) * 8
    q.grow(FREE_AREA + count * stride)
    fixed = SNAPSHOT_HEADER.pack(0, 0, 65535, 65535, 0, 0, 0, 0, 1024)
    for i in range(count):
        q.write(FREE_AREA + i * stride, fixed)
    q.put(NB_SNAP, "IQ", count, FREE_AREA)


# --------------------------------------------------------------------------
# templates: made once per module by qemu-img, copied for every case

TEMPLATES = {
    "v3": [["create", "-f", "qcow2", "{path}", "1M"]],
    "v2": [["create", "-f", "qcow2", "-o", "compat=0.10", "{path}", "1M"]],
    "v3-512": [["create", "-f", "qcow2", "-o", "cluster_size=512", "{path}", "1M"]],
    "v3-2M": [["create", "-f", "qcow2", "-o", "cluster_size=2M", "{path}", "1M"]],
    "v3-snap": [["create", "-f", "qcow2", "{path}", "1M"],
                ["snapshot", "-c", "one", "{path}"],
                ["snapshot", "-c", "two", "{path}"]],
}


def _qemu_img_commands(cmds):
    def build(path):
        for cmd in cmds:
            qemu_img(*[a.format(path=path) for a in cmd])
    return build


@pytest.fixture(scope="module")
def templates(tmp_path_factory):
    paths = build_named(tmp_path_factory.mktemp("qcow2-templates"),
                        {name: _qemu_img_commands(cmds) for name, cmds in TEMPLATES.items()})
    out = {}
    for name, path in paths.items():
        with open(path, "rb") as f:
            out[name] = f.read()
    return out


def build(case, templates, tmp_path):
    path = str(tmp_path / "image.qcow2")     # a name that names no field
    with open(path, "wb") as f:
        f.write(templates[case.template])
    case.edit(Qcow2File(path))
    return path


class Case:
    """template: which qemu-img image to start from; edit(Qcow2File) breaks
    (or stretches) it; qemu_says: a piece of qemu-img's error message for
    the check (rejected cases); fields: the message of imgcopy's
    ImageFormatError must contain one of these (case-insensitive);
    format: passed to imgcopy.open (None: probe)."""

    def __init__(self, id, template, edit, qemu_says=None, fields=(), format=None):
        self.id = id
        self.template = template
        self.edit = edit
        self.qemu_says = qemu_says
        self.fields = fields
        self.format = format


def put(off, fmt, *values):
    return lambda q: q.put(off, fmt, *values)


def edits(*fns):
    def run(q):
        for fn in fns:
            fn(q)
    return run


def grow(size):
    return lambda q: q.grow(size)


def set_ext(*exts):
    return lambda q: q.set_extensions(list(exts))


def entry_field(index, off, fmt, value):
    """Patch a field of snapshot table entry ``index``."""
    return lambda q: q.put(q.snapshot_entries()[index] + off, fmt, value)


def bitmaps_ext(nb_bitmaps=1, reserved=0, dir_size=64, dir_offset=FREE_AREA):
    return (EXT_BITMAPS, struct.pack(">IIQQ", nb_bitmaps, reserved, dir_size, dir_offset))


AUTOCLEAR_BITMAPS = put(AUTOCLEAR, "Q", 1)
# "size" alone would match "l1_size": the header's size field is the virtual size
SIZE_FIELD = ("virtual size", "'size'", ": size ", "size field")
NB_SNAPSHOTS_65537 = 65537

# --------------------------------------------------------------------------
# checks QEMU makes on a read-only open: each case violates exactly one

REJECTED = [
    # ---- header fields
    Case("magic", "v3", put(MAGIC, "I", 0x51464900),
         "Image is not in qcow2 format", ("magic",), format="qcow2"),
    Case("version-1", "v3", put(VERSION, "I", 1),
         "Unsupported qcow2 version 1", ("version",)),
    Case("version-4", "v3", put(VERSION, "I", 4),
         "Unsupported qcow2 version 4", ("version",)),
    Case("cluster_bits-8", "v3", put(CLUSTER_BITS, "I", 8),
         "Unsupported cluster size: 2^8", ("cluster_bits",)),
    Case("cluster_bits-22", "v3", put(CLUSTER_BITS, "I", 22),
         "Unsupported cluster size: 2^22", ("cluster_bits",)),
    Case("header_length-100", "v3", put(HEADER_LENGTH, "I", 100),
         "qcow2 header too short", ("header_length",)),
    Case("header_length-over-cluster", "v3", put(HEADER_LENGTH, "I", 64 * KiB + 8),
         "qcow2 header exceeds cluster size", ("header_length",)),
    Case("header_length-over-cluster-512", "v3-512", put(HEADER_LENGTH, "I", 520),
         "qcow2 header exceeds cluster size", ("header_length",)),
    Case("backing_file_offset-past-cluster", "v3", put(BACKING_OFF, "QI", 64 * KiB + 1, 1),
         "Invalid backing file offset", ("backing_file_offset",)),
    Case("backing_file_size-1024", "v3", put(BACKING_OFF, "QI", 4096, 1024),
         "Backing file name too long", ("backing_file_size",)),
    Case("backing_file_size-past-cluster", "v3", put(BACKING_OFF, "QI", 64 * KiB - 10, 11),
         "Backing file name too long", ("backing_file_size",)),
    Case("refcount_order-7", "v3", put(REFCOUNT_ORDER, "I", 7),
         "Reference count entry width too large", ("refcount_order",)),
    Case("crypt_method-3", "v3", put(CRYPT, "I", 3),
         "Unsupported encryption method 3", ("crypt_method",)),
    # the header field "size" (the virtual size): its L1 index must fit an int
    Case("size-l1-index-over-int-max", "v3", put(SIZE, "Q", 1 << 62),
         "Image is too big", SIZE_FIELD),
    Case("size-max", "v3", put(SIZE, "Q", INT64_MAX),
         "Image is too big", SIZE_FIELD),
    # ---- feature bits
    Case("incompatible-bit-5", "v3", put(INCOMPAT, "Q", 1 << 5),
         "Unsupported qcow2 feature(s): Unknown incompatible feature: 20",
         ("incompatible_features",)),
    Case("incompatible-bit-63", "v3", put(INCOMPAT, "Q", 1 << 63),
         "Unknown incompatible feature: 8000000000000000", ("incompatible_features",)),
    Case("incompatible-bit-5-named", "v3",
         edits(put(INCOMPAT, "Q", 1 << 5),
               set_ext((EXT_FEATURE_TABLE, bytes([0, 5]) + b"frobnication".ljust(46, b"\0")))),
         "Unsupported qcow2 feature(s): frobnication", ("incompatible_features", "frobnication")),
    Case("compression_type-2", "v3", edits(put(INCOMPAT, "Q", 1 << 3), put(COMPRESSION, "B", 2)),
         "qcow2: unknown compression type: 2", ("compression_type",)),
    Case("compression-bit-with-zlib", "v3", put(INCOMPAT, "Q", 1 << 3),
         "Compression type incompatible feature bit must not be set", ("compression_type",)),
    Case("compression_type-zstd-without-bit", "v3", put(COMPRESSION, "B", 1),
         "Compression type incompatible feature bit must be set", ("compression_type",)),
    Case("extended-l2-subcluster-256", "v3",
         edits(put(INCOMPAT, "Q", 1 << 4), put(CLUSTER_BITS, "I", 13)),
         "Unsupported subcluster size: 256", ("extended l2", "subcluster", "cluster_bits")),
    # ---- refcount table
    Case("refcount_table_clusters-0", "v3", put(RT_CLUSTERS, "I", 0),
         "Image does not contain a reference count table", ("refcount_table_clusters",)),
    Case("refcount_table_clusters-over-8MiB", "v3",
         edits(put(RT_CLUSTERS, "I", 129), grow(64 * KiB + 129 * 64 * KiB)),
         "Reference count table too large", ("refcount_table_clusters",)),
    Case("refcount_table_clusters-over-8MiB-512", "v3-512",
         edits(put(RT_CLUSTERS, "I", 16385), grow(8 * MiB + 8 * KiB)),
         "Reference count table too large", ("refcount_table_clusters",)),
    Case("refcount_table_offset-unaligned", "v3", put(RT_OFF, "Q", 0x10008),
         "Reference count table offset invalid", ("refcount_table_offset",)),
    Case("refcount_table_offset-past-int64", "v3", put(RT_OFF, "Q", (1 << 63) - 64 * KiB),
         "Reference count table offset invalid", ("refcount_table_offset",)),
    # ---- snapshot table: header fields
    Case("nb_snapshots-65537", "v3",
         edits(put(NB_SNAP, "IQ", NB_SNAPSHOTS_65537, FREE_AREA),
               grow(FREE_AREA + NB_SNAPSHOTS_65537 * 40 + 64 * KiB)),
         "Snapshot table too large", ("nb_snapshots",)),
    Case("snapshots_offset-unaligned", "v3-snap",
         lambda q: q.put(SNAP_OFF, "Q", q.get(SNAP_OFF, "Q") + 8),
         "Snapshot table offset invalid", ("snapshots_offset",)),
    # checked even when the image has no snapshots
    Case("snapshots_offset-unaligned-nb_snapshots-0", "v3", put(SNAP_OFF, "Q", 8),
         "Snapshot table offset invalid", ("snapshots_offset",)),
    Case("snapshots_offset-past-int64", "v3", put(NB_SNAP, "IQ", 65536, (1 << 63) - 64 * KiB),
         "Snapshot table offset invalid", ("snapshots_offset",)),
    # passes qemu's offset check, then the read fails (EIO past BDRV_MAX_LENGTH)
    Case("snapshots_offset-unreadable", "v3", put(NB_SNAP, "IQ", 1, BDRV_MAX_LENGTH),
         "Failed to read snapshot table", ("snapshots_offset",)),
    # ---- snapshot table: entries
    Case("snapshot-extra_data_size-1025", "v3-snap", entry_field(1, 36, "I", 1025),
         "Too much extra metadata in snapshot table entry 1", ("snapshot",)),
    Case("snapshot-extra_data_size-4G", "v3-snap", entry_field(0, 36, "I", 0xFFFFFFFF),
         "Too much extra metadata in snapshot table entry 0", ("snapshot",)),
    # 508 entries of 132134 bytes: 67125086 bytes > QCOW_MAX_SNAPSHOTS_SIZE (64 MiB)
    Case("snapshot-table-over-64MiB", "v3", lambda q: max_size_entries(q, 508),
         "Snapshot table is too big", ("snapshot",)),
    # ---- active L1 table
    Case("l1_size-over-32MiB", "v3",
         edits(put(L1_SIZE, "I", 4 * MiB + 1), grow(0x30000 + 32 * MiB + 64 * KiB)),
         "Active L1 table too large", ("l1_size",)),
    Case("l1_table_offset-unaligned", "v3", put(L1_OFF, "Q", 0x30008),
         "Active L1 table offset invalid", ("l1_table_offset",)),
    Case("l1_table_offset-past-int64", "v3",
         put(L1_SIZE, "IQ", 8192, (1 << 63) - 64 * KiB),
         "Active L1 table offset invalid", ("l1_table_offset",)),
    # passes qemu's offset check, then the read fails (EIO past BDRV_MAX_LENGTH)
    Case("l1_table_offset-unreadable", "v3", put(L1_OFF, "Q", BDRV_MAX_LENGTH),
         "Could not read L1 table", ("l1_table_offset",)),
    Case("l1_size-0", "v3", put(L1_SIZE, "I", 0),
         "L1 table is too small", ("l1_size",)),
    # 512 MiB + 1 byte needs 2 L1 entries at 64 KiB clusters
    Case("l1_size-one-short", "v3", put(SIZE, "Q", 512 * MiB + 1),
         "L1 table is too small", ("l1_size",)),
    # ---- header extensions
    Case("extension-past-cluster", "v3",
         edits(set_ext((EXT_UNKNOWN, b"")), put(112 + 4, "I", 64 * KiB - 119)),
         "Header extension too large", ("extension",)),
    Case("extension-past-cluster-v2", "v2", put(72, "II", EXT_UNKNOWN, 64 * KiB),
         "Header extension too large", ("extension",)),
    # the end marker's length is checked too
    Case("extension-end-marker-with-length", "v3", put(112, "II", EXT_END, 64 * KiB),
         "Header extension too large", ("extension",)),
    # the extension area ends at backing_file_offset: a type/length pair
    # that straddles it is too large
    Case("extension-header-straddles-backing-name", "v3",
         edits(put(BACKING_OFF, "QI", 116, 8), lambda q: q.write(116, b"base.img"),
               lambda q: open(os.path.join(os.path.dirname(q.path), "base.img"), "wb").close()),
         "Header extension too large", ("extension",)),
    Case("extension-backing-format-16-bytes", "v3", set_ext((EXT_BACKING_FORMAT, b"r" * 16)),
         "ext_backing_format: len=16 too large", ("backing format", "backing file format")),
    Case("extension-crypto-without-luks", "v3", set_ext((EXT_CRYPTO, b"\0" * 16)),
         "CRYPTO header extension only expected with LUKS", ("crypt", "encryption")),
    Case("extension-bitmaps-length-23", "v3", set_ext((EXT_BITMAPS, b"\0" * 23)),
         "bitmaps_ext: Invalid extension length", ("bitmap",)),
    Case("extension-bitmaps-nb_bitmaps-0", "v3",
         edits(AUTOCLEAR_BITMAPS, set_ext(bitmaps_ext(nb_bitmaps=0))),
         "found bitmaps extension with zero bitmaps", ("nb_bitmaps",)),
    Case("extension-bitmaps-nb_bitmaps-65536", "v3",
         edits(AUTOCLEAR_BITMAPS, set_ext(bitmaps_ext(nb_bitmaps=65536))),
         "exceeding the QEMU supported maximum of 65535", ("nb_bitmaps",)),
    Case("extension-bitmaps-reserved", "v3",
         edits(AUTOCLEAR_BITMAPS, set_ext(bitmaps_ext(reserved=1))),
         "bitmaps_ext: Reserved field is not zero", ("bitmap",)),
    Case("extension-bitmaps-directory-offset-unaligned", "v3",
         edits(AUTOCLEAR_BITMAPS, set_ext(bitmaps_ext(dir_offset=FREE_AREA + 8))),
         "invalid bitmap directory offset", ("bitmap_directory_offset",)),
    Case("extension-bitmaps-directory-size-too-big", "v3",
         edits(AUTOCLEAR_BITMAPS, set_ext(bitmaps_ext(dir_size=1024 * 65535 + 1))),
         "bitmap directory size (67107841) exceeds the maximum", ("bitmap_directory_size",)),
    # with the autoclear bit set qemu loads the bitmap directory at open
    # (qcow2_load_dirty_bitmaps), read-only too
    Case("bitmap-directory-size-0", "v3",
         edits(AUTOCLEAR_BITMAPS, set_ext(bitmaps_ext(dir_size=0)), grow(FREE_AREA + 64 * KiB)),
         "Requested bitmap directory size is zero", ("bitmap_directory_size",)),
    Case("bitmap-directory-entry-of-zeros", "v3",
         edits(AUTOCLEAR_BITMAPS, set_ext(bitmaps_ext(dir_size=32)), grow(FREE_AREA + 64 * KiB)),
         "Bitmap '' doesn't satisfy the constraints", ("bitmap",)),
]


@pytest.mark.parametrize("case", REJECTED, ids=[c.id for c in REJECTED])
def test_rejected_like_qemu(case, templates, tmp_path):
    path = build(case, templates, tmp_path)
    rc, out, err = qemu_info_result(path)
    # the oracle: qemu refuses the image, cleanly (no crash), for this check
    assert rc == 1, "qemu-img accepted the patched image (the case is wrong): %s%s" % (out, err)
    assert case.qemu_says in err, err
    with pytest.raises(imgcopy.ImageFormatError) as exc:
        with imgcopy.open(path, format=case.format):
            pass
    # the message may start with the file's name: only the rest counts
    msg = str(exc.value).replace(os.path.realpath(path), "<image>").replace(path, "<image>")
    assert any(f.lower() in msg.lower() for f in case.fields), \
        "%r names none of %r" % (msg, case.fields)


# --------------------------------------------------------------------------
# at the limits QEMU accepts (and odd images it opens on purpose): both open


def backing_format_15(q):
    q.set_extensions([(EXT_BACKING_FORMAT, b"r" * 15)])


ACCEPTED = [
    # ---- header fields
    Case("cluster_bits-9", "v3-512", lambda q: None),
    Case("cluster_bits-21", "v3-2M", lambda q: None),
    Case("version-2", "v2", lambda q: None),
    # no room left for extensions: none are read
    Case("header_length-equals-cluster", "v3", put(HEADER_LENGTH, "I", 64 * KiB)),
    Case("refcount_order-6", "v3", put(REFCOUNT_ORDER, "I", 6)),
    Case("refcount_order-0", "v3", put(REFCOUNT_ORDER, "I", 0)),
    # backing_file_size is ignored when backing_file_offset is 0
    Case("backing_file_size-ignored-without-offset", "v3", put(BACKING_SIZE, "I", 0xFFFFFFFF)),
    # ---- feature bits
    Case("unknown-compatible-and-autoclear-bits", "v3",
         edits(put(COMPAT, "Q", 0xFFFFFFFFFFFFFFFE), put(AUTOCLEAR, "Q", 0xFFFFFFFFFFFFFFFC))),
    # header_length 104: the compression_type byte is not part of the header
    Case("compression_type-outside-header_length", "v3",
         edits(put(HEADER_LENGTH, "I", 104), put(COMPRESSION, "B", 1))),
    # ---- refcount table: exactly 8 MiB
    Case("refcount_table_clusters-8MiB", "v3",
         edits(put(RT_CLUSTERS, "I", 128), grow(64 * KiB + 128 * 64 * KiB))),
    Case("refcount_table_clusters-8MiB-512", "v3-512",
         edits(put(RT_CLUSTERS, "I", 16384), grow(8 * MiB + 8 * KiB))),
    # ---- snapshot table
    # (nb_snapshots 65536 is accepted too, but qemu-img takes 2.5 s to read
    # 65536 entries: not a case here; 1000 all-zero entries, empty ID and name)
    Case("nb_snapshots-1000-zero-entries", "v3",
         edits(put(NB_SNAP, "IQ", 1000, FREE_AREA), grow(FREE_AREA + 1000 * 40))),
    # with no snapshots an aligned offset is not looked at
    Case("snapshots_offset-ignored-nb_snapshots-0", "v3", put(SNAP_OFF, "Q", 1 << 62)),
    Case("snapshot-extra_data_size-1024", "v3",
         lambda q: (q.write(FREE_AREA, snapshot_entry(extra=b"\0" * 1024, id_str=b"1",
                                                      name=b"x")),
                    q.put(NB_SNAP, "IQ", 1, FREE_AREA))),
    # 507 entries of 132134 bytes: 66992950 bytes, just under 64 MiB
    Case("snapshot-table-just-under-64MiB", "v3", lambda q: max_size_entries(q, 507)),
    # a snapshot's own L1 table is not checked at open (only when the
    # snapshot is used: goto, delete, check)
    Case("snapshot-l1_table_offset-unaligned", "v3-snap", entry_field(0, 0, "Q", 0x30008)),
    Case("snapshot-l1_size-huge", "v3-snap", entry_field(1, 8, "I", 0xFFFFFFFF)),
    # v3 entries should have 16 bytes of extra data; only qemu-img check says so
    Case("snapshot-no-extra-data-v3", "v3",
         lambda q: (q.write(FREE_AREA, snapshot_entry(id_str=b"1", name=b"old")),
                    q.put(NB_SNAP, "IQ", 1, FREE_AREA))),
    # ---- active L1 table
    Case("l1_size-32MiB", "v3",
         edits(put(L1_SIZE, "I", 4 * MiB), grow(0x30000 + 32 * MiB))),
    Case("l1_size-exactly-enough", "v3", put(SIZE, "Q", 512 * MiB)),
    Case("l1_size-0-size-0", "v3", edits(put(SIZE, "Q", 0), put(L1_SIZE, "I", 0))),
    # ---- header extensions
    Case("extension-ends-at-cluster-end", "v3",
         edits(set_ext((EXT_UNKNOWN, b"")), put(112 + 4, "I", 64 * KiB - 120))),
    Case("extension-backing-format-15-bytes", "v3", backing_format_15),
    # bitmaps extension without its autoclear bit: qemu warns, ignores it
    Case("extension-bitmaps-without-autoclear", "v3", set_ext(bitmaps_ext(nb_bitmaps=0))),
]


@pytest.mark.parametrize("case", ACCEPTED, ids=[c.id for c in ACCEPTED])
def test_accepted_like_qemu(case, templates, tmp_path):
    path = build(case, templates, tmp_path)
    rc, out, err = qemu_info_result(path)
    assert rc == 0, "qemu-img refused the image (the case is wrong): %s" % err
    size = json.loads(out)["virtual-size"]
    with imgcopy.open(path, format=case.format) as img:
        assert img.format == "qcow2"
        assert img.size == size


def test_backing_file_size_1023_accepted(tmp_path):
    """The longest backing file name (1023 bytes, relative) opens in both."""
    parts = ["d" * 200] * 4
    rel = "/".join(parts + ["f" * (1023 - 4 * 201)])
    assert len(rel) == 1023
    os.makedirs(str(tmp_path.joinpath(*parts)))
    base = str(tmp_path / rel)
    with open(base, "wb") as f:
        f.truncate(MiB)
    top = str(tmp_path / "top.qcow2")
    qemu_img("create", "-f", "qcow2", "-b", rel, "-F", "raw", top)
    assert Qcow2File(top).get(BACKING_SIZE, "I") == 1023
    rc, out, err = qemu_info_result(top)
    assert rc == 0, err
    assert json.loads(out)["backing-filename"] == rel
    with imgcopy.open(top) as img:
        assert img.size == MiB
