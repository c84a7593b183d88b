"""Hostile qcow2 files through the Python API.

A qcow2 file is untrusted input: imgcopy.open / Image.extents / Image.read /
imgcopy.map on a damaged or malicious file may raise ImageFormatError or
OSError, and nothing else: no crash, no hang, no runaway allocation.  Each
file runs in its own child process with a timeout (forked from a zygote
that imported imgcopy once: a crash or a hang fails one test, not pytest),
under an address-space limit, and the child's peak RSS (os.wait4: its
getrusage) must stay below RSS_LIMIT_MB.

The files come from tests/fuzz/hostile.py (built byte by byte, the same
ones as tests/fuzz/regressions/hostile-*.qcow2), from the fuzzer's own
finds in tests/fuzz/regressions/, from the seed corpus, and from qemu-img
(a 1 PiB image, backing loops across files).
"""
import json
import os
import select
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
FUZZ_DIR = os.path.join(HERE, "fuzz")

from .build_features import HAVE_ZSTD
from .convert_helpers import imgcopy_child_env
from .fuzz import hostile
from .gen.sparse import write_file
from .oracles import qemu_check, qemu_img

# Under `make test-sanitize` the children run with the ASan runtime
# preloaded: slower, and with a quarantine and shadow memory in their RSS.
SANITIZED = "asan" in os.environ.get("LD_PRELOAD", "")
SLOW = 5 if SANITIZED else 1
TIMEOUT = 30 * SLOW
RSS_LIMIT_MB = None if SANITIZED else 300
# Address space of a child: a runaway allocation becomes a MemoryError (a
# test failure naming it) instead of swapping the machine.  ASan needs
# terabytes of address space for its shadow: no limit then.
AS_LIMIT = None if SANITIZED else 2 << 30

# A zygote: one Python process that imported imgcopy once, reading
# requests (one JSON line each) and forking a child per file.  The child
# runs work() with its own cwd, address-space limit, stdout and stderr; the
# zygote waits for it with a deadline (SIGKILL past it) and answers with its
# exit status and peak RSS (os.wait4).  A crash or a hang thus kills one
# child, never the zygote or pytest, at a fork's cost instead of a Python
# start-up's.
ZYGOTE = r"""
import json, os, resource, signal, sys, time, traceback
import imgcopy

WINDOW = 64 << 20

def work(path, fmt, full_map):
    stages = []

    def run(op, fn):
        t = time.monotonic()
        try:
            r = fn()
        except (imgcopy.ImageFormatError, OSError) as e:
            kind = "ImageFormatError" if isinstance(e, imgcopy.ImageFormatError) else "OSError"
            stages.append({"op": op, "error": kind, "msg": str(e)[:300],
                           "secs": time.monotonic() - t})
            return None
        except BaseException as e:
            stages.append({"op": op, "error": type(e).__name__, "msg": str(e)[:300],
                           "unexpected": True, "secs": time.monotonic() - t})
            return None
        stages.append({"op": op, "secs": time.monotonic() - t})
        return r

    img = run("open", lambda: imgcopy.open(path, fmt))
    if img is not None:
        size = img.size
        stages[-1]["size"] = size
        head = min(size, WINDOW)
        run("extents-head", lambda: len(img.extents(0, head)))
        if size > head:
            run("extents-tail", lambda: len(img.extents(max(head, size - WINDOW))))
        if size:
            for off in sorted({0, size // 2, size - 1}):
                run("block-status@%d" % off,
                    lambda: img.block_status(off, min(size - off, 1 << 30)))
            for off, n in ((0, min(size, 1 << 20)), (size // 3, min(size - size // 3, 65536)),
                           (size - min(size, 4096), min(size, 4096))):
                run("read@%d+%d" % (off, n), lambda: len(img.read(off, n)))
        img.close()
        if full_map:
            run("map", lambda: len(imgcopy.map(path, fmt)))
        elif size > WINDOW:
            run("map-tail", lambda: len(imgcopy.map(path, fmt, start=size - WINDOW)))
        if fmt is not None:
            run("open-probed", lambda: imgcopy.open(path).close())
    return stages

def child(req):
    out = os.open(req["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    err = os.open(req["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(err, 2)
    os.dup2(err, 1)
    try:
        os.chdir(req["cwd"])
        if req["as_limit"]:
            resource.setrlimit(resource.RLIMIT_AS, (req["as_limit"], req["as_limit"]))
        stages = work(req["path"], req["fmt"], req["full_map"])
        os.write(out, json.dumps(stages).encode())
        code = 0
    except BaseException:
        os.write(err, traceback.format_exc().encode())
        code = 3
    os._exit(code)

for line in sys.stdin:
    req = json.loads(line)
    t = time.monotonic()
    pid = os.fork()
    if pid == 0:
        child(req)
    timed_out = False
    nap = 0.0005
    while True:
        wpid, status, usage = os.wait4(pid, os.WNOHANG)
        if wpid:
            break
        if time.monotonic() - t > req["timeout"]:
            os.kill(pid, signal.SIGKILL)
            _, status, usage = os.wait4(pid, 0)
            timed_out = True
            break
        time.sleep(nap)
        nap = min(nap * 2, 0.02)
    print(json.dumps({"code": os.waitstatus_to_exitcode(status), "maxrss_kb": usage.ru_maxrss,
                      "timed_out": timed_out, "wall": time.monotonic() - t}), flush=True)
"""


