"""`imgcopy check`: qemu-img check's command line, output and exit codes."""
from __future__ import annotations

import argparse
import os
import sys

from ._defaults import FORMATS
from .cli_common import source_arguments

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("check", help="check a qcow2 image's refcounts and tables "
                                            "(like qemu-img check; read-only)")
    p.add_argument("-f", "--format", dest="format", choices=FORMATS, default=None,
                   help="image format (default: probe)")
    p.add_argument("--output", choices=("human", "json"), default="human")
    p.add_argument("-U", "--force-share", dest="force_share", action="store_true",
                   help="read the image even if another process writes it")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="print only the errors found, not the summary")
    source_arguments(p, "the image", "FILENAME")
    p.add_argument("filename")
    p.set_defaults(func=run, parser=p)


def _out(text: str, stream: Any) -> None:
    """Text as qemu-img writes it: a file name's bytes as they are."""
    buf = getattr(stream, "buffer", None)
    if buf is None:
        stream.write(text)
        return
    stream.flush()
    buf.write(os.fsencode(text))
    buf.flush()


def run(args: argparse.Namespace) -> int:
    from .check import EXIT_FAILED, EXIT_NOT_SUPPORTED, CheckFailed, check, not_supported

    try:
        result = check(args.filename, format=args.format, force_share=args.force_share,
                       member=args.member, external_files=args.external_files)
    except CheckFailed as exc:
        _out(exc.result.messages_text(), sys.stderr)
        print(f"imgcopy: Check failed: {exc.strerror}", file=sys.stderr)
        return EXIT_FAILED
    except OSError as exc:
        if not not_supported(exc):
            raise
        print("imgcopy: This image format does not support checks", file=sys.stderr)
        return EXIT_NOT_SUPPORTED
    _out(result.messages_text(), sys.stderr)
    if not args.quiet:
        _out(result.to_json() if args.output == "json" else result.to_human(), sys.stdout)
    if result.check_errors:
        print("imgcopy: Check failed", file=sys.stderr)
    return result.exit_code
