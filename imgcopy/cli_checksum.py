"""`imgcopy checksum`: blksum's output for any readable image."""
from __future__ import annotations

import argparse
import sys

from ._defaults import DEFAULT_ALGORITHM, DEFAULT_BLOCK_SIZE, FORMATS
from .cli_common import describe, parse_size, source_arguments, write

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("checksum", help="print the blkhash checksum of images (like blksum)")
    p.add_argument("-f", "--format", dest="format", choices=FORMATS, default=None,
                   help="image format (default: probe)")
    p.add_argument("-a", "--algorithm", "-d", "--digest", dest="algorithm",
                   default=DEFAULT_ALGORITHM, metavar="ALG",
                   help=f"digest: a hashlib or OpenSSL name (default {DEFAULT_ALGORITHM})")
    p.add_argument("--block-size", type=parse_size, default=DEFAULT_BLOCK_SIZE, metavar="N",
                   help="blkhash block size (default 64k; changes the value)")
    p.add_argument("-t", "--threads", type=int, default=None, metavar="N",
                   help="hashing threads (default 4; does not change the value)")
    p.add_argument("-U", "--force-share", dest="force_share", action="store_true",
                   help="read the image even if another process writes it")
    p.add_argument("-p", "--progress", action="store_true",
                   help="show progress as qemu-img does (a bar too on a terminal)")
    p.add_argument("-l", "--list-digests", action="store_true",
                   help="list the algorithms and exit")
    source_arguments(p, "each image", "FILE")
    p.add_argument("filenames", nargs="*", metavar="FILE")
    p.set_defaults(func=run, parser=p)


def run(args: argparse.Namespace) -> int:
    """One line per file, `<hex>  <file>`, as blksum prints (with --member,
    `<hex>  <archive>/<member>`); a file that fails gets a message on stderr
    and the exit status 1."""
    from .checksum import checksum, checksum_algorithms
    from .image import display_name
    from .progress import QemuProgress

    if args.list_digests:
        write("".join(name + "\n" for name in checksum_algorithms()))
        return 0
    if not args.filenames:
        args.parser.error("the following arguments are required: FILE")
    status = 0
    for name in args.filenames:
        bar = QemuProgress() if args.progress else None  # convert -p's, per file
        try:
            if bar is not None:
                bar.start()
            digest = checksum(name, args.algorithm, args.block_size, format=args.format,
                              threads=args.threads, progress=bar,
                              force_share=args.force_share, member=args.member,
                              external_files=args.external_files)
            if bar is not None:
                bar.finish()
        except (OSError, ValueError) as exc:
            if bar is not None:
                bar.close()  # the line ends before the error
            print(f"imgcopy: {describe(exc)}", file=sys.stderr)
            status = 1
            continue
        finally:
            if bar is not None:
                bar.close()
        write(f"{digest}  {display_name(name, args.member)}\n")
    return status