class Zygote:
    def __init__(self, workdir):
        self.workdir = workdir
        self.proc = None
        self.count = 0

    def _start(self):
        self.stderr = open(os.path.join(self.workdir, "zygote.err"), "wb")
        self.proc = subprocess.Popen([sys.executable, "-c", ZYGOTE], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.stderr,
                                     env=imgcopy_child_env(), cwd=self.workdir)

    def run(self, req, timeout):
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        self.proc.stdin.write((json.dumps(req) + "\n").encode())
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout + 30)
        line = self.proc.stdout.readline() if ready else b""
        if not line:
            self.close()
            with open(os.path.join(self.workdir, "zygote.err"), "rb") as f:
                pytest.fail("the zygote died or stopped answering:\n" +
                            f.read().decode(errors="replace")[-3000:])
        return json.loads(line)

    def close(self):
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            self.proc.stdin.close()
            self.proc.stdout.close()
            self.stderr.close()
            self.proc = None


@pytest.fixture(scope="module")
def zygote(tmp_path_factory):
    z = Zygote(str(tmp_path_factory.mktemp("zygote")))
    yield z
    z.close()


def run_worker(path, fmt, zygote, full_map=True, timeout=TIMEOUT, as_limit=AS_LIMIT):
    """Run work() on `path` in a child: (stages, peak RSS in MB, wall
    seconds).  A crash, a hang or garbage output fails the calling test."""
    # opened by its name from its own directory: relative backing names
    # then resolve without a directory part, as for a user in that directory
    cwd, name = os.path.split(os.path.abspath(path))
    zygote.count += 1
    out = os.path.join(zygote.workdir, "out-%d" % zygote.count)
    err = os.path.join(zygote.workdir, "err-%d" % zygote.count)
    r = zygote.run({"path": name, "fmt": fmt, "full_map": full_map, "cwd": cwd,
                    "as_limit": as_limit, "timeout": timeout, "out": out, "err": err},
                   timeout)
    with open(out, "rb") as f:
        stdout = f.read().decode(errors="replace")
    with open(err, "rb") as f:
        stderr = f.read().decode(errors="replace")
    os.unlink(out)
    os.unlink(err)
    where = "%s (format=%s)" % (os.path.basename(path), fmt)
    assert not r["timed_out"], "%s: still running after %ss (hang?)\n%s" % (
        where, timeout, stderr[-3000:])
    assert r["code"] == 0, "%s: worker died with %s\n%s" % (where, r["code"], stderr[-3000:])
    try:
        stages = json.loads(stdout)
    except ValueError:
        pytest.fail("%s: no result from the worker\n%s\n%s" % (where, stdout[-2000:],
                                                               stderr[-2000:]))
    return stages, r["maxrss_kb"] / 1024, r["wall"]


def check_outcome(stages, rss_mb, expect, where):
    """Only ImageFormatError/OSError; an error where one is expected; RSS."""
    bad = [s for s in stages if s.get("unexpected")]
    assert not bad, "%s: unexpected exception types: %s" % (where, bad)
    errors = [s for s in stages if "error" in s]
    if expect == "error":
        assert errors, "%s: expected ImageFormatError or OSError somewhere, all passed: %s" % (
            where, stages)
    if RSS_LIMIT_MB is not None:
        assert rss_mb < RSS_LIMIT_MB, "%s: peak RSS %.0f MB (limit %d MB): %s" % (
            where, rss_mb, RSS_LIMIT_MB, stages)


