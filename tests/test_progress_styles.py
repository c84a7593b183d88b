"""One text progress bar in two styles: the library's ("disk.raw:  42.0% |###")
and qemu-img convert -p's ("    ( 42.00/100%)") that the command line draws;
a bar made before the copy's size is known learns it from convert()."""
import io
import re
import subprocess
import sys

import pytest

import imgcopy
from imgcopy import progress as P

from .gen.sparse import make_sparse
from .units import MiB



def qemu_line(percent):
    """The command line's -p line, as it has always been drawn."""
    return "\r    (%6.2f/100%%) [%-40s]" % (percent, "#" * int(percent / 2.5))


def test_qemu_style_lines():
    out = io.StringIO()
    bar = P.TextBar(1000, stream=out, style="qemu", min_interval=0)
    for n in (1, 419, 330, 150):
        bar.update(n)
    assert out.getvalue() == "".join(qemu_line(p) for p in (0.1, 42.0, 75.0, 90.0))
    bar.update(100)
    assert out.getvalue().endswith(qemu_line(100.0) + "\n") and bar.closed
    assert out.getvalue().count("\n") == 1


def test_unknown_total_draws_nothing_until_known():
    out = io.StringIO()
    bar = P.TextBar(stream=out, style="qemu", min_interval=0)
    bar.update(5)
    assert out.getvalue() == ""
    bar.close()  # a copy that failed before it started: no line at all
    assert out.getvalue() == "" and bar.closed
    with pytest.raises(ValueError, match="style"):
        P.TextBar(10, style="fancy")


@pytest.fixture
def source(tmp_path):
    path = str(tmp_path / "src.raw")
    make_sparse(path, 6 * MiB, [(0, b"a" * MiB), (4 * MiB, b"b" * 4096)])
    return path


def test_convert_gives_a_bar_its_total(source, tmp_path):
    out = io.StringIO()
    bar = P.TextBar(stream=out, style="qemu")
    imgcopy.convert(source, str(tmp_path / "out.raw"), progress=bar, flush=False)
    assert bar.total == 6 * MiB and bar.n == 6 * MiB and bar.closed
    assert out.getvalue().endswith(qemu_line(100.0) + "\n")


def test_convert_gives_a_tqdm_bar_its_total(source, tmp_path):
    tqdm = pytest.importorskip("tqdm").tqdm
    out = io.StringIO()
    bar = tqdm(file=out, unit="B")
    imgcopy.convert(source, str(tmp_path / "out.raw"), progress=bar, flush=False)
    assert bar.total == 6 * MiB and bar.n == 6 * MiB
    bar.close()


def test_cli_draws_qemus_line(source, tmp_path, imgcopy_env):
    p = subprocess.run([sys.executable, "-m", "imgcopy", "convert", "-p", source,
                        str(tmp_path / "out.raw")], capture_output=True, env=imgcopy_env)
    err = p.stderr.decode()  # bytes: "\r" stays "\r"
    assert p.returncode == 0, err
    assert re.fullmatch(r"(\r    \( *\d+\.\d\d/100%\) \[#* *\])+\n", err), repr(err)
    assert err.endswith(qemu_line(100.0) + "\n")
