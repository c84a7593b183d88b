"""`imgcopy info`: an image's format, sizes and backing file, as qemu-img
info prints them."""
from __future__ import annotations

import argparse

from ._defaults import FORMATS
from .cli_common import reader_arguments, write

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def register(subparsers: Any) -> None:
    i = subparsers.add_parser("info", help="show an image's format, sizes, cluster size and "
                                           "backing file (like qemu-img info)")
    reader_arguments(i, FORMATS)
    i.add_argument("--backing-chain", action="store_true",
                   help="show every image of the backing chain")
    i.set_defaults(func=run, parser=i)


def run(args: argparse.Namespace) -> int:
    from .info import chain_to_human, chain_to_json, info, info_chain

    if args.backing_chain:
        infos = info_chain(args.filename, args.format, force_share=args.force_share,
                           member=args.member, external_files=args.external_files)
        text = chain_to_json(infos) if args.output == "json" else chain_to_human(infos)
    else:
        one = info(args.filename, args.format, force_share=args.force_share,
                   member=args.member, external_files=args.external_files)
        text = one.to_json() if args.output == "json" else one.to_human()
    write(text)
    return 0
