"""imgcopy.check(): qemu-img check, read-only.

The C core recomputes a qcow2 image's refcounts from every structure that
points at a host cluster and compares them with the stored ones
(csrc/drivers/qcow2_check.c); this module gives the result qemu-img's
shapes: its JSON (member order included) and its human summary."""
from __future__ import annotations

import errno as _errno
import os

from . import _core
from ._keywords import suggest_keywords
from ._records import Record
from .info import _json_text, qemu_json

TYPE_CHECKING = False  # typing's import is not paid to start a command
if TYPE_CHECKING:
    from typing import List, Optional, Union

__all__ = ["CheckResult", "check"]

# qemu-img check's exit codes
EXIT_OK, EXIT_FAILED, EXIT_CORRUPTIONS, EXIT_LEAKS, EXIT_NOT_SUPPORTED = 0, 1, 2, 3, 63

# The JSON members in the order qemu prints them (its QDict's hash buckets),
# with the fields they come from; all but check-errors are left out when 0.
_JSON_ORDER = (
    ("image-end-offset", "image_end_offset"),
    ("compressed-clusters", "compressed_clusters"),
    ("total-clusters", "total_clusters"),
    ("corruptions", "corruptions"),
    ("corruptions-fixed", "corruptions_fixed"),
    ("check-errors", "check_errors"),
    ("leaks", "leaks"),
    ("leaks-fixed", "leaks_fixed"),
    ("allocated-clusters", "allocated_clusters"),
    ("filename", "filename"),
    ("format", "format"),
    ("fragmented-clusters", "fragmented_clusters"),
)


class CheckResult(Record):
    """What qemu-img check reports, by its JSON names in snake_case.

    ``messages`` are the detail lines qemu prints on stderr while it
    checks (``ERROR ...``, ``Leaked cluster ...``).  True when the image
    is clean (``ok``).  ``member``: the tar member checked (``filename``
    is then its archive, as ``ImageInfo`` has it); not part of qemu's
    output."""

    _fields = __match_args__ = (
        "filename", "format", "check_errors", "corruptions", "leaks", "corruptions_fixed",
        "leaks_fixed", "image_end_offset", "total_clusters", "allocated_clusters",
        "fragmented_clusters", "compressed_clusters", "messages", "member")

    def __init__(self, filename: str, format: str, check_errors: int = 0,
                 corruptions: int = 0, leaks: int = 0, corruptions_fixed: int = 0,
                 leaks_fixed: int = 0, image_end_offset: int = 0, total_clusters: int = 0,
                 allocated_clusters: int = 0, fragmented_clusters: int = 0,
                 compressed_clusters: int = 0, messages: Optional[List[str]] = None,
                 member: Optional[str] = None) -> None:
        self.filename = filename
        self.format = format
        self.check_errors = check_errors
        self.corruptions = corruptions
        self.leaks = leaks
        self.corruptions_fixed = corruptions_fixed
        self.leaks_fixed = leaks_fixed
        self.image_end_offset = image_end_offset
        self.total_clusters = total_clusters
        self.allocated_clusters = allocated_clusters
        self.fragmented_clusters = fragmented_clusters
        self.compressed_clusters = compressed_clusters
        self.messages: List[str] = [] if messages is None else messages
        self.member = member

    @property
    def ok(self) -> bool:
        return not (self.corruptions or self.leaks or self.check_errors)

    def __bool__(self) -> bool:
        return self.ok

    @property
    def exit_code(self) -> int:
        """qemu-img check's exit status for this result."""
        if self.check_errors:
            return EXIT_FAILED
        if self.corruptions:
            return EXIT_CORRUPTIONS
        if self.leaks:
            return EXIT_LEAKS
        return EXIT_OK

    def to_json(self) -> str:
        """``qemu-img check --output=json``'s stdout, byte for byte."""
        import json

        members = []
        for key, attr in _JSON_ORDER:
            value = getattr(self, attr)
            if attr in ("filename", "format", "check_errors") or value:
                members.append(f"    {json.dumps(key)}: {_json_value(value)}")
        return "{\n" + ",\n".join(members) + "\n}\n"

    def messages_text(self) -> str:
        """What qemu-img check prints on stderr before its summary."""
        return "".join(line + "\n" for line in self.messages)

    def to_human(self) -> str:
        """``qemu-img check``'s stdout (the summary), byte for byte."""
        out = []
        if self.ok:
            out.append("No errors were found on the image.\n")
        else:
            if self.corruptions:
                out.append(f"\n{self.corruptions} errors were found on the image.\n"
                           "Data may be corrupted, or further writes to the image may "
                           "corrupt it.\n")
            if self.leaks:
                out.append(f"\n{self.leaks} leaked clusters were found on the image.\n"
                           "This means waste of disk space, but no harm to data.\n")
            if self.check_errors:
                out.append(f"\n{self.check_errors} internal errors have occurred during "
                           "the check.\n")
        if self.total_clusters and self.allocated_clusters:
            alloc = self.allocated_clusters
            out.append(f"{alloc}/{self.total_clusters} = "
                       f"{alloc * 100.0 / self.total_clusters:0.2f}% allocated, "
                       f"{self.fragmented_clusters * 100.0 / alloc:0.2f}% fragmented, "
                       f"{self.compressed_clusters * 100.0 / alloc:0.2f}% compressed clusters\n")
        if self.image_end_offset:
            out.append(f"Image end offset: {self.image_end_offset}\n")
        return "".join(out)


def _json_value(value: Union[int, str]) -> str:
    if isinstance(value, str):  # escaped as qemu escapes (info's JSON)
        return qemu_json(_json_text(value))
    return str(value)


class CheckFailed(OSError):
    """qemu-img check could not complete ("Check failed: <reason>").
    ``result`` holds what it found before it stopped."""

    result: CheckResult


@suggest_keywords
def check(path: Union[str, "os.PathLike[str]"], *, format: Optional[str] = None,
          force_share: bool = False, member: Optional[str] = None,
          external_files: bool = False) -> CheckResult:
    """Check an image's consistency, as ``qemu-img check`` (without ``-r``).

    qcow2 only, as in qemu: other formats raise ``OSError`` with errno
    ENOTSUP ("This image format does not support checks"; the CLI exits
    63).  A check that cannot complete raises :class:`CheckFailed` (an
    OSError) carrying the partial result.  Dirty and corrupt-flagged images
    are checked (read-only), as qemu-img check does.  ``member``: the image
    is this member of the tar archive at ``path`` (an OVA's disk), read in
    place; ``external_files``: a vmdk descriptor may name extent files
    outside its directory (both as for ``open()``)."""
    if member is not None and not isinstance(member, str):
        raise TypeError(f"member must be a str or None, not {type(member).__name__}")
    filename = os.fspath(path)
    raw = _core.check(path, format, force_share=force_share, member=member,
                      external_files=external_files)
    text = raw["messages"].decode("utf-8", "surrogateescape")
    failed = raw["failed_errno"]
    counters = {k: v for k, v in raw.items() if k not in ("messages", "failed_errno")}
    result = CheckResult(filename=os.fsdecode(filename), messages=text.splitlines(),
                         member=member, **counters)  # type: ignore[arg-type]
    if failed:
        exc = CheckFailed(failed, os.strerror(failed), os.fsdecode(filename))
        exc.result = result
        raise exc
    return result


def not_supported(exc: BaseException) -> bool:
    """Whether an error of check() is the format's lack of a checker."""
    return isinstance(exc, OSError) and exc.errno == _errno.ENOTSUP \
        and not isinstance(exc, CheckFailed)
