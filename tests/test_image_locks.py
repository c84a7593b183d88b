"""imgcopy locks the image files it opens the way qemu does, and qemu is the oracle.

qemu (block/file-posix.c) takes open-file-description byte-range locks, all of them *shared*
(F_RDLCK, F_OFD_SETLK), one byte per permission bit: byte 100+i while it holds permission i
(0 consistent read, 1 write, 2 write unchanged, 3 resize) and byte 200+i while it refuses to
share permission i.  Before it keeps them it asks (F_OFD_GETLK for a write lock) whether any other
open file holds byte 200+i for a permission it wants, or byte 100+i for one it refuses to share.
The design these tests hold imgcopy to:

- a reader (``imgcopy.open``, ``map``, the CLI's ``map``/``info``) locks like ``qemu-img
  map``/``info``: it fails exactly when they fail;
- ``force_share=True`` / ``-U`` reads anyway, like ``qemu-img -U``;
- a convert source locks like ``qemu-img convert``'s source (write and resize not shared);
- a writer (``mode="r+"``, a convert destination, a file about to be replaced) wants write and
  does not share write or resize, so qemu cannot open for writing what imgcopy writes;
- every file of a backing chain is locked, a backing file as qemu locks one (read only);
- a failed open leaves no lock behind; closing releases every lock.

Every qemu process a test starts is killed when the test ends, whatever its outcome.
"""

import errno
import functools
import os
import re
import subprocess
import sys
import time

import pytest

import imgcopy

from . import oracles
from .oracles import QEMU_IMG, QEMU_IO
from .units import MiB

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT = 30

LOCKED = "locked by another process"            # imgcopy's message
QEMU_SHARED_WRITE = 'Failed to get shared "write" lock'
QEMU_WRITE = 'Failed to get "write" lock'
QEMU_HINT = "Is another process using the image"


pytestmark = [
    oracles.needs_qemu,
    pytest.mark.skipif(not os.path.exists("/proc/locks"), reason="needs Linux /proc/locks"),
]


# -- running things ------------------------------------------------------------------------
# each returns the CompletedProcess, whatever the exit status: ok() and refused() judge it
qemu_img = functools.partial(oracles.qemu_img, check=False, timeout=TIMEOUT)
qemu_io = functools.partial(oracles.qemu_io_args, check=False, timeout=TIMEOUT)


def cli(*args):
    return oracles.run([sys.executable, "-m", "imgcopy", *args], cwd=REPO, check=False,
                       timeout=TIMEOUT)


def ok(r):
    assert r.returncode == 0, "%s failed:\n%s%s" % (r.args, r.stdout, r.stderr)
    return r


def refused(r, *needles):
    """r failed, and its stderr says each of needles."""
    assert r.returncode != 0, "%s succeeded but should have been refused:\n%s" % (r.args, r.stdout)
    for needle in needles:
        assert needle in r.stderr, "%s: %r not in %r" % (r.args, needle, r.stderr)
    return r


class Procs:
    """Processes started by one test; all of them are killed at its end."""

    def __init__(self):
        self.started = []

    def start(self, argv, **kw):
        p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, **kw)
        self.started.append(p)
        return p

    def stop(self, p):
        if p.poll() is None:
            try:
                p.kill()
            except ProcessLookupError:
                pass
        try:
            p.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            pass
        for f in (p.stdin, p.stdout):
            try:
                f.close()
            except (OSError, ValueError):
                pass

    def stop_all(self):
        for p in self.started:
            self.stop(p)


@pytest.fixture
def procs():
    ps = Procs()
    try:
        yield ps
    finally:
        ps.stop_all()


def read_until(p, pattern, timeout=TIMEOUT):
    """What p wrote until its output matches pattern (or it ended: then all of it)."""
    fd = p.stdout.fileno()
    os.set_blocking(fd, False)
    buf = b""
    deadline = time.monotonic() + timeout
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            chunk = None
        if chunk:
            buf += chunk
            if re.search(pattern, buf.decode(errors="replace")):
                return buf.decode(errors="replace")
            continue
        if chunk == b"":
            return buf.decode(errors="replace")
        if time.monotonic() > deadline:
            raise AssertionError("%s: no %r after %ss; got %r" % (p.args, pattern, timeout, buf))
        time.sleep(0.01)


