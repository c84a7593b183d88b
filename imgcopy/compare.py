"""Comparing two images as ``qemu-img compare`` does, in parallel, reading
only what the two extent maps say may differ."""
from __future__ import annotations

import time

from . import _core
from ._keywords import suggest_keywords
from ._records import Record
from .errors import ImageFormatError
from .image import Image

TYPE_CHECKING = False  # typing's import is not paid to start a command
if TYPE_CHECKING:
    from typing import Any, Callable, List, Optional, Tuple

    from .image import PathArg

IDENTICAL = "Images are identical."
SIZE_WARNING = "Warning: Image size mismatch!"
STRICT_SIZE = "Strict mode: Image size mismatch!"


class CompareResult(Record):
    """The outcome of :func:`compare`; true when the images are identical.

    ``reason`` is ``"identical"``, ``"content"`` (a byte differs: ``offset``
    is the start of the first differing 512-byte sector as qemu-img counts
    them), ``"size"`` (strict mode: the sizes differ) or ``"status"``
    (strict mode: the allocation differs at ``offset``).  ``message`` is the
    last line qemu-img compare prints; ``lines`` everything it prints to
    stdout (``Warning: Image size mismatch!`` first when the sizes differ
    and the common part matched).  ``progress`` (compare_images(...,
    progress=True)): the reports qemu-img compare -p prints after its first
    "0.00", as (percent, after the size warning); not in the repr."""

    _fields = __match_args__ = ("identical", "reason", "offset", "message", "size_mismatch",
                                "size_a", "size_b", "warned", "bytes_read", "elapsed",
                                "progress")
    _hidden = ("progress",)

    def __init__(self, identical: bool, reason: str, offset: Optional[int], message: str,
                 size_mismatch: bool, size_a: int, size_b: int, warned: bool = False,
                 bytes_read: int = 0, elapsed: float = 0.0,
                 progress: Optional[List[Tuple[float, bool]]] = None) -> None:
        self.identical = identical
        self.reason = reason
        self.offset = offset
        self.message = message
        self.size_mismatch = size_mismatch
        self.size_a = size_a
        self.size_b = size_b
        self.warned = warned
        self.bytes_read = bytes_read
        self.elapsed = elapsed
        self.progress: List[Tuple[float, bool]] = [] if progress is None else progress

    def __bool__(self) -> bool:
        return self.identical

    @property
    def lines(self) -> List[str]:
        return ([SIZE_WARNING] if self.warned else []) + [self.message]


def _message(reason: str, offset: int) -> str:
    if reason == "identical":
        return IDENTICAL
    if reason == "content":
        return f"Content mismatch at offset {offset}!"
    if reason == "size":
        return STRICT_SIZE
    return f"Strict mode: Offset {offset} block status mismatch!"


def compare_images(a: Image, b: Image, *, strict: bool = False, concurrency: int = 4,
                   progress: bool = False,
                   on_progress: Optional[Callable[[float, bool], Any]] = None
                   ) -> CompareResult:
    """:func:`compare` on images already open.  ``progress``: collect the
    reports qemu-img compare -p prints (``CompareResult.progress``);
    ``on_progress(percent, after_size_warning)`` is called with each as it
    becomes final, in order, from the calling thread."""
    if not 1 <= concurrency <= 64:
        raise ValueError(f"concurrency must be 1 to 64, not {concurrency}")
    start = time.monotonic()
    r = _core.compare(a._img, b._img, strict=strict, concurrency=concurrency,
                      progress=progress or on_progress is not None, on_progress=on_progress)
    reason = r["outcome"]
    offset = r["offset"] if reason in ("content", "status") else None
    return CompareResult(identical=r["identical"], reason=reason, offset=offset,
                         message=_message(reason, r["offset"]),
                         size_mismatch=r["size_mismatch"], size_a=r["size_a"],
                         size_b=r["size_b"], warned=r["warned"],
                         bytes_read=r["bytes_read_a"] + r["bytes_read_b"],
                         elapsed=time.monotonic() - start, progress=r["progress"])


@suggest_keywords
def compare(a: PathArg, b: PathArg, *, a_format: Optional[str] = None,
            b_format: Optional[str] = None, a_member: Optional[str] = None,
            b_member: Optional[str] = None, strict: bool = False, force_share: bool = False,
            external_files: bool = False, concurrency: int = 4,
            on_progress: Optional[Callable[[float, bool], Any]] = None) -> CompareResult:
    """Compare the guest content of two images (files or NBD URIs, any
    format imgcopy reads, backing chains followed) as ``qemu-img compare``
    does: ``a_format`` and ``b_format`` are its ``-f`` and ``-F`` (None:
    probe), ``strict`` its ``-s`` (the sizes and the allocation must match
    too), ``force_share`` its ``-U``.  Ranges both images read as zeros are
    never read; a range one image holds and the other reads as zeros is
    read from the one side only.  A size difference is allowed when the
    larger image's tail reads as zeros (not in strict mode).  ``a_member``
    and ``b_member``: that image is this member of the tar archive at ``a``
    (``b``), an OVA's disk, read in place; ``external_files``: a vmdk
    descriptor may name extent files outside its directory (as for
    ``open()``).

    ``on_progress(percent, after_size_warning)`` gets qemu-img compare -p's
    reports as they become final.

    Returns a :class:`CompareResult`, true when identical; raises OSError
    or ImageFormatError when an image cannot be opened or read (an error
    while comparing carries ``compare_step`` 3 (block status) or 4 (read),
    ``compare_image`` 0 or 1 and ``compare_offset``)."""
    with _open(a, a_format, a_member, "a", force_share, external_files) as ia:
        with _open(b, b_format, b_member, "b", force_share, external_files) as ib:
            return compare_images(ia, ib, strict=strict, concurrency=concurrency,
                                  on_progress=on_progress)


def _open(path: PathArg, fmt: Optional[str], member: Optional[str], side: str,
          force_share: bool, external_files: bool) -> Image:
    """Image ``a`` or ``b``; an error's remedies name compare()'s keywords
    (``a_member``, not open()'s ``member``)."""
    try:
        return Image(path, fmt, force_share=force_share, member=member,
                     external_files=external_files)
    except ImageFormatError as exc:
        raise exc.renamed({"format": f"{side}_format", "member": f"{side}_member"})
