"""Fleets and big disks on a Dask cluster (``pip install imgcopy[distributed]``):
the same jobs as ``copy_many()``, as Dask tasks on the cluster's workers
(each runs imgcopy's own engine inside), and one disk cut into range shards
whose block digests the coordinator combines into the disk's checksum.
Dask is the scheduler: retries, placement and worker deaths are its."""
from __future__ import annotations

import os
import threading
import time
import uuid
from typing import (TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple,
                    Union)

try:
    import distributed as _dask
except ImportError as exc:  # the optional extra
    raise ImportError("imgcopy.distributed needs Dask distributed: pip install "
                      "'imgcopy[distributed]' (or: pip install distributed)") from exc

from ._sharing import SHARING, Sharing
from .fleet import Cancelled, CopyJob, Event, PerSource, _cap_of, source_host
from .sizes import parse_size

if TYPE_CHECKING:
    from .sizes import Size

Placement = Union[Mapping[str, Any], Callable[[CopyJob], Any], None]

# at most this many progress events a task sends a second
PROGRESS_INTERVAL = 0.5
EVENT_TOPIC = "imgcopy-events"


def _run_job(job: CopyJob, index: int, run_id: str, buffer_limit: int) -> Any:
    """On a worker: the job's copy, its events logged to the scheduler."""
    worker = _dask.get_worker()
    t0, last = time.monotonic(), [0.0]
    base = {"job": index, "src": job.src, "dst": job.dst, "run": run_id,
            "worker": worker.address}

    def log(event: Dict[str, Any]) -> None:
        worker.log_event(EVENT_TOPIC, {**base, **event})

    def progress(done: int, total: int) -> None:
        now = time.monotonic()
        if now - last[0] >= PROGRESS_INTERVAL or done == total:
            last[0] = now
            log({"event": "progress", "done_bytes": done, "total_bytes": total,
                 "elapsed": now - t0})

    log({"event": "start", "done_bytes": 0, "total_bytes": None, "elapsed": 0.0})
    token = SHARING.set(Sharing(None, buffer_limit))
    try:
        return job.run(progress=progress)
    finally:
        SHARING.reset(token)


def _placement(value: Placement, job: CopyJob) -> Any:
    if value is None:
        return None
    if callable(value):
        return value(job)
    return value.get(job.src)


class _Events:
    """Events of a run, from the scheduler's log topic, handed to on_event
    from one thread at a time."""

    def __init__(self, client: Any, run_id: str, on_event: Optional[Callable[[Event], Any]]):
        self.client, self.run_id, self.on_event = client, run_id, on_event
        self.lock = threading.Lock()
        self.error: Optional[BaseException] = None
        if on_event is not None:
            client.subscribe_topic(EVENT_TOPIC, self._from_topic)

    def _from_topic(self, logged: Any) -> None:
        _, event = logged if isinstance(logged, tuple) else (None, logged)
        if isinstance(event, dict) and event.get("run") == self.run_id:
            event = {k: v for k, v in event.items() if k != "run"}
            self.emit(event)

    def emit(self, event: Event) -> None:
        if self.on_event is None:
            return
        with self.lock:
            try:
                self.on_event(event)
            except BaseException as exc:
                if self.error is None:
                    self.error = exc

    def close(self) -> None:
        if self.on_event is not None:
            try:
                self.client.unsubscribe_topic(EVENT_TOPIC)
            except Exception:
                pass


def copy_many(jobs: Sequence[CopyJob], *, client: Any, max_parallel: Optional[int] = None,
              per_source: PerSource = None, memory_limit: Optional[Size] = None,
              on_event: Optional[Callable[[Event], Any]] = None, fail_fast: bool = False,
              retries: int = 0, workers: Placement = None,
              resources: Placement = None) -> List[Any]:
    """``imgcopy.copy_many()`` on a Dask cluster: each job a task on some
    worker (running imgcopy's engine there), results and events as
    ``copy_many()`` gives them (events carry the worker's address too).
    ``max_parallel`` (default: the cluster's threads) and ``per_source``
    caps hold across the cluster; ``memory_limit`` is each task's cap on its
    buffers.  ``retries``: Dask's, for a task that failed (a worker that
    dies has its task run elsewhere anyway).  ``workers`` / ``resources``:
    where a job runs (a job pinned where its source is): a mapping from a
    job's source to Dask's ``workers=`` / ``resources=``, or a callable
    ``(job) -> value``.  Sources and destinations must be reachable from
    the workers that run them."""
    jobs = list(jobs)
    for i, job in enumerate(jobs):
        if not isinstance(job, CopyJob):
            raise TypeError(f"job {i} is a {type(job).__name__}, not a CopyJob")
    parallel = max_parallel if max_parallel is not None else max(
        1, sum(client.nthreads().values()))
    if parallel < 1:
        raise ValueError(f"max_parallel must be a positive integer, not {max_parallel!r}")
    limit = parse_size(memory_limit, "memory_limit") if memory_limit is not None else 0
    run_id = uuid.uuid4().hex
    events = _Events(client, run_id, on_event)
    results: List[Any] = [None] * len(jobs)
    pending = list(range(len(jobs)))
    running: Dict[Any, int] = {}
    per_host: Dict[str, int] = {}
    ac = _dask.as_completed()
    stop = False
    try:
        while pending or running:
            while pending and len(running) < parallel and not stop:
                ready = next((k for k in pending if _allowed(jobs[k], per_source, per_host)),
                             None)
                if ready is None:
                    break
                i = ready
                pending.remove(i)
                host = source_host(jobs[i].src)
                per_host[host] = per_host.get(host, 0) + 1
                future = client.submit(_run_job, jobs[i], i, run_id, limit, pure=False,
                                       retries=retries, key=f"imgcopy-{run_id}-{i}",
                                       workers=_placement(workers, jobs[i]),
                                       resources=_placement(resources, jobs[i]))
                running[future] = i
                ac.add(future)
            if stop and not running:
                break
            future = next(ac)
            if future.status not in ("finished", "error", "cancelled"):
                # done, then lost with the worker that held its result:
                # Dask runs it again, and it completes a second time
                ac.add(future)
                continue
            i = running.pop(future)
            per_host[source_host(jobs[i].src)] -= 1
            if future.status == "finished":
                results[i] = future.result()
                r = results[i]
                events.emit({"job": i, "src": jobs[i].src, "dst": jobs[i].dst, "event": "done",
                             "done_bytes": r.bytes_changed, "total_bytes": r.bytes_changed,
                             "elapsed": r.elapsed, "result": r.to_dict()})
            else:
                exc = (future.exception() if future.status == "error"
                       else Cancelled(f"job {i} was cancelled"))
                results[i] = exc
                events.emit({"job": i, "src": jobs[i].src, "dst": jobs[i].dst,
                             "event": "failed", "error": type(exc).__name__,
                             "message": str(exc)})
                if fail_fast:
                    stop = True
                    for f in list(running):
                        f.cancel()
            if events.error is not None:
                stop = True
    except KeyboardInterrupt:
        for f in list(running):
            f.cancel()
        raise
    finally:
        events.close()
    for i in pending:
        results[i] = Cancelled(f"job {i} was not started")
    for i, r in enumerate(results):
        if r is None:
            results[i] = Cancelled(f"job {i} was cancelled")
    if events.error is not None:
        raise events.error
    return results


