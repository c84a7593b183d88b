"""Planning a copy: the exact requests convert() would make, without writing."""
from __future__ import annotations

import struct
from typing import Dict, Iterator, List, NamedTuple, Optional

from . import _core
from .convert import (DEFAULT_CONCURRENCY, DEFAULT_REQUEST_SIZE, DEFAULT_SPARSE_THRESHOLD,
                      NULL_TARGET, check_copy_options)
from .image import Image, PathArg
from .sizes import Size, parse_size

_KINDS = {_core.REQ_WRITE: "write", _core.REQ_ZERO: "zero", _core.REQ_SKIP: "skip"}
_REQUEST = struct.Struct("=QQII")


class Request(NamedTuple):
    kind: str  # "write", "zero" or "skip"
    offset: int
    length: int

    @property
    def end(self) -> int:
        return self.offset + self.length


class CopyPlan:
    """The requests of a copy, in guest order, with the counters the copy
    would report (``totals()``, keys as ``CopyResult.to_dict()``)."""

    def __init__(self, packed: bytes, counters: Dict[str, int], *, size: int,
                 options: dict) -> None:
        self._packed = packed
        self._counters = dict(counters)
        self.size = size
        self.options = options

    def __len__(self) -> int:
        return len(self._packed) // _REQUEST.size

    def __getitem__(self, i: int) -> Request:
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("request index out of range")
        off, length, kind, _ = _REQUEST.unpack_from(self._packed, i * _REQUEST.size)
        return Request(_KINDS[kind], off, length)

    def __iter__(self) -> Iterator[Request]:
        for off, length, kind, _ in _REQUEST.iter_unpack(self._packed):
            yield Request(_KINDS[kind], off, length)

    def __repr__(self) -> str:
        t = self._counters
        return (f"<CopyPlan {len(self)} requests: {t['write_requests']} writes "
                f"({t['bytes_written']} B), {t['zero_requests']} zeroes, "
                f"{t['bytes_skipped']} B skipped>")

    def requests(self, kind: Optional[str] = None) -> List[Request]:
        return [r for r in self if kind is None or r.kind == kind]

    def totals(self) -> Dict[str, int]:
        return dict(self._counters)

    def to_pandas(self):  # -> pandas.DataFrame
        """Columns kind, offset, length, end (needs pandas)."""
        import pandas as pd  # lazy: pandas is an optional extra
        rows = list(self)
        return pd.DataFrame({"kind": [r.kind for r in rows],
                             "offset": [r.offset for r in rows],
                             "length": [r.length for r in rows],
                             "end": [r.end for r in rows]})


def plan(src: PathArg, *, src_format: Optional[str] = None,
         sparse_threshold: Size = DEFAULT_SPARSE_THRESHOLD,
         request_size: Size = DEFAULT_REQUEST_SIZE, concurrency: int = DEFAULT_CONCURRENCY,
         target_is_zero: bool = True) -> CopyPlan:
    """The requests ``convert(src, dst, ...)`` with the same options makes
    into a raw destination, found by the same C engine: the source is read
    (zero runs are found in its data) but nothing is written."""
    sparse_threshold = parse_size(sparse_threshold, "sparse_threshold")
    request_size = parse_size(request_size, "request_size")
    check_copy_options(sparse_threshold, concurrency, request_size)
    options = dict(sparse_threshold=sparse_threshold, request_size=request_size,
                   concurrency=concurrency, target_is_zero=target_is_zero)
    with Image(src, src_format) as source:
        sink, _ = _core.create(NULL_TARGET, "null", source.size)
        try:
            report = _core.copy(source._img, sink, sparse_threshold=sparse_threshold,
                                request_size=request_size, concurrency=concurrency,
                                target_is_zero=bool(target_is_zero), offload=False,
                                flush=False, log=True)
        finally:
            sink.close()
        counters = {k: v for k, v in report.items() if isinstance(v, int)}
        return CopyPlan(report["requests"] or b"", counters, size=source.size, options=options)
