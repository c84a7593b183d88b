"""The imgcopy command line: qemu-img's flag names where they exist."""
from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Any, List, Optional

from . import (cli_check, cli_checksum, cli_compare, cli_convert, cli_convert_many, cli_info,
               cli_map, cli_measure)
from .cli_common import cli_spelling, describe  # noqa: F401 (cli_spelling: the flags' spelling)
from .errors import Error
from .features import VersionAction

# one module per command, each with register(subparsers) and run(args);
# in `imgcopy --help`'s order
COMMANDS = (cli_map, cli_info, cli_check, cli_convert, cli_convert_many, cli_measure, cli_compare,
            cli_checksum)


class _Parser(argparse.ArgumentParser):
    """argparse without abbreviations: ``--target-is`` is no ``--target-is-zero``
    (an abbreviation that works today breaks when a flag sharing its prefix
    is added).  Subparsers are made of the parser's class, so every command
    gets it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="imgcopy", description=__doc__)
    parser.add_argument("--version", action=VersionAction)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for command in COMMANDS:
        command.register(sub)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    """The program (argv None: sys.argv), or one command run in the caller's
    process (argv given: a test, a notebook).  Ctrl-C: ``imgcopy:
    interrupted`` and 130, whenever it comes (the program's entry,
    _program.main(), answers one that comes while this module is imported)."""
    try:
        return _main(argv)
    except KeyboardInterrupt:  # outside a command's own handling
        print("imgcopy: interrupted", file=sys.stderr)
        return 130


def _main(argv: Optional[List[str]]) -> int:
    program = argv is None
    argv = sys.argv[1:] if argv is None else argv
    # convert ignores Ctrl-C once its copy is committed.  The program keeps
    # ignoring it until it exits (restoring it would let a late Ctrl-C kill
    # a finished copy's process); a caller's process gets its handler back,
    # or the programs it starts later would inherit SIG_IGN.
    on_main_thread = threading.current_thread() is threading.main_thread()
    sigint = signal.getsignal(signal.SIGINT) if on_main_thread and not program else None
    try:
        return _run(argv)
    finally:
        if sigint is not None:
            signal.signal(signal.SIGINT, sigint)


def _run(argv: List[str]) -> int:
    try:
        args, extra = _build_parser().parse_known_args(argv)
        if extra:  # the command's own usage, not the top level's
            args.parser.error("unrecognized arguments: " + " ".join(extra))
        return args.func(args)
    except (OSError, ValueError, Error) as exc:
        print(f"imgcopy: {describe(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("imgcopy: interrupted", file=sys.stderr)
        return 130
