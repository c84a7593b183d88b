"""Planning a copy: the exact requests convert() would make, without writing."""
from __future__ import annotations

from typing import TYPE_CHECKING, Dict, Iterator, List, NamedTuple, Optional

from . import _core
from .extents import packed_struct
from ._keywords import suggest_keywords
from .image import source_member
from .job import NULL_TARGET, CopySteps
from .options import CopyOptions
from .sizes import human_size

if TYPE_CHECKING:
    from .image import PathArg
    from .sizes import Size

_KINDS = {_core.REQ_WRITE: "write", _core.REQ_ZERO: "zero", _core.REQ_SKIP: "skip"}
# struct ic_request, as the C core packs requests: offset, length, kind
_REQUEST = packed_struct("=QQII", _core.REQUEST_SIZE, "struct ic_request")


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
                 options: CopyOptions) -> None:
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
        return (f"<CopyPlan {human_size(self.size)}, {len(self)} requests: "
                f"{t['write_requests']} writes ({human_size(t['bytes_written'])}), "
                f"{t['zero_requests']} zeroes ({human_size(t['bytes_zeroed'])}), "
                f"{human_size(t['bytes_skipped'])} skipped>")

    def _repr_html_(self) -> str:
        from ._html import copy_plan_html

        return copy_plan_html(self)

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


@suggest_keywords
def plan(src: PathArg, *, src_format: Optional[str] = None, member: Optional[str] = None,
         src_member: Optional[str] = None,
         src_external_files: bool = False, options: Optional[CopyOptions] = None,
         sparse_threshold: Optional[Size] = None,
         request_size: Optional[Size] = None, concurrency: Optional[int] = None,
         target_is_zero: Optional[bool] = None) -> CopyPlan:
    """The requests ``convert(src, dst, options=options)`` makes into a new
    raw destination, found by the same C engine: the source is read (zero
    runs are found in its data) but nothing is written.  ``options`` and the
    keywords (shorthand for its fields, replacing them) are convert()'s;
    ``target_is_zero`` None is True, as for a new file.  The plan is of a
    copy without ``offload`` (the kernel would copy whole data extents);
    ``direct`` and ``flush`` change no request.  ``CopyPlan.options`` holds
    the options the plan's engine ran with (``offload`` and ``flush`` off,
    None decided).  ``member`` (or its long name ``src_member``) and
    ``src_external_files``: ``open()``'s ``member`` and ``external_files``
    for the source."""
    # convert()'s steps, into the null target, every request recorded
    steps = CopySteps(src, NULL_TARGET, src_format=src_format,
                      src_member=source_member("plan", member, src_member),
                      src_external_files=src_external_files, dst_format="null",
                      options=options,
                      option_keywords=dict(sparse_threshold=sparse_threshold,
                                           request_size=request_size, concurrency=concurrency,
                                           target_is_zero=target_is_zero),
                      request_log=True)
    steps.validate()
    with steps.open_source():
        sink = steps.open_destination()
        try:
            steps.run()
        finally:
            sink.close()
    report = steps.report
    if report is None:  # cannot be: run() returned
        raise RuntimeError("the plan's copy ended without its report")
    counters = {k: v for k, v in report.items() if isinstance(v, int)}
    return CopyPlan(report["requests"] or b"", counters, size=steps.source_size,
                    options=steps.options)
