"""Copying an image to another: the Python face of the C copy engine."""
from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any, Callable, Optional, Tuple, Union

from . import _core
from .checksum import (DEFAULT_ALGORITHM, DEFAULT_BLOCK_SIZE, ChecksumMismatch,
                       image_checksum)
from .errors import ImageFormatError, Remedy
from ._keywords import suggest_keywords
from .image import Image, PathArg, _check_format, source_member
from .options import CopyOptions, CreateOptions, Qcow2Options, with_keywords
from .progress import Progress, _progress_adapter, close_progress, make_progress
from .sizes import Size, parse_size

if TYPE_CHECKING:
    from ._core import CacheStats, CopyReport

NULL_TARGET = "null:"
# the formats the C core writes, and "null", the null target's name
DEST_FORMATS = _core.writable_formats() + ("null",)


@dataclass
class CopyResult:
    """What a copy did.  ``bytes_written + bytes_zeroed + bytes_skipped``
    is the source's size: each destination byte is dealt with once."""

    bytes_read: int
    bytes_written: int
    bytes_zeroed: int
    bytes_skipped: int
    read_requests: int
    write_requests: int
    zero_requests: int
    extents: int
    elapsed: float
    cache_hits: int = 0
    cache_misses: int = 0
    lseek_calls: int = 0
    # of bytes_skipped: zeros the destination read already (its block
    # status said so), so no zero request was sent
    bytes_already_zero: int = 0
    options: CopyOptions = field(default_factory=CopyOptions, repr=False)
    # checksum=: the source's blkhash (hex), from what the copy read;
    # verify=True: the destination's, read back after the copy
    checksum: Optional[str] = None
    dst_checksum: Optional[str] = None

    def to_dict(self) -> dict:
        d = asdict(self)
        del d["options"]
        for name in ("checksum", "dst_checksum"):  # only when asked for
            if d[name] is None:
                del d[name]
        return d


def _check_not_read(source: Image, dst: str) -> None:
    """Refuse a destination that is a file the source reads: the source
    itself, or a file of its backing chain (under any name)."""
    found = source._img.reads_file(dst)
    if found is None:
        return
    if found == source._img.chain()[0][0]:
        raise ValueError(f"{dst}: the destination is the source")
    raise ValueError(f"{dst}: the destination is {found}, a backing file of the source "
                     f"{source.filename}: writing it would change what the source reads")


def _existing_format(path: str) -> str:
    """The format to write into an existing destination when none was
    given: raw, if it looks like raw; anything else is refused, since
    writing raw bytes over an image's metadata destroys it."""
    found = _core.probe(path)
    if found == "raw":
        return found
    remedies = []
    if found in DEST_FORMATS:
        remedies.append(Remedy({"dst_format": found}, f"to write into it as a {found} image"))
    remedies.append(Remedy({"dst_format": "raw"}, "to overwrite it with raw bytes"))
    raise ImageFormatError(f"the destination is a {found} image and no destination format "
                           "was given", filename=path, remedies=remedies)


