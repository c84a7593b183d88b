"""What an image is: ``imgcopy.info(path)``, like ``qemu-img info``."""
from __future__ import annotations

import json
import os
import re
import struct
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from . import _core
from .extents import QEMU_SECTOR, human_size
from .image import PathArg, open as open_image

QCOW2_MAGIC = b"QFI\xfb"
# qcow2 header (docs/interop/qcow2.txt): the version 2 fields, then version 3's
_QCOW2_V2 = struct.Struct(">4sIQIIQIIQQIIQ")           # 72 bytes
_QCOW2_V3 = struct.Struct(">QQQII")                    # bytes 72..103
QCOW2_HEADER_READ = 112
# feature bits
INCOMPAT_DIRTY = 1 << 0
INCOMPAT_CORRUPT = 1 << 1
INCOMPAT_EXTERNAL_DATA = 1 << 2
INCOMPAT_COMPRESSION = 1 << 3
INCOMPAT_EXTENDED_L2 = 1 << 4
COMPAT_LAZY_REFCOUNTS = 1 << 0
COMPRESSION_TYPES = {0: "zlib", 1: "zstd"}


@dataclass
class Qcow2Header:
    """The fields of a qcow2 header that ``info`` reports."""

    version: int
    cluster_bits: int
    size: int
    backing_file_offset: int
    backing_file_size: int
    nb_snapshots: int
    incompatible_features: int = 0
    compatible_features: int = 0
    autoclear_features: int = 0
    refcount_order: int = 4
    header_length: int = 72
    compression_type: int = 0

    @property
    def cluster_size(self) -> int:
        return 1 << self.cluster_bits

    @property
    def compat(self) -> str:
        return "0.10" if self.version == 2 else "1.1"


def read_qcow2_header(f: Any) -> Qcow2Header:
    """Parse the first 112 bytes of a qcow2 file (a binary file object);
    ValueError if it is not one."""
    f.seek(0)
    buf = f.read(QCOW2_HEADER_READ)
    if len(buf) < _QCOW2_V2.size or buf[:4] != QCOW2_MAGIC:
        raise ValueError("not a qcow2 image")
    (_, version, backing_off, backing_size, cluster_bits, size, _, _, _, _, _, nb_snapshots,
     _) = _QCOW2_V2.unpack_from(buf)
    h = Qcow2Header(version=version, cluster_bits=cluster_bits, size=size,
                    backing_file_offset=backing_off, backing_file_size=backing_size,
                    nb_snapshots=nb_snapshots)
    if version >= 3 and len(buf) >= _QCOW2_V2.size + _QCOW2_V3.size:
        (h.incompatible_features, h.compatible_features, h.autoclear_features,
         h.refcount_order, h.header_length) = _QCOW2_V3.unpack_from(buf, _QCOW2_V2.size)
        if h.header_length > 104 and len(buf) > 104 and \
                h.incompatible_features & INCOMPAT_COMPRESSION:
            h.compression_type = buf[104]
    return h


def read_qcow2_backing_name(f: Any, h: Qcow2Header) -> Optional[str]:
    """The backing file name as the header stores it, or None."""
    if not h.backing_file_offset or not h.backing_file_size:
        return None
    f.seek(h.backing_file_offset)
    raw = f.read(min(h.backing_file_size, 1023))
    return raw.decode("utf-8", "surrogateescape")


EXT_BACKING_FORMAT = 0xE2792ACA
_EXT = struct.Struct(">II")


def read_qcow2_extensions(f: Any, h: Qcow2Header) -> Dict[int, bytes]:
    """The header extensions (type -> data) of the header cluster."""
    start = h.header_length if h.version >= 3 else _QCOW2_V2.size
    f.seek(start)
    buf = f.read(max(0, min(h.cluster_size, 2 << 20) - start))
    out: Dict[int, bytes] = {}
    pos = 0
    while pos + _EXT.size <= len(buf):
        kind, length = _EXT.unpack_from(buf, pos)
        if kind == 0:
            break
        pos += _EXT.size
        if pos + length > len(buf):
            break
        out[kind] = buf[pos:pos + length]
        pos += (length + 7) // 8 * 8
    return out


