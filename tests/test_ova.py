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


# ---- an archive opened without member= is refused, not read as a disk ----

def _refusal(call):
    with pytest.raises(imgcopy.ImageFormatError) as e:
        call()
    return e.value


def _names_the_disks(exc, first="disk1.vmdk", member="member", format="format"):
    text = str(exc)
    assert "tar archive" in text and "'disk1.vmdk' (vmdk)" in text and \
        "'disk2.vmdk' (vmdk)" in text, text
    assert "vm.ovf" not in text and "vm.mf" not in text, text   # not disks
    assert exc.remedies[0].options == {member: first}, exc.remedies
    assert {format: "raw"} in [r.options for r in exc.remedies], exc.remedies
    return text


@pytest.mark.parametrize("fmt", [None, "vmdk", "qcow2"])
def test_ova_without_member_refused_everywhere(ova, tmp_path, fmt):
    """Probed or named as a format, the archive is no disk: every entry
    point says so and names the disks in it."""
    archive, _ = ova
    # each remedy spelt with the keywords of the call that was refused
    calls = [(lambda: imgcopy.open(archive, format=fmt), "member", "format"),
             (lambda: imgcopy.map(archive, format=fmt), "member", "format"),
             (lambda: imgcopy.info(archive, format=fmt), "member", "format"),
             (lambda: imgcopy.checksum(archive, format=fmt), "member", "format"),
             (lambda: imgcopy.check(archive, format=fmt), "member", "format"),
             (lambda: imgcopy.measure(archive, src_format=fmt, dst_format="qcow2"),
              "member", "src_format"),
             (lambda: imgcopy.plan(archive, src_format=fmt), "src_member", "src_format"),
             (lambda: imgcopy.compare(archive, archive, a_format=fmt, b_format=fmt),
              "a_member", "a_format")]
    for call, member, format in calls:
        _names_the_disks(_refusal(call), member=member, format=format)
    dst = str(tmp_path / "x.qcow2")
    exc = _refusal(lambda: imgcopy.convert(archive, dst, src_format=fmt, dst_format="qcow2"))
    assert 'src_member="disk1.vmdk"' in str(exc) and 'src_format="raw"' in str(exc), str(exc)
    assert not os.path.exists(dst)


def test_ova_as_raw_reads_the_archive_bytes(ova):
    archive, _ = ova
    with imgcopy.open(archive, format="raw") as img:
        with open(archive, "rb") as f:
            assert img.read(0, img.size) == f.read()


def test_ova_cli_convert_without_member_refused(ova, tmp_path, imgcopy_env):
    """The issue's command: exit 1, nothing written, the flags to use."""
    archive, _ = ova
    dst = str(tmp_path / "x.qcow2")
    for extra in ([], ["-f", "vmdk"]):
        p = subprocess.run([sys.executable, "-m", "imgcopy", "convert"] + extra +
                           ["-O", "qcow2", archive, dst], capture_output=True, text=True,
                           env=imgcopy_env, timeout=60)
        assert p.returncode == 1, p.stderr
        assert "--member disk1.vmdk" in p.stderr and "-f raw" in p.stderr, p.stderr
        assert not os.path.exists(dst)


@pytest.mark.parametrize("fmt", ["ustar", "gnu", "pax", "v7"])
def test_every_tar_format_is_probed(tmp_path, fmt):
    disk = tmp_path / "disk.qcow2"
    qemu_img("create", "-f", "qcow2", str(disk), "1M")
    archive = str(tmp_path / "a.tar")
    if fmt == "v7":
        data = disk.read_bytes()
        with open(archive, "wb") as f:
            f.write(tar_archives.header("d.qcow2", len(data), magic="v7") + data +
                    tar_archives.pad(len(data)) + tar_archives.end_blocks())
        name = "d.qcow2"
    else:
        tar_archives.build(archive, [("vm/d.qcow2", str(disk))], fmt=fmt)
        name = "vm/d.qcow2"
    assert imgcopy._core.probe(archive) == "tar"
    exc = _refusal(lambda: imgcopy.info(archive))
    assert "'%s' (qcow2)" % name in str(exc) and exc.remedies[0].options == {"member": name}
    assert imgcopy.info(archive, member=name).format == "qcow2"


def test_archive_without_disks_lists_its_members(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("hello\n")
    archive = str(tmp_path / "a.tar")
    tar_archives.build(archive, [("notes.txt", str(notes)), ("disk-flat.vmdk", str(notes))],
                       fmt="gnu")
    exc = _refusal(lambda: imgcopy.open(archive))
    assert "none of its members looks like a disk" in str(exc) and "'notes.txt'" in str(exc)
    assert [r.options for r in exc.remedies] == [{"format": "raw"}]


def test_header_with_a_bad_checksum_is_not_an_archive(tmp_path):
    """Only a header tar would read is a tar archive: a wrong checksum makes
    the bytes a raw disk again."""
    p = tmp_path / "a.raw"
    p.write_bytes(tar_archives.header("x", 0, checksum_delta=1) + bytes(1024))
    assert imgcopy._core.probe(str(p)) == "raw"
    with imgcopy.open(str(p)) as img:
        assert img.format == "raw"


def test_member_that_is_an_archive_refused(ova, tmp_path):
    archive, _ = ova
    outer = str(tmp_path / "outer.tar")
    tar_archives.build(outer, [("inner.ova", archive)], fmt="pax")
    exc = _refusal(lambda: imgcopy.open(outer, member="inner.ova"))
    assert "member 'inner.ova' is a tar archive itself" in str(exc)
    assert [r.options for r in exc.remedies] == [{"format": "raw"}]   # member= is one level
    with imgcopy.open(outer, member="inner.ova", format="raw") as img:
        assert img.size == os.path.getsize(archive)


def test_backing_file_that_is_an_archive_refused(ova, tmp_path):
    archive, _ = ova
    top = str(tmp_path / "top.qcow2")
    qemu_img("create", "-f", "qcow2", "-b", archive, "-F", "raw", "-u", top, "8M")
    with imgcopy.open(top) as img:     # named raw: read as raw, as qemu does
        assert img.size == 8 * MiB
    qemu_img("rebase", "-u", "-b", archive, "-F", "vmdk", top)
    exc = _refusal(lambda: imgcopy.open(top))
    assert "tar archive" in str(exc) and not exc.remedies   # no option of the caller's helps
