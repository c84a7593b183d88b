"""qemu-img measure's arguments, read as qemu reads them: the option list
syntax (``-o a=1,b=2``, ``,,`` for a comma), each option's type (size,
number, on/off) with qemu's messages, the output formats it knows, and
measure()'s keywords (and a Qcow2Options) in the same terms.  What the
options mean for a qcow2 layout (qcow2_measure's own checks) is measure.py's."""
from __future__ import annotations

import os
import re
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from .options import Qcow2Options

_U64 = 1 << 64
INT64_MAX = (1 << 63) - 1

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
            raise size_range_error() from None
        raise MeasureError("Invalid image size specified. You may use k, M, G, T, P or E "
                           "suffixes for",
                           "kilobytes, megabytes, gigabytes, terabytes, petabytes and "
                           "exabytes.") from None
    if value > INT64_MAX:
        raise size_range_error()
    return value


def size_range_error() -> MeasureError:
    return MeasureError(f"Invalid image size specified. Must be between 0 and {INT64_MAX}.")


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


def qcow2_option_dict(create_options: Optional[Qcow2Options] = None,
                      **keywords: object) -> Dict[str, object]:
    """A qcow2 target's options in qemu's terms, as typed_options() gives
    them: from a Qcow2Options object and measure()'s keywords (which win;
    None is not given)."""
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
    return opts


def raw_option_check(dst_format: str, create_options: Optional[Qcow2Options],
                     keywords: Mapping[str, object]) -> None:
    """A raw target takes none of the qcow2 layout: measure()'s keywords
    refused as qemu refuses -o options it does not know (preallocation is
    the file protocol's, so allowed)."""
    if create_options is not None:
        raise ValueError("create_options (Qcow2Options) need dst_format='qcow2'")
    given = [k for k, v in keywords.items() if v is not None and k != "preallocation"]
    if given:
        raise MeasureError(f"Invalid parameter '{given[0]}'",
                           f"Invalid options for file format '{dst_format}'")