def qcow2_format_specific(h: Qcow2Header) -> Dict[str, Any]:
    """qemu-img info's "format-specific" of a qcow2 image (qemu 7.2's keys;
    bitmaps and external data files are not reported)."""
    data: Dict[str, Any] = {"compat": h.compat,
                            "compression-type": COMPRESSION_TYPES.get(h.compression_type,
                                                                      str(h.compression_type))}
    if h.version >= 3:
        data["lazy-refcounts"] = bool(h.compatible_features & COMPAT_LAZY_REFCOUNTS)
    data["refcount-bits"] = 1 << h.refcount_order
    if h.version >= 3:
        data["corrupt"] = bool(h.incompatible_features & INCOMPAT_CORRUPT)
        data["extended-l2"] = bool(h.incompatible_features & INCOMPAT_EXTENDED_L2)
    return {"type": "qcow2", "data": data}


_U64 = 1 << 64


def _int64(value: int) -> int:
    """qemu's QAPI prints 64-bit unsigned fields as int64."""
    return value - _U64 if value >= 1 << 63 else value


@dataclass(frozen=True)
class Snapshot:
    """An internal snapshot (qcow2), as ``qemu-img info`` lists it.  ``id``
    and ``name`` are the stored bytes, cut as qemu cuts them (127 and 255
    bytes, at a NUL); ``icount`` is None when not recorded."""

    id: bytes
    name: bytes
    vm_state_size: int
    date_sec: int
    date_nsec: int
    vm_clock_nsec: int
    icount: Optional[int]

    def to_dict(self) -> Dict[str, Any]:
        """One entry of qemu-img info's "snapshots" list (its key order)."""
        d: Dict[str, Any] = {}
        if self.icount is not None:
            d["icount"] = self.icount
        d["vm-clock-nsec"] = self.vm_clock_nsec % 10**9
        d["name"] = self.name.decode("utf-8", "replace")
        d["date-sec"] = self.date_sec
        d["date-nsec"] = self.date_nsec
        d["vm-clock-sec"] = self.vm_clock_nsec // 10**9
        d["id"] = self.id.decode("utf-8", "replace")
        d["vm-state-size"] = _int64(self.vm_state_size)
        return d

    def human_row(self) -> str:
        """A row of qemu-img info's "Snapshot list:" table: widths count
        bytes, the date is local time."""
        secs = self.vm_clock_nsec // 10**9
        clock = "%02d:%02d:%02d.%03d" % (secs // 3600, secs // 60 % 60, secs % 60,
                                         self.vm_clock_nsec // 10**6 % 1000)
        date = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.date_sec))
        icount = "" if self.icount is None else str(self.icount)
        row = b"%-9s %-16s %8s%20s%13s%11s" % (
            self.id, self.name, human_size(self.vm_state_size).encode(), date.encode(),
            clock.encode(), icount.encode())
        return row.decode("utf-8", "replace")


SNAPSHOT_HEADER = "%-10s%-17s%8s%20s%13s%11s" % ("ID", "TAG", "VM SIZE", "DATE", "VM CLOCK",
                                                 "ICOUNT")


# struct ic_snapshot, as the C core packs snapshots
_SNAPSHOT = struct.Struct("=128s256sQQIIq")
assert _SNAPSHOT.size == _core.SNAPSHOT_SIZE


def _snapshots(packed: bytes) -> List[Snapshot]:
    """Snapshots as the C core packs them: id and name are cut at a NUL."""
    return [Snapshot(id_.split(b"\0")[0], name.split(b"\0")[0], state, date_sec, date_nsec,
                     clock, None if icount == -1 else icount)
            for id_, name, state, clock, date_sec, date_nsec, icount
            in _SNAPSHOT.iter_unpack(packed)]


_ESCAPE = re.compile(r"\\(u[0-9a-f]{4}|.)")


