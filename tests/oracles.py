"""qemu's tools as the oracle of the test-suite: every test runs qemu-img,
qemu-io (and finds qemu-nbd, nbdkit) through this module.

- :func:`run` runs any program; a failure raises :class:`ToolFailed`, an
  AssertionError whose message holds the command, its directory, its exit
  status and the end of its stdout and stderr.
- :func:`qemu_img` and :func:`qemu_io` run qemu's tools; :func:`qemu_info`,
  :func:`qemu_map`, :func:`qemu_check`, :func:`qemu_measure` return what
  they print with ``--output=json``, parsed; :func:`qemu_compare` /
  :func:`assert_same_content` compare guest bytes.
- The rest reads qemu's answers: map entries as tuples, clipped, merged
  into layouts; a raw source's :class:`Layout`; content digests.

Nothing here imports imgcopy.  A missing tool skips the test that asks for
it (``require_qemu_img()``, or the ``needs_qemu*`` marks).
"""

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
from typing import Any, Dict, List, NamedTuple, Optional

import pytest

# --------------------------------------------------------------------------
# the tools

QEMU_IMG = shutil.which("qemu-img")
QEMU_IO = shutil.which("qemu-io")
QEMU_NBD = shutil.which("qemu-nbd")
NBDKIT = shutil.which("nbdkit")
HAVE_QEMU = QEMU_IMG is not None and QEMU_IO is not None

NO_QEMU_IMG = "qemu-img not found on PATH (install qemu-utils); it is the test oracle"
NO_QEMU_IO = "qemu-io not found on PATH (install qemu-utils)"
NO_QEMU = "qemu-img/qemu-io not found on PATH (install qemu-utils); they are the test oracle"

needs_qemu_img = pytest.mark.skipif(QEMU_IMG is None, reason=NO_QEMU_IMG)
needs_qemu_io = pytest.mark.skipif(QEMU_IO is None, reason=NO_QEMU_IO)
needs_qemu = pytest.mark.skipif(not HAVE_QEMU, reason=NO_QEMU)

# a command that hangs fails its test instead of the whole run
TIMEOUT = 600


def require_qemu_img():
    if QEMU_IMG is None:
        pytest.skip(NO_QEMU_IMG)


def require_qemu_io():
    if QEMU_IO is None:
        pytest.skip(NO_QEMU_IO)


def require_qemu():
    if not HAVE_QEMU:
        pytest.skip(NO_QEMU)


# --------------------------------------------------------------------------
# running them

class ToolFailed(AssertionError):
    """A program the tests ran failed: the message says which, where and why."""

    def __init__(self, p: subprocess.CompletedProcess, cwd=None, why=None):
        self.result = p
        out, err = (s.decode(errors="replace") if isinstance(s, bytes) else s or ""
                    for s in (p.stdout, p.stderr))
        super().__init__("%s\n  in %s: %s\n  stdout: %s\n  stderr: %s" % (
            command_line(p.args), cwd or os.getcwd(),
            why or "exit status %d" % p.returncode, out[-3000:].rstrip(), err[-3000:].rstrip()))


def command_line(argv) -> str:
    return " ".join(shlex.quote(os.fsdecode(a) if isinstance(a, bytes) else str(a))
                    for a in argv)


def _arg(a):
    return os.fsdecode(a) if isinstance(a, (bytes, os.PathLike)) else str(a)


def run(argv, *, cwd=None, input=None, env=None, timeout=TIMEOUT, check=True,
        text=True) -> subprocess.CompletedProcess:
    """Run argv (stdout and stderr captured; str unless text=False).  With
    check, a non-zero exit status raises ToolFailed."""
    argv = [_arg(a) for a in argv]
    kw: Dict[str, Any] = dict(encoding="utf-8") if text else {}
    if input is None:
        kw["stdin"] = subprocess.DEVNULL    # nothing waits for the test's terminal
    p = subprocess.run(argv, cwd=None if cwd is None else os.fspath(cwd), input=input, env=env,
                       timeout=timeout, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)
    if check and p.returncode != 0:
        raise ToolFailed(p, cwd)
    return p


def qemu_img(*args, cwd=None, env=None, check=True, timeout=TIMEOUT,
             text=True) -> subprocess.CompletedProcess:
    """``qemu-img ARGS`` (skips the test if qemu-img is missing)."""
    require_qemu_img()
    return run([QEMU_IMG, *args], cwd=cwd, env=env, check=check, timeout=timeout, text=text)


def qemu_io_args(*args, cwd=None, env=None, check=True,
                 timeout=TIMEOUT) -> subprocess.CompletedProcess:
    """``qemu-io ARGS`` as given (exit status checked only)."""
    require_qemu_io()
    return run([QEMU_IO, *args], cwd=cwd, env=env, check=check, timeout=timeout)


