"""`imgcopy map`: an image's extent map, as qemu-img map prints it; with
``--bitmap NAME`` the dirty ranges of its persistent bitmap NAME."""
from __future__ import annotations

import argparse

from ._defaults import FORMATS
from .cli_common import parse_size, reader_arguments, write

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def register(subparsers: Any) -> None:
    m = subparsers.add_parser("map", help="print the extent map of an image (like qemu-img map)")
    reader_arguments(m, FORMATS)
    m.add_argument("-s", "--start-offset", type=parse_size, default=0, metavar="N")
    m.add_argument("-l", "--max-length", type=parse_size, default=None, metavar="N")
    m.add_argument("--force", action="store_true",
                   help="read a qcow2 image marked dirty or corrupt")
    m.add_argument("--bitmap", metavar="NAME", default=None,
                   help="print the ranges persistent bitmap NAME marks dirty (human) or "
                        "every range with \"dirty\": true/false (json), as nbdinfo "
                        "--map=qemu:dirty-bitmap:NAME tells them")
    m.set_defaults(func=run, parser=m)


def run(args: argparse.Namespace) -> int:
    from .image import open as open_image

    with open_image(args.filename, args.format, force=args.force,
                    force_share=args.force_share, member=args.member,
                    external_files=args.external_files) as img:
        if args.bitmap is None:
            emap = img.extents(args.start_offset, args.max_length)
        else:
            emap = img.dirty_map(args.bitmap, args.start_offset, args.max_length)
    text = emap.to_json() if args.output == "json" else emap.to_human(args.filename)
    write(text)
    return 0
