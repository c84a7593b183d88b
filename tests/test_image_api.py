"""The Python API contract of imgcopy.open() / Image / ExtentMap."""

import errno
import os
import pathlib
import random
import subprocess
import sys

import pytest

from .oracles import (clip_entries, extent_tuple, find_covering, needs_qemu_img, qemu_img, qemu_io,
                      qemu_map, qemu_map_human, require_qemu_io, sha256_file)
from .units import KiB, MiB

import imgcopy

pytestmark = needs_qemu_img


@pytest.fixture
def sparse(make_sparse):
    """A 3 MiB + 5 sparse file: data at 64k..64k+10000, hole elsewhere, last byte data."""
    data = [(65536, bytes(range(1, 251)) * 40), (3 * MiB + 4, b"\xee")]
    return make_sparse("sparse.img", 3 * MiB + 5, data)


def _drop_page_cache(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _file_bytes(path):
    with open(path, "rb") as f:
        return f.read()


# --------------------------------------------------------------------------
# opening, paths, properties


@pytest.mark.parametrize("pathtype", ["str", "bytes", "pathlike"])
def test_path_types(sparse, pathtype):
    p = {"str": sparse, "bytes": os.fsencode(sparse), "pathlike": pathlib.Path(sparse)}[pathtype]
    with imgcopy.open(p) as img:
        assert img.size == 3 * MiB + 5
        assert img.format == "raw"
        assert img.filename == sparse
        assert isinstance(img.filename, str)
        assert img.closed is False
    assert imgcopy.map(p).to_json() == qemu_map(sparse).text


def test_context_manager_and_close(sparse):
    with imgcopy.open(sparse) as img:
        assert not img.closed
        inner = img
    assert inner.closed
    img = imgcopy.open(sparse)
    assert img.__enter__() is img
    assert not img.closed
    img.close()
    assert img.closed
    img.close()  # closing twice is harmless
    assert img.closed


def test_context_manager_closes_on_exception(sparse):
    with pytest.raises(RuntimeError):
        with imgcopy.open(sparse) as img:
            raise RuntimeError("boom")
    assert img.closed


@pytest.mark.parametrize("size", [0, 1, 511, 512, 1000001, 4 * MiB])
def test_size_is_exact(make_sparse, size):
    path = make_sparse("s%d.img" % size, size)
    with imgcopy.open(path, format="raw") as img:
        assert img.size == size
        assert img.format == "raw"
    m = imgcopy.map(path)
    assert m.size == size


def test_explicit_format_and_mode(sparse):
    with imgcopy.open(sparse, format="raw", mode="r") as img:
        assert img.format == "raw"
    with imgcopy.open(sparse, format=None, mode="r+") as img:
        assert img.format == "raw"


@pytest.mark.parametrize("kind,seed", [("holes_and_data", 1), ("alloc_zeros", 2), ("unaligned", 1),
                                       ("tiny", 2), ("odd_size", 1), ("qemu_io", 1)])
def test_read_matches_file(make_image, kind, seed):
    im = make_image(kind, seed)
    content = _file_bytes(im.path)
    rng = random.Random("read-%s-%d" % (kind, seed))
    with imgcopy.open(im.path) as img:
        assert img.read(0, im.size) == content
        for _ in range(60):
            off = rng.randrange(im.size)
            n = rng.randint(1, im.size - off)
            got = img.read(off, n)
            assert isinstance(got, bytes)
            assert got == content[off:off + n], (off, n)
        # holes read as zeros
        for t in clip_entries(qemu_map(im.path).extents, im.size):
            if t[4]:  # zero
                assert img.read(t[0], t[1]) == bytes(t[1])


# --------------------------------------------------------------------------
# errors


def test_missing_file(tmp_path):
    p = str(tmp_path / "does-not-exist.img")
    with pytest.raises(FileNotFoundError) as ei:
        imgcopy.open(p)
    assert ei.value.errno == errno.ENOENT
    assert ei.value.filename == p
    with pytest.raises(FileNotFoundError) as ei:
        imgcopy.map(p)
    assert ei.value.errno == errno.ENOENT
    assert ei.value.filename == p


@pytest.mark.parametrize("pathtype", ["bytes", "pathlike"])
def test_missing_file_other_path_types(tmp_path, pathtype):
    p = str(tmp_path / "nope.img")
    arg = os.fsencode(p) if pathtype == "bytes" else pathlib.Path(p)
    with pytest.raises(FileNotFoundError) as ei:
        imgcopy.open(arg)
    assert ei.value.errno == errno.ENOENT
    assert os.fsdecode(os.fspath(ei.value.filename)) == p


def test_directory(tmp_path):
    with pytest.raises(IsADirectoryError) as ei:
        imgcopy.open(str(tmp_path))
    assert ei.value.errno == errno.EISDIR
    with pytest.raises(IsADirectoryError):
        imgcopy.map(tmp_path)


def test_error_hierarchy():
    assert issubclass(imgcopy.Error, Exception)
    assert issubclass(imgcopy.ImageFormatError, imgcopy.Error)
    assert issubclass(imgcopy.ImageFormatError, ValueError)


@pytest.mark.parametrize("fmt", ["qcow3", "nosuchformat", "RAW ", ""])
def test_unknown_format(sparse, fmt):
    with pytest.raises(ValueError):
        imgcopy.open(sparse, format=fmt)
    with pytest.raises(ValueError):
        imgcopy.map(sparse, format=fmt)


@pytest.mark.parametrize("mode", ["w", "rw", "a", "", "r+b", "x", "w+"])
def test_bad_mode(sparse, mode):
    before = sha256_file(sparse)
    with pytest.raises(ValueError):
        imgcopy.open(sparse, mode=mode)
    assert sha256_file(sparse) == before
    assert os.path.getsize(sparse) == 3 * MiB + 5


def test_out_of_range_arguments(sparse):
    size = 3 * MiB + 5
    with imgcopy.open(sparse) as img:
        bad = [
            (img.block_status, (size,)),
            (img.block_status, (-1,)),
            (img.block_status, (0, size + 1)),
            (img.block_status, (size - 10, 11)),
            (img.block_status, (size + 4096,)),
            (img.read, (size - 10, 20)),
            (img.read, (size, 1)),
            (img.read, (-1, 1)),
            (img.read, (0, -1)),
            (img.read, (size + 1, 1)),
            (img.read, (0, 1 << 63)),
            (img.read, (1, (1 << 64) - 1)),
            (img.read, (1 << 64, 1)),
            (img.block_status, (1 << 64,)),
            (img.block_status, (1, (1 << 64) - 1)),
        ]
        for fn, args in bad:
            with pytest.raises(ValueError):
                fn(*args)
        # the image is still usable
        assert img.read(size - 1, 1) == b"\xee"
        assert img.block_status(0).start == 0


def test_use_after_close(sparse):
    img = imgcopy.open(sparse, mode="r+")
    img.close()
    for call in (lambda: img.block_status(0), lambda: img.read(0, 1), lambda: img.extents(),
                 lambda: img.write(0, b"x"), lambda: img.zero(0, 4096), lambda: img.flush()):
        with pytest.raises(ValueError):
            call()
    assert img.closed


# --------------------------------------------------------------------------
# read-only never modifies


def test_read_only_never_modifies(sparse):
    st0 = os.stat(sparse)
    h0 = sha256_file(sparse)
    q0 = qemu_map(sparse).text
    with imgcopy.open(sparse) as img:
        img.extents()
        for off in range(0, img.size, 65536):
            img.block_status(off)
        img.read(0, img.size)
        img.drop_cache()
        img.block_status(img.size - 1)
        with pytest.raises((OSError, ValueError)):
            img.write(0, b"hello")
        with pytest.raises((OSError, ValueError)):
            img.zero(0, 4096)
    imgcopy.map(sparse)
    st1 = os.stat(sparse)
    assert sha256_file(sparse) == h0
    assert st1.st_mtime_ns == st0.st_mtime_ns
    assert st1.st_size == st0.st_size
    assert st1.st_blocks == st0.st_blocks
    assert qemu_map(sparse).text == q0


def test_read_only_works_on_read_only_file(sparse):
    os.chmod(sparse, 0o444)
    try:
        with imgcopy.open(sparse) as img:
            assert img.read(65536, 4) == b"\x01\x02\x03\x04"
            assert img.extents().to_json() == qemu_map(sparse).text
    finally:
        os.chmod(sparse, 0o644)


# --------------------------------------------------------------------------
# writes keep the cache coherent


def _assert_map_is_qemu(img, path):
    q = qemu_map(path)
    assert img.extents().to_json() == q.text
    return clip_entries(q.extents, img.size)


@pytest.mark.parametrize("off,n", [(1 * MiB, 4096), (1 * MiB + 123, 100), (2 * MiB - 10, 20),
                                   (0, 1), (3 * MiB - 4096, 4100)])
def test_write_into_hole_updates_cache(sparse, off, n):
    data = bytes((i * 7 + 3) % 255 + 1 for i in range(n))
    with imgcopy.open(sparse, mode="r+") as img:
        before = img.extents()
        assert before.to_json() == qemu_map(sparse).text
        e = img.block_status(off)
        assert e.zero and not e.data  # it is a hole now (and cached)
        img.write(off, data)
        e = img.block_status(off)
        assert e.start == off and e.data and not e.zero, e
        assert e.length >= 1
        assert img.read(off, n) == data
        qext = _assert_map_is_qemu(img, sparse)
        t = extent_tuple(img.block_status(off))
        q = find_covering(qext, off)
        assert t[2:6] == q[2:6] and off + t[1] <= q[0] + q[1]
        img.flush()
    with open(sparse, "rb") as f:
        f.seek(off)
        assert f.read(n) == data
    assert os.path.getsize(sparse) == 3 * MiB + 5


@pytest.mark.parametrize("punch", [True, False, None])
def test_zero_range_updates_cache(make_sparse, punch):
    size = 4 * MiB + 100
    path = make_sparse("dense.img", size, [(0, b"\x5a" * size)])
    with imgcopy.open(path, mode="r+") as img:
        m = img.extents()
        assert m.to_json() == qemu_map(path).text
        assert img.block_status(1 * MiB).data
        if punch is None:
            img.zero(1 * MiB, 1 * MiB)          # default: punch a hole
        else:
            img.zero(1 * MiB, 1 * MiB, punch_hole=punch)
        assert img.read(1 * MiB, 1 * MiB) == bytes(1 * MiB)
        assert img.read(1 * MiB - 1, 1) == b"\x5a"
        assert img.read(2 * MiB, 1) == b"\x5a"
        e = img.block_status(1 * MiB)
        if punch in (True, None):
            assert e.zero and not e.data, e
            assert e.start == 1 * MiB and e.end <= 2 * MiB
            assert e.length == 1 * MiB
        qext = _assert_map_is_qemu(img, path)
        t = extent_tuple(e)
        q = find_covering(qext, 1 * MiB)
        assert t[2:6] == q[2:6]
        # neighbours are still data
        assert img.block_status(1 * MiB - 1).data
        assert img.block_status(2 * MiB).data
        img.flush()
    assert os.path.getsize(path) == size
    with open(path, "rb") as f:
        f.seek(1 * MiB)
        assert f.read(1 * MiB) == bytes(1 * MiB)


def test_zero_then_write_back(make_sparse):
    """zero() then write() into the new hole: the map follows both changes."""
    size = 2 * MiB
    path = make_sparse("zw.img", size, [(0, b"\x11" * size)])
    with imgcopy.open(path, mode="r+") as img:
        img.extents()
        img.zero(512 * KiB, 512 * KiB)
        _assert_map_is_qemu(img, path)
        img.write(600 * KiB, b"\x22" * 8192)
        _assert_map_is_qemu(img, path)
        assert img.block_status(600 * KiB).data
        assert img.read(600 * KiB, 8192) == b"\x22" * 8192


def test_write_out_of_range(sparse):
    size = 3 * MiB + 5
    h0 = sha256_file(sparse)
    with imgcopy.open(sparse, mode="r+") as img:
        with pytest.raises(ValueError):
            img.write(-1, b"x")
        with pytest.raises(ValueError):
            img.zero(-1, 4096)
        with pytest.raises(ValueError):
            img.zero(0, -4096)
    assert sha256_file(sparse) == h0
    assert os.path.getsize(sparse) == size


def test_write_and_zero_out_of_bounds(sparse):
    """Images do not grow: writes/zeroes past the end are rejected, file untouched."""
    size = 3 * MiB + 5
    h0 = sha256_file(sparse)
    with imgcopy.open(sparse, mode="r+") as img:
        for call in (lambda: img.write(size - 1, b"ab"), lambda: img.write(size, b"a"),
                     lambda: img.zero(size - 4096, 8192), lambda: img.zero(size, 1),
                     lambda: img.write((1 << 64) - 1, b"ab"), lambda: img.zero(4096, (1 << 64) - 4096)):
            with pytest.raises(ValueError):
                call()
        assert img.size == size
    assert sha256_file(sparse) == h0
    assert os.path.getsize(sparse) == size


@pytest.mark.parametrize("off,n", [(5000, 1), (4096, 4096), (4000, 200), (1 * MiB - 10, 10)])
def test_zero_without_punch_in_hole(make_sparse, off, n):
    """zero(punch_hole=False) on a hole: the map must still equal qemu's.

    (The file system may allocate the partial blocks it zeroes: the cache
    must not keep claiming the rest of those blocks are holes.)
    """
    path = make_sparse("zh.img", 1 * MiB, [(512 * KiB, b"\x01" * 4096)])
    with imgcopy.open(path, mode="r+") as img:
        assert img.extents().to_json() == qemu_map(path).text
        img.zero(off, n, punch_hole=False)
        assert img.read(off, n) == bytes(n)
        _assert_map_is_qemu(img, path)


@pytest.mark.parametrize("off,n", [(5000, 1), (4096, 8192), (100, 300000)])
def test_zero_without_punch_in_data(make_sparse, off, n):
    size = 1 * MiB
    path = make_sparse("zd.img", size, [(0, b"\x07" * size)])
    with imgcopy.open(path, mode="r+") as img:
        img.extents()
        img.zero(off, n, punch_hole=False)
        assert img.read(off, n) == bytes(n)
        assert img.read(off + n, 1) == b"\x07"
        _assert_map_is_qemu(img, path)


def test_unaligned_zero_inside_data(make_sparse):
    """zero() of an unaligned range: partial blocks zeroed, whole blocks punched."""
    size = 1 * MiB + 333
    path = make_sparse("uz.img", size, [(0, b"\x42" * size)])
    with imgcopy.open(path, mode="r+") as img:
        img.extents()
        img.zero(1000, 50000)
        _assert_map_is_qemu(img, path)
        assert img.read(1000, 50000) == bytes(50000)
        assert img.read(999, 1) == b"\x42" and img.read(51000, 1) == b"\x42"
        img.zero(size - 700, 700)
        _assert_map_is_qemu(img, path)
        assert img.read(size - 701, 701) == b"\x42" + bytes(700)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_mutations_keep_cache_coherent(make_image, seed):
    """Random write/zero/block_status sequences: the map always equals qemu's."""
    rng = random.Random("mut-%d" % seed)
    im = make_image("holes_and_data", seed)
    shadow = bytearray(_file_bytes(im.path))
    size = im.size
    with imgcopy.open(im.path, mode="r+") as img:
        for step in range(25):
            # warm random parts of the cache
            for _ in range(rng.randint(0, 5)):
                img.block_status(rng.randrange(size))
            off = rng.randrange(size)
            n = min(size - off, rng.choice([1, 512, 4096, 5000, 65536, rng.randint(1, 300000)]))
            op = rng.choice(["write", "write", "zero", "zero_nopunch"])
            if op == "write":
                data = bytes(rng.randint(1, 255) for _ in range(min(n, 64))) * (n // 64 + 1)
                data = data[:n]
                img.write(off, data)
                shadow[off:off + n] = data
            else:
                img.zero(off, n, punch_hole=(op == "zero"))
                shadow[off:off + n] = bytes(n)
            what = "step %d: %s(%d, %d)" % (step, op, off, n)
            # ext4 calls an unwritten (zero_nopunch) extent data while its
            # pages sit in the page cache, which the reads below bring in:
            # write back and drop the pages so that both tools see the
            # same file state
            img.flush()
            _drop_page_cache(im.path)
            q = qemu_map(im.path)
            assert img.extents().to_json() == q.text, what
            qext = clip_entries(q.extents, size)
            probe = rng.randrange(size)
            t = extent_tuple(img.block_status(probe))
            c = find_covering(qext, probe)
            assert t[0] == probe and t[2:6] == c[2:6] and probe + t[1] <= c[0] + c[1], (what, t, c)
            a = rng.randrange(size)
            b = min(size, a + rng.randint(1, 100000))
            assert img.read(a, b - a) == bytes(shadow[a:b]), what
        img.flush()
    assert _file_bytes(im.path) == bytes(shadow)


def test_extent_map_outlives_image(sparse):
    with imgcopy.open(sparse) as img:
        m = img.extents()
        e = img.block_status(0)
    assert m.to_json() == qemu_map(sparse).text
    assert len(m) >= 1 and m[0].start == 0
    assert e.start == 0


def test_non_utf8_bytes_path(tmp_path):
    raw = os.fsencode(str(tmp_path)) + b"/img-\xff\xfe.raw"
    fd = os.open(raw, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.ftruncate(fd, 65536 + 3)
        os.pwrite(fd, b"data", 8192)
    finally:
        os.close(fd)
    with imgcopy.open(raw) as img:
        assert img.size == 65539
        assert img.filename == os.fsdecode(raw)
        assert img.read(8192, 4) == b"data"
    assert imgcopy.map(raw).to_json() == qemu_map(os.fsdecode(raw)).text


def test_qcow2_file_as_raw(tmp_path):
    """A qcow2 file opened with format="raw" is just bytes: map == qemu-img map -f raw."""
    require_qemu_io()
    p = str(tmp_path / "disk.qcow2")
    qemu_img("create", "-q", "-f", "qcow2", p, "64M")
    qemu_io(p, ["write -P 0x11 1M 64k"], fmt="qcow2")
    with imgcopy.open(p, format="raw") as img:
        assert img.format == "raw"
        assert img.size == os.path.getsize(p)
        assert img.read(0, 4) == b"QFI\xfb"
    assert imgcopy.map(p, format="raw").to_json() == qemu_map(p, fmt="raw").text
    # probing must not silently call it raw
    try:
        img = imgcopy.open(p)
    except imgcopy.Error as e:
        assert isinstance(e, ValueError)  # ImageFormatError
    else:
        with img:
            assert img.format != "raw"


def test_fifo_is_rejected_without_hanging(tmp_path):
    """Opening a FIFO must fail promptly (not block waiting for a writer)."""
    fifo = str(tmp_path / "fifo")
    os.mkfifo(fifo)
    code = ("import imgcopy, sys\n"
            "try:\n    imgcopy.open(sys.argv[1])\n"
            "except (OSError, ValueError) as e:\n    print(type(e).__name__)\n    sys.exit(0)\n"
            "sys.exit(3)\n")
    p = subprocess.run([sys.executable, "-c", code, fifo], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, timeout=20, cwd=str(tmp_path))
    assert p.returncode == 0, (p.returncode, p.stdout, p.stderr)


# --------------------------------------------------------------------------
# block devices


def test_block_device(make_sparse, loop_device):
    size = 8 * MiB
    path = make_sparse("loop.img", size, [(1000, b"abc"), (5 * MiB, b"\x01" * 4096)])
    dev = loop_device(path)
    fd = os.open(dev, os.O_RDONLY)
    try:
        devsize = os.lseek(fd, 0, os.SEEK_END)
    finally:
        os.close(fd)
    assert devsize == size
    with imgcopy.open(dev) as img:
        assert img.size == devsize
        assert img.format == "raw"
        assert img.filename == dev
        e = img.block_status(0)
        assert (e.start, e.depth, e.present, e.data, e.zero) == (0, 0, True, True, False), e
        assert e.host_offset == 0
        assert e.end <= devsize
        mid = img.block_status(3 * MiB + 17)
        assert mid.data and not mid.zero and mid.present and mid.host_offset == 3 * MiB + 17
        assert img.read(1000, 3) == b"abc"
    q = qemu_map(dev)
    m = imgcopy.map(dev)
    assert m.to_json() == q.text
    assert [extent_tuple(x) for x in m] == clip_entries(q.extents, devsize)
    assert m.data_bytes == devsize
    assert m.to_human(dev) == qemu_map_human(dev)
