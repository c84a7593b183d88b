"""Writing into existing qcow2 images: convert(create=False) like qemu-img
convert -n, and Image(mode="r+"); qemu-img check/compare are the oracles."""
import os
import random

import pytest

import imgcopy

from .gen.qcow2_meta import l2_patch
from .gen.raw_layouts import random_runs
from .gen.sparse import garbage
from .oracles import assert_same_content, needs_qemu_img, qemu_check, qemu_img, qemu_info
from .units import MiB

pytestmark = needs_qemu_img


TARGETS = {
    "empty-v3": ["create", "-f", "qcow2", "{dst}", "{size}"],
    "empty-v2-4k": ["create", "-f", "qcow2", "-o", "compat=0.10,cluster_size=4k", "{dst}",
                    "{size}"],
    "full-garbage": ["convert", "-f", "raw", "-O", "qcow2", "{garbage}", "{dst}"],
    "compressed-garbage": ["convert", "-c", "-f", "raw", "-O", "qcow2", "{garbage}", "{dst}"],
    "compressed-v2-garbage": ["convert", "-c", "-f", "raw", "-O", "qcow2", "-o",
                              "compat=0.10,cluster_size=4k", "{garbage}", "{dst}"],
}


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    d = tmp_path_factory.mktemp("existing-src")
    raw = random_runs(str(d / "src.raw"), 6 * MiB + 4096, 1)
    qcow = str(d / "src.qcow2")
    qemu_img("convert", "-f", "raw", "-O", "qcow2", "-o", "cluster_size=16k", raw, qcow)
    noise = str(d / "garbage.raw")
    garbage(noise, 6 * MiB + 4096, 2)
    return {"raw": raw, "qcow2": qcow, "garbage": noise}


@pytest.mark.parametrize("target", sorted(TARGETS))
@pytest.mark.parametrize("src_kind", ["raw", "qcow2"])
@pytest.mark.parametrize("concurrency", [1, 8])
def test_convert_into_existing(sources, tmp_path, target, src_kind, concurrency):
    src = sources[src_kind]
    size = os.path.getsize(sources["raw"])
    dst = str(tmp_path / "dst.qcow2")
    argv = [a.format(dst=dst, size=size, garbage=sources["garbage"]) for a in TARGETS[target]]
    qemu_img(*argv)
    res = imgcopy.convert(src, dst, dst_format="qcow2", create=False,
                          concurrency=concurrency, request_size=64 * 1024)
    assert res.bytes_written + res.bytes_zeroed + res.bytes_skipped == size
    if "garbage" in target:
        assert res.bytes_zeroed > 0  # the holes of the source are zeroed
    qemu_check(dst)
    assert_same_content(src, dst)


def test_refcount_table_grows(tmp_path):
    """512-byte clusters: a refcount block covers 128 KiB, so writing a few
    MiB into an almost empty image needs many new blocks and a bigger table."""
    raw = random_runs(str(tmp_path / "src.raw"), 4 * MiB, 3)
    dst = str(tmp_path / "dst.qcow2")
    qemu_img("create", "-f", "qcow2", "-o", "cluster_size=512", dst, str(4 * MiB))
    imgcopy.convert(raw, dst, dst_format="qcow2", create=False, concurrency=4)
    qemu_check(dst)
    assert_same_content(raw, dst)
    info = imgcopy.info(dst) if hasattr(imgcopy, "info") else None
    assert info is None or info.virtual_size == 4 * MiB


def test_image_r_plus_writes_and_zeroes(tmp_path):
    dst = str(tmp_path / "w.qcow2")
    qemu_img("convert", "-c", "-f", "raw", "-O", "qcow2", random_runs(str(tmp_path / "g.raw"),
             2 * MiB, 4), dst)
    shadow = bytearray(open(str(tmp_path / "g.raw"), "rb").read())
    rng = random.Random(5)
    with imgcopy.open(dst, mode="r+") as img:
        for _ in range(60):
            off = rng.randrange(len(shadow))
            n = min(len(shadow) - off, rng.choice([1, 700, 4096, 65536, 200000]))
            if rng.random() < 0.6:
                data = rng.randbytes(n)
                img.write(off, data)
                shadow[off:off + n] = data
            else:
                img.zero(off, n)
                shadow[off:off + n] = bytes(n)
            assert img.read(off, n) == bytes(shadow[off:off + n])
    qemu_check(dst)
    out = str(tmp_path / "out.raw")
    qemu_img("convert", "-O", "raw", dst, out)
    assert open(out, "rb").read() == bytes(shadow)


