"""A copy as named steps, built from its arguments without running (see
CopySteps): what convert() and plan() are made of."""
from __future__ import annotations

import os
import stat
import time
from dataclasses import asdict, dataclass, field, fields

from . import _core
from ._defaults import DEST_FORMATS, JOURNAL_INTERVAL
from .changes import compare_block, pack_ranges
from .checksum import DEFAULT_ALGORITHM, DEFAULT_BLOCK_SIZE, ChecksumMismatch, image_checksum
from .errors import ImageFormatError, Remedy
from .image import Image, _check_format
from .options import CopyOptions, CreateOptions, Qcow2Options, with_keywords
from .progress import _progress_adapter, close_progress, make_progress
from .sizes import parse_size

TYPE_CHECKING = False  # typing's import is not paid to start a command
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional, Tuple, Union

    from ._core import CacheStats, CopyReport
    from .image import PathArg
    from .progress import Progress
    from .sizes import Size

NULL_TARGET = "null:"
# how a partial qcow2 is opened again (its metadata as the last checkpoint left it)
_RESUME: Dict[str, Any] = {"resume": True}


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
    # what was to be copied: the source's size, or its changed ranges';
    # changed="compare": the destination bytes read and compared, and of
    # them those in blocks equal to the source's (left alone)
    bytes_changed: int = 0
    bytes_compared: int = 0
    bytes_equal: int = 0
    # a range shard (offset=, length=): its range, and with a checksum the
    # digests of its blkhash blocks, in order (combine_checksums())
    offset: Optional[int] = None
    length: Optional[int] = None
    block_digests: Optional[bytes] = field(default=None, repr=False)
    # imgcopy.distributed.convert(): the shards the disk was cut into
    shards: Optional[List[Tuple[int, int]]] = None
    # journal=: the bytes an earlier run had copied and recorded, not
    # copied again (the counters above are this run's)
    bytes_resumed: int = 0
    options: CopyOptions = field(default_factory=CopyOptions, repr=False)
    # checksum=: the source's blkhash (hex), from what the copy read;
    # verify=True: the destination's, read back after the copy
    checksum: Optional[str] = None
    dst_checksum: Optional[str] = None
    # bitmaps=True: the names of the source's persistent bitmaps stored in
    # the destination, and of those skipped as inconsistent (in use) with
    # skip_broken_bitmaps=True
    bitmaps: Optional[List[str]] = None
    bitmaps_skipped: Optional[List[str]] = None

    def to_dict(self) -> dict:
        d = asdict(self)
        del d["options"]
        d.pop("block_digests", None)  # bytes: no JSON
        for name in ("checksum", "dst_checksum", "offset", "length", "shards",  # when asked for
                     "bitmaps", "bitmaps_skipped"):
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


