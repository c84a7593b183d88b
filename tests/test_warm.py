"""Warm copies (issue 26): only what changed, into the target the last copy
made.  Every byte outside the changed ranges is left alone (nbdkit's log
of the target says so), and the result equals the source (qemu-img
compare)."""
import json
import os
import random
import subprocess
import sys

import pytest

import imgcopy

from .oracles import assert_same_content, qemu_check, qemu_img, qemu_io, qemu_map
from .servers import needs_nbdkit, nbdkit

KiB, MiB = 1 << 10, 1 << 20


def write_at(path, off, data):
    with open(path, "r+b") as f:
        f.seek(off)
        f.write(data)


def base_and_changed(tmp_path, size=16 * MiB, seed=1):
    """A source, the copy an earlier run made of it (equal), then guest
    writes to the source: what changed, as (offset, length) pairs."""
    rng = random.Random(seed)
    src = tmp_path / "src.raw"
    with open(src, "wb") as f:
        f.truncate(size)
        for off in range(0, size, 1 * MiB):
            f.seek(off)
            f.write(rng.randbytes(300 * KiB))
    dst = tmp_path / "dst.raw"
    imgcopy.convert(src, dst)
    unit = size // 16
    changes = [(100, 5000), (3 * unit - 4096, 12 * KiB), (7 * unit + 1, 70 * KiB),
               (size - 8 * KiB, 8 * KiB)]
    for off, length in changes:
        write_at(src, off, rng.randbytes(length))
    write_at(src, 5 * unit, bytes(64 * KiB))  # zeros over data
    changes.append((5 * unit, 64 * KiB))
    return src, dst, changes


def touched(requests):
    return [(r.offset, r.count) for r in requests if r.kind in ("Write", "Zero", "Trim")]


def inside(ranges, off, length):
    return any(o <= off and off + length <= o + n for o, n in ranges)


@needs_nbdkit
def test_changed_ranges_touch_nothing_else(tmp_path):
    src, dst, changes = base_and_changed(tmp_path)
    size = os.path.getsize(src)
    with nbdkit("file", str(dst)) as target:
        # out of order and overlapping, as change lists come
        asked = list(reversed(changes)) + [(changes[0][0] + 10, 100)]
        res = imgcopy.convert(src, target.uri, dst_format="raw", create=False, changed=asked)
        requests = target.requests()
    assert_same_content(src, dst, "raw", "raw")
    done = touched(requests)
    assert done and all(inside(changes, off, n) for off, n in done), done
    assert res.bytes_changed == sum(n for _, n in changes)
    assert res.bytes_written + res.bytes_zeroed + res.bytes_skipped == res.bytes_changed
    assert res.bytes_zeroed >= 64 * KiB  # the zeros were zeroed, not skipped
    assert res.checksum is None and os.path.getsize(dst) == size


def test_changed_ranges_from_an_extent_map_and_verify(tmp_path):
    src, dst, changes = base_and_changed(tmp_path, seed=2)
    # a map of just the changes: each range its own extent
    res = imgcopy.convert(src, dst, create=False, changed=changes, verify=True)
    assert res.checksum == res.dst_checksum == imgcopy.checksum(src)
    assert_same_content(src, dst, "raw", "raw")


def test_changed_ranges_refused_when_out_of_range(tmp_path):
    src, dst, _ = base_and_changed(tmp_path, size=4 * MiB)
    before = dst.read_bytes()
    with pytest.raises(ValueError, match="outside the source"):
        imgcopy.convert(src, dst, create=False, changed=[(0, 10), (4 * MiB - 1, 2)])
    with pytest.raises(ValueError, match="negative"):
        imgcopy.convert(src, dst, create=False, changed=[(-1, 10)])
    with pytest.raises(TypeError, match="pair"):
        imgcopy.convert(src, dst, create=False, changed=[(1, 2, 3)])
    with pytest.raises(TypeError):
        imgcopy.convert(src, dst, create=False, changed="nonsense")
    with pytest.raises(ValueError, match="compare_block_size"):
        imgcopy.convert(src, dst, create=False, changed=[(0, 1)], compare_block_size="64k")
    assert dst.read_bytes() == before


def test_no_change_is_no_copy(tmp_path):
    src, dst, _ = base_and_changed(tmp_path, size=2 * MiB)
    write_at(src, 0, b"x")
    res = imgcopy.convert(src, dst, create=False, changed=[])
    assert res.bytes_changed == res.bytes_read == res.bytes_written == 0
    assert dst.read_bytes()[:1] != b"x"


