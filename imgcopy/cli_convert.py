"""`imgcopy convert`: qemu-img convert's flags, and imgcopy's own (--checksum,
--verify, --stats, ...), handed to convert()."""
from __future__ import annotations

import argparse
import sys

from ._defaults import (COPY_DEFAULTS, DEFAULT_ALGORITHM, DEFAULT_BLOCK_SIZE, DEST_FORMATS,
                        FORMATS, JOURNAL_INTERVAL)
from .cli_common import parse_size, source_arguments, write

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, List, Optional

    from .options import CopyOptions, Qcow2Options
    from .progress import QemuProgress


def register(subparsers: Any) -> None:
    c = subparsers.add_parser("convert", help="copy an image, moving only what matters "
                                              "(like qemu-img convert)")
    c.add_argument("-f", dest="src_format", choices=FORMATS, default=None,
                   help="source format (default: probe)")
    c.add_argument("-O", dest="dst_format", choices=DEST_FORMATS, default=None,
                   help="destination format (default: raw; with -n, an existing destination "
                        "that is not raw must be named)")
    c.add_argument("--force", action="store_true",
                   help="read a qcow2 source marked dirty or corrupt")
    c.add_argument("-U", "--force-share", dest="force_share", action="store_true",
                   help="read the source even if another process writes it")
    source_arguments(c, "the source", "SRC")
    c.add_argument("-c", dest="compress", action="store_true",
                   help="compress the qcow2 destination's clusters")
    c.add_argument("-o", dest="options", action="append", default=[], metavar="OPTIONS",
                   help="qcow2 creation options: cluster_size=SIZE,compat=1.1|0.10,"
                        "preallocation=off|metadata,compression_type=zlib|zstd,"
                        "compression_level=N")
    c.add_argument("-B", dest="backing_file", default=None, metavar="FILE",
                   help="make the new qcow2 image an overlay of FILE (relative to the "
                        "destination's directory); ranges the source's backing chain holds "
                        "are left unwritten")
    c.add_argument("-F", dest="backing_format", default=None, metavar="FMT",
                   help="format of the backing file")
    c.add_argument("-S", dest="sparse_threshold", type=parse_size,
                   default=COPY_DEFAULTS["sparse_threshold"], metavar="SIZE",
                   help="zero runs at least this long become holes; 0: fully allocated "
                        "(default 4k)")
    c.add_argument("-m", dest="concurrency", type=int, default=COPY_DEFAULTS["concurrency"],
                   metavar="N", help=f"worker threads (default {COPY_DEFAULTS['concurrency']})")
    c.add_argument("--connections", type=int, default=None, metavar="N",
                   help="connections to an NBD server (default: 4 with multi-conn, else 1)")
    c.add_argument("--requests", dest="requests_in_flight", type=int,
                   default=COPY_DEFAULTS["requests_in_flight"], metavar="N",
                   help="NBD requests in flight per connection "
                        f"(default {COPY_DEFAULTS['requests_in_flight']})")
    order = c.add_mutually_exclusive_group()
    order.add_argument("-W", dest="out_of_order", action="store_true", default=True,
                       help="out-of-order writes (the default; accepted for qemu-img users)")
    order.add_argument("--in-order", dest="out_of_order", action="store_false",
                       help="write in guest order (reads may still run ahead)")
    c.add_argument("-n", dest="create", action="store_false",
                   help="write into an existing destination instead of creating it")
    c.add_argument("-C", dest="offload", action="store_true",
                   help="copy data in the kernel (copy_file_range)")
    c.add_argument("--target-is-zero", action="store_true",
                   help="the destination already reads as zeros: skip zero ranges (needs -n, "
                        "implied for an NBD URI)")
    c.add_argument("-p", dest="progress", action="store_true",
                   help="show progress as qemu-img does (a bar too on a terminal)")
    c.add_argument("-t", dest="dst_cache", choices=("none", "writeback", "unsafe"),
                   default="writeback",
                   help="destination cache mode: none = O_DIRECT, unsafe = no flush")
    c.add_argument("-T", dest="src_cache", choices=("none", "writeback"), default="writeback",
                   help="source cache mode: none = O_DIRECT")
    c.add_argument("--request-size", type=parse_size, default=COPY_DEFAULTS["request_size"],
                   metavar="SIZE", help="bytes per request (default 2M)")
    c.add_argument("--no-flush", dest="flush", action="store_false",
                   help="do not wait for the destination to be durable")
    c.add_argument("--stats", choices=("json",), default=None,
                   help="print what the copy did")
    _checksum_arguments(c)
    c.add_argument("--retries", type=int, default=0, metavar="N",
                   help="make a dropped NBD connection again up to N times, sending again "
                        "what it left unanswered (default 0: a drop fails the copy)")
    c.add_argument("--retry-delay", type=float, default=1.0, metavar="SECONDS",
                   help="before the first new connection; doubling (default 1)")
    c.add_argument("--changed", default=None, metavar="FILE|compare",
                   help="copy only what changed: the ranges in FILE (JSON "
                        "[[offset, length], ...], as CBT tools print them), or 'compare': "
                        "the blocks where the destination differs from the source")
    c.add_argument("--bitmap", default=None, metavar="NAME",
                   help="copy only what the source's dirty bitmap NAME marks changed (a qcow2 "
                        "persistent bitmap, an NBD export's qemu:dirty-bitmap:NAME)")
    c.add_argument("--bitmaps", action="store_true",
                   help="also store the source's persistent bitmaps in the new qcow2 "
                        "destination (a qcow2 v3 source; refused if one is in use)")
    c.add_argument("--skip-broken-bitmaps", dest="skip_broken_bitmaps", action="store_true",
                   help="with --bitmaps: skip a bitmap in use (inconsistent) with a warning")
    c.add_argument("--compare-block-size", type=parse_size, default=None, metavar="SIZE",
                   help="the block --changed=compare compares and writes (default 64k)")
    c.add_argument("--offset", type=parse_size, default=None, metavar="N",
                   help="a range shard: copy only from this byte of the source (with -n, "
                        "into an existing destination; other shards do the rest)")
    c.add_argument("--length", type=parse_size, default=None, metavar="L",
                   help="the shard's length")
    c.add_argument("--journal", default=None, metavar="PATH",
                   help="record what is done in PATH: run the same command again after any "
                        "failure and only what is missing is copied")
    c.add_argument("--journal-interval", type=_interval, default=JOURNAL_INTERVAL,
                   metavar="SECONDS|SIZE",
                   help=f"a checkpoint every SECONDS (default {JOURNAL_INTERVAL:g}), or once "
                        "SIZE more is done")
    c.add_argument("source")
    c.add_argument("destination")
    c.set_defaults(func=run, parser=c, option_objects=True)