_QEMU_IO_FAILED = ("error", "fail", "invalid", "usage")


def qemu_io(path, commands, *, fmt="raw", cache=None, read_only=False, cwd=None,
            check=True, timeout=TIMEOUT) -> subprocess.CompletedProcess:
    """``qemu-io [-t CACHE] [-r] [-f FMT] -c CMD... PATH``.  qemu-io exits 0
    when a command fails (a refused write, a failed ``read -P`` pattern
    check): with check, any such word in its output raises ToolFailed too."""
    args = []
    if cache:
        args += ["-t", cache]
    if read_only:
        args.append("-r")
    if fmt:
        args += ["-f", fmt]
    for c in commands:
        args += ["-c", c]
    p = qemu_io_args(*args, path, cwd=cwd, check=check, timeout=timeout)
    said = (p.stdout + p.stderr).lower()
    if check and any(w in said for w in _QEMU_IO_FAILED):
        raise ToolFailed(p, cwd, "a command failed")
    return p


# --------------------------------------------------------------------------
# qemu-img's JSON answers

def qemu_info(path, fmt=None, *, backing_chain=False, force_share=False, cwd=None, env=None):
    """``qemu-img info --output=json``: a dict (a list with backing_chain)."""
    args = ["info", "--output=json"]
    if force_share:
        args.append("-U")
    if fmt:
        args += ["-f", fmt]
    if backing_chain:
        args.append("--backing-chain")
    return json.loads(qemu_img(*args, path, cwd=cwd, env=env).stdout)


def qemu_chain(path, cwd=None):
    """[(filename, format), ...] of the backing files, as qemu-img info names them."""
    return [(d["filename"], d["format"])
            for d in qemu_info(path, backing_chain=True, cwd=cwd)[1:]]


def qemu_measure(path=None, *, fmt=None, out_fmt="qcow2", size=None, options=None,
                 cwd=None) -> dict:
    """``qemu-img measure --output=json [-f FMT] -O OUT_FMT [-o OPTS] (PATH | --size N)``."""
    args = ["measure", "--output=json", "-O", out_fmt]
    if fmt:
        args += ["-f", fmt]
    if options:
        args += ["-o", options]
    args += ["--size", str(size)] if path is None else [path]
    return json.loads(qemu_img(*args, cwd=cwd).stdout)


class QemuMap(NamedTuple):
    """Result of ``qemu-img map --output=json``: parsed list and raw stdout."""
    extents: list
    text: str


def map_args(path, fmt="raw", start=None, length=None, output=None, force_share=True):
    """Argument list for ``qemu-img map`` (without the program name)."""
    args = ["map"]
    if force_share:
        args.append("-U")
    if fmt is not None:
        args += ["-f", fmt]
    if output is not None:
        args.append("--output=%s" % output)
    if start is not None:
        args += ["--start-offset", str(start)]
    if length is not None:
        args += ["--max-length", str(length)]
    args.append(os.fspath(path))
    return args


def qemu_map(path, fmt="raw", start=None, length=None, *, force_share=True, cwd=None) -> QemuMap:
    """``qemu-img map [-U] [-f FMT] --output=json [--start-offset S] [--max-length L] PATH``.

    Returns QemuMap(extents=<parsed JSON list>, text=<stdout, exactly>);
    fmt=None lets qemu probe."""
    p = qemu_img(*map_args(path, fmt, start, length, "json", force_share), cwd=cwd)
    return QemuMap(json.loads(p.stdout), p.stdout)


def qemu_map_human(path, fmt="raw", start=None, length=None, *, force_share=True,
                   cwd=None) -> str:
    """stdout of ``qemu-img map [-f FMT] [...] PATH`` (human format)."""
    return qemu_img(*map_args(path, fmt, start, length, None, force_share), cwd=cwd).stdout


class Check(NamedTuple):
    text: str           # qemu-img check (human)
    data: dict          # qemu-img check --output=json
    fragmented: float   # percent, from the human output


def qemu_check(path, fmt=None, *, strict=False, cwd=None) -> Check:
    """``qemu-img check`` (human and JSON) must exit 0 and find no errors.
    strict: nor any leak, corruption, OFLAG_COPIED error or warning."""
    f = ["-f", fmt] if fmt else []
    p = qemu_img("check", *f, path, cwd=cwd, check=False)
    text = p.stdout + p.stderr
    assert p.returncode == 0, "qemu-img check %s: rc=%d\n%s" % (path, p.returncode, text[-3000:])
    assert "No errors were found on the image." in p.stdout, text[-3000:]
    j = qemu_img("check", *f, "--output=json", path, cwd=cwd, check=False)
    assert j.returncode == 0, (j.returncode, j.stdout, j.stderr)
    data = json.loads(j.stdout)
    if strict:
        for bad in ("leaked", "Leaked", "ERROR", "corrupt", "OFLAG_COPIED", "Warning"):
            assert bad not in text, (bad, text[-3000:])
        for key in ("leaks", "corruptions", "check-errors", "leaks-fixed", "corruptions-fixed"):
            assert data.get(key, 0) == 0, (key, data)
    m = re.search(r"([0-9.]+)% fragmented", p.stdout)
    return Check(p.stdout, data, float(m.group(1)) if m else 0.0)


