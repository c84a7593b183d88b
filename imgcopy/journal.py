"""A resumable copy's journal, as convert(journal=PATH) keeps it: what
names a copy (so that a journal is never applied to another one), where a
new destination lives until it is complete, and what is left to copy.

The journal itself (its file format, durability, damage) is the C core's
(csrc/journal.h); the engine records in it (csrc/copy_checkpoint.c)."""
from __future__ import annotations

import errno
import hashlib
import os
from array import array

from ._defaults import JOURNAL_INTERVAL
from .sizes import parse_size

TYPE_CHECKING = False  # typing's import is not paid to start a command
if TYPE_CHECKING:
    from typing import Any, Iterable, List, Optional, Tuple

DEFAULT_INTERVAL = JOURNAL_INTERVAL  # seconds between checkpoints


def parse_interval(value: Any) -> Tuple[int, int]:
    """``journal_interval``: seconds (a number above 0), or a size ("256M":
    a checkpoint once that much more is done, and every 5 s at the
    latest), as (milliseconds, bytes)."""
    if isinstance(value, bool):
        raise TypeError("journal_interval is seconds or a size, not a bool")
    if isinstance(value, (int, float)):
        if not value > 0 or value > 86400:
            raise ValueError(f"journal_interval must be above 0 and at most a day of "
                             f"seconds, not {value!r}")
        return max(1, round(value * 1000)), 0
    if isinstance(value, str):
        nbytes = parse_size(value, "journal_interval")
        if nbytes <= 0:
            raise ValueError(f"journal_interval must be above 0 bytes, not {value!r}")
        return round(DEFAULT_INTERVAL * 1000), nbytes
    raise TypeError(f"journal_interval is seconds or a size, not {type(value).__name__}")


def _file_identity(path: str, with_mtime: bool) -> str:
    st = os.stat(path)
    text = f"{os.path.realpath(path)} dev={st.st_dev} ino={st.st_ino}"
    if with_mtime:  # a source that changed since is another source
        text += f" mtime={st.st_mtime_ns}"
    return text


def source_identity(src: str, fmt: str, size: int, member: Optional[str]) -> str:
    """What the source is: its format, file (or URI), size and member."""
    where = src if "://" in src else _file_identity(src, with_mtime=True)
    text = f"{fmt}:{where} size={size}"
    return text + (f" member={member}" if member is not None else "")


def destination_identity(dst: str, fmt: str, create: bool) -> str:
    """What the destination is: a new file (by its final path), or an
    existing image (its file, not its changing contents)."""
    if "://" in dst:
        return f"{fmt}:{dst}"
    if create:
        return f"{fmt}:{os.path.realpath(dst)} new"
    return f"{fmt}:{_file_identity(dst, with_mtime=False)}"


def options_text(**options: Any) -> str:
    """The options that change the output, canonical (sorted name=value);
    a changed-ranges list by its digest."""
    parts = []
    for name in sorted(options):
        value = options[name]
        if isinstance(value, (bytes, bytearray)):
            value = "sha256:" + hashlib.sha256(value).hexdigest()
        elif isinstance(value, dict):
            value = "{" + ",".join(f"{k}={value[k]!r}" for k in sorted(value)) + "}"
        parts.append(f"{name}={value!r}" if isinstance(value, str) else f"{name}={value}")
    return " ".join(parts)


def partial_path(dst: str, journal: str) -> str:
    """A new destination's file until it is complete: beside ``dst`` (the
    rename stays in one file system), named from the journal, so that
    another journal's copy to the same path never takes it."""
    head, tail = os.path.split(os.path.abspath(dst))
    return os.path.join(head, f".{tail}.{os.path.basename(journal)}.partial")


def _unpack(packed: bytes) -> List[Tuple[int, int]]:
    a = array("Q")
    a.frombytes(packed)
    return [(a[i], a[i + 1]) for i in range(0, len(a), 2)]


def recorded_bytes(done: bytes) -> int:
    """The bytes the recorded ranges hold."""
    return sum(length for _, length in _unpack(done))


def covers(done: bytes, size: int) -> bool:
    """Whether the recorded ranges (sorted, merged) are the whole copy."""
    ranges = _unpack(done)
    return size == 0 or (len(ranges) == 1 and ranges[0] == (0, size))


def remaining(done: bytes, size: int, changed: Optional[bytes]) -> Tuple[bytes, int]:
    """What is left to copy: ``changed`` (or the whole source) less the
    recorded ranges, packed as changed= takes it, and its bytes."""
    wanted: Iterable[Tuple[int, int]]
    wanted = _merge(_unpack(changed)) if changed is not None else [(0, size)]
    skip = _unpack(done)
    out = array("Q")
    total, j = 0, 0
    for off, length in wanted:
        end = min(off + length, size)
        while j < len(skip) and skip[j][0] + skip[j][1] <= off:
            j += 1
        k = j
        while off < end:
            if k < len(skip) and skip[k][0] < end:
                s_off, s_end = skip[k][0], skip[k][0] + skip[k][1]
                if s_off > off:
                    out.extend((off, s_off - off))
                    total += s_off - off
                off = max(off, s_end)
                k += 1
            else:
                out.extend((off, end - off))
                total += end - off
                off = end
    return out.tobytes(), total


def _merge(ranges: List[Tuple[int, int]]) -> List[Tuple[int, int]]:
    merged: List[Tuple[int, int]] = []
    for off, length in sorted(r for r in ranges if r[1]):
        if merged and off <= merged[-1][0] + merged[-1][1]:
            last_off, last_len = merged[-1]
            merged[-1] = (last_off, max(last_len, off + length - last_off))
        else:
            merged.append((off, length))
    return merged


def fsync_directory(path: str) -> None:
    """A rename in ``path``'s directory made durable (where the file system
    can sync a directory)."""
    fd = os.open(os.path.dirname(os.path.abspath(path)) or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno != errno.EINVAL:  # a file system that cannot sync a directory
            raise
    finally:
        os.close(fd)
