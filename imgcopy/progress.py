"""Progress bars for long copies: ``convert(..., progress=True)``.

``make_progress(True, total, desc)`` gives a tqdm bar when tqdm is installed
(``tqdm.auto``: a widget in a notebook that has ipywidgets, text elsewhere),
otherwise a plain text bar on stderr.  Bars made here close themselves when
they reach ``total``; ``close_progress`` closes them early (on errors)."""
from __future__ import annotations

import sys
import time
from typing import IO, Any, Optional

from .extents import human_size


class TextBar:
    """A one-line progress bar on a stream (stderr), redrawn at most
    ``1 / min_interval`` times a second; ``update(n)`` as in tqdm.

    ``style`` "bar": ``disk.raw:  42.0% |############      | 1.2 GiB/3 GiB 512 MiB/s``;
    "qemu": qemu-img convert -p's ``    (42.00/100%)``, with a bar (the
    command line's -p).  ``total`` None: not known yet (``convert()`` sets
    it when the copy starts); a bar closed before it knew draws nothing."""

    STYLES = ("bar", "qemu")

    def __init__(self, total: Optional[int] = None, desc: str = "",
                 stream: Optional[IO[str]] = None, min_interval: float = 0.2,
                 width: Optional[int] = None, style: str = "bar") -> None:
        if style not in self.STYLES:
            raise ValueError(f"style must be one of {', '.join(self.STYLES)}, not {style!r}")
        self.total = total
        self.desc = desc
        self.stream = sys.stderr if stream is None else stream
        self.min_interval = min_interval
        self.width = (30 if style == "bar" else 40) if width is None else width
        self.style = style
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
        """The bar's text in its style."""
        now = time.monotonic() if now is None else now
        frac = min(1.0, self.n / self.total) if self.total else 1.0
        filled = "#" * int(frac * self.width)
        if self.style == "qemu":
            return f"    ({100.0 * frac:6.2f}/100%) [{filled:<{self.width}}]"
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
