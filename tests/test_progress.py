"""imgcopy.progress: what convert(progress=...) reports to."""
import importlib
import io

import pytest

import imgcopy
from imgcopy import progress as P

from .gen.sparse import make_sparse
from .units import MiB

# convert() runs a CopyJob: the job makes the bar and calls the core.
job_module = importlib.import_module("imgcopy.job")


def test_passthrough():
    assert P.make_progress(None, 10) is None
    assert P.make_progress(False, 10) is None

    def cb(done, total):
        pass

    assert P.make_progress(cb, 10) is cb
    obj = object()
    assert P.make_progress(obj, 10) is obj
    P.close_progress(None, None)
    P.close_progress(cb, cb)        # the caller's own: left alone


def test_text_bar_draws_and_closes_once():
    out = io.StringIO()
    bar = P.make_progress(True, 3 * MiB, "disk.raw", use_tqdm=False, stream=out)
    assert isinstance(bar, P.TextBar)
    bar.min_interval = 0.0
    bar.update(MiB)
    assert out.getvalue().startswith("\rdisk.raw:  33.3% |##########")
    assert "1 MiB/3 MiB" in out.getvalue() and "\n" not in out.getvalue()
    bar.update(2 * MiB)                 # reaching the total closes the bar
    assert bar.closed and out.getvalue().endswith("\n")
    assert "100.0% |" + "#" * 30 + "| 3 MiB/3 MiB" in out.getvalue()
    bar.update(5)
    bar.close()
    assert out.getvalue().count("\n") == 1


def test_text_bar_throttles():
    out = io.StringIO()
    bar = P.TextBar(1000, stream=out, min_interval=3600)
    for _ in range(999):
        bar.update(1)
    assert out.getvalue().count("\r") == 1     # the first draw only
    bar.update(1)
    assert out.getvalue().count("\r") == 2 and out.getvalue().endswith("\n")


def test_text_bar_empty_total():
    out = io.StringIO()
    bar = P.TextBar(0, "x", stream=out)
    bar.update(0)
    assert bar.closed and "100.0%" in out.getvalue()


def test_without_tqdm(monkeypatch):
    monkeypatch.setattr(P, "_tqdm_class", lambda: None)
    out = io.StringIO()
    assert isinstance(P.make_progress(True, 10, stream=out), P.TextBar)
    with pytest.raises(ImportError):
        P.make_progress(True, 10, use_tqdm=True)


def test_tqdm_bar():
    pytest.importorskip("tqdm")
    out = io.StringIO()
    bar = P.make_progress(True, 4 * MiB, "x.raw", use_tqdm=True, stream=out)
    assert isinstance(bar, P._TqdmBar)
    bar.update(MiB)
    assert not bar.closed
    bar.update(3 * MiB)
    assert bar.closed and bar.bar.n == 4 * MiB
    assert "x.raw" in out.getvalue() and "100%" in out.getvalue()
    bar.update(1)        # after the end: ignored
    assert bar.bar.n == 4 * MiB


def test_close_progress_closes_bars_made_here():
    out = io.StringIO()
    bar = P.make_progress(True, 100, use_tqdm=False, stream=out)
    bar.update(10)
    P.close_progress(bar, True)
    assert bar.closed and out.getvalue().endswith("\n")


def test_with_convert_today(tmp_path):
    """A bar made here is an update(n) object: convert() takes it as it is."""
    src = str(tmp_path / "s.raw")
    make_sparse(src, 8 * MiB, [(0, b"x" * MiB), (5 * MiB, b"y" * 4096)])
    out = io.StringIO()
    bar = P.make_progress(True, 8 * MiB, "s.raw", use_tqdm=False, stream=out)
    imgcopy.convert(src, str(tmp_path / "d.raw"), progress=bar, flush=False)
    assert bar.closed and bar.n == 8 * MiB
    assert "| 8 MiB/8 MiB " in out.getvalue() and out.getvalue().endswith("/s\n")
    assert out.getvalue().count("\n") == 1


@pytest.mark.parametrize("use_tqdm", [False, True])
def test_convert_progress_true(tmp_path, capsys, monkeypatch, use_tqdm):
    if use_tqdm:
        pytest.importorskip("tqdm")
    else:
        monkeypatch.setattr(P, "_tqdm_class", lambda: None)
    src = str(tmp_path / "s.raw")
    make_sparse(src, 8 * MiB, [(0, b"x" * MiB)])
    imgcopy.convert(src, str(tmp_path / "d.raw"), progress=True, flush=False)
    err = capsys.readouterr().err
    assert "s.raw" in err and "100" in err and err.endswith("\n")


def test_convert_failure_closes_the_bar(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(P, "_tqdm_class", lambda: None)
    src = str(tmp_path / "s.raw")
    make_sparse(src, 8 * MiB, [(0, b"x" * MiB)])
    made = []
    real = P.make_progress

    def spy(*a, **k):
        made.append(real(*a, **k))
        return made[-1]

    monkeypatch.setattr(job_module, "make_progress", spy)

    def boom(*a, **k):
        raise OSError(5, "injected")

    monkeypatch.setattr(job_module._core, "copy", boom)
    with pytest.raises(OSError):
        imgcopy.convert(src, str(tmp_path / "d.raw"), progress=True, flush=False)
    assert made and made[0].closed
    assert capsys.readouterr().err.endswith("\n")


class _InterruptedStream(io.StringIO):
    """A stream whose next write lands, then raises KeyboardInterrupt: Ctrl-C
    arriving right after a bar was drawn (the race that glued the CLI's
    "imgcopy: interrupted" to its progress bar one run in five)."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = False

    def write(self, s: str) -> int:
        n = super().write(s)
        if self.armed:
            self.armed = False
            raise KeyboardInterrupt
        return n


def test_cli_bar_ends_its_line_after_ctrl_c_during_a_draw():
    stream = _InterruptedStream()
    bar = P.QemuProgress(100, stream=stream)    # the CLI's -p
    stream.armed = True
    with pytest.raises(KeyboardInterrupt):
        bar.update(2)
    bar.close()
    assert stream.getvalue().endswith("\n"), repr(stream.getvalue())


@pytest.mark.parametrize("at", ["draw", "last update"])
def test_text_bar_ends_its_line_after_ctrl_c(at):
    stream = _InterruptedStream()
    bar = P.TextBar(100, stream=stream, min_interval=0)
    stream.armed = True
    with pytest.raises(KeyboardInterrupt):
        bar.update(10 if at == "draw" else 100)
    P.close_progress(bar, None)
    assert stream.getvalue().endswith("\n"), repr(stream.getvalue())
