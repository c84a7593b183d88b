"""`imgcopy convert` on the command line: every flag maps onto the library's
options (same output, same counters), --stats=json, the progress bar,
errors as one line with exit status 1, and Ctrl-C (SIGINT: status 130)."""

import json
import os
import re
import select
import signal
import subprocess
import sys
import time

import pytest

from .convert_helpers import STATS_KEYS, imgcopy_cmd
from .servers import slow_export
from .gen.sparse import garbage, make_sparse
from .oracles import (assert_prefix_equal, assert_same_content, qemu_map, sha256_file,
                      sha256_range)

imgcopy = pytest.importorskip("imgcopy")


def run_cli(args, env, *, module=False, cwd=None, timeout=60):
    cmd = ([sys.executable, "-m", "imgcopy"] if module else imgcopy_cmd()) + ["convert"]
    return subprocess.run(cmd + [str(a) for a in args], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, env=env, cwd=cwd, timeout=timeout)


# Deterministic counters (the rest - elapsed, cache counters - may vary).
COMPARED = ("bytes_read", "bytes_written", "bytes_zeroed", "bytes_skipped", "read_requests",
            "write_requests", "zero_requests", "extents")

# flags -> library keyword arguments; "target" says what the destination is
FLAG_CASES = [
    ([], {}, "new"),
    (["-f", "raw", "-O", "raw", "-S", "8k"],
     {"src_format": "raw", "dst_format": "raw", "sparse_threshold": 8192}, "new"),
    (["-S", "0"], {"sparse_threshold": 0}, "new"),
    (["-S", "512", "-T", "none"], {"sparse_threshold": 512, "direct": (True, False)}, "new"),
    (["-S", "64K", "-t", "none", "-T", "none"],
     {"sparse_threshold": 65536, "direct": (True, True)}, "new"),
    (["-m", "1", "--in-order", "-t", "unsafe"],
     {"concurrency": 1, "out_of_order": False, "flush": False}, "new"),
    (["-W", "-m", "8", "--no-flush"], {"concurrency": 8, "out_of_order": True, "flush": False},
     "new"),
    (["--request-size", "64k"], {"request_size": 65536}, "new"),
    (["--request-size", "1M", "-S", "16k"], {"request_size": 1 << 20,
                                              "sparse_threshold": 16384}, "new"),
    (["-C"], {"offload": True}, "new"),
    (["-n"], {"create": False}, "garbage"),
    (["-n", "-S", "0"], {"create": False, "sparse_threshold": 0}, "garbage"),
    (["-n", "--target-is-zero"], {"create": False, "target_is_zero": True}, "zeros"),
    (["-O", "null"], {"dst_format": "null"}, "null-format"),
    ([], {}, "null:"),
]


def _case_id(case):
    flags, _, target = case
    return ("_".join(f.lstrip("-") for f in flags) or "defaults") + "-" + target


def _make_target(path, kind, size):
    if kind == "garbage":
        garbage(path, size + 12345, seed=size)
    elif kind == "zeros":
        make_sparse(path, size + 4096)


@pytest.mark.parametrize("case", FLAG_CASES, ids=_case_id)
def test_flags_map_onto_library(convert_sources, tmp_path, imgcopy_env, case):
    flags, kwargs, target = case
    img = convert_sources.get("alloc_zeros")
    if target in ("null:",):
        cli_dst = lib_dst = "null:"
    else:
        cli_dst, lib_dst = str(tmp_path / "cli.raw"), str(tmp_path / "lib.raw")
        _make_target(cli_dst, target, img.size)
        _make_target(lib_dst, target, img.size)
    tails = {}
    if target in ("garbage", "zeros"):
        tails = {p: sha256_range(p, img.size) for p in (cli_dst, lib_dst)}

    p = run_cli(flags + ["--stats=json", img.path, cli_dst], imgcopy_env, cwd=str(tmp_path))
    assert p.returncode == 0, p.stderr
    assert p.stderr == ""
    cli = json.loads(p.stdout)
    lib = imgcopy.convert(img.path, lib_dst, **kwargs).to_dict()

    assert set(cli) == set(STATS_KEYS)
    assert {k: cli[k] for k in COMPARED} == {k: lib[k] for k in COMPARED}, (cli, lib)
    assert cli["bytes_written"] + cli["bytes_zeroed"] + cli["bytes_skipped"] == img.size

    if target.startswith("null"):
        assert sorted(os.listdir(tmp_path)) == [], "a null destination created a file"
        return
    if target == "new":
        # the maps before any read: ext4 reports an unwritten extent (the
        # fallocated zeros of -S 0) as data once its pages are cached
        assert qemu_map(cli_dst).extents == qemu_map(lib_dst).extents
        assert_same_content(img.path, cli_dst, "raw", "raw")
    else:
        assert_prefix_equal(img.path, cli_dst, img.size)
        assert_prefix_equal(img.path, lib_dst, img.size)
        for path, tail in tails.items():
            assert sha256_range(path, img.size) == tail, "tail of %s changed" % path


