"""Opening images and asking them where their data is."""
from __future__ import annotations

import os

from . import _core
from ._defaults import FORMATS
from ._keywords import suggest_keywords
from ._records import FrozenRecord
from .extents import QEMU_SECTOR, Extent, ExtentMap

TYPE_CHECKING = False  # typing's import is not paid to start a command
if TYPE_CHECKING:
    from typing import List, Optional, Union

    from ._core import CacheStats

    # (for annotations: a type checker's name only)
    PathArg = Union[str, bytes, "os.PathLike[str]", "os.PathLike[bytes]"]

MODES = ("r", "r+")


class Bitmap(FrozenRecord):
    """A persistent dirty bitmap stored in an image (qcow2), as ``qemu-img
    info`` lists it: ``name``; ``granularity``, the bytes one bit covers;
    ``in_use``, a program had it open for writing and did not close it, so
    its bits may be stale (qemu's "in-use" flag); ``auto``, it is enabled:
    qemu updates it as the guest writes (its "auto" flag).  Frozen."""

    _fields = __match_args__ = ("name", "granularity", "in_use", "auto")
    name: str
    granularity: int
    in_use: bool
    auto: bool

    def __init__(self, name: str, granularity: int, in_use: bool, auto: bool) -> None:
        self._set(name=name, granularity=granularity, in_use=in_use, auto=auto)

    @property
    def enabled(self) -> bool:
        """Whether writes through qemu update it (``auto``)."""
        return self.auto

    @property
    def consistent(self) -> bool:
        """Whether its bits can be trusted: it was closed properly (not
        ``in_use``), as qemu decides when it loads it."""
        return not self.in_use


def display_name(path: PathArg, member: Optional[str] = None) -> str:
    """How listings and messages name an image: its path, or for a member
    of a tar archive ``archive/member`` (``vm.ova/disk1.vmdk``)."""
    name = os.fsdecode(os.fspath(path))
    return name if member is None else f"{name}/{member}"


def source_member(function: str, member: Optional[str], src_member: Optional[str]) -> Optional[str]:
    """The source's member of a call that takes both ``member`` and its long
    name ``src_member`` (convert, plan, measure): one, or both the same."""
    if member is not None and src_member is not None and member != src_member:
        raise TypeError(f"{function}() got member={member!r} and src_member={src_member!r}: "
                        "both name the source's member; give one")
    return member if member is not None else src_member


def _check_format(format: Optional[str]) -> None:
    if format is not None and format not in FORMATS:
        raise ValueError(f"unknown image format {format!r} (known: {', '.join(FORMATS)})")


