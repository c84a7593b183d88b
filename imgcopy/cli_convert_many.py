"""`imgcopy convert-many JOBS.json`: a fleet of copies in one command
(copy_many()), its progress as JSON lines for dashboards, or a summary
table on a terminal."""
from __future__ import annotations

import argparse
import sys

from .cli_common import parse_size, write

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List

    from .fleet import CopyJob


def register(subparsers: Any) -> None:
    c = subparsers.add_parser(
        "convert-many", help="copy many disks at once under shared caps (JOBS.json: "
                             '[{"src": ..., "dst": ..., convert() keywords...}, ...])')
    c.add_argument("jobs", metavar="JOBS.json",
                   help="a JSON list of jobs: objects with src, dst and any keyword "
                        "imgcopy.convert() takes (dst_format, sparse_threshold, ...)")
    c.add_argument("--max-parallel", type=int, default=4, metavar="N",
                   help="disks copied at once (default 4)")
    c.add_argument("--per-source", action="append", default=[], metavar="SOURCE=N",
                   help="at most N jobs at once from this source's server (an NBD URI, "
                        "e.g. nbd://esx1=2); repeatable")
    c.add_argument("--memory-limit", type=parse_size, default=None, metavar="SIZE",
                   help="a hard cap on all copies' buffers and bytes in flight")
    c.add_argument("--fail-fast", action="store_true",
                   help="stop every job when one fails")
    c.add_argument("--events", choices=("json",), default=None,
                   help="print every event (start, progress, done, failed) as a JSON "
                        "object per line on stdout")
    c.set_defaults(func=run, parser=c, option_objects=True)


def _load_jobs(path: str) -> List[CopyJob]:
    import json

    from .fleet import CopyJob

    try:
        with open(path, "rb") as f:
            specs = json.load(f)
    except OSError as e:
        raise OSError(e.errno, f"convert-many: {e.strerror}", path) from None
    except ValueError as e:
        raise ValueError(f"{path}: not JSON: {e}") from None
    if not isinstance(specs, list):
        raise ValueError(f"{path}: expected a list of jobs")
    jobs = []
    for i, spec in enumerate(specs):
        if not isinstance(spec, dict) or "src" not in spec or "dst" not in spec:
            raise ValueError(f"{path}: job {i} needs src and dst")
        spec = dict(spec)
        try:
            jobs.append(CopyJob(spec.pop("src"), spec.pop("dst"), **spec))
        except TypeError as e:
            raise ValueError(f"{path}: job {i}: {e}") from None
    return jobs


def _per_source(specs: List[str]) -> Dict[str, int]:
    caps = {}
    for spec in specs:
        source, sep, count = spec.rpartition("=")
        if not sep or not source or not count.isdigit() or int(count) < 1:
            raise ValueError(f"--per-source {spec!r}: expected SOURCE=N, N from 1")
        caps[source] = int(count)
    return caps


def run(args: argparse.Namespace) -> int:
    import json

    from .fleet import copy_many

    jobs = _load_jobs(args.jobs)
    as_json = args.events == "json"

    def on_event(event: Dict[str, Any]) -> None:
        if as_json:
            write(json.dumps(event, sort_keys=True) + "\n")
            sys.stdout.flush()

    results = copy_many(jobs, max_parallel=args.max_parallel,
                        per_source=_per_source(args.per_source) or None,
                        memory_limit=args.memory_limit, on_event=on_event,
                        fail_fast=args.fail_fast)
    failed = [r for r in results if isinstance(r, BaseException)]
    if not as_json:
        _summary(jobs, results)
    for i, r in enumerate(results):
        if isinstance(r, BaseException):
            print(f"imgcopy: job {i} ({jobs[i].src} -> {jobs[i].dst}): "
                  f"{type(r).__name__}: {r}", file=sys.stderr)
    return 1 if failed else 0


def _summary(jobs: List[CopyJob], results: List[Any]) -> None:
    from .sizes import human_size

    rows = [("job", "source", "destination", "result", "written", "seconds")]
    for i, (job, r) in enumerate(zip(jobs, results)):
        if isinstance(r, BaseException):
            rows.append((str(i), job.src, job.dst, type(r).__name__, "", ""))
        else:
            rows.append((str(i), job.src, job.dst, "ok", human_size(r.bytes_written),
                         f"{r.elapsed:.2f}"))
    widths = [max(len(row[k]) for row in rows) for k in range(len(rows[0]))]
    for row in rows:
        write("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() + "\n")
