"""The imgcopy command line: qemu-img's flag names where they exist."""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from typing import Any, Dict, List, Optional

from . import cli_check, cli_checksum, cli_measure, sizes
from .cli_compare import add_compare_parser, run as run_compare
from .convert import DEST_FORMATS, convert
from .errors import Error, ImageFormatError, describe_remedies
from .features import VersionAction
from .image import FORMATS, open as open_image
from .info import chain_to_human, chain_to_json, info, info_chain
from .options import CopyOptions, Qcow2Options
from .progress import QemuProgress
from .uris import is_nbd_uri

DEFAULTS = CopyOptions()


def parse_size(text: str) -> int:
    """A byte count with an optional k/M/G/T/P/E suffix (powers of 1024)."""
    try:
        return sizes.parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


# How the CLI spells the options an error's remedies name.
_FLAGS = {"format": "-f {}", "src_format": "-f {}", "dst_format": "-O {}", "force": "--force",
          "force_share": "-U", "member": "--member {}", "src_member": "--member {}",
          "external_files": "--external-files", "src_external_files": "--external-files"}


def cli_spelling(options: Dict[str, Any]) -> str:
    return " ".join(_FLAGS[k].format(v) if k in _FLAGS else f"--{k}={v}"
                    for k, v in options.items())


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

    def reader(name: str, func: Any, help: str) -> argparse.ArgumentParser:
        """A command that reads one image and prints what it found, as qemu-img's does."""
        r = sub.add_parser(name, help=help)
        r.add_argument("-f", "--format", dest="format", choices=FORMATS, default=None,
                       help="image format (default: probe)")
        r.add_argument("--output", choices=("human", "json"), default="human")
        r.add_argument("-U", "--force-share", dest="force_share", action="store_true",
                       help="read the image even if another process writes it")
        _source_arguments(r, "the image", "FILENAME")
        r.add_argument("filename")
        r.set_defaults(func=func, parser=r)
        return r

    m = reader("map", _cmd_map, "print the extent map of an image (like qemu-img map)")
    m.add_argument("-s", "--start-offset", type=parse_size, default=0, metavar="N")
    m.add_argument("-l", "--max-length", type=parse_size, default=None, metavar="N")
    m.add_argument("--force", action="store_true",
                   help="read a qcow2 image marked dirty or corrupt")

    i = reader("info", _cmd_info, "show an image's format, sizes, cluster size and backing "
                                  "file (like qemu-img info)")
    i.add_argument("--backing-chain", action="store_true",
                   help="show every image of the backing chain")

    cli_check.register(sub, FORMATS)

    c = sub.add_parser("convert", help="copy an image, moving only what matters "
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
    _source_arguments(c, "the source", "SRC")
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
                   default=DEFAULTS.sparse_threshold, metavar="SIZE",
                   help="zero runs at least this long become holes; 0: fully allocated "
                        "(default 4k)")
    c.add_argument("-m", dest="concurrency", type=int, default=DEFAULTS.concurrency,
                   metavar="N", help=f"worker threads (default {DEFAULTS.concurrency})")
    c.add_argument("--connections", type=int, default=None, metavar="N",
                   help="connections to an NBD server (default: 4 with multi-conn, else 1)")
    c.add_argument("--requests", dest="requests_in_flight", type=int,
                   default=DEFAULTS.requests_in_flight, metavar="N",
                   help="NBD requests in flight per connection "
                        f"(default {DEFAULTS.requests_in_flight})")
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
    c.add_argument("--request-size", type=parse_size, default=DEFAULTS.request_size,
                   metavar="SIZE", help="bytes per request (default 2M)")
    c.add_argument("--no-flush", dest="flush", action="store_false",
                   help="do not wait for the destination to be durable")
    c.add_argument("--stats", choices=("json",), default=None,
                   help="print what the copy did")
    cli_checksum.add_convert_arguments(c, parse_size)
    c.add_argument("source")
    c.add_argument("destination")
    c.set_defaults(func=_cmd_convert, parser=c)
    cli_measure.register(sub)
    add_compare_parser(sub)
    cli_checksum.add_parser(sub, parse_size)
    return parser