def harness_dir(root, data):
    """The fuzz harness's layout: input.qcow2, base.qcow2 (a copy of it),
    base.raw (1 MiB: a 4 KiB data block every 64 KiB)."""
    os.makedirs(root, exist_ok=True)
    for name in ("input.qcow2", "base.qcow2"):
        with open(os.path.join(root, name), "wb") as f:
            f.write(data)
    raw = bytearray(1 << 20)
    for off in range(0, len(raw), 65536):
        raw[off:off + 4096] = bytes([0x10 + off // 65536]) * 4096
    with open(os.path.join(root, "base.raw"), "wb") as f:
        f.write(raw)
    return os.path.join(root, "input.qcow2")


# Files describing huge numbers of extents: a full map is legitimately
# as big as its answer, so only windows of them are asked for.
NO_FULL_MAP = {"amplify-512-l1-8k", "amplify-64k-l1-8k", "check-amplify-saturated-refcount"}


@pytest.mark.parametrize("case", hostile.CASES, ids=[c.name for c in hostile.CASES])
def test_hostile_case(case, tmp_path, zygote):
    path = harness_dir(str(tmp_path), case.build())
    stages, rss_mb, _ = run_worker(path, case.format, zygote,
                                   full_map=case.name not in NO_FULL_MAP)
    check_outcome(stages, rss_mb, case.expect, case.name)


def _regression_files():
    d = os.path.join(FUZZ_DIR, "regressions", "qcow2")
    if not os.path.isdir(d):
        return []
    # hostile-* are test_hostile_case's; the rest are the fuzzer's finds
    return sorted(f for f in os.listdir(d) if not f.startswith("hostile-"))


@pytest.mark.parametrize("name", _regression_files() or ["(none)"])
def test_fuzzer_regression(name, tmp_path, zygote):
    """Every input the fuzzer ever crashed on, through Python too."""
    if name == "(none)":
        pytest.skip("no fuzzer finds in tests/fuzz/regressions")
    with open(os.path.join(FUZZ_DIR, "regressions", "qcow2", name), "rb") as f:
        data = f.read()[:262144]  # what the fuzzer ran (-max_len)
    path = harness_dir(str(tmp_path), data)
    stages, rss_mb, _ = run_worker(path, "qcow2", zygote, full_map=False)
    check_outcome(stages, rss_mb, "any", name)


def _seed_files():
    d = os.path.join(FUZZ_DIR, "seeds", "qcow2")
    return sorted(os.listdir(d)) if os.path.isdir(d) else []


@pytest.mark.parametrize("name", _seed_files())
def test_seed(name, tmp_path, zygote):
    """The seeds are valid images: they open (or name the feature imgcopy
    refuses) and read, probed or not."""
    with open(os.path.join(FUZZ_DIR, "seeds", "qcow2", name), "rb") as f:
        path = harness_dir(str(tmp_path), f.read())
    stages, rss_mb, _ = run_worker(path, "qcow2", zygote)
    check_outcome(stages, rss_mb, "any", name)
    # resume-*: images imgcopy's writer left incomplete (opened with resume=True only)
    refused = ("datafile", "dirty", "extl2", "backing-self", "backing-qcow2", "resume") + \
        (() if HAVE_ZSTD else ("zstd",))
    if not any(r in name for r in refused):
        assert not [s for s in stages if "error" in s], stages


@pytest.mark.parametrize("kw", [{}, {"cluster_bits": 12}, {"cluster_bits": 16, "size": 8 << 20},
                                {"version": 2},
                                {"backing": b"base.raw", "backing_fmt": b"raw"}],
                         ids=["512", "4k", "64k", "v2", "backing"])
def test_base_image_is_valid(kw, tmp_path):
    """The image every hostile case starts from is a valid one: qemu-img
    check agrees, and qemu and imgcopy read the same bytes from it."""
    import imgcopy

    buf, lay = hostile.base_image(**kw)
    path = harness_dir(str(tmp_path), bytes(buf))
    qemu_check(path, "qcow2")
    out = str(tmp_path / "out.raw")
    qemu_img("convert", "-f", "qcow2", "-O", "raw", path, out, timeout=60)
    with open(out, "rb") as f:
        expected = f.read()
    cs = lay.cluster_size
    for c, v in hostile.BASE_PATTERN.items():
        if v is not None or kw.get("version") != 2:
            assert expected[c * cs:(c + 1) * cs] == bytes([v or 0]) * cs, c
    with imgcopy.open(path) as img:
        assert img.size == lay.size
        assert img.read(0, img.size) == expected


def test_zstd_image_is_named(tmp_path):
    """A zstd image is read as one, or refused as such by a build without
    libzstd: the compression type byte (offset 104) must be read, not taken
    for 0."""
    import imgcopy

    with open(os.path.join(FUZZ_DIR, "seeds", "qcow2", "v3-zstd.qcow2"), "rb") as f:
        data = f.read()
    assert data[104] == 1
    path = str(tmp_path / "zstd.qcow2")
    with open(path, "wb") as f:
        f.write(data)
    if HAVE_ZSTD:
        assert imgcopy.info(path).format_specific["data"]["compression-type"] == "zstd"
    else:
        with pytest.raises(imgcopy.ImageFormatError, match="zstd"):
            imgcopy.open(path)


# -- across files: loops and deep chains ----------------------------------

@pytest.mark.parametrize("probed", [False, True], ids=["with-format", "probed"])
def test_backing_loop_two_files(tmp_path, zygote, probed):
    """a -> b -> a"""
    fmt = None if probed else b"qcow2"
    a = write_file(str(tmp_path / "a.qcow2"),
                   bytes(hostile.base_image(backing=b"b.qcow2", backing_fmt=fmt)[0]))
    write_file(str(tmp_path / "b.qcow2"),
               bytes(hostile.base_image(backing=b"a.qcow2", backing_fmt=fmt)[0]))
    stages, rss_mb, _ = run_worker(a, None, zygote)
    check_outcome(stages, rss_mb, "error", "a->b->a")
    assert stages[0]["op"] == "open" and stages[0].get("error") == "ImageFormatError", stages
    assert "loop" in stages[0]["msg"], stages


def test_backing_loop_three_files_absolute(tmp_path, zygote):
    """a -> b -> c -> a, by absolute names, one through a symlink."""
    names = [str(tmp_path / n) for n in ("a.qcow2", "b.qcow2", "c.qcow2")]
    os.symlink(names[0], str(tmp_path / "a-link.qcow2"))
    targets = [names[1], names[2], str(tmp_path / "a-link.qcow2")]
    for p, t in zip(names, targets):
        write_file(p, bytes(hostile.base_image(backing=t.encode(), backing_fmt=b"qcow2")[0]))
    stages, rss_mb, _ = run_worker(names[0], None, zygote)
    check_outcome(stages, rss_mb, "error", "a->b->c->a")
    assert "loop" in stages[0]["msg"], stages


def test_backing_is_a_fifo(tmp_path, zygote):
    """A backing file name naming a FIFO: refused without blocking."""
    os.mkfifo(str(tmp_path / "fifo"))
    a = write_file(str(tmp_path / "a.qcow2"),
                   bytes(hostile.base_image(backing=b"fifo", backing_fmt=b"raw")[0]))
    stages, rss_mb, _ = run_worker(a, None, zygote)
    check_outcome(stages, rss_mb, "error", "backing FIFO")


def test_backing_chain_too_deep(tmp_path, zygote):
    """70 distinct files in a chain: refused, without running out of
    stack or memory (2 MiB clusters: each link's L2 cache is at its cap).
    64 links of 2 MiB clusters reserve about 2 GiB of address space for
    their (mostly untouched) L2 caches: the address-space cap is raised
    to 6 GiB here, the RSS bound stays."""
    n = 70
    for i in range(n):
        backing = ("img%d.qcow2" % (i + 1)).encode() if i + 1 < n else None
        buf, _ = hostile.base_image(cluster_bits=21, size=4 << 20, backing=backing,
                                    backing_fmt=b"qcow2" if backing else None)
        # keep the files small: only what the header and L1 need, the rest
        # of the 2 MiB clusters are holes
        path = str(tmp_path / ("img%d.qcow2" % i))
        with open(path, "wb") as f:
            f.truncate(len(buf))
            f.write(bytes(buf[:4096]))
            f.seek(3 << 21)
            f.write(bytes(buf[3 << 21:(3 << 21) + 4096]))
    stages, rss_mb, _ = run_worker(str(tmp_path / "img0.qcow2"), None, zygote,
                                   as_limit=AS_LIMIT and 6 << 30)
    check_outcome(stages, rss_mb, "error", "chain of 70")
    assert "deeper" in stages[0]["msg"], stages


def test_backing_chain_metadata_memory(tmp_path, zygote):
    """Metadata memory is capped for a whole chain, not only per image: 64
    files of 4 KiB on disk each (sparse), each with the largest L1 table
    qemu allows (32 MiB, all holes), open in bounded memory."""
    import struct

    n, cb = 64, 16
    for i in range(n):
        backing = ("img%d.qcow2" % (i + 1)).encode() if i + 1 < n else None
        buf, _ = hostile.base_image(cluster_bits=cb, size=1 << 30, backing=backing,
                                    backing_fmt=b"qcow2" if backing else None)
        struct.pack_into(">I", buf, hostile.OFF_L1_SIZE, (32 << 20) // 8)
        struct.pack_into(">Q", buf, hostile.OFF_L1_OFFSET, 1 << cb)
        struct.pack_into(">Q", buf, hostile.OFF_REFTABLE_OFFSET, 0)
        struct.pack_into(">I", buf, hostile.OFF_REFTABLE_CLUSTERS, 0)
        with open(str(tmp_path / ("img%d.qcow2" % i)), "wb") as f:
            f.write(bytes(buf[:4096]))
            f.truncate((1 << cb) + (32 << 20))
    stages, rss_mb, _ = run_worker(str(tmp_path / "img0.qcow2"), None, zygote,
                                   full_map=False)
    check_outcome(stages, rss_mb, "any", "64 sparse 32 MiB L1 tables")


# -- huge virtual sizes ----------------------------------------------------

def test_one_pib_image_maps_instantly(tmp_path, imgcopy_env):
    """qemu-img create -f qcow2 x.qcow2 1P: opens and maps in < 2 s."""
    path = str(tmp_path / "x.qcow2")
    qemu_img("create", "-q", "-f", "qcow2", path, "1P")
    code = r"""
import json, sys, time
import imgcopy
t = time.monotonic()
m = imgcopy.map(sys.argv[1])
t_map = time.monotonic() - t
t = time.monotonic()
with imgcopy.open(sys.argv[1]) as img:
    e = img.block_status(img.size - 512)
    tail = img.extents(img.size - (64 << 20))
    data = img.read(img.size - 4096, 4096)
    size = img.size
t_tail = time.monotonic() - t
print(json.dumps({"size": size, "n": len(m),
                  "zero": [x.zero for x in m], "data": [x.data for x in m],
                  "t_map": t_map, "t_tail": t_tail, "tail_n": len(tail),
                  "read_zero": data == bytes(4096)}))
"""
    proc = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True,
                          env=imgcopy_env, timeout=TIMEOUT, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["n"] == 1 and r["zero"] == [True] and r["data"] == [False], r
    assert r["t_map"] < 2 * SLOW, r
    assert r["t_tail"] < 2 * SLOW, r
    assert r["tail_n"] == 1 and r["read_zero"], r
    assert r["size"] == 1 << 50, r


def test_huge_disk_empty_l1(tmp_path, zygote):
    """1 PiB of 2 MiB clusters, hand-made: instant too."""
    path = harness_dir(str(tmp_path), hostile.CASES_BY_NAME["huge-disk-empty-l1"].build())
    stages, rss_mb, _ = run_worker(path, "qcow2", zygote)
    check_outcome(stages, rss_mb, "any", "huge-disk-empty-l1")
    assert not [s for s in stages if "error" in s], stages
    slow = [s for s in stages if s["secs"] > 2 * SLOW]
    assert not slow, slow


@pytest.mark.parametrize("name", sorted(NO_FULL_MAP))
def test_amplification_tail_is_cheap(name, tmp_path, zygote):
    """A few hundred KiB describing millions of alternating extents: a
    question about the end of the disk costs time and memory about the end
    of the disk (block status there, a map of its last 64 MiB)."""
    path = harness_dir(str(tmp_path), hostile.CASES_BY_NAME[name].build())
    stages, rss_mb, _ = run_worker(path, "qcow2", zygote, full_map=False)
    check_outcome(stages, rss_mb, "any", name)
    slow = [s for s in stages if s["secs"] > 5 * SLOW]
    assert not slow, "%s: slow operations: %s" % (name, slow)
