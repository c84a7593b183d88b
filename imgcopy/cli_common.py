"""What every command of the command line shares: sizes parsed as flags,
--member and --external-files, text written as qemu-img writes it, and an
error described with its remedies spelt as flags.  A leaf of the cli_*
modules: it imports none of them; what their registration uses imports
nothing of what the commands run (nor typing)."""
from __future__ import annotations

import argparse
import os
import sys

from .errors import ImageFormatError, describe_remedies

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict


def parse_size(text: str) -> int:
    """A byte count with an optional k/M/G/T/P/E suffix (powers of 1024)."""
    from . import sizes

    try:
        return sizes.parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


# How the CLI spells the options an error's remedies name.
_FLAGS = {"format": "-f {}", "src_format": "-f {}", "dst_format": "-O {}", "force": "--force",
          "force_share": "-U", "member": "--member {}", "src_member": "--member {}",
          "external_files": "--external-files", "src_external_files": "--external-files"}


def cli_spelling(options: Dict[str, Any]) -> str:
    return " ".join(_FLAGS[k].format(v) if k in _FLAGS else f"--{k}={v}"
                    for k, v in options.items())


def source_arguments(p: argparse.ArgumentParser, what: str, where: str) -> None:
    """--member and --external-files: where the bytes of the image read come from."""
    p.add_argument("--member", default=None, metavar="NAME",
                   help=f"{what} is member NAME of the tar archive {where} (an OVA's disk), "
                        "read in place; its backing file is another member")
    p.add_argument("--external-files", dest="external_files", action="store_true",
                   help="a vmdk descriptor may name extent files outside its directory")


def reader_arguments(p: argparse.ArgumentParser, formats: Any) -> None:
    """A command that reads one image and prints what it found, as qemu-img's does."""
    p.add_argument("-f", "--format", dest="format", choices=formats, default=None,
                   help="image format (default: probe)")
    p.add_argument("--output", choices=("human", "json"), default="human")
    p.add_argument("-U", "--force-share", dest="force_share", action="store_true",
                   help="read the image even if another process writes it")
    source_arguments(p, "the image", "FILENAME")
    p.add_argument("filename")


def write(text: str) -> None:
    """Text that names files, written as qemu-img writes it: a name's bytes
    as they are, UTF-8 or not."""
    out = getattr(sys.stdout, "buffer", None)
    if out is None:
        sys.stdout.write(text)
        return
    sys.stdout.flush()
    out.write(os.fsencode(text))
    out.flush()


def describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.filename is not None:
        reason = getattr(exc, "reason", None)
        if reason is not None:  # the C core's: its remedies spelt as flags
            return (f"{os.fsdecode(exc.filename)}: {reason}"
                    f"{describe_remedies(getattr(exc, 'remedies', []), cli_spelling)}")
        return f"{os.fsdecode(exc.filename)}: {exc.strerror}"
    if isinstance(exc, ImageFormatError):
        return exc.describe(cli_spelling)
    return str(exc)
