"""Type stubs for imgcopy's C core (csrc/py/module.c).

Options are keywords, each a field of the C struct it fills (csrc/fields.c
lists them); left out, they take the core's defaults."""
import os
from typing import (Callable, Dict, List, Optional, Tuple, TypedDict, Union, final,
                    type_check_only)

from .errors import Error as Error, ImageFormatError as ImageFormatError

_Path = Union[str, bytes, "os.PathLike[str]", "os.PathLike[bytes]"]

EXTENT_SIZE: int
EXTENT_DATA: int
EXTENT_ZERO: int
EXTENT_PRESENT: int
EXTENT_OFFSET_VALID: int
EXTENT_COMPRESSED: int
EXTENT_DIRTY: int
SNAPSHOT_SIZE: int
REQUEST_SIZE: int
REQ_WRITE: int
REQ_ZERO: int
REQ_SKIP: int
ZERO_MAY_UNMAP: int
ZERO_FAST: int
BITMAP_IN_USE: int
BITMAP_AUTO: int

# a persistent bitmap: name, granularity (bytes a bit covers), flags
# (BITMAP_IN_USE, BITMAP_AUTO)
_Bitmap = Tuple[str, int, int]

@type_check_only  # a type of the stubs only: dicts at run time
class ImageDescription(TypedDict):
    """Image.describe(): what the image's own header says."""
    cluster_size: int  # 0: the format has no clusters
    dirty: bool  # not cleanly shut down
    backing_name: Optional[str]  # as the image stores it
    backing_format: Optional[str]  # None: not stored
    # where the backing file is, opened or not: (path, member or None)
    backing_location: Optional[Tuple[str, Optional[str]]]
    # qemu-img info's, in its order; "bitmaps": Image.bitmaps()'s list
    format_specific: List[Tuple[str, Union[int, bool, str, List[_Bitmap]]]]
    # the format's facts, as its driver states them
    may_hold_compressed: bool  # clusters (grains) may be stored compressed
    qemu_sees_all_data: bool  # qemu 7.2 has no block status for it: all data
    stores_bitmaps: bool  # can hold persistent bitmaps (qcow2 v3)

@type_check_only  # a type of the stubs only: dicts at run time
class CacheStats(TypedDict):
    """Image.cache_stats(): the extent cache's counters."""
    hits: int
    misses: int
    lseek_calls: int
    intervals: int

@type_check_only  # a type of the stubs only: dicts at run time
class CopyCounters(TypedDict):
    """What a copy did (struct ic_copy_stats)."""
    bytes_read: int
    bytes_written: int
    bytes_zeroed: int
    bytes_skipped: int
    bytes_already_zero: int
    read_requests: int
    write_requests: int
    zero_requests: int
    extents: int
    bytes_changed: int
    bytes_compared: int
    bytes_equal: int

@type_check_only  # a type of the stubs only: dicts at run time
class _CopyChecksum(TypedDict, total=False):
    checksum: str  # the source's blkhash, when copy() was asked for it
    # block_digests=True (a shard): its blocks' digests, the first's index
    block_digests: bytes
    first_block: int
    # set by the Python side for a shard's report
    offset: int
    length: int
    # set by the Python side: what a journal had recorded before this run
    bytes_resumed: int

@type_check_only  # a type of the stubs only: dicts at run time
class CopyOptionDefaults(TypedDict):
    """copy_option_defaults(): struct ic_copy_options as the core fills it
    (target_is_zero None: decided per copy)."""
    sparse_threshold: int
    request_size: int
    concurrency: int
    out_of_order: bool
    target_is_zero: Optional[bool]
    offload: bool
    flush: bool
    connections: int
    requests_in_flight: int
    retries: int
    retry_delay_ms: int

@type_check_only  # a type of the stubs only: dicts at run time
class CopyReport(CopyCounters, _CopyChecksum):
    """copy()'s result: the counters, the options the copy ran with (as the
    core decided them: ic_copy_options_effective) and the requests made
    (packed struct ic_request, sorted by offset) when copy() was asked to
    log them."""
    requests: Optional[bytes]
    options: CopyOptionDefaults

