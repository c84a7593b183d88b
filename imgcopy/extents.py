"""Extents and extent maps, in qemu-img map's vocabulary."""
from __future__ import annotations

import collections.abc
import os
import struct
from collections import namedtuple

from . import _core
from .sizes import KINDS, LABELS, human_size, share_text  # noqa: F401 (the views' words)
from .uris import qemu_filename

# typing's import is not paid to start a command (map, info): what a type
# checker reads of typing is here, the running code does without it
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import (Any, Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple,
                        Union, overload)
else:
    def overload(func):
        return func

# qemu reports a raw image's size rounded up to whole 512-byte sectors.
QEMU_SECTOR = 512

# Formats whose "present, zero, no data" comes from the file system (a hole
# in a plain file), not from the image's own metadata.
_PLAIN_FORMATS = ("raw",)




def _median_low(values: List[int]) -> int:
    """statistics.median_low, without importing statistics (start-up time)."""
    return sorted(values)[(len(values) - 1) // 2] if values else 0

def extent_kind(depth: int, zero: bool, data: bool, zeroed: bool = False,
                dirty: Optional[bool] = None) -> str:
    """One of KINDS for an extent's flags (``zeroed``, ``dirty``: see Extent)."""
    if dirty:
        return "dirty"
    if data and not zero:
        return "data" if depth == 0 else "backing"
    if data:
        return "zero"
    return "zeroed" if zeroed else "hole"


def packed_struct(fmt: str, c_size: int, c_name: str) -> struct.Struct:
    """The layout of a C struct the core packs, refused at import when the
    compiled core's struct has another size (an ``ImportError``, not an
    ``assert``: ``python -O`` keeps this check)."""
    layout = struct.Struct(fmt)
    if layout.size != c_size:
        raise ImportError(f"imgcopy._core packs {c_name} in {c_size} bytes, imgcopy "
                          f"reads {layout.size}: the extension was built from other sources")
    return layout


# struct ic_extent, as the C core packs extents: start, length, host
# offset, flags, depth
_EXTENT = packed_struct("=QQQII", _core.EXTENT_SIZE, "struct ic_extent")
_DATA, _ZERO, _PRESENT = _core.EXTENT_DATA, _core.EXTENT_ZERO, _core.EXTENT_PRESENT
_OFFSET_VALID, _COMPRESSED = _core.EXTENT_OFFSET_VALID, _core.EXTENT_COMPRESSED
_DIRTY = _core.EXTENT_DIRTY


if TYPE_CHECKING:
    class _ExtentFields(NamedTuple):
        start: int
        length: int
        depth: int
        present: bool
        zero: bool
        data: bool
        host_offset: Optional[int]
        compressed: bool = False
        zeroed: bool = False
        dirty: Optional[bool] = None
else:  # the same tuple, of collections' namedtuple (typing's NamedTuple makes one too)
    _ExtentFields = namedtuple(
        "Extent", ["start", "length", "depth", "present", "zero", "data", "host_offset",
                   "compressed", "zeroed", "dirty"], defaults=(False, False, None))


class Extent(_ExtentFields):
    """A run of guest bytes with the same block status.

    ``start`` (and every other offset imgcopy names so) is a guest offset.
    ``present``: allocated at ``depth`` of the backing chain; ``zero``: reads
    as zeros; ``data``: read from the image's storage; ``host_offset``: where
    the run starts in the host file, or None where that means nothing
    (qemu-img map's "offset"); ``zeroed``: reads as zeros because the
    layer at ``depth`` records it so (a qcow2 zero cluster, a vmdk zero
    grain, a vhdx zero block) and hides what the layers below it hold.
    A raw file's holes, which qemu calls present, are not zeroed, nor are
    the zeros of the last layer of a chain (nothing is below them to hide:
    to a reader they are holes, whatever the format calls them).
    ``dirty``, of a dirty map's extents (see ``dirty_map()``): whether a
    persistent bitmap of the image marks the run changed since the bitmap
    was started; None in a plain extent map, which says nothing of changes
    (``convert(changed=MAP)`` copies a dirty map's dirty extents, a plain
    map's all).
    Fields: ``start``, ``length``, ``depth``, ``present``, ``zero``,
    ``data``, ``host_offset``, ``compressed`` (False), ``zeroed``
    (False) and ``dirty`` (None)."""

    __slots__ = ()

    @classmethod
    def unpack(cls, packed: bytes, index: int = 0,
               hiding_depths: Optional[Sequence[bool]] = None,
               dirty_map: bool = False) -> "Extent":
        """Extent ``index`` of extents packed by the C core.
        ``hiding_depths[d]``: the zeros the layer at depth d records hide
        layers below it (see ``zeroed``; none when None); ``dirty_map``:
        they are a dirty map's (``dirty`` is True or False, else None)."""
        start, length, host, flags, depth = _EXTENT.unpack_from(packed, index * _EXTENT.size)
        present, zero, data = bool(flags & _PRESENT), bool(flags & _ZERO), bool(flags & _DATA)
        zeroed = present and zero and not data and hiding_depths is not None \
            and depth < len(hiding_depths) and hiding_depths[depth]
        return cls(start, length, depth, present, zero, data,
                   host if flags & _OFFSET_VALID else None, bool(flags & _COMPRESSED), zeroed,
                   bool(flags & _DIRTY) if dirty_map else None)

    @property
    def end(self) -> int:
        return self.start + self.length

    @property
    def kind(self) -> str:
        """"dirty" (in a dirty map: marked changed, whatever it holds), else
        "data" (stored in this image), "backing" (data of a backing file),
        "zero" (stored but known to read as zeros), "zeroed" (a zero cluster
        of a layer) or "hole" (no data)."""
        return extent_kind(self.depth, self.zero, self.data, self.zeroed, self.dirty)

    def to_dict(self) -> dict:
        """qemu-img map --output=json's entry (its keys and order)."""
        d = {
            "start": self.start,
            "length": self.length,
            "depth": self.depth,
            "present": self.present,
            "zero": self.zero,
            "data": self.data,
        }
        if self.host_offset is not None:
            d["offset"] = self.host_offset  # qemu-img map's name
        return d


class ExtentMap(collections.abc.Sequence[Extent]):
    """The extents of ``[start, end)`` of an image, neighbours merged as
    qemu-img map merges them.  Extents stay packed in C until asked for.

    A *dirty map* (``dirty_map()``, ``Image.dirty_map()``) is the same map
    with the image's persistent bitmap ``bitmap`` laid over it: extents are
    cut where the bitmap changes between dirty and clean, and carry
    ``dirty``; its views draw the dirty ranges as a kind of their own, and
    ``to_json()``/``to_human()`` print the dirty ranges (``imgcopy map
    --bitmap``).  ``bitmap`` is None for a plain extent map."""

    def __init__(self, packed: bytes, *, start: int, end: int, size: int,
                 filename: str = "", format: str = "raw",
                 qemu_end: Optional[int] = None, chain: Optional[list] = None,
                 chain_formats: Optional[Sequence[str]] = None,
                 bitmap: Optional[str] = None) -> None:
        self._packed = packed
        self._count = len(packed) // _core.EXTENT_SIZE
        self.start = start
        self.end = end
        self.size = size
        self.filename = filename
        self.format = format
        self.bitmap = bitmap
        self._totals: Optional[tuple] = None
        self._runs: Optional[List[Tuple[str, int, int]]] = None
        self._compressed: Optional[List[Tuple[int, int]]] = None
        # where qemu-img map would stop: past `end` only for a raw file
        # whose size is not a multiple of 512
        self._qemu_end = end if qemu_end is None else qemu_end
        # file names by depth, for the human format
        self._chain = list(chain) if chain else [filename]
        # formats by depth: which layers' zeros hide the layers below
        formats = list(chain_formats) if chain_formats else [format]
        self.chain_formats = formats
        self._hiding = [f not in _PLAIN_FORMATS and d + 1 < len(formats)
                        for d, f in enumerate(formats)]

    @property
    def chain_files(self) -> List[str]:
        """The files of the backing chain by depth (this image's first), as
        to_human() names them."""
        return list(self._chain)

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, i: int) -> Extent: ...
    @overload
    def __getitem__(self, i: slice) -> list: ...

    def __getitem__(self, i: Union[int, slice]) -> Union[Extent, list]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self._count))]
        if i < 0:
            i += self._count
        if not 0 <= i < self._count:
            raise IndexError("extent index out of range")
        return Extent.unpack(self._packed, i, self._hiding, self.bitmap is not None)

    def __iter__(self) -> Iterator[Extent]:
        hiding, dirty_map = self._hiding, self.bitmap is not None
        for i in range(self._count):
            yield Extent.unpack(self._packed, i, hiding, dirty_map)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ExtentMap):
            return NotImplemented
        return (self._packed, self.start, self.end, self.bitmap) == \
            (other._packed, other.start, other.end, other.bitmap)

    def __hash__(self) -> int:
        return hash((self._packed, self.start, self.end, self.bitmap))

    def __repr__(self) -> str:
        where = human_size(self.size)
        if (self.start, self.end) != (0, self.size):
            where = f"[{self.start}, {self.end}) of {where}"
        if self.bitmap is not None:
            where += f", bitmap {self.bitmap!r}"
        parts = [f"{row['label']} {human_size(row['bytes'])} ({row['share_text']})"
                 for row in self.breakdown()]
        if self.compressed_bytes:
            parts.append(f"compressed {human_size(self.compressed_bytes)}")
        return f"<ExtentMap {self.filename!r} {self.format} {where}: {len(self)} extents; " \
               + (", ".join(parts) or "empty range") + ">"

    def to_json(self) -> str:
        """Exactly what ``qemu-img map --output=json`` prints for this range,
        including qemu's zero tail past a raw file's unaligned end.

        A dirty map prints its dirty and clean ranges instead, in the same
        shape: ``[{ "start": S, "length": L, "dirty": true|false}, ...]``
        (what ``nbdinfo --map=qemu:dirty-bitmap:NAME`` tells)."""
        if self.bitmap is not None:
            return _core.format_dirty_map(self._packed, self.start)
        return _core.format_map(self._packed, self.start, self._qemu_end)

    def to_human(self, filename: Optional[str] = None) -> str:
        """Exactly what ``qemu-img map`` prints (data extents only), naming
        the top image ``filename`` and backing files as the chain names them.

        A dirty map prints its dirty ranges only, under "Offset Length
        File", as qemu-img map prints data ranges."""
        if self.bitmap is not None:
            name = qemu_filename(self._chain[0] if filename is None else filename)
            return _core.format_dirty_map(self._packed, self.start, name)
        names = list(self._chain)
        if filename is not None:
            names[0] = filename
        names = [qemu_filename(n) for n in names]
        # names as bytes: a file's name need not be UTF-8
        return _core.format_map(self._packed, self.start, self._qemu_end,
                                os.fsencode("\0".join(names)))

    def _totals_cached(self) -> tuple:
        if self._totals is None:
            self._totals = _core.extent_totals(self._packed)
        return self._totals

    @property
    def data_bytes(self) -> int:
        """Bytes with qemu-img map's ``data`` flag: data of this image, of
        its backing files and allocated zeros (see ``breakdown()``)."""
        return self._totals_cached()[0]

    @property
    def zero_bytes(self) -> int:
        """Bytes known to read as zeros (``zero``)."""
        return self._totals_cached()[1]

    @property
    def allocated_bytes(self) -> int:
        """Bytes with qemu-img map's ``present`` flag: allocated at some
        depth of the chain, a raw file's holes included (qemu counts them
        so: a raw file has nothing below it)."""
        return self._totals_cached()[2]

    @property
    def compressed_bytes(self) -> int:
        """Bytes stored in compressed clusters."""
        return self._totals_cached()[3]

    @property
    def dirty_bytes(self) -> int:
        """Bytes a dirty map's bitmap marks changed (0 in a plain map)."""
        return self._totals_cached()[4]

    def dirty_ranges(self) -> List[Tuple[int, int]]:
        """[(start, end), ...] of a dirty map's dirty ranges, neighbours
        merged, in guest order: what a copy of the changes reads."""
        out: List[Tuple[int, int]] = []
        for start, length, _, flags, _ in _EXTENT.iter_unpack(self._packed):
            if flags & _DIRTY:
                if out and out[-1][1] == start:
                    out[-1] = (out[-1][0], start + length)
                else:
                    out.append((start, start + length))
        return out

    @property
    def hole_bytes(self) -> int:
        """Bytes without qemu-img map's ``data`` flag (holes and zeroed
        clusters): a copy never reads them."""
        return self.end - self.start - self.data_bytes

    # -- exploration ------------------------------------------------------
    def runs(self) -> List[Tuple[str, int, int]]:
        """[(kind, start, end), ...]: neighbouring extents of the same kind
        (see KINDS) merged, in guest order."""
        return list(self._scan()[0])

    def compressed_ranges(self) -> List[Tuple[int, int]]:
        """[(start, end), ...] of the extents stored compressed, neighbours
        merged, in guest order."""
        return list(self._scan()[1])

    def _scan(self) -> Tuple[List[Tuple[str, int, int]], List[Tuple[int, int]]]:
        """(runs, compressed ranges), found once."""
        if self._runs is not None and self._compressed is not None:
            return self._runs, self._compressed
        # one pass over the packed extents, without an Extent per extent:
        # views of maps with 100,000s of extents stay interactive
        runs: List[Tuple[str, int, int]] = []
        compressed: List[Tuple[int, int]] = []
        hiding = self._hiding
        layers = len(hiding)
        last_kind, last_end = "", -1
        for start, length, _, flags, depth in _EXTENT.iter_unpack(self._packed):
            end = start + length
            if flags & _DIRTY:
                kind = "dirty"
            elif flags & _DATA:
                kind = "zero" if flags & _ZERO else "backing" if depth else "data"
            elif flags & _ZERO and flags & _PRESENT and depth < layers and hiding[depth]:
                kind = "zeroed"
            else:
                kind = "hole"
            if kind == last_kind and start == last_end:
                runs[-1] = (kind, runs[-1][1], end)
            else:
                runs.append((kind, start, end))
            last_kind, last_end = kind, end
            if flags & _COMPRESSED:
                if compressed and compressed[-1][1] == start:
                    compressed[-1] = (compressed[-1][0], end)
                else:
                    compressed.append((start, end))
        self._runs, self._compressed = runs, compressed
        return runs, compressed

    def breakdown(self) -> List[Dict[str, Any]]:
        """One row per kind present in the range (see KINDS), in drawing
        order: ``kind``, ``label`` (the word repr, the HTML view and plot()
        use), ``bytes``, ``share`` of the range (0..1) and ``share_text``
        ("41.4%", "<0.1%").  The rows add up to the range's length."""
        sizes = dict.fromkeys(KINDS, 0)
        for kind, s, e in self.runs():
            sizes[kind] += e - s
        return self._rows(sizes)

    def _rows(self, sizes: Dict[str, int]) -> List[Dict[str, Any]]:
        span = self.end - self.start
        return [{"kind": k, "label": LABELS[k], "bytes": n,
                 "share": n / span if span else 0.0, "share_text": share_text(n, span)}
                for k, n in sizes.items() if n]

    def summary(self) -> Dict[str, Any]:
        """Sizes and counts of the range (bytes unless named otherwise).

        ``kind_bytes`` maps every kind (see KINDS) to its bytes, and
        ``breakdown`` is ``breakdown()``: what the views draw.
        ``data_bytes``, ``zero_bytes``, ``allocated_bytes`` and
        ``hole_bytes`` keep qemu-img map's flags (``data``, ``zero``,
        ``present``, no ``data``): ``data_bytes`` + ``hole_bytes`` is the
        range's length; ``zero_bytes`` overlaps both.  A *run* is a
        longest range of extents that all have data (``data_runs``) or all
        have none (``hole_runs``); medians are the lower median of the run
        lengths.

        Of a dirty map also: ``bitmap``, ``dirty_bytes``, ``dirty_ranges``
        (how many), ``dirty_data_bytes`` (dirty bytes with qemu's ``data``
        flag: what a copy of the changes reads; the rest are holes and
        zeros)."""
        data_extents = zero_extents = compressed_extents = 0
        backing_bytes = zero_data_bytes = dirty_data_bytes = 0
        sizes = dict.fromkeys(KINDS, 0)
        for kind, start, end in self.runs():
            sizes[kind] += end - start
        data_runs: List[int] = []
        hole_runs: List[int] = []
        last: Optional[bool] = None
        for _, length, _, flags, depth in _EXTENT.iter_unpack(self._packed):
            data = bool(flags & _DATA)
            if data:
                data_extents += 1
                if depth:
                    backing_bytes += length
                if flags & _ZERO:
                    zero_data_bytes += length
            if flags & _ZERO:
                zero_extents += 1
            if flags & _COMPRESSED:
                compressed_extents += 1
            if flags & _DIRTY and data:
                dirty_data_bytes += length
            runs = data_runs if data else hole_runs
            if last is data:
                runs[-1] += length
            else:
                runs.append(length)
            last = data
        dirty = {} if self.bitmap is None else {
            "bitmap": self.bitmap,
            "dirty_bytes": self.dirty_bytes,
            "dirty_ranges": len(self.dirty_ranges()),
            "dirty_data_bytes": dirty_data_bytes,
        }
        return {
            "filename": self.filename,
            "format": self.format,
            "virtual_size": self.size,
            "start": self.start,
            "end": self.end,
            "extents": len(self),
            "kind_bytes": dict(sizes),
            "breakdown": self._rows(sizes),
            "data_extents": data_extents,
            "data_bytes": self.data_bytes,
            "zero_bytes": self.zero_bytes,
            "allocated_bytes": self.allocated_bytes,
            "hole_bytes": self.hole_bytes,
            "backing_bytes": backing_bytes,
            "zero_data_bytes": zero_data_bytes,
            "compressed_bytes": self.compressed_bytes,
            "zero_extents": zero_extents,
            "hole_extents": len(self) - data_extents,
            "compressed_extents": compressed_extents,
            "data_runs": len(data_runs),
            "largest_data_run": max(data_runs, default=0),
            "median_data_run": _median_low(data_runs),
            "hole_runs": len(hole_runs),
            "largest_hole_run": max(hole_runs, default=0),
            "median_hole_run": _median_low(hole_runs),
            **dirty,
        }

    def to_numpy(self) -> Any:  # -> numpy structured array
        """A structured array, one row per extent: start, end, length,
        depth, present, zero, data, host_offset (-1 where there is none),
        compressed, zeroed, dirty (False in a plain map) (needs numpy)."""
        import numpy as np  # lazy: numpy is an optional extra

        rows = [(e.start, e.end, e.length, e.depth, e.present, e.zero, e.data,
                 -1 if e.host_offset is None else e.host_offset, e.compressed, e.zeroed,
                 bool(e.dirty))
                for e in self]
        return np.array(rows, dtype=_numpy_dtype())

    def to_pandas(self) -> Any:  # -> pandas.DataFrame
        """A DataFrame, one row per extent: start, end, length, depth,
        present, zero, data, host_offset (nullable: <NA> where there is
        none), compressed, zeroed, dirty (False in a plain map), kind (see
        KINDS); ``df.attrs``
        holds filename, format, virtual_size and, of a dirty map, bitmap
        (needs pandas)."""
        import pandas as pd  # lazy: pandas is an optional extra

        a = self.to_numpy()
        df = pd.DataFrame({name: a[name] for name in a.dtype.names
                           if name not in ("host_offset", "compressed", "zeroed", "dirty")})
        host = a["host_offset"]
        df["host_offset"] = pd.arrays.IntegerArray(host.copy(), host < 0)
        df["compressed"] = a["compressed"]
        df["zeroed"] = a["zeroed"]
        df["dirty"] = a["dirty"]
        df["kind"] = [extent_kind(d, z, x, zd, dt) for d, z, x, zd, dt in zip(
            a["depth"].tolist(), a["zero"].tolist(), a["data"].tolist(), a["zeroed"].tolist(),
            a["dirty"].tolist())]
        df.attrs.update(filename=self.filename, format=self.format, virtual_size=self.size)
        if self.bitmap is not None:
            df.attrs["bitmap"] = self.bitmap
        return df

    def plot(self, ax: Any = None, *, bins: int = 40, title: Optional[str] = None) -> Any:
        """Draw the map with matplotlib: an allocation strip over the range
        (one colour per kind, holes are the background, compressed ranges
        hatched) and a histogram of extent lengths by kind.  ``ax``: None (a new figure),
        one Axes (the strip only) or a pair of Axes (strip, histogram).
        Returns the tuple of Axes drawn on."""
        from ._plot import plot_extent_map  # lazy: matplotlib is an optional extra

        return plot_extent_map(self, ax, bins=bins, title=title)

    def _repr_html_(self) -> str:
        from ._html import extent_map_html

        return extent_map_html(self)


def _numpy_dtype() -> Any:
    import numpy as np

    return np.dtype([("start", "<i8"), ("end", "<i8"), ("length", "<i8"), ("depth", "<i4"),
                     ("present", "?"), ("zero", "?"), ("data", "?"), ("host_offset", "<i8"),
                     ("compressed", "?"), ("zeroed", "?"), ("dirty", "?")])

