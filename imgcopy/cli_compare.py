"""``imgcopy compare``: qemu-img compare's options, messages and exit codes.

The arguments are parsed as qemu-img parses them (GNU getopt, options and
file names in any order) rather than by argparse, so that usage errors
read and exit as qemu-img's do (exit 1, then the ``Try`` line)."""
from __future__ import annotations

import argparse
import errno
import os
import sys

from ._defaults import FORMATS
from .errors import ImageFormatError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, List, Optional, Tuple

    from .compare import CompareResult
    from .image import Image
    from .progress import QemuProgress

PROG = "imgcopy"
USAGE = ("usage: imgcopy compare [-f FMT] [-F FMT] [-T SRC_CACHE] [-p] [-q] [-s] [-U] "
         "[-m N]\n"
         "                       [--a-member NAME] [--b-member NAME] [--external-files] "
         "FILE1 FILE2\n\n"
         "Compare the guest content of two images as qemu-img compare does.\n"
         "  -f FMT   format of FILE1 (default: probe)\n"
         "  -F FMT   format of FILE2 (default: probe)\n"
         "  -T MODE  cache mode of both (none, writeback, ...: none reads with O_DIRECT)\n"
         "  -p       show progress\n"
         "  -q       print nothing (the exit code says it)\n"
         "  -s       strict: sizes and allocation must match too\n"
         "  -U       read images others are writing (force share)\n"
         "  -m N     threads (default 4; an imgcopy extension)\n"
         "  --a-member NAME  FILE1 is a tar archive (an OVA): compare its member NAME\n"
         "  --b-member NAME  FILE2 is a tar archive: compare its member NAME\n"
         "  --external-files a vmdk descriptor may name extent files outside its\n"
         "                   directory\n\n"
         "Exit codes: 0 identical, 1 different (or a usage error), 2 an image could not\n"
         "be opened, 3 block status failed, 4 a read failed.\n")

SHORT = "hf:F:T:pqsUm:"
LONG = {"help": False, "object": True, "image-opts": False, "force-share": False,
        "a-member": True, "b-member": True, "external-files": False}
CACHE_MODES = ("none", "writeback", "writethrough", "directsync", "unsafe")


class UsageError(Exception):
    pass


def register(subparsers: Any) -> None:
    """Listed in ``imgcopy --help``.  Its arguments are handed over untouched
    (argparse takes none of them as options): parsed as qemu-img parses them."""
    p = subparsers.add_parser("compare", help="compare two images (like qemu-img compare)",
                              add_help=False, prefix_chars="\x01")
    p.add_argument("argv", nargs=argparse.REMAINDER)
    p.set_defaults(func=run, parser=p)


def run(args: argparse.Namespace) -> int:
    return _run(list(args.argv))