def _source_arguments(p: argparse.ArgumentParser, what: str, where: str) -> None:
    """--member and --external-files: where the bytes of the image read come from."""
    p.add_argument("--member", default=None, metavar="NAME",
                   help=f"{what} is member NAME of the tar archive {where} (an OVA's disk), "
                        "read in place; its backing file is another member")
    p.add_argument("--external-files", dest="external_files", action="store_true",
                   help="a vmdk descriptor may name extent files outside its directory")


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


def _cmd_convert(args: argparse.Namespace) -> int:
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
    cli_checksum.print_convert_checksum(args, result)
    if args.stats == "json":
        print(json.dumps(result.to_dict(), indent=1))
    return 0


def _ignore_sigint() -> None:
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def _copy_options(args: argparse.Namespace) -> CopyOptions:
    return CopyOptions(
        sparse_threshold=args.sparse_threshold, concurrency=args.concurrency,
        request_size=args.request_size, out_of_order=args.out_of_order,
        target_is_zero=True if args.target_is_zero else None,
        direct=(args.src_cache == "none", args.dst_cache == "none"),
        flush=args.flush and args.dst_cache != "unsafe", offload=args.offload,
        connections=args.connections, requests_in_flight=args.requests_in_flight)


def _create_options(args: argparse.Namespace) -> Optional[Qcow2Options]:
    """-o, -c, -B and -F: a qcow2 layout, when any of them is given."""
    layout = _creation_options(args.options)
    if args.compress:
        layout["compress"] = True
    if args.backing_file is not None:
        layout["backing_file"] = args.backing_file
    if args.backing_format is not None:
        layout["backing_format"] = args.backing_format
    return Qcow2Options(**layout) if layout else None


def _convert(args: argparse.Namespace, bar: Optional[QemuProgress]):
    return convert(
        args.source, args.destination, src_format=args.src_format, dst_format=args.dst_format,
        src_member=args.member, src_external_files=args.external_files,
        create=args.create, force=args.force, force_share=args.force_share,
        options=_copy_options(args), create_options=_create_options(args), progress=bar,
        **cli_checksum.convert_keywords(args))


def _write(text: str) -> None:
    """Text that names files, written as qemu-img writes it: a name's bytes
    as they are, UTF-8 or not."""
    out = getattr(sys.stdout, "buffer", None)
    if out is None:
        sys.stdout.write(text)
        return
    sys.stdout.flush()
    out.write(os.fsencode(text))
    out.flush()


def _cmd_map(args: argparse.Namespace) -> int:
    with open_image(args.filename, args.format, force=args.force,
                    force_share=args.force_share, member=args.member,
                    external_files=args.external_files) as img:
        emap = img.extents(args.start_offset, args.max_length)
    text = emap.to_json() if args.output == "json" else emap.to_human(args.filename)
    _write(text)
    return 0


def _cmd_info(args: argparse.Namespace) -> int:
    if args.backing_chain:
        infos = info_chain(args.filename, args.format, force_share=args.force_share,
                           member=args.member, external_files=args.external_files)
        text = chain_to_json(infos) if args.output == "json" else chain_to_human(infos)
    else:
        one = info(args.filename, args.format, force_share=args.force_share,
                   member=args.member, external_files=args.external_files)
        text = one.to_json() if args.output == "json" else one.to_human()
    _write(text)
    return 0


def _describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.filename is not None:
        reason = getattr(exc, "reason", None)
        if reason is not None:  # the C core's: its remedies spelt as flags
            return (f"{os.fsdecode(exc.filename)}: {reason}"
                    f"{describe_remedies(getattr(exc, 'remedies', []), cli_spelling)}")
        return f"{os.fsdecode(exc.filename)}: {exc.strerror}"
    if isinstance(exc, ImageFormatError):
        return exc.describe(cli_spelling)
    return str(exc)


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
    if argv[:1] == ["compare"]:  # parsed as qemu-img parses it
        return run_compare(argv[1:])
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
        print(f"imgcopy: {_describe(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("imgcopy: interrupted", file=sys.stderr)
        return 130