@suggest_keywords
def convert(src: PathArg, dst: PathArg, *, src_format: Optional[str] = None,
            member: Optional[str] = None, src_member: Optional[str] = None,
            src_external_files: bool = False,
            dst_format: Optional[str] = None, create: bool = True, force: bool = False,
            force_share: bool = False, options: Optional[CopyOptions] = None,
            create_options: Optional[CreateOptions] = None,
            sparse_threshold: Optional[Size] = None, concurrency: Optional[int] = None,
            request_size: Optional[Size] = None, out_of_order: Optional[bool] = None,
            target_is_zero: Optional[bool] = None,
            direct: Optional[Union[bool, Tuple[bool, bool]]] = None,
            flush: Optional[bool] = None, offload: Optional[bool] = None,
            connections: Optional[int] = None, requests_in_flight: Optional[int] = None,
            progress: Progress = None, cluster_size: Optional[Size] = None,
            compat: Optional[str] = None, preallocation: Optional[str] = None,
            compress: Optional[bool] = None, compression_type: Optional[str] = None,
            compression_level: Optional[int] = None,
            backing_file: Optional[Union[str, "os.PathLike[str]"]] = None,
            backing_format: Optional[str] = None,
            checksum: Union[bool, str, None] = None,
            checksum_block_size: Size = DEFAULT_BLOCK_SIZE,
            verify: bool = False) -> CopyResult:
    """Copy ``src`` to ``dst``, moving only what matters (``qemu-img convert``).

    Source:
      ``src``: a path (str, bytes or os.PathLike) of an image in any
      format ``imgcopy.open()`` reads (raw, qcow2, vmdk, vhdx, vpc:
      ``imgcopy.image.FORMATS``), a block device included, or an NBD URI
      (``nbd://host[:port]/export``, ``nbd+unix:///export?socket=PATH``,
      ``nbds://...``); backing chains are followed.
      ``src_format``: one of those formats; None probes (an image of a
      format imgcopy does not read is refused, not read as raw). ``force``: read a qcow2 source
      marked dirty or corrupt. ``member`` (or its long name ``src_member``;
      both given, they must agree): the source is this member of the tar
      archive ``src`` (an OVA's disk), read in place; its backing file is
      another member. ``src_external_files``: a vmdk source's
      descriptor may name extent files outside its directory (see
      ``open()``). The source's files are locked as qemu-img convert locks
      them (nobody may write them during the copy); ``force_share`` reads a
      source another process writes (qemu-img -U).

    Destination:
      ``dst``: a path, a block device, an NBD URI (the export as it is:
      ``create`` does not apply, its size is the server's, a smaller one is
      refused), or ``"null:"`` (discard everything; for measuring).
      ``dst_format``: "raw", "qcow2" or "null" (the formats imgcopy
      writes); None means
      "raw" for a new file, and for an existing one (``create=False``) the
      format it has if that is raw (another format must be named).
      ``create``: True makes a new image: a regular file is written under a
      temporary name beside ``dst`` and renamed over it only when the copy
      and its flush succeeded (on failure or Ctrl-C nothing appears at
      ``dst`` and an old file there is untouched, and locked meanwhile: a
      file qemu or a VM uses is never replaced); a block device is written
      in place. False (``qemu-img convert -n``) writes into an
      existing image at least as large as the source, in place, and leaves
      its tail alone: a failed copy leaves it half written (a qcow2 image is
      then flagged corrupt).

    Copy options: ``options``, a ``CopyOptions`` (its documentation says
    what each does and its default), or its fields as keywords, which are
    shorthand for it: ``sparse_threshold`` (-S), ``concurrency`` (-m),
    ``request_size``, ``out_of_order`` (-W), ``target_is_zero``, ``direct``
    (-T none / -t none), ``flush`` (False: -t unsafe), ``offload`` (-C),
    ``connections`` and ``requests_in_flight`` (NBD endpoints).
    Keywords given (not None) replace the fields of ``options``; sizes take
    ints or strings such as "64k", "4M".
      ``progress``: True shows a bar (tqdm when installed, else text on
      stderr); a callable ``(done, total)``; or an object with ``update(n)``
      (such as a tqdm bar; one whose ``total`` is None learns the copy's).

    New images: ``create_options``, a ``Qcow2Options`` for
    ``dst_format="qcow2"``, or its fields as keywords, shorthand as above:
    ``cluster_size`` [64k], ``compat`` "1.1" (v3) or "0.10" (v2),
    ``preallocation`` "off" or "metadata", ``compress`` (per cluster, in
    the worker threads; -c), ``compression_type`` "zlib" or "zstd",
    ``compression_level`` (None: as small as qemu's, faster), ``backing_file`` (stored as given, relative
    to dst's directory) and ``backing_format``: a qcow2 overlay in which what
    the source's own backing chain holds is left unwritten (-B/-F). Host
    clusters are allocated in guest order whatever the concurrency.

    Checksums: ``checksum``: True (sha256) or an algorithm's name as
    ``imgcopy.checksum()`` takes it ("sha256", "blake2b", "md5", ...)
    computes the source's blkhash from the data the copy reads (zero
    ranges for free; nothing is read twice, but ranges an overlay
    destination leaves to its backing file are read for it, and
    ``offload`` is off) into ``CopyResult.checksum``: the value
    ``imgcopy.checksum(src)`` and blksum give. ``checksum_block_size``:
    blkhash's block [64k]. ``verify``: after the copy (the destination
    is committed by then), read the destination back through its format
    and extent map, put its checksum (over the source's size) in
    ``CopyResult.dst_checksum`` and raise ``ChecksumMismatch`` (an
    ``imgcopy.Error``) when the two differ; implies ``checksum=True``
    unless an algorithm is given. A Ctrl-C that comes after the copy was
    committed returns the result without ``dst_checksum``.

    Returns a CopyResult: bytes read, written, zeroed and skipped (written
    + zeroed + skipped is the source's size), requests of each kind, source
    extents, elapsed seconds, the source's extent-cache counters and the
    ``CopyOptions`` the copy ran with, as the C core decided them from the
    ones asked for and the destination (``target_is_zero`` None decided, a
    server's preferred block size raising ``sparse_threshold`` and
    ``request_size``, a qcow2 cluster size rounding them).

    Raises: ``ImageFormatError`` for a corrupt or unsupported source or
    destination image (its message says which option would help);
    ``ValueError`` / ``TypeError`` for invalid options, checked before the
    destination is touched; ``OSError`` (with ``errno`` and ``filename``) for
    I/O errors, e.g. ENOSPC; ``KeyboardInterrupt`` or the progress
    callback's exception, which cancel the copy.

    An unknown keyword raises TypeError naming the nearest valid one."""
    src_member = source_member("convert", member, src_member)
    _check_format(src_format)
    algorithm = _checksum_algorithm(checksum, verify)
    block_size = parse_size(checksum_block_size, "checksum_block_size")
    if algorithm is not None:
        if block_size == 0:  # the C core's "default"
            raise ValueError("checksum block size must be even, from 2 bytes, not 0")
        _core.checksum_check(algorithm, block_size)
    if dst_format is not None and dst_format not in DEST_FORMATS:
        raise ValueError(f"unknown destination format {dst_format!r} "
                         f"(known: {', '.join(DEST_FORMATS)})")
    options = with_keywords(options if options is not None else CopyOptions(),
                            sparse_threshold=sparse_threshold,
                            concurrency=concurrency, request_size=request_size,
                            out_of_order=out_of_order, target_is_zero=target_is_zero,
                            direct=direct, flush=flush, offload=offload,
                            connections=connections, requests_in_flight=requests_in_flight)
    layout = dict(cluster_size=cluster_size, compat=compat, preallocation=preallocation,
                  compress=compress, compression_type=compression_type,
                  compression_level=compression_level, backing_file=backing_file,
                  backing_format=backing_format)
    if any(v is not None for v in layout.values()):
        create_options = with_keywords(
            create_options if create_options is not None else Qcow2Options(), **layout)
    dst_name = os.fsdecode(os.fspath(dst))
    is_null = dst_format == "null" or dst_name == NULL_TARGET
    if is_null:
        dst_format = "null"
        if verify:
            raise ValueError("verify=True reads the destination back: the null target "
                             "has nothing to read")
    elif dst_format is None:
        dst_format = "raw" if create else _existing_format(dst_name)
    if create_options is not None and create_options.format != dst_format:
        names = ", ".join(f.name for f in fields(create_options))
        raise ValueError(f"{type(create_options).__name__} ({names}) need "
                         f"dst_format={create_options.format!r}")
    if getattr(create_options, "backing_file", None) is not None and not create:
        raise ValueError("backing_file makes a new image: it needs create=True")
    if create_options is not None and not create:
        _check_existing_layout(create_options)

    try:
        source = Image(src, src_format, direct=options.source_direct, force=force,
                       force_share=force_share, member=src_member,
                       external_files=src_external_files, _source=True)
    except ImageFormatError as exc:
        raise exc.renamed({"format": "src_format", "member": "src_member",
                           "external_files": "src_external_files"})
    source_size = source.size
    core: Optional[_core.Image] = None
    report: Optional[CopyReport] = None
    cache: Optional[CacheStats] = None
    t0 = time.monotonic()
    try:
        with source:
            if not is_null:
                _check_not_read(source, dst_name)
            if is_null:
                core, _ = _core.create(NULL_TARGET, "null", source.size)
            elif create:
                laid_out = create_options.create_keywords() if create_options else {}
                core, _ = _core.create(dst, dst_format, source.size,
                                       direct=options.destination_direct,
                                       writeback=options.flush, atomic=True, **laid_out)
            else:
                core = _core.Image(dst, dst_format, writable=True,
                                   direct=options.destination_direct)
                dst_size = core.size
                if dst_size < source.size:
                    core.close()
                    raise ValueError(f"{dst_name}: the destination ({dst_size} bytes) is smaller "
                                     f"than the source ({source.size} bytes)")
            # The copy's outcome decides what convert() reports: until the
            # destination is committed (finish: a new file renamed into place,
            # a qcow2 image marked complete) an error, the progress callback or
            # Ctrl-C cancels it and convert() raises; once it is committed,
            # convert() returns its result, and a Ctrl-C arriving in between is
            # too late to change anything.
            bar = None
            t0 = time.monotonic()
            try:
                bar = make_progress(progress, source.size, os.path.basename(source.filename))
                report = _core.copy(source._img, core, progress=_progress_adapter(bar),
                                    checksum=algorithm, checksum_block_size=block_size,
                                    **options.engine_options())
                options = options.ran_with(report["options"])
                cache = source.cache_stats()
                core.finish(sync=options.flush)
            except KeyboardInterrupt:
                if not core.finished:
                    close_progress(bar, progress)
                    raise
            except BaseException:
                close_progress(bar, progress)  # a bar made here ends its line
                raise
            finally:
                core.close()
            if report is None or cache is None:  # cannot be: the copy ran to its end
                raise RuntimeError("the copy ended without its report")
            result = _completed(report, time.monotonic() - t0, cache, options)
    except KeyboardInterrupt:
        # a Ctrl-C after the destination was committed (closing the images,
        # returning) is too late: the copy happened, and convert() says so
        if core is None or not core.finished or report is None or cache is None:
            raise
        _uninterrupted(core.close)
        _uninterrupted(source.close)
        return _completed(report, time.monotonic() - t0, cache, options)
    if verify:
        if algorithm is None or result.checksum is None:  # cannot be: verify hashes
            raise RuntimeError("verify=True: the copy made no checksum")
        result.dst_checksum = _verify(dst, dst_format, result.checksum, algorithm, block_size,
                                      source_size)
    return result


