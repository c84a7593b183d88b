"""A conversion never writes a file its source reads: the source itself or
any file of its backing chain, under any name (the same path, a relative
one, a symbolic or hard link, another node of the same block device), with
and without -n, from Python and from the command line."""
import os
import stat
import subprocess

import pytest

import imgcopy

from .convert_helpers import imgcopy_cmd
from .oracles import assert_same_content, qemu_img, qemu_io, sha256_file
from .units import MiB


@pytest.fixture
def chain(tmp_path):
    """base.raw <- mid.qcow2 <- top.qcow2, each with data of its own."""
    base = tmp_path / "base.raw"
    base.write_bytes(b"B" * MiB + bytes(MiB))
    qemu_img("create", "-f", "qcow2", "-b", "base.raw", "-F", "raw", "mid.qcow2", str(2 * MiB),
             cwd=str(tmp_path))
    qemu_img("create", "-f", "qcow2", "-b", "mid.qcow2", "-F", "qcow2", "top.qcow2",
             str(2 * MiB), cwd=str(tmp_path))
    for name, off in (("mid.qcow2", MiB), ("top.qcow2", MiB + 65536)):
        qemu_io(str(tmp_path / name), ["write -P 0x5a %d 64k" % off], fmt="qcow2")
    (tmp_path / "sub").mkdir()
    os.symlink("../base.raw", str(tmp_path / "sub" / "link-to-base.raw"))
    os.link(str(base), str(tmp_path / "hard-base.raw"))
    os.symlink("mid.qcow2", str(tmp_path / "link-to-mid.qcow2"))
    return tmp_path


# (destination name relative to the chain's directory, the file it is)
ALIASES = [
    ("top.qcow2", "top"), ("./top.qcow2", "top"),
    ("mid.qcow2", "mid"), ("link-to-mid.qcow2", "mid"),
    ("base.raw", "base"), ("sub/../base.raw", "base"), ("sub/link-to-base.raw", "base"),
    ("hard-base.raw", "base"),
]


@pytest.mark.parametrize("create", [True, False], ids=["new", "-n"])
@pytest.mark.parametrize("alias, which", ALIASES)
def test_python_refuses_every_file_of_the_chain(chain, alias, which, create):
    before = {n: sha256_file(str(chain / n)) for n in ("base.raw", "mid.qcow2", "top.qcow2")}
    dst = str(chain / alias)
    fmt = "qcow2" if which != "base" else "raw"
    with pytest.raises(ValueError, match="destination is") as info:
        imgcopy.convert(str(chain / "top.qcow2"), dst, dst_format=fmt, create=create)
    if which == "top":
        assert "the destination is the source" in str(info.value)
    else:
        assert "backing file of the source" in str(info.value)
    assert {n: sha256_file(str(chain / n)) for n in before} == before
    assert os.path.islink(str(chain / "sub" / "link-to-base.raw"))


@pytest.mark.parametrize("create", [True, False], ids=["new", "-n"])
@pytest.mark.parametrize("alias", ["base.raw", "sub/link-to-base.raw", "hard-base.raw"])
def test_cli_refuses_the_backing_file(chain, alias, create):
    """The data-loss case of the report: convert an overlay onto its own
    backing file."""
    before = sha256_file(str(chain / "base.raw"))
    args = ["convert", "-O", "raw"] + ([] if create else ["-n"]) + ["top.qcow2", alias]
    p = subprocess.run(imgcopy_cmd() + args, capture_output=True, text=True, cwd=str(chain))
    assert p.returncode == 1, p.stdout + p.stderr
    assert "backing file of the source" in p.stderr
    assert sha256_file(str(chain / "base.raw")) == before


def test_a_different_file_is_fine(chain):
    out = str(chain / "flat.raw")
    imgcopy.convert(str(chain / "top.qcow2"), out)
    assert_same_content(str(chain / "top.qcow2"), out, None, "raw")


def test_another_node_of_the_same_block_device(tmp_path, loop_device):
    """Two device nodes, one disk: refused as the same file."""
    backing = tmp_path / "disk.img"
    backing.write_bytes(b"L" * (4 * MiB))
    dev = loop_device(str(backing))
    st = os.stat(dev)
    alias = str(tmp_path / "alias-node")
    os.mknod(alias, stat.S_IFBLK | 0o600, st.st_rdev)
    with pytest.raises(ValueError, match="the destination is the source"):
        imgcopy.convert(dev, alias, create=False)
