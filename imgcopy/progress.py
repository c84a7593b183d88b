"""Progress bars for long copies: ``convert(..., progress=True)``, and the
command line's -p.

``make_progress(True, total, desc)`` gives a tqdm bar when tqdm is installed
(``tqdm.auto``: a widget in a notebook that has ipywidgets, text elsewhere),
otherwise a plain text bar on stderr.  Bars made here close themselves when
they reach ``total``; ``close_progress`` closes them early (on errors).
``QemuProgress`` is every command's -p: qemu-img's reports, byte for byte
where they are not drawn on a terminal."""
from __future__ import annotations

import struct
import sys
import time

from .sizes import human_size

TYPE_CHECKING = False  # typing's import is not paid to start a command
if TYPE_CHECKING:
    from typing import IO, Any, Callable, Optional, Union

    # what convert() and checksum() take as progress= (a type checker's name only)
    Progress = Union[Callable[[int, int], Any], Any, None]


class TextBar:
    """A one-line progress bar on a stream (stderr), redrawn at most
    ``1 / min_interval`` times a second; ``update(n)`` as in tqdm:
    ``disk.raw:  42.0% |############      | 1.2 GiB/3 GiB 512 MiB/s``.
    ``total`` None: not known yet (``convert()`` sets it when the copy
    starts); a bar closed before it knew draws nothing."""

    def __init__(self, total: Optional[int] = None, desc: str = "",
                 stream: Optional[IO[str]] = None, min_interval: float = 0.2,
                 width: int = 30) -> None:
        self.total = total
        self.desc = desc
        self.stream = sys.stderr if stream is None else stream
        self.min_interval = min_interval
        self.width = width
        self.n = 0
        self.closed = False
        self._t0 = time.monotonic()
        self._last_draw = float("-inf")

    def update(self, n: int = 1) -> None:
        if self.closed:
            return
        self.n += n
        if self.total is not None and self.n >= self.total:
            self.close()
            return
        now = time.monotonic()
        if now - self._last_draw >= self.min_interval:
            self._draw(now)

    def line(self, now: Optional[float] = None) -> str:
        """The bar's text."""
        now = time.monotonic() if now is None else now
        frac = min(1.0, self.n / self.total) if self.total else 1.0
        filled = "#" * int(frac * self.width)
        elapsed = max(now - self._t0, 1e-9)
        rate = human_size(int(self.n / elapsed))
        prefix = f"{self.desc}: " if self.desc else ""
        return (f"{prefix}{100.0 * frac:5.1f}% |{filled:<{self.width}}| "
                f"{human_size(self.n)}/{human_size(self.total or 0)} {rate}/s")

    def _draw(self, now: float) -> None:
        if self.total is None:
            return
        self._last_draw = now
        self.stream.write("\r" + self.line(now))
        self.stream.flush()

    def close(self) -> None:
        """Draw the final state and end the line (once)."""
        if self.closed:
            return
        if self.total is not None:
            # closed once its line is ended: Ctrl-C in between leaves it open
            self.stream.write("\r" + self.line() + "\n")
            self.stream.flush()
        self.closed = True

    def __enter__(self) -> "TextBar":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def qemu_line(percent: float) -> str:
    """One report as qemu-img -p prints it (util/qemu-progress.c:
    ``printf("    (%3.2f/100%%)\\r", current)``)."""
    return "    (%3.2f/100%%)\r" % percent


def _float32(x: float) -> float:
    """x as qemu's ``float`` holds it (its percents are single precision)."""
    return float(struct.unpack("f", struct.pack("f", x))[0])


def is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # no isatty, or closed
        return False