@final
class Image:
    """An open disk image; its files locked as qemu locks them."""
    @property
    def size(self) -> int: ...
    @property
    def format(self) -> str: ...
    @property
    def writable(self) -> bool: ...
    @property
    def closed(self) -> bool: ...
    @property
    def finished(self) -> bool: ...
    def __init__(self, path: _Path, format: Optional[str] = ..., *, writable: bool = ...,
                 direct: bool = ..., force: bool = ..., force_share: bool = ...,
                 source: bool = ..., member: Optional[str] = ...,
                 external_files: bool = ..., no_backing: bool = ..., share_write: bool = ...,
                 resume: bool = ..., writeback: bool = ...) -> None:
        """``member``: the image is that member of the tar archive at
        ``path``, read in place (read-only); ``external_files``: a vmdk may
        name extent files outside its directory; ``no_backing``: the image
        alone, to describe it (what it does not hold reads as zeros);
        ``resume`` (with ``writable``): carry on writing a qcow2 image a
        crash left incomplete (name the format: an incomplete compat 0.10
        image has no magic), with every write a completed ``checkpoint()``
        made durable; finish() then completes it; ``writeback`` (a raw
        file written): start each write's writeback as it is made, so that
        the final flush finds little left to do."""
    def close(self, *, finish: bool = ...) -> None:
        """Close once calls in flight end (idempotent); ``finish`` first
        writes held metadata and marks the image complete."""
    def finish(self, *, sync: bool = ...) -> None:
        """Write held metadata and mark a new image complete."""
    def block_status(self, offset: int, length: int) -> bytes:
        """The extent at ``offset``, packed (struct ic_extent)."""
    def map(self, start: int, end: int) -> bytes:
        """The extents of [start, end), packed (struct ic_extent array)."""
    def dirty_map(self, bitmap: Union[str, bytes], start: int, end: int) -> bytes:
        """The dirty map of [start, end) of persistent bitmap ``bitmap``,
        packed: extents flagged EXTENT_DIRTY or not at all, neighbours
        merged; ValueError for no such bitmap, ImageFormatError for one
        qemu refuses (in use)."""
    def read(self, offset: int, length: int) -> bytes: ...
    def write(self, offset: int, data: bytes) -> None: ...
    def zero(self, offset: int, length: int, flags: int = ...) -> None: ...
    def flush(self) -> None: ...
    def checkpoint(self) -> None:
        """Make every write completed so far durable, so that after a crash
        at any later moment the image opens with ``resume=True`` holding
        them (writes of other threads may go on meanwhile)."""
    def cache_stats(self) -> CacheStats: ...
    def drop_cache(self) -> None: ...
    def chain(self) -> List[Tuple[str, str]]:
        """[(path, format)] from this image down its backing chain."""
    def chain_members(self) -> List[Optional[str]]:
        """The tar member each image of chain() is (None: a whole file)."""
    def reads_file(self, path: _Path, /) -> Optional[str]:
        """The file of this image's chain that ``path`` names, or None."""
    def snapshots(self) -> bytes:
        """The internal snapshots, packed (struct ic_snapshot array)."""
    def bitmaps(self) -> List[_Bitmap]:
        """The persistent bitmaps, in the order the image stores them."""
    def add_bitmap(self, name: Union[str, bytes], granularity: int, ranges: bytes, *,
                   enabled: bool = ...) -> None:
        """A persistent bitmap the next ``finish()`` stores (a new qcow2 v3
        image, or one resumed; the image is incomplete until then): a bit
        per ``granularity`` bytes (a power of two, 512 B to 2 GiB), set for
        every granule the packed (offset, length) ``ranges`` touch;
        ``enabled``: qemu marks what the guest writes from then on (the
        qcow2 auto flag).  Its bits are written now; writes before that
        finish do not change them, a write after it drops the stored
        bitmaps.  ValueError for what qemu refuses (the name: 1 to 1023
        bytes, unique; the granularity; too many or too large; compat
        0.10; an empty disk; a range outside the image), OSError ENOTSUP
        for a format that keeps no bitmaps or an existing qcow2 image."""
    def copy_bitmap(self, source: Image, name: Union[str, bytes]) -> None:
        """``source``'s persistent bitmap ``name`` (granularity, enabled or
        not, dirty map, read now), added as ``add_bitmap()`` adds one:
        ``qemu-img convert --bitmaps``.  ValueError when ``source`` keeps
        no bitmaps or not that one, ImageFormatError for one in use."""
    def describe(self, depth: int = ...) -> ImageDescription:
        """The image at ``depth`` of the backing chain (0: this one)."""

