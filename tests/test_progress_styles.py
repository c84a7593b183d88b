"""Two progress styles: the library's bar ("disk.raw:  42.0% |###", stderr)
and every command's -p, which prints qemu-img's reports ("    (42.00/100%)\\r"
on stdout) byte for byte where stdout is not a terminal, and draws a bar
after them only on a terminal.  qemu-img is the oracle: the bytes of
``qemu-img convert -p`` into a pipe."""
import io
import os
import pty
import re
import select
import subprocess
import sys

import pytest

import imgcopy
from imgcopy import progress as P

from .convert_helpers import imgcopy_cmd
from .gen.sparse import make_sparse, seeded_bytes
from .oracles import needs_qemu_img
from .servers import slow_export
from .units import MiB

REPORT = re.compile(rb"    \((\d+\.\d\d)/100%\)\r")


def q(*percents):
    return "".join("    (%3.2f/100%%)\r" % p for p in percents)


# ---- the reports, without a terminal ---------------------------------------

def test_qemu_lines_skip_moves_of_one_percent_or_less():
    """qemu_progress_print(p, 0) with convert's min_skip of 1.0: drawn when
    the percent moved by more than 1, and at 0 and 100."""
    out = io.StringIO()
    bar = P.QemuProgress(1000, stream=out)
    assert not bar.bar  # a StringIO is no terminal
    bar.start()
    for n in (5, 10, 1, 5, 400, 0, 579):   # 0.5 1.5 1.6 2.1 42.1 (nothing) 100
        bar.update(n)
    assert out.getvalue() == q(0, 1.5, 42.1, 100)
    bar.finish()
    assert out.getvalue() == q(0, 1.5, 42.1, 100, 100) + "\n" and bar.closed
    bar.update(5)
    bar.close()
    assert out.getvalue().count("\n") == 1


def test_qemu_percents_are_single_precision():
    out = io.StringIO()
    bar = P.QemuProgress(3, stream=out)
    bar.update(2)   # 66.666...: qemu's float prints 66.67 as the double does
    bar.update(1)
    assert out.getvalue() == q(0, 66.67, 100)
    assert P._float32(100.0 * 2 / 3) != 100.0 * 2 / 3


def test_empty_total_and_unknown_total():
    out = io.StringIO()
    bar = P.QemuProgress(stream=out)   # total None: learnt from the operation
    bar.start()
    bar.update(7)
    assert out.getvalue() == q(0)
    bar.close()                          # a failure: the line ends, no 100
    assert out.getvalue() == q(0) + "\n"
    out = io.StringIO()
    bar = P.QemuProgress(0, stream=out)
    bar.update(0)                        # an empty image's only report
    bar.finish()
    assert out.getvalue() == q(0, 100, 100) + "\n"


def test_bar_on_a_terminal_only():
    out = io.StringIO()
    bar = P.QemuProgress(100, stream=out, bar=True, width=10)
    bar.update(42)
    bar.blank()
    assert out.getvalue() == ("    (0.00/100%) [          ]\r"
                              "    (42.00/100%) [####      ]\r" + " " * 29 + "\r")
    bar.finish()
    assert out.getvalue().endswith("    (100.00/100%) [##########]\r\n")
    r, w = pty.openpty()
    try:
        with os.fdopen(w, "w", closefd=False) as tty:
            assert P.QemuProgress(stream=tty).bar
    finally:
        os.close(r)
        os.close(w)


def test_convert_drives_a_qemu_progress(tmp_path):
    src = str(tmp_path / "src.raw")
    make_sparse(src, 6 * MiB, [(0, b"a" * MiB), (4 * MiB, b"b" * 4096)])
    out = io.StringIO()
    bar = P.QemuProgress(stream=out)
    imgcopy.convert(src, str(tmp_path / "out.raw"), progress=bar, flush=False)
    assert bar.total == 6 * MiB and bar.n == 6 * MiB
    bar.finish()
    assert out.getvalue().endswith(q(100, 100) + "\n")


