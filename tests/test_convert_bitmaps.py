"""convert(..., bitmaps=True) / ``imgcopy convert --bitmaps
[--skip-broken-bitmaps]``: the source's persistent bitmaps carried into a
new qcow2 image, as ``qemu-img convert --bitmaps`` carries them.

Sources are qemu's own: ``qemu-img create``, ``qemu-img bitmap --add [-g]
[--disable]`` (512 B, 64 KiB, 2 MiB and 4 KiB granularities), guest
writes through ``qemu-io`` (across clusters, up to the disk's end, before
and after a bitmap is disabled), ``qemu-img bitmap --merge``, an empty
bitmap, bitmaps left in use by a qemu-io that died.  Each output is
checked by qemu: ``qemu-img check`` (no leak, no corruption), ``qemu-img
info`` (the same bitmaps, in the same order, as the source and as
``qemu-img convert --bitmaps``'s output), ``qemu-img compare``, and the
bits as qemu reads them (``qemu-nbd -B NAME`` + ``nbdinfo
--map=qemu:dirty-bitmap:NAME``) and as imgcopy's dirty maps read them;
then qemu writes into the copy and its enabled bitmaps record it."""
import json
import os
import subprocess
import sys
import time
import warnings

import pytest

import imgcopy
from imgcopy import ImageFormatError
from .oracles import assert_same_content, needs_qemu, qemu_check, qemu_img, qemu_info, qemu_io
from .servers import NBDINFO, needs_qemu_nbd
from .test_bitmaps import left_in_use, with_bitmaps
from .test_dirty_map import mine, qemu_dirty
from .units import GiB, KiB, MiB, TiB

pytestmark = needs_qemu

# the disk: no multiple of 64 KiB nor of 2 MiB (its last granules are partial)
SIZE = 10 * MiB + 3 * 512
NAMES = ["fine", "mid", "coarse", "off", "merged", "empty"]


def make_source(path, size=SIZE):
    """Bitmaps of qemu's making, dirtied by a guest's writes."""
    qemu_img("create", "-q", "-f", "qcow2", path, str(size))
    for args in (["-g", "512", "fine"], ["mid"], ["-g", "2M", "coarse"], ["off"]):
        qemu_img("bitmap", "--add", path, *args)
    # across clusters, then "off" stops recording
    qemu_io(path, ["write -P 1 65000 70000", "write -P 5 1M 4k"], fmt="qcow2")
    qemu_img("bitmap", "--disable", path, "off")
    # the disk's last bytes (its last granules, partial), a long run
    qemu_io(path, [f"write -P 2 {size - 3072} 3072", "write -P 3 3M 1049088",
                   "write -z 6M 64k"], fmt="qcow2")
    # a disabled bitmap holding another's bits; an empty one
    qemu_img("bitmap", "--add", "-g", "4k", "--disable", path, "merged")
    qemu_img("bitmap", "--merge", "fine", path, "merged")
    qemu_img("bitmap", "--add", path, "empty")
    return path


def bitmaps_of(path):
    """qemu-img info's bitmaps: [{flags, name, granularity}, ...]."""
    return qemu_info(path, "qcow2")["format-specific"]["data"].get("bitmaps", [])


def maps_of(path, names):
    """imgcopy's dirty map of each bitmap."""
    return {name: mine(path, name) for name in names}


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return make_source(str(tmp_path_factory.mktemp("bitmaps") / "src.qcow2"))


@pytest.fixture(scope="module")
def reference(source, tmp_path_factory):
    """qemu-img convert --bitmaps's copy, and its bitmaps."""
    ref = str(tmp_path_factory.mktemp("reference") / "ref.qcow2")
    qemu_img("convert", "--bitmaps", "-O", "qcow2", source, ref)
    return ref


