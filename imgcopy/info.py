"""What an image is: ``imgcopy.info(path)``, like ``qemu-img info``."""
from __future__ import annotations

import os
import re
import time

from . import _core
from .extents import QEMU_SECTOR, packed_struct
from ._keywords import suggest_keywords
from ._records import FrozenRecord, Record
from .image import Image, open as open_image
from .sizes import human_size
from .uris import is_nbd_uri, qemu_filename

TYPE_CHECKING = False  # typing's import is not paid to start a command
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Tuple

    from .image import PathArg

_U64 = 1 << 64


def _json_text(name: str) -> str:
    """A file name as qemu's JSON has it: bytes that are not UTF-8 become U+FFFD."""
    return os.fsencode(name).decode("utf-8", "replace")


def _int64(value: int) -> int:
    """qemu's QAPI prints 64-bit unsigned fields as int64."""
    return value - _U64 if value >= 1 << 63 else value


class Snapshot(FrozenRecord):
    """An internal snapshot (qcow2), as ``qemu-img info`` lists it.  ``id``
    and ``name`` are the stored bytes, cut as qemu cuts them (127 and 255
    bytes, at a NUL); ``icount`` is None when not recorded.  Frozen."""

    _fields = __match_args__ = ("id", "name", "vm_state_size", "date_sec", "date_nsec",
                                "vm_clock_nsec", "icount")
    id: bytes
    name: bytes
    vm_state_size: int
    date_sec: int
    date_nsec: int
    vm_clock_nsec: int
    icount: Optional[int]

    def __init__(self, id: bytes, name: bytes, vm_state_size: int, date_sec: int,
                 date_nsec: int, vm_clock_nsec: int, icount: Optional[int]) -> None:
        self._set(id=id, name=name, vm_state_size=vm_state_size, date_sec=date_sec,
                  date_nsec=date_nsec, vm_clock_nsec=vm_clock_nsec, icount=icount)

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
_SNAPSHOT = packed_struct("=128s256sQQIIq", _core.SNAPSHOT_SIZE, "struct ic_snapshot")


def _snapshots(packed: bytes) -> List[Snapshot]:
    """Snapshots as the C core packs them: id and name are cut at a NUL."""
    return [Snapshot(id_.split(b"\0")[0], name.split(b"\0")[0], state, date_sec, date_nsec,
                     clock, None if icount == -1 else icount)
            for id_, name, state, clock, date_sec, date_nsec, icount
            in _SNAPSHOT.iter_unpack(packed)]


_ESCAPE = re.compile(r"\\(u[0-9a-f]{4}|.)")
# an empty list or object ending its line: strings end in a quote, so a
# line ending so is a container's
_EMPTY = re.compile(r"^( *)(.*)(\[\]|\{\})(,?)$", re.MULTILINE)


def qemu_json(obj: Any) -> str:
    """JSON as qemu writes it: json.dumps' layout, but an empty list or
    object opened and closed on lines of their own; non-ASCII and DEL as
    \\uXXXX escapes with upper-case hex."""
    import json  # here: `imgcopy info` without --output=json starts faster

    text = json.dumps(obj, indent=4).replace("\x7f", "\\u007F")
    text = _EMPTY.sub(lambda m: f"{m[1]}{m[2]}{m[3][0]}\n{m[1]}{m[3][1]}{m[4]}", text)
    return _ESCAPE.sub(lambda m: "\\" + ("u" + m.group(1)[1:].upper() if m.group(1)[0] == "u"
                                          else m.group(1)), text)