def _allowed(job: CopyJob, per_source: PerSource, per_host: Dict[str, int]) -> bool:
    cap = _cap_of(per_source, job.src)
    return cap is None or per_host.get(source_host(job.src), 0) < cap


def convert(src: Union[str, "os.PathLike[str]"], dst: Union[str, "os.PathLike[str]"], *,
            client: Any, shard_size: Size = "1G", checksum: Union[bool, str] = True,
            create: bool = True, src_format: Optional[str] = None, dst_format: str = "raw",
            retries: int = 2, checksum_block_size: Size = 64 << 10,
            on_event: Optional[Callable[[Event], Any]] = None, **convert_keywords: Any) -> Any:
    """One big disk copied as range shards on the cluster: the source's data
    cut into shards of about ``shard_size`` bytes of data (whole checksum
    blocks, the holes between them joined to a neighbour), each a task
    ``convert(src, dst, create=False, offset=, length=, checksum=,
    verify=)`` into a raw file, block device or NBD export every worker
    reaches (``create``: a new file of the source's size is made first).
    Shards are idempotent and flushed on their own: a worker that dies has
    its shard run again elsewhere.  The coordinator combines the shards'
    block digests into the disk's blkhash (``CopyResult.checksum``, what
    ``imgcopy.checksum(src)`` gives) and, each shard having read its range
    back (``verify``), the destination's (``dst_checksum``).  A qcow2
    destination is refused: one writer allocates its clusters.  Returns a
    ``CopyResult`` with the shards' counters summed and ``shards`` (their
    ranges)."""
    from .image import Image
    from .job import CopyResult
    from .shards import combine_checksums, cut_shards

    if dst_format != "raw":
        raise ValueError(f"a sharded copy writes raw destinations (a file, a block device, an "
                         f"NBD export), not {dst_format}: one writer allocates a qcow2's clusters")
    algorithm = ("sha256" if checksum is True else checksum) if checksum else None
    block = parse_size(checksum_block_size, "checksum_block_size")
    step = parse_size(shard_size, "shard_size")
    dst_name = os.fsdecode(os.fspath(dst))
    with Image(src, src_format) as img:
        size = img.size
        data = [(e.start, e.length) for e in img.extents() if e.data and not e.zero]
    if create:
        if "://" in dst_name:
            raise ValueError("an NBD export exists already: create=False")
        with open(dst_name, "wb") as f:
            f.truncate(size)
    ranges = cut_shards(data, size, step, block)
    t0 = time.monotonic()
    jobs = [CopyJob(src, dst_name, create=False, src_format=src_format, dst_format="raw",
                    offset=off, length=n, checksum=algorithm or False,
                    checksum_block_size=block, verify=bool(algorithm), **convert_keywords)
            for off, n in ranges]
    results = copy_many(jobs, client=client, retries=retries, on_event=on_event, fail_fast=True)
    failures = [r for r in results if isinstance(r, BaseException)]
    if failures:
        raise failures[0]
    total = {name: sum(getattr(r, name) for r in results)
             for name in ("bytes_read", "bytes_written", "bytes_zeroed", "bytes_skipped",
                          "read_requests", "write_requests", "zero_requests", "extents",
                          "bytes_already_zero", "bytes_changed")}
    combined = (combine_checksums(size, results, algorithm=algorithm, block_size=block)
                if algorithm else None)
    return CopyResult(elapsed=time.monotonic() - t0, checksum=combined,
                      dst_checksum=combined, shards=list(ranges), **total)