def hold_qemu_io(procs, *args):
    """qemu-io ARGS kept running (stdin is a pipe); returns once its image is open, i.e. once
    its locks are taken (it has answered a command)."""
    p = procs.start([QEMU_IO, *args])
    p.stdin.write(b"length\n")
    p.stdin.flush()
    out = read_until(p, r"\n")
    if "can't open" in out or p.poll() is not None:
        raise AssertionError("qemu-io %s could not open its image: %s" % (" ".join(args), out))
    return p


def hold_qemu_img_convert(procs, *args, timeout=TIMEOUT):
    """``qemu-img convert ARGS`` (a raw source) parked in its copy: its source and target stay
    open, with qemu-img convert's locks on them, until the test kills it.  At one byte a second
    (-r 1) qemu copies the first chunk at once and waits days before the next one (every
    source here has data in two places).  Returns once the source's first sector is in the
    target: qemu writes only after it has opened both images, and it takes or changes no lock
    until it ends, so their locks are final -- whatever the load, no guess at how long
    opening takes or at how long the copy lasts."""
    src, dst = args[-2], args[-1]
    with open(src, "rb") as f:
        first = f.read(512)
    assert first.strip(b"\0"), "%s must start with data" % src
    p = procs.start([QEMU_IMG, "convert", "-r", "1", *args])
    deadline = time.monotonic() + timeout
    while True:
        # a raw target has it at offset 0, a qcow2 target in the cluster allocated for it
        if os.path.exists(dst):
            with open(dst, "rb") as f:
                if first in f.read():
                    break
        if p.poll() is not None:
            raise AssertionError("%s ended (%s) before copying: %r"
                                 % (p.args, p.returncode, p.stdout.read()))
        if time.monotonic() > deadline:
            raise AssertionError("%s copied nothing in %ss" % (p.args, timeout))
        time.sleep(0.01)
    assert file_locks(src) and file_locks(dst), "qemu-img convert copies without locks"
    return p


CHILD = r"""
import sys, imgcopy
src, dst, dst_format, create = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"
first = [True]
def progress(done, total):
    # convert() has both images open here (the 100% report comes before the commit):
    # say so and wait for the test's go-ahead
    if first[0]:
        first[0] = False
        sys.stdout.write("copying\n")
        sys.stdout.flush()
        sys.stdin.readline()
imgcopy.convert(src, dst, src_format="raw", dst_format=dst_format, create=create,
                progress=progress)
sys.stdout.write("done\n")
"""


def hold_imgcopy_convert(procs, src, dst, dst_format, create):
    """imgcopy.convert(src, dst) in a child process, stopped inside its progress callback."""
    p = procs.start([sys.executable, "-c", CHILD, src, dst, dst_format, "1" if create else "0"],
                    cwd=REPO)
    out = read_until(p, r"copying\n")
    if "copying" not in out:
        raise AssertionError("imgcopy convert ended before copying: %s" % out)
    return p


def let_finish(p):
    p.stdin.write(b"\n")
    p.stdin.flush()
    out = read_until(p, r"done\n")
    assert p.wait(timeout=TIMEOUT) == 0 and "done" in out, out


