"""The imgcopy command line: qemu-img's flag names where they exist."""
from __future__ import annotations

import argparse
import os
import sys

from . import (cli_check, cli_checksum, cli_compare, cli_convert, cli_convert_many, cli_info,
               cli_map, cli_measure)
from .cli_common import cli_spelling, describe  # noqa: F401 (cli_spelling: the flags' spelling)
from .errors import Error
from ._interrupt import is_interrupt

TYPE_CHECKING = False  # (typing itself is not imported to start a command)
if TYPE_CHECKING:
    from typing import Any, List, Optional

# one module per command, each with register(subparsers) and run(args);
# in `imgcopy --help`'s order.  Registering imports none of what a command
# runs: its run() does, so a command imports only what it uses.
COMMANDS = (cli_map, cli_info, cli_check, cli_convert, cli_convert_many, cli_measure, cli_compare,
            cli_checksum)


def _columns() -> int:
    """The terminal's width as shutil.get_terminal_size() finds it: $COLUMNS,
    else stdout's terminal, else 80."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    stdout = sys.__stdout__
    if columns <= 0 and stdout is not None:
        try:
            columns = os.get_terminal_size(stdout.fileno()).columns
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns or 80


class _Formatter(argparse.HelpFormatter):
    """argparse's, given the width it would ask shutil for: argparse makes a
    formatter for every argument added, and shutil's import (bz2, lzma,
    fnmatch) would cost every command's start."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if len(args) < 4 and kwargs.get("width") is None:
            kwargs["width"] = _columns() - 2  # as argparse takes it
        super().__init__(*args, **kwargs)


class _Parser(argparse.ArgumentParser):
    """argparse without abbreviations: ``--target-is`` is no ``--target-is-zero``
    (an abbreviation that works today breaks when a flag sharing its prefix
    is added), and with _Formatter.  Subparsers are made of the parser's
    class, so every command gets both."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)


class VersionAction(argparse.Action):
    """``--version``: prints features.version_text() and exits (the
    libraries are looked up only then).  ``imgcopy --version`` alone is
    answered before this parser is built (_program.main()), the same way."""

    def __init__(self, option_strings: List[str], dest: str = argparse.SUPPRESS,
                 default: Any = argparse.SUPPRESS,
                 help: str = "print the version and the libraries this build has, and exit"):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: Any, values: Any,
                 option_string: Optional[str] = None) -> None:
        from .features import version_text

        print(version_text())
        parser.exit()


def command_name(command: Any) -> str:
    """The name a command module registers: cli_convert_many, convert-many."""
    return command.__name__.rpartition(".")[2][len("cli_"):].replace("_", "-")


def _build_parser(argv: Optional[List[str]] = None) -> argparse.ArgumentParser:
    """The parser of every command, or of the one `argv` starts with: then
    the top level never speaks (the command's parser answers every error and
    --help), and the others' parsers are not built (~1.5 ms of a start)."""
    first = argv[0] if argv else None
    chosen = [c for c in COMMANDS if command_name(c) == first]
    parser = _Parser(prog="imgcopy", description=__doc__)
    parser.add_argument("--version", action=VersionAction)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for command in chosen or COMMANDS:
        command.register(sub)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    """The program (argv None: sys.argv), or one command run in the caller's
    process (argv given: a test, a notebook).  Ctrl-C: ``imgcopy:
    interrupted`` and 130, whenever it comes (the program's entry,
    _program.main(), answers one that comes while this module is imported)."""
    try:
        return _main(argv)
    except BaseException as e:  # outside a command's own handling
        if not is_interrupt(e):  # (or an error it caused, as a lazy import ran)
            raise
        print("imgcopy: interrupted", file=sys.stderr)
        return 130


def _main(argv: Optional[List[str]]) -> int:
    program = argv is None
    argv = sys.argv[1:] if argv is None else argv
    # convert ignores Ctrl-C once its copy is committed.  The program keeps
    # ignoring it until it exits (restoring it would let a late Ctrl-C kill
    # a finished copy's process); a caller's process gets its handler back,
    # or the programs it starts later would inherit SIG_IGN.
    if program:
        return _run(argv, program=True)
    import signal
    import threading

    on_main_thread = threading.current_thread() is threading.main_thread()
    sigint = signal.getsignal(signal.SIGINT) if on_main_thread else None
    try:
        return _run(argv)
    finally:
        if sigint is not None:
            signal.signal(signal.SIGINT, sigint)


def _run(argv: List[str], program: bool = False) -> int:
    try:
        args, extra = _build_parser(argv).parse_known_args(argv)
        if extra:  # the command's own usage, not the top level's
            args.parser.error("unrecognized arguments: " + " ".join(extra))
        if program and getattr(args, "option_objects", False):
            # the option objects are dataclasses: this process is the
            # command's own, so they come without inspect
            from ._inspect_on_demand import import_dataclasses

            import_dataclasses()
        return args.func(args)
    except (OSError, ValueError, Error) as exc:
        print(f"imgcopy: {describe(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("imgcopy: interrupted", file=sys.stderr)
        return 130
