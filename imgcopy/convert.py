"""Copying an image to another: the Python face of the C copy engine."""
from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Optional, Tuple, Union

from . import _core
from .image import FORMATS, Image, PathArg, _check_format
from .progress import close_progress, make_progress

# Chosen by measurement (benchmarks/bench_convert.py, README): with 2 MiB
# requests, 4 threads keep a 2-core machine's disk busy without queueing
# more than it can use.
DEFAULT_CONCURRENCY = 4
DEFAULT_REQUEST_SIZE = 2 << 20
DEFAULT_SPARSE_THRESHOLD = 4096

NULL_TARGET = "null:"
DEST_FORMATS = ("raw", "qcow2", "null")
COMPATS = {"1.1": False, "v3": False, "0.10": True, "v2": True}
PREALLOCATIONS = ("off", "metadata")

Progress = Union[Callable[[int, int], Any], Any, None]


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
    options: dict = field(default_factory=dict, repr=False)

    def to_dict(self) -> dict:
        d = asdict(self)
        del d["options"]
        return d


def _progress_adapter(progress: Progress) -> Optional[Callable[[int, int], None]]:
    """A callable (done, total), or an object with .update(n) such as tqdm;
    the result reports 100% exactly once, at the end."""
    if progress is None:
        return None
    update = getattr(progress, "update", None)
    if update is None and not callable(progress):
        raise TypeError("progress must be a callable (done, total) or have an update(n) method")
    last = [0]

    def report(done: int, total: int) -> None:
        if done == last[0] and done:
            return
        if update is not None:
            update(done - last[0])
        else:
            progress(done, total)
        last[0] = done

    def report_until_end(done: int, total: int) -> None:
        if done < total:   # the caller reports the end itself
            report(done, total)
    report_until_end.finish = report  # type: ignore[attr-defined]
    return report_until_end


