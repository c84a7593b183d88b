"""How large a new image would be: ``imgcopy.measure()``, like ``qemu-img
measure``.

The numbers are qemu 7.2's (block/qcow2.c qcow2_measure, block/raw-format.c
raw_measure), computed from the source's extent map: which target clusters
hold data is all the source contributes, so holes and zero ranges cost
nothing and no guest byte is read.  The C core computes the map and says
what each layer of the source is (Image.describe(): whether qemu sees a
layer as all data, whether the image holds persistent bitmaps, and which);
the rest is arithmetic.  The options are read as qemu-img reads them, with
its messages (measure_options.py); then come the qcow2 rules (cluster size,
compat, refcount width, preallocation mode), here."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, Optional, Sequence, Union

from .errors import ImageFormatError
from .extents import _DATA, _EXTENT, _PRESENT, _ZERO, QEMU_SECTOR
from ._keywords import suggest_keywords
from .image import Bitmap, Image, source_member
from .measure_options import (INT64_MAX, MeasureError, check_output_format, parse_image_size,
                              qcow2_option_dict, raw_option_check, size_range_error)
from .options import Qcow2Options

if TYPE_CHECKING:
    from .image import PathArg

__all__ = ["MeasureError", "MeasureResult", "Qcow2Target", "measure", "measure_image",
           "measure_size"]

_U64 = 1 << 64

# qcow2's limits (block/qcow2.h)
_MIN_CLUSTER_BITS, _MAX_CLUSTER_BITS = 9, 21
_MIN_CLUSTER_BITS_EXTL2 = 14
_MAX_L1_BYTES = 0x2000000
_L1E = 8
_DEFAULT_CLUSTER = 65536
_PREALLOC_MODES = ("off", "metadata", "falloc", "full")


# -- the qcow2 target -------------------------------------------------------

@dataclass(frozen=True)
class Qcow2Target:
    """A qcow2 layout as qcow2_measure reads it from the options."""

    cluster_size: int = _DEFAULT_CLUSTER
    version: int = 3
    refcount_bits: int = 16
    extended_l2: bool = False
    preallocation: str = "off"
    has_backing_file: bool = False
    size_option: int = 0  # -o size: what the "too large" check sees with a source

    @classmethod
    def from_options(cls, opts: Dict[str, object]) -> "Qcow2Target":
        """qcow2_measure's checks, in its order, with its messages."""
        extended_l2 = bool(opts.get("extended_l2", False))
        cs = _int_option(opts, "cluster_size", _DEFAULT_CLUSTER)
        low = cs & 0xffffffff
        bits = (low & -low).bit_length() - 1 if low else 32
        if not _MIN_CLUSTER_BITS <= bits <= _MAX_CLUSTER_BITS or 1 << bits != cs:
            raise MeasureError("Cluster size must be a power of two between 512 and 2048k")
        if extended_l2 and bits < _MIN_CLUSTER_BITS_EXTL2:
            raise MeasureError("Extended L2 entries are only supported with cluster sizes of "
                               f"at least {1 << _MIN_CLUSTER_BITS_EXTL2} bytes")
        compat = opts.get("compat")
        if compat is None or compat == "1.1":
            version = 3
        elif compat == "0.10":
            version = 2
        else:
            raise MeasureError(f"Invalid compatibility level: '{compat}'")
        rb = _int_option(opts, "refcount_bits", 16)
        if rb > 64 or rb <= 0 or rb & (rb - 1):
            raise MeasureError("Refcount width must be a power of two and may not exceed 64 "
                               "bits")
        if version < 3 and rb != 16:
            raise MeasureError("Different refcount widths than 16 bits require compatibility "
                               "level 1.1 or above (use compat=1.1 or greater)")
        prealloc = opts.get("preallocation")
        prealloc = "off" if prealloc is None else str(prealloc)
        if prealloc not in _PREALLOC_MODES:
            raise MeasureError(f"invalid parameter value: {prealloc}")
        if opts.get("encrypt.format") == "luks":
            raise MeasureError("encrypt.format=luks: encrypted qcow2 images are not supported")
        return cls(cluster_size=cs, version=version, refcount_bits=rb, extended_l2=extended_l2,
                   preallocation=prealloc, has_backing_file="backing_file" in opts,
                   size_option=_int_option(opts, "size", 0))

    def check_size(self, size: int) -> None:
        """qemu's limit on the L1 table (32 MiB) for ``size`` bytes."""
        cs = self.cluster_size
        clusters = _round_up(size, cs) // cs
        l2_tables = -(-clusters // (cs // self.l2_entry))
        if l2_tables * _L1E > _MAX_L1_BYTES:
            raise MeasureError("The image size is too large (try using a larger cluster size)")

    @property
    def l2_entry(self) -> int:
        return 16 if self.extended_l2 else 8

    def fully_allocated(self, virtual_size: int) -> int:
        """qcow2_calc_prealloc_size: every cluster and its metadata."""
        cs = self.cluster_size
        total = _round_up(virtual_size, cs)
        meta = cs  # the header
        nl2e = _round_up(total // cs, cs // self.l2_entry)
        meta += nl2e * self.l2_entry
        nl1e = _round_up(nl2e * self.l2_entry // cs, cs // _L1E)
        meta += nl1e * _L1E
        meta += refcount_metadata_size((meta + total) // cs, cs, self.refcount_bits)
        return meta + total


def _int_option(opts: Dict[str, object], name: str, default: int) -> int:
    value = opts.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int or a size string, not {type(value).__name__}")
    return value


def refcount_metadata_size(clusters: int, cluster_size: int, refcount_bits: int) -> int:
    """Refcount blocks and table for ``clusters`` clusters and for
    themselves: qemu's fixed point."""
    per_table_cluster = cluster_size // 8
    per_block = cluster_size * 8 // refcount_bits
    table = blocks = n = 0
    while True:
        last = n
        blocks = -(-(clusters + table + blocks) // per_block)
        table = -(-blocks // per_table_cluster)
        n = clusters + blocks + table
        if n == last:
            return (blocks + table) * cluster_size


def _round_up(n: int, unit: int) -> int:
    return -(-n // unit) * unit


# -- the result ---------------------------------------------------------------

def _int64(value: int) -> int:
    value %= _U64
    return value - _U64 if value > INT64_MAX else value


@dataclass(frozen=True)
class MeasureResult:
    """What ``qemu-img measure`` reports: ``required`` bytes for a new image
    holding the source's data, ``fully_allocated`` bytes with every cluster
    allocated, and ``bitmaps`` bytes for the source's persistent bitmaps
    (None when qemu leaves them out: a raw source or target, --size,
    compat=0.10)."""

    required: int
    fully_allocated: int
    bitmaps: Optional[int] = None

    def to_dict(self) -> Dict[str, int]:
        """qemu-img measure --output=json's object, in its member order."""
        d: Dict[str, int] = {}
        if self.bitmaps is not None:
            d["bitmaps"] = _int64(self.bitmaps)
        d["required"] = _int64(self.required)
        d["fully-allocated"] = _int64(self.fully_allocated)
        return d

    def to_json(self) -> str:
        """As ``qemu-img measure --output=json`` prints it (newline included)."""
        members = ",\n".join(f'    "{k}": {v}' for k, v in self.to_dict().items())
        return "{\n" + members + "\n}\n"

    def to_human(self) -> str:
        """As ``qemu-img measure`` prints it."""
        text = (f"required size: {self.required % _U64}\n"
                f"fully allocated size: {self.fully_allocated % _U64}\n")
        if self.bitmaps is not None:
            text += f"bitmaps size: {self.bitmaps % _U64}\n"
        return text


# -- what the source contributes ----------------------------------------------

def _qemu_length(img: Image) -> int:
    """The source's length as qemu sees it: raw in whole 512-byte sectors."""
    size = img.size
    if img.format == "raw":
        size = _round_up(size, QEMU_SECTOR)
    return size


def _all_data_depth(img: Image) -> Optional[int]:
    """The depth of the chain's first layer qemu sees as all data (its
    format has no block status in qemu 7.2: its generic answer), if any."""
    for depth in range(len(img.backing_chain) + 1):
        if img._img.describe(depth)["qemu_sees_all_data"]:
            return depth
    return None


def data_clusters(img: Image, cluster_size: int) -> int:
    """Target clusters that hold source data: every cluster a range that
    reads from storage (data, not zero: the whole backing chain's) touches,
    counted once, as qcow2_measure walks the block status."""
    count = 0
    last = -1
    all_data = _all_data_depth(img)
    emap = img.extents()
    # the packed extents as they are: no Extent object per extent
    for start, length, _, flags, depth in _EXTENT.iter_unpack(emap._packed):
        below = all_data is not None and (not flags & _PRESENT or depth >= all_data)
        if not below and (flags & (_DATA | _ZERO)) != _DATA:
            continue
        first = max(start // cluster_size, last + 1)
        end = (start + length - 1) // cluster_size
        if end >= first:
            count += end - first + 1
            last = end
    return count


def bitmaps_size(bitmaps: Sequence[Bitmap], virtual_size: int, cluster_size: int) -> int:
    """qcow2_get_persistent_dirty_bitmap_size: every bitmap fully allocated,
    its table, and the directory (names counted in bytes, as stored)."""
    total = 0
    directory = 0
    for bitmap in bitmaps:
        nbytes = -(-(-(-virtual_size // bitmap.granularity)) // 8)
        clusters = -(-nbytes // cluster_size)
        total += clusters * cluster_size + _round_up(clusters * 8, cluster_size)
        directory += _round_up(24 + len(os.fsencode(bitmap.name)), 8)
    return total + _round_up(directory, cluster_size)


def _source_bitmaps(img: Image, cluster_size: int) -> Optional[int]:
    """bitmaps size, or None when the source cannot hold persistent bitmaps
    (as its driver says: anything but a qcow2 v3 image)."""
    if not img._img.describe()["stores_bitmaps"]:
        return None
    return bitmaps_size(img.bitmaps(), img.size, cluster_size)


# -- measure ------------------------------------------------------------------

def qcow2_target(create_options: Optional[Qcow2Options] = None,
                 **keywords: object) -> "Qcow2Target":
    """A Qcow2Target from a Qcow2Options object and keywords (which win)."""
    return Qcow2Target.from_options(qcow2_option_dict(create_options, **keywords))


if TYPE_CHECKING:
    Source = Union[PathArg, Image]


@suggest_keywords
def measure(src: Optional[Source] = None, *, size: Optional[Union[int, str]] = None,
            src_format: Optional[str] = None, dst_format: str = "raw",
            create_options: Optional[Qcow2Options] = None,
            cluster_size: Optional[Union[int, str]] = None, compat: Optional[str] = None,
            preallocation: Optional[str] = None,
            refcount_bits: Optional[Union[int, str]] = None,
            extended_l2: Optional[bool] = None,
            backing_file: Optional[Union[str, "os.PathLike[str]"]] = None,
            force_share: bool = False, member: Optional[str] = None,
            src_member: Optional[str] = None,
            src_external_files: bool = False) -> MeasureResult:
    """How many bytes a new ``dst_format`` image ("raw" or "qcow2") would
    take, like ``qemu-img measure``: for the data of ``src`` (a path, an NBD
    URI or an open Image; any format imgcopy reads, backing chain included)
    or, instead, for an empty image of ``size`` bytes.

    The qcow2 layout comes from ``create_options`` (a Qcow2Options) and the
    keywords, which win: ``cluster_size`` (512..2M), ``compat`` ("1.1" or
    "0.10"), ``preallocation`` (off, metadata, falloc, full: the last two
    count every cluster as required), ``refcount_bits`` (1..64, a power of
    two), ``extended_l2``, ``backing_file`` (only whether one is given
    matters: then every cluster counts).  A bad option raises ValueError
    (MeasureError) with qemu-img's message.

    ``member`` (or its long name ``src_member``): the source is this member
    of the tar archive ``src`` (an OVA's disk), read in place;
    ``src_external_files``: a vmdk source's descriptor may name extent files
    outside its directory (both as ``open()``'s ``member`` and
    ``external_files``)."""
    src_member = source_member("measure", member, src_member)
    if (src is None) == (size is None):
        raise ValueError("measure() needs either a source or a size, not both"
                         if src is not None else
                         "measure() needs a source or a size")
    if src is None and src_format is not None:
        raise ValueError("src_format needs a source")
    if src is None and src_member is not None:
        raise ValueError("member needs a source")
    if isinstance(src, Image) and src_member is not None:
        raise ValueError("member is for a source to open, not an open Image")
    check_output_format(dst_format)
    target: Optional[Qcow2Target] = None
    keywords = dict(cluster_size=cluster_size, compat=compat, preallocation=preallocation,
                    refcount_bits=refcount_bits, extended_l2=extended_l2,
                    backing_file=backing_file)
    if dst_format == "qcow2":
        target = qcow2_target(create_options, **keywords)
    else:
        raw_option_check(dst_format, create_options, keywords)
    if size is not None:
        nbytes = size if isinstance(size, int) else parse_image_size(size)
        if not 0 <= nbytes <= INT64_MAX:
            raise size_range_error()
        return measure_size(nbytes, target)
    if isinstance(src, Image):
        return measure_image(src, target)
    try:
        img = Image(src, src_format, force_share=force_share, member=src_member,  # type: ignore[arg-type]
                    external_files=src_external_files)
    except ImageFormatError as exc:  # remedies in measure()'s keywords
        raise exc.renamed({"format": "src_format", "external_files": "src_external_files"})
    with img:
        return measure_image(img, target)


def measure_size(size: int, target: Optional[Qcow2Target]) -> MeasureResult:
    """An empty image of ``size`` bytes (--size N)."""
    if target is None:
        n = _round_up(size, QEMU_SECTOR)
        return MeasureResult(n, n)
    target.check_size(size)
    vs = _round_up(size, target.cluster_size)
    full = target.fully_allocated(vs)
    data = vs if target.preallocation in ("falloc", "full") else 0
    return MeasureResult(full - vs + data, full)


def measure_image(img: Image, target: Optional[Qcow2Target]) -> MeasureResult:
    """The data of an open image."""
    length = _qemu_length(img)
    if target is None:
        return MeasureResult(length, length)
    target.check_size(target.size_option)
    cs = target.cluster_size
    vs = _round_up(length, cs)
    if target.preallocation in ("falloc", "full") or target.has_backing_file:
        data = vs
    else:
        data = data_clusters(img, cs) * cs
    full = target.fully_allocated(vs)
    bitmaps = _source_bitmaps(img, cs) if target.version >= 3 else None
    return MeasureResult(full - vs + data, full, bitmaps)
