"""``imgcopy measure``: qemu-img measure's options, messages and exit codes.

Its arguments are read as qemu-img reads them (GNU getopt: options and the
file name in any order, ``-Oqcow2``, ``--output json``), in order, each
error reported when qemu-img would report it."""
from __future__ import annotations

import argparse
import os
import sys

from ._defaults import FORMATS
from .cli_common import cli_spelling
from .errors import ImageFormatError, describe_remedies

TYPE_CHECKING = False
if TYPE_CHECKING:
    import getopt
    from typing import Any, List, Optional

    from .image import Image

USAGE = ("usage: imgcopy measure [--output=human|json] [-O OUTPUT_FMT] [-o OPTIONS]\n"
         "                       [--size N | [-f FMT] [-U] [--member NAME] [--external-files]\n"
         "                       FILENAME]\n")

HELP = USAGE + """
How large a new image would be (like qemu-img measure): the bytes a new
OUTPUT_FMT image (raw or qcow2, default raw) needs for FILENAME's data
("required size") and with every cluster allocated ("fully allocated size"),
from FILENAME's extent map; or for an empty image of N bytes (--size N).

  -f FMT            FILENAME's format (default: probe)
  -O OUTPUT_FMT     raw or qcow2 (default raw)
  -o OPTIONS        creation options, e.g. cluster_size=64k,compat=1.1,
                    preallocation=off|metadata|falloc|full,refcount_bits=16,
                    extended_l2=on|off,backing_file=NAME (may be repeated)
  --size N          an empty image of N bytes (k, M, G, T, P, E suffixes)
  --output FMT      human (default) or json
  -U, --force-share read FILENAME even if another process writes it
  --member NAME     FILENAME is a tar archive (an OVA): measure its member NAME,
                    read in place
  --external-files  a vmdk descriptor may name extent files outside its
                    directory
  -h, --help        show this help
"""

_SHORT = "hf:O:o:l:U"
_LONG = ["help", "image-opts", "object=", "output=", "size=", "force-share", "member=",
         "external-files"]


def register(subparsers: Any) -> None:
    """Add the measure command to the CLI's subparsers.  Its arguments are
    handed over untouched (argparse takes none of them as options)."""
    p = subparsers.add_parser("measure", help="how large a new raw or qcow2 image would be "
                                              "(like qemu-img measure)",
                       add_help=False, prefix_chars="\x01")
    p.add_argument("argv", nargs=argparse.REMAINDER)
    p.set_defaults(func=run, parser=p, option_objects=True)