def check_copy_options(sparse_threshold: int, concurrency: int, request_size: int) -> None:
    for name, value in (("sparse_threshold", sparse_threshold), ("concurrency", concurrency),
                        ("request_size", request_size)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"{name} must be an int")
    if sparse_threshold < 0 or sparse_threshold % 512 or sparse_threshold > 16 << 20:
        raise ValueError("sparse_threshold must be a multiple of 512 from 0 to 16 MiB")
    if not 1 <= concurrency <= 1024:
        raise ValueError("concurrency must be between 1 and 1024")
    if request_size < 4096 or request_size % 4096 or request_size > 1 << 30:
        raise ValueError("request_size must be a multiple of 4096 between 4 KiB and 1 GiB")


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def convert(src: PathArg, dst: PathArg, *, src_format: Optional[str] = None,
            dst_format: str = "raw", create: bool = True,
            sparse_threshold: int = DEFAULT_SPARSE_THRESHOLD,
            concurrency: int = DEFAULT_CONCURRENCY,
            request_size: int = DEFAULT_REQUEST_SIZE, out_of_order: bool = True,
            target_is_zero: Optional[bool] = None,
            direct: Union[bool, Tuple[bool, bool]] = False, flush: bool = True,
            offload: bool = False, progress: Progress = None,
            cluster_size: Optional[int] = None, compat: str = "1.1",
            preallocation: str = "off", compress: bool = False,
            backing_file: Optional[str] = None,
            backing_format: Optional[str] = None) -> CopyResult:
    """Copy ``src`` to ``dst``, moving only what matters.

    ``dst`` may be a path, a block device or ``"null:"`` (discard).
    ``create=False`` writes into an existing image at least as large as the
    source and leaves its tail alone.  ``sparse_threshold``: zero runs at
    least this long inside data become holes (0: fully allocated).
    ``target_is_zero``: None decides (True only for a file created here).
    ``direct``: O_DIRECT on both ends, or a (source, destination) pair.
    qcow2 destinations (new images only): ``cluster_size`` [64 KiB],
    ``compat`` "1.1" (v3) or "0.10" (v2), ``preallocation`` "off" or
    "metadata", ``compress`` (zlib, per cluster, in the worker threads).
    ``progress``: True shows a bar (tqdm when installed, else text on
    stderr); or a callable ``(done, total)``, or an object with ``update(n)``.
    Host clusters are allocated in guest order whatever the concurrency.
    ``backing_file`` (relative to dst's directory, as stored in the image)
    makes a qcow2 overlay: what the source's own backing chain holds is left
    unwritten, like ``qemu-img convert -B``."""
    _check_format(src_format)
    if dst_format not in DEST_FORMATS:
        raise ValueError(f"unknown destination format {dst_format!r} "
                         f"(known: {', '.join(DEST_FORMATS)})")
    check_copy_options(sparse_threshold, concurrency, request_size)

    if compat not in COMPATS:
        raise ValueError(f"compat must be one of {', '.join(COMPATS)}, not {compat!r}")
    if preallocation not in PREALLOCATIONS:
        raise ValueError(f"preallocation must be 'off' or 'metadata', not {preallocation!r}")
    qcow2_only = cluster_size is not None or compress or preallocation != "off" or \
        compat != "1.1" or backing_file is not None
    if qcow2_only and dst_format != "qcow2":
        raise ValueError("cluster_size, compat, preallocation, compress and backing_file "
                         "need dst_format='qcow2'")
    if cluster_size is not None and (not isinstance(cluster_size, int) or
                                     not 512 <= cluster_size <= 2 << 20 or
                                     cluster_size & (cluster_size - 1)):
        raise ValueError("cluster_size must be a power of two from 512 to 2 MiB")
    if compress and preallocation != "off":
        raise ValueError("compression and preallocation exclude each other")
    if backing_file is not None and not create:
        raise ValueError("backing_file makes a new image: it needs create=True")
    src_direct, dst_direct = direct if isinstance(direct, tuple) else (direct, direct)
    dst_name = os.fsdecode(os.fspath(dst))
    is_null = dst_format == "null" or dst_name == NULL_TARGET
    options = dict(sparse_threshold=sparse_threshold, concurrency=concurrency,
                   request_size=request_size, out_of_order=out_of_order, direct=direct,
                   flush=flush, offload=offload)

    with Image(src, src_format, direct=bool(src_direct)) as source:
        if not is_null and _same_file(source.filename, dst_name):
            raise ValueError(f"{dst_name}: the destination is the source")
        if is_null:
            core, fresh = _core.create(NULL_TARGET, "null", source.size)
        elif create:
            core, fresh = _core.create(dst, dst_format, source.size,
                                       direct=bool(dst_direct), writeback=flush,
                                       cluster_size=cluster_size or 0,
                                       compat_v2=COMPATS[compat],
                                       prealloc_metadata=preallocation == "metadata",
                                       compress=compress,
                                       backing_file=None if backing_file is None
                                       else os.fsdecode(backing_file),
                                       backing_format=backing_format)
        else:
            core = _core.Image(dst, dst_format, True, bool(dst_direct))
            fresh = False
            if core.size < source.size:
                core.close()
                raise ValueError(f"{dst_name}: the destination ({core.size} bytes) is smaller "
                                 f"than the source ({source.size} bytes)")
        bar = None
        try:
            bar = make_progress(progress, source.size, os.path.basename(source.filename))
            zero_target = fresh if target_is_zero is None else bool(target_is_zero)
            options["target_is_zero"] = zero_target
            report = _progress_adapter(bar)
            t0 = time.monotonic()
            counters = _core.copy(source._img, core, sparse_threshold, request_size,
                                  concurrency, out_of_order, zero_target, offload,
                                  flush and not is_null, report)
            # only a complete copy marks a new qcow2 image complete
            core.finish(flush and not is_null)
            elapsed = time.monotonic() - t0
        except BaseException:
            close_progress(bar, progress)  # a bar made here ends its line
            raise
        finally:
            core.close()
        if report is not None:
            report.finish(source.size, source.size)  # type: ignore[attr-defined]
        cache = source.cache_stats()
    return CopyResult(**counters, elapsed=elapsed, cache_hits=cache["hits"],
                      cache_misses=cache["misses"], lseek_calls=cache["lseek_calls"],
                      options=options)