def qemu_compare(a, b, fmt_a=None, fmt_b=None, *, force_share=False, strict=False,
                 cwd=None) -> subprocess.CompletedProcess:
    """``qemu-img compare [-U] [-s] [-f FMT_A] [-F FMT_B] A B`` (exit 0: identical)."""
    args = ["compare"]
    if force_share:
        args.append("-U")
    if strict:
        args.append("-s")
    if fmt_a:
        args += ["-f", fmt_a]
    if fmt_b:
        args += ["-F", fmt_b]
    return qemu_img(*args, a, b, cwd=cwd, check=False)


def assert_same_content(a, b, fmt_a=None, fmt_b=None, *, force_share=False, cwd=None):
    """qemu-img compare A B: identical guest bytes (formats probed unless given)."""
    p = qemu_compare(a, b, fmt_a, fmt_b, force_share=force_share, cwd=cwd)
    assert p.returncode == 0 and "Images are identical" in p.stdout, (
        "%s: rc=%d %s%s" % (command_line(p.args), p.returncode, p.stdout, p.stderr))


def assert_converts_back(src, dst, tmpdir, src_fmt="raw"):
    """qemu-img converts the qcow2 image dst back to raw, identical to src."""
    back = os.path.join(os.fspath(tmpdir), os.path.basename(os.fspath(dst)) + ".back.raw")
    try:
        qemu_img("convert", "-f", "qcow2", "-O", "raw", dst, back)
        p = qemu_compare(back, src, "raw", src_fmt, force_share=True)
        assert p.returncode == 0, ("round trip", p.stdout, p.stderr)
    finally:
        if os.path.exists(back):
            os.unlink(back)


def verify_qcow2(src, dst, *, virtual_size, cluster_size=64 << 10, compat="1.1",
                 src_fmt="raw", tmpdir=None, roundtrip=False, compressed=False) -> Check:
    """Everything every qcow2 image imgcopy writes must satisfy: qemu-img
    info's size, cluster size and compat, a strictly clean check, the
    source's content.  Compressed images are compared through ``qemu-img
    convert -O raw`` (qemu-img compare of a raw file against a compressed
    image takes seconds)."""
    info = qemu_info(dst, force_share=True)
    assert info["format"] == "qcow2", info
    assert info["virtual-size"] == virtual_size, (info["virtual-size"], virtual_size)
    assert info["cluster-size"] == cluster_size, info
    fs = info["format-specific"]["data"]
    assert fs["compat"] == compat, fs
    if compat == "1.1":
        assert fs.get("corrupt") is False, fs
    assert "backing-filename" not in info, info
    c = qemu_check(dst, "qcow2", strict=True)
    tmpdir = tmpdir or os.path.dirname(os.fspath(dst))
    if compressed:
        assert_converts_back(src, dst, tmpdir, src_fmt)
        return c
    assert_same_content(src, dst, src_fmt, "qcow2", force_share=True)
    if roundtrip:
        assert_converts_back(src, dst, tmpdir, src_fmt)
    return c


# --------------------------------------------------------------------------
# reading qemu-img map's answers

# Field order of imgcopy.Extent
FIELDS = ("start", "length", "depth", "present", "zero", "data", "host_offset")


def entry_tuple(d) -> tuple:
    """qemu JSON entry -> tuple in imgcopy.Extent field order (offset None if absent)."""
    return (d["start"], d["length"], d["depth"], d["present"], d["zero"], d["data"], d.get("offset"))


def extent_tuple(e) -> tuple:
    """imgcopy.Extent (by field name) or a 7-sequence -> plain tuple with normalised types."""
    if hasattr(e, "start"):
        s, l, depth, present, zero, data, off = (getattr(e, f) for f in FIELDS)
    else:
        s, l, depth, present, zero, data, off = e
    return (int(s), int(l), int(depth), bool(present), bool(zero), bool(data), None if off is None else int(off))


