"""OVA archives as v2v pipelines receive them: an .ovf, streamOptimized vmdk
disks and a manifest in a tar file, read in place (``member=``,
``--member``) and compared with what qemu-img reads from the extracted
disks; also disks whose descriptor names extent files (twoGbMaxExtent*,
monolithicFlat), whose extents are other members of the archive."""
import hashlib
import json
import os
import subprocess
import sys

import pytest

import imgcopy

from .gen import tar_archives
from .gen.sparse import make_sparse, seeded_bytes
from .oracles import needs_qemu_img, qemu_img, qemu_map
from .units import KiB, MiB

pytestmark = needs_qemu_img

OVF = """<?xml version="1.0" encoding="UTF-8"?>
<Envelope xmlns="http://schemas.dmtf.org/ovf/envelope/1">
  <References>
    <File ovf:href="disk1.vmdk" ovf:id="file1"/>
    <File ovf:href="disk2.vmdk" ovf:id="file2"/>
  </References>
</Envelope>
"""


def _source(path, seed, size):
    """A guest disk: data runs, written zeros and holes at seeded places, odd tail."""
    runs = [(0, seeded_bytes(64 * KiB, seed)),
            (MiB + 512, seeded_bytes(300 * KiB, seed + 1)),
            (3 * MiB, bytes(128 * KiB)),
            (size - 4 * KiB, seeded_bytes(4 * KiB, seed + 2))]
    make_sparse(path, size, runs)
    return path


def _member_map(archive, member):
    return [(e.start, e.length, e.data, e.zero) for e in imgcopy.map(archive, member=member)]


def _qemu_extents(path):
    return [(e["start"], e["length"], e["data"], e["zero"]) for e in qemu_map(path, fmt="vmdk").extents]


def _merged(extents):
    out = []
    for e in extents:
        if out and out[-1][2:] == e[2:] and out[-1][0] + out[-1][1] == e[0]:
            out[-1] = (out[-1][0], out[-1][1] + e[1]) + e[2:]
        else:
            out.append(e)
    return out


@pytest.fixture(scope="module")
def ova(tmp_path_factory):
    d = tmp_path_factory.mktemp("ova")
    disks = {}
    for i, size in ((1, 8 * MiB + 3 * 512), (2, 6 * MiB)):
        raw = _source(str(d / ("disk%d.raw" % i)), 10 * i, size)
        vmdk = str(d / ("disk%d.vmdk" % i))
        qemu_img("convert", "-f", "raw", "-O", "vmdk", "-o", "subformat=streamOptimized",
                 raw, vmdk)
        disks["disk%d.vmdk" % i] = (raw, vmdk)
    ovf = d / "vm.ovf"
    ovf.write_text(OVF)
    manifest = d / "vm.mf"
    lines = []
    for name in ["vm.ovf"] + sorted(disks):
        path = str(ovf) if name == "vm.ovf" else disks[name][1]
        with open(path, "rb") as f:
            lines.append("SHA256(%s)= %s\n" % (name, hashlib.sha256(f.read()).hexdigest()))
    manifest.write_text("".join(lines))
    archive = str(d / "vm.ova")
    tar_archives.build(archive, [("vm.ovf", str(ovf))] +
                       [(name, disks[name][1]) for name in sorted(disks)] +
                       [("vm.mf", str(manifest))], fmt="ustar", align=False)
    return archive, disks


@pytest.mark.parametrize("name", ["disk1.vmdk", "disk2.vmdk"])
def test_ova_disk_maps_and_infos_as_qemu_reads_the_extracted_disk(ova, name):
    archive, disks = ova
    raw, vmdk = disks[name]
    assert _merged(_member_map(archive, name)) == _merged(_qemu_extents(vmdk))
    info = imgcopy.info(archive, member=name)
    q = json.loads(qemu_img("info", "--output=json", "-f", "vmdk", vmdk).stdout)
    assert (info.format, info.virtual_size) == ("vmdk", q["virtual-size"])
    with imgcopy.open(archive, member=name) as img:
        assert img.format == "vmdk" and img.size == os.path.getsize(raw)


@pytest.mark.parametrize("dst_format", ["raw", "qcow2"])
def test_ova_disk_converts_identically(ova, tmp_path, dst_format):
    archive, disks = ova
    raw, _ = disks["disk1.vmdk"]
    dst = str(tmp_path / ("out." + dst_format))
    result = imgcopy.convert(archive, dst, src_member="disk1.vmdk", dst_format=dst_format)
    qemu_img("compare", "-f", "raw", "-F", dst_format, raw, dst)
    if dst_format == "raw":   # plan() is the requests into a new raw destination
        totals = imgcopy.plan(archive, src_member="disk1.vmdk").totals()
        assert (totals["write_requests"], totals["zero_requests"]) == (
            result.write_requests, result.zero_requests)


def test_ova_cli_member(ova, tmp_path, imgcopy_env):
    archive, disks = ova
    raw, _ = disks["disk2.vmdk"]
    dst = str(tmp_path / "out.qcow2")
    p = subprocess.run([sys.executable, "-m", "imgcopy", "convert", "--member", "disk2.vmdk",
                        "-O", "qcow2", archive, dst], capture_output=True, text=True,
                       env=imgcopy_env, timeout=120)
    assert p.returncode == 0, p.stderr
    qemu_img("compare", "-f", "raw", "-F", "qcow2", raw, dst)
    p = subprocess.run([sys.executable, "-m", "imgcopy", "info", "--member", "disk2.vmdk",
                        "--output=json", archive], capture_output=True, text=True,
                       env=imgcopy_env, timeout=60)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["format"] == "vmdk"


def test_ova_other_members_are_not_disks(ova):
    archive, _ = ova
    # the descriptor of an OVF is XML: it reads as raw bytes, never as a disk format
    with imgcopy.open(archive, member="vm.ovf") as img:
        assert img.format == "raw" and img.size == len(OVF)
    with pytest.raises(ValueError, match="disk3.vmdk"):
        imgcopy.open(archive, member="disk3.vmdk")


@pytest.mark.parametrize("subformat", ["twoGbMaxExtentSparse", "monolithicFlat",
                                       "twoGbMaxExtentFlat"])
def test_descriptor_extents_are_members(tmp_path, subformat):
    """A descriptor's extent files are other members of the archive, in the
    descriptor's directory there."""
    raw = _source(str(tmp_path / "src.raw"), 7, 5 * MiB + 512)
    d = tmp_path / "disk"
    d.mkdir()
    vmdk = str(d / "vm.vmdk")
    qemu_img("convert", "-f", "raw", "-O", "vmdk", "-o", "subformat=" + subformat, raw, vmdk)
    files = sorted(os.listdir(str(d)))
    assert len(files) >= 2, files
    archive = str(tmp_path / "vm.tar")
    tar_archives.build(archive, [("vm/" + f, str(d / f)) for f in files], fmt="pax")
    assert _merged(_member_map(archive, "vm/vm.vmdk")) == _merged(_qemu_extents(vmdk))
    out = str(tmp_path / "out.raw")
    imgcopy.convert(archive, out, src_member="vm/vm.vmdk")
    qemu_img("compare", "-f", "raw", "-F", "raw", raw, out)
