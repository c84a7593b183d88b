"""Options as objects: how a copy runs (``CopyOptions``) and how a new image
is laid out (``Qcow2Options``).  Both are frozen dataclasses, checked by the
C core when they are made (the check the copy and the creation make again
before they touch anything: there is one definition of what is valid),
and shared by ``convert()`` and ``plan()``, whose keyword arguments are
shorthand for their fields.

A new option is a field here with its default and its line in the
docstring, a field of the C struct it fills (``struct ic_copy_options`` or
``struct ic_create_options``), a row in that struct's table (csrc/fields.c:
the glue reads and writes the struct through it, naming no field) and its
check (csrc/options.c).  The interfaces spell it out again: a keyword of
``convert()`` (and of ``plan()`` when it changes the requests), a flag of
the command line (imgcopy/cli.py), and the typed keywords of ``_core.copy()``
and ``_core.check_copy_options()`` (or ``_core.create()``) in
imgcopy/_core.pyi; tests/test_options.py checks convert()'s and the stubs'
against the fields."""
from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field, fields, replace

from . import _core
from ._defaults import COPY_DEFAULTS
from ._keywords import suggest_keywords
from .sizes import parse_size

TYPE_CHECKING = False  # typing's import is not paid to start a command
if TYPE_CHECKING:
    from typing import Any, ClassVar, Dict, Mapping, Optional, Tuple, TypeVar, Union

    from .sizes import Size

    _Options = TypeVar("_Options", "CopyOptions", "CreateOptions")

# the engine's defaults are the C core's (csrc/options.c says why these)
_DEFAULTS = COPY_DEFAULTS

# fields the copy engine does not take: they apply when images are opened
_AT_OPEN = {"at_open": True}


def _flag(value: Any) -> bool:
    return bool(value)


