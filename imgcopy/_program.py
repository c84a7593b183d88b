"""The imgcopy command's entry (the console script's and ``python -m
imgcopy``'s): a Ctrl-C that comes while it starts, before ``cli.main()``
answers it, ends the command with ``imgcopy: interrupted`` and exit status
130, as one that comes later does, instead of a traceback; once the
command is done, the process ends without the interpreter's teardown
(end_now).  The package imports this first; it uses nothing but sys and os
(loaded with the interpreter; atexit, built in, at the end) and _interrupt,
a leaf, so it is there when the package's other imports fail."""

import os
import sys

from ._interrupt import is_interrupt

_HERE = os.path.dirname(os.path.abspath(__file__))


def _runs_this_module(argv: list) -> bool:
    """python [options] -m imgcopy ..., as the interpreter was started."""
    for i, arg in enumerate(argv):
        if arg == "-m":
            return argv[i + 1:i + 2] == ["imgcopy"]
        if arg == "-mimgcopy":
            return True
    return False


def is_the_program() -> bool:
    """The console script (``bin/imgcopy``) or ``python -m imgcopy``, not a
    program that imports imgcopy."""
    arg0 = sys.argv[0] if sys.argv else ""
    if arg0 == "-m":  # python -m: runpy imports the package before __main__
        orig = getattr(sys, "orig_argv", None)  # Python 3.10 and later
        return orig is None or _runs_this_module(orig)
    return (os.path.basename(arg0) == "imgcopy" or
            os.path.abspath(arg0) == os.path.join(_HERE, "__main__.py"))


def interrupted_while_starting() -> None:
    """Called with the KeyboardInterrupt of an import: the command's exit
    (SystemExit 130, its message on stderr); returns (the caller re-raises)
    when imgcopy is not the program."""
    if is_the_program():
        try:
            sys.stderr.write("imgcopy: interrupted\n")
            sys.stderr.flush()
        finally:
            raise SystemExit(130)


def main() -> int:
    """The command: ``cli.main()``, whose import a Ctrl-C may interrupt too
    (the package's own imports answer one that comes before).
    ``imgcopy --version`` alone is answered here, as the parser's --version
    answers it, without building the parser: it imports only the C core."""
    try:
        if sys.argv[1:] == ["--version"]:
            from .features import version_text

            print(version_text())
            return 0
        from .cli import main as cli_main

        # inside the try: a Ctrl-C between the import and cli_main()'s own
        # handler is answered the same way
        status = cli_main()
    except BaseException as e:
        if not is_interrupt(e):
            raise
        sys.stderr.write("imgcopy: interrupted\n")
        status = 130
    end_now(status)
    return status


def end_now(status: int) -> None:
    """Ends the program's process with `status` as its exit does (the atexit
    functions run, the output is flushed), without the interpreter tearing
    down every module first (~5 ms, an eighth of a short copy's start and
    end).  Returns, for the usual exit, in a program that imports imgcopy,
    while another Python thread runs, or when the output cannot be
    flushed (the usual exit reports it)."""
    threading = sys.modules.get("threading")
    if not is_the_program() or (threading is not None and threading.active_count() > 1):
        return
    import atexit

    run_exitfuncs = getattr(atexit, "_run_exitfuncs", None)  # CPython's own
    clear = getattr(atexit, "_clear", None)
    if run_exitfuncs is None or clear is None or not _flushed():
        return
    run_exitfuncs()
    clear()
    if _flushed():
        os._exit(status)


def _flushed() -> bool:
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
    except (OSError, ValueError):
        return False
    return True
