"""Copying an image to another: the Python face of the C copy engine."""
from __future__ import annotations

import os

from ._defaults import JOURNAL_INTERVAL
from .checksum import DEFAULT_BLOCK_SIZE
from ._keywords import suggest_keywords
from ._sharing import SHARING
from .image import source_member
from .job import DEST_FORMATS, NULL_TARGET, CopyResult, CopySteps  # noqa: F401 (convert's names)
from .options import CopyOptions, CreateOptions

TYPE_CHECKING = False  # typing's import is not paid to start a command
if TYPE_CHECKING:
    from typing import Any, Optional, Tuple, Union

    from .image import PathArg
    from .progress import Progress
    from .sizes import Size


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
            retries: Optional[int] = None, retry_delay: Optional[float] = None,
            progress: Progress = None, cluster_size: Optional[Size] = None,
            compat: Optional[str] = None, preallocation: Optional[str] = None,
            compress: Optional[bool] = None, compression_type: Optional[str] = None,
            compression_level: Optional[int] = None,
            backing_file: Optional[Union[str, "os.PathLike[str]"]] = None,
            backing_format: Optional[str] = None,
            checksum: Union[bool, str, None] = None,
            checksum_block_size: Size = DEFAULT_BLOCK_SIZE,
            verify: bool = False, changed: Any = None,
            compare_block_size: Optional[Size] = None, offset: Optional[int] = None,
            length: Optional[int] = None, bitmap: Optional[str] = None,
            journal: Optional[PathArg] = None,
            journal_interval: Union[float, str] = JOURNAL_INTERVAL,
            bitmaps: bool = False, skip_broken_bitmaps: bool = False) -> CopyResult:
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
    ``connections`` and ``requests_in_flight`` (NBD endpoints), ``retries``
    and ``retry_delay`` (NBD connections made again when they drop).
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

    Warm copies (the changes since an earlier copy, into the destination it
    made: ``create=False``): ``changed``: copy only these ranges of the
    source, each as a copy does (read; zero runs judged at the sparse
    threshold; written, zeroed or skipped), every other destination byte
    left as it is: ``(offset, length)`` pairs in any order, overlapping or
    not (VMware CBT's changed areas), or an ``ExtentMap`` (of
    ``dirty_map()``, its dirty extents; of ``map()``, all of it). A range
    past the source's end is a ``ValueError``. ``bitmap``: NAME, the
    changed ranges are the source's dirty bitmap NAME (a qcow2 persistent
    bitmap; an NBD export's ``qemu:dirty-bitmap:NAME``: qemu-nbd -B NAME),
    refused as qemu refuses it (missing: the message lists those there
    are; in use; corrupt). ``changed="compare"``: no
    change tracking at all: the destination is read too and only the
    blocks of ``compare_block_size`` [64k] that differ are written.
    ``CopyResult.bytes_changed`` says what was to be copied,
    ``bytes_compared`` and ``bytes_equal`` what compare mode read and
    left alone. A new qcow2 overlay (``backing_file`` the previous copy)
    with ``changed`` holds only the changed clusters: ovirt-imageio's
    incremental backup. ``checksum``/``verify`` hash the whole source and
    destination apart from the copy.

    Range shards: ``offset``, ``length``: copy only [offset, offset+length)
    of the source into an existing destination (``create=False``), every
    other byte untouched, flushed on its own; shards in other processes or
    hosts into the same raw file, block device or NBD export make one disk
    (a qcow2 destination is refused: one writer allocates its clusters).
    With ``checksum``, a shard of whole blkhash blocks returns their
    digests (``CopyResult.block_digests``): ``combine_checksums()`` makes
    the disk's checksum from every shard's; ``verify`` reads the range back.

    Resumable copies: ``journal``: a file path; the copy records in it,
    durably and cheaply, what is done: every ``journal_interval`` [5.0
    seconds; or a size such as "256M": once that much more is done, and
    every 5 s at the latest] the destination is made durable, then the
    ranges finished before that are recorded, with their blkhash block
    digests when a whole copy has a ``checksum``.  Run the same copy again
    after any failure (an exception, Ctrl-C, SIGKILL, a power cut) and it
    copies only what the journal does not hold, then finishes as a normal
    copy and removes the journal; ``CopyResult.bytes_resumed`` says how
    much an earlier run had done, and the checksum is the whole copy's,
    made from the journal's digests and this run's reads.  The journal
    names the source (its file, size, modification time; or URI), the
    destination and the options that change the output: another copy's
    journal is refused (``ValueError`` naming what differs), a damaged one
    too (``ImageFormatError``); a torn last record, as a crash leaves it,
    is dropped.  A new destination is written to
    ``.<dst name>.<journal name>.partial`` beside ``dst``, kept after a
    failure and renamed to ``dst`` when complete.  Not with a shard,
    ``changed="compare"`` or the null target.

    Persistent bitmaps (``qemu-img convert --bitmaps``): ``bitmaps``: True
    stores the source's persistent bitmaps in the destination, which must
    be a new qcow2 image (``dst_format="qcow2"``, ``create=True``, compat
    1.1; else ``ValueError``) of a qcow2 v3 source (another source:
    ``ValueError``, "Source lacks bitmap support"): each with its name,
    granularity and enabled state (qemu's auto flag) and its dirty bits as
    the source holds them, copied after the data, before the destination
    is finished (a resumed ``journal`` copy stores them when it finishes).
    A bitmap in use in the source (inconsistent: a program had the image
    open for writing and did not close it) is refused
    (``ImageFormatError``, before the destination is made) unless
    ``skip_broken_bitmaps``: True skips it with a warning.
    ``CopyResult.bitmaps`` and ``bitmaps_skipped`` name them.

    Returns a CopyResult: bytes read, written, zeroed and skipped (written
    + zeroed + skipped is the source's size, less ``bytes_resumed``), requests of each kind, source
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
    sharing = SHARING.get()
    steps = CopySteps(
        src, dst, src_format=src_format, src_member=source_member("convert", member, src_member),
        src_external_files=src_external_files, dst_format=dst_format, create=create,
        force=force, force_share=force_share, options=options,
        option_keywords=dict(sparse_threshold=sparse_threshold, concurrency=concurrency,
                             request_size=request_size, out_of_order=out_of_order,
                             target_is_zero=target_is_zero, direct=direct, flush=flush,
                             offload=offload, connections=connections,
                             requests_in_flight=requests_in_flight, retries=retries,
                             retry_delay=retry_delay),
        create_options=create_options,
        layout_keywords=dict(cluster_size=cluster_size, compat=compat,
                             preallocation=preallocation, compress=compress,
                             compression_type=compression_type,
                             compression_level=compression_level,
                             backing_file=backing_file, backing_format=backing_format),
        progress=progress, checksum=checksum, checksum_block_size=checksum_block_size,
        verify=verify, changed=changed, compare_block_size=compare_block_size,
        offset=offset, length=length, pool=sharing.pool, buffer_limit=sharing.buffer_limit,
        bitmap=bitmap, journal=journal, journal_interval=journal_interval, bitmaps=bitmaps,
        skip_broken_bitmaps=skip_broken_bitmaps)
    return steps.execute()