@needs_nbdkit
@pytest.mark.parametrize("block", ["64k", "4k", "1M"])
def test_compare_mode_writes_only_what_differs(tmp_path, block):
    src, dst, changes = base_and_changed(tmp_path, seed=3)
    with nbdkit("file", str(dst)) as target:
        res = imgcopy.convert(src, target.uri, dst_format="raw", create=False,
                              changed="compare", compare_block_size=block)
        done = touched(target.requests())
    assert_same_content(src, dst, "raw", "raw")
    unit = {"64k": 64 * KiB, "4k": 4 * KiB, "1M": MiB}[block]
    blocks = [(o // unit * unit, -(-(o + n) // unit) * unit - o // unit * unit)
              for o, n in changes]
    assert done and all(inside(blocks, off, n) for off, n in done), done
    assert res.bytes_compared > 0 and res.bytes_equal > 0
    assert res.bytes_compared - res.bytes_equal <= sum(n for _, n in blocks)
    # a second pass finds nothing to do
    res2 = imgcopy.convert(src, dst, create=False, changed="compare")
    assert res2.bytes_written == res2.bytes_zeroed == 0


def test_compare_mode_zeroes_what_the_source_no_longer_holds(tmp_path):
    src = tmp_path / "src.raw"
    dst = tmp_path / "dst.raw"
    with open(src, "wb") as f:
        f.truncate(4 * MiB)
    with open(dst, "wb") as f:
        f.write(random.Random(4).randbytes(4 * MiB))
    res = imgcopy.convert(src, dst, create=False, changed="compare")
    assert_same_content(src, dst, "raw", "raw")
    assert res.bytes_zeroed == 4 * MiB and res.bytes_read == 0


def test_changed_into_existing_qcow2(tmp_path):
    src, _, changes = base_and_changed(tmp_path, seed=5)
    old = tmp_path / "old.raw"
    # the qcow2 the last copy made, from the source before the changes
    qemu_img("convert", "-O", "raw", str(src), str(old))
    rng = random.Random(55)
    for off, n in changes:
        write_at(old, off, rng.randbytes(n))  # differs exactly there
    dst = tmp_path / "dst.qcow2"
    qemu_img("convert", "-O", "qcow2", "-o", "cluster_size=64k", str(old), str(dst))
    imgcopy.convert(src, dst, dst_format="qcow2", create=False, changed=changes)
    qemu_check(dst, strict=True)
    assert_same_content(src, dst, "raw", "qcow2")


def test_incremental_qcow2_overlay_holds_only_the_changes(tmp_path):
    """ovirt-imageio's incremental backup: a new overlay on the previous
    backup with just the changed clusters; the chain reads as the source."""
    src, _, changes = base_and_changed(tmp_path, seed=6)
    prev = tmp_path / "full.qcow2"
    old = tmp_path / "old.raw"
    qemu_img("convert", "-O", "raw", str(src), str(old))
    rng = random.Random(66)
    for off, n in changes:
        write_at(old, off, rng.randbytes(n))
    qemu_img("convert", "-O", "qcow2", str(old), str(prev))
    inc = tmp_path / "inc.qcow2"
    imgcopy.convert(src, inc, dst_format="qcow2", backing_file="full.qcow2",
                    backing_format="qcow2", changed=changes)
    qemu_check(inc, strict=True)
    assert_same_content(src, inc, "raw", "qcow2")
    cluster = 64 * KiB
    own = [e for e in qemu_map(inc, "qcow2").extents if e["depth"] == 0 and e["data"]]
    allocated = sum(e["length"] for e in qemu_map(inc, "qcow2").extents if e["depth"] == 0)
    clusters = {c for o, n in changes for c in range(o // cluster, (o + n - 1) // cluster + 1)}
    assert allocated <= len(clusters) * cluster
    assert own


def test_cli_changed_file_and_compare(tmp_path):
    src, dst, changes = base_and_changed(tmp_path, seed=7)
    listing = tmp_path / "changes.json"
    listing.write_text(json.dumps([list(c) for c in changes]))
    env = dict(os.environ)
    p = subprocess.run([sys.executable, "-m", "imgcopy", "convert", "-n", "-f", "raw", "-O",
                        "raw", "--changed", str(listing), str(src), str(dst)],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert p.returncode == 0, p.stderr
    assert_same_content(src, dst, "raw", "raw")
    write_at(src, 9 * MiB, b"late change")
    p = subprocess.run([sys.executable, "-m", "imgcopy", "convert", "-n", "-f", "raw", "-O",
                        "raw", "--changed=compare", str(src), str(dst)],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert p.returncode == 0, p.stderr
    assert_same_content(src, dst, "raw", "raw")
    bad = tmp_path / "bad.json"
    bad.write_text('[[0, 10], ["x", 3]]')
    p = subprocess.run([sys.executable, "-m", "imgcopy", "convert", "-n", "-f", "raw", "-O",
                        "raw", "--changed", str(bad), str(src), str(dst)],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert p.returncode == 1 and "changed" in p.stderr and "Traceback" not in p.stderr


def test_qemu_io_writes_as_changes(tmp_path):
    """Guest writes made by qemu-io into a qcow2 source, copied by the
    list of what was written."""
    src = tmp_path / "src.qcow2"
    qemu_img("create", "-f", "qcow2", str(src), "32M")
    qemu_io(src, ["write -P 0x11 0 8M"], fmt="qcow2")
    dst = tmp_path / "dst.raw"
    imgcopy.convert(src, dst)
    writes = [(1 * MiB + 512, 3000), (20 * MiB, 2 * MiB), (32 * MiB - 512, 512)]
    qemu_io(src, [f"write -P 0x{i + 0x21:x} {o} {n}" for i, (o, n) in enumerate(writes)],
            fmt="qcow2")
    imgcopy.convert(src, dst, create=False, changed=writes)
    assert_same_content(src, dst, "qcow2", "raw")


# -- range shards (issue 27) ---------------------------------------------------

def test_shards_make_one_disk_and_its_checksum(tmp_path):
    rng = random.Random(11)
    size = 12 * MiB + 4096  # a short last block
    src = tmp_path / "src.raw"
    with open(src, "wb") as f:
        f.truncate(size)
        for off in range(0, size - MiB, 3 * MiB):
            f.seek(off)
            f.write(rng.randbytes(1 * MiB))
        f.seek(size - 100)
        f.write(b"tail")
    dst = tmp_path / "dst.raw"
    with open(dst, "wb") as f:
        f.truncate(size)
    cuts = [(0, 4 * MiB), (4 * MiB, 4 * MiB), (8 * MiB, size - 8 * MiB)]
    results = [imgcopy.convert(src, dst, create=False, offset=o, length=n, checksum=True,
                               verify=True) for o, n in reversed(cuts)]
    assert_same_content(src, dst, "raw", "raw")
    assert all(r.offset is not None and r.block_digests for r in results)
    assert imgcopy.combine_checksums(size, results) == imgcopy.checksum(src)
    # holes no shard covered are zeros
    only_data = [r for r in results if r.offset != 4 * MiB]
    with open(tmp_path / "zero.raw", "wb") as f:
        f.truncate(size)
    assert imgcopy.combine_checksums(size, only_data) != imgcopy.checksum(src)


@needs_nbdkit
def test_two_shards_at_once_into_one_export(tmp_path):
    rng = random.Random(12)
    src = tmp_path / "src.raw"
    src.write_bytes(rng.randbytes(8 * MiB))
    with nbdkit("memory", "8M") as target:
        procs = [subprocess.Popen([sys.executable, "-m", "imgcopy", "convert", "-n", "-f", "raw",
                                   "-O", "raw", "--offset", str(o), "--length", str(4 * MiB),
                                   str(src), target.uri], stderr=subprocess.PIPE, text=True)
                 for o in (0, 4 * MiB)]
        for p in procs:
            assert p.wait(timeout=60) == 0, p.stderr.read()
            p.stderr.close()
        assert_same_content(src, target.uri, "raw", "raw")


def test_shards_refused_clearly(tmp_path):
    src = tmp_path / "src.raw"
    src.write_bytes(bytes(2 * MiB))
    qcow = tmp_path / "d.qcow2"
    qemu_img("create", "-f", "qcow2", str(qcow), "2M")
    with pytest.raises(ValueError, match="one writer"):
        imgcopy.convert(src, qcow, dst_format="qcow2", create=False, offset=0, length=MiB)
    with pytest.raises(ValueError, match="existing destination"):
        imgcopy.convert(src, tmp_path / "new.raw", offset=0, length=MiB)
    raw = tmp_path / "d.raw"
    raw.write_bytes(bytes(2 * MiB))
    with pytest.raises(ValueError, match="whole"):
        imgcopy.convert(src, raw, create=False, offset=100, length=MiB, checksum=True)
    with pytest.raises(ValueError, match="outside"):
        imgcopy.convert(src, raw, create=False, offset=MiB, length=2 * MiB)
