"""A vmdk descriptor's extent files stay inside the descriptor's directory
(unless ``external_files=True``): not only names with ``..`` or a leading
``/``, but every way a name can lead out once resolved, symbolic links
included, and device nodes; and a descriptor never names itself.  Images
come from uploads: what they name must not pick the host's files."""

import os
import stat
import subprocess
import sys
import tarfile

import pytest

import imgcopy

from .convert_helpers import imgcopy_child_env
from .oracles import HAVE_QEMU, qemu_img

SECRET = b"host secret: not part of any disk\n" * 20


def _descriptor(extent, sectors=8, ctype="monolithicFlat", kind="FLAT"):
    return ('# Disk DescriptorFile\nversion=1\nCID=fffffffe\nparentCID=ffffffff\n'
            'createType="%s"\nRW %d %s "%s"%s\n'
            % (ctype, sectors, kind, extent, " 0" if kind == "FLAT" else "")).encode()


@pytest.fixture
def tree(tmp_path):
    """vm/ (the upload) next to secret.raw (the host's file)."""
    (tmp_path / "secret.raw").write_bytes(SECRET)
    vm = tmp_path / "vm"
    vm.mkdir()
    (vm / "sub").mkdir()
    (vm / "disk-flat.raw").write_bytes(b"\xa5" * 4096)
    (vm / "sub" / "deep-flat.raw").write_bytes(b"\x5a" * 4096)
    return vm


def _vmdk(vm, extent, name="x.vmdk", **kw):
    p = vm / name
    p.write_bytes(_descriptor(extent, **kw))
    return str(p)


def _refused(path, words, **kw):
    with pytest.raises(imgcopy.ImageFormatError) as e:
        with imgcopy.open(path, format="vmdk", **kw) as img:
            img.read(0, img.size)
    assert words in str(e.value), str(e.value)
    # every entry point: map, info, convert
    for call in (lambda: imgcopy.map(path, format="vmdk", **kw),
                 lambda: imgcopy.info(path, format="vmdk", **kw)):
        with pytest.raises(imgcopy.ImageFormatError):
            call()
    return str(e.value)


@pytest.mark.parametrize("target", ["/etc/passwd", "../secret.raw", "../vm/../secret.raw"])
def test_link_out_of_the_directory_refused(tree, target):
    os.symlink(target, str(tree / "link.raw"))
    msg = _refused(_vmdk(tree, "link.raw"), "outside the image's directory")
    assert "symbolic link" in msg and "external_files=True" in msg


def test_link_out_allowed_with_external_files(tree):
    os.symlink("../secret.raw", str(tree / "link.raw"))
    path = _vmdk(tree, "link.raw", sectors=len(SECRET) // 512)
    with imgcopy.open(path, format="vmdk", external_files=True) as img:
        assert img.read(0, 512) == SECRET[:512]


@pytest.mark.parametrize("link, target, extent", [
    ("up", "..", "up/secret.raw"),               # a directory link up
    ("etc", "/etc", "etc/passwd"),               # an absolute directory link
    ("sub/up", "../..", "sub/up/secret.raw"),    # up twice from a subdirectory
    ("sub/back", "..", "sub/back/../secret.raw"),  # ".." after a link (refused as "..")
])
def test_dotdot_through_links_refused(tree, link, target, extent):
    os.symlink(target, str(tree / link))
    _refused(_vmdk(tree, extent), "outside the image's directory")


@pytest.mark.parametrize("target", ["/dev/zero", "/dev/urandom", "../../../../../../dev/zero"])
def test_link_to_a_device_refused(tree, target):
    os.symlink(target, str(tree / "dev.raw"))
    _refused(_vmdk(tree, "dev.raw"), "outside the image's directory")


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root")
@pytest.mark.parametrize("kind, major, minor", [(stat.S_IFCHR, 1, 5), (stat.S_IFBLK, 7, 0)])
def test_device_node_in_the_directory_refused(tree, kind, major, minor):
    """A device node unpacked from an upload (tar does, as root) is the
    host's device, not a file of the image."""
    os.mknod(str(tree / "node.raw"), kind | 0o600, os.makedev(major, minor))
    try:
        _refused(_vmdk(tree, "node.raw"), "is a device")
    except OSError as e:   # a block device without a driver behind it: ENXIO before fstat
        assert kind == stat.S_IFBLK, e


def test_links_inside_the_directory_still_read(tree):
    """Links that stay inside (openat2 resolves them beneath the directory)
    read as before; qemu-img reads the same bytes."""
    os.symlink("disk-flat.raw", str(tree / "alias.raw"))
    os.symlink("sub", str(tree / "s"))
    os.symlink("../disk-flat.raw", str(tree / "sub" / "up.raw"))
    for extent, byte in [("alias.raw", b"\xa5"), ("s/deep-flat.raw", b"\x5a"),
                         ("sub/up.raw", b"\xa5")]:
        path = _vmdk(tree, extent)
        with imgcopy.open(path, format="vmdk") as img:
            assert img.read(0, img.size) == byte * 4096, extent
        if HAVE_QEMU:
            out = str(tree.parent / "q.raw")
            qemu_img("convert", "-f", "vmdk", "-O", "raw", path, out)
            assert open(out, "rb").read() == byte * 4096


def test_descriptor_naming_itself_refused(tree):
    """A descriptor whose extent is itself would read its own text as the
    guest's data; by any name (itself, a link to it, a hard link), with
    external_files too."""
    for extent, make in [("x.vmdk", None), ("alias.vmdk", os.symlink),
                         ("hard.vmdk", os.link)]:
        path = str(tree / "x.vmdk")
        (tree / "x.vmdk").write_bytes(_descriptor(extent))
        if make:
            make(path if make is os.link else "x.vmdk", str(tree / extent))
        for kw in ({}, {"external_files": True}):
            _refused(path, "this image's own file", **kw)
        if make:
            os.unlink(str(tree / extent))


def test_sparse_descriptor_naming_itself_refused(tree):
    _refused(_vmdk(tree, "x.vmdk", kind="SPARSE", ctype="twoGbMaxExtentSparse"), "own file")


def test_member_naming_itself_refused(tmp_path):
    desc = tmp_path / "vm.vmdk"
    desc.write_bytes(_descriptor("vm.vmdk"))
    archive = str(tmp_path / "vm.ova")
    with tarfile.open(archive, "w", format=tarfile.USTAR_FORMAT) as t:
        t.add(str(desc), arcname="dir/vm.vmdk")
    with pytest.raises(imgcopy.ImageFormatError, match="own file"):
        imgcopy.open(archive, member="dir/vm.vmdk")


def test_cli_convert_writes_no_host_file(tree, tmp_path):
    """The issue's command: refused, exit 1, nothing written."""
    os.symlink("/etc/passwd", str(tree / "link.raw"))
    path = _vmdk(tree, "link.raw", name="lnk.vmdk")
    out = str(tmp_path / "out.raw")
    p = subprocess.run([sys.executable, "-m", "imgcopy", "convert", path, out],
                       capture_output=True, text=True, env=imgcopy_child_env(), timeout=60)
    assert p.returncode == 1, p.stderr
    assert "symbolic link" in p.stderr
    assert not os.path.exists(out)
