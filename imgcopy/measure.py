"""How large a new image would be: ``imgcopy.measure()``, like ``qemu-img
measure``.

The numbers are qemu 7.2's (block/qcow2.c qcow2_measure, block/raw-format.c
raw_measure), computed from the source's extent map: which target clusters
hold data is all the source contributes, so holes and zero ranges cost
nothing and no guest byte is read.  The C core computes the map and says
what each layer of the source is (Image.describe(): whether qemu sees a
layer as all data, whether the image holds persistent bitmaps, and which);
the rest is arithmetic.

Options are checked as qemu-img checks them, with its messages: the option
list syntax (``-o a=1,b=2``, ``,,`` for a comma), each option's type (size,
number, on/off), then the qcow2 rules (cluster size, compat, refcount width,
preallocation mode)."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple, Union

from .errors import ImageFormatError
from .extents import _DATA, _EXTENT, _PRESENT, _ZERO, QEMU_SECTOR
from ._keywords import suggest_keywords
from .image import Bitmap, Image, PathArg, source_member
from .options import Qcow2Options

_U64 = 1 << 64
_INT64_MAX = (1 << 63) - 1

# qcow2's limits (block/qcow2.h)
_MIN_CLUSTER_BITS, _MAX_CLUSTER_BITS = 9, 21
_MIN_CLUSTER_BITS_EXTL2 = 14
_MAX_L1_BYTES = 0x2000000
_L1E = 8
_DEFAULT_CLUSTER = 65536
_PREALLOC_MODES = ("off", "metadata", "falloc", "full")

# The output formats: the ones imgcopy writes are measured; qemu's other
# drivers answer as qemu-img does (tested with qemu 7.2).
MEASURED_FORMATS = ("raw", "qcow2")
_NO_MEASURE = frozenset("file gluster host_cdrom host_device iscsi iser nbd nfs nvme "
                        "parallels qcow qed rbd ssh vdi vhdx vmdk vpc".split())
_NO_CREATE = frozenset("blkdebug blklogwrites blkverify bochs cloop compress copy-before-write "
                       "copy-on-read dmg ftp ftps http https null-aio null-co preallocate "
                       "quorum replication snapshot-access throttle vvfat".split())
QEMU_FORMATS = _NO_MEASURE | _NO_CREATE | {"luks", "raw", "qcow2"}

# Each output format's creation options and their types, as qemu-img measure
# takes them (the format's own and the file protocol's).
_FILE_OPTIONS = {"size": "size", "preallocation": "str", "nocow": "bool",
                 "extent_size_hint": "size"}
_QCOW2_OPTIONS = dict(_FILE_OPTIONS, **{
    "compat": "str", "backing_file": "str", "backing_fmt": "str", "encryption": "bool",
    "encrypt.format": "str", "encrypt.key-secret": "str", "encrypt.cipher-alg": "str",
    "encrypt.cipher-mode": "str", "encrypt.ivgen-alg": "str", "encrypt.ivgen-hash-alg": "str",
    "encrypt.hash-alg": "str", "encrypt.iter-time": "number", "cluster_size": "size",
    "lazy_refcounts": "bool", "refcount_bits": "number", "data_file": "str",
    "data_file_raw": "bool", "compression_type": "str", "extended_l2": "bool"})
OPTION_TYPES = {"raw": _FILE_OPTIONS, "qcow2": _QCOW2_OPTIONS}

_SIZE_HINT = ("Optional suffix k, M, G, T, P or E means kilo-, mega-, giga-, tera-, peta-\n"
              "and exabytes, respectively.")


class MeasureError(ValueError):
    """A bad argument, as qemu-img measure reports it: ``reports`` are its
    error lines (each would be prefixed with the program's name)."""

    def __init__(self, *reports: str) -> None:
        super().__init__("\n".join(reports))
        self.reports = list(reports)


# -- qemu's number syntax ---------------------------------------------------

class _SizeSyntax(ValueError):
    """qemu_strtosz failed: ``out_of_range`` (ERANGE) or not a size (EINVAL)."""

    def __init__(self, out_of_range: bool) -> None:
        super().__init__("out of range" if out_of_range else "invalid size")
        self.out_of_range = out_of_range


_SUFFIX = {"B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50,
           "E": 1 << 60}
_DEC = re.compile(r"[ \t\n\v\f\r]*([+-]?)([0-9]+)")
_HEX = re.compile(r"[ \t\n\v\f\r]*[+-]?0[xX]([0-9a-fA-F]+)")
_FRACTION = re.compile(r"\.[0-9]+(?:[eE][+-]?[0-9]+)?")


def qemu_strtosz(text: str, warnings: Optional[List[str]] = None) -> int:
    """A byte count as qemu's qemu_strtosz reads it: decimal (a fraction
    allowed with a suffix, rounded half up), or hex (0x..); suffixes
    B/K/M/G/T/P/E in either case, powers of 1024.  Raises _SizeSyntax."""
    m = _DEC.match(text)
    if m is None:
        raise _SizeSyntax(False)
    if m.group(1) == "-":
        raise _SizeSyntax(False)
    val = int(m.group(2))
    if val >= _U64:
        raise _SizeSyntax(True)
    pos = m.end()
    frac_bits = 0
    hexa = False
    if val == 0 and text[pos:pos + 1] in ("x", "X"):
        h = _HEX.match(text)
        if h is None:  # "0x" and no digit: strtoull stops at the x
            pass
        else:
            val = int(h.group(1), 16)
            if val >= _U64:
                raise _SizeSyntax(True)
            pos = h.end()
            if text[pos:pos + 1] == ".":
                raise _SizeSyntax(False)
            hexa = True
    elif text[pos:pos + 1] == ".":
        f = _FRACTION.match(text, pos)
        if f is None:
            pos += 1  # "1." and "1.k": no fractional digits
        elif "e" in f.group(0).lower():
            raise _SizeSyntax(False)
        else:
            frac_bits = int(float(f.group(0)) * 2.0 ** 64)
            pos = f.end()
    mul = _SUFFIX.get(text[pos:pos + 1].upper()) if pos < len(text) else None
    if mul is not None:
        if hexa and warnings is not None:
            warnings.append(f"warning: Using a multiplier suffix on hex numbers is deprecated: "
                            f"{text}")
        pos += 1
    else:
        mul = 1
    if pos != len(text):
        raise _SizeSyntax(False)
    if mul == 1:
        if frac_bits:
            raise _SizeSyntax(False)
        return val
    # qemu's 64.64 fixed point, 0.5 rounded up
    frac = frac_bits * mul
    result = val * mul + (frac >> 64) + ((frac & (_U64 - 1)) >> 63)
    if result >= _U64:
        raise _SizeSyntax(True)
    return result


def parse_image_size(text: str, warnings: Optional[List[str]] = None) -> int:
    """qemu-img's --size N (cvtnum): MeasureError with its messages."""
    try:
        value = qemu_strtosz(text, warnings)
    except _SizeSyntax as exc:
        if exc.out_of_range:
            raise _size_range_error() from None
        raise MeasureError("Invalid image size specified. You may use k, M, G, T, P or E "
                           "suffixes for",
                           "kilobytes, megabytes, gigabytes, terabytes, petabytes and "
                           "exabytes.") from None
    if value > _INT64_MAX:
        raise _size_range_error()
    return value


def _size_range_error() -> MeasureError:
    return MeasureError(f"Invalid image size specified. Must be between 0 and {_INT64_MAX}.")


def _strtou64(text: str) -> int:
    """qemu_strtou64 with base 0, the whole string: ValueError, or
    OverflowError when too large.  A minus sign wraps, as strtoull does."""
    m = re.fullmatch(r"[ \t\n\v\f\r]*([+-]?)(0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*)", text)
    if m is None:
        raise ValueError(text)
    digits = m.group(2)
    if digits[:2].lower() == "0x":
        value = int(digits, 16)
    elif digits.startswith("0") and len(digits) > 1:
        value = int(digits, 8)
    else:
        value = int(digits)
    if value >= _U64:
        raise OverflowError(text)
    return (-value) % _U64 if m.group(1) == "-" else value


def _bool(name: str, value: str) -> bool:
    if value in ("on", "yes", "true", "y"):
        return True
    if value in ("off", "no", "false", "n"):
        return False
    raise ValueError(f"Parameter '{name}' expects 'on' or 'off'")


# -- qemu's option lists ----------------------------------------------------

def valid_option_list(text: str) -> bool:
    """qemu-img's check of one -o argument: not empty, no leading comma, no
    lone trailing comma."""
    if not text or text[0] == ",":
        return False
    stripped = text.rstrip(",")
    return (len(text) - len(stripped)) % 2 == 0


def split_options(text: str) -> List[Tuple[str, str]]:
    """``name=value,...`` as qemu's option parser splits it: ``,,`` is a
    comma inside a value; a bare ``name`` is name=on, ``noname`` name=off."""
    out: List[Tuple[str, str]] = []
    pos = 0
    while pos < len(text):
        stop = pos
        while stop < len(text) and text[stop] not in "=,":
            stop += 1
        name = text[pos:stop]
        if stop < len(text) and text[stop] == "=":
            pos = stop + 1
            value = []
            while pos < len(text):
                if text[pos] == ",":
                    if text[pos + 1:pos + 2] != ",":
                        break
                    pos += 1
                value.append(text[pos])
                pos += 1
            out.append((name, "".join(value)))
        else:
            pos = stop
            out.append((name[2:], "off") if name.startswith("no") else (name, "on"))
        if pos < len(text):  # the comma after it
            pos += 1
    return out


def typed_options(out_fmt: str, pairs: Sequence[Tuple[str, str]]) -> Dict[str, object]:
    """The options of ``pairs`` checked against ``out_fmt``'s list, as
    qemu_opts_do_parse checks them (in order; the last of a name wins):
    MeasureError with qemu's two reports for the first bad one."""
    types = OPTION_TYPES[out_fmt]
    out: Dict[str, object] = {}
    for name, value in pairs:
        if name == "id":
            continue
        try:
            kind = types.get(name)
            if kind is None:
                raise ValueError(f"Invalid parameter '{name}'")
            if kind == "bool":
                out[name] = _bool(name, value)
            elif kind == "size":
                try:
                    out[name] = qemu_strtosz(value)
                except _SizeSyntax as exc:
                    if exc.out_of_range:
                        raise ValueError(f"Value '{value}' is out of range for parameter "
                                         f"'{name}'") from None
                    raise ValueError(f"Parameter '{name}' expects a non-negative number below "
                                     f"2^64\n{_SIZE_HINT}") from None
            elif kind == "number":
                try:
                    out[name] = _strtou64(value)
                except OverflowError:
                    raise ValueError(f"Value '{value}' is too large for parameter "
                                     f"'{name}'") from None
                except ValueError:
                    raise ValueError(f"Parameter '{name}' expects a number") from None
            else:
                out[name] = value
        except ValueError as exc:
            raise MeasureError(str(exc), f"Invalid options for file format '{out_fmt}'") \
                from None
    return out


def check_output_format(out_fmt: str) -> None:
    """MeasureError unless ``out_fmt`` is measured, as qemu-img says it."""
    if out_fmt in MEASURED_FORMATS:
        return
    if out_fmt in _NO_CREATE:
        raise MeasureError(f"Format driver '{out_fmt}' does not support image creation")
    if out_fmt in _NO_MEASURE:
        raise MeasureError(f"Block driver '{out_fmt}' does not support size measurement")
    if out_fmt == "luks":
        raise MeasureError("measuring for a luks image is not supported (raw, qcow2)")
    raise MeasureError(f"Unknown file format '{out_fmt}'")


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
    return value - _U64 if value > _INT64_MAX else value


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

def _option_value(name: str, value: object) -> object:
    """A keyword of measure() in qemu's terms (sizes and numbers as strings
    read as -o reads them)."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, str):
        kind = _QCOW2_OPTIONS.get(name, "str")
        if kind in ("size", "number", "bool"):
            return typed_options("qcow2", [(name, value)])[name]
    return value


_COMPAT_NAMES = {"v2": "0.10", "v3": "1.1"}


def qcow2_target(create_options: Optional[Qcow2Options] = None,
                 **keywords: object) -> Qcow2Target:
    """A Qcow2Target from a Qcow2Options object and keywords (which win)."""
    opts: Dict[str, object] = {}
    if create_options is not None:
        if create_options.cluster_size is not None:
            opts["cluster_size"] = create_options.cluster_size
        opts["compat"] = _COMPAT_NAMES.get(create_options.compat, create_options.compat)
        opts["preallocation"] = create_options.preallocation
        if create_options.backing_file is not None:
            opts["backing_file"] = create_options.backing_file
    for name, value in keywords.items():
        if value is None:
            continue
        if name == "backing_file":
            opts["backing_file"] = value if isinstance(value, str) else \
                os.fsdecode(value)  # type: ignore[arg-type]
        else:
            opts[name] = _option_value(name, value)
    return Qcow2Target.from_options(opts)


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
        given = [k for k, v in keywords.items() if v is not None and k != "preallocation"]
        if create_options is not None:
            raise ValueError("create_options (Qcow2Options) need dst_format='qcow2'")
        if given:
            raise MeasureError(f"Invalid parameter '{given[0]}'",
                               f"Invalid options for file format '{dst_format}'")
    if size is not None:
        nbytes = size if isinstance(size, int) else parse_image_size(size)
        if not 0 <= nbytes <= _INT64_MAX:
            raise _size_range_error()
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
