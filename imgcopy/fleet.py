"""Fleets: many disks in one call (``copy_many``), on one pool of worker
threads under shared caps, with events a dashboard can draw.  A disk's copy
is a ``CopyJob``: what ``convert()`` is asked, frozen and picklable, so the
same jobs run on a Dask cluster (``imgcopy.distributed``)."""
from __future__ import annotations

import os
import threading
import time
from typing import (TYPE_CHECKING, Any, Callable, Dict, Hashable, List, Mapping, Optional, Sequence,
                    Union)
from urllib.parse import urlsplit

from ._keywords import unexpected_keyword
from ._sharing import SHARING, Sharing
from .sizes import parse_size

if TYPE_CHECKING:
    from .sizes import Size

Event = Dict[str, Any]
PerSource = Union[Mapping[str, int], Callable[[str], Optional[int]], None]

# at most this many progress events a job sends a second
PROGRESS_INTERVAL = 0.5


def _convert_keywords() -> frozenset:
    from .convert import convert

    defaults = getattr(convert, "__kwdefaults__", None) or {}
    return frozenset(k for k in defaults if not k.startswith("_"))


class CopyJob:
    """One disk's copy: ``convert(src, dst, **convert_keywords)``, not run
    yet.  Frozen (hashable, comparable) and picklable; its keywords are
    checked against ``convert()``'s when it is made."""

    __slots__ = ("src", "dst", "keywords")
    src: str
    dst: str
    keywords: Mapping[str, Any]

    def __init__(self, src: Union[str, "os.PathLike[str]"], dst: Union[str, "os.PathLike[str]"],
                 **convert_keywords: Any) -> None:
        valid = _convert_keywords()
        for name in convert_keywords:
            if name not in valid:
                raise unexpected_keyword("CopyJob", name, valid)
        object.__setattr__(self, "src", os.fsdecode(os.fspath(src)))
        object.__setattr__(self, "dst", os.fsdecode(os.fspath(dst)))
        object.__setattr__(self, "keywords", dict(convert_keywords))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"CopyJob is frozen: cannot set {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"CopyJob is frozen: cannot delete {name!r}")

    def __reduce__(self):  # frozen, slotted: rebuilt through __init__
        return (_rebuild_job, (self.src, self.dst, tuple(sorted(self.keywords.items()))))

    def _key(self) -> tuple:
        return (self.src, self.dst, tuple(sorted((k, repr(v)) for k, v in self.keywords.items())))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CopyJob) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        extra = "".join(f", {k}={v!r}" for k, v in self.keywords.items())
        return f"CopyJob({self.src!r}, {self.dst!r}{extra})"

    def run(self, **extra: Any) -> Any:
        """``convert(src, dst, **keywords)``: the CopyResult."""
        from .convert import convert

        return convert(self.src, self.dst, **{**self.keywords, **extra})


def _rebuild_job(src: str, dst: str, items: tuple) -> CopyJob:
    return CopyJob(src, dst, **dict(items))


def source_host(src: str) -> str:
    """What a per-source cap counts: an NBD URI's server (``nbd://esx1``;
    a Unix socket's path), else the local machine ("local")."""
    if "://" not in src:
        return "local"
    parts = urlsplit(src)
    if parts.scheme.endswith("+unix"):
        query = dict(p.split("=", 1) for p in parts.query.split("&") if "=" in p)
        return f"{parts.scheme}:{query.get('socket', parts.path)}"
    return f"{parts.scheme}://{parts.hostname or ''}" + (f":{parts.port}" if parts.port else "")


def _cap_of(per_source: PerSource, src: str) -> Optional[int]:
    if per_source is None:
        return None
    if callable(per_source):
        return per_source(src)
    host = source_host(src)
    for key, cap in per_source.items():
        if source_host(key) == host if "://" in key else src.startswith(key) or key == host:
            return cap
    return None


class _Cancelled(Exception):
    """A job stopped because the fleet was told to stop (fail_fast, Ctrl-C)."""


class Cancelled(Exception):
    """The result of a job ``copy_many`` never ran or stopped, because another
    failed with ``fail_fast`` or the call was interrupted."""