def _changed(spec: Optional[str]) -> Any:
    """--changed: "compare", or the ranges a JSON file lists."""
    from .changes import COMPARE

    if spec is None or spec == COMPARE:
        return spec
    import json

    try:
        with open(spec, "rb") as f:
            ranges = json.load(f)
    except OSError as e:
        raise OSError(e.errno, f"--changed: {e.strerror}", spec) from None
    except ValueError as e:
        raise ValueError(f"--changed {spec}: not JSON: {e}") from None
    if not isinstance(ranges, list) or not all(
            isinstance(r, list) and len(r) == 2 and all(type(v) is int for v in r)
            for r in ranges):
        raise ValueError(f"--changed {spec}: expected [[offset, length], ...] of integers")
    return ranges


def _checksum_arguments(c: argparse.ArgumentParser) -> None:
    """--checksum[=ALG], --checksum-block-size and --verify."""
    c.add_argument("--checksum", nargs="?", const=DEFAULT_ALGORITHM, default=None,
                   metavar="ALG", help="print the source's blkhash checksum, computed from "
                                       f"what the copy reads (default {DEFAULT_ALGORITHM})")
    c.add_argument("--checksum-block-size", type=parse_size, default=DEFAULT_BLOCK_SIZE,
                   metavar="N", help="blkhash block size (default 64k)")
    c.add_argument("--verify", action="store_true",
                   help="read the destination back after the copy and fail unless its "
                        "checksum is the source's")


def _print_checksum(args: argparse.Namespace, result: Any) -> None:
    """`<hex>  <source>` as `imgcopy checksum SOURCE` prints it (with
    --member, `<hex>  <archive>/<member>`: what was hashed)."""
    from .image import display_name

    if result is not None and result.checksum is not None:
        write(f"{result.checksum}  {display_name(args.source, args.member)}\n")