def test_failed_copy_leaves_image_marked(tmp_path):
    """A -n copy stopped half way (the source's last cluster cannot be read,
    so earlier clusters are written first) leaves the v3 image flagged, not
    looking complete.  Stopped by the data, not by a timer: a fast machine
    finishing the copy within the first progress report made an earlier
    version of this test fail."""
    raw = str(tmp_path / "src.raw")
    garbage(raw, 32 * MiB, 6)
    src = str(tmp_path / "src.qcow2")
    qemu_img("convert", "-f", "raw", "-O", "qcow2", raw, src)
    # the last cluster's entry says "compressed": it cannot inflate
    l2_patch(src, 32 * MiB // (64 << 10) - 1, 1 << 62)
    dst = str(tmp_path / "dst.qcow2")
    qemu_img("create", "-f", "qcow2", dst, str(32 * MiB))
    with pytest.raises(imgcopy.ImageFormatError, match="compressed cluster"):
        imgcopy.convert(src, dst, dst_format="qcow2", create=False, request_size=64 << 10,
                        concurrency=1)
    assert qemu_info(dst)["format-specific"]["data"]["corrupt"] is True
    with pytest.raises(imgcopy.ImageFormatError):
        imgcopy.open(dst)
    imgcopy.open(dst, force=True).close()


def test_failed_source_leaves_target_alone(tmp_path):
    """A source that fails before anything is written (a corrupt L2 entry
    the planner meets first) leaves an existing target as it was."""
    raw = str(tmp_path / "src.raw")
    garbage(raw, 4 * MiB, 7)
    src = str(tmp_path / "src.qcow2")
    qemu_img("convert", "-f", "raw", "-O", "qcow2", raw, src)
    with open(src, "r+b") as f:
        hdr = f.read(104)
        l1 = int.from_bytes(hdr[40:48], "big")
        f.seek(l1)
        l2 = int.from_bytes(f.read(8), "big") & 0x00fffffffffffe00
        f.seek(l2 + 8 * 40)
        e = int.from_bytes(f.read(8), "big")
        f.seek(l2 + 8 * 40)
        f.write((e | 0x200).to_bytes(8, "big"))
    dst = str(tmp_path / "dst.qcow2")
    qemu_img("create", "-f", "qcow2", dst, str(4 * MiB))
    before = open(dst, "rb").read()
    with pytest.raises(imgcopy.ImageFormatError):
        imgcopy.convert(src, dst, dst_format="qcow2", create=False)
    assert open(dst, "rb").read() == before


def test_untouched_when_nothing_was_written(tmp_path):
    """Opened for writing and closed without a write: not a byte changes."""
    dst = str(tmp_path / "d.qcow2")
    qemu_img("create", "-f", "qcow2", dst, str(MiB))
    before = open(dst, "rb").read()
    with imgcopy.open(dst, mode="r+") as img:
        img.read(0, 4096)
    assert open(dst, "rb").read() == before


@pytest.mark.parametrize("why", ["backing", "snapshot"])
def test_refused_targets(tmp_path, why):
    base = str(tmp_path / "base.qcow2")
    dst = str(tmp_path / "dst.qcow2")
    qemu_img("create", "-f", "qcow2", base, "1M")
    if why == "backing":
        qemu_img("create", "-f", "qcow2", "-b", base, "-F", "qcow2", dst)
    else:
        qemu_img("create", "-f", "qcow2", dst, "1M")
        qemu_img("snapshot", "-c", "s1", dst)
    with pytest.raises(imgcopy.ImageFormatError, match=why):
        imgcopy.open(dst, mode="r+")
    qemu_check(dst)