# -- locks ---------------------------------------------------------------------------------
def file_locks(path):
    """Every lock on path's inode in /proc/locks as {(kind, type, byte)}: ranges are cut into
    bytes, since the kernel merges one owner's adjacent ranges (qemu's 100 and 101 show as one
    line "100 101")."""
    st = os.stat(path)
    where = "%02x:%02x:%d" % (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    found = set()
    with open("/proc/locks") as f:
        for line in f:
            fields = line.split()
            if len(fields) < 8 or fields[1] == "->":   # "->": a waiter, not a lock
                continue
            kind, _advisory, ltype, _pid, dev, start, end = fields[1:8]
            if dev != where:
                continue
            if end == "EOF":
                found.add((kind, ltype, int(start), "EOF"))
            else:
                found.update((kind, ltype, b) for b in range(int(start), int(end) + 1))
    return found


def ofd(*byte_numbers):
    """The lock set of qemu's (shared, OFD) locks on these bytes."""
    return {("OFDLCK", "READ", b) for b in byte_numbers}


# qemu 7.2's locks per role, as /proc/locks shows them (measured with qemu-io / qemu-img)
QCOW2_READER = ofd(100, 201, 203)            # consistent read; write, resize not shared
RAW_READER = ofd(100)                        # raw format shares everything
QCOW2_WRITER = ofd(100, 101, 103, 201, 203)  # + write, resize
FORCE_SHARE = ofd(100)                       # -U: consistent read only, everything shared
CONVERT_SOURCE = ofd(100, 201, 203)          # qemu-img convert's source, raw or qcow2
RAW_WRITER_BYTES = ofd(100, 101, 201)        # imgcopy's raw writer holds at least these
ALL_QEMU_BYTES = ofd(100, 101, 102, 103, 200, 201, 202, 203)


def assert_locked_error(exc, path):
    """imgcopy's lock error: an OSError with errno EAGAIN naming the file."""
    name = os.path.basename(path)
    assert isinstance(exc, OSError), repr(exc)
    assert exc.errno == errno.EAGAIN, "errno %r, not EAGAIN: %s" % (exc.errno, exc)
    assert LOCKED in str(exc), str(exc)
    assert name in str(exc), str(exc)
    assert exc.filename is not None and os.path.basename(os.fsdecode(exc.filename)) == name, \
        exc.filename


def expect_locked(path, fn, *args, **kw):
    with pytest.raises(OSError) as ei:
        r = fn(*args, **kw)
        if hasattr(r, "close"):
            r.close()
    assert_locked_error(ei.value, path)


# -- images --------------------------------------------------------------------------------
def make_raw(path, size=4 * MiB):
    ok(qemu_img("create", "-q", "-f", "raw", path, str(size)))
    ok(qemu_io("-f", "raw", "-c", "write -q -P 0x5a 0 %d" % (size // 4),
               "-c", "write -q -P 0xa5 %d 64k" % (size // 2), path))
    return path


def make_qcow2(path, size=4 * MiB, backing=None, backing_fmt=None, data=True):
    args = ["create", "-q", "-f", "qcow2"]
    if backing is not None:
        args += ["-b", backing, "-F", backing_fmt]
    ok(qemu_img(*args, path, str(size)))
    if data:
        ok(qemu_io("-f", "qcow2", "-c", "write -q -P 0x3c 64k 128k", path))
    return path


def snapshot(path):
    st = os.stat(path)
    with open(path, "rb") as f:
        return st.st_ino, st.st_size, st.st_mtime_ns, f.read()


@pytest.fixture(scope="module", autouse=True)
def _qemu_locks_here(tmp_path_factory):
    """qemu locks only with OFD locks (locking=auto): skip where it takes none."""
    path = make_raw(str(tmp_path_factory.mktemp("ofd") / "probe.raw"))
    ps = Procs()
    try:
        hold_qemu_io(ps, "-f", "raw", path)
        if not any(kind == "OFDLCK" for kind, *_ in file_locks(path)):
            pytest.skip("qemu takes no OFD locks on this file system")
    finally:
        ps.stop_all()


# -- opening for reading -------------------------------------------------------------------
@pytest.mark.parametrize("fmt, qemu_io_mode, info_ok", [
    ("qcow2", "-r", True),    # a qcow2 reader shares reading with other readers
    ("qcow2", "rw", False),   # a qcow2 writer does not share write: readers are refused
    ("raw", "-r", True),
    ("raw", "rw", True),      # qemu-io on raw shares everything: qemu-img info/map work
])
def test_open_fails_exactly_when_qemu_img_info_fails(tmp_path, procs, fmt, qemu_io_mode, info_ok):
    path = str(tmp_path / ("img." + fmt))
    (make_qcow2 if fmt == "qcow2" else make_raw)(path)
    hold_qemu_io(procs, "-f", fmt, *(["-r"] if qemu_io_mode == "-r" else []), path)
    held = file_locks(path)

    for r in (qemu_img("info", "-f", fmt, path), qemu_img("map", "-f", fmt, path)):
        if info_ok:
            ok(r)
        else:
            refused(r, QEMU_SHARED_WRITE, QEMU_HINT, path)

    if info_ok:
        with imgcopy.open(path, fmt) as img:
            assert img.size == 4 * MiB
            assert img.read(0, 512) == b"\x5a" * 512 or fmt == "qcow2"
    else:
        expect_locked(path, imgcopy.open, path, fmt)
        expect_locked(path, imgcopy.map, path, fmt)
    # a failed open keeps none of the locks it took before it checked; close releases them
    assert file_locks(path) == held


def test_force_share_reads_an_image_qemu_writes(tmp_path, procs):
    path = make_qcow2(str(tmp_path / "busy.qcow2"))
    hold_qemu_io(procs, "-f", "qcow2", path)

    refused(qemu_img("info", "-f", "qcow2", path), QEMU_SHARED_WRITE)
    ok(qemu_img("info", "-U", "-f", "qcow2", path))
    qemu_json = ok(qemu_img("map", "-U", "-f", "qcow2", "--output=json", path)).stdout
    # force-share is for readers only
    refused(qemu_io("-U", "-f", "qcow2", "-c", "read 0 512", path),
            "force-share=on can only be used with read-only images")

    with imgcopy.open(path, "qcow2", force_share=True) as img:
        assert img.size == 4 * MiB
        assert img.read(64 << 10, 512) == b"\x3c" * 512
    assert imgcopy.map(path, "qcow2", force_share=True).to_json() == qemu_json
    with pytest.raises(ValueError):
        imgcopy.open(path, "qcow2", mode="r+", force_share=True)

    # the command line: refused without -U, with imgcopy's message; -U reads it
    for cmd in ("map", "info"):
        r = cli(cmd, "-f", "qcow2", path)
        refused(r, LOCKED, os.path.basename(path))
    assert ok(cli("map", "-U", "-f", "qcow2", "--output=json", path)).stdout == qemu_json
    ok(cli("info", "-U", "-f", "qcow2", path))


# -- backing files -------------------------------------------------------------------------
def test_backing_file_written_by_qemu_refuses_its_overlay(tmp_path, procs):
    base = make_qcow2(str(tmp_path / "base.qcow2"))
    top = make_qcow2(str(tmp_path / "top.qcow2"), backing=base, backing_fmt="qcow2", data=False)
    hold_qemu_io(procs, "-f", "qcow2", base)

    ok(qemu_img("info", top))   # info opens no backing file
    refused(qemu_img("map", top), QEMU_SHARED_WRITE, "[%s]" % base)   # map reads the chain
    ok(qemu_img("map", "-U", top))

    expect_locked(base, imgcopy.open, top)       # the error names the backing file
    with imgcopy.open(top, force_share=True) as img:
        assert img.read(64 << 10, 512) == b"\x3c" * 512


@pytest.mark.parametrize("backing_fmt", ["qcow2", "raw"])
def test_open_overlay_locks_its_backing_file_like_qemu(tmp_path, procs, backing_fmt):
    if backing_fmt == "qcow2":
        base = make_qcow2(str(tmp_path / "base.qcow2"))
    else:
        base = make_raw(str(tmp_path / "base.raw"))
    top = make_qcow2(str(tmp_path / "top.qcow2"), backing=base, backing_fmt=backing_fmt,
                     data=False)

    def probe():
        """(qemu can write base, qemu can read base, qemu-img info base works)"""
        w = qemu_io("-f", backing_fmt, "-c", "write -q 0 512", base)
        if w.returncode:
            refused(w, QEMU_WRITE)
        r = qemu_io("-r", "-f", backing_fmt, "-c", "read -q 0 512", base)
        i = qemu_img("info", "-f", backing_fmt, base)
        return w.returncode == 0, r.returncode == 0, i.returncode == 0

    holder = hold_qemu_io(procs, "-r", top)
    qemu_sets = (file_locks(top), file_locks(base))
    expected = probe()
    procs.stop(holder)
    # a qcow2 backing file's readers keep writers out; a raw one's (through qemu-io) do not
    assert expected == (backing_fmt == "raw", True, True)
    assert qemu_sets == (QCOW2_READER, QCOW2_READER if backing_fmt == "qcow2" else RAW_READER)

    with imgcopy.open(top) as img:
        assert (file_locks(top), file_locks(base)) == qemu_sets
        assert probe() == expected
    assert file_locks(top) == file_locks(base) == set()


# -- imgcopy holding images ----------------------------------------------------------------
def test_imgcopy_writer_keeps_qemu_out_of_a_qcow2_image(tmp_path, procs):
    path = make_qcow2(str(tmp_path / "w.qcow2"))

    def probe():
        refused(qemu_img("info", "-f", "qcow2", path), QEMU_SHARED_WRITE, QEMU_HINT)
        refused(qemu_io("-f", "qcow2", "-c", "write -q 0 512", path), QEMU_WRITE, QEMU_HINT)
        refused(qemu_io("-r", "-f", "qcow2", "-c", "read -q 0 512", path), QEMU_SHARED_WRITE)

    holder = hold_qemu_io(procs, "-f", "qcow2", path)   # oracle: qemu writing it
    probe()
    procs.stop(holder)

    with imgcopy.open(path, "qcow2", mode="r+") as img:
        img.write(0, b"\x11" * 512)
        probe()
        expect_locked(path, imgcopy.open, path, "qcow2", mode="r+")   # a second writer
        expect_locked(path, imgcopy.open, path, "qcow2")              # a qcow2 reader
    assert file_locks(path) == set()
    ok(qemu_io("-f", "qcow2", "-c", "write -q 0 512", path))   # released on close
    ok(qemu_img("info", "-f", "qcow2", path))


def test_imgcopy_writer_keeps_qemu_writers_out_of_a_raw_image(tmp_path, procs):
    path = make_raw(str(tmp_path / "w.raw"))

    def probe():
        refused(qemu_io("-f", "raw", "-c", "write -q 0 512", path), QEMU_WRITE, QEMU_HINT)
        ok(qemu_img("info", "-f", "raw", path))          # takes no lock on a raw image
        ok(qemu_io("-r", "-f", "raw", "-c", "read -q 0 512", path))   # readers share it

    # oracle: a qemu process that does not share write on a raw file (qemu-img convert's
    # source; a VM's disk does the same) keeps qemu writers out and lets readers in
    holder = hold_qemu_img_convert(procs, "-f", "raw", "-O", "raw", path, str(tmp_path / "o.raw"))
    probe()
    procs.stop(holder)

    with imgcopy.open(path, "raw", mode="r+") as img:
        img.write(0, b"\x11" * 512)
        locks = file_locks(path)
        assert RAW_WRITER_BYTES <= locks <= ALL_QEMU_BYTES, sorted(locks)
        probe()
        expect_locked(path, imgcopy.open, path, "raw", mode="r+")   # a second writer
        with imgcopy.open(path, "raw") as reader:                    # a reader: fine
            assert reader.read(0, 512) == b"\x11" * 512
    assert file_locks(path) == set()
    ok(qemu_io("-f", "raw", "-c", "write -q 0 512", path))


@pytest.mark.parametrize("fmt", ["qcow2", "raw"])
def test_imgcopy_reader_shares_like_a_qemu_reader(tmp_path, procs, fmt):
    path = str(tmp_path / ("r." + fmt))
    (make_qcow2 if fmt == "qcow2" else make_raw)(path)

    def probe():
        ok(qemu_img("info", "-f", fmt, path))
        ok(qemu_io("-r", "-f", fmt, "-c", "read -q 0 512", path))
        w = qemu_io("-f", fmt, "-c", "write -q 0 512", path)
        if fmt == "qcow2":
            refused(w, QEMU_WRITE, QEMU_HINT)
        else:
            ok(w)   # a raw image's readers share write, in qemu as in imgcopy

    holder = hold_qemu_io(procs, "-r", "-f", fmt, path)
    probe()
    procs.stop(holder)

    with imgcopy.open(path, fmt) as img:
        assert img.size == 4 * MiB
        probe()


@pytest.mark.parametrize("case", ["qcow2 reader", "raw reader", "qcow2 writer",
                                  "qcow2 force_share", "raw force_share",
                                  "overlay on qcow2", "overlay on raw", "overlay force_share"])
def test_proc_locks_show_the_bytes_qemu_locks(tmp_path, procs, case):
    files = []
    if case.startswith("overlay"):
        base_fmt = "raw" if case.endswith("raw") else "qcow2"
        base = str(tmp_path / ("base." + base_fmt))
        (make_raw if base_fmt == "raw" else make_qcow2)(base)
        top = make_qcow2(str(tmp_path / "top.qcow2"), backing=base, backing_fmt=base_fmt,
                         data=False)
        files = [top, base]
        qemu_args, kw = ["-r", top], {}
        if case.endswith("force_share"):
            qemu_args, kw = ["-U", "-r", top], {"force_share": True}
    else:
        fmt = case.split()[0]
        path = str(tmp_path / ("img." + fmt))
        (make_qcow2 if fmt == "qcow2" else make_raw)(path)
        files = [path]
        qemu_args = {"reader": ["-r"], "writer": [], "force_share": ["-U", "-r"]}[case.split()[1]]
        qemu_args = qemu_args + ["-f", fmt, path]
        kw = {"reader": {}, "writer": {"mode": "r+"},
              "force_share": {"force_share": True}}[case.split()[1]]

    holder = hold_qemu_io(procs, *qemu_args)
    qemu_sets = [file_locks(f) for f in files]
    procs.stop(holder)
    known = {"qcow2 reader": [QCOW2_READER], "raw reader": [RAW_READER],
             "qcow2 writer": [QCOW2_WRITER], "qcow2 force_share": [FORCE_SHARE],
             "raw force_share": [FORCE_SHARE], "overlay on qcow2": [QCOW2_READER, QCOW2_READER],
             "overlay on raw": [QCOW2_READER, RAW_READER],
             "overlay force_share": [FORCE_SHARE, FORCE_SHARE]}[case]
    assert qemu_sets == known   # qemu 7.2 as researched

    with imgcopy.open(files[0], **kw) as img:
        assert img.size == 4 * MiB
        assert [file_locks(f) for f in files] == qemu_sets
    assert [file_locks(f) for f in files] == [set()] * len(files)


def test_locks_past_the_end_of_a_tiny_file(tmp_path, procs):
    for size in (0, 100):
        path = str(tmp_path / ("tiny%d.raw" % size))
        with open(path, "wb") as f:
            f.write(b"\x01" * size)
        holder = hold_qemu_io(procs, "-f", "raw", path)
        assert file_locks(path) == ofd(100, 101)   # qemu locks bytes 100+ of a 0-byte file
        procs.stop(holder)
        with imgcopy.open(path, "raw", mode="r+"):
            assert RAW_WRITER_BYTES <= file_locks(path) <= ALL_QEMU_BYTES
            refused(qemu_io("-f", "raw", "-c", "length", path), QEMU_WRITE)
        assert os.path.getsize(path) == size   # locks never grow the file
        assert file_locks(path) == set()


# -- convert -------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt, qemu_io_mode, refused_", [
    ("raw", "rw", True),      # convert's source does not share write: a writer refuses it
    ("qcow2", "rw", True),
    ("raw", "-r", False),
    ("qcow2", "-r", False),
])
def test_convert_source_held_by_qemu(tmp_path, procs, fmt, qemu_io_mode, refused_):
    src = str(tmp_path / ("src." + fmt))
    (make_qcow2 if fmt == "qcow2" else make_raw)(src)
    hold_qemu_io(procs, "-f", fmt, *(["-r"] if qemu_io_mode == "-r" else []), src)
    held = file_locks(src)

    r = qemu_img("convert", "-f", fmt, "-O", "raw", src, str(tmp_path / "q.raw"))
    if refused_:
        refused(r, QEMU_SHARED_WRITE, "[%s]" % src)
    else:
        ok(r)
    ok(qemu_img("convert", "-U", "-f", fmt, "-O", "raw", src, str(tmp_path / "qU.raw")))

    out = str(tmp_path / "out.raw")
    before = sorted(os.listdir(str(tmp_path)))
    if refused_:
        expect_locked(src, imgcopy.convert, src, out, src_format=fmt)
        assert sorted(os.listdir(str(tmp_path))) == before   # nothing created, nothing left
        assert file_locks(src) == held
        r = cli("convert", "-f", fmt, "-O", "raw", src, out)
        refused(r, LOCKED, os.path.basename(src))
        assert not os.path.exists(out)
        imgcopy.convert(src, out, src_format=fmt, force_share=True)
        ok(cli("convert", "-U", "-f", fmt, "-O", "raw", src, str(tmp_path / "cliU.raw")))
        ok(qemu_img("compare", "-U", "-f", fmt, "-F", "raw", src, str(tmp_path / "cliU.raw")))
    else:
        imgcopy.convert(src, out, src_format=fmt)
    ok(qemu_img("compare", "-U", "-f", fmt, "-F", "raw", src, out))
    assert file_locks(src) == held


def _hold_dst(procs, case, dst, tmp_path):
    if case == "qcow2, qemu-io -r":
        hold_qemu_io(procs, "-r", "-f", "qcow2", dst)
    elif case == "qcow2, qemu-io rw":
        hold_qemu_io(procs, "-f", "qcow2", dst)
    elif case == "raw, qemu-img convert source":
        hold_qemu_img_convert(procs, "-f", "raw", "-O", "raw", dst, str(tmp_path / "sink.raw"))
    elif case == "raw, qemu-io rw":
        hold_qemu_io(procs, "-f", "raw", dst)


@pytest.mark.parametrize("case", ["qcow2, qemu-io -r", "qcow2, qemu-io rw",
                                  "raw, qemu-img convert source", "raw, qemu-io rw"])
def test_convert_never_writes_a_destination_qemu_holds(tmp_path, procs, case):
    fmt = case.split(",")[0]
    src = make_raw(str(tmp_path / "src.raw"), size=1 * MiB)
    dst = str(tmp_path / ("dst." + fmt))
    (make_qcow2 if fmt == "qcow2" else make_raw)(dst)
    _hold_dst(procs, case, dst, tmp_path)
    held = file_locks(dst)

    if case == "raw, qemu-io rw":
        # qemu-io shares write on a raw file, so qemu-img convert would write it; but qemu
        # users that do not share write (a VM's disk, qemu-img convert's source, imgcopy's
        # writers) cannot open it
        refused(qemu_img("convert", "-f", "raw", "-O", "raw", dst, str(tmp_path / "x.raw")),
                QEMU_SHARED_WRITE)
    else:
        # qemu-img convert refuses both ways: creating (truncating) it and writing into it
        refused(qemu_img("convert", "-f", "raw", "-O", "raw", src, dst), QEMU_WRITE, QEMU_HINT)
        refused(qemu_img("convert", "-n", "-f", "raw", "-O", fmt, src, dst), QEMU_WRITE)

    before = snapshot(dst)
    listing = sorted(os.listdir(str(tmp_path)))
    # replaced (a new file renamed over it) ...
    expect_locked(dst, imgcopy.convert, src, dst, src_format="raw", dst_format="raw")
    # ... or written in place (-n)
    expect_locked(dst, imgcopy.convert, src, dst, src_format="raw", dst_format=fmt,
                  create=False)
    refused(cli("convert", "-f", "raw", "-O", "raw", src, dst), LOCKED, os.path.basename(dst))
    assert snapshot(dst) == before, "the destination was touched"
    assert sorted(os.listdir(str(tmp_path))) == listing, "a temporary file was left"
    assert file_locks(dst) == held


def test_convert_over_a_raw_image_qemu_only_reads(tmp_path, procs):
    """qemu-io -f raw -r shares write (qemu-img convert writes over it): so does imgcopy."""
    src = make_raw(str(tmp_path / "src.raw"), size=1 * MiB)
    dst = make_raw(str(tmp_path / "dst.raw"))
    hold_qemu_io(procs, "-r", "-f", "raw", dst)
    ok(qemu_img("convert", "-n", "-f", "raw", "-O", "raw", src, dst))
    imgcopy.convert(src, dst, src_format="raw", dst_format="raw", create=False)
    imgcopy.convert(src, dst, src_format="raw", dst_format="raw")
    ok(qemu_img("compare", "-U", "-f", "raw", "-F", "raw", src, dst))


def test_convert_in_progress_locks_like_qemu_img_convert(tmp_path, procs):
    src = make_raw(str(tmp_path / "src.raw"))
    ok(qemu_io("-f", "raw", "-c", "write -q -P 0x77 0 4M", src))

    def probe(dst):
        refused(qemu_img("info", "-f", "qcow2", dst), QEMU_SHARED_WRITE, QEMU_HINT)
        refused(qemu_io("-f", "qcow2", "-c", "write -q 0 512", dst), QEMU_WRITE)
        refused(qemu_io("-f", "raw", "-c", "write -q 0 512", src), QEMU_WRITE, "[%s]" % src)
        ok(qemu_img("info", "-f", "raw", src))
        ok(qemu_io("-r", "-f", "raw", "-c", "read -q 0 512", src))

    dst_q = make_qcow2(str(tmp_path / "dst_q.qcow2"), data=False)
    holder = hold_qemu_img_convert(procs, "-n", "-f", "raw", "-O", "qcow2", src, dst_q)
    qemu_sets = (file_locks(src), file_locks(dst_q))
    probe(dst_q)
    procs.stop(holder)
    assert qemu_sets == (CONVERT_SOURCE, QCOW2_WRITER)

    dst = make_qcow2(str(tmp_path / "dst.qcow2"), data=False)
    child = hold_imgcopy_convert(procs, src, dst, "qcow2", create=False)
    assert (file_locks(src), file_locks(dst)) == qemu_sets
    probe(dst)
    # two imgcopy processes behave like two qemu processes
    expect_locked(dst, imgcopy.open, dst, "qcow2")
    with imgcopy.open(src, "raw") as img:
        assert img.read(0, 512) == b"\x77" * 512
    expect_locked(src, imgcopy.open, src, "raw", mode="r+")
    let_finish(child)
    assert file_locks(src) == file_locks(dst) == set()
    ok(qemu_img("compare", "-f", "raw", "-F", "qcow2", src, dst))


def test_convert_guards_the_file_it_replaces(tmp_path, procs):
    """A new destination is written under a temporary name and renamed over the old file:
    until then the old file is locked as a destination, so no qemu writes into a file that is
    about to be replaced and no other imgcopy replaces it at the same time."""
    src = make_raw(str(tmp_path / "src.raw"), size=1 * MiB)
    dst = str(tmp_path / "dst.raw")
    with open(dst, "wb") as f:
        f.write(b"old" * 1000)
    old = snapshot(dst)

    child = hold_imgcopy_convert(procs, src, dst, "raw", create=True)
    # at least: wants write, does not share write (locks.md recommends 101 103 201 203)
    assert ofd(101, 201) <= file_locks(dst) <= ALL_QEMU_BYTES, sorted(file_locks(dst))
    refused(qemu_io("-f", "raw", "-c", "write -q 0 512", dst), QEMU_WRITE, QEMU_HINT)
    expect_locked(dst, imgcopy.convert, src, dst, src_format="raw", dst_format="raw")
    expect_locked(dst, imgcopy.open, dst, "raw", mode="r+")
    assert snapshot(dst) == old
    let_finish(child)
    assert os.stat(dst).st_ino != old[0]
    ok(qemu_img("compare", "-f", "raw", "-F", "raw", src, dst))
    assert file_locks(dst) == set()
    assert not [n for n in os.listdir(str(tmp_path)) if "imgcopy-" in n]