@suggest_keywords
@dataclass(frozen=True)
class CopyOptions:
    """How a copy runs (qemu-img convert's flag, and the default, in brackets).

    ``sparse_threshold`` [-S, 4k]: zero runs at least this long inside data
    become holes; 0: fully allocated, every block of the destination gets
    disk space: zeros by zero requests that keep them allocated (a new
    file's fallocate, FALLOC_FL_ZERO_RANGE, NBD WRITE_ZEROES without
    may-trim), written as data only where the destination has no such
    request (qcow2, a server without WRITE_ZEROES).
    ``concurrency`` [-m, 4]: worker threads.
    ``request_size`` [2M]: bytes per read or write request.
    ``out_of_order`` [-W, True]: writes may complete in any order; False
    writes in guest order.
    ``target_is_zero`` [--target-is-zero, None]: the destination already
    reads as zeros, so zero ranges are skipped; None: the C core decides,
    True for a destination the copy created reading as zeros (a new
    regular file or qcow2 image, and ``plan()``'s), else False.
    ``direct`` [-T none / -t none, False]: O_DIRECT on both ends, or a
    (source, destination) pair; stored as a bool when both agree.
    ``flush`` [True; -t unsafe: False]: make the destination durable before
    the copy returns.
    ``offload`` [-C, False]: copy data in the kernel (copy_file_range)
    where the pair of files allows it.
    ``connections`` [nbdcopy's --connections, None]: connections to an NBD
    source or destination; None: 4 where the server allows several
    (multi-conn), else 1 (a server without multi-conn always gets 1).
    ``requests_in_flight`` [nbdcopy's --requests, 64]: NBD requests in
    flight per connection (0: the default).
    ``retries`` [--retries, 0]: an NBD connection that drops (the server
    killed, restarted, the network gone) is made again up to this many
    times, every request it left unanswered sent again (writes and zeroes
    are idempotent; reads and block status asked again); an error the
    server answers (EIO, ENOSPC) is never retried.  0: a drop fails the copy.
    ``retry_delay`` [1.0]: seconds before the first new connection, doubling
    after each that fails (at most a minute).

    Sizes take ints or strings such as ``"64k"`` and are stored as ints.
    An invalid option raises ValueError (TypeError for a wrong type) here,
    before anything is opened."""

    sparse_threshold: Size = _DEFAULTS["sparse_threshold"]
    concurrency: int = _DEFAULTS["concurrency"]
    request_size: Size = _DEFAULTS["request_size"]
    out_of_order: bool = _DEFAULTS["out_of_order"]
    target_is_zero: Optional[bool] = _DEFAULTS["target_is_zero"]
    direct: Union[bool, Tuple[bool, bool]] = field(default=False, metadata=_AT_OPEN)
    flush: bool = _DEFAULTS["flush"]
    offload: bool = _DEFAULTS["offload"]
    connections: Optional[int] = None
    requests_in_flight: int = _DEFAULTS["requests_in_flight"]
    retries: int = _DEFAULTS["retries"]
    # the C core's retry_delay_ms, in seconds here
    retry_delay: float = field(default=_DEFAULTS["retry_delay_ms"] / 1000,
                               metadata={"engine": "retry_delay_ms", "scale": 1000})

    def __post_init__(self) -> None:
        normal = {
            "sparse_threshold": parse_size(self.sparse_threshold, "sparse_threshold"),
            "request_size": parse_size(self.request_size, "request_size"),
            "out_of_order": _flag(self.out_of_order),
            "target_is_zero": None if self.target_is_zero is None else _flag(self.target_is_zero),
            "direct": _direct(self.direct),
            "flush": _flag(self.flush),
            "offload": _flag(self.offload),
        }
        for name, value in normal.items():
            object.__setattr__(self, name, value)
        _core.check_copy_options(**self.engine_options())

    @property
    def source_direct(self) -> bool:
        return self.direct[0] if isinstance(self.direct, tuple) else self.direct

    @property
    def destination_direct(self) -> bool:
        return self.direct[1] if isinstance(self.direct, tuple) else self.direct

    def engine_options(self, **resolved: Any) -> Dict[str, Any]:
        """The keywords of ``_core.copy()``: the fields the engine takes,
        with ``resolved`` (e.g. ``target_is_zero=True``) in place of them."""
        out = {}
        for f in fields(self):
            if f.metadata.get("at_open"):
                continue
            value = getattr(self, f.name)
            if "engine" in f.metadata:  # the core's unit and name
                out[f.metadata["engine"]] = _scaled(f.name, value, f.metadata["scale"])
            else:
                out[f.name] = value
        out["connections"] = out["connections"] or 0  # the C core's "as the server allows"
        out.update(resolved)
        return out

    def ran_with(self, used: Mapping[str, Any]) -> "CopyOptions":
        """These options as a copy ran with them: the engine's fields as
        ``_core.copy()`` reports them (its report's "options", decided by
        the C core from these and the images: a server's preferred block
        size raises ``sparse_threshold`` and ``request_size``, ``None``
        becomes what was decided), the others (``direct``) as they are.
        Not checked again: the values are the engine's own."""
        out = copy.copy(self)
        for f in fields(self):
            if "engine" in f.metadata and f.metadata["engine"] in used:
                object.__setattr__(out, f.name, used[f.metadata["engine"]] / f.metadata["scale"])
            elif f.name in used and not f.metadata.get("at_open"):
                value = used[f.name]
                if f.name == "connections" and not value:
                    value = self.connections  # 0: as each server allows
                object.__setattr__(out, f.name, value)
        return out