def _getopt(argv: List[str]) -> Tuple[List[Tuple[str, Optional[str]]], List[str]]:
    """GNU getopt_long as qemu-img calls it: options anywhere, "--" ends them."""
    opts: List[Tuple[str, Optional[str]]] = []
    names: List[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if arg == "--":
            names.extend(argv[i:])
            break
        if arg.startswith("--"):
            name, eq, value = arg[2:].partition("=")
            matches = [k for k in LONG if k == name] or [k for k in LONG if k.startswith(name)]
            if len(matches) != 1:
                raise UsageError(f"unrecognized option '{arg}'")
            key = matches[0]
            if LONG[key]:
                if not eq:
                    if i >= len(argv):
                        raise UsageError(f"missing argument for option '{arg}'")
                    value = argv[i]
                    i += 1
                opts.append(("--" + key, value))
            else:
                opts.append(("--" + key, None))
            continue
        if not arg.startswith("-") or arg == "-":
            names.append(arg)
            continue
        k = 1
        while k < len(arg):
            ch = arg[k]
            pos = SHORT.find(ch)
            if ch == ":" or pos < 0:
                raise UsageError(f"unrecognized option '{arg}'")
            if SHORT[pos + 1:pos + 2] == ":":
                if k + 1 < len(arg):
                    opts.append(("-" + ch, arg[k + 1:]))
                elif i < len(argv):
                    opts.append(("-" + ch, argv[i]))
                    i += 1
                else:
                    raise UsageError(f"missing argument for option '{arg}'")
                break
            opts.append(("-" + ch, None))
            k += 1
    return opts, names


def _err(text: str) -> None:
    sys.stdout.flush()
    sys.stderr.write(f"{PROG}: {text}\n")
    sys.stderr.flush()


def _out(text: str, quiet: bool) -> None:
    if not quiet:
        out = getattr(sys.stdout, "buffer", None)
        if out is None:
            sys.stdout.write(text)
        else:
            sys.stdout.flush()
            out.write(os.fsencode(text))
        sys.stdout.flush()


def open_failure(filename: str, exc: BaseException, fmt: Optional[str]) -> str:
    """qemu-img's "Could not open" line for an image that did not open."""
    if isinstance(exc, OSError) and exc.errno is not None and \
            not isinstance(exc, ImageFormatError):
        if exc.errno == errno.EISDIR:
            return (f"Could not open '{filename}': 'file' driver requires '{filename}' "
                    "to be a regular file")
        return (f"Could not open '{filename}': Could not open '{filename}': "
                f"{os.strerror(exc.errno)}")
    if isinstance(exc, ImageFormatError):
        reason = exc.reason
        if fmt is not None and "bad magic" in reason:
            reason = f"Image is not in {fmt} format"
        return f"Could not open '{filename}': {reason}"
    return f"Could not open '{filename}': {exc}"


def _run(argv: List[str]) -> int:
    try:
        opts, names = _getopt(argv)
    except UsageError as exc:
        _err(str(exc))
        sys.stderr.write(f"Try '{PROG} --help' for more information\n")
        return 1
    fmts: List[Optional[str]] = [None, None]
    members: List[Optional[str]] = [None, None]
    external_files = False
    cache = "writeback"
    progress = quiet = strict = force_share = False
    threads = 4
    for opt, value in opts:
        if opt in ("-h", "--help"):
            sys.stdout.write(USAGE)
            return 0
        if opt == "-f":
            fmts[0] = value
        elif opt == "-F":
            fmts[1] = value
        elif opt == "-T":
            cache = value or ""
        elif opt == "-p":
            progress = True
        elif opt == "-q":
            quiet = True
        elif opt == "-s":
            strict = True
        elif opt in ("-U", "--force-share"):
            force_share = True
        elif opt == "--a-member":
            members[0] = value
        elif opt == "--b-member":
            members[1] = value
        elif opt == "--external-files":
            external_files = True
        elif opt == "-m":
            try:
                threads = int(value or "")
            except ValueError:
                threads = 0
            if not 1 <= threads <= 64:
                _err(f"-m must be a number of threads from 1 to 64, not '{value}'")
                return 1
        elif opt == "--object":
            _err("--object is not supported")
            return 2
        elif opt == "--image-opts":
            _err("--image-opts is not supported")
            return 2
    if quiet:
        progress = False
    if len(names) != 2:
        _err("Expecting two image file names")
        sys.stderr.write(f"Try '{PROG} --help' for more information\n")
        return 1
    direct = cache in ("none", "directsync")
    bar: Optional[QemuProgress] = None
    if progress:  # convert -p's, with compare's reports
        from .progress import QemuProgress

        bar = QemuProgress()
    try:
        if cache not in CACHE_MODES:
            _err(f"Invalid source cache option: {cache}")
            return 2
        return _compare(names, fmts, members, external_files, direct, force_share, strict,
                        threads, quiet, bar)
    except KeyboardInterrupt:
        _err("interrupted")
        return 130
    finally:
        if bar is not None:
            bar.close()


def _open(path: str, fmt: Optional[str], member: Optional[str], external_files: bool,
          direct: bool, force_share: bool) -> Optional[Image]:
    from .image import Image, display_name

    name = display_name(path, member)
    if fmt is not None and fmt not in FORMATS:
        _err(f"Could not open '{name}': Unknown driver '{fmt}'")
        return None
    try:
        return Image(path, fmt, direct=direct, force_share=force_share, member=member,
                     external_files=external_files)
    except (OSError, ImageFormatError, ValueError) as exc:
        if fmt is None and isinstance(exc, OSError) and exc.errno and \
                _opens_as_raw(path, member):
            # the file opens: reading it to probe its format failed
            _err(f"Could not open '{name}': Could not read image for determining its "
                 f"format: {os.strerror(exc.errno)}")
        else:
            _err(open_failure(name, exc, fmt))
        return None


def _opens_as_raw(name: str, member: Optional[str]) -> bool:
    from .image import Image

    try:
        Image(name, "raw", member=member).close()
    except (OSError, ValueError):
        return False
    return True


def _compare(paths: List[str], fmts: List[Optional[str]], members: List[Optional[str]],
             external_files: bool, direct: bool, force_share: bool, strict: bool, threads: int,
             quiet: bool, bar: Optional[QemuProgress]) -> int:
    from .compare import compare_images
    from .image import display_name

    # messages name a member as archive/member
    names = [display_name(p, m) for p, m in zip(paths, members)]
    a = _open(paths[0], fmts[0], members[0], external_files, direct, force_share)
    if a is None:
        return 2
    with a:
        b = _open(paths[1], fmts[1], members[1], external_files, direct, force_share)
        if b is None:
            return 2
        with b:
            live = _Live(quiet, bar)
            if bar is not None:
                bar.start()
            try:
                result = compare_images(a, b, strict=strict, concurrency=threads,
                                        on_progress=live.report if bar is not None else None)
            except (OSError, ImageFormatError) as exc:
                return _failure(names, exc, quiet, live)
    return _report(result, quiet, live)


class _Live:
    """The progress reports as they come, and qemu's size warning before the
    first one past the smaller image's end."""

    def __init__(self, quiet: bool, bar: Optional[QemuProgress] = None) -> None:
        self.quiet = quiet
        self.bar = bar
        self.warned = False

    def warn(self) -> None:
        if not self.warned:
            self.out("Warning: Image size mismatch!\n")
            self.warned = True

    def report(self, percent: float, in_tail: bool) -> None:
        """One of qemu-img's reports (the core decided which it prints)."""
        if in_tail:
            self.warn()
        if self.bar is not None:
            self.bar.report(percent)

    def out(self, text: str) -> None:
        """A line of the output: past the bar's on a terminal."""
        if self.bar is not None:
            self.bar.blank()
        _out(text, self.quiet)


def _failure(names: List[str], exc: BaseException, quiet: bool, live: _Live) -> int:
    step = getattr(exc, "compare_step", None)
    if step is None:
        _err(str(exc))
        return 4
    if getattr(exc, "compare_warned", False):
        live.warn()
    if live.bar is not None:
        live.bar.blank()
    name = names[getattr(exc, "compare_image", 0)]
    if step == 3:
        _err(f"Sector allocation test failed for {name}")
        return 3
    errnum = getattr(exc, "errno", None) or errno.EIO
    _err(f"Error while reading offset {getattr(exc, 'compare_offset', 0)} of {name}: "
         f"{os.strerror(errnum)}")
    return 4


def _report(result: CompareResult, quiet: bool, live: _Live) -> int:
    if result.warned:
        live.warn()
    live.out(result.message + "\n")
    return 0 if result.identical else 1