def clip_entries(entries, size, start=0, length=None) -> List[tuple]:
    """Clip qemu's JSON entries to [start, min(start+length, size)).

    qemu rounds a raw file's size up to 512 and reports the tail past EOF; the
    empty-range placeholder entry (length 0, present false) is dropped too.
    Offsets move with the clipped start when valid.
    """
    end = size if length is None else min(size, start + length)
    out = []
    for d in entries:
        s, l, depth, present, zero, data, off = entry_tuple(d)
        a, b = max(s, start), min(s + l, end)
        if b <= a:
            continue
        if off is not None:
            off += a - s
        out.append((a, b - a, depth, present, zero, data, off))
    return out


def find_covering(tuples, offset) -> Optional[tuple]:
    """The clipped qemu extent (tuple) containing byte `offset`, or None."""
    for t in tuples:
        if t[0] <= offset < t[0] + t[1]:
            return t
    return None


def covering(entries, offset) -> Optional[dict]:
    """The qemu JSON entry containing byte `offset`, or None."""
    for d in entries:
        if d["start"] <= offset < d["start"] + d["length"]:
            return d
    return None


LAYOUT_FIELDS = ("start", "length", "depth", "present", "zero", "data")


def layout(entries) -> List[tuple]:
    """Map entries on start/length/depth/present/zero/data (host offsets
    dropped: two tools place clusters differently), neighbours with equal
    flags merged (qemu merges only host-contiguous ones)."""
    out: List[list] = []
    for d in entries:
        t = [d[f] for f in LAYOUT_FIELDS]
        if out and out[-1][0] + out[-1][1] == t[0] and out[-1][2:] == t[2:]:
            out[-1][1] += t[1]
        else:
            out.append(t)
    return [tuple(t) for t in out]


def cluster_layout(entries, cluster_size, size) -> List[tuple]:
    """For every cluster, the sorted set of (present, zero, data) states
    that qemu-img map reports inside it."""
    n = (size + cluster_size - 1) // cluster_size
    out: List[set] = [set() for _ in range(n)]
    for d in entries:
        if d["start"] >= size:
            continue
        first = d["start"] // cluster_size
        last = (min(d["start"] + d["length"], size) - 1) // cluster_size
        state = (d["present"], d["zero"], d["data"])
        for c in range(first, last + 1):
            out[c].add(state)
    return [tuple(sorted(s)) for s in out]


def diff_layouts(a, b, limit=5) -> str:
    lines = ["%d vs %d entries" % (len(a), len(b))]
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            lines.append("#%d: %r != %r" % (i, x, y))
            if len(lines) > limit:
                break
    return "\n".join(lines)


def host_order_violations(entries) -> List[tuple]:
    """Pairs of guest-ordered data extents whose host offsets go backwards
    or overlap (compressed extents have no offset and are skipped)."""
    bad = []
    prev = None
    for d in sorted(entries, key=lambda e: e["start"]):
        if "offset" not in d or not d["data"]:
            continue
        if prev is not None and d["offset"] < prev["offset"] + prev["length"]:
            bad.append((prev, d))
        prev = d
    return bad


def data_extents(entries) -> List[list]:
    """The data entries of a map, guest-adjacent ones merged: [[start, end]]."""
    merged: List[list] = []
    for e in entries:
        if not e["data"]:
            continue
        start, end = e["start"], e["start"] + e["length"]
        if merged and merged[-1][1] == start:
            merged[-1][1] = end
        else:
            merged.append([start, end])
    return merged


class Layout(NamedTuple):
    """What qemu-img map says of a raw source, clipped to its size."""
    size: int
    data_bytes: int   # bytes that must be read (data, not zero)
    runs: int         # alternating data / zero runs (neighbours merged)


def source_layout(path) -> Layout:
    size = os.path.getsize(path)
    entries = clip_entries(qemu_map(path).extents, size)
    data = 0
    runs = 0
    last = None
    for (_s, length, _d, _p, zero, is_data, _o) in entries:
        kind = bool(is_data) and not zero
        if kind:
            data += length
        if kind != last:
            runs += 1
            last = kind
    return Layout(size, data, runs)


# --------------------------------------------------------------------------
# content

def sha256_file(path) -> str:
    return sha256_range(path, 0)


def sha256_range(path, start, length=None) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        f.seek(start)
        left = length
        while left is None or left > 0:
            n = 1 << 20 if left is None else min(1 << 20, left)
            chunk = f.read(n)
            if not chunk:
                break
            h.update(chunk)
            if left is not None:
                left -= len(chunk)
    return h.hexdigest()


def assert_prefix_equal(src, dst, size):
    """The first `size` bytes of dst equal src (dst may be larger)."""
    if size == 0:
        return
    p = run(["cmp", "-n", str(size), src, dst], check=False)
    assert p.returncode == 0, "cmp -n %d %s %s: %s%s" % (size, src, dst, p.stdout, p.stderr)
