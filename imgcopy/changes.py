"""What a warm copy copies: the ranges that changed since the last copy,
as convert()'s ``changed=`` takes them, packed for the C core (which sorts,
merges and bounds-checks them again: they are input)."""
from __future__ import annotations

from array import array
from operator import index

from .sizes import parse_size

TYPE_CHECKING = False  # typing's import is not paid to start a command
if TYPE_CHECKING:
    from typing import Any, Iterable, Tuple

DEFAULT_COMPARE_BLOCK = 64 << 10
COMPARE = "compare"


def pack_ranges(changed: Iterable[Any]) -> Tuple[bytes, int]:
    """``changed`` as packed (offset, length) pairs of uint64, and their
    number.  Items are ``(offset, length)`` pairs in any order, overlapping
    or not (CBT's list), or the extents of an ``ExtentMap``: of a dirty map
    (``imgcopy.dirty_map()``) the dirty ones, of any other map all."""
    if isinstance(changed, (str, bytes)):
        raise TypeError("changed must be (offset, length) pairs, an ExtentMap or "
                        f"{COMPARE!r}, not {type(changed).__name__}")
    packed = array("Q")
    for item in changed:
        if hasattr(item, "start") and hasattr(item, "length"):
            if getattr(item, "dirty", None) is False:
                continue
            offset, length = item.start, item.length
        else:
            try:
                offset, length = item
            except (TypeError, ValueError):
                raise TypeError(f"a changed range is an (offset, length) pair, not {item!r}")
        try:
            offset, length = index(offset), index(length)
        except TypeError:
            raise TypeError(f"a changed range's offset and length are integers, not {item!r}")
        if offset < 0 or length < 0:
            raise ValueError(f"changed range {offset}+{length} is negative")
        if offset >= 1 << 64 or length >= 1 << 64:
            raise ValueError(f"changed range {offset}+{length} is outside any image")
        packed.append(offset)
        packed.append(length)
    return packed.tobytes(), len(packed) // 2


def compare_block(changed: Any, block_size: Any) -> int:
    """The compare mode's block: ``block_size`` (default 64 KiB) when
    ``changed`` is "compare", else 0 (and no block size may be given)."""
    if changed == COMPARE:
        size = parse_size(DEFAULT_COMPARE_BLOCK if block_size is None else block_size,
                          "compare_block_size")
        if size == 0:
            raise ValueError("compare_block_size must be a multiple of 512 from 512 bytes "
                             "to 64 MiB, not 0")
        return size
    if block_size is not None:
        raise ValueError("compare_block_size goes with changed='compare'")
    return 0