def _check_existing_layout(create_options: CreateOptions) -> None:
    """An existing destination keeps its layout: options that would change
    it (compression included: writing compressed clusters into an image
    whose clusters may be allocated is not supported) are refused rather
    than ignored."""
    defaults = type(create_options)()
    changed = [f.name for f in fields(create_options)
               if getattr(create_options, f.name) != getattr(defaults, f.name)]
    if changed:
        raise ValueError(f"{', '.join(changed)} lay{'s' if len(changed) == 1 else ''} out a "
                         f"new image: with an existing destination (create=False, -n) "
                         f"the image keeps its own layout")


def _checksum_algorithm(checksum: Union[bool, str, None], verify: bool) -> Optional[str]:
    """convert()'s checksum= and verify= as an algorithm's name, or None."""
    if checksum is None or checksum is False:
        return DEFAULT_ALGORITHM if verify else None
    if checksum is True:
        return DEFAULT_ALGORITHM
    if not isinstance(checksum, str):
        raise TypeError("checksum must be a bool or an algorithm's name, not "
                        f"{type(checksum).__name__}")
    return checksum


def _verify(dst: PathArg, dst_format: str, expected: str, algorithm: str, block_size: int,
            size: int) -> str:
    """The committed destination's checksum over the source's size, read
    back through its format; ChecksumMismatch unless it is `expected`."""
    with Image(dst, dst_format) as img:
        length = size if 0 < size < img.size else None
        got = image_checksum(img, algorithm, block_size, length=length)
    if got != expected:
        raise ChecksumMismatch(os.fsdecode(os.fspath(dst)), algorithm, expected, got)
    return got


def _uninterrupted(step: Callable[[], Any]) -> None:
    """Run an idempotent step (closing an image) to its end, whatever
    Ctrl-C comes meanwhile."""
    while True:
        try:
            step()
            return
        except KeyboardInterrupt:
            continue


def _completed(report: CopyReport, elapsed: float, cache: CacheStats,
               options: CopyOptions) -> CopyResult:
    """The result of a committed copy: a Ctrl-C while it is built changes
    nothing (the destination is complete)."""
    while True:
        try:
            return CopyResult(
                bytes_read=report["bytes_read"], bytes_written=report["bytes_written"],
                bytes_zeroed=report["bytes_zeroed"], bytes_skipped=report["bytes_skipped"],
                read_requests=report["read_requests"], write_requests=report["write_requests"],
                zero_requests=report["zero_requests"], extents=report["extents"],
                elapsed=elapsed, cache_hits=cache["hits"], cache_misses=cache["misses"],
                lseek_calls=cache["lseek_calls"],
                bytes_already_zero=report["bytes_already_zero"], options=options,
                checksum=report.get("checksum"))
        except KeyboardInterrupt:
            continue
