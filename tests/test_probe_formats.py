"""Probing never opens an image of another format as raw.

Every disk-image format qemu knows (vpc/vhd, vhdx, parallels, bochs, dmg, cloop, qed, luks, vdi,
vmdk, qcow version 1) must be recognised by probing.  The ones imgcopy reads (imgcopy._core.formats():
vmdk, vhdx and vpc among them) open as that format, or are refused with an ``ImageFormatError``
naming what of it imgcopy does not read, never as raw; every other one is refused:
``imgcopy.open(path)`` raises ``ImageFormatError`` naming the format and suggesting
``format="raw"``; the CLI exits 1 naming the format and suggesting ``-f raw``.  Passing
``format="raw"`` (``-f raw``) reads the file's bytes as they are.

Images are made by ``qemu-img create`` where qemu can, else written from the format's
description by tests/gen/foreign_formats.py (bochs, cloop, dmg, vmdk3, LUKS2) and checked with ``qemu-img info`` (and their
contents with ``qemu-img convert``) where qemu reads the format.  Cases marked BEYOND_QEMU are
images that qemu-img itself probes as raw although they are of another format (a fixed VHD,
whose only "conectix" footer is at the end; a DMG, which qemu recognises by its file name only;
LUKS2; a bochs redolog of another subtype; a cloop preamble of another version; a VMDK
descriptor with an empty line before "version="): they follow the probe rules recommended for
imgcopy (head rules first; a fixed VHD's footer and a DMG's "koly" trailer read from the end).

The other side: files that merely look like something (random or zero first bytes, an MBR, GPT,
ext4 or ISO 9660 header, text that mentions a magic away from its offset, a trailer that starts
with a magic but is not valid, a file shorter than a magic, a raw file named *.dmg) stay raw.

File names are neutral ("i07", not "x.vmdk") so that a message naming the format is not
satisfied by the path it quotes.
"""

import os
import struct
import subprocess
import sys

import pytest

import imgcopy
from imgcopy import cli

from .gen import foreign_formats as ff
from .gen.sparse import write_file
from .oracles import NO_QEMU_IMG, QEMU_IMG, needs_qemu_img, qemu_img
from .units import MiB


# ---- images qemu-img makes -----------------------------------------------------------------------

SECRET = ["--object", "secret,id=sec0,data=x"]

# id -> (format name the error must use, qemu-img create arguments before the file name)
QEMU_MADE = {
    "vpc-dynamic": ("vpc", ["-f", "vpc", "-o", "subformat=dynamic"]),
    "vpc-fixed": ("vpc", ["-f", "vpc", "-o", "subformat=fixed"]),              # BEYOND_QEMU
    "vhdx": ("vhdx", ["-f", "vhdx"]),
    "parallels": ("parallels", ["-f", "parallels"]),
    "qed": ("qed", ["-f", "qed"]),
    # sha512: with sha256, qemu 7.2's PBKDF benchmark often fails ("Unable to get accurate CPU
    # usage") on fast machines
    "luks": ("luks", SECRET + ["-f", "luks",
                               "-o", "key-secret=sec0,iter-time=10,hash-alg=sha512"]),
    "vdi": ("vdi", ["-f", "vdi"]),
    "vmdk-monolithicSparse": ("vmdk", ["-f", "vmdk", "-o", "subformat=monolithicSparse"]),
    "vmdk-streamOptimized": ("vmdk", ["-f", "vmdk", "-o", "subformat=streamOptimized"]),
    "vmdk-monolithicFlat": ("vmdk", ["-f", "vmdk", "-o", "subformat=monolithicFlat"]),
    "vmdk-twoGbMaxExtentSparse": ("vmdk", ["-f", "vmdk", "-o", "subformat=twoGbMaxExtentSparse"]),
    "qcow": ("qcow", ["-f", "qcow"]),
}

# id -> (format name, id of the qemu-made image it is derived from)
DERIVED = {
    "parallels-v2-magic": ("parallels", "parallels"),  # "WithoutFreeSpace" (qemu: "...SpacExt")
    "vmdk-sparse-extent": ("vmdk", "vmdk-twoGbMaxExtentSparse"),  # the -s001 extent on its own
    "vmdk-descriptor-crlf": ("vmdk", "vmdk-monolithicFlat"),
    "vmdk-descriptor-blank-line": ("vmdk", "vmdk-monolithicFlat"),  # BEYOND_QEMU
}


# ---- images written here (tests/gen/foreign_formats.py) ------------------------------------------

SECTOR0 = ff.lcg_bytes(512, 42)

