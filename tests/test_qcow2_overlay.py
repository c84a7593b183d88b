"""qcow2 overlays made by convert(backing_file=...) / -B, against
qemu-img convert -B: same content, same allocation layout."""
import os
import subprocess
import sys

import pytest

import imgcopy

from .oracles import (assert_same_content, layout, needs_qemu, qemu_check, qemu_img, qemu_info,
                      qemu_io, qemu_map, run)

pytestmark = needs_qemu


def map_layout(path, cwd):
    """qemu-img map without host offsets (the two tools place clusters
    differently), neighbours merged again."""
    return layout(qemu_map(path, None, cwd=cwd).extents)


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("overlay"))
    run(["truncate", "-s", "8M", "base.raw"], cwd=d)
    qemu_io("base.raw", ["write -P 1 0 2M", "write -P 2 5M 1M"], fmt="raw", cwd=d)
    qemu_img("create", "-q", "-f", "qcow2", "-b", "base.raw", "-F", "raw", "top.qcow2", "8M",
             cwd=d)
    qemu_io("top.qcow2", ["write -P 3 1M 100k", "write -z 5M 64k", "write -P 4 7M 4k",
                          "write -P 5 3M 1M"], fmt=None, cwd=d)
    return d


@pytest.mark.parametrize("opts", [
    {}, {"cluster_size": 4096}, {"compat": "0.10"}, {"compress": True},
    {"cluster_size": 2 << 20}, {"concurrency": 1, "out_of_order": False},
])
def test_overlay_matches_qemu(chain, tmp_path, opts):
    new = "new-%d.qcow2" % abs(hash(tuple(sorted(opts.items()))))
    res = imgcopy.convert(os.path.join(chain, "top.qcow2"), os.path.join(chain, new),
                          dst_format="qcow2", backing_file="base.raw", backing_format="raw",
                          **opts)
    if opts.get("cluster_size", 65536) <= 65536:
        assert res.bytes_skipped > 0  # what the backing holds is not written
    ref = "ref-" + new
    qopts = []
    if "cluster_size" in opts or "compat" in opts:
        o = []
        if "cluster_size" in opts:
            o.append("cluster_size=%d" % opts["cluster_size"])
        if "compat" in opts:
            o.append("compat=" + opts["compat"])
        qopts = ["-o", ",".join(o)]
    if opts.get("compress"):
        qopts.append("-c")
    qemu_img("convert", "-O", "qcow2", *qopts, "-B", "base.raw", "-F", "raw",
        "top.qcow2", ref, cwd=chain)
    qemu_check(new, cwd=chain)
    assert_same_content("top.qcow2", new, cwd=chain)
    info = qemu_info(new, cwd=chain)
    assert info["backing-filename"] == "base.raw"
    assert info.get("backing-filename-format") == "raw"
    if opts.get("cluster_size", 65536) >= 4096:
        assert map_layout(new, chain) == map_layout(ref, chain)
    with imgcopy.open(os.path.join(chain, new)) as img:
        assert img.backing_chain[0][1] == "raw"


def test_overlay_of_raw_source_writes_everything(chain, tmp_path):
    """A raw source has no backing chain: every range is written, holes as
    zero clusters that hide the backing file."""
    src = str(tmp_path / "src.raw")
    run(["truncate", "-s", "8M", src])
    qemu_io(src, ["write -P 9 1M 64k"], fmt="raw")
    new = os.path.join(chain, "from-raw.qcow2")
    imgcopy.convert(src, new, dst_format="qcow2", backing_file="base.raw")
    qemu_check(new)
    assert_same_content(src, new, "raw")


def test_overlay_errors(chain, tmp_path):
    with pytest.raises(FileNotFoundError):
        imgcopy.convert(os.path.join(chain, "top.qcow2"), str(tmp_path / "x.qcow2"),
                        dst_format="qcow2", backing_file="missing.raw")
    with pytest.raises(ValueError):
        imgcopy.convert(os.path.join(chain, "top.qcow2"), str(tmp_path / "x.raw"),
                        backing_file="base.raw")


def test_cli_overlay(chain):
    subprocess.run([sys.executable, "-m", "imgcopy", "convert", "-O", "qcow2", "-B",
                    "base.raw", "-F", "raw", "top.qcow2", "cli.qcow2"], cwd=chain, check=True)
    assert_same_content("top.qcow2", "cli.qcow2", cwd=chain)


def fill(path, size, byte=None, seed=0):
    """A raw file of `size` bytes: one byte repeated, or seeded noise."""
    import random
    data = bytes([byte]) * size if byte is not None else random.Random(seed).randbytes(size)
    with open(path, "wb") as f:
        f.write(data)


@pytest.mark.parametrize("compress", [False, True])
def test_overlay_of_source_not_ending_on_a_sector(tmp_path, compress):
    """qemu sees a raw file of 100000 bytes as 100352, zeros after its end,
    and so does the overlay made of it: the rest of its last cluster is
    not the backing file's data (it was, in the sector past the source)."""
    base, src, new = (str(tmp_path / n) for n in ("base.raw", "src.raw", "new.qcow2"))
    fill(base, 1 << 20, 0x5A)
    fill(src, 100000, seed=3)
    imgcopy.convert(src, new, dst_format="qcow2", backing_file=base, backing_format="raw",
                    compress=compress)
    qemu_check(new, strict=True)
    assert qemu_info(new)["virtual-size"] == 100352
    assert_same_content(src, new, "raw", "qcow2")


@pytest.mark.parametrize("cluster_size", [4096, 65536])
def test_compressed_overlay_of_backing_ending_inside_a_cluster(tmp_path, cluster_size):
    """The backing file ends inside a cluster: the data on both sides of
    its end is one compressed write (qemu-img -c -B writes it whole); the
    cut there used to split it into two writes of that cluster (refused:
    "compressed writes must cover whole clusters", or, placed together,
    one of them leaked)."""
    base, src, new = (str(tmp_path / n) for n in ("base.raw", "src.raw", "new.qcow2"))
    fill(base, 431616, 0x1D)  # 843 sectors: inside a cluster of either size
    fill(src, 458752, seed=4)
    imgcopy.convert(src, new, dst_format="qcow2", backing_file=base, backing_format="raw",
                    compress=True, cluster_size=cluster_size)
    qemu_check(new, strict=True)
    assert_same_content(src, new, "raw", "qcow2")
    # compressible data up to the backing file's end, then a hole: the
    # leak's case, with as many items at once as the copy takes
    with open(src, "wb") as f:
        f.truncate(452608)
        f.write(b"\x1d" * 431616)
    for _ in range(4):
        os.unlink(new)
        imgcopy.convert(src, new, dst_format="qcow2", backing_file=base,
                        backing_format="raw", compress=True, cluster_size=cluster_size,
                        concurrency=4)
        qemu_check(new, strict=True)
        assert_same_content(src, new, "raw", "qcow2")