def test_convert_gives_a_tqdm_bar_its_total(tmp_path):
    tqdm = pytest.importorskip("tqdm").tqdm
    src = str(tmp_path / "src.raw")
    make_sparse(src, 6 * MiB, [(0, b"a" * MiB)])
    out = io.StringIO()
    bar = tqdm(file=out, unit="B")
    imgcopy.convert(src, str(tmp_path / "out.raw"), progress=bar, flush=False)
    assert bar.total == 6 * MiB and bar.n == 6 * MiB
    bar.close()


# ---- the command line against qemu-img -------------------------------------

@pytest.fixture(scope="module")
def images(tmp_path_factory):
    d = tmp_path_factory.mktemp("styles")
    small = str(d / "small.raw")    # copied within the first report's 100 ms
    make_sparse(small, 10 * MiB, [(3 * MiB, seeded_bytes(MiB, 5))])
    big = str(d / "big.raw")        # long enough for reports on the way
    make_sparse(big, 512 * MiB, [(i * 16 * MiB, seeded_bytes(MiB, i)) for i in range(32)])
    return {"small": small, "big": big, "dir": str(d)}


def run(cmd, env, **kw):
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                          timeout=120, **kw)


@needs_qemu_img
@pytest.mark.parametrize("fmt", ["raw", "qcow2"])
def test_convert_prints_qemus_bytes(images, tmp_path, imgcopy_env, fmt):
    """A copy qemu-img finishes between two reports: the same bytes."""
    ours = run(imgcopy_cmd() + ["convert", "-p", "-O", fmt, images["small"],
                                str(tmp_path / "ours")], imgcopy_env)
    theirs = run(["qemu-img", "convert", "-p", "-O", fmt, images["small"],
                  str(tmp_path / "theirs")], imgcopy_env)
    assert theirs.returncode == ours.returncode == 0, (theirs.stderr, ours.stderr)
    assert theirs.stdout == q(0, 100, 100).encode() + b"\n"
    assert ours.stderr == b""
    # the same bytes unless this copy outlasted a report's slice (a loaded
    # machine): then qemu-img's framing, with reports on the way
    if ours.stdout != theirs.stdout:
        check_reports(ours.stdout)


@needs_qemu_img
def test_convert_failure_prints_qemus_bytes(images, tmp_path, imgcopy_env):
    missing = str(tmp_path / "missing.raw")
    ours = run(imgcopy_cmd() + ["convert", "-p", missing, str(tmp_path / "o")], imgcopy_env)
    theirs = run(["qemu-img", "convert", "-p", missing, str(tmp_path / "t")], imgcopy_env)
    assert ours.returncode == theirs.returncode == 1
    assert ours.stdout == theirs.stdout == q(0).encode() + b"\n"
    assert ours.stderr.startswith(b"imgcopy: ") and b"\r" not in ours.stderr


def check_reports(stdout, steps=True):
    """qemu-img's framing: reports only, 0.00 first, never back, more than
    min_skip apart, 100.00 twice at the end, one newline."""
    assert stdout.endswith(b"\r\n"), stdout[-80:]
    assert REPORT.sub(b"", stdout[:-1]) == b"", stdout
    percents = [float(p) for p in REPORT.findall(stdout)]
    assert percents[0] == 0.0 and percents[-2:] == [100.0, 100.0], percents
    assert percents == sorted(percents), percents
    if steps:  # 100 is drawn however close the last report was
        below = [p for p in percents if p < 100.0]
        assert all(b - a > 1.0 for a, b in zip(below, below[1:])), percents
    return percents


