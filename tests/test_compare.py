"""imgcopy compare against qemu-img compare, the oracle: the same exit code,
stdout and stderr (the program name aside) on seeded image pairs, and
imgcopy.compare()'s result saying the same thing."""
import os
import random
import re
import shutil
import time

import pytest

import imgcopy
from imgcopy.cli import main as cli_main

from .gen.sparse import make_sparse
from .oracles import qemu_img, qemu_io, require_qemu_img
from .servers import nbdkit, needs_nbdkit, needs_qemu_nbd, qemu_nbd
from .units import KiB, MiB, GiB

pytestmark = pytest.mark.usefixtures("oracle")


@pytest.fixture
def oracle():
    require_qemu_img()


def run_imgcopy(args, cwd, capfdbinary):
    old = os.getcwd()
    os.chdir(cwd)
    try:
        capfdbinary.readouterr()
        rc = cli_main(["compare", *args])
        out, err = capfdbinary.readouterr()
    finally:
        os.chdir(old)
    return rc, out, err


def same_as_qemu(args, cwd, capfdbinary):
    """Run both; assert they agree; return qemu's (rc, stdout text)."""
    q = qemu_img("compare", *args, cwd=cwd, check=False, text=False)
    rc, out, err = run_imgcopy(args, cwd, capfdbinary)
    qerr = q.stderr.replace(b"qemu-img", b"imgcopy")
    assert (rc, out, err) == (q.returncode, q.stdout, qerr), args
    return q.returncode, q.stdout.decode()


def check_api(a, b, rc, stdout, cwd, **kw):
    """imgcopy.compare() says what the command printed."""
    res = imgcopy.compare(*(x if "://" in x else os.path.join(cwd, x) for x in (a, b)), **kw)
    assert bool(res) == (rc == 0)
    assert res.identical == (rc == 0)
    assert "".join(line + "\n" for line in res.lines) == stdout
    if res.reason in ("content", "status"):
        assert f"offset {res.offset}" in stdout.replace("Offset", "offset")
    else:
        assert res.offset is None
    assert res.size_mismatch == (res.size_a != res.size_b)
    return res


def both(a, b, cwd, capfdbinary, *flags, **kw):
    rc, out = same_as_qemu([*flags, a, b], cwd, capfdbinary)
    strict = "-s" in flags
    if "-p" in flags:  # the progress reports and the newline after them
        out = re.sub(r" {4}\(\d+\.\d\d/100%\)\r", "", out)[:-1]
    if "-q" not in flags:
        check_api(a, b, rc, out, cwd, strict=strict, **kw)
    return rc, out


def sparse_raw(path, size, rng, chunks=6, max_len=200 * KiB):
    """Data at random (odd) offsets, holes elsewhere."""
    data = []
    for _ in range(chunks):
        n = rng.randint(1, max_len)
        off = rng.randrange(0, max(1, size - n))
        data.append((off, rng.randbytes(n)))
    make_sparse(path, size, data)
    return data


def poke(path, offsets, rng):
    """Change one byte at each offset (never to the same value)."""
    with open(path, "r+b") as f:
        for off in offsets:
            f.seek(off)
            old = f.read(1) or b"\0"
            f.seek(off)
            f.write(bytes([(old[0] + rng.randint(1, 255)) % 256]))


def copy_sparse(src, dst):
    """A copy with the same holes (qemu-img convert keeps a raw sparse)."""
    qemu_img("convert", "-f", "raw", "-O", "raw", src, dst)


SEEDS = range(4)


@pytest.mark.parametrize("seed", SEEDS)
def test_identical_raw(tmp_path, capfdbinary, seed):
    rng = random.Random(seed)
    size = rng.randint(1, 6 * MiB)
    sparse_raw(tmp_path / "a.raw", size, rng)
    shutil.copy(tmp_path / "a.raw", tmp_path / "b.raw")       # holes filled
    copy_sparse(tmp_path / "a.raw", tmp_path / "c.raw")
    for b in ("b.raw", "c.raw"):
        assert both("a.raw", b, tmp_path, capfdbinary)[0] == 0
        both("a.raw", b, tmp_path, capfdbinary, "-s")
        both(b, "a.raw", tmp_path, capfdbinary, "-p")