def qemu_json(obj: Any) -> str:
    """JSON as qemu writes it: json.dumps' layout, non-ASCII and DEL as
    \\uXXXX escapes with upper-case hex."""
    text = json.dumps(obj, indent=4).replace("\x7f", "\\u007F")
    return _ESCAPE.sub(lambda m: "\\" + ("u" + m.group(1)[1:].upper() if m.group(1)[0] == "u"
                                          else m.group(1)), text)


@dataclass
class ImageInfo:
    """What ``imgcopy.info()`` learnt of an image.

    ``virtual_size`` is the exact size (``Image.size``); ``to_dict()`` and
    ``to_json()`` are shaped like ``qemu-img info --output=json`` and, like
    it, round a raw file's size up to whole 512-byte sectors."""

    filename: str
    format: str
    virtual_size: int
    actual_size: Optional[int]
    dirty_flag: bool = False
    cluster_size: Optional[int] = None
    backing_filename: Optional[str] = None
    full_backing_filename: Optional[str] = None
    backing_filename_format: Optional[str] = None
    format_specific: Optional[Dict[str, Any]] = None
    compressed_clusters: Optional[int] = None
    snapshots: List[Snapshot] = field(default_factory=list)
    backing_chain: List[Tuple[str, str]] = field(default_factory=list)

    @property
    def qemu_virtual_size(self) -> int:
        if self.format == "raw":
            return -(-self.virtual_size // QEMU_SECTOR) * QEMU_SECTOR
        return self.virtual_size

    def to_dict(self) -> Dict[str, Any]:
        """``qemu-img info --output=json``'s object (qemu 7.2's key order),
        plus "compressed-clusters" for qcow2 images."""
        d: Dict[str, Any] = {}
        if self.backing_filename_format is not None:
            d["backing-filename-format"] = self.backing_filename_format
        if self.snapshots:
            d["snapshots"] = [sn.to_dict() for sn in self.snapshots]
        d["virtual-size"] = self.qemu_virtual_size
        d["filename"] = self.filename
        if self.cluster_size is not None:
            d["cluster-size"] = self.cluster_size
        d["format"] = self.format
        if self.actual_size is not None:
            d["actual-size"] = self.actual_size
        if self.format_specific is not None:
            d["format-specific"] = self.format_specific
        if self.backing_filename is not None:
            if self.full_backing_filename is not None:
                d["full-backing-filename"] = self.full_backing_filename
            d["backing-filename"] = self.backing_filename
        d["dirty-flag"] = self.dirty_flag
        if self.compressed_clusters is not None:
            d["compressed-clusters"] = self.compressed_clusters
        return d

    def to_json(self) -> str:
        """As ``qemu-img info --output=json`` prints it (newline included)."""
        return qemu_json(self.to_dict()) + "\n"

    def to_human(self) -> str:
        """As ``qemu-img info`` prints it, plus a "compressed clusters" line
        for qcow2 images."""
        size = self.qemu_virtual_size
        disk = "unavailable" if self.actual_size is None else human_size(self.actual_size)
        lines = [f"image: {self.filename}",
                 f"file format: {self.format}",
                 f"virtual size: {human_size(size)} ({size} bytes)",
                 f"disk size: {disk}"]
        if self.cluster_size is not None:
            lines.append(f"cluster_size: {self.cluster_size}")
        if self.dirty_flag:
            lines.append("cleanly shut down: no")
        if self.backing_filename is not None:
            line = f"backing file: {self.backing_filename}"
            if self.full_backing_filename is None:
                line += " (cannot determine actual path)"
            elif self.full_backing_filename != self.backing_filename:
                line += f" (actual path: {self.full_backing_filename})"
            lines.append(line)
            if self.backing_filename_format is not None:
                lines.append(f"backing file format: {self.backing_filename_format}")
        if self.compressed_clusters is not None:
            lines.append(f"compressed clusters: {self.compressed_clusters}")
        if self.snapshots:
            lines += ["Snapshot list:", SNAPSHOT_HEADER]
            lines += [sn.human_row() for sn in self.snapshots]
        if self.format_specific is not None:
            lines.append("Format specific information:")
            lines.extend(_dump_specific(self.format_specific["data"], 1))
        return "\n".join(lines) + "\n"

    def _repr_html_(self) -> str:
        from html import escape

        rows = "".join(f'<tr><th style="text-align:left;padding-right:1em">{escape(k)}</th>'
                       f'<td style="text-align:left">{escape(str(v))}</td></tr>'
                       for k, v in self.to_dict().items() if k != "format-specific")
        return f"<table>{rows}</table>"


def _dump_specific(data: Dict[str, Any], depth: int) -> List[str]:
    """qemu's bdrv_image_info_specific_dump: "-" becomes " ", four spaces
    of indent per level, booleans in lower case."""
    out = []
    pad = "    " * depth
    for key, value in data.items():
        name = key.replace("-", " ")
        if isinstance(value, dict):
            out.append(f"{pad}{name}:")
            out.extend(_dump_specific(value, depth + 1))
        elif isinstance(value, bool):
            out.append(f"{pad}{name}: {'true' if value else 'false'}")
        else:
            out.append(f"{pad}{name}: {value}")
    return out


def _compressed_clusters(emap: Any, cluster_size: int) -> int:
    """Clusters of the image itself (depth 0) stored compressed."""
    n = 0
    for e in emap:
        if e.compressed and e.depth == 0:
            first = e.start // cluster_size
            last = (e.end - 1) // cluster_size
            n += last - first + 1
    return n


def info(path: PathArg, format: Optional[str] = None, *,
         force_share: bool = False) -> ImageInfo:
    """Format, sizes, cluster size, backing file and compressed clusters of
    an image, as ``qemu-img info`` reports them.  Images marked dirty or
    corrupt are read too (``dirty_flag`` says so)."""
    filename = os.fsdecode(os.fspath(path))
    with open_image(path, format, force=True, force_share=force_share) as img:
        fmt = img.format
        size = img.size
        chain = [(name, f) for name, f in img.backing_chain]
        emap = img.extents() if fmt == "qcow2" else None
        snapshots = _snapshots(img._img.snapshots())
    try:
        st = os.stat(filename)
        actual: Optional[int] = st.st_blocks * 512
    except OSError:
        actual = None
    result = ImageInfo(filename=filename, format=fmt, virtual_size=size, actual_size=actual,
                       backing_chain=chain, snapshots=snapshots)
    if fmt == "qcow2":
        with open(filename, "rb") as f:
            h = read_qcow2_header(f)
            backing = read_qcow2_backing_name(f, h)
            extensions = read_qcow2_extensions(f, h)
        result.cluster_size = h.cluster_size
        result.dirty_flag = bool(h.incompatible_features & INCOMPAT_DIRTY)
        result.format_specific = qcow2_format_specific(h)
        if backing is not None:
            result.backing_filename = backing
            if chain:
                result.full_backing_filename = chain[0][0]
            if EXT_BACKING_FORMAT in extensions:  # absent: qemu probes, and does not say
                result.backing_filename_format = extensions[EXT_BACKING_FORMAT].decode(
                    "utf-8", "surrogateescape")
        assert emap is not None
        result.compressed_clusters = _compressed_clusters(emap, h.cluster_size)
    return result



def info_chain(path: PathArg, format: Optional[str] = None, *,
               force_share: bool = False) -> List[ImageInfo]:
    """``info`` of the image and of every backing file, nearest first
    (``qemu-img info --backing-chain``)."""
    top = info(path, format, force_share=force_share)
    return [top] + [info(name, fmt, force_share=force_share) for name, fmt in top.backing_chain]


def chain_to_json(infos: List[ImageInfo]) -> str:
    """``qemu-img info --backing-chain --output=json``: a list."""
    return json.dumps([i.to_dict() for i in infos], indent=4) + "\n"


def chain_to_human(infos: List[ImageInfo]) -> str:
    """``qemu-img info --backing-chain``: one block per image, a blank line between."""
    return "\n".join(i.to_human() for i in infos)