def probe(path: _Path, /) -> str:
    """The format the file looks like ("raw" when nothing else matches, "tar" for a
    tar archive)."""
def formats() -> Tuple[str, ...]:
    """The formats imgcopy reads."""
def writable_formats() -> Tuple[str, ...]:
    """The formats imgcopy can create."""
def create(path: _Path, format: Optional[str], size: int, *, direct: bool = ...,
           writeback: bool = ..., atomic: bool = ..., cluster_size: int = ...,
           compat: Optional[str] = ..., preallocation: Optional[str] = ...,
           compress: bool = ..., compression_type: Optional[str] = ...,
           compression_level: int = ..., backing_file: Optional[str] = ...,
           backing_format: Optional[str] = ...) -> Tuple[Image, bool]:
    """A new writable image, and whether it reads as zeros."""
def check_create_options(format: Optional[str], *, cluster_size: int = ...,
                         compat: Optional[str] = ..., preallocation: Optional[str] = ...,
                         compress: bool = ..., compression_type: Optional[str] = ...,
                         compression_level: int = ..., backing_file: Optional[str] = ...,
                         backing_format: Optional[str] = ...) -> None:
    """ValueError unless create() takes these options."""
def library_versions() -> Dict[str, Optional[str]]:
    """The version of each library this build can use (zlib, libdeflate,
    zstd linked in; libnbd, libcrypto loaded now), None where it lacks it."""
def compression_libraries() -> Dict[str, Optional[str]]:
    """The library each qcow2 compression type ("zlib", "zstd") uses in this
    build, with its version, or None where the build has none."""
@final
class Pool:
    """Worker threads and a budget of bytes in flight copies share."""
    def __new__(cls, threads: int, budget: int = ...) -> Pool: ...
    @property
    def threads(self) -> int: ...
    @property
    def budget(self) -> int: ...

@final
class Journal:
    """A copy's journal (csrc/journal.h): made, or an earlier run's opened
    and checked against this identity (ValueError naming what differs;
    ImageFormatError when damaged)."""
    def __new__(cls, path: Union[str, bytes, "os.PathLike[str]"], *, source: str = ...,
                destination: str = ..., size: int = ..., options: str = ...,
                algorithm: Optional[str] = ..., block_size: int = ...) -> Journal: ...
    @property
    def resumed(self) -> bool: ...
    @property
    def done(self) -> bytes:
        """The ranges recorded done: packed native uint64 (offset, length)."""
    @property
    def closed(self) -> bool: ...
    def close(self) -> None: ...
    def complete(self) -> None:
        """The copy completed: the journal is removed (durably)."""

def copy(src: Image, dst: Image, *, progress: Optional[object] = ..., log: bool = ...,
         sparse_threshold: int = ..., request_size: int = ..., concurrency: int = ...,
         out_of_order: bool = ..., target_is_zero: Optional[bool] = ...,
         offload: bool = ..., flush: bool = ..., connections: int = ...,
         requests_in_flight: int = ..., retries: int = ..., retry_delay_ms: int = ...,
         checksum: Optional[str] = ...,
         checksum_block_size: int = ..., changed: Optional[bytes] = ...,
         compare_block_size: int = ..., block_digests: bool = ...,
         pool: Optional[Pool] = ..., buffer_limit: int = ...,
         journal: Optional[Journal] = ..., journal_interval_ms: int = ...,
         journal_interval_bytes: int = ...) -> CopyReport:
    """Copy src to dst; progress(done, total) is called as it goes;
    ``checksum``: also the source's blkhash with this algorithm;
    ``changed``: only these ranges (packed native uint64 offset, length
    pairs); ``compare_block_size``: write only the blocks of this size
    where the destination differs (0: off)."""