LAYOUTS = {
    "default": {},
    "512-byte clusters": {"cluster_size": 512},
    "compressed": {"compress": True},
    "2M clusters, zstd": {"cluster_size": "2M", "compression_type": "zstd", "compress": True},
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_as_qemu_img_convert_bitmaps(source, reference, tmp_path, layout):
    dst = str(tmp_path / "dst.qcow2")
    result = imgcopy.convert(source, dst, dst_format="qcow2", bitmaps=True, **LAYOUTS[layout])
    assert result.bitmaps == NAMES and result.bitmaps_skipped == []
    assert result.to_dict()["bitmaps"] == NAMES
    qemu_check(dst, "qcow2", strict=True)
    assert_same_content(source, dst, "qcow2", "qcow2")
    # the same bitmaps as the source's and qemu's copy's: names, order,
    # granularities, enabled or not, none in use
    want = bitmaps_of(source)
    assert [b["name"] for b in want] == NAMES
    assert bitmaps_of(dst) == want == bitmaps_of(reference)
    assert {b["name"]: b["flags"] for b in want}["off"] == []
    # their bits: as imgcopy reads them in the source, in qemu's copy, in this one
    got = maps_of(dst, NAMES)
    assert got == maps_of(source, NAMES) == maps_of(reference, NAMES)
    assert got["empty"] == [(0, SIZE, False)]
    assert got["fine"][-1] == (SIZE - 3072, 3072, True)
    assert got["coarse"] == [(0, SIZE, True)]  # every 2 MiB granule written
    assert any(dirty for _, _, dirty in got["off"]) and got["off"] != got["mid"]
    assert got["merged"] != got["fine"]  # 4 KiB granules of fine's 512-byte ones


@needs_qemu_nbd
@pytest.mark.skipif(NBDINFO is None, reason="nbdinfo not found on PATH (libnbd-bin)")
def test_qemu_reads_the_bits(source, tmp_path):
    """qemu's own reading of the copy's bitmaps (qemu-nbd -B, nbdinfo) is
    its reading of the source's."""
    dst = str(tmp_path / "dst.qcow2")
    imgcopy.convert(source, dst, dst_format="qcow2", bitmaps=True, cluster_size=4096)
    assert qemu_dirty(dst, NAMES) == qemu_dirty(source, NAMES)


def test_qemu_writes_into_the_copy(source, tmp_path):
    """qemu opens the copy for writing, keeps its bitmaps and records its
    writes in the enabled ones only; the image stays clean."""
    dst = str(tmp_path / "dst.qcow2")
    imgcopy.convert(source, dst, dst_format="qcow2", bitmaps=True)
    before = maps_of(dst, NAMES)
    qemu_io(dst, ["write -P 9 0 64k", "write -P 9 5M 512"], fmt="qcow2")
    qemu_check(dst, "qcow2", strict=True)
    assert bitmaps_of(dst) == bitmaps_of(source)
    after = maps_of(dst, NAMES)
    for b in bitmaps_of(dst):
        name = b["name"]
        if "auto" in b["flags"]:
            dirty = [(s, s + n) for s, n, d in after[name] if d]
            assert any(s <= 0 and 65536 <= e for s, e in dirty), (name, dirty)
            assert any(s <= 5 * MiB < e for s, e in dirty), (name, dirty)
        else:
            assert after[name] == before[name], name


def test_broken_bitmaps(tmp_path):
    """A bitmap in use (a qemu that died with the image open) is refused
    before the destination is made, as qemu-img refuses it; with
    skip_broken_bitmaps it is skipped with a warning, as qemu skips it."""
    src = str(tmp_path / "src.qcow2")
    with_bitmaps(src, "4M", [("stale", None, False), ("stale2", "512", True)])
    qemu_io(src, ["write -P 1 0 100k"], fmt="qcow2")
    left_in_use(src)
    qemu_img("bitmap", "--add", "-g", "128k", src, "good")
    qemu_io(src, ["write -P 2 1M 300k"], fmt="qcow2")
    dst = str(tmp_path / "dst.qcow2")
    with pytest.raises(ImageFormatError, match="Cannot copy inconsistent bitmap 'stale'") as e:
        imgcopy.convert(src, dst, dst_format="qcow2", bitmaps=True)
    assert e.value.filename == src and not os.path.exists(dst)
    assert qemu_img("convert", "--bitmaps", "-O", "qcow2", src, dst, check=False).returncode
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = imgcopy.convert(src, dst, dst_format="qcow2", bitmaps=True,
                                 skip_broken_bitmaps=True)
    assert [str(w.message) for w in caught] == [
        f"{src}: Skipping inconsistent bitmap '{name}'" for name in ("stale", "stale2")]
    assert result.bitmaps == ["good"] and result.bitmaps_skipped == ["stale", "stale2"]
    qemu_check(dst, "qcow2", strict=True)
    ref = str(tmp_path / "ref.qcow2")
    qemu_img("convert", "--bitmaps", "--skip-broken-bitmaps", "-O", "qcow2", src, ref)
    assert bitmaps_of(dst) == bitmaps_of(ref) == [
        {"flags": ["auto"], "name": "good", "granularity": 128 * KiB}]
    assert mine(dst, "good") == mine(ref, "good") == mine(src, "good")
    assert (1 * MiB, 384 * KiB, True) in mine(dst, "good")


@pytest.mark.parametrize("case", ["raw destination", "default destination", "null target",
                                  "compat 0.10", "existing destination", "skip alone",
                                  "raw source", "v2 source", "not a bool"])
def test_refused(source, tmp_path, case):
    """What cannot store or has no bitmaps: ValueError (TypeError for a
    wrong type), before the destination is made."""
    dst = str(tmp_path / "dst")
    kw = dict(dst_format="qcow2", bitmaps=True)
    src = source
    error, match = ValueError, "bitmaps"
    if case == "raw destination":
        kw["dst_format"], match = "raw", "does not support bitmaps"
    elif case == "default destination":
        del kw["dst_format"]
        match = "does not support bitmaps"
    elif case == "null target":
        dst, match = "null:", "null"
    elif case == "compat 0.10":
        kw["compat"], match = "0.10", "v2"
    elif case == "existing destination":
        qemu_img("create", "-q", "-f", "qcow2", dst, str(SIZE))
        kw["create"], match = False, "new qcow2"
    elif case == "skip alone":
        kw = dict(dst_format="qcow2", skip_broken_bitmaps=True)
        match = "needs bitmaps=True"
    elif case == "raw source":
        src = str(tmp_path / "src.raw")
        qemu_img("create", "-q", "-f", "raw", src, "1M")
        match = "Source lacks bitmap support"
    elif case == "v2 source":
        src = with_bitmaps(str(tmp_path / "v2.qcow2"), "1M", [], compat="0.10")
        match = "Source lacks bitmap support"
    else:
        kw["bitmaps"], error, match = "yes", TypeError, "bool"
    existed = os.path.exists(dst)
    with pytest.raises(error, match=match):
        imgcopy.convert(src, dst, **kw)
    assert os.path.exists(dst) == existed


def test_no_bitmaps_at_all(tmp_path):
    """A qcow2 v3 source without bitmaps: a copy without any, as qemu's."""
    src = with_bitmaps(str(tmp_path / "src.qcow2"), "1M", [])
    dst = str(tmp_path / "dst.qcow2")
    assert imgcopy.convert(src, dst, dst_format="qcow2", bitmaps=True).bitmaps == []
    qemu_check(dst, "qcow2", strict=True)
    assert bitmaps_of(dst) == []


def test_overlay_destination(source, tmp_path):
    """-B: a new overlay keeps the bitmaps too (its header holds the
    backing file's name and the bitmaps extension)."""
    base = str(tmp_path / "base.qcow2")
    imgcopy.convert(source, base, dst_format="qcow2")
    dst = str(tmp_path / "top.qcow2")
    imgcopy.convert(source, dst, dst_format="qcow2", bitmaps=True, backing_file="base.qcow2",
                    backing_format="qcow2")
    qemu_check(dst, "qcow2", strict=True)
    info = qemu_info(dst, "qcow2")
    assert info["backing-filename"] == "base.qcow2"
    assert info["format-specific"]["data"]["bitmaps"] == bitmaps_of(source)
    assert maps_of(dst, NAMES) == maps_of(source, NAMES)
    assert_same_content(source, dst, "qcow2", "qcow2")


def test_resumed_copy_stores_them(source, tmp_path):
    """journal=: a copy interrupted before its end resumes, and the resumed
    run stores the bitmaps when it finishes (the partial file has none)."""
    dst, journal = str(tmp_path / "dst.qcow2"), str(tmp_path / "j")

    def stop(done, total):
        time.sleep(0.02)
        if done >= 2 * MiB:
            raise RuntimeError("stop")

    with pytest.raises(RuntimeError):
        imgcopy.convert(source, dst, dst_format="qcow2", bitmaps=True, journal=journal,
                        journal_interval="512k", request_size="256k", concurrency=1,
                        progress=stop)
    assert os.path.exists(journal) and not os.path.exists(dst)
    # the journal names bitmaps=True among the options that change the output
    with pytest.raises(ValueError, match="bitmaps"):
        imgcopy.convert(source, dst, dst_format="qcow2", journal=journal)
    result = imgcopy.convert(source, dst, dst_format="qcow2", bitmaps=True, journal=journal)
    assert result.bytes_resumed > 0 and result.bitmaps == NAMES
    assert not os.path.exists(journal)
    qemu_check(dst, "qcow2", strict=True)
    assert bitmaps_of(dst) == bitmaps_of(source)
    assert maps_of(dst, NAMES) == maps_of(source, NAMES)
    assert_same_content(source, dst, "qcow2", "qcow2")


def test_crash_after_the_bits(source, tmp_path, monkeypatch):
    """A crash after the bitmaps' bits were written, before the destination
    was finished: the run again resumes the partial file (those clusters
    no one's), stores the bitmaps anew, and qemu finds no leak."""
    from imgcopy import job

    dst, journal = str(tmp_path / "dst.qcow2"), str(tmp_path / "j")
    monkeypatch.setattr(job.CopySteps, "commit",
                        lambda self: (_ for _ in ()).throw(RuntimeError("crash")))
    with pytest.raises(RuntimeError, match="crash"):
        imgcopy.convert(source, dst, dst_format="qcow2", bitmaps=True, journal=journal,
                        cluster_size=512)
    monkeypatch.undo()
    partial = [n for n in os.listdir(tmp_path) if n.endswith(".partial")]
    assert len(partial) == 1 and not os.path.exists(dst)
    result = imgcopy.convert(source, dst, dst_format="qcow2", bitmaps=True, journal=journal,
                             cluster_size=512)
    assert result.bitmaps == NAMES and result.bytes_resumed == SIZE
    qemu_check(dst, "qcow2", strict=True)
    assert bitmaps_of(dst) == bitmaps_of(source)
    assert maps_of(dst, NAMES) == maps_of(source, NAMES)
    assert_same_content(source, dst, "qcow2", "qcow2")


def test_finished_partial_keeps_them(source, tmp_path, monkeypatch):
    """A crash after the destination was finished but before it was renamed
    into place: the run again finds it complete, with its bitmaps, and
    keeps them."""
    from imgcopy import job

    dst, journal = str(tmp_path / "dst.qcow2"), str(tmp_path / "j")
    monkeypatch.setattr(job.CopySteps, "_complete_journal",
                        lambda self: (_ for _ in ()).throw(RuntimeError("crash")))
    with pytest.raises(RuntimeError, match="crash"):
        imgcopy.convert(source, dst, dst_format="qcow2", bitmaps=True, journal=journal)
    monkeypatch.undo()
    assert os.path.exists(journal) and not os.path.exists(dst)
    result = imgcopy.convert(source, dst, dst_format="qcow2", bitmaps=True, journal=journal)
    assert result.bitmaps == NAMES
    qemu_check(dst, "qcow2", strict=True)
    assert bitmaps_of(dst) == bitmaps_of(source)
    assert maps_of(dst, NAMES) == maps_of(source, NAMES)


def cli(*args):
    return subprocess.run([sys.executable, "-m", "imgcopy", "convert", *args],
                          capture_output=True, text=True, timeout=120)


def test_cli(source, tmp_path):
    dst = str(tmp_path / "dst.qcow2")
    p = cli("-O", "qcow2", "--bitmaps", "--stats", "json", source, dst)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["bitmaps"] == NAMES
    qemu_check(dst, "qcow2", strict=True)
    assert bitmaps_of(dst) == bitmaps_of(source)
    os.unlink(dst)
    p = cli("-O", "qcow2", "--skip-broken-bitmaps", source, dst)
    assert p.returncode == 1 and "--skip-broken-bitmaps needs --bitmaps" in p.stderr
    p = cli("--bitmaps", source, dst)
    assert p.returncode == 1 and "does not support bitmaps" in p.stderr, p.stderr
    assert not os.path.exists(dst)
    # in use: refused, or skipped with qemu-img's warning
    src = with_bitmaps(str(tmp_path / "in-use.qcow2"), "2M", [("a", None, False)])
    left_in_use(src)
    p = cli("-O", "qcow2", "--bitmaps", src, dst)
    assert p.returncode == 1 and "Cannot copy inconsistent bitmap 'a'" in p.stderr
    p = cli("-O", "qcow2", "--bitmaps", "--skip-broken-bitmaps", src, dst)
    assert p.returncode == 0, p.stderr
    assert "imgcopy: warning:" in p.stderr and "Skipping inconsistent bitmap 'a'" in p.stderr
    assert bitmaps_of(dst) == []


def test_large_disk(tmp_path):
    """A 1 TiB disk: a few dirty ranges of 512-byte and 64 KiB granules
    (256 MiB and 2 MiB of bits) are copied from the clusters that hold set
    bits, in a moment."""
    src = str(tmp_path / "src.qcow2")
    qemu_img("create", "-q", "-f", "qcow2", src, "1T")
    qemu_img("bitmap", "--add", "-g", "512", src, "fine")
    qemu_img("bitmap", "--add", src, "mid")
    qemu_io(src, ["write -P 1 0 1M", f"write -P 2 {512 * GiB} 64k",
                  f"write -P 3 {TiB - 4096} 4096"], fmt="qcow2")
    dst = str(tmp_path / "dst.qcow2")
    t0 = time.monotonic()
    imgcopy.convert(src, dst, dst_format="qcow2", bitmaps=True)
    elapsed = time.monotonic() - t0
    assert elapsed < 30, elapsed
    qemu_check(dst, "qcow2", strict=True)
    assert bitmaps_of(dst) == bitmaps_of(src)
    assert maps_of(dst, ["fine", "mid"]) == maps_of(src, ["fine", "mid"])
    # the bits of a few clusters, not 256 MiB of them
    assert os.path.getsize(dst) < 64 * MiB