class CopySteps:
    """One copy, as steps: built from convert()'s arguments without running
    (nothing is checked, opened or touched until a step runs), then
    ``execute()``: ``validate`` (options, formats, the checksum algorithm;
    before anything is opened), ``open_source``, ``open_destination``
    (created, or the existing one opened), ``run`` (the C engine's copy,
    with progress), ``copy_bitmaps`` (bitmaps=True: the source's persistent
    bitmaps added to the destination), ``commit`` (the destination
    finished: a new file renamed into place), ``verify`` (read back, when
    asked).  Until the commit an
    error, the progress callback or Ctrl-C cancels the copy and raises; once
    it is committed the steps return their result, a Ctrl-C arriving in
    between being too late to change anything.

    ``request_log``: ``run`` records every request the engine makes
    (``report["requests"]``), the copy of plan(): into the null target,
    with ``offload`` (the kernel would copy whole extents) and ``flush``
    off, as a plan's options say."""

    def __init__(self, src: PathArg, dst: PathArg, *, src_format: Optional[str] = None,
                 src_member: Optional[str] = None, src_external_files: bool = False,
                 dst_format: Optional[str] = None, create: bool = True, force: bool = False,
                 force_share: bool = False, options: Optional[CopyOptions] = None,
                 option_keywords: Optional[Dict[str, Any]] = None,
                 create_options: Optional[CreateOptions] = None,
                 layout_keywords: Optional[Dict[str, Any]] = None,
                 progress: Progress = None, checksum: Union[bool, str, None] = None,
                 checksum_block_size: Size = DEFAULT_BLOCK_SIZE,
                 verify: bool = False, request_log: bool = False,
                 changed: Any = None, compare_block_size: Optional[Size] = None,
                 offset: Optional[int] = None, length: Optional[int] = None,
                 pool: Any = None, buffer_limit: int = 0,
                 bitmap: Optional[str] = None, journal: Optional[PathArg] = None,
                 journal_interval: Any = JOURNAL_INTERVAL, bitmaps: bool = False,
                 skip_broken_bitmaps: bool = False) -> None:
        self.src, self.dst = src, dst
        self.src_format, self.src_member = src_format, src_member
        self.src_external_files = src_external_files
        self.dst_format, self.create = dst_format, create
        self.force, self.force_share = force, force_share
        self.options: CopyOptions = options if options is not None else CopyOptions()
        self._option_keywords = dict(option_keywords or {})
        self.create_options = create_options
        self._layout_keywords = dict(layout_keywords or {})
        self.progress = progress
        self._checksum, self._checksum_block_size = checksum, checksum_block_size
        self.verify_after = verify
        self.request_log = request_log
        self._changed, self._compare_block_size = changed, compare_block_size
        self.offset, self.length = offset, length
        # a fleet's: the shared pool, and this copy's share of its memory
        self.pool, self.buffer_limit = pool, buffer_limit
        self.bitmap = bitmap
        self.bitmaps, self.skip_broken_bitmaps = bitmaps, skip_broken_bitmaps
        # bitmaps=True: the source's bitmaps to store, and those skipped (open_source)
        self.bitmap_names: List[str] = []
        self.bitmaps_skipped: List[str] = []
        self._journal_arg, self._journal_interval = journal, journal_interval
        self.journal_path: Optional[str] = None
        self.journal: Optional[_core.Journal] = None  # open_destination
        self.journal_every = (0, 0)  # checkpoints: (milliseconds, bytes)
        self.partial: Optional[str] = None  # a new destination's file until the commit
        self.resumed_bytes = 0
        self.changed: Optional[bytes] = None  # packed ranges (validate)
        self.compare_block = 0
        # what the steps find and make
        self.algorithm: Optional[str] = None
        self.block_size = 0
        self.dst_name = ""
        self.is_null = False
        self.source: Optional[Image] = None
        self.source_size = 0
        self.core: Optional[_core.Image] = None
        self.report: Optional[CopyReport] = None
        self.cache: Optional[CacheStats] = None
        self.t0 = time.monotonic()

    def execute(self) -> CopyResult:
        """Every step, in order: what convert() does."""
        self.validate()
        source = self.open_source()
        try:
            with source:
                self.open_destination()
                result = self.copy()
        except KeyboardInterrupt:
            # a Ctrl-C after the destination was committed (closing the images,
            # returning) is too late: the copy happened, and the result says so
            core, report, cache = self.core, self.report, self.cache
            if core is None or not core.finished or report is None or cache is None:
                raise
            _uninterrupted(core.close)
            _uninterrupted(source.close)
            return self._with_bitmaps(_completed(report, time.monotonic() - self.t0, cache,
                                                 self.options))
        return self.verify(result)

    def validate(self) -> None:
        """The options, the formats and the checksum algorithm, checked
        before anything is opened (an existing destination's format is
        probed when none was named)."""
        _check_format(self.src_format)
        self.algorithm = _checksum_algorithm(self._checksum, self.verify_after)
        self.block_size = parse_size(self._checksum_block_size, "checksum_block_size")
        if self.algorithm is not None:
            if self.block_size == 0:  # the C core's "default"
                raise ValueError("checksum block size must be even, from 2 bytes, not 0")
            _core.checksum_check(self.algorithm, self.block_size)
        self.compare_block = compare_block(self._changed, self._compare_block_size)
        if self.bitmap is not None:
            if not isinstance(self.bitmap, str):
                raise TypeError(f"bitmap must be a str, not {type(self.bitmap).__name__}")
            if self._changed is not None or self.offset is not None:
                raise ValueError("bitmap says what changed: not with changed= or a shard")
        if self.offset is not None or self.length is not None:
            self._shard_range()
        if self._changed is not None and not self.compare_block:
            self.changed, _ = pack_ranges(self._changed)
        dst_format = self.dst_format
        if dst_format is not None and dst_format not in DEST_FORMATS:
            raise ValueError(f"unknown destination format {dst_format!r} "
                             f"(known: {', '.join(DEST_FORMATS)})")
        self.options = with_keywords(self.options, **self._option_keywords)
        create_options = self.create_options
        if any(v is not None for v in self._layout_keywords.values()):
            create_options = with_keywords(
                create_options if create_options is not None else Qcow2Options(),
                **self._layout_keywords)
        self.dst_name = os.fsdecode(os.fspath(self.dst))
        self.is_null = dst_format == "null" or self.dst_name == NULL_TARGET
        if self.is_null:
            dst_format = "null"
            if self.verify_after:
                raise ValueError("verify=True reads the destination back: the null target "
                                 "has nothing to read")
        elif dst_format is None:
            dst_format = "raw" if self.create else _existing_format(self.dst_name)
        if create_options is not None and create_options.format != dst_format:
            names = ", ".join(f.name for f in fields(create_options))
            raise ValueError(f"{type(create_options).__name__} ({names}) need "
                             f"dst_format={create_options.format!r}")
        if getattr(create_options, "backing_file", None) is not None and not self.create:
            raise ValueError("backing_file makes a new image: it needs create=True")
        if create_options is not None and not self.create:
            _check_existing_layout(create_options)
        self.dst_format, self.create_options = dst_format, create_options
        if self._journal_arg is not None:
            self._validate_journal(self._journal_arg)
        self._validate_bitmaps()

    def _validate_bitmaps(self) -> None:
        """bitmaps=True (qemu-img convert --bitmaps): what cannot store the
        source's bitmaps, refused before anything opens."""
        for name in ("bitmaps", "skip_broken_bitmaps"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, not {type(getattr(self, name)).__name__}")
        if self.skip_broken_bitmaps and not self.bitmaps:
            raise ValueError("skip_broken_bitmaps=True needs bitmaps=True "
                             "(--skip-broken-bitmaps needs --bitmaps)")
        if not self.bitmaps:
            return
        if self.dst_format != "qcow2":
            raise ValueError(f"bitmaps=True stores the source's persistent bitmaps in a qcow2 "
                             f"destination, not {self.dst_format} (Format driver "
                             f"'{self.dst_format}' does not support bitmaps): dst_format='qcow2'")
        if not self.create:
            raise ValueError("bitmaps=True stores the source's bitmaps in a new qcow2 image "
                             "(create=True): not into an existing one (create=False, -n)")
        if getattr(self.create_options, "compat", None) in ("0.10", "v2"):
            raise ValueError("bitmaps=True: Cannot store dirty bitmaps in qcow2 v2 files: "
                             "compat='0.10' holds no bitmaps (compat='1.1' does)")
        if self.request_log:
            raise ValueError("a plan stores no bitmaps")

    def _validate_journal(self, journal: "PathArg") -> None:
        """journal=: what a journal cannot record, refused before anything opens.
        (imgcopy.journal, and hashlib with it, is imported by journalled
        copies alone: a copy without one starts without them.)"""
        from .journal import parse_interval

        self.journal_path = os.fsdecode(os.fspath(journal))
        self.journal_every = parse_interval(self._journal_interval)
        if self.offset is not None:
            raise ValueError("a shard is copied again whole: journal= is for whole copies, "
                             "not with offset/length")
        if self.compare_block:
            raise ValueError("changed='compare' resumes by comparing again: no journal needed")
        if self.is_null:
            raise ValueError("a journal records what reached a destination: not the null "
                             "target")
        if self.request_log:
            raise ValueError("a plan records no journal")

    def _shard_range(self) -> None:
        """offset=/length=: a range shard, copied as one changed range."""
        if self._changed is not None:
            raise ValueError("offset/length (a shard) and changed do not go together")
        if self.create:
            raise ValueError("a shard writes into an existing destination (create=False): "
                             "make it first, its size the source's")
        if self.dst_format == "qcow2":
            raise ValueError("a qcow2 destination takes no shards: its clusters are allocated "
                             "by one writer; copy it whole")
        offset = 0 if self.offset is None else self.offset
        if self.length is None:
            raise ValueError("a shard needs its length")
        if offset < 0 or self.length <= 0:
            raise ValueError(f"shard {offset}+{self.length}: offset from 0, length above 0")
        self.offset = offset
        self._changed = [(offset, self.length)]

    def open_source(self) -> Image:
        """The source, read as a copy reads it (its errors name src_format,
        src_member, src_external_files)."""
        try:
            self.source = Image(self.src, self.src_format, direct=self.options.source_direct,
                                force=self.force, force_share=self.force_share,
                                member=self.src_member,
                                external_files=self.src_external_files, _source=True)
        except ImageFormatError as exc:
            raise exc.renamed({"format": "src_format", "member": "src_member",
                               "external_files": "src_external_files"})
        self.source_size = self.source.size
        if self.bitmaps:
            self._source_bitmaps(self.source)
        if self.bitmap is not None:
            # what changed: the dirty ranges of the source's own bitmap
            # (refused as qemu refuses it: missing, in use, corrupt)
            self.changed, _ = pack_ranges(self.source.dirty_map(self.bitmap))
        return self.source

    def _source_bitmaps(self, source: Image) -> None:
        """bitmaps=True: the source's bitmaps to store, checked before the
        destination is made, as qemu-img convert checks them: a source that
        keeps none is refused, an inconsistent (in-use) bitmap too, unless
        skip_broken_bitmaps skips it with a warning."""
        if not source._img.describe()["stores_bitmaps"]:
            raise ValueError(f"{source.filename}: Source lacks bitmap support: a {source.format} "
                             "image keeps no persistent bitmaps (bitmaps=True copies a qcow2 "
                             "v3 source's)")
        for b in source.bitmaps():
            if b.consistent:
                self.bitmap_names.append(b.name)
            elif self.skip_broken_bitmaps:
                import warnings

                warnings.warn(f"{source.filename}: Skipping inconsistent bitmap '{b.name}'",
                              stacklevel=2)
                self.bitmaps_skipped.append(b.name)
            else:
                raise ImageFormatError(
                    f"Cannot copy inconsistent bitmap '{b.name}' (a program had the image "
                    "open for writing and did not close it, so its bits may be stale): "
                    "skip_broken_bitmaps=True (--skip-broken-bitmaps) skips it, 'qemu-img "
                    "bitmap --remove' deletes it", filename=source.filename)

    def open_destination(self) -> _core.Image:
        """The destination: the null target, a new image (under a temporary
        name until the commit), or an existing one at least the source's size."""
        source = self._open_source()
        options, dst_name = self.options, self.dst_name
        if self.is_null:
            self.core = null_destination(source.size)
            return self.core
        _check_not_read(source, dst_name)
        if self.journal_path is not None:
            self.core = self._open_journalled(source)
            return self.core
        if self.create:
            create_options = self.create_options
            laid_out = create_options.create_keywords() if create_options else {}
            self.core, _ = _core.create(self.dst, self.dst_format, source.size,
                                        direct=options.destination_direct,
                                        writeback=options.flush, atomic=True, **laid_out)
            return self.core
        self.core = self._open_existing(source)
        return self.core

    def _journal_identity(self, source: Image) -> Dict[str, Any]:
        """What names this copy in its journal: the source, the destination
        and the options that change the output.  Block digests are kept for
        a whole copy's checksum only (a copy of changes hashes apart)."""
        from .journal import destination_identity, options_text, source_identity

        algorithm = self.algorithm if self.changed is None else None
        create = self.create_options.create_keywords() if self.create_options else {}
        opts = self.options
        text = options_text(src_format=source.format, dst_format=self.dst_format,
                            create=self.create, layout=create,
                            sparse_threshold=parse_size(opts.sparse_threshold,
                                                        "sparse_threshold"),
                            target_is_zero=opts.target_is_zero, changed=self.changed,
                            bitmap=self.bitmap,
                            # bitmaps change the output: a resume must not switch them
                            **({"bitmaps": True, "skip_broken_bitmaps": self.skip_broken_bitmaps}
                               if self.bitmaps else {}))
        return dict(source=source_identity(os.fsdecode(os.fspath(self.src)), source.format,
                                           source.size, self.src_member),
                    destination=destination_identity(self.dst_name, self._dst_format(),
                                                     self.create),
                    size=source.size, options=text, algorithm=algorithm,
                    block_size=(self.block_size or DEFAULT_BLOCK_SIZE) if algorithm else 1)

    def _open_journalled(self, source: Image) -> _core.Image:
        """journal=: the journal (made, or an earlier run's: refused unless
        it is this copy's), and the destination: an existing one as it is;
        a new one in its partial file, resumed when the journal recorded
        some of it."""
        journal_path = self._journal_path()
        self.journal = _core.Journal(journal_path, **self._journal_identity(source))
        try:
            if not self.create:
                return self._open_existing(source)
            if _written_in_place(self.dst_name):  # an NBD export, a block device
                options = self.options
                core, _ = _core.create(self.dst, self.dst_format, source.size,
                                       direct=options.destination_direct,
                                       writeback=options.flush)
                return core
            return self._open_partial(source)
        except BaseException:
            self.journal.close()
            raise

    def _open_partial(self, source: Image) -> _core.Image:
        from .journal import covers, partial_path, recorded_bytes

        options, journal = self.options, self._journal()
        partial = partial_path(self.dst_name, self._journal_path())
        done = journal.done if journal.resumed else b""
        if done and os.path.exists(partial):
            core = _core.Image(partial, self.dst_format, writable=True,
                               direct=options.destination_direct, **_RESUME)
            if core.size != source.size:
                core.close()
                raise ValueError(f"{partial}: the journal's partial copy has {core.size} "
                                 f"bytes, the source {source.size}: remove {self.journal_path} "
                                 "and it to copy again from the start")
            self.partial = partial
            return core
        if done and covers(done, source.size) and os.path.exists(self.dst_name):
            # an earlier run renamed the complete copy into place but did
            # not remove its journal: nothing is left but that
            return _core.Image(self.dst_name, self.dst_format, writable=True,
                               direct=options.destination_direct)
        if done:
            raise ValueError(f"{self.journal_path} records {recorded_bytes(done)} bytes copied into "
                             f"{partial}, which is gone: remove the journal to copy again "
                             "from the start")
        if os.path.lexists(partial):  # made before the journal recorded anything
            os.unlink(partial)
        create_options = self.create_options
        laid_out = create_options.create_keywords() if create_options else {}
        core, _ = _core.create(partial, self.dst_format, source.size,
                               direct=options.destination_direct, writeback=options.flush,
                               **laid_out)
        self.partial = partial
        return core

    def _open_existing(self, source: Image) -> _core.Image:
        """An existing destination, at least the source's size."""
        options = self.options
        # a shard's destination is written by the other shards too
        core = _core.Image(self.dst, self.dst_format, writable=True,
                           direct=options.destination_direct, writeback=options.flush,
                           share_write=self.offset is not None)
        if core.size < source.size:
            dst_size = core.size
            core.close()
            raise ValueError(f"{self.dst_name}: the destination ({dst_size} bytes) is smaller "
                             f"than the source ({source.size} bytes)")
        return core

    def copy(self) -> CopyResult:
        """run, then commit; the destination closed whatever happens."""
        core, source = self._open_destination(), self._open_source()
        bar = None
        self.t0 = time.monotonic()
        try:
            bar = make_progress(self.progress, source.size, os.path.basename(source.filename))
            self.run(bar)
            self.copy_bitmaps()
            self.commit()
        except KeyboardInterrupt:
            if not core.finished:
                close_progress(bar, self.progress)
                raise
        except BaseException:
            close_progress(bar, self.progress)  # a bar made here ends its line
            raise
        finally:
            core.close()
            if self.journal is not None and not self.journal.closed:
                self.journal.close()  # kept: the next run resumes
        report, cache = self.report, self.cache
        if report is None or cache is None:  # cannot be: the copy ran to its end
            raise RuntimeError("the copy ended without its report")
        return self._with_bitmaps(_completed(report, time.monotonic() - self.t0, cache,
                                             self.options))

    def _with_bitmaps(self, result: CopyResult) -> CopyResult:
        """bitmaps=True: the result names the bitmaps stored and skipped."""
        if self.bitmaps:
            result.bitmaps = list(self.bitmap_names)
            result.bitmaps_skipped = list(self.bitmaps_skipped)
        return result

    def run(self, bar: Any = None) -> None:
        """The C engine's copy, reporting to ``bar`` (a progress as convert()
        takes it); the options it ran with replace the ones asked for."""
        source, core = self._open_source(), self._open_destination()
        logged: Dict[str, Any] = {"offload": False, "flush": False} if self.request_log else {}
        # a copy of the changes reads only them: the checksum of the whole
        # source is made apart (verify); a shard's checksum is its blocks'
        shard = self.offset is not None
        in_copy = self.algorithm if self.changed is None or shard else None
        changed = self.changed
        journalled: Dict[str, Any] = {}
        if self.journal is not None:
            # what an earlier run recorded is not copied again; a whole
            # copy's checksum takes those blocks' digests from the journal
            from .journal import recorded_bytes, remaining

            done = self.journal.done
            self.resumed_bytes = recorded_bytes(done)
            changed, _ = remaining(done, source.size, self.changed)
            every_ms, every_bytes = self.journal_every
            journalled = dict(journal=self.journal, journal_interval_ms=every_ms,
                              journal_interval_bytes=every_bytes)
        self.report = _core.copy(source._img, core, progress=_progress_adapter(bar),
                                 checksum=in_copy, checksum_block_size=self.block_size,
                                 log=self.request_log, changed=changed,
                                 compare_block_size=self.compare_block,
                                 block_digests=shard and in_copy is not None,
                                 pool=self.pool, buffer_limit=self.buffer_limit,
                                 **journalled, **self.options.engine_options(**logged))
        if self.offset is not None and self.length is not None:  # a shard
            self.report["offset"], self.report["length"] = self.offset, self.length
        self.report["bytes_resumed"] = self.resumed_bytes
        self.options = self.options.ran_with(self.report["options"])
        self.cache = source.cache_stats()
        if self.algorithm is not None and in_copy is None and not shard:
            self.report["checksum"] = image_checksum(source, self.algorithm, self.block_size)

    def copy_bitmaps(self) -> None:
        """bitmaps=True: after the data, each of the source's bitmaps (its
        dirty map read now, its granularity, enabled or not) added to the
        destination, which commit() finishes with them.  A destination that
        lists one already is an earlier run's complete copy (journal=): it
        keeps its own."""
        if not self.bitmaps:
            return
        source, core = self._open_source(), self._open_destination()
        stored = {name for name, _, _ in core.bitmaps()}
        for name in self.bitmap_names:
            if name not in stored:
                core.copy_bitmap(source._img, name)

    def commit(self) -> None:
        """The destination finished (flushed unless told not to); with a
        journal, a new one's partial file renamed into place, then the
        journal removed (a Ctrl-C meanwhile waits: the copy is complete)."""
        self._open_destination().finish(sync=self.options.flush)
        if self.journal is not None:
            _uninterrupted(self._complete_journal)

    def _complete_journal(self) -> None:
        from .journal import fsync_directory

        journal = self._journal()
        if self.partial is not None and os.path.exists(self.partial):
            os.replace(self.partial, self.dst_name)
            fsync_directory(self.dst_name)
        if not journal.closed:
            journal.complete()

    def _dst_format(self) -> str:
        if self.dst_format is None:
            raise RuntimeError("the destination's format is decided in validate()")
        return self.dst_format

    def _journal(self) -> "_core.Journal":
        if self.journal is None:
            raise RuntimeError("the journal is opened with the destination")
        return self.journal

    def _journal_path(self) -> str:
        if self.journal_path is None:
            raise RuntimeError("journal= is validated before the destination opens")
        return self.journal_path

    def verify(self, result: CopyResult) -> CopyResult:
        """With verify=True, the committed destination read back: its
        checksum in ``result.dst_checksum``, ChecksumMismatch unless it is
        the source's."""
        if self.verify_after and result.offset is not None:
            result.dst_checksum = self._verify_shard(result)
        elif self.verify_after:
            if self.algorithm is None or result.checksum is None:  # cannot be: verify hashes
                raise RuntimeError("verify=True: the copy made no checksum")
            result.dst_checksum = _verify(self.dst, self.dst_format or "raw", result.checksum,
                                          self.algorithm, self.block_size, self.source_size)
        return result

    def _verify_shard(self, result: CopyResult) -> str:
        """A shard's range of the destination read back: its block digests
        must be the shard's (their hash, in hex, is returned)."""
        import hashlib

        if self.algorithm is None or result.block_digests is None or result.offset is None:
            raise RuntimeError("verify=True: the shard made no block digests")
        with Image(self.dst, self.dst_format or "raw") as img:
            sink = null_destination(img.size)
            try:
                ranges, _ = pack_ranges([(result.offset, result.length)])
                report = _core.copy(img._img, sink, checksum=self.algorithm,
                                    checksum_block_size=self.block_size, changed=ranges,
                                    block_digests=True, flush=False)
            finally:
                sink.close()
        got = report["block_digests"]
        if got != result.block_digests:
            dsize = len(hashlib.new(self.algorithm).digest())
            bad = next(k for k in range(0, len(got), dsize)
                       if got[k:k + dsize] != result.block_digests[k:k + dsize]) // dsize
            block = self.block_size or DEFAULT_BLOCK_SIZE
            raise ChecksumMismatch(self.dst_name, self.algorithm,
                                   hashlib.new(self.algorithm, result.block_digests).hexdigest(),
                                   hashlib.new(self.algorithm, got).hexdigest(),
                                   f"the shard's block at offset {result.offset + bad * block} "
                                   "differs")
        return hashlib.new(self.algorithm, got).hexdigest()

    def _open_source(self) -> Image:
        if self.source is None:
            raise RuntimeError("the copy's source is not open (open_source() first)")
        return self.source

    def _open_destination(self) -> _core.Image:
        if self.core is None:
            raise RuntimeError("the copy's destination is not open (open_destination() first)")
        return self.core


def null_destination(size: int) -> _core.Image:
    """The null target of ``size`` bytes: everything written is discarded."""
    core, _ = _core.create(NULL_TARGET, "null", size)
    return core


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


def _written_in_place(dst: str) -> bool:
    """A destination a new copy writes in place, not in a file of its own
    renamed at the end: an NBD export, a block device."""
    if "://" in dst:
        return True
    try:
        return stat.S_ISBLK(os.stat(dst).st_mode)
    except FileNotFoundError:
        return False


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
                checksum=report.get("checksum"), bytes_changed=report["bytes_changed"],
                bytes_compared=report["bytes_compared"], bytes_equal=report["bytes_equal"],
                offset=report.get("offset"), length=report.get("length"),
                block_digests=report.get("block_digests"),
                bytes_resumed=report.get("bytes_resumed", 0))
        except KeyboardInterrupt:
            continue