def _json_texts(data: Any) -> Any:
    """Every string of ``data`` as qemu's JSON has it (see _json_text)."""
    if isinstance(data, str):
        return _json_text(data)
    if isinstance(data, dict):
        return {k: _json_texts(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_json_texts(v) for v in data]
    return data


class ImageInfo(Record):
    """What ``imgcopy.info()`` learnt of an image.

    ``virtual_size`` is the exact size (``Image.size``); ``to_dict()`` and
    ``to_json()`` are shaped like ``qemu-img info --output=json`` and, like
    it, round a raw file's size up to whole 512-byte sectors.
    ``dirty_flag`` None: unknown (qemu omits it).  ``member``: the tar
    member the image is (None: a whole file), ``backing_members`` those of
    ``backing_chain``; not part of qemu's output."""

    _fields = __match_args__ = (
        "filename", "format", "virtual_size", "actual_size", "dirty_flag", "cluster_size",
        "backing_filename", "full_backing_filename", "backing_filename_format",
        "format_specific", "compressed_clusters", "snapshots", "backing_chain", "member",
        "backing_members")

    def __init__(self, filename: str, format: str, virtual_size: int,
                 actual_size: Optional[int], dirty_flag: Optional[bool] = False,
                 cluster_size: Optional[int] = None, backing_filename: Optional[str] = None,
                 full_backing_filename: Optional[str] = None,
                 backing_filename_format: Optional[str] = None,
                 format_specific: Optional[Dict[str, Any]] = None,
                 compressed_clusters: Optional[int] = None,
                 snapshots: Optional[List[Snapshot]] = None,
                 backing_chain: Optional[List[Tuple[str, str]]] = None,
                 member: Optional[str] = None,
                 backing_members: Optional[List[Optional[str]]] = None) -> None:
        self.filename = filename
        self.format = format
        self.virtual_size = virtual_size
        self.actual_size = actual_size
        self.dirty_flag = dirty_flag
        self.cluster_size = cluster_size
        self.backing_filename = backing_filename
        self.full_backing_filename = full_backing_filename
        self.backing_filename_format = backing_filename_format
        self.format_specific = format_specific
        self.compressed_clusters = compressed_clusters
        self.snapshots: List[Snapshot] = [] if snapshots is None else snapshots
        self.backing_chain: List[Tuple[str, str]] = [] if backing_chain is None \
            else backing_chain
        self.member = member
        self.backing_members: List[Optional[str]] = [] if backing_members is None \
            else backing_members

    @property
    def qemu_virtual_size(self) -> int:
        if self.format == "raw":
            return -(-self.virtual_size // QEMU_SECTOR) * QEMU_SECTOR
        return self.virtual_size

    def to_dict(self) -> Dict[str, Any]:
        """``qemu-img info --output=json``'s object (qemu 7.2's key order),
        plus "compressed-clusters" for qcow2 and vmdk images."""
        d: Dict[str, Any] = {}
        if self.backing_filename_format is not None:
            d["backing-filename-format"] = self.backing_filename_format
        if self.snapshots:
            d["snapshots"] = [sn.to_dict() for sn in self.snapshots]
        d["virtual-size"] = self.qemu_virtual_size
        d["filename"] = _json_text(self.filename)
        if self.cluster_size is not None:
            d["cluster-size"] = self.cluster_size
        d["format"] = self.format
        if self.actual_size is not None:
            d["actual-size"] = self.actual_size
        if self.format_specific is not None:
            d["format-specific"] = _json_texts(self.format_specific)
        if self.backing_filename is not None:
            if self.full_backing_filename is not None:
                d["full-backing-filename"] = _json_text(self.full_backing_filename)
            d["backing-filename"] = _json_text(self.backing_filename)
        if self.dirty_flag is not None:
            d["dirty-flag"] = self.dirty_flag
        if self.compressed_clusters is not None:
            d["compressed-clusters"] = self.compressed_clusters
        return d

    def to_json(self) -> str:
        """As ``qemu-img info --output=json`` prints it (newline included)."""
        return qemu_json(self.to_dict()) + "\n"

    def to_human(self) -> str:
        """As ``qemu-img info`` prints it, plus a "compressed clusters" line
        for qcow2 and vmdk images."""
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
        from ._html import image_info_html

        return image_info_html(self)


def _dump_specific(data: Dict[str, Any], depth: int) -> List[str]:
    """qemu's bdrv_image_info_specific_dump: "-" becomes " ", four spaces
    of indent per level, list items as "[i]", booleans in lower case."""
    return [line for key, value in data.items()
            for line in _dump_item(key.replace("-", " "), value, depth)]


def _dump_item(label: str, value: Any, depth: int) -> List[str]:
    pad = "    " * depth
    if isinstance(value, dict):
        return [f"{pad}{label}:"] + _dump_specific(value, depth + 1)
    if isinstance(value, list):
        return [f"{pad}{label}:"] + [line for i, item in enumerate(value)
                                     for line in _dump_item(f"[{i}]", item, depth + 1)]
    if isinstance(value, bool):
        return [f"{pad}{label}: {'true' if value else 'false'}"]
    return [f"{pad}{label}: {value}"]


def _compressed_clusters(emap: Any, cluster_size: int) -> int:
    """Clusters of the image itself (depth 0) stored compressed."""
    n = 0
    for e in emap:
        if e.compressed and e.depth == 0:
            first = e.start // cluster_size
            last = (e.end - 1) // cluster_size
            n += last - first + 1
    return n


@suggest_keywords
def info(path: PathArg, format: Optional[str] = None, *,
         force_share: bool = False, member: Optional[str] = None,
         external_files: bool = False) -> ImageInfo:
    """Format, sizes, cluster size, backing file and compressed clusters of
    an image, as ``qemu-img info`` reports them.  Images marked dirty or
    corrupt are read too (``dirty_flag`` says so).  ``member`` and
    ``external_files`` as for ``open()``: a member's ``actual_size`` is
    None (its disk usage is the archive's).

    As qemu-img info, the image is described without its backing file: one
    that is missing or unusable leaves ``backing_filename`` and
    ``full_backing_filename`` as the image names it, and ``backing_chain``
    empty (``info_chain()``, which opens it, fails)."""
    filename = os.fsdecode(os.fspath(path))
    with Image(path, format, force=True, force_share=force_share, member=member,
               external_files=external_files, _no_backing=True) as img:
        fmt = img.format
        size = img.size
        snapshots = _snapshots(img._img.snapshots())
        description = img._img.describe()
        # the image's own clusters (depth 0, whatever lies below) stored
        # compressed are counted where its format may store some
        emap = img.extents() if description["may_hold_compressed"] else None
    chain: List[Tuple[str, str]] = []
    members: List[Optional[str]] = []
    if description["backing_name"] is not None:
        # the chain as it opens, for backing_chain; not opening is no error
        # here, as qemu-img info never opens it
        try:
            with open_image(path, format, force=True, force_share=force_share, member=member,
                            external_files=external_files) as whole:
                chain = list(whole.backing_chain)
                members = whole.backing_members
        except (OSError, ValueError):
            pass
    actual: Optional[int] = None  # a server's disk usage is unknown, as to qemu
    if not is_nbd_uri(filename) and member is None:
        try:
            actual = os.stat(filename).st_blocks * 512
        except OSError:
            pass
    result = ImageInfo(filename=qemu_filename(filename), format=fmt, virtual_size=size,
                       actual_size=actual, backing_chain=chain, snapshots=snapshots,
                       member=member, backing_members=members)
    if description["cluster_size"]:
        result.cluster_size = description["cluster_size"]
    # qemu asks the driver under a raw image: an NBD export has no answer
    plain_nbd = fmt == "raw" and is_nbd_uri(filename)
    result.dirty_flag = None if plain_nbd else description["dirty"]
    if description["format_specific"]:
        data: Dict[str, Any] = dict(description["format_specific"])
        if "bitmaps" in data:
            data["bitmaps"] = [_bitmap_info(*b) for b in data["bitmaps"]]
        result.format_specific = {"type": fmt, "data": data}
    if description["backing_name"] is not None:
        result.backing_filename = description["backing_name"]
        where = description["backing_location"]
        if where is not None:
            result.full_backing_filename = where[1] if where[1] is not None else where[0]
        # not stored: qemu probes, and does not say
        result.backing_filename_format = description["backing_format"]
    if emap is not None:
        result.compressed_clusters = _compressed_clusters(emap, description["cluster_size"])
    return result


@suggest_keywords
def info_chain(path: PathArg, format: Optional[str] = None, *,
               force_share: bool = False, member: Optional[str] = None,
               external_files: bool = False) -> List[ImageInfo]:
    """``info`` of the image and of every backing file, nearest first
    (``qemu-img info --backing-chain``): the whole chain must open, as
    qemu's must (a missing backing file raises ``OSError``)."""
    with open_image(path, format, force=True, force_share=force_share, member=member,
                    external_files=external_files):
        pass
    top = info(path, format, force_share=force_share, member=member,
               external_files=external_files)
    return [top] + [info(name, fmt, force_share=force_share, member=m,
                         external_files=external_files)
                    for (name, fmt), m in zip(top.backing_chain, top.backing_members)]


def _bitmap_info(name: str, granularity: int, flags: int) -> Dict[str, Any]:
    """A persistent bitmap as qemu-img info lists it (its keys, its flags'
    names and order)."""
    names = [word for bit, word in ((_core.BITMAP_IN_USE, "in-use"), (_core.BITMAP_AUTO, "auto"))
             if flags & bit]
    return {"flags": names, "name": name, "granularity": granularity}


def chain_to_json(infos: List[ImageInfo]) -> str:
    """``qemu-img info --backing-chain --output=json``: a list."""
    return qemu_json([i.to_dict() for i in infos]) + "\n"


def chain_to_human(infos: List[ImageInfo]) -> str:
    """``qemu-img info --backing-chain``: one block per image, a blank line between."""
    return "\n".join(i.to_human() for i in infos)
