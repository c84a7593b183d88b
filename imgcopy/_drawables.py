"""What the notebook views (_html.py, _plot.py) draw, as protocols: the
attributes and methods of ExtentMap, CopyPlan and ImageInfo the views read.
The views name these, never the classes, so that a class can import its view
(lazily, to draw itself) without an import circle, even one a type checker
or a reader following ``if TYPE_CHECKING:`` imports would see.  A leaf: it
imports nothing of the package."""
from __future__ import annotations

from typing import Any, Dict, Iterator, List, Optional, Protocol, Sequence, Tuple


class DrawnExtent(Protocol):
    """An extent (Extent): its kind (extents.KINDS) and length."""

    @property
    def kind(self) -> str: ...

    @property
    def length(self) -> int: ...


class DrawnExtentMap(Protocol):
    """An extent map (ExtentMap) of the guest range [start, end); a dirty
    map names its ``bitmap``."""

    @property
    def start(self) -> int: ...

    @property
    def end(self) -> int: ...

    @property
    def size(self) -> int: ...

    @property
    def filename(self) -> str: ...

    @property
    def format(self) -> str: ...

    @property
    def chain_formats(self) -> Sequence[str]: ...

    @property
    def chain_files(self) -> Sequence[str]: ...

    @property
    def compressed_bytes(self) -> int: ...

    @property
    def bitmap(self) -> Optional[str]: ...

    @property
    def dirty_bytes(self) -> int: ...

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[DrawnExtent]: ...

    def runs(self) -> List[Tuple[str, int, int]]: ...

    def compressed_ranges(self) -> List[Tuple[int, int]]: ...

    def breakdown(self) -> List[Dict[str, Any]]: ...

    def summary(self) -> Dict[str, Any]: ...


class DrawnRequest(Protocol):
    """A request of a copy plan (Request)."""

    @property
    def kind(self) -> str: ...

    @property
    def offset(self) -> int: ...

    @property
    def end(self) -> int: ...


class DrawnOptions(Protocol):
    """The options a plan ran with (CopyOptions)."""

    @property
    def sparse_threshold(self) -> Any: ...

    @property
    def request_size(self) -> Any: ...

    @property
    def concurrency(self) -> int: ...

    @property
    def target_is_zero(self) -> Optional[bool]: ...


class DrawnPlan(Protocol):
    """A copy plan (CopyPlan) of an image of ``size`` bytes."""

    @property
    def size(self) -> int: ...

    @property
    def options(self) -> DrawnOptions: ...

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[DrawnRequest]: ...

    def totals(self) -> Dict[str, int]: ...


class DrawnSnapshot(Protocol):
    """An internal snapshot (info.Snapshot)."""

    def human_row(self) -> str: ...


class DrawnInfo(Protocol):
    """What info() learnt of an image (ImageInfo)."""

    @property
    def filename(self) -> str: ...

    @property
    def format(self) -> str: ...

    @property
    def qemu_virtual_size(self) -> int: ...

    @property
    def actual_size(self) -> Optional[int]: ...

    @property
    def cluster_size(self) -> Optional[int]: ...

    @property
    def backing_filename(self) -> Optional[str]: ...

    @property
    def full_backing_filename(self) -> Optional[str]: ...

    @property
    def backing_filename_format(self) -> Optional[str]: ...

    @property
    def dirty_flag(self) -> Optional[bool]: ...

    @property
    def compressed_clusters(self) -> Optional[int]: ...

    @property
    def snapshots(self) -> Sequence[DrawnSnapshot]: ...

    @property
    def format_specific(self) -> Optional[Dict[str, Any]]: ...