def _report(*lines: str) -> None:
    for line in lines:
        print(f"imgcopy: {line}", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    from .measure_options import MeasureError

    try:
        return _run(list(args.argv))
    except MeasureError as exc:
        _report(*exc.reports)
        return 1


def _run(argv: List[str]) -> int:
    import getopt

    from .measure import Qcow2Target, measure_image, measure_size
    from .measure_options import (MeasureError, check_output_format, parse_image_size,
                                  split_options, typed_options, valid_option_list)

    try:
        opts, rest = getopt.gnu_getopt(argv, _SHORT, _LONG)
    except getopt.GetoptError as exc:
        print(f"imgcopy measure: {_getopt_message(exc)}\n{USAGE}"
              "Try 'imgcopy measure --help' for more information.", file=sys.stderr)
        return 1
    output = "human"
    fmt: Optional[str] = None
    out_fmt = "raw"
    options: Optional[str] = None
    size: Optional[int] = None
    snapshot = False
    force_share = False
    member: Optional[str] = None
    external_files = False
    warnings: List[str] = []
    for flag, value in opts:
        if flag in ("-h", "--help"):
            sys.stdout.write(HELP)
            return 0
        if flag == "-f":
            fmt = value
        elif flag == "-O":
            out_fmt = value
        elif flag == "-o":
            if not valid_option_list(value):
                raise MeasureError(f"Invalid option list: {value}")
            options = value if options is None else f"{options},{value}"
        elif flag == "-l":
            snapshot = True
        elif flag in ("-U", "--force-share"):
            force_share = True
        elif flag == "--member":
            member = value
        elif flag == "--external-files":
            external_files = True
        elif flag == "--output":
            if value not in ("json", "human"):
                raise MeasureError("--output must be used with human or json as argument.")
            output = value
        elif flag == "--size":
            size = parse_image_size(value, warnings)
            _report(*warnings)
            warnings.clear()
        else:  # --object, --image-opts
            raise MeasureError(f"{flag} is not supported by imgcopy")
    if len(rest) > 1:
        raise MeasureError("At most one filename argument is allowed.")
    filename = rest[0] if rest else None
    if filename is None and (fmt is not None or snapshot):
        raise MeasureError("--image-opts, -f, and -l require a filename argument.")
    if filename is None and member is not None:
        raise MeasureError("--member requires a filename argument.")
    if filename is not None and size is not None:
        raise MeasureError("--size N cannot be used together with a filename.")
    if filename is None and size is None:
        raise MeasureError("Either --size N or one filename must be specified.")
    if snapshot:
        raise MeasureError("-l: measuring an internal snapshot is not supported by imgcopy")

    img = _open(filename, fmt, force_share, member, external_files) \
        if filename is not None else None
    try:
        check_output_format(out_fmt)
        typed = typed_options(out_fmt, split_options(options)) if options else {}
        target = Qcow2Target.from_options(typed) if out_fmt == "qcow2" else None
        if img is not None:
            result = measure_image(img, target)
        elif size is not None:
            result = measure_size(size, target)
        else:  # refused above
            raise MeasureError("Either --size N or one filename must be specified.")
    finally:
        if img is not None:
            img.close()
    sys.stdout.write(result.to_json() if output == "json" else result.to_human())
    return 0


def _getopt_message(exc: getopt.GetoptError) -> str:
    opt = exc.opt
    if "requires argument" in exc.msg:
        return f"option requires an argument -- '{opt}'" if len(opt) == 1 else \
            f"option '--{opt}' requires an argument"
    if len(opt) == 1:
        return f"invalid option -- '{opt}'"
    return f"unrecognized option '--{opt}'"


def _open(filename: str, fmt: Optional[str], force_share: bool, member: Optional[str] = None,
          external_files: bool = False) -> Image:
    """The source, or qemu-img's "Could not open" report (a member named
    ``archive/member``)."""
    from .image import Image, display_name
    from .measure_options import QEMU_FORMATS, MeasureError

    path = filename
    filename = display_name(path, member)
    if fmt is not None and fmt not in FORMATS:
        if fmt in QEMU_FORMATS:
            raise MeasureError(f"Could not open '{filename}': imgcopy does not read {fmt} "
                               f"images (it reads {', '.join(FORMATS)})")
        raise MeasureError(f"Could not open '{filename}': Unknown driver '{fmt}'")
    try:
        return Image(path, fmt, force_share=force_share, member=member,
                     external_files=external_files)
    except BlockingIOError as exc:  # another process writes it (qemu's locks)
        locked = os.fsdecode(exc.filename) if exc.filename is not None else filename
        raise MeasureError(f"Could not open '{filename}': Failed to get shared \"write\" lock\n"
                           f"Is another process using the image [{locked}]?") from None
    except OSError as exc:
        reason = os.strerror(exc.errno) if exc.errno else (exc.strerror or str(exc))
        raise MeasureError(f"Could not open '{filename}': Could not open '{path}': "
                           f"{reason}") from None
    except ImageFormatError as exc:  # remedies spelt as flags (--member NAME)
        raise MeasureError(f"Could not open '{filename}': {exc.reason}"
                           f"{describe_remedies(exc.remedies, cli_spelling)}") from None
    except ValueError as exc:  # a member that is not there
        raise MeasureError(f"Could not open '{filename}': {exc}") from None