class _Fleet:
    def __init__(self, jobs: Sequence[CopyJob], max_parallel: int, per_source: PerSource,
                 memory_limit: int, on_event: Optional[Callable[[Event], Any]],
                 fail_fast: bool, threads: Optional[int]) -> None:
        from . import _core

        self.jobs = list(jobs)
        self.max_parallel = max_parallel
        self.per_source = per_source
        self.memory_limit = memory_limit
        self.on_event = on_event
        self.fail_fast = fail_fast
        self.results: List[Any] = [None] * len(self.jobs)
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self.event_lock = threading.Lock()  # on_event: one thread at a time
        self.stop = threading.Event()
        self.running = 0
        self.per_host: Dict[Hashable, int] = {}
        self.event_error: Optional[BaseException] = None
        # one pool for all: its threads scan zeros and write for every copy
        # (remote copies wait in no thread), its budget bounds bytes in flight
        self.pool = _core.Pool(threads or max(4, min(4 * max_parallel, 64)), memory_limit)

    def emit(self, event: Event) -> None:
        if self.on_event is None:
            return
        with self.event_lock:
            try:
                self.on_event(event)
            except BaseException as exc:  # the caller's callback: stop all, re-raise later
                if self.event_error is None:
                    self.event_error = exc
                self.stop.set()

    def base(self, i: int) -> Event:
        job = self.jobs[i]
        return {"job": i, "src": job.src, "dst": job.dst}

    def run_one(self, i: int) -> None:
        job, t0 = self.jobs[i], time.monotonic()
        last = [0.0]

        def progress(done: int, total: int) -> None:
            if self.stop.is_set():
                raise _Cancelled()
            now = time.monotonic()
            if now - last[0] >= PROGRESS_INTERVAL or done == total:
                last[0] = now
                self.emit({**self.base(i), "event": "progress", "done_bytes": done,
                           "total_bytes": total, "elapsed": now - t0})

        self.emit({**self.base(i), "event": "start", "done_bytes": 0, "total_bytes": None,
                   "elapsed": 0.0})
        share = self.memory_limit // self.max_parallel if self.memory_limit else 0
        try:
            token = SHARING.set(Sharing(self.pool, share))
            try:
                result = job.run(progress=progress)
            finally:
                SHARING.reset(token)
        except _Cancelled:
            result = Cancelled(f"job {i} ({job.src} -> {job.dst}) was cancelled")
            self.emit({**self.base(i), "event": "failed", "error": "Cancelled",
                       "message": str(result), "elapsed": time.monotonic() - t0})
        except Exception as exc:  # isolated: the others go on
            result = exc
            self.emit({**self.base(i), "event": "failed", "error": type(exc).__name__,
                       "message": str(exc), "elapsed": time.monotonic() - t0})
            if self.fail_fast:
                self.stop.set()
        else:
            total = result.bytes_changed
            self.emit({**self.base(i), "event": "done", "done_bytes": total,
                       "total_bytes": total, "elapsed": time.monotonic() - t0,
                       "result": result.to_dict()})
        self.results[i] = result

    def host_of(self, i: int) -> tuple:
        src = self.jobs[i].src
        return source_host(src), _cap_of(self.per_source, src)

    def start_allowed(self, i: int) -> bool:
        host, cap = self.host_of(i)
        return cap is None or self.per_host.get(host, 0) < cap

    def worker(self, i: int) -> None:
        host, _ = self.host_of(i)
        try:
            if not self.stop.is_set():
                self.run_one(i)
            else:
                self.results[i] = Cancelled(f"job {i} was not started")
        finally:
            with self.changed:
                self.running -= 1
                self.per_host[host] -= 1
                self.changed.notify_all()

    def run(self) -> List[Any]:
        pending = list(range(len(self.jobs)))
        threads: List[threading.Thread] = []
        try:
            with self.changed:
                while pending and not self.stop.is_set():
                    ready = next((i for i in pending if self.start_allowed(i)), None)
                    if ready is None or self.running >= self.max_parallel:
                        self.changed.wait(0.2)
                        continue
                    pending.remove(ready)
                    host, _ = self.host_of(ready)
                    self.running += 1
                    self.per_host[host] = self.per_host.get(host, 0) + 1
                    t = threading.Thread(target=self.worker, args=(ready,),
                                         name=f"imgcopy-job-{ready}", daemon=True)
                    threads.append(t)
                    t.start()
            for t in threads:
                while t.is_alive():
                    t.join(0.2)
        except KeyboardInterrupt:
            self.stop.set()
            for t in threads:
                _join_uninterrupted(t)
            raise
        for i in pending:
            self.results[i] = Cancelled(f"job {i} was not started")
        if self.event_error is not None:
            raise self.event_error
        return self.results


def _join_uninterrupted(t: threading.Thread) -> None:
    while t.is_alive():
        try:
            t.join(0.2)
        except KeyboardInterrupt:
            continue


def copy_many(jobs: Sequence[CopyJob], *, max_parallel: int = 4, per_source: PerSource = None,
              memory_limit: Optional[Size] = None,
              on_event: Optional[Callable[[Event], Any]] = None, fail_fast: bool = False,
              threads: Optional[int] = None) -> List[Any]:
    """Copy every job's disk, at most ``max_parallel`` at once, on one shared
    pool of worker threads (``threads``; default four per job up to 64):
    the copies' requests in flight and zero scans share it.

    ``per_source``: a cap on jobs at once per source host (VMware's ~50
    NFC streams per ESXi host): a mapping from a source (an NBD URI, whose
    server counts: ``{"nbd://esx1/": 2}``; a path prefix) to its cap, or a
    callable ``(src) -> cap or None``.  ``memory_limit``: a hard cap on the
    copies' buffers and bytes in flight, all jobs together (each running job
    gets its share: fewer requests in flight, never more memory).
    ``on_event(event)``: called from one thread at a time with dicts
    ``{"job": i, "event": "start" | "progress" | "done" | "failed", "src",
    "dst", "done_bytes", "total_bytes", "elapsed", ...}``; "done" carries
    ``result`` (``CopyResult.to_dict()``), "failed" ``error`` (the
    exception's type name) and ``message``.  An exception the callback
    raises stops every job and is raised.

    Returns, in job order, each job's ``CopyResult`` or the exception it
    raised (as ``asyncio.gather(return_exceptions=True)``): one disk failing
    never stops the others, unless ``fail_fast``, after which the others
    stop and end with ``Cancelled``.  Ctrl-C cancels all and raises."""
    jobs = list(jobs)
    for i, job in enumerate(jobs):
        if not isinstance(job, CopyJob):
            raise TypeError(f"job {i} is a {type(job).__name__}, not a CopyJob")
    if not isinstance(max_parallel, int) or max_parallel < 1:
        raise ValueError(f"max_parallel must be a positive integer, not {max_parallel!r}")
    limit = parse_size(memory_limit, "memory_limit") if memory_limit is not None else 0
    if per_source is not None and not callable(per_source):
        for key, cap in per_source.items():
            if not isinstance(cap, int) or cap < 1:
                raise ValueError(f"per_source[{key!r}] must be a positive integer, not {cap!r}")
    if not jobs:
        return []
    return _Fleet(jobs, max_parallel, per_source, limit, on_event, fail_fast, threads).run()