# id -> (format name, bytes, qemu check: None, or (qemu format, virtual size, probes, contents))
HANDMADE = {
    "bochs-v2": ("bochs", ff.bochs(0x00020000, data=SECTOR0),
                 ("bochs", 64 << 10, True, SECTOR0 + bytes(64 * 1024 - 512))),
    "bochs-v1": ("bochs", ff.bochs(0x00010000), ("bochs", 64 << 10, True, bytes(64 << 10))),
    "bochs-undoable": ("bochs", ff.bochs(0x00020000, subtype="Undoable"), None),  # BEYOND_QEMU
    "cloop-v2": ("cloop", ff.cloop([SECTOR0, bytes(512)]),
                 ("cloop", 1024, True, SECTOR0 + bytes(512))),
    "cloop-v4-preamble": ("cloop", ff.cloop([SECTOR0], preamble=ff.CLOOP_V4), None),  # BEYOND_QEMU
    "dmg": ("dmg", ff.dmg(SECTOR0), ("dmg", 1024, False, SECTOR0 + bytes(512))),  # BEYOND_QEMU
    "vmdk3-cowd": ("vmdk", ff.vmdk3(), ("vmdk", MiB, True, None)),
    "luks2": ("luks", ff.luks2(), None),                                          # BEYOND_QEMU
}

BEYOND_QEMU = {"vpc-fixed", "vmdk-descriptor-blank-line", "bochs-undoable",
               "cloop-v4-preamble", "dmg", "luks2"}

FOREIGN = {}
FOREIGN.update({k: v[0] for k, v in QEMU_MADE.items()})
FOREIGN.update({k: v[0] for k, v in DERIVED.items()})
FOREIGN.update({k: v[0] for k, v in HANDMADE.items()})
CASES = sorted(FOREIGN)
QEMU_CASES = set(QEMU_MADE) | set(DERIVED)
READABLE = set(imgcopy._core.formats())
# images of a format imgcopy reads: they must open as it (or name what is not read)
READ_CASES = [k for k in CASES if FOREIGN[k] in READABLE]
REFUSED_CASES = [k for k in CASES if FOREIGN[k] not in READABLE]


