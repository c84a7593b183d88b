"""imgcopy's exceptions.  I/O failures are ``OSError`` (with ``errno`` and
``filename``); what is wrong with an image is ``ImageFormatError``, which
may carry remedies: options that make the call work, spelt the Python way
in ``str(exc)`` and the command line's way by the CLI."""
from __future__ import annotations

from collections import namedtuple

# The C core imports this module: every command does, ``--version`` too, so
# it does without typing (whose NamedTuple would cost the import of it).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Union

    class Remedy(NamedTuple):
        options: Dict[str, Any]
        purpose: str
else:
    Remedy = namedtuple("Remedy", ["options", "purpose"])
Remedy.__doc__ = """Options that make a refused call work, and what they do: ``options``,
keyword arguments (e.g. {"format": "raw"}); ``purpose``, e.g. "to read the
file as raw bytes"."""


# Remedy codes of the C core (csrc/error.h, enum ic_remedy).
CORE_REMEDIES = {
    "as_raw": Remedy({"format": "raw"}, "to read the file as raw bytes"),
    "force": Remedy({"force": True}, "to read it anyway, read-only"),
    "force_share": Remedy({"force_share": True}, "to read it anyway"),
}


def core_remedies(code: str) -> List[Remedy]:
    """The remedies a code of the C core stands for: "as_raw", ..., or
    "member:NAME" (a tar archive: read its member NAME, or its bytes)."""
    kind, _, arg = code.partition(":")
    if kind == "member":
        return [Remedy({"member": arg}, "to read that disk of the archive"),
                Remedy({"format": "raw"}, "to read the archive's own bytes")]
    return [CORE_REMEDIES[code]] if code in CORE_REMEDIES else []


def python_spelling(options: Dict[str, Any]) -> str:
    """format="raw", force=True"""
    return ", ".join(f'{key}="{value}"' if isinstance(value, str) else f"{key}={value!r}"
                     for key, value in options.items())


class Error(Exception):
    """Base class of imgcopy's own errors."""


class ImageFormatError(Error, ValueError):
    """The image is corrupt, or uses a feature or format imgcopy lacks.

    ``reason`` says what is wrong, ``filename`` names the image (or None),
    ``remedies`` lists options that would make the call work."""

    def __init__(self, reason: str, filename: Optional[str] = None,
                 remedies: Union[str, Sequence[Remedy], None] = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.filename = filename
        if isinstance(remedies, str):   # a code from the C core
            remedies = core_remedies(remedies)
        self.remedies: List[Remedy] = list(remedies or ())

    def describe(self, spell: Callable[[Dict[str, Any]], str] = python_spelling) -> str:
        """The message, with each remedy's options spelt by ``spell``."""
        text = f"{self.filename}: {self.reason}" if self.filename else self.reason
        return text + describe_remedies(self.remedies, spell)

    def __str__(self) -> str:
        return self.describe()

    def renamed(self, names: Dict[str, str]) -> "ImageFormatError":
        """The same error with remedy options renamed (an image's `format`
        is convert()'s `src_format`)."""
        self.remedies = [Remedy({names.get(k, k): v for k, v in r.options.items()}, r.purpose)
                         for r in self.remedies]
        return self

    def __reduce__(self) -> Any:
        return (type(self), (self.reason, self.filename, self.remedies))


def describe_remedies(remedies: Sequence[Remedy],
                      spell: Callable[[Dict[str, Any]], str] = python_spelling) -> str:
    """" (pass OPTIONS PURPOSE, or ...)", or "" without remedies."""
    hints = [f"{spell(r.options)} {r.purpose}" for r in remedies]
    return " (pass " + ", or ".join(hints) + ")" if hints else ""


def os_error(errnum: int, reason: str, filename: Optional[str],
             remedy: Optional[str] = None) -> OSError:
    """An OSError of the C core (the subclass its errno selects), with
    ``.reason`` and ``.remedies`` as ImageFormatError has them."""
    remedies = [CORE_REMEDIES[remedy]] if remedy in CORE_REMEDIES else []
    exc = OSError(errnum, reason + describe_remedies(remedies), filename)
    exc.reason = reason  # type: ignore[attr-defined]
    exc.remedies = remedies  # type: ignore[attr-defined]
    return exc