@pytest.mark.parametrize("fmt,opts", [("qcow2", []), ("qcow2", ["-o", "cluster_size=4k"]),
                                      ("qcow2", ["-c"]), ("vpc", []),
                                      pytest.param("vpc", ["-o", "subformat=fixed"],
                                                   marks=pytest.mark.xfail(
                                                       reason="on purpose: qemu-img probes a "
                                                       "fixed VHD as raw (footer included), "
                                                       "imgcopy as vpc")),
                                      ("vhdx", []), ("vmdk", [])])
@pytest.mark.parametrize("seed", SEEDS)
def test_raw_vs_conversion(tmp_path, capfdbinary, fmt, opts, seed):
    if fmt not in imgcopy.image.FORMATS:
        pytest.skip(f"imgcopy does not read {fmt} yet")
    rng = random.Random(seed * 7 + len(opts))
    size = rng.randint(1, 5 * MiB) // 512 * 512 + rng.choice([0, 512])
    sparse_raw(tmp_path / "a.raw", size, rng)
    qemu_img("convert", "-f", "raw", "-O", fmt, *opts, "a.raw", f"a.{fmt}", cwd=tmp_path)
    name = f"a.{fmt}"
    both("a.raw", name, tmp_path, capfdbinary)
    both(name, "a.raw", tmp_path, capfdbinary, "-s")
    both(name, "a.raw", tmp_path, capfdbinary, "-p")
    # the same size (vpc rounds sizes to its geometry): strict mode's status words
    qemu_img("convert", "-O", "raw", name, "back.raw", cwd=tmp_path)
    both(name, "back.raw", tmp_path, capfdbinary, "-s")
    both("back.raw", name, tmp_path, capfdbinary, "-s", "-p")
    # a difference: in a data range and in a hole of the raw side
    shutil.copy(tmp_path / "a.raw", tmp_path / "b.raw")
    poke(tmp_path / "b.raw", sorted(rng.randrange(size) for _ in range(3)), rng)
    rc, _ = both(name, "b.raw", tmp_path, capfdbinary)
    assert rc == 1
    both("b.raw", name, tmp_path, capfdbinary, "-p")


@pytest.mark.parametrize("seed", range(8))
def test_first_of_several_differences(tmp_path, capfdbinary, seed):
    rng = random.Random(100 + seed)
    size = rng.randint(2 * KiB, 8 * MiB)
    sparse_raw(tmp_path / "a.raw", size, rng, chunks=rng.randint(0, 8))
    copy_sparse(tmp_path / "a.raw", tmp_path / "b.raw")
    where = rng.choice(["anywhere", "last sector", "first byte", "hole"])
    if where == "last sector":
        offsets = [size - 1 - rng.randrange(min(size, 512))]
    elif where == "first byte":
        offsets = [0]
    else:
        offsets = [rng.randrange(size) for _ in range(rng.randint(1, 5))]
    poke(tmp_path / "b.raw", offsets, rng)
    rc, out = both("a.raw", "b.raw", tmp_path, capfdbinary)
    assert rc == 1
    res = imgcopy.compare(tmp_path / "a.raw", tmp_path / "b.raw")
    assert res.offset <= min(offsets) < res.offset + 512
    # the threads never change the answer
    for n in (1, 2, 3, 8):
        again = imgcopy.compare(tmp_path / "a.raw", tmp_path / "b.raw", concurrency=n)
        assert (again.reason, again.offset, again.lines) == (res.reason, res.offset, res.lines)
    both("b.raw", "a.raw", tmp_path, capfdbinary, "-q")


def test_differences_in_many_steps_threads(tmp_path, capfdbinary):
    """Many 2 MiB steps differ: each thread finds some; the first wins."""
    rng = random.Random(9)
    size = 24 * MiB + 1000
    a = rng.randbytes(size)
    (tmp_path / "a.raw").write_bytes(a)
    b = bytearray(a)
    for off in range(size - 1, 3 * MiB, -rng.randint(100 * KiB, 900 * KiB)):
        b[off] ^= 0x5A
    (tmp_path / "b.raw").write_bytes(bytes(b))
    rc, out = both("a.raw", "b.raw", tmp_path, capfdbinary)
    first = min(i for i in range(3 * MiB, size) if a[i] != b[i])
    assert out == f"Content mismatch at offset {first // 512 * 512}!\n"
    for n in (1, 2, 4, 16):
        assert imgcopy.compare(tmp_path / "a.raw", tmp_path / "b.raw", concurrency=n).offset \
            == first // 512 * 512


