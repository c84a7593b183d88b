"""Range shards of one disk: several copies of parts of a source into one
destination (processes, hosts, Dask tasks), and the disk's checksum made
from what each shard hashed, without reading anything again."""
from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any, Iterable, List, Optional, Tuple

from .sizes import parse_size

if TYPE_CHECKING:
    from .sizes import Size

# a shard: (offset, length, block digests of the blocks it covers, in order)
Shard = Tuple[int, int, bytes]


def _as_shard(item: Any) -> Shard:
    if isinstance(item, tuple):
        return item
    digests = getattr(item, "block_digests", None)
    if digests is None or item.offset is None:
        raise ValueError("a shard's result carries its range and block digests: copy it with "
                         "offset=, length= and checksum=True")
    return (item.offset, item.length, digests)


def combine_checksums(size: int, shards: Iterable[Any], *, algorithm: str = "sha256",
                      block_size: Size = 64 << 10) -> str:
    """The blkhash of a ``size``-byte disk (what ``imgcopy.checksum()`` of
    it gives) from its shards: ``CopyResult``s of ``convert(offset=,
    length=, checksum=ALGORITHM)`` or ``(offset, length, block_digests)``
    tuples.  Blocks no shard covers are zeros (a sparse disk's holes need
    no shard); shards must start on a block and end on one or at the end."""
    block = parse_size(block_size, "block_size")
    if block < 2 or block % 2:
        raise ValueError(f"block_size must be even, from 2 bytes, not {block}")
    nblocks = -(-size // block)
    zero = hashlib.new(algorithm, bytes(block)).digest()
    dsize = len(zero)
    tail = size - (nblocks - 1) * block if nblocks else 0
    tail_zero = hashlib.new(algorithm, bytes(tail)).digest() if tail != block else zero
    digests: List[Optional[bytes]] = [None] * nblocks
    for item in shards:
        offset, length, packed = _as_shard(item)
        end = offset + length
        if offset % block or (end % block and end != size) or end > size or length <= 0:
            raise ValueError(f"shard {offset}+{length} is not whole blocks of {block} bytes "
                             f"inside the disk ({size} bytes)")
        first, count = offset // block, -(-length // block)
        if len(packed) != count * dsize:
            raise ValueError(f"shard {offset}+{length}: {len(packed)} bytes of digests, not "
                             f"{count} of {dsize} ({algorithm})")
        for k in range(count):
            digest = packed[k * dsize:(k + 1) * dsize]
            if digests[first + k] not in (None, digest):
                raise ValueError(f"shards disagree on block {first + k}")
            digests[first + k] = digest
    outer = hashlib.new(algorithm)
    for i, known in enumerate(digests):
        outer.update(known if known is not None else tail_zero if i == nblocks - 1 else zero)
    outer.update(size.to_bytes(8, "little"))
    return outer.hexdigest()


def cut_shards(extents: Iterable[Tuple[int, int]], size: int, shard_size: int,
               block_size: int) -> List[Tuple[int, int]]:
    """Shards covering a ``size``-byte disk, each about ``shard_size`` bytes
    of the data the ``(offset, length)`` extents say it holds (holes cost a
    shard nothing: they join their neighbours), cut on whole blocks of
    ``block_size``; the last ends at the disk's end."""
    unit = max(block_size, 1)
    want = max(shard_size, unit)
    cuts = [0]
    held = 0
    for off, length in sorted(extents):
        pos, end = off, off + length
        while pos < end:
            take = min(end - pos, want - held)
            pos += take
            held += take
            if held >= want:
                cut = -(-pos // unit) * unit
                if cut < size and cut > cuts[-1]:
                    cuts.append(cut)
                held = 0
                pos = max(pos, cut)
    cuts.append(size)
    return [(a, b - a) for a, b in zip(cuts, cuts[1:]) if b > a]