def _creation_options(specs: List[str]) -> dict:
    """-o cluster_size=64k,compat=1.1,preallocation=metadata"""
    out: dict = {}
    for spec in specs:
        for item in filter(None, spec.split(",")):
            key, sep, value = item.partition("=")
            if not sep:
                raise ValueError(f"-o {item}: expected KEY=VALUE")
            if key == "cluster_size":
                try:
                    out["cluster_size"] = parse_size(value)
                except argparse.ArgumentTypeError as exc:
                    raise ValueError(f"-o cluster_size: {exc}") from None
            elif key in ("compat", "preallocation", "compression_type"):
                out[key] = value
            elif key == "compression_level":
                try:
                    out[key] = int(value)
                except ValueError:
                    raise ValueError(f"-o compression_level: not an integer: {value!r}") \
                        from None
            else:
                raise ValueError(f"-o {key}: unknown option (cluster_size, compat, "
                                 "preallocation, compression_type, compression_level)")
    return out


def run(args: argparse.Namespace) -> int:
    from .progress import QemuProgress
    from .uris import is_nbd_uri

    # an NBD export always exists: -n is implied there
    if args.target_is_zero and args.create and not is_nbd_uri(args.destination):
        raise ValueError("--target-is-zero needs -n (an existing destination)")
    # qemu-img's reports on stdout, unless stdout is the JSON of --stats
    bar = QemuProgress(stream=sys.stderr if args.stats == "json" else sys.stdout) \
        if args.progress else None
    result = None
    try:
        if bar is not None:
            bar.start()
        result = _convert(args, bar)
        # complete: a Ctrl-C from now on changes nothing (convert() already
        # ignores one that comes after the destination was committed)
        _ignore_sigint()
    except KeyboardInterrupt:
        if result is None:
            raise
        _ignore_sigint()
    finally:
        if bar is not None:
            if result is not None:
                bar.finish()
            bar.close()  # the line ends before an error is printed
    _print_checksum(args, result)
    if args.stats == "json":
        import json

        print(json.dumps(result.to_dict(), indent=1))
    return 0


def _ignore_sigint() -> None:
    import signal

    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:  # not the main thread (a caller's): its handlers are not ours to change
        pass


def _copy_options(args: argparse.Namespace) -> CopyOptions:
    from .options import CopyOptions

    return CopyOptions(
        sparse_threshold=args.sparse_threshold, concurrency=args.concurrency,
        request_size=args.request_size, out_of_order=args.out_of_order,
        target_is_zero=True if args.target_is_zero else None,
        direct=(args.src_cache == "none", args.dst_cache == "none"),
        flush=args.flush and args.dst_cache != "unsafe", offload=args.offload,
        connections=args.connections, requests_in_flight=args.requests_in_flight,
        retries=args.retries, retry_delay=args.retry_delay)


def _create_options(args: argparse.Namespace) -> Optional[Qcow2Options]:
    """-o, -c, -B and -F: a qcow2 layout, when any of them is given."""
    from .options import Qcow2Options

    layout = _creation_options(args.options)
    if args.compress:
        layout["compress"] = True
    if args.backing_file is not None:
        layout["backing_file"] = args.backing_file
    if args.backing_format is not None:
        layout["backing_format"] = args.backing_format
    return Qcow2Options(**layout) if layout else None


def _convert(args: argparse.Namespace, bar: Optional[QemuProgress]):
    if args.bitmaps:
        return _warning_lines(_convert_now, args, bar)
    return _convert_now(args, bar)


def _warning_lines(call: Any, *args: Any) -> Any:
    """The call's warnings (a bitmap skipped) as qemu-img prints them:
    ``imgcopy: warning: ...`` on stderr."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            return call(*args)
        finally:
            for w in caught:
                print(f"imgcopy: warning: {w.message}", file=sys.stderr)


def _convert_now(args: argparse.Namespace, bar: Optional[QemuProgress]):
    from .convert import convert

    return convert(
        args.source, args.destination, src_format=args.src_format, dst_format=args.dst_format,
        src_member=args.member, src_external_files=args.external_files,
        create=args.create, force=args.force, force_share=args.force_share,
        options=_copy_options(args), create_options=_create_options(args), progress=bar,
        checksum=args.checksum, checksum_block_size=args.checksum_block_size,
        verify=args.verify, changed=_changed(args.changed),
        compare_block_size=args.compare_block_size, offset=args.offset, length=args.length,
        bitmap=args.bitmap, journal=args.journal, journal_interval=args.journal_interval,
        bitmaps=args.bitmaps, skip_broken_bitmaps=args.skip_broken_bitmaps)


def _interval(text: str):
    """--journal-interval: seconds, or a size with its unit ("256M")."""
    try:
        return float(text)
    except ValueError:
        return text