def check_copy_options(*, sparse_threshold: int = ..., request_size: int = ...,
                       concurrency: int = ..., out_of_order: bool = ...,
                       target_is_zero: Optional[bool] = ..., offload: bool = ...,
                       flush: bool = ..., connections: int = ...,
                       requests_in_flight: int = ..., retries: int = ...,
                       retry_delay_ms: int = ...) -> None:
    """ValueError unless copy() takes these options."""
def copy_option_defaults() -> CopyOptionDefaults: ...
def format_map(packed: bytes, start: int, tail_end: int,
               names: Optional[Union[str, bytes]] = ...) -> str:
    """qemu-img map's output: JSON, or human with ``names`` (the file of
    each depth of the chain, NUL-separated)."""
def extent_totals(packed: bytes, /) -> Tuple[int, int, int, int, int]:
    """(data, zero, present, compressed, dirty) bytes of packed extents."""
def mark_dirty(packed: bytes, dirty: bytes, /) -> bytes:
    """The packed extents cut where the packed dirty map ``dirty`` changes,
    EXTENT_DIRTY set inside its dirty extents, merged as qemu-img map
    merges."""
def format_dirty_map(packed: bytes, start: int, file: Optional[Union[str, bytes]] = ...) -> str:
    """A dirty map's output, neighbours merged by EXTENT_DIRTY alone: JSON
    (start, length, dirty), or human naming ``file`` (dirty ranges only)."""

# ---- compare (csrc/py/compare.c) ------------------------------------------

@type_check_only  # a type of the stubs only: dicts at run time
class CompareOutcome(TypedDict):
    """compare()'s result (struct ic_compare_result)."""
    outcome: str  # "identical", "content", "size", "status"
    identical: bool
    offset: int
    size_a: int  # qemu's lengths (raw files rounded up to 512 bytes)
    size_b: int
    size_mismatch: bool
    in_tail: bool  # found past the end of the smaller image
    warned: bool  # qemu printed "Warning: Image size mismatch!" first
    bytes_read_a: int
    bytes_read_b: int
    progress: List[Tuple[float, bool]]  # qemu-img -p's reports: (percent, after the warning)

def compare(a: Image, b: Image, *, strict: bool = ..., concurrency: int = ...,
            progress: bool = ...,
            on_progress: Optional[Callable[[float, bool], object]] = ...) -> CompareOutcome:
    """qemu-img compare on two open images; read failures are raised with
    compare_step (3, 4), compare_image (0, 1) and compare_offset set."""
# ---- checksums (csrc/py/checksum.c) -------------------------------------
def checksum(image: Image, algorithm: Optional[str] = ..., *, block_size: int = ...,
             threads: int = ..., request_size: int = ..., length: int = ...,
             progress: Optional[object] = ...) -> str:
    """The blkhash checksum (hex) of the image's first ``length`` bytes
    (0: all); progress(done, total) is called as it goes."""
def checksum_check(algorithm: str, block_size: int, /) -> None:
    """ValueError (OSError ENOSYS without libcrypto) unless a checksum can
    be made with these (block_size 0: the default)."""
def checksum_algorithms() -> Tuple[str, ...]:
    """hashlib's names of the digests libcrypto provides."""
# ---- check (csrc/py/check.c) ----
@type_check_only  # a type of the stubs only: dicts at run time
class CheckCounters(TypedDict):
    corruptions: int
    leaks: int
    check_errors: int
    corruptions_fixed: int
    leaks_fixed: int
    image_end_offset: int
    total_clusters: int
    allocated_clusters: int
    fragmented_clusters: int
    compressed_clusters: int
    failed_errno: int  # qemu's "Check failed: <strerror>": its errno, else 0
    messages: bytes    # the detail lines qemu prints on stderr
    format: str
def check(path: Union[str, bytes, os.PathLike], format: Optional[str] = ..., *,
          force_share: bool = ..., member: Optional[str] = ...,
          external_files: bool = ...) -> CheckCounters:
    """qemu-img check of the image, read-only; OSError(ENOTSUP) for
    formats without a checker.  ``member`` and ``external_files`` as
    Image's."""