def test_python_module(convert_sources, tmp_path, imgcopy_env):
    img = convert_sources.get("holes_and_data")
    dst = str(tmp_path / "out.raw")
    p = run_cli(["-S", "4k", img.path, dst], imgcopy_env, module=True, cwd=str(tmp_path))
    assert p.returncode == 0, p.stderr
    assert p.stdout == "" and p.stderr == ""
    assert_same_content(img.path, dst, "raw", "raw")


def test_stats_json(convert_sources, tmp_path, imgcopy_env):
    img = convert_sources.get("holes_and_data")
    dst = str(tmp_path / "out.raw")
    p = run_cli(["--stats=json", img.path, dst], imgcopy_env)
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert set(d) == set(STATS_KEYS)
    assert all(isinstance(d[k], int) for k in STATS_KEYS if k != "elapsed")
    assert isinstance(d["elapsed"], (int, float)) and d["elapsed"] >= 0
    assert d["bytes_written"] + d["bytes_zeroed"] + d["bytes_skipped"] == img.size
    assert d["bytes_zeroed"] == 0  # a new file reads as zeros
    assert_same_content(img.path, dst, "raw", "raw")
    # no --stats: nothing on stdout
    p = run_cli([img.path, str(tmp_path / "out2.raw")], imgcopy_env)
    assert p.returncode == 0 and p.stdout == "" and p.stderr == "", (p.stdout, p.stderr)


def test_progress_bar(convert_sources, tmp_path, imgcopy_env):
    img = convert_sources.get("alloc_zeros")
    dst = str(tmp_path / "out.raw")
    p = run_cli(["-p", img.path, dst], imgcopy_env)
    assert p.returncode == 0, p.stderr
    # qemu-img's reports, on stdout as qemu-img prints them
    assert "(100.00/100%)" in p.stdout and p.stdout.endswith("\n"), repr(p.stdout)
    assert p.stderr == ""
    assert_same_content(img.path, dst, "raw", "raw")


def test_progress_bar_with_stats(convert_sources, tmp_path, imgcopy_env):
    # the bar is on stderr: stdout stays pure JSON
    img = convert_sources.get("alloc_zeros")
    p = run_cli(["-p", "--stats=json", img.path, str(tmp_path / "out.raw")], imgcopy_env)
    assert p.returncode == 0, p.stderr
    json.loads(p.stdout)
    assert "100" in p.stderr


# ---------------------------------------------------------------------------
# errors: exit 1, one line on stderr starting with "imgcopy: ", no traceback

def _assert_one_line_error(p, *needles):
    assert p.returncode == 1, (p.returncode, p.stderr)
    assert "Traceback" not in p.stderr, p.stderr
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("imgcopy: "), p.stderr
    assert p.stdout == "", p.stdout
    for n in needles:
        assert n in lines[0], (n, lines[0])


def test_error_missing_source(tmp_path, imgcopy_env):
    src = str(tmp_path / "missing.raw")
    dst = tmp_path / "out.raw"
    p = run_cli([src, str(dst)], imgcopy_env)
    _assert_one_line_error(p, src)
    assert not dst.exists()


def test_error_missing_destination_directory(convert_sources, tmp_path, imgcopy_env):
    img = convert_sources.get("tiny")
    dst = str(tmp_path / "nodir" / "out.raw")
    p = run_cli([img.path, dst], imgcopy_env)
    _assert_one_line_error(p, dst)


def test_error_target_is_zero_without_n(convert_sources, tmp_path, imgcopy_env):
    img = convert_sources.get("tiny")
    dst = tmp_path / "out.raw"
    p = run_cli(["--target-is-zero", img.path, str(dst)], imgcopy_env)
    _assert_one_line_error(p, "-n")
    assert not dst.exists()


def test_error_bad_sparse_threshold(convert_sources, tmp_path, imgcopy_env):
    img = convert_sources.get("tiny")
    dst = tmp_path / "out.raw"
    p = run_cli(["-S", "1000", img.path, str(dst)], imgcopy_env)
    _assert_one_line_error(p)
    assert not dst.exists()


