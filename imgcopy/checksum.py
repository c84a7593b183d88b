"""blkhash checksums of images (blksum, nbdcopy --blkhash), using the
extent map: holes and zero ranges are never read, data is hashed by the C
core's threads."""
from __future__ import annotations

import os

from . import _core
from ._defaults import DEFAULT_ALGORITHM, DEFAULT_BLOCK_SIZE
from .errors import Error
from ._keywords import suggest_keywords
from .image import Image
from .progress import _progress_adapter, close_progress, make_progress
from .sizes import parse_size

TYPE_CHECKING = False  # typing's import is not paid to start a command
if TYPE_CHECKING:
    from typing import Any, Optional, Tuple

    from .image import PathArg
    from .sizes import Size


class ChecksumMismatch(Error):
    """``convert(..., verify=True)``: the destination read back does not
    hash to the source's checksum.  ``source`` and ``destination`` are the
    two hex digests, ``algorithm`` the digest that made them."""

    def __init__(self, filename: str, algorithm: str, source: str, destination: str,
                 detail: str = "") -> None:
        super().__init__(f"{filename}: checksum mismatch after the copy: the source's "
                         f"{algorithm} blkhash is {source}, the destination's is {destination}"
                         + (f" ({detail})" if detail else ""))
        self.filename = filename
        self.algorithm = algorithm
        self.source = source
        self.destination = destination


def checksum_algorithms() -> Tuple[str, ...]:
    """The algorithms this machine's libcrypto provides, as hashlib names
    them (``OSError`` ENOSYS without libcrypto)."""
    return _core.checksum_algorithms()


@suggest_keywords
def checksum(path: PathArg, algorithm: str = DEFAULT_ALGORITHM,
             block_size: Size = DEFAULT_BLOCK_SIZE, *, format: Optional[str] = None,
             threads: Optional[int] = None, progress: Any = None, force_share: bool = False,
             force: bool = False, member: Optional[str] = None,
             external_files: bool = False) -> str:
    """The blkhash checksum of an image's guest content, as lowercase hex:
    the value ``blksum`` (blkhash >= 0.10) and ``nbdcopy --blkhash`` print
    for the same content, whatever the format that holds it.

    ``path``: any image ``imgcopy.open()`` reads (raw, qcow2 with its
    backing chain, the other readable formats, NBD URIs); ``format``:
    None probes. ``algorithm``: a hashlib name ("sha256", "sha1", "md5",
    "blake2b", "sha3_256", ...; ``imgcopy.checksum_algorithms()`` lists
    them) or OpenSSL's name of one. ``block_size``: blkhash's block
    (default 64 KiB; an even number of bytes; it changes the value).
    ``threads``: hashing threads (default 4; it never changes the value).
    ``progress``: as ``convert()``'s (True: a bar). ``force_share``: read
    an image another process writes (qemu-img -U); ``force``: a qcow2 image
    marked dirty or corrupt.  ``member``: the image is this member of the
    tar archive at ``path`` (an OVA's disk), read in place;
    ``external_files``: a vmdk descriptor may name extent files outside
    its directory (both as for ``open()``).

    Raises ``ValueError`` for an unknown algorithm or a bad block size,
    ``OSError`` ENOSYS without OpenSSL's libcrypto, and what opening and
    reading the image raise."""
    block = parse_size(block_size, "block_size")
    with Image(path, format, force=force, force_share=force_share, member=member,
               external_files=external_files) as img:
        return image_checksum(img, algorithm, block, threads=threads, progress=progress)


def image_checksum(img: Image, algorithm: str = DEFAULT_ALGORITHM,
                   block_size: int = DEFAULT_BLOCK_SIZE, *, threads: Optional[int] = None,
                   progress: Any = None, length: Optional[int] = None) -> str:
    """checksum() of an open image; ``length``: of its first bytes only."""
    if threads is not None and threads < 1:
        raise ValueError(f"threads must be at least 1, not {threads}")
    if block_size == 0:  # the C core's "default"
        raise ValueError("checksum block size must be even, from 2 bytes, not 0")
    if length is not None and length <= 0:
        raise ValueError("length must be positive")
    size = img.size if length is None else length
    bar = make_progress(progress, size, os.path.basename(img.filename))
    try:
        return _core.checksum(img._img, algorithm, block_size=block_size,
                              threads=threads or 0, length=length or 0,
                              progress=_progress_adapter(bar))
    except BaseException:
        close_progress(bar, progress)
        raise