def test_compressed_cluster_difference(tmp_path, capfdbinary):
    rng = random.Random(3)
    size = 3 * MiB + 512
    text = b"".join(rng.choice([b"alpha ", b"beta ", b"gamma\n"]) for _ in range(size // 5))
    (tmp_path / "a.raw").write_bytes(text[:size])
    qemu_img("convert", "-c", "-O", "qcow2", "a.raw", "a.qcow2", cwd=tmp_path)
    both("a.raw", "a.qcow2", tmp_path, capfdbinary)
    both("a.raw", "a.qcow2", tmp_path, capfdbinary, "-s", "-p")
    shutil.copy(tmp_path / "a.raw", tmp_path / "b.raw")
    poke(tmp_path / "b.raw", [1 * MiB + 777, 2 * MiB + 3], rng)
    assert both("a.qcow2", "b.raw", tmp_path, capfdbinary, "-p")[0] == 1
    assert both("b.raw", "a.qcow2", tmp_path, capfdbinary)[0] == 1


@pytest.mark.parametrize("tail", ["zero", "hole", "data", "data-late"])
def test_size_mismatch(tmp_path, capfdbinary, tail):
    rng = random.Random(len(tail))
    size = 1 * MiB + 512
    data = sparse_raw(tmp_path / "a.raw", size, rng, chunks=3)
    extra = 3 * MiB + 1536
    if tail == "zero":
        more = [(size, bytes(extra))]
    elif tail == "hole":
        more = []
    elif tail == "data":
        more = [(size + 5, b"x")]
    else:
        more = [(size + extra - 700, rng.randbytes(300))]
    make_sparse(tmp_path / "b.raw", size + extra, data + more)
    for args in (("a.raw", "b.raw"), ("b.raw", "a.raw")):
        rc, out = both(*args, tmp_path, capfdbinary)
        assert out.startswith("Warning: Image size mismatch!\n")
        assert rc == (0 if tail in ("zero", "hole") else 1)
        both(*args, tmp_path, capfdbinary, "-s")
        both(*args, tmp_path, capfdbinary, "-p")
    # a difference before the tail is found before the sizes are mentioned
    poke(tmp_path / "b.raw", [size // 2], rng)
    rc, out = both("a.raw", "b.raw", tmp_path, capfdbinary)
    assert rc == 1 and "Warning" not in out


def test_size_mismatch_qcow2_tail(tmp_path, capfdbinary):
    rng = random.Random(11)
    sparse_raw(tmp_path / "a.raw", 2 * MiB, rng, chunks=2)
    qemu_img("convert", "-O", "qcow2", "a.raw", "big.qcow2", cwd=tmp_path)
    qemu_img("resize", "big.qcow2", "6M", cwd=tmp_path)
    both("a.raw", "big.qcow2", tmp_path, capfdbinary)
    qemu_io(tmp_path / "big.qcow2", ["write -z 3M 64k", "write -P 7 5M 512"], fmt="qcow2")
    both("big.qcow2", "a.raw", tmp_path, capfdbinary, "-p")
    both("big.qcow2", "a.raw", tmp_path, capfdbinary, "-s")


@pytest.mark.parametrize("sizes", [(1000, 1024), (1000, 1025), (1023, 1000), (1, 511),
                                   (513, 1000)])
def test_odd_sizes(tmp_path, capfdbinary, sizes):
    rng = random.Random(sizes[0])
    common = rng.randbytes(min(sizes))
    (tmp_path / "a.raw").write_bytes(common + bytes(sizes[0] - len(common)))
    (tmp_path / "b.raw").write_bytes(common + bytes(sizes[1] - len(common)))
    both("a.raw", "b.raw", tmp_path, capfdbinary)
    both("a.raw", "b.raw", tmp_path, capfdbinary, "-s")
    # a byte past the shorter file's end but inside its last sector
    big = max(sizes)
    tail = bytearray(common + bytes(big - len(common)))
    tail[-1] = 0x42
    (tmp_path / "c.raw").write_bytes(bytes(tail))
    short = "a.raw" if sizes[0] < sizes[1] else "b.raw"
    both(short, "c.raw", tmp_path, capfdbinary)
    both("c.raw", short, tmp_path, capfdbinary, "-p")
    qemu_img("convert", "-O", "qcow2", short, "s.qcow2", cwd=tmp_path)
    both("s.qcow2", "c.raw", tmp_path, capfdbinary)
    both(short, "s.qcow2", tmp_path, capfdbinary, "-s")


@pytest.mark.parametrize("seed", range(3))
def test_backing_chain(tmp_path, capfdbinary, seed):
    rng = random.Random(50 + seed)
    base_size = rng.choice([1 * MiB, 2 * MiB + 512])
    sparse_raw(tmp_path / "base.raw", base_size, rng, chunks=3)
    qemu_img("convert", "-O", "qcow2", "base.raw", "base.qcow2", cwd=tmp_path)
    top_size = base_size + [0, 1 * MiB, 3 * MiB + 512][seed]
    qemu_img("create", "-f", "qcow2", "-b", "base.qcow2", "-F", "qcow2", "top.qcow2",
             str(top_size), cwd=tmp_path)
    cmds = [f"write -P {rng.randint(1, 255)} {rng.randrange(top_size - 4096) // 512 * 512} 4096",
            f"write -z {rng.randrange(base_size - 65536) // 65536 * 65536} 64k"]
    qemu_io(tmp_path / "top.qcow2", cmds, fmt="qcow2")
    qemu_img("convert", "-O", "raw", "top.qcow2", "flat.raw", cwd=tmp_path)
    both("top.qcow2", "flat.raw", tmp_path, capfdbinary)
    both("flat.raw", "top.qcow2", tmp_path, capfdbinary, "-s")
    both("top.qcow2", "base.qcow2", tmp_path, capfdbinary, "-p")
    qemu_img("create", "-f", "qcow2", "-b", "base.qcow2", "-F", "qcow2", "empty.qcow2",
             str(top_size), cwd=tmp_path)
    both("empty.qcow2", "base.qcow2", tmp_path, capfdbinary, "-s")
    both("empty.qcow2", "base.raw", tmp_path, capfdbinary, "-s")
    # a raw backing file
    qemu_img("create", "-f", "qcow2", "-b", "base.raw", "-F", "raw", "over.qcow2",
             str(top_size), cwd=tmp_path)
    both("over.qcow2", "base.raw", tmp_path, capfdbinary)
    both("over.qcow2", "empty.qcow2", tmp_path, capfdbinary, "-s")
    # zeros past the backing file's end are "allocated" in qemu's eyes
    qemu_img("convert", "-O", "qcow2", "top.qcow2", "flat.qcow2", cwd=tmp_path)
    both("top.qcow2", "flat.qcow2", tmp_path, capfdbinary, "-s")
    both("empty.qcow2", "flat.qcow2", tmp_path, capfdbinary, "-s", "-p")
    both("empty.qcow2", "top.qcow2", tmp_path, capfdbinary, "-s")
    poke(tmp_path / "flat.raw", [rng.randrange(top_size)], rng)
    assert both("top.qcow2", "flat.raw", tmp_path, capfdbinary)[0] == 1


def test_strict_allocation(tmp_path, capfdbinary):
    """Same content, different allocation: strict mode says where."""
    rng = random.Random(77)
    size = 4 * MiB
    data = [(64 * KiB, rng.randbytes(100 * KiB)), (2 * MiB, rng.randbytes(4096))]
    make_sparse(tmp_path / "sparse.raw", size, data)
    full = bytearray(size)
    for off, buf in data:
        full[off:off + len(buf)] = buf
    (tmp_path / "full.raw").write_bytes(bytes(full))
    qemu_img("convert", "-O", "qcow2", "sparse.raw", "a.qcow2", cwd=tmp_path)
    shutil.copy(tmp_path / "a.qcow2", tmp_path / "z.qcow2")
    qemu_io(tmp_path / "z.qcow2", ["write -z 1M 128k", "write -z -u 3M 64k"], fmt="qcow2")
    qemu_img("create", "-f", "qcow2", "-o", "preallocation=metadata", "pre.qcow2", str(size),
             cwd=tmp_path)
    qemu_io(tmp_path / "pre.qcow2", [f"write -P 0 0 {size}"], fmt="qcow2")
    names = ["sparse.raw", "full.raw", "a.qcow2", "z.qcow2"]
    for a in names:
        for b in names:
            if a < b:
                assert both(a, b, tmp_path, capfdbinary)[0] == 0
                both(a, b, tmp_path, capfdbinary, "-s")
    both("a.qcow2", "pre.qcow2", tmp_path, capfdbinary, "-s")
    # whichever comes first: a content difference or an allocation difference
    for where, expect in ((70001, "Content mismatch at offset 69632!"),
                          (3 * MiB + 70001, "Strict mode: Offset 1048576 block status mismatch!")):
        shutil.copy(tmp_path / "a.qcow2", tmp_path / "c.qcow2")
        qemu_io(tmp_path / "c.qcow2", [f"write -P 9 {where} 1"], fmt="qcow2")
        rc, out = same_as_qemu(["-s", "c.qcow2", "z.qcow2"], tmp_path, capfdbinary)
        assert (rc, out) == (1, expect + "\n")
        for threads in (1, 2, 8):
            res = imgcopy.compare(tmp_path / "c.qcow2", tmp_path / "z.qcow2", strict=True,
                                  concurrency=threads)
            assert res.message == expect


def test_sparse_terabyte_costs_nothing(tmp_path, capfdbinary):
    size = 1 << 40
    rng = random.Random(1)
    data = [(rng.randrange(size // 4096) * 4096, rng.randbytes(1 * MiB)) for _ in range(4)]
    make_sparse(tmp_path / "a.raw", size, data)
    make_sparse(tmp_path / "b.raw", size, data)
    start = time.monotonic()
    res = imgcopy.compare(tmp_path / "a.raw", tmp_path / "b.raw")
    elapsed = time.monotonic() - start
    assert res and elapsed < 0.5, elapsed
    assert res.bytes_read <= 2 * 4 * 2 * MiB
    both("a.raw", "b.raw", tmp_path, capfdbinary)
    poke(tmp_path / "b.raw", [data[2][0] + 12345], rng)
    both("a.raw", "b.raw", tmp_path, capfdbinary)


USAGE_CASES = [
    ["a.raw"], [], ["a.raw", "b.raw", "c.raw"], ["-x", "a.raw", "b.raw"], ["-f"],
    ["--bogus", "a.raw", "b.raw"], ["-f", "qcow2", "a.raw", "b.raw"],
    ["-F", "qcow2", "a.raw", "b.raw"], ["a.raw", "missing.raw"], ["missing.raw", "a.raw"],
    ["-T", "foo", "a.raw", "b.raw"], ["-T", "none", "a.raw", "b.raw"], ["-f", "foo", "a.raw", "b.raw"],
    ["-q", "a.raw", "b.raw"], ["-q", "-s", "a.raw", "b.raw"], ["a.raw", "-U", "b.raw"],
    ["-pq", "a.raw", "b.raw"], ["-p", "a.raw", "missing.raw"], ["-p", "-T", "foo", "a.raw", "b.raw"],
    ["a.raw", "."], ["--", "a.raw", "b.raw"], ["--force-share", "a.raw", "b.raw"],
]


@pytest.mark.parametrize("args", USAGE_CASES, ids=lambda a: " ".join(a) or "none")
def test_options_and_errors(tmp_path, capfdbinary, args):
    make_sparse(tmp_path / "a.raw", 1 * MiB, [(4096, b"abc")])
    make_sparse(tmp_path / "b.raw", 2 * MiB, [(4096, b"abd")])
    same_as_qemu(args, tmp_path, capfdbinary)


def test_api_errors(tmp_path):
    make_sparse(tmp_path / "a.raw", 1 * MiB)
    with pytest.raises(FileNotFoundError):
        imgcopy.compare(tmp_path / "a.raw", tmp_path / "missing")
    with pytest.raises(imgcopy.ImageFormatError):
        imgcopy.compare(tmp_path / "a.raw", tmp_path / "a.raw", b_format="qcow2")
    with pytest.raises(ValueError):
        imgcopy.compare(tmp_path / "a.raw", tmp_path / "a.raw", concurrency=0)


@needs_nbdkit
def test_nbd_and_read_errors(tmp_path, capfdbinary):
    rng = random.Random(5)
    sparse_raw(tmp_path / "a.raw", 2 * MiB, rng, chunks=2)
    with nbdkit("file", str(tmp_path / "a.raw"), log=False) as srv:
        both("a.raw", srv.uri, tmp_path, capfdbinary)
    with nbdkit("pattern", "2M", "error-pread-rate=1", "error=EIO", filters=["error"],
                log=False) as srv:
        assert same_as_qemu(["a.raw", srv.uri], tmp_path, capfdbinary)[0] == 2  # probing
        for args in (["-F", "raw", "a.raw", srv.uri], ["-f", "raw", srv.uri, "a.raw"],
                     ["-F", "raw", "-p", "a.raw", srv.uri]):
            assert same_as_qemu(args, tmp_path, capfdbinary)[0] == 4
        with pytest.raises(OSError) as info:
            imgcopy.compare(tmp_path / "a.raw", srv.uri, b_format="raw")
        assert info.value.compare_step == 4 and info.value.compare_image == 1


@needs_qemu_nbd
def test_nbd_exports(tmp_path, capfdbinary):
    """An NBD export's block status cuts the steps as the file's would."""
    rng = random.Random(8)
    sparse_raw(tmp_path / "a.raw", 5 * MiB + 512, rng, chunks=4)
    qemu_img("convert", "-O", "qcow2", "-o", "cluster_size=4k", "a.raw", "a.qcow2",
             cwd=tmp_path)
    shutil.copy(tmp_path / "a.raw", tmp_path / "b.raw")
    poke(tmp_path / "b.raw", [3 * MiB + 5], rng)
    with qemu_nbd(tmp_path / "a.qcow2", "qcow2", read_only=True) as srv:
        for args in (["a.raw", srv.uri], ["-p", srv.uri, "a.raw"], ["-s", "a.raw", srv.uri],
                     ["-s", "a.qcow2", srv.uri], ["-p", "a.qcow2", srv.uri],
                     [srv.uri, "b.raw"]):
            same_as_qemu(args, tmp_path, capfdbinary)


@needs_nbdkit
def test_ctrl_c_stops_a_long_compare(tmp_path):
    """The comparison runs outside Python's thread: Ctrl-C still stops it."""
    import signal
    import subprocess
    import sys
    # 4 GiB: steps of 2 MiB, 200 ms a read, some 16 in flight: a minute
    with nbdkit("pattern", "4G", "rdelay=200ms", filters=["delay"], log=False) as srv:
        p = subprocess.Popen([sys.executable, "-m", "imgcopy", "compare", "-f", "raw", "-F",
                              "raw", srv.uri, srv.uri], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        time.sleep(1.0)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
    assert (p.returncode, out, err) == (130, "", "imgcopy: interrupted\n")


def test_api_progress_reports(tmp_path, capfdbinary):
    """on_progress gets the reports -p prints, in order."""
    rng = random.Random(21)
    sparse_raw(tmp_path / "a.raw", 3 * MiB, rng)
    shutil.copy(tmp_path / "a.raw", tmp_path / "c.raw")
    with open(tmp_path / "c.raw", "r+b") as f:
        f.truncate(5 * MiB)
        f.seek(4 * MiB + 7)
        f.write(b"x")
    rc, out = same_as_qemu(["-p", "a.raw", "c.raw"], tmp_path, capfdbinary)
    got = []
    res = imgcopy.compare(tmp_path / "a.raw", tmp_path / "c.raw",
                          on_progress=lambda p, tail: got.append((p, tail)))
    text = "    (0.00/100%)\r"
    for p, tail in got:
        if tail and "Warning" not in text:
            text += "Warning: Image size mismatch!\n"
        text += "    (%3.2f/100%%)\r" % p
    if res.warned and "Warning" not in text:
        text += "Warning: Image size mismatch!\n"
    assert text + res.message + "\n\n" == out