class QemuProgress:
    """Every command's -p: qemu-img's progress reports, on stdout as
    qemu-img writes them (``stream``).

    Where the stream is not a terminal these are exactly qemu-img's bytes,
    for the scripts that parse them: ``    (0.00/100%)\\r`` when the command
    starts (``start()``), a report whenever the percent moved by more than
    ``min_skip`` (qemu-img convert's 1.0) and at 100, 100 once more when the
    command succeeds (``finish()``), and a newline (``close()``, also after
    a failure).  On a terminal (``bar`` None: whether the stream is one)
    each report also draws a bar of ``width`` characters.

    ``update(n)`` and ``total`` as tqdm's (``convert()`` and ``checksum()``
    set a total of None to the image's size); ``report(percent)`` draws a
    report qemu-img would print (compare's, whose reports are qemu's own);
    ``blank()`` clears a terminal's bar for a line of text."""

    def __init__(self, total: Optional[int] = None, stream: Optional[IO[str]] = None, *,
                 bar: Optional[bool] = None, min_skip: float = 1.0, width: int = 40) -> None:
        self.total = total
        self.stream = sys.stdout if stream is None else stream
        self.bar = is_terminal(self.stream) if bar is None else bar
        self.min_skip = min_skip
        self.width = width
        self.n = 0
        self.current = 0.0
        self.last_print = 0.0
        self.started = False
        self.closed = False
        self._drawn = 0  # characters of the line on the terminal

    def start(self) -> None:
        """The first report, 0.00 (qemu-img prints it before it opens
        anything, so a command that fails still shows it)."""
        if not self.started:
            self.started = True
            self.percent(0.0)

    def update(self, n: int = 1) -> None:
        if self.closed:
            return
        self.n += n
        if self.total is None or (n == 0 and self.total):
            return
        self.percent(100.0 * min(self.n, self.total) / self.total if self.total else 100.0)

    def percent(self, percent: float) -> None:
        """qemu_progress_print(percent, 0): drawn when it moved by more than
        min_skip, or is 0 or 100."""
        if self.closed:
            return
        self.start()
        current = min(_float32(percent), 100.0)
        self.current = current
        skip = _float32(self.min_skip)
        if (current > _float32(self.last_print + skip) or
                current < _float32(self.last_print - skip) or current in (0.0, 100.0)):
            self.last_print = current
            self.report(current)

    def report(self, percent: float) -> None:
        """Draw one report as it is."""
        if self.closed:
            return
        self.started = True
        line = qemu_line(percent)
        if self.bar:
            filled = "#" * int(min(max(percent, 0.0), 100.0) / 100.0 * self.width)
            line = f"{line[:-1]} [{filled:<{self.width}}]\r"
            self._drawn = len(line) - 1
        self._write(line)

    def blank(self) -> None:
        """Before what the command prints between reports (compare's
        warning and verdict): on a terminal the bar's line is blanked, so
        the text does not end in the bar's remains; nothing elsewhere."""
        if self.bar and self._drawn:
            self._write(" " * self._drawn + "\r")
            self._drawn = 0

    def finish(self) -> None:
        """The command succeeded: 100 once more (qemu-img's last report),
        and the line ends."""
        if not self.closed:
            self.report(100.0)
            self.close()

    def close(self) -> None:
        """End the line (qemu_progress_end: a newline, even when no report
        was drawn, as qemu-img compare's after a file failed to open), once."""
        if self.closed:
            return
        # closed once the newline is written: Ctrl-C in between leaves it open
        self._write("\n")
        self.closed = True

    def _write(self, s: str) -> None:
        self.stream.write(s)
        self.stream.flush()


class _TqdmBar:
    """A tqdm bar that closes itself when it reaches its total."""

    def __init__(self, bar: Any) -> None:
        self.bar = bar
        self.closed = False

    def update(self, n: int = 1) -> None:
        if self.closed:
            return
        self.bar.update(n)
        if self.bar.n >= self.bar.total:
            self.close()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.bar.close()


def _tqdm_class() -> Any:
    """tqdm.auto's class where it can draw (a notebook widget needs
    ipywidgets), else the text tqdm; None without tqdm."""
    import importlib.util  # here: the command line starts faster without it

    if importlib.util.find_spec("tqdm") is None:
        return None
    if importlib.util.find_spec("ipywidgets") is not None:
        from tqdm.auto import tqdm
    else:  # tqdm.auto would warn in a notebook and fall back to this anyway
        from tqdm import tqdm
    return tqdm


def make_progress(progress: Any, total: int, desc: str = "", *,
                  use_tqdm: Optional[bool] = None, stream: Optional[IO[str]] = None) -> Any:
    """What ``convert()`` reports progress to.

    ``progress``: None or False -> None; True -> a new bar of ``total``
    bytes: tqdm's when it is installed (``use_tqdm=False``: never,
    ``use_tqdm=True``: required), otherwise a TextBar on ``stream``
    (stderr); anything else (a callable ``(done, total)``, an object with
    ``update(n)``) is returned as it is."""
    if progress is None or progress is False:
        return None
    if progress is not True:
        return progress
    tqdm = _tqdm_class() if use_tqdm is not False else None
    if tqdm is None and use_tqdm:
        raise ImportError("progress bars with use_tqdm=True need tqdm (pip install tqdm)")
    if tqdm is not None:
        kwargs = {} if stream is None else {"file": stream}
        return _TqdmBar(tqdm(total=total, desc=desc or None, unit="B", unit_scale=True,
                             unit_divisor=1024, **kwargs))
    return TextBar(total, desc, stream=stream)


def close_progress(bar: Any, progress: Any) -> None:
    """Close ``bar`` if ``make_progress`` made it (not the caller's own
    object): for a copy that stopped before the end."""
    if bar is not None and bar is not progress:
        bar.close()


def _progress_adapter(progress: Progress) -> Optional[Callable[[int, int], None]]:
    """A callable (done, total), or an object with .update(n) such as tqdm
    (whose total, if None, is set to the copy's).  The copy reports 100%
    once, when every byte is written and before the destination is
    committed: raising there still cancels it."""
    if progress is None:
        return None
    update = getattr(progress, "update", None)
    if update is None and not callable(progress):
        raise TypeError("progress must be a callable (done, total) or have an update(n) method")
    last = [0]

    def report(done: int, total: int) -> None:
        if done == last[0] and done:
            return
        if update is not None:
            if getattr(progress, "total", 0) is None:  # a bar made before the size was known
                setattr(progress, "total", total)
            update(done - last[0])
        else:
            progress(done, total)
        last[0] = done
    return report