@suggest_keywords
class Image:
    """An open disk image.  Use as a context manager, or call close()."""

    def __init__(self, path: PathArg, format: Optional[str] = None, mode: str = "r", *,
                 direct: bool = False, force: bool = False, force_share: bool = False,
                 member: Optional[str] = None, external_files: bool = False,
                 _source: bool = False, _no_backing: bool = False) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be 'r' or 'r+', not {mode!r}")
        _check_format(format)
        if member is not None and not isinstance(member, str):
            raise TypeError(f"member must be a str or None, not {type(member).__name__}")
        self.filename = os.fsdecode(os.fspath(path))
        self.member = member
        self.mode = mode
        self._img = _core.Image(path, format, writable=mode == "r+", direct=direct, force=force,
                                force_share=force_share, source=_source, member=member,
                                external_files=external_files, no_backing=_no_backing)

    # -- life cycle -------------------------------------------------------
    def close(self) -> None:
        """Close; an image opened "r+" first writes what its format keeps in
        memory (qcow2 metadata), so that it is complete on disk.  Calls
        running in other threads end first; later ones raise ValueError."""
        # calls still running in other threads end first
        self._img.close(finish=self.mode == "r+")

    @property
    def closed(self) -> bool:
        return self._img.closed

    def __del__(self) -> None:
        # an image opened "r+" and dropped unclosed is still finished
        try:
            if not self._img.closed:
                self.close()
        except Exception:
            pass

    def __enter__(self) -> "Image":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        where = repr(self.filename) if self.member is None else \
            f"{self.filename!r} member={self.member!r}"
        if self.closed:
            return f"<imgcopy.Image {where} closed>"
        return f"<imgcopy.Image {where} format={self.format} size={self.size}>"

    # -- properties -------------------------------------------------------
    @property
    def size(self) -> int:
        """Virtual size in bytes."""
        return self._img.size

    @property
    def format(self) -> str:
        return self._img.format

    # -- block status -----------------------------------------------------
    def block_status(self, offset: int, length: Optional[int] = None) -> Extent:
        """The extent starting at ``offset``, at most ``length`` bytes long."""
        if length is None:
            size = self.size
            if not 0 <= offset < size:
                raise ValueError(f"offset {offset} is outside the image (size {size})")
            length = size - offset
        return Extent.unpack(self._img.block_status(offset, length))

    def extents(self, start: int = 0, length: Optional[int] = None) -> ExtentMap:
        """The extents of ``[start, start + length)``; ``length`` is clipped
        at the end of the image, like qemu-img map's --max-length."""
        return self._map(start, length, None)

    def dirty_map(self, bitmap: str, start: int = 0, length: Optional[int] = None) -> ExtentMap:
        """The dirty map of persistent bitmap ``bitmap`` (see ``bitmaps()``)
        over ``[start, start + length)`` (clipped as ``extents()`` clips
        it): the extent map with each extent cut where the bitmap changes,
        ``Extent.dirty`` set on what it marks changed since it was started.
        The bitmap is this image's own (a layer's, not its backing
        chain's); a disabled one reads as any other.

        Raises ValueError when the image has no bitmap of that name (the
        message lists those it has) or its format keeps none;
        ImageFormatError (a ValueError too) for one qemu refuses: in use,
        left so by a program that had the image open for writing and did
        not close it (its bits may be stale), or corrupt."""
        if not isinstance(bitmap, str):
            raise TypeError(f"bitmap must be a str, not {type(bitmap).__name__}")
        return self._map(start, length, bitmap)

    def _map(self, start: int, length: Optional[int], bitmap: Optional[str]) -> ExtentMap:
        size = self.size
        if start < 0:
            raise ValueError("start must not be negative")
        if length is not None and length < 0:
            raise ValueError("length must not be negative")
        want_end = None if length is None else start + length
        end = size if want_end is None else min(size, want_end)
        if start >= size:
            packed, end = b"", start
            if bitmap is not None:   # still refused as it would be in range
                self._img.dirty_map(bitmap, size, size)
        else:
            packed = self._img.map(start, end)
            if bitmap is not None:
                packed = _core.mark_dirty(packed, self._img.dirty_map(bitmap, start, end))
        layers = self._img.chain()
        chain = [self.filename] + [path for path, _ in layers[1:]]
        return ExtentMap(packed, start=start, end=end, size=size, filename=self.filename,
                         format=self.format, qemu_end=self._qemu_end(want_end), chain=chain,
                         chain_formats=[fmt for _, fmt in layers], bitmap=bitmap)

    def _qemu_end(self, want_end: Optional[int]) -> int:
        """qemu sees a raw file's size rounded up to whole 512-byte sectors."""
        size = self.size
        if self.format == "raw":
            size = -(-size // QEMU_SECTOR) * QEMU_SECTOR
        return size if want_end is None else min(size, want_end)

    @property
    def backing_chain(self) -> list:
        """[(filename, format), ...] of the backing files, nearest first."""
        return self._img.chain()[1:]

    def bitmaps(self) -> List[Bitmap]:
        """The image's persistent dirty bitmaps, in the order it stores them
        (a qcow2 v3 image's; none for other formats, nor once the image
        has been written here: imgcopy does not update them, so it marks
        them invalid, as qemu expects of a program unaware of them)."""
        return [Bitmap(name, granularity, bool(flags & _core.BITMAP_IN_USE),
                       bool(flags & _core.BITMAP_AUTO))
                for name, granularity, flags in self._img.bitmaps()]

    @property
    def backing_members(self) -> list:
        """The tar member each of ``backing_chain`` is (None: a whole file)."""
        return self._img.chain_members()[1:]

    def cache_stats(self) -> CacheStats:
        """Extent-cache counters: hits, misses, lseek_calls, intervals."""
        return self._img.cache_stats()

    def drop_cache(self) -> None:
        self._img.drop_cache()

    # -- data -------------------------------------------------------------
    def read(self, offset: int, length: int) -> bytes:
        return self._img.read(offset, length)

    def write(self, offset: int, data: bytes) -> None:
        self._img.write(offset, data)

    def zero(self, offset: int, length: int, *, punch_hole: bool = True) -> None:
        """Make ``[offset, offset+length)`` read as zeros; ``punch_hole``
        lets the range be deallocated."""
        self._img.zero(offset, length, _core.ZERO_MAY_UNMAP if punch_hole else 0)

    def flush(self) -> None:
        """Make everything written so far durable (qcow2: metadata too)."""
        self._img.finish(sync=True)
        self._img.flush()


@suggest_keywords
def open(path: PathArg, format: Optional[str] = None, mode: str = "r", *,
         force: bool = False, force_share: bool = False, member: Optional[str] = None,
         external_files: bool = False) -> Image:
    """Open a disk image: ``mode`` "r" (read-only) or "r+" (read-write);
    ``format`` None probes the file.  ``force`` reads a qcow2 image marked
    dirty or corrupt (read-only only).

    ``member``: the image is this member of the tar archive at ``path`` (an
    OVA's disk), read in place without extracting it ("./" prefixes do not
    matter); read-only.  Its backing file (and a vmdk's extent files) are
    other members of the same archive.  A member that is not there raises
    ValueError naming some that are; a corrupt archive ImageFormatError.
    ``external_files``: a vmdk descriptor may name extent files outside its
    own directory (absolute, with "..", or through a symbolic link leading
    out of it) and device nodes; off by default, as an image's content
    should not choose which files are read.

    The image's files are locked as qemu locks them: while it is open, qemu
    (and imgcopy) cannot open for writing an image read here, nor open at
    all one written here (raw files: read).  An image another process
    writes raises ``BlockingIOError`` (an ``OSError``, errno EAGAIN) unless
    ``force_share`` reads it anyway (qemu-img -U; read-only only)."""
    return Image(path, format, mode, force=force, force_share=force_share, member=member,
                 external_files=external_files)


@suggest_keywords
def dirty_map(src: PathArg, bitmap: str, *, format: Optional[str] = None, start: int = 0,
              length: Optional[int] = None, force: bool = False, force_share: bool = False,
              member: Optional[str] = None, external_files: bool = False) -> ExtentMap:
    """The dirty map of persistent bitmap ``bitmap`` of the image ``src``
    (qcow2 v3: ``qemu-img bitmap --add``; see ``Image.bitmaps()``): its
    extent map, each extent cut where the bitmap changes between dirty and
    clean and carrying ``dirty``, the whole image unless ``start`` and
    ``length`` say otherwise.  What ``nbdinfo
    --map=qemu:dirty-bitmap:NAME`` says of ``qemu-nbd -B NAME``'s export,
    read from the file without qemu: lazily, a 1 TiB disk with a few dirty
    clusters in milliseconds.  See ``Image.dirty_map()`` for the errors;
    other keywords as for ``open()``."""
    with open(src, format, force=force, force_share=force_share, member=member,
              external_files=external_files) as img:
        return img.dirty_map(bitmap, start, length)


@suggest_keywords
def map(path: PathArg, format: Optional[str] = None, start: int = 0,
        length: Optional[int] = None, *, force: bool = False,
        force_share: bool = False, member: Optional[str] = None,
        external_files: bool = False) -> ExtentMap:
    """The extent map of an image, like ``qemu-img map``; ``member`` and
    ``external_files`` as for ``open()``."""
    with open(path, format, force=force, force_share=force_share, member=member,
              external_files=external_files) as img:
        return img.extents(start, length)