def _derive(kind, src, dst):
    with open(src, "rb") as f:
        data = f.read()
    if kind == "parallels-v2-magic":
        assert data[:16] == b"WithouFreSpacExt"
        return write_file(dst, b"WithoutFreeSpace" + data[16:])
    if kind == "vmdk-sparse-extent":
        # qemu probes it as vmdk but opens it only through its descriptor
        with open(src + "-s001", "rb") as f:
            assert f.read(4) == b"KDMV"
        return src + "-s001"
    text = data.decode()
    assert text.startswith("# Disk DescriptorFile\nversion=1\n"), text
    if kind == "vmdk-descriptor-crlf":
        return write_file(dst, text.replace("\n", "\r\n").encode())
    assert kind == "vmdk-descriptor-blank-line"
    return write_file(dst, text.replace("# Disk DescriptorFile\n", "# Disk DescriptorFile\n\n",
                                        1).encode())


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """id -> path of every foreign image (qemu-made ones only when qemu-img is installed)."""
    d = str(tmp_path_factory.mktemp("probe"))
    paths = {}
    names = {k: os.path.join(d, "i%02d" % i) for i, k in enumerate(CASES)}
    for k, (_, data, _) in HANDMADE.items():
        paths[k] = write_file(names[k], data)
    if QEMU_IMG is not None:
        # LUKS spends ~2 s benchmarking its key derivation: let it run while the rest is made
        luks_args = [QEMU_IMG, "create", "-q"] + QEMU_MADE["luks"][1] + [names["luks"], "1M"]
        luks = subprocess.Popen(luks_args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        for k, (_, args) in QEMU_MADE.items():
            if k != "luks":
                qemu_img("create", "-q", *args, names[k], "1M", timeout=60)
                paths[k] = names[k]
        for k, (_, src) in DERIVED.items():
            paths[k] = _derive(k, paths[src], names[k])
        out, err = luks.communicate(timeout=120)
        for _ in range(2):      # the benchmark's flakiness, should it strike anyway
            if luks.returncode == 0 or "accurate CPU usage" not in err:
                break
            luks = subprocess.Popen(luks_args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True)
            out, err = luks.communicate(timeout=120)
        assert luks.returncode == 0, err
        paths["luks"] = names["luks"]
    return paths


@pytest.fixture
def image(images, request):
    kind = request.param
    if kind not in images:
        pytest.skip(NO_QEMU_IMG)
    return kind, images[kind]


def _tokens(msg, path):
    """The words of an error message, lower-cased, with the file's path taken out."""
    msg = msg.replace(os.fsdecode(path), " ").lower()
    words, cur = set(), ""
    for ch in msg + " ":
        if ch.isalnum():
            cur += ch
        elif cur:
            words.add(cur)
            cur = ""
    return words


def _check_python_message(exc, path, fmt):
    msg = str(exc)
    assert fmt in _tokens(msg, path), "error does not name %r: %s" % (fmt, msg)
    assert 'format="raw"' in msg, msg


def _check_cli_message(err, path, fmt):
    assert fmt in _tokens(err, path), "CLI message does not name %r: %s" % (fmt, err)
    assert "-f raw" in err, err
    assert "format=" not in err, err


# ---- the images are what they claim --------------------------------------------------------------

@needs_qemu_img
@pytest.mark.parametrize("kind", sorted(k for k in HANDMADE if HANDMADE[k][2]))
def test_handmade_images_are_valid_for_qemu(images, kind, tmp_path):
    """qemu-img opens what this file writes as the format it is meant to be, with the expected
    virtual size and contents, and (where qemu probes by content) probes it as that format."""
    fmt, data, (qfmt, vsize, probes, contents) = HANDMADE[kind]
    path = images[kind]
    if kind == "vmdk3-cowd":
        # qemu opens a vmfsSparse extent through a descriptor (alone, it wants a "parentCID"
        # at byte 512, which real COWD files do not have)
        path = write_file(str(tmp_path / "desc"), (
            '# Disk DescriptorFile\nversion=1\nCID=12345678\nparentCID=ffffffff\n'
            'createType="vmfsSparse"\n\nRW 2048 VMFSSPARSE "%s"\n' % path).encode())
    info = qemu_img("info", "--output=json", "-f", qfmt, path, timeout=60).stdout
    assert '"format": "%s"' % qfmt in info, info
    assert '"virtual-size": %d' % vsize in info, info
    if probes:
        info = qemu_img("info", "--output=json", path, timeout=60).stdout
        assert '"format": "%s"' % qfmt in info, info
    if contents is not None:
        out = str(tmp_path / "out")
        qemu_img("convert", "-f", qfmt, "-O", "raw", path, out, timeout=60)
        with open(out, "rb") as f:
            assert f.read() == contents


@needs_qemu_img
@pytest.mark.parametrize("kind", sorted(k for k in DERIVED if k != "vmdk-sparse-extent"))
def test_derived_images_are_valid_for_qemu(images, kind):
    fmt = DERIVED[kind][0]
    info = qemu_img("info", "--output=json", "-f", fmt, images[kind], timeout=60).stdout
    assert '"format": "%s"' % fmt in info, info


# ---- refused by probing --------------------------------------------------------------------------

@pytest.mark.parametrize("image", READ_CASES, indirect=True)
def test_open_reads_readable_foreign_format(image):
    """Probing hands a format imgcopy reads to its driver: the image opens as that format, or
    the driver names what it does not read (never raw, never a hint to read it as raw)."""
    kind, path = image
    fmt = FOREIGN[kind]
    try:
        with imgcopy.open(path) as img:
            assert img.format == fmt
    except imgcopy.ImageFormatError as e:
        assert 'format="raw"' not in str(e), str(e)
        assert kind in ("vmdk-sparse-extent", "vmdk3-cowd"), "%s: %s" % (kind, e)


@pytest.mark.parametrize("image", REFUSED_CASES, indirect=True)
def test_open_refuses_foreign_format(image):
    kind, path = image
    fmt = FOREIGN[kind]
    with pytest.raises(imgcopy.ImageFormatError) as ei:
        with imgcopy.open(path) as img:
            pytest.fail("%s opened as %s (size %d)" % (kind, img.format, img.size))
    _check_python_message(ei.value, path, fmt)
    assert isinstance(ei.value, ValueError)


@pytest.mark.parametrize("image", REFUSED_CASES, indirect=True)
def test_map_refuses_foreign_format(image):
    kind, path = image
    with pytest.raises(imgcopy.ImageFormatError) as ei:
        imgcopy.map(path)
    _check_python_message(ei.value, path, FOREIGN[kind])


@pytest.mark.parametrize("image", CASES, indirect=True)
def test_format_raw_reads_the_bytes(image):
    kind, path = image
    size = os.path.getsize(path)
    with imgcopy.open(path, format="raw") as img:
        assert img.format == "raw"
        assert img.size == size
    emap = imgcopy.map(path, format="raw")
    ext = list(emap)
    assert ext and ext[0].start == 0
    assert ext[-1].start + ext[-1].length == size
    assert sum(e.length for e in ext) == size
    assert emap.to_json().startswith("[")


@pytest.mark.parametrize("command", ["map", "info", "convert"])
@pytest.mark.parametrize("image", REFUSED_CASES, indirect=True)
def test_cli_refuses_foreign_format(image, command, tmp_path, capsys):
    kind, path = image
    dst = str(tmp_path / "dst")
    argv = [command, path] + ([dst] if command == "convert" else [])
    assert cli.main(argv) == 1
    out, err = capsys.readouterr()
    _check_cli_message(err, path, FOREIGN[kind])
    assert out == ""
    if command == "convert":
        assert not os.path.exists(dst), "a refused source must not create the destination"


@pytest.mark.parametrize("image", CASES, indirect=True)
def test_cli_format_raw(image, tmp_path, capsys):
    kind, path = image
    assert cli.main(["map", "-f", "raw", "--output=json", path]) == 0
    assert cli.main(["info", "-f", "raw", path]) == 0
    out, err = capsys.readouterr()
    assert "raw" in out


@pytest.mark.parametrize("command", ["map", "info", "convert"])
def test_python_m_imgcopy_refuses(images, command, imgcopy_env, tmp_path):
    """The real entry point, in a process of its own, for the image qemu-img itself calls raw."""
    path, fmt = images["dmg"], "dmg"
    dst = str(tmp_path / "dst")
    argv = [command, path] + ([dst] if command == "convert" else [])
    p = subprocess.run([sys.executable, "-m", "imgcopy"] + argv, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, env=imgcopy_env, timeout=60)
    assert p.returncode == 1, (p.stdout, p.stderr)
    _check_cli_message(p.stderr, path, fmt)
    assert not os.path.exists(dst)
    p = subprocess.run([sys.executable, "-m", "imgcopy", "map", "-f", "raw", path],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       env=imgcopy_env, timeout=60)
    assert p.returncode == 0, p.stderr


# ---- still raw -----------------------------------------------------------------------------------

NEGATIVE = {
    "random": ff.lcg_bytes(65536, 12),
    "zeros": bytes(1 << 20),
    "zeros-then-data": bytes(4096) + ff.lcg_bytes(4096, 13),
    "mbr": ff.mbr(),
    "gpt": ff.gpt(),
    "ext4": ff.ext4(),
    "iso9660": ff.iso9660(),
    "text-mentions-magics": ff.text_with_magics(),
    "text-starting-with-vdi-banner": b"<<< not a VirtualBox image >>>\n" + bytes(1000),
    "bad-vhd-trailer": ff.bad_vhd_trailer(),
    "bad-koly-trailer": ff.bad_koly_trailer(),
    "odd-size": ff.lcg_bytes(12345, 14),
    "one-byte": b"Q",
    "empty": b"",
}

# a file shorter than each magic (the magic cut by one byte) is raw
SHORT = {
    "vpc": b"conecti",
    "vhdx": b"vhdxfil",
    "parallels": b"WithoutFreeSpac",
    "bochs": ff.BOCHS_MAGIC[:-1].encode(),
    "cloop": ff.CLOOP_V2[:22],
    "qed": b"QED",
    "luks": b"LUKS\xba",
    "vdi": bytes(0x40) + struct.pack("<I", 0xBEDA107F)[:3],
    "vmdk": b"KDM",
    "vmdk3": b"COW",
    "qcow": b"QFI",
    "dmg": b"koly" + struct.pack(">II", 4, 512) + bytes(499),   # a trailer cut by one byte
}


def _check_raw(path, size):
    with imgcopy.open(path) as img:
        assert img.format == "raw"
        assert img.size == size
    emap = imgcopy.map(path)
    assert sum(e.length for e in emap) == size


@pytest.mark.parametrize("kind", sorted(NEGATIVE))
def test_plausible_raw_disks_open_as_raw(kind, tmp_path):
    data = NEGATIVE[kind]
    _check_raw(write_file(str(tmp_path / "disk"), data), len(data))


@pytest.mark.parametrize("fmt", sorted(SHORT))
def test_file_shorter_than_magic_is_raw(fmt, tmp_path):
    data = SHORT[fmt]
    _check_raw(write_file(str(tmp_path / "short"), data), len(data))


def test_raw_file_named_dmg_is_raw(tmp_path):
    """DMG is recognised by its "koly" trailer, not by its name (qemu's dmg probe goes by the
    name and then fails to open such a file)."""
    data = ff.lcg_bytes(4096, 15)
    _check_raw(write_file(str(tmp_path / "disk.dmg"), data), len(data))


@needs_qemu_img
def test_vmdk_flat_extent_is_raw(images):
    """The data file of a monolithicFlat VMDK is raw bytes: probing it says raw."""
    _check_raw(images["vmdk-monolithicFlat"] + "-flat", MiB)
