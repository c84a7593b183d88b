"""Extents and extent maps, in qemu-img map's vocabulary."""
from __future__ import annotations

import math
import os
import struct
from typing import Any, Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple, Union, \
    overload

from . import _core
from .uris import qemu_filename

# qemu reports a raw image's size rounded up to whole 512-byte sectors.
QEMU_SECTOR = 512

# What a run of guest bytes is, for a copy: "data" is read from the image
# itself, "backing" from a backing file, "zero" is storage known to read as
# zeros (allocated zeros: never read), "hole" has no data at all (never read).
KINDS = ("data", "backing", "zero", "hole")

_SIZE_UNITS = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")



def _median_low(values: List[int]) -> int:
    """statistics.median_low, without importing statistics (start-up time)."""
    return sorted(values)[(len(values) - 1) // 2] if values else 0

def human_size(n: int) -> str:
    """A byte count as qemu-img prints it ("1.31 MiB", "977 KiB", "0 B"):
    three significant digits, switching unit at 1000 of the smaller one."""
    _, exp = math.frexp(n / (1000.0 / 1024.0))
    i = min(max(int((exp - 1) / 10), 0), len(_SIZE_UNITS) - 1)
    return "%0.3g %sB" % (n / (1 << (i * 10)), _SIZE_UNITS[i])


def extent_kind(depth: int, zero: bool, data: bool) -> str:
    """One of KINDS for an extent's flags."""
    if data and not zero:
        return "data" if depth == 0 else "backing"
    return "zero" if data else "hole"


# struct ic_extent, as the C core packs extents: start, length, host
# offset, flags, depth
_EXTENT = struct.Struct("=QQQII")
assert _EXTENT.size == _core.EXTENT_SIZE
_DATA, _ZERO, _PRESENT = _core.EXTENT_DATA, _core.EXTENT_ZERO, _core.EXTENT_PRESENT
_OFFSET_VALID, _COMPRESSED = _core.EXTENT_OFFSET_VALID, _core.EXTENT_COMPRESSED


class Extent(NamedTuple):
    """A run of guest bytes with the same block status.

    ``start`` (and every other offset imgcopy names so) is a guest offset.
    ``present``: allocated at ``depth`` of the backing chain; ``zero``: reads
    as zeros; ``data``: read from the image's storage; ``host_offset``: where
    the run starts in the host file, or None where that means nothing
    (qemu-img map's "offset")."""

    start: int
    length: int
    depth: int
    present: bool
    zero: bool
    data: bool
    host_offset: Optional[int]
    compressed: bool = False

    @classmethod
    def unpack(cls, packed: bytes, index: int = 0) -> "Extent":
        """Extent ``index`` of extents packed by the C core."""
        start, length, host, flags, depth = _EXTENT.unpack_from(packed, index * _EXTENT.size)
        return cls(start, length, depth, bool(flags & _PRESENT), bool(flags & _ZERO),
                   bool(flags & _DATA), host if flags & _OFFSET_VALID else None,
                   bool(flags & _COMPRESSED))

    @property
    def end(self) -> int:
        return self.start + self.length

    @property
    def kind(self) -> str:
        """"data" (stored in this image), "backing" (data of a backing file),
        "zero" (stored but known to read as zeros) or "hole" (no data)."""
        return extent_kind(self.depth, self.zero, self.data)

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


class ExtentMap(Sequence[Extent]):
    """The extents of ``[start, end)`` of an image, neighbours merged as
    qemu-img map merges them.  Extents stay packed in C until asked for."""

    def __init__(self, packed: bytes, *, start: int, end: int, size: int,
                 filename: str = "", format: str = "raw",
                 qemu_end: Optional[int] = None, chain: Optional[list] = None) -> None:
        self._packed = packed
        self._count = len(packed) // _core.EXTENT_SIZE
        self.start = start
        self.end = end
        self.size = size
        self.filename = filename
        self.format = format
        self._totals: Optional[tuple] = None
        # where qemu-img map would stop: past `end` only for a raw file
        # whose size is not a multiple of 512
        self._qemu_end = end if qemu_end is None else qemu_end
        # file names by depth, for the human format
        self._chain = list(chain) if chain else [filename]

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
        return Extent.unpack(self._packed, i)

    def __iter__(self) -> Iterator[Extent]:
        for i in range(self._count):
            yield Extent.unpack(self._packed, i)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ExtentMap):
            return NotImplemented
        return (self._packed, self.start, self.end) == (other._packed, other.start, other.end)

    def __hash__(self) -> int:
        return hash((self._packed, self.start, self.end))

    def __repr__(self) -> str:
        span = self.end - self.start
        where = human_size(self.size)
        if (self.start, self.end) != (0, self.size):
            where = f"[{self.start}, {self.end}) of {where}"
        data = self.data_bytes
        text = f"<ExtentMap {self.filename!r} {self.format} {where}: {len(self)} extents, " \
               f"data {human_size(data)}"
        if span:
            text += f" ({100.0 * data / span:.1f}%)"
        if self.compressed_bytes:
            text += f", compressed {human_size(self.compressed_bytes)}"
        return text + f", holes {human_size(span - data)}>"

    def to_json(self) -> str:
        """Exactly what ``qemu-img map --output=json`` prints for this range,
        including qemu's zero tail past a raw file's unaligned end."""
        return _core.format_map(self._packed, self.start, self._qemu_end)

    def to_human(self, filename: Optional[str] = None) -> str:
        """Exactly what ``qemu-img map`` prints (data extents only), naming
        the top image ``filename`` and backing files as the chain names them."""
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
        """Bytes read from the image's storage (``data``)."""
        return self._totals_cached()[0]

    @property
    def zero_bytes(self) -> int:
        """Bytes known to read as zeros (``zero``)."""
        return self._totals_cached()[1]

    @property
    def allocated_bytes(self) -> int:
        """Bytes allocated in the image itself (``present``)."""
        return self._totals_cached()[2]

    @property
    def compressed_bytes(self) -> int:
        """Bytes stored in compressed clusters."""
        return self._totals_cached()[3]

    @property
    def hole_bytes(self) -> int:
        """Bytes with no data (``data`` false): a copy never reads them."""
        return self.end - self.start - self.data_bytes

    # -- exploration ------------------------------------------------------
    def runs(self) -> List[Tuple[str, int, int]]:
        """[(kind, start, end), ...]: neighbouring extents of the same kind
        (see KINDS) merged, in guest order."""
        out: List[Tuple[str, int, int]] = []
        for e in self:
            kind = e.kind
            if out and out[-1][0] == kind and out[-1][2] == e.start:
                out[-1] = (kind, out[-1][1], e.end)
            else:
                out.append((kind, e.start, e.end))
        return out

    def summary(self) -> Dict[str, Any]:
        """Sizes and counts of the range (bytes unless named otherwise).

        ``data_bytes`` + ``hole_bytes`` is the range's length; ``zero_bytes``
        (reads as zeros) overlaps both.  A *run* is a longest range of
        extents that all have data (``data_runs``) or all have none
        (``hole_runs``); medians are the lower median of the run lengths."""
        data_extents = zero_extents = compressed_extents = 0
        backing_bytes = zero_data_bytes = 0
        data_runs: List[int] = []
        hole_runs: List[int] = []
        last: Optional[bool] = None
        for e in self:
            if e.data:
                data_extents += 1
                if e.depth:
                    backing_bytes += e.length
                if e.zero:
                    zero_data_bytes += e.length
            if e.zero:
                zero_extents += 1
            if e.compressed:
                compressed_extents += 1
            runs = data_runs if e.data else hole_runs
            if last is e.data:
                runs[-1] += e.length
            else:
                runs.append(e.length)
            last = e.data
        return {
            "filename": self.filename,
            "format": self.format,
            "virtual_size": self.size,
            "start": self.start,
            "end": self.end,
            "extents": len(self),
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
        }

    def to_numpy(self) -> Any:  # -> numpy structured array
        """A structured array, one row per extent: start, end, length,
        depth, present, zero, data, host_offset (-1 where there is none),
        compressed (needs numpy)."""
        import numpy as np  # lazy: numpy is an optional extra

        rows = [(e.start, e.end, e.length, e.depth, e.present, e.zero, e.data,
                 -1 if e.host_offset is None else e.host_offset, e.compressed) for e in self]
        return np.array(rows, dtype=_numpy_dtype())

    def to_pandas(self) -> Any:  # -> pandas.DataFrame
        """A DataFrame, one row per extent: start, end, length, depth,
        present, zero, data, host_offset (nullable: <NA> where there is
        none), compressed, kind (see KINDS); ``df.attrs`` holds filename,
        format, virtual_size (needs pandas)."""
        import pandas as pd  # lazy: pandas is an optional extra

        a = self.to_numpy()
        df = pd.DataFrame({name: a[name] for name in a.dtype.names
                           if name not in ("host_offset", "compressed")})
        host = a["host_offset"]
        df["host_offset"] = pd.arrays.IntegerArray(host.copy(), host < 0)
        df["compressed"] = a["compressed"]
        df["kind"] = [extent_kind(d, z, x) for d, z, x in zip(a["depth"].tolist(),
                                                             a["zero"].tolist(),
                                                             a["data"].tolist())]
        df.attrs.update(filename=self.filename, format=self.format, virtual_size=self.size)
        return df

    def plot(self, ax: Any = None, *, bins: int = 40, title: Optional[str] = None) -> Any:
        """Draw the map with matplotlib: an allocation strip over the range
        (data, backing data, allocated zeros; holes are left blank) and a
        histogram of extent lengths by kind.  ``ax``: None (a new figure),
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
                     ("compressed", "?")])

