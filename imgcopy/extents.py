"""Extents and extent maps, in qemu-img map's vocabulary."""
from __future__ import annotations

from typing import Iterator, NamedTuple, Optional, Sequence, Union, overload

from . import _core

# qemu reports a raw image's size rounded up to whole 512-byte sectors.
QEMU_SECTOR = 512


class Extent(NamedTuple):
    """A run of guest bytes with the same block status.

    ``present``: allocated at ``depth`` of the backing chain; ``zero``: reads
    as zeros; ``data``: read from the image's storage; ``offset``: where the
    run starts in the host file, or None where that means nothing."""

    start: int
    length: int
    depth: int
    present: bool
    zero: bool
    data: bool
    offset: Optional[int]
    compressed: bool = False

    @property
    def end(self) -> int:
        return self.start + self.length

    def to_dict(self) -> dict:
        d = {
            "start": self.start,
            "length": self.length,
            "depth": self.depth,
            "present": self.present,
            "zero": self.zero,
            "data": self.data,
        }
        if self.offset is not None:
            d["offset"] = self.offset
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
        return Extent(*_core.extent_at(self._packed, i))

    def __iter__(self) -> Iterator[Extent]:
        for i in range(self._count):
            yield Extent(*_core.extent_at(self._packed, i))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ExtentMap):
            return NotImplemented
        return (self._packed, self.start, self.end) == (other._packed, other.start, other.end)

    def __hash__(self) -> int:
        return hash((self._packed, self.start, self.end))

    def __repr__(self) -> str:
        return (f"<ExtentMap {self.filename!r} [{self.start}, {self.end}) {len(self)} extents, "
                f"data={self.data_bytes} zero={self.zero_bytes}>")

    def to_json(self) -> str:
        """Exactly what ``qemu-img map --output=json`` prints for this range,
        including qemu's zero tail past a raw file's unaligned end."""
        return _core.format_map_json(self._packed, self.start, self._qemu_end)

    def to_human(self, filename: Optional[str] = None) -> str:
        """Exactly what ``qemu-img map`` prints (data extents only), naming
        the top image ``filename`` and backing files as the chain names them."""
        names = list(self._chain)
        if filename is not None:
            names[0] = filename
        return _core.format_map_human(self._packed, self.start, self._qemu_end, names)

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

    def summary(self) -> dict:
        return {
            "filename": self.filename,
            "format": self.format,
            "virtual_size": self.size,
            "start": self.start,
            "end": self.end,
            "extents": len(self),
            "data_extents": sum(1 for e in self if e.data),
            "data_bytes": self.data_bytes,
            "zero_bytes": self.zero_bytes,
            "allocated_bytes": self.allocated_bytes,
        }
