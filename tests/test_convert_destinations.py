"""What convert() does to its destination: a new file appears only when the
copy is complete (written under a temporary name, renamed at the end); an
existing destination (-n) must be large enough and of a known format."""
import os
import stat
import subprocess

import pytest

import imgcopy

from .convert_helpers import imgcopy_cmd
from .gen.qcow2_meta import l2_patch
from .gen.sparse import make_sparse, seeded_bytes
from .oracles import assert_same_content, qemu_img, sha256_file
from .servers import slow_export
from .units import MiB


def leftovers(directory, name):
    """Temporary files convert may have left beside `name`."""
    return [n for n in os.listdir(directory) if n.startswith("." + name + ".imgcopy-")]


def unreadable_tail_source(tmp_path, size=16 * MiB):
    """A qcow2 source whose last cluster cannot be read (it claims to be
    compressed): a copy fails after writing most of the data."""
    raw = str(tmp_path / "src.raw")
    make_sparse(raw, size, [(0, seeded_bytes(size))])
    src = str(tmp_path / "src.qcow2")
    qemu_img("convert", "-f", "raw", "-O", "qcow2", raw, src)
    l2_patch(src, size // (64 << 10) - 1, 1 << 62)
    return src


# ---------------------------------------------------------------------------
# a failed copy leaves nothing that looks like a copy

@pytest.mark.parametrize("fmt", ["raw", "qcow2"])
@pytest.mark.parametrize("old", [False, True], ids=["new", "replacing"])
def test_enospc_leaves_no_copy(tmp_path, small_tmpfs, fmt, old):
    src = str(tmp_path / "src.raw")
    make_sparse(src, 16 * MiB, [(0, seeded_bytes(16 * MiB))])
    dst = str(small_tmpfs / ("out." + fmt))
    if old:
        with open(dst, "wb") as f:
            f.write(b"old content" * 100)
        before = sha256_file(dst)
    with pytest.raises(OSError) as info:
        imgcopy.convert(src, dst, dst_format=fmt)
    assert info.value.errno == 28
    assert info.value.filename == dst  # the destination the caller named
    if old:
        assert sha256_file(dst) == before, "the old file changed"
    else:
        assert not os.path.exists(dst)
    assert leftovers(str(small_tmpfs), os.path.basename(dst)) == []


@pytest.mark.parametrize("fmt", ["raw", "qcow2"])
def test_read_error_leaves_no_copy(tmp_path, fmt):
    src = unreadable_tail_source(tmp_path)
    dst = str(tmp_path / ("out." + fmt))
    with pytest.raises(imgcopy.ImageFormatError, match="compressed cluster"):
        imgcopy.convert(src, dst, dst_format=fmt, concurrency=1, request_size=64 << 10)
    assert not os.path.exists(dst)
    assert leftovers(str(tmp_path), os.path.basename(dst)) == []


def test_interrupted_copy_leaves_no_copy(tmp_path):
    """The progress callback raises (as Ctrl-C does) during a long copy."""
    dst = str(tmp_path / "out.raw")

    def stop(done, total):
        raise KeyboardInterrupt

    with slow_export() as srv, pytest.raises(KeyboardInterrupt):
        imgcopy.convert(srv.uri, dst, request_size=4096, progress=stop)
    assert not os.path.exists(dst)
    assert leftovers(str(tmp_path), "out.raw") == []


def test_success_replaces_an_old_file_keeping_its_mode(tmp_path):
    src = str(tmp_path / "src.raw")
    make_sparse(src, 4 * MiB, [(MiB, seeded_bytes(MiB))])
    dst = str(tmp_path / "out.raw")
    with open(dst, "wb") as f:
        f.write(b"x" * (16 * MiB))
    os.chmod(dst, 0o640)
    imgcopy.convert(src, dst)
    assert sha256_file(dst) == sha256_file(src)
    assert stat.S_IMODE(os.stat(dst).st_mode) == 0o640
    assert leftovers(str(tmp_path), "out.raw") == []


def test_a_symlinked_destination_replaces_its_target(tmp_path):
    src = str(tmp_path / "src.raw")
    make_sparse(src, 4 * MiB, [(MiB, seeded_bytes(MiB))])
    (tmp_path / "store").mkdir()
    target = tmp_path / "store" / "disk.raw"
    target.write_bytes(b"old")
    link = tmp_path / "disk.raw"
    link.symlink_to(target)
    imgcopy.convert(src, str(link))
    assert link.is_symlink()
    assert sha256_file(str(target)) == sha256_file(src)


def test_unflushed_copy_is_still_renamed(tmp_path):
    src = str(tmp_path / "src.raw")
    make_sparse(src, 4 * MiB, [(MiB, seeded_bytes(MiB))])
    dst = str(tmp_path / "out.qcow2")
    imgcopy.convert(src, dst, dst_format="qcow2", flush=False)
    assert os.path.exists(dst)
    assert_same_content(src, dst, "raw", "qcow2")


def test_existing_destination_is_written_in_place(tmp_path):
    """-n: the same inode, as documented (no temporary file)."""
    src = str(tmp_path / "src.raw")
    make_sparse(src, 4 * MiB, [(MiB, seeded_bytes(MiB))])
    dst = str(tmp_path / "out.raw")
    make_sparse(dst, 4 * MiB)
    inode = os.stat(dst).st_ino
    imgcopy.convert(src, dst, create=False)
    assert os.stat(dst).st_ino == inode
    assert sha256_file(dst) == sha256_file(src)


# ---------------------------------------------------------------------------
# -n: existing destinations

@pytest.mark.parametrize("fmt", ["raw", "qcow2"])
def test_existing_smaller_destination_is_refused(tmp_path, fmt):
    src = str(tmp_path / "src.raw")
    make_sparse(src, 8 * MiB, [(0, seeded_bytes(MiB))])
    dst = str(tmp_path / ("small." + fmt))
    qemu_img("create", "-f", fmt, dst, str(4 * MiB))
    before = sha256_file(dst)
    with pytest.raises(ValueError, match=r"smaller than the source") as info:
        imgcopy.convert(src, dst, dst_format=fmt, create=False)
    assert "closed image" not in str(info.value)
    assert "4194304" in str(info.value) and "8388608" in str(info.value)
    assert sha256_file(dst) == before


def test_existing_qcow2_without_format_is_refused(tmp_path):
    src = str(tmp_path / "src.raw")
    make_sparse(src, 4 * MiB, [(0, seeded_bytes(MiB))])
    dst = str(tmp_path / "existing.qcow2")
    qemu_img("create", "-f", "qcow2", dst, str(4 * MiB))
    before = sha256_file(dst)
    with pytest.raises(imgcopy.ImageFormatError) as info:
        imgcopy.convert(src, dst, create=False)
    text = str(info.value)
    assert "qcow2" in text and 'dst_format="qcow2"' in text and 'dst_format="raw"' in text
    assert sha256_file(dst) == before
    # the CLI names its own flag
    p = subprocess.run(imgcopy_cmd() + ["convert", "-n", src, dst], capture_output=True,
                       text=True)
    assert p.returncode == 1
    assert "-O qcow2" in p.stderr and "dst_format" not in p.stderr, p.stderr
    assert sha256_file(dst) == before
    # named, it works either way
    imgcopy.convert(src, dst, create=False, dst_format="qcow2")
    assert_same_content(src, dst, "raw", "qcow2")


def test_existing_foreign_image_without_format_is_refused(tmp_path):
    src = str(tmp_path / "src.raw")
    make_sparse(src, 4 * MiB, [(0, seeded_bytes(MiB))])
    dst = str(tmp_path / "existing.vmdk")
    qemu_img("create", "-f", "vmdk", dst, str(4 * MiB))
    with pytest.raises(imgcopy.ImageFormatError, match="vmdk"):
        imgcopy.convert(src, dst, create=False)


def test_existing_raw_destination_needs_no_format(tmp_path):
    src = str(tmp_path / "src.raw")
    make_sparse(src, 4 * MiB, [(0, seeded_bytes(MiB))])
    dst = str(tmp_path / "existing.raw")
    make_sparse(dst, 8 * MiB, [(6 * MiB, b"tail" * 1024)])
    imgcopy.convert(src, dst, create=False)
    with open(dst, "rb") as f:
        assert f.read(4 * MiB) == open(src, "rb").read()
        f.seek(6 * MiB)
        assert f.read(4096) == b"tail" * 1024


def test_cli_target_is_zero_with_existing(tmp_path):
    src = str(tmp_path / "src.raw")
    make_sparse(src, 4 * MiB, [(0, seeded_bytes(MiB))])
    dst = str(tmp_path / "zeros.raw")
    make_sparse(dst, 4 * MiB)
    p = subprocess.run(imgcopy_cmd() + ["convert", "-n", "--target-is-zero", src, dst],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert sha256_file(dst) == sha256_file(src)


def test_fully_allocated_file_allocates_without_writing_zeros(tmp_path):
    """-S 0 into files: every block gets disk space (st_blocks), by the
    cheapest call that leaves it allocated (a new file: fallocate; an
    existing one: FALLOC_FL_ZERO_RANGE over its garbage), never by writing
    zeros: 512 MiB holding 8 KiB of data costs 8 KiB of writes."""
    src = str(tmp_path / "src.raw")
    size = 512 * MiB
    make_sparse(src, size, [(4096, seeded_bytes(4096)), (300 * MiB, seeded_bytes(4096, seed=2))])
    new = str(tmp_path / "new.raw")
    res = imgcopy.convert(src, new, sparse_threshold=0, flush=False)
    try:
        assert os.stat(new).st_blocks * 512 >= size
        assert res.bytes_written == 8192 and res.bytes_zeroed == size - 8192, res
        assert res.zero_requests <= 4 and res.bytes_skipped == 0, res
        assert qemu_img("compare", "-f", "raw", "-F", "raw", src, new).returncode == 0
    finally:
        os.unlink(new)
    old = str(tmp_path / "old.raw")
    make_sparse(old, size, [(off, seeded_bytes(MiB, seed=3)) for off in (0, 100 * MiB, 400 * MiB)])
    try:
        res = imgcopy.convert(src, old, create=False, sparse_threshold=0, flush=False)
        assert os.stat(old).st_blocks * 512 >= size
        assert res.bytes_written == 8192 and res.zero_requests <= 4, res
        assert qemu_img("compare", "-f", "raw", "-F", "raw", src, old).returncode == 0
    finally:
        os.unlink(old)