def test_error_existing_destination_too_small(convert_sources, tmp_path, imgcopy_env):
    img = convert_sources.get("holes_and_data")
    dst = str(tmp_path / "small.raw")
    garbage(dst, 4096, seed=1)
    before = sha256_file(dst)
    p = run_cli(["-n", img.path, dst], imgcopy_env)
    _assert_one_line_error(p)
    assert sha256_file(dst) == before


def test_error_existing_destination_missing(convert_sources, tmp_path, imgcopy_env):
    img = convert_sources.get("tiny")
    dst = str(tmp_path / "none.raw")
    p = run_cli(["-n", img.path, dst], imgcopy_env)
    _assert_one_line_error(p, dst)
    assert not os.path.exists(dst)


# ---------------------------------------------------------------------------
# Ctrl-C

def _wait_for_progress(proc, timeout=20.0):
    """Read the child's stdout until its progress shows; return it."""
    fd = proc.stdout.fileno()
    seen = b""
    deadline = time.monotonic() + timeout
    while b"%" not in seen:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError("no progress from the child: %r" % seen)
        r, _, _ = select.select([fd], [], [], left)
        if r:
            chunk = os.read(fd, 4096)
            if not chunk:
                raise AssertionError("child exited (status %r) before copying: %r"
                                     % (proc.wait(), seen))
            seen += chunk
    return seen


def _interrupt(tmp_path, env, dest, merged=False):
    """Start a long copy with -p, SIGINT it once its progress shows.
    Returns (returncode, seconds from SIGINT to exit, stderr, stdout,
    files the copy left in tmp_path); merged: stderr goes to stdout's pipe
    (returned as stdout, in the order written)."""
    with slow_export() as srv:
        return _interrupt_copy(tmp_path, env, srv.uri, dest, merged)


def _interrupt_copy(tmp_path, env, src, dest, merged=False):
    dst = str(tmp_path / "out.raw") if dest == "file" else "null:"
    # 20 GiB of data to read 4 KiB at a time: many seconds
    args = ["-p", "--request-size", "4k", src, dst]
    proc = subprocess.Popen(imgcopy_cmd() + ["convert"] + args, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT if merged else subprocess.PIPE, env=env)
    try:
        seen = _wait_for_progress(proc)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pytest.fail("imgcopy did not stop within 10 s of SIGINT")
        elapsed = time.monotonic() - t0
        out = (seen + proc.stdout.read()).decode(errors="replace")
        err = "" if merged else proc.stderr.read().decode(errors="replace")
        left = sorted(os.listdir(str(tmp_path)))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        if not merged:
            proc.stderr.close()
        if os.path.exists(dst):
            os.unlink(dst)
    return proc.returncode, elapsed, err, out, left


@pytest.mark.parametrize("dest", ["file", "null"])
def test_sigint(tmp_path, imgcopy_env, dest):
    rc, elapsed, err, out, left = _interrupt(tmp_path, imgcopy_env, dest)
    assert left == [], "an interrupted copy left %s" % left
    assert rc == 130, (rc, err)
    assert elapsed < 1.0, "exit took %.2f s after SIGINT" % elapsed
    assert "Traceback" not in err, err
    assert err == "imgcopy: interrupted\n", err
    # qemu-img's reports, the line ended: no 100% for a copy that stopped
    assert re.fullmatch(r"(    \(\d+\.\d\d/100%\)\r)+\n", out), repr(out)
    assert "(100.00/100%)" not in out


def test_sigint_message_starts_a_line(tmp_path, imgcopy_env):
    """The error after the progress reports is a line of its own, starting
    with "imgcopy: " (their line is ended first)."""
    rc, _, _, out, _ = _interrupt(tmp_path, imgcopy_env, "null", merged=True)
    assert rc == 130
    assert out.endswith("\r\nimgcopy: interrupted\n"), \
        "error glued to the progress reports: %r" % out[-120:]


def test_main_in_process_gives_sigint_back(tmp_path):
    """convert ignores Ctrl-C once the copy is committed; run in a caller's
    own process (a test, a notebook), main() puts the caller's SIGINT
    handler back, so programs the caller starts later do not inherit
    SIG_IGN and stay interruptible."""
    from imgcopy import cli
    src = str(tmp_path / "src.raw")
    make_sparse(src, 1 << 20, [(0, b"x" * 4096)])
    before = signal.getsignal(signal.SIGINT)
    assert cli.main(["convert", src, str(tmp_path / "dst.raw")]) == 0
    assert signal.getsignal(signal.SIGINT) is before
    assert cli.main(["convert", src, str(tmp_path / "missing-dir" / "dst.raw")]) == 1
    assert signal.getsignal(signal.SIGINT) is before
