"""`imgcopy checksum`: blksum's output for any readable image."""
from __future__ import annotations

import argparse
import sys
from typing import Any

from .checksum import DEFAULT_ALGORITHM, DEFAULT_BLOCK_SIZE, checksum, checksum_algorithms
from .image import FORMATS
from .progress import QemuProgress


def add_parser(sub: Any, parse_size: Any) -> None:
    p = sub.add_parser("checksum", help="print the blkhash checksum of images (like blksum)")
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
    p.add_argument("filenames", nargs="*", metavar="FILE")
    p.set_defaults(func=run, parser=p)


def run(args: argparse.Namespace) -> int:
    """One line per file, `<hex>  <file>`, as blksum prints; a file that
    fails gets a message on stderr and the exit status 1."""
    from .cli import _describe, _write
    if args.list_digests:
        _write("".join(name + "\n" for name in checksum_algorithms()))
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
                              force_share=args.force_share)
            if bar is not None:
                bar.finish()
        except (OSError, ValueError) as exc:
            if bar is not None:
                bar.close()  # the line ends before the error
            print(f"imgcopy: {_describe(exc)}", file=sys.stderr)
            status = 1
            continue
        finally:
            if bar is not None:
                bar.close()
        _write(f"{digest}  {name}\n")
    return status


def add_convert_arguments(c: argparse.ArgumentParser, parse_size: Any) -> None:
    """convert's --checksum[=ALG], --checksum-block-size and --verify."""
    c.add_argument("--checksum", nargs="?", const=DEFAULT_ALGORITHM, default=None,
                   metavar="ALG", help="print the source's blkhash checksum, computed from "
                                       f"what the copy reads (default {DEFAULT_ALGORITHM})")
    c.add_argument("--checksum-block-size", type=parse_size, default=DEFAULT_BLOCK_SIZE,
                   metavar="N", help="blkhash block size (default 64k)")
    c.add_argument("--verify", action="store_true",
                   help="read the destination back after the copy and fail unless its "
                        "checksum is the source's")


def convert_keywords(args: argparse.Namespace) -> dict:
    return {"checksum": args.checksum, "checksum_block_size": args.checksum_block_size,
            "verify": args.verify}


def print_convert_checksum(args: argparse.Namespace, result: Any) -> None:
    """`<hex>  <source>` as `imgcopy checksum SOURCE` prints it."""
    from .cli import _write
    if result is not None and result.checksum is not None:
        _write(f"{result.checksum}  {args.source}\n")