@needs_qemu_img
def test_convert_reports_along_the_way_are_framed_as_qemus(images, tmp_path, imgcopy_env):
    theirs = run(["qemu-img", "convert", "-p", images["big"], str(tmp_path / "theirs")],
                 imgcopy_env)
    assert theirs.returncode == 0, theirs.stderr
    assert len(check_reports(theirs.stdout)) > 3
    # a second or two of data read 4 KiB at a time (zeros now cost a copy
    # next to nothing: they cannot make it last)
    with slow_export("96M") as srv:
        ours = run(imgcopy_cmd() + ["convert", "-p", "--request-size", "4k", srv.uri,
                                    "null:"], imgcopy_env)
    assert ours.returncode == 0, ours.stderr
    assert len(check_reports(ours.stdout)) > 3, ours.stdout     # some on the way
    assert ours.stderr == b""


def test_checksum_prints_converts_reports(images, imgcopy_env):
    """One style for every command: checksum -p's reports are convert -p's,
    one set per file, each ended before the file's digest."""
    p = run(imgcopy_cmd() + ["checksum", "-p", images["small"], images["big"]], imgcopy_env)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.split(b"\n")
    assert lines[-1] == b"" and len(lines) == 5, p.stdout
    for reports, digest, name in ((lines[0], lines[1], "small"), (lines[2], lines[3], "big")):
        check_reports(reports + b"\n")
        assert digest == ("%s  %s" % (imgcopy.checksum(images[name]), images[name])).encode()
    assert p.stderr == b""


def test_checksum_failure_ends_the_line_first(tmp_path, imgcopy_env):
    p = run(imgcopy_cmd() + ["checksum", "-p", str(tmp_path / "missing.raw")], imgcopy_env)
    assert p.returncode == 1
    assert p.stdout == q(0).encode() + b"\n"


def test_stats_json_keeps_stdout_json(images, tmp_path, imgcopy_env):
    p = run(imgcopy_cmd() + ["convert", "-p", "--stats=json", images["small"],
                             str(tmp_path / "o")], imgcopy_env)
    assert p.returncode == 0, p.stderr
    import json
    json.loads(p.stdout)
    # the reports go to stderr, qemu's lines from 0 to 100; those between
    # are as many as the copy's pace lets the reporter see (a slow run
    # shows one at 90%)
    err = p.stderr.decode()
    assert err.startswith(q(0)) and err.endswith(q(100, 100) + "\n"), err
    shown = [float(x.strip()[1:].split("/")[0]) for x in err.rstrip("\n").split("\r") if x]
    assert err == q(*shown) + "\n" and shown == sorted(shown), err


# ---- on a terminal ----------------------------------------------------------

def run_on_a_terminal(cmd, env):
    """cmd with its stdout a terminal: (status, what it drew)."""
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen(cmd, stdout=slave, stderr=subprocess.PIPE, env=env)
        os.close(slave)
        slave = -1
        seen = b""
        while True:
            r, _, _ = select.select([master], [], [], 60)
            assert r, "no output from %r" % cmd
            try:
                chunk = os.read(master, 65536)
            except OSError:   # EIO: the child closed the terminal
                break
            if not chunk:
                break
            seen += chunk
        assert proc.wait(timeout=60) == 0, proc.stderr.read()
        proc.stderr.close()
        return seen
    finally:
        os.close(master)
        if slave >= 0:
            os.close(slave)


BAR = re.compile(rb"    \((\d+\.\d\d)/100%\) \[(#*) *\]\r")


@pytest.mark.parametrize("command", ["convert", "checksum", "compare"])
def test_a_bar_on_a_terminal(images, tmp_path, imgcopy_env, command):
    src = images["small"]
    args = {"convert": ["convert", "-p", src, str(tmp_path / "o")],
            "checksum": ["checksum", "-p", src],
            "compare": ["compare", "-p", src, src]}[command]
    seen = run_on_a_terminal(imgcopy_cmd() + args, imgcopy_env)
    bars = BAR.findall(seen)
    assert bars and bars[0] == (b"0.00", b"") and bars[-1] == (b"100.00", b"#" * 40), seen
    if command == "compare":   # the verdict is written over a blanked bar
        blank = b" " * len(b"    (100.00/100%) [" + b"#" * 40 + b"]") + b"\r"
        assert blank + b"Images are identical.\r\n" in seen, seen
