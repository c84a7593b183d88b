"""The imgcopy command line: qemu-img's flag names where they exist."""
from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional

from . import _core
from .image import FORMATS, open as open_image

_SUFFIXES = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40,
             "p": 1 << 50, "e": 1 << 60}


def parse_size(text: str) -> int:
    """A byte count with an optional k/M/G/T/P/E suffix (powers of 1024)."""
    t = text.strip().lower()
    unit = t[-1:] if t[-1:] in _SUFFIXES and not t[-1:].isdigit() else ""
    number = t[: len(t) - len(unit)]
    try:
        value = float(number) if "." in number else int(number, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid size {text!r}") from None
    result = int(value * _SUFFIXES[unit])
    if result < 0:
        raise argparse.ArgumentTypeError(f"size must not be negative: {text!r}")
    return result


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="imgcopy", description=__doc__)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    m = sub.add_parser("map", help="print the extent map of an image (like qemu-img map)")
    m.add_argument("-f", "--format", dest="format", choices=FORMATS, default=None,
                   help="image format (default: probe)")
    m.add_argument("--output", choices=("human", "json"), default="human")
    m.add_argument("-s", "--start-offset", type=parse_size, default=0, metavar="N")
    m.add_argument("-l", "--max-length", type=parse_size, default=None, metavar="N")
    m.add_argument("filename")
    m.set_defaults(func=_cmd_map)
    return parser


def _cmd_map(args: argparse.Namespace) -> int:
    with open_image(args.filename, args.format) as img:
        emap = img.extents(args.start_offset, args.max_length)
    text = emap.to_json() if args.output == "json" else emap.to_human(args.filename)
    sys.stdout.write(text)
    return 0


def _describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.filename is not None:
        return f"{os.fsdecode(exc.filename)}: {exc.strerror}"
    return str(exc)


def main(argv: Optional[List[str]] = None) -> int:
    args = _build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (OSError, ValueError, _core.Error) as exc:
        print(f"imgcopy: {_describe(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("imgcopy: interrupted", file=sys.stderr)
        return 130