def _scaled(name: str, value: Any, scale: int) -> int:
    """A number of seconds (an int or a float) in the core's unit."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, not {type(value).__name__}")
    if not value >= 0:
        raise ValueError(f"{name} must be a number of seconds from 0, not {value!r}")
    return round(value * scale)


def _direct(value: Any) -> Union[bool, Tuple[bool, bool]]:
    if isinstance(value, tuple):
        if len(value) != 2:
            raise TypeError("direct must be a bool or a (source, destination) pair of bools")
        source, destination = _flag(value[0]), _flag(value[1])
        return source if source == destination else (source, destination)
    return _flag(value)


@dataclass(frozen=True)
class CreateOptions:
    """How a new image of ``format`` is laid out: the base of each format's
    options (``Qcow2Options``)."""

    # the format's name: no field (unannotated, as dataclasses tells a
    # ClassVar annotation apart only when typing is loaded)
    if TYPE_CHECKING:
        format: ClassVar[str] = ""
    else:
        format = ""

    def create_keywords(self) -> Dict[str, Any]:
        """The keywords of ``_core.create()``: the fields that are set."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if getattr(self, f.name) is not None}

    def _check(self) -> None:
        _core.check_create_options(self.format, **self.create_keywords())


@suggest_keywords
@dataclass(frozen=True)
class Qcow2Options(CreateOptions):
    """How a new qcow2 image is laid out (qemu-img convert -O qcow2 -o ...).

    ``cluster_size`` [None: 64k]: a power of two from 512 to 2M.
    ``compat`` ["1.1"]: "1.1" (or "v3") or "0.10" (or "v2", qcow2 version 2).
    ``preallocation`` ["off"]: "off" or "metadata" (every cluster allocated,
    unwritten).
    ``compress`` [-c, False]: data clusters compressed, each on its own, in
    the copy's worker threads.
    ``compression_type`` ["zlib"]: qemu's names: "zlib" (deflate; done by
    libdeflate where imgcopy was built with it, else zlib) or "zstd" (qemu
    5.1 and later read it; needs compat 1.1 and a build with libzstd).
    ``compression_level`` [None]: 1 to 12 for zlib (libdeflate's scale,
    zlib's up to 9), 1 to 19 for zstd; None picks the fastest level that
    compresses no worse than qemu-img convert -c: 4 with libdeflate (6, as
    qemu, with zlib), 3 for zstd.  ``compression_libraries()`` says which
    library this build uses.
    ``backing_file`` [-B, None]: the new image is an overlay of this file
    (stored as given, relative to the image's directory); what the source's
    own backing chain holds is left unwritten.
    ``backing_format`` [-F, None]: the backing file's format; None probes it.

    An invalid option raises ValueError here, before anything is opened."""

    if TYPE_CHECKING:
        format: ClassVar[str] = "qcow2"
    else:
        format = "qcow2"

    cluster_size: Optional[Size] = None
    compat: str = "1.1"
    preallocation: str = "off"
    compress: bool = False
    compression_type: str = "zlib"
    compression_level: Optional[int] = None
    backing_file: Optional[Union[str, "os.PathLike[str]"]] = None
    backing_format: Optional[str] = None

    def __post_init__(self) -> None:
        if self.cluster_size is not None:
            object.__setattr__(self, "cluster_size",
                               parse_size(self.cluster_size, "cluster_size"))
        if self.backing_file is not None:
            object.__setattr__(self, "backing_file", os.fsdecode(self.backing_file))
        object.__setattr__(self, "compress", _flag(self.compress))
        level = self.compression_level
        if level is not None and (isinstance(level, bool) or not isinstance(level, int)
                                  or level < 1):
            raise ValueError(f"compression_level must be a positive integer or None, "
                             f"not {level!r}")
        self._check()


def compression_libraries() -> Dict[str, Optional[str]]:
    """The library each qcow2 compression type uses in this build, with its
    version (``{"zlib": "libdeflate 1.14", "zstd": "libzstd 1.5.4"}``), or
    None for a type the build cannot write or read (zstd without libzstd)."""
    return _core.compression_libraries()


def with_keywords(options: _Options, **keywords: Any) -> _Options:
    """``options`` with the keywords that were given (not None) in place of
    its fields: the shorthand of convert() and plan()."""
    given = {k: v for k, v in keywords.items() if v is not None}
    return replace(options, **given) if given else options
