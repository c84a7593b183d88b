"""Disks inside tar archives (OVA members), read in place.

Every answer about a member is checked against qemu-img's answer about the
same member extracted (sparsely, with Python's tarfile): map and info,
convert (qemu-img compare), plan (the copy's counters).  Archives come in
tarfile's USTAR, GNU and PAX formats, and hand-built for what tarfile
cannot make (base-256 sizes over sparse files, GNU sparse members, broken
headers)."""

import errno
import json
import os
import random
import shutil
import subprocess
import sys
import tarfile

import pytest

import imgcopy
from imgcopy.errors import ImageFormatError
from imgcopy.info import info_chain
from .convert_helpers import imgcopy_child_env, imgcopy_cmd
from .gen import tar_archives as ta
from .gen.sparse import make_sparse, pattern
from .oracles import (assert_same_content, qemu_img, qemu_info, qemu_io, qemu_map,
                      qemu_measure, require_qemu)
from .servers import nbdkit, needs_libnbd, needs_nbdkit
from .units import GiB, KiB, MiB

pytestmark = pytest.mark.usefixtures("_qemu")

PLAN_KEYS = ("bytes_read", "bytes_written", "bytes_zeroed", "bytes_skipped", "read_requests",
             "write_requests", "zero_requests", "extents")

# member names per archive format: longer than a header's 100 bytes (ustar:
# through the prefix field), and ones stored or asked for with "./"
LONG = {
    "ustar": "ova-" * 30 + "/disk-with-a-long-name.raw",
    "gnu": "g" * 150 + "/disk.raw",
    "pax": "pax-dir/" * 40 + "disk.raw",
}


@pytest.fixture(scope="module")
def _qemu():
    require_qemu()


def _raw_source(path, seed, size):
    """Seeded data runs (with zero runs inside), holes between, odd size."""
    rng = random.Random(seed)
    data = []
    off = rng.randrange(0, 64 * KiB)
    while off < size:
        n = min(size - off, rng.randrange(1, 300 * KiB))
        data.append((off, pattern(rng, n, zero_runs=True)))
        off += n + rng.randrange(4 * KiB, 1 * MiB)
    make_sparse(path, size, data)
    return path


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    d = tmp_path_factory.mktemp("member-sources")
    raw = _raw_source(str(d / "disk.raw"), 1, 3 * MiB + 777)
    q_raw = _raw_source(str(d / "q.raw"), 2, 4 * MiB + 512)
    qcow2 = str(d / "disk.qcow2")
    qemu_img("convert", "-f", "raw", "-O", "qcow2", q_raw, qcow2)
    # a big sparse member to put before the others
    big = str(d / "big.raw")
    make_sparse(big, 24 * MiB, [(5 * MiB, b"\x11" * 8192), (20 * MiB + 100, b"\x22" * 3000)])
    # an overlay and its backing file, named relative to each other
    vm = d / "vm"
    vm.mkdir()
    base = str(vm / "base.qcow2")
    qemu_img("convert", "-f", "raw", "-O", "qcow2", raw, base)
    top = str(vm / "top.qcow2")
    qemu_img("create", "-f", "qcow2", "-b", "base.qcow2", "-F", "qcow2", top, "4M")
    qemu_io(top, ["write -P 0x5c 64k 192k", "write -z 1M 256k", "write -P 0x7e 3584k 4k"],
            fmt="qcow2")
    return {"raw": raw, "qcow2": qcow2, "big": big, "base": base, "top": top, "dir": str(d)}


@pytest.fixture(scope="module", params=["ustar", "gnu", "pax"])
def archive(request, sources, tmp_path_factory):
    """(format, tar path, {name to ask: (stored name, image format)})"""
    fmt = request.param
    d = tmp_path_factory.mktemp("member-" + fmt)
    path = str(d / ("disks-%s.ova" % fmt))
    members = [("big.raw", sources["big"]),
               (LONG[fmt], sources["raw"]),
               ("./disk.qcow2", sources["qcow2"]),
               ("vm/base.qcow2", sources["base"]),
               ("vm/top.qcow2", sources["top"])]
    ta.build(path, members, fmt)
    asked = {LONG[fmt]: (LONG[fmt], "raw"), "disk.qcow2": ("./disk.qcow2", "qcow2"),
             "./big.raw": ("big.raw", "raw"), "vm/top.qcow2": ("vm/top.qcow2", "qcow2")}
    return fmt, path, asked


def _extract_all(tar, out_dir):
    """Every member, extracted sparsely into out_dir (tarfile's names)."""
    paths = {}
    with tarfile.open(tar) as tf:
        names = [m.name for m in tf.getmembers() if m.isreg()]
    for name in names:
        out = os.path.join(out_dir, name)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        paths[name] = ta.extract(tar, name, out)
    return paths


@pytest.fixture(scope="module")
def extracted(archive, tmp_path_factory):
    fmt, tar, _ = archive
    return _extract_all(tar, str(tmp_path_factory.mktemp("extracted-" + fmt)))


def _qemu_info_comparable(d):
    return {k: v for k, v in d.items()
            if k not in ("filename", "actual-size", "full-backing-filename",
                         "compressed-clusters")}


def _info_comparable(i):
    return _qemu_info_comparable(i.to_dict())


def _common(d):
    return {k: d[k] for k in PLAN_KEYS}


# --------------------------------------------------------------------------
# map, info, convert, plan against qemu-img on the extracted member

def test_map_and_info_as_qemu_img_says(archive, extracted):
    fmt, tar, asked = archive
    for ask, (stored, kind) in asked.items():
        out = extracted[stored]
        m = imgcopy.map(tar, member=ask)
        assert m.to_json() == qemu_map(out, kind).text, (fmt, ask)
        i = imgcopy.info(tar, member=ask)
        assert _info_comparable(i) == _qemu_info_comparable(qemu_info(out, kind)), (fmt, ask)
        assert i.actual_size is None and i.member == ask
        with imgcopy.open(tar, member=ask) as img:
            assert img.format == kind
            if kind == "raw":
                assert img.size == os.path.getsize(out)
                n = min(img.size, 300 * KiB)
                with open(out, "rb") as f:
                    f.seek(img.size - n)
                    assert img.read(img.size - n, n) == f.read(n)


@pytest.mark.parametrize("dst_format", ["raw", "qcow2"])
def test_convert_and_plan(archive, extracted, tmp_path, dst_format):
    fmt, tar, asked = archive
    for ask, (stored, kind) in asked.items():
        out = extracted[stored]
        dst = str(tmp_path / ("out." + dst_format))
        r = imgcopy.convert(tar, dst, src_member=ask, dst_format=dst_format, flush=False)
        assert_same_content(dst, out, dst_format, kind)
        if dst_format == "raw":
            p = imgcopy.plan(tar, src_member=ask)
            assert _common(p.totals()) == _common(r.to_dict()), (fmt, ask)
            # the same source extracted gives the same copy
            r2 = imgcopy.convert(out, dst, src_format=kind, flush=False)
            assert _common(r2.to_dict()) == _common(r.to_dict()), (fmt, ask)
        os.unlink(dst)


def test_convert_and_plan_take_member(archive, extracted, tmp_path):
    """member= is src_member='s short name, as open(), map() and info() spell it."""
    fmt, tar, _ = archive
    if fmt != "gnu":
        pytest.skip("one archive format is enough for a keyword")
    dst = str(tmp_path / "m.qcow2")
    r = imgcopy.convert(tar, dst, member="disk.qcow2", dst_format="qcow2", flush=False)
    assert_same_content(dst, extracted["./disk.qcow2"], "qcow2", "qcow2")
    assert _common(imgcopy.plan(tar, member="disk.qcow2").totals()) == \
        _common(imgcopy.plan(tar, src_member="disk.qcow2").totals())
    # both given: the same name is fine, two names are a TypeError before anything opens
    imgcopy.convert(tar, dst, member="vm/top.qcow2", src_member="vm/top.qcow2",
                    dst_format="qcow2", flush=False)
    assert_same_content(dst, extracted["vm/top.qcow2"], "qcow2", "qcow2")
    for call, args in ((imgcopy.convert, (tar, dst)), (imgcopy.plan, (tar,))):
        with pytest.raises(TypeError, match=r"member='disk.qcow2' and src_member='big.raw'"):
            call(*args, member="disk.qcow2", src_member="big.raw")
    assert r.bytes_written > 0


def test_backing_file_is_another_member(archive, extracted, tmp_path):
    fmt, tar, _ = archive
    top = extracted["vm/top.qcow2"]
    chain = info_chain(tar, member="vm/top.qcow2")
    want = qemu_info(top, "qcow2", backing_chain=True)
    assert [_info_comparable(i) for i in chain] == [_qemu_info_comparable(w) for w in want]
    assert [i.member for i in chain] == ["vm/top.qcow2", "vm/base.qcow2"]
    with imgcopy.open(tar, member="vm/top.qcow2") as img:
        assert img.backing_chain == [(tar, "qcow2")]
        assert img.backing_members == ["vm/base.qcow2"]
        # the archive itself is what a destination must not be
        assert img._img.reads_file(tar) == tar
    with pytest.raises(ValueError, match="the destination is the source"):
        imgcopy.convert(tar, tar, src_member="vm/top.qcow2")
    assert os.path.getsize(tar) > 0 and tarfile.is_tarfile(tar)


def test_hole_of_a_sparse_archive_is_a_hole(tmp_path):
    src = str(tmp_path / "holey.raw")
    make_sparse(src, 2 * MiB + 4 * KiB, [(0, b"\x01" * 8192), (2 * MiB, b"\x02" * 4096)])
    tar = str(tmp_path / "h.tar")
    offsets = ta.build(tar, [("holey.raw", src)], "gnu")
    assert offsets["holey.raw"] % 4096 == 0
    extents = list(imgcopy.map(tar, member="holey.raw"))
    holes = [e for e in extents if e.zero and not e.data]
    assert [(e.start, e.length) for e in holes] == [(8192, 2 * MiB - 8192)]
    assert imgcopy.map(tar, member="holey.raw").to_json() == qemu_map(src).text


def test_unaligned_member_reads_right(tmp_path):
    """Members at any 512-byte offset: zero extents read zeros, the copy
    equals the file."""
    src = _raw_source(str(tmp_path / "u.raw"), 7, 2 * MiB + 3)
    tar = str(tmp_path / "u.tar")
    ta.build(tar, [("a.txt", _small(tmp_path)), ("u.raw", src)], "ustar", align=False)
    with imgcopy.open(tar, member="u.raw") as img:
        for e in img.extents():
            if e.zero:
                assert img.read(e.start, e.length) == bytes(e.length)
    dst = str(tmp_path / "copy.raw")
    imgcopy.convert(tar, dst, src_member="u.raw")
    assert_same_content(dst, src, "raw", "raw")


def _small(tmp_path):
    p = str(tmp_path / "small.txt")
    with open(p, "wb") as f:
        f.write(b"not a disk\n" * 100)
    return p


def test_member_larger_than_8_gib_base256(tmp_path):
    size = 8 * GiB + 12 * KiB + 123
    data = [(0, b"\x31" * 4096), (1 * MiB + 512, b"\x32" * 5000),
            (8 * GiB + 4 * KiB, b"\x33" * (8 * KiB + 123))]
    tar = str(tmp_path / "big.ova")
    assert ta.build_big(tar, "huge.raw", size, data) % 4096 == 0
    flat = str(tmp_path / "huge.raw")
    make_sparse(flat, size, data)
    assert imgcopy.map(tar, member="huge.raw").to_json() == qemu_map(flat).text
    assert _info_comparable(imgcopy.info(tar, member="huge.raw")) == \
        _qemu_info_comparable(qemu_info(flat, "raw"))
    with tarfile.open(tar) as tf:  # Python's tarfile reads the same size
        assert tf.getmember("huge.raw").size == size
    for dst_format in ("qcow2", "raw"):
        dst = str(tmp_path / ("out." + dst_format))
        r = imgcopy.convert(tar, dst, src_member="huge.raw", dst_format=dst_format, flush=False)
        assert_same_content(dst, flat, dst_format, "raw")
        if dst_format == "raw":
            p = imgcopy.plan(tar, src_member="huge.raw")
            assert _common(p.totals()) == _common(r.to_dict())
        os.unlink(dst)


def test_cli_member(archive, extracted, tmp_path):
    fmt, tar, _ = archive
    if fmt != "pax":
        pytest.skip("one archive format is enough for the command line")
    ask, out = "disk.qcow2", extracted["./disk.qcow2"]
    env = imgcopy_child_env()
    cmd = imgcopy_cmd()
    p = subprocess.run(cmd + ["map", "--member", ask, "--output=json", tar],
                       capture_output=True, text=True, env=env, check=True)
    assert p.stdout == qemu_map(out, "qcow2").text
    p = subprocess.run(cmd + ["info", "--member", ask, "--output=json", tar],
                       capture_output=True, text=True, env=env, check=True)
    assert _qemu_info_comparable(json.loads(p.stdout)) == \
        _qemu_info_comparable(qemu_info(out, "qcow2"))
    dst = str(tmp_path / "cli.qcow2")
    subprocess.run(cmd + ["convert", "--member", ask, "-O", "qcow2", tar, dst], env=env,
                   check=True)
    assert_same_content(dst, out, "qcow2", "qcow2")
    p = subprocess.run(cmd + ["map", "--member", "nope.vmdk", tar], capture_output=True,
                       text=True, env=env)
    assert p.returncode == 1 and "no member 'nope.vmdk'" in p.stderr, p.stderr


@needs_nbdkit
@needs_libnbd
def test_archive_on_nbd(sources, tmp_path):
    tar = str(tmp_path / "n.tar")
    ta.build(tar, [("disk.qcow2", sources["qcow2"])], "gnu")
    out = ta.extract(tar, "disk.qcow2", str(tmp_path / "x.qcow2"))
    with nbdkit("file", tar, log=False) as srv:
        m = imgcopy.map(srv.uri, member="disk.qcow2")
        assert m.to_json() == qemu_map(out, "qcow2").text
        dst = str(tmp_path / "o.raw")
        imgcopy.convert(srv.uri, dst, src_member="disk.qcow2")
        assert_same_content(dst, out, "raw", "qcow2")


# --------------------------------------------------------------------------
# the verification tools (checksum, compare, check, measure) on members,
# against qemu-img on the member extracted

def _guest(path, kind, tmp_path):
    """What qemu reads from an image: qemu-img convert -O raw (a raw file
    itself: qemu would round its size up to whole sectors)."""
    if kind == "raw":
        with open(path, "rb") as f:
            return f.read()
    out = str(tmp_path / "guest.raw")
    qemu_img("convert", "-f", kind, "-O", "raw", path, out)
    with open(out, "rb") as f:
        data = f.read()
    os.unlink(out)
    return data


def _run_cli(capfdbinary, *argv):
    from imgcopy.cli import main as cli_main
    capfdbinary.readouterr()
    rc = cli_main(list(argv))
    out, err = capfdbinary.readouterr()
    return rc, out.decode(), err.decode()


def test_checksum_of_member(archive, extracted, tmp_path, capfdbinary):
    from .test_checksum import reference
    fmt, tar, asked = archive
    for ask, (stored, kind) in asked.items():
        want = reference(_guest(extracted[stored], kind, tmp_path))
        assert imgcopy.checksum(tar, member=ask) == want, (fmt, ask)
        assert imgcopy.checksum(extracted[stored], format=kind) == want
    ask = "disk.qcow2"
    want = imgcopy.checksum(tar, "md5", "4k", member=ask)
    assert want == reference(_guest(extracted["./disk.qcow2"], "qcow2", tmp_path), "md5", 4096)
    # the CLI names what it hashed: the archive's member
    rc, out, err = _run_cli(capfdbinary, "checksum", "-a", "md5", "--block-size", "4k",
                            "--member", ask, tar)
    assert (rc, out, err) == (0, f"{want}  {tar}/{ask}\n", "")
    rc, out, err = _run_cli(capfdbinary, "checksum", "--member", "nope.raw", tar)
    assert rc == 1 and out == "" and "no member 'nope.raw'" in err, err
    with pytest.raises(ValueError, match="no member 'nope.raw'"):
        imgcopy.checksum(tar, member="nope.raw")


def test_convert_checksum_names_the_member(archive, extracted, tmp_path, capfdbinary):
    fmt, tar, _ = archive
    if fmt != "pax":
        pytest.skip("one archive format is enough for the command line")
    dst = str(tmp_path / "c.raw")
    rc, out, err = _run_cli(capfdbinary, "convert", "--checksum=sha256", "--member", "disk.qcow2",
                            tar, dst)
    want = imgcopy.checksum(extracted["./disk.qcow2"], format="qcow2")
    assert (rc, out) == (0, f"{want}  {tar}/disk.qcow2\n"), err
    rc, out, err = _run_cli(capfdbinary, "convert", "--checksum=sha256", dst, dst + ".2")
    assert (rc, out) == (0, f"{want}  {dst}\n"), err


def _poked(src, kind, tmp_path, offset):
    """src as raw, one byte changed at offset."""
    out = str(tmp_path / "poked.raw")
    qemu_img("convert", "-f", kind, "-O", "raw", src, out)
    with open(out, "r+b") as f:
        f.seek(offset)
        old = f.read(1)
        f.seek(offset)
        f.write(bytes([old[0] ^ 0x5a]))
    return out


def test_compare_members(archive, extracted, tmp_path, capfdbinary):
    fmt, tar, asked = archive
    for ask, (stored, kind) in asked.items():
        out = extracted[stored]
        r = imgcopy.compare(tar, out, a_member=ask, b_format=kind)
        assert r.identical and r.message == "Images are identical.", (fmt, ask)
        assert imgcopy.compare(out, tar, b_member=ask)
        size = imgcopy.info(out, kind).virtual_size
        poked = _poked(out, kind, tmp_path, size * 2 // 3)
        q = qemu_img("compare", "-f", kind, "-F", "raw", out, poked, check=False)
        assert q.returncode == 1, q.stdout
        r = imgcopy.compare(tar, poked, a_member=ask, b_format="raw")
        assert not r.identical and r.message + "\n" == q.stdout, (fmt, ask)
        rc, o, e = _run_cli(capfdbinary, "compare", "--a-member", ask, "-F", "raw", tar, poked)
        assert (rc, o) == (1, q.stdout), e
        os.unlink(poked)
    # both sides members, of the same archive
    assert imgcopy.compare(tar, tar, a_member="disk.qcow2", b_member="./disk.qcow2")
    r = imgcopy.compare(tar, tar, a_member="disk.qcow2", b_member="vm/top.qcow2")
    q = qemu_img("compare", extracted["./disk.qcow2"], extracted["vm/top.qcow2"], check=False)
    assert r.lines == q.stdout.splitlines()
    rc, o, e = _run_cli(capfdbinary, "compare", "--a-member", "disk.qcow2", "--b-member",
                        "vm/top.qcow2", tar, tar)
    assert (rc, o) == (q.returncode, q.stdout), e
    # a member that is not there: qemu-img's exit code 2, named as archive/member
    # (the archive itself is no disk: the other side names a member too)
    rc, o, e = _run_cli(capfdbinary, "compare", "--a-member", "disk.qcow2", "--b-member",
                        "nope.raw", tar, tar)
    assert rc == 2 and f"Could not open '{tar}/nope.raw'" in e and "no member" in e, e
    # an archive without a member: the remedy is compare()'s keyword for that side
    with pytest.raises(ImageFormatError) as exc:
        imgcopy.compare(extracted["big.raw"], tar)
    assert "b_member=" in str(exc.value) and "(pass member=" not in str(exc.value)
    assert all(set(r.options) <= {"b_member", "b_format"} for r in exc.value.remedies)


def test_check_member(archive, extracted, capfdbinary):
    fmt, tar, _ = archive
    for ask, stored in (("disk.qcow2", "./disk.qcow2"), ("vm/top.qcow2", "vm/top.qcow2")):
        out = extracted[stored]
        q = qemu_img("check", "--output=json", out)
        want = json.loads(q.stdout)
        r = imgcopy.check(tar, member=ask)
        assert r.ok and r.member == ask and r.filename == tar
        got = json.loads(r.to_json())
        assert got.pop("filename") == tar and want.pop("filename") == out
        assert got == want, (fmt, ask)
        rc, o, e = _run_cli(capfdbinary, "check", "--member", ask, tar)
        assert (rc, o) == (0, qemu_img("check", out).stdout), e
    # a raw member has no checks, as qemu-img check of the extracted file says
    q = qemu_img("check", "-f", "raw", extracted["big.raw"], check=False)
    assert q.returncode == 63
    with pytest.raises(OSError) as exc:
        imgcopy.check(tar, member="big.raw")
    assert exc.value.errno == errno.ENOTSUP
    rc, o, e = _run_cli(capfdbinary, "check", "--member", "big.raw", tar)
    assert rc == 63 and "does not support checks" in e
    with pytest.raises(ValueError, match="no member 'nope'"):
        imgcopy.check(tar, member="nope")


def test_measure_member(archive, extracted, capfdbinary):
    fmt, tar, asked = archive
    for ask, (stored, kind) in asked.items():
        out = extracted[stored]
        for out_fmt in ("raw", "qcow2"):
            want = qemu_measure(out, fmt=kind, out_fmt=out_fmt)
            got = imgcopy.measure(tar, member=ask, dst_format=out_fmt)
            assert got.to_dict() == want, (fmt, ask, out_fmt)
            assert imgcopy.measure(tar, src_member=ask, dst_format=out_fmt) == got
        rc, o, e = _run_cli(capfdbinary, "measure", "--output=json", "-O", "qcow2",
                            "--member", ask, tar)
        assert (rc, json.loads(o)) == (0, qemu_measure(out, fmt=kind)), e
    rc, o, e = _run_cli(capfdbinary, "measure", "--member", "nope", tar)
    assert rc == 1 and f"Could not open '{tar}/nope'" in e and "no member 'nope'" in e, e
    rc, o, e = _run_cli(capfdbinary, "measure", "--member", "x", "--size", "1M")
    assert rc == 1 and "--member requires a filename" in e
    # an archive without a member: the remedy spelt as the flag
    rc, o, e = _run_cli(capfdbinary, "measure", tar)
    assert rc == 1 and f"Could not open '{tar}'" in e and "--member " in e, e
    with pytest.raises(ImageFormatError, match=r"\(pass member="):
        imgcopy.measure(tar)
    with pytest.raises(ValueError, match="no member 'nope'"):
        imgcopy.measure(tar, member="nope")


def test_measure_member_bitmaps(tmp_path):
    """A qcow2 member's persistent bitmaps are read from the member (not
    from the archive's first bytes)."""
    q = str(tmp_path / "bm.qcow2")
    qemu_img("create", "-f", "qcow2", q, "64M")
    qemu_io(q, ["write -P 0x3c 1M 256k"], fmt="qcow2")
    qemu_img("bitmap", "--add", "-g", "64k", q, "b1")
    qemu_img("bitmap", "--add", "-g", "1M", q, "second-bitmap")
    tar = str(tmp_path / "bm.ova")
    ta.build(tar, [("vm.ovf", _small(tmp_path)), ("bm.qcow2", q)], "gnu")
    want = qemu_measure(q, fmt="qcow2")
    assert want["bitmaps"] > 0
    assert imgcopy.measure(tar, member="bm.qcow2", dst_format="qcow2").to_dict() == want


def test_verification_tools_take_member_and_external_files():
    """member and external_files, spelt as open() spells them, on every tool."""
    import inspect
    for func, names in ((imgcopy.checksum, ("member", "external_files")),
                        (imgcopy.check, ("member", "external_files")),
                        (imgcopy.compare, ("a_member", "b_member", "external_files")),
                        (imgcopy.measure, ("member", "src_member", "src_external_files"))):
        params = inspect.signature(func).parameters
        for name in names:
            assert params[name].kind is inspect.Parameter.KEYWORD_ONLY, (func, name)
    with pytest.raises(TypeError, match="member"):
        imgcopy.check("x.tar", member=3)
    with pytest.raises(TypeError, match="both name the source's member"):
        imgcopy.measure("x.tar", member="a", src_member="b")


# --------------------------------------------------------------------------
# hand-built headers: what tarfile does not write

def _write(path, *parts):
    with open(path, "wb") as f:
        for p in parts:
            f.write(p)
    return path


def test_v7_header_signed_checksum_and_pax_records(tmp_path):
    body = random.Random(3).randbytes(5000)
    name = "v7-\xe9t\xe9.raw".encode("latin-1")  # bytes > 127: signed and unsigned sums differ
    records = b""
    for key, value in ((b"path", b"pax/renamed.raw"), (b"size", b"5000")):
        rec = b" " + key + b"=" + value + b"\n"
        n = len(rec) + 2
        records += str(n).encode() + rec
        assert len(str(n)) == 2
    tar = _write(str(tmp_path / "hand.tar"),
                 ta.header(name, 5000, magic="v7", signed_checksum=True), body, ta.pad(5000),
                 ta.header("PaxHeader", len(records), typeflag=b"x", magic="posix"), records,
                 ta.pad(len(records)),
                 ta.header("short", 0, magic="posix"),  # size=5000 from the pax header
                 body, ta.pad(5000),
                 ta.header("disk.raw", 5000, magic="posix", prefix=b"in/a/prefix"), body,
                 ta.pad(5000), ta.end_blocks())
    with tarfile.open(tar, encoding="latin-1") as tf:
        assert [m.name for m in tf.getmembers()][1:] == ["pax/renamed.raw",
                                                         "in/a/prefix/disk.raw"]
    for member in (name.decode("latin-1"), "pax/renamed.raw", "in/a/prefix/disk.raw"):
        if not member.isascii():
            continue  # a latin-1 name is no str member name; found through the checksum below
        with imgcopy.open(tar, "raw", member=member) as img:
            assert img.size == 5000 and img.read(0, 5000) == body
    with pytest.raises(ValueError, match="no member 'short'"):
        imgcopy.open(tar, member="short")


def test_gnu_long_name_and_long_link(tmp_path):
    body = b"\x77" * 1536
    long = ("x" * 700 + "/disk.raw").encode()
    tar = _write(str(tmp_path / "l.tar"),
                 ta.header("././@LongLink", 3000, typeflag=b"K"), b"l" * 3000, ta.pad(3000),
                 ta.header("././@LongLink", len(long) + 1, typeflag=b"L"), long + b"\0",
                 ta.pad(len(long) + 1), ta.header("cut", 1536), body, ta.end_blocks())
    with imgcopy.open(tar, "raw", member=long.decode()) as img:
        assert img.read(0, 1536) == body


def _errors_archive(tmp_path, name="e.tar"):
    a = b"\x41" * 3000
    b = b"\x42" * 2048
    return _write(str(tmp_path / name), ta.header("a.raw", 3000), a, ta.pad(3000),
                  ta.header("b.raw", 2048), b, ta.end_blocks())


def test_missing_member_lists_members(tmp_path):
    tar = _errors_archive(tmp_path)
    with pytest.raises(ValueError, match=r"no member 'c.raw' in the archive \(it has "
                                         r"'a.raw', 'b.raw'\)") as exc:
        imgcopy.open(tar, member="c.raw")
    assert not isinstance(exc.value, ImageFormatError)
    _write(tar, ta.header("dir/", 0, typeflag=b"5"), ta.end_blocks())
    with pytest.raises(ValueError, match="not a regular file"):
        imgcopy.open(tar, member="dir/")


def test_corrupt_checksum(tmp_path):
    tar = _write(str(tmp_path / "c.tar"), ta.header("a.raw", 512, checksum_delta=1),
                 bytes(512), ta.end_blocks())
    with pytest.raises(ImageFormatError, match="bad checksum"):
        imgcopy.open(tar, member="a.raw")


def test_truncated_archive(tmp_path):
    tar = _errors_archive(tmp_path)
    os.truncate(tar, 512 + 1024)
    with pytest.raises(ImageFormatError, match="past the end of the archive"):
        imgcopy.open(tar, member="b.raw")
    with pytest.raises(ImageFormatError, match="'a.raw' .*extends past the end"):
        imgcopy.open(tar, member="a.raw")
    tar = _errors_archive(tmp_path)
    os.truncate(tar, 512 + 3072 + 100)  # inside the next header
    with pytest.raises(ImageFormatError, match="truncated header"):
        imgcopy.open(tar, member="b.raw")
    os.truncate(tar, 512 + 3072)  # no end blocks: the end of the file ends the archive
    with imgcopy.open(tar, "raw", member="a.raw") as img:
        assert img.read(0, 3000) == b"\x41" * 3000


def test_member_past_eof_and_hostile_numbers(tmp_path):
    tar = _write(str(tmp_path / "p.tar"), ta.header("a.raw", 1 * MiB), b"\x01" * 10240)
    with pytest.raises(ImageFormatError, match="extends past the end"):
        imgcopy.open(tar, member="a.raw")
    _write(tar, ta.header("a.raw", (1 << 88) - 1, base256=True), bytes(1024))
    with pytest.raises(ImageFormatError):
        imgcopy.open(tar, member="a.raw")
    _write(tar, ta.header("a.raw", 0, extra={124: b"\xff" * 12}), bytes(1024))
    with pytest.raises(ImageFormatError, match="malformed size"):
        imgcopy.open(tar, member="a.raw")
    _write(tar, ta.header("././@LongLink", 1 << 30, typeflag=b"L"), bytes(1024))
    with pytest.raises(ImageFormatError):
        imgcopy.open(tar, member="a.raw")
    os.truncate(tar, (1 << 30) + 4096)  # present but longer than any name
    with pytest.raises(ImageFormatError, match="longer than"):
        imgcopy.open(tar, member="a.raw")
    _write(tar, ta.header("PaxHeader", 12, typeflag=b"x"), b"99 path=a\n\0\0", bytes(500),
           ta.header("a.raw", 0), ta.end_blocks())
    with pytest.raises(ImageFormatError, match="pax record"):
        imgcopy.open(tar, member="a.raw")


def test_gnu_sparse_member_refused_by_name(tmp_path):
    tar = _write(str(tmp_path / "s.tar"),
                 ta.header("sparse.raw", 512, typeflag=b"S"), b"\x01" * 512,
                 ta.header("after.raw", 512), b"\x02" * 512, ta.end_blocks())
    with pytest.raises(ImageFormatError, match="'sparse.raw' is a GNU sparse file"):
        imgcopy.open(tar, member="sparse.raw")
    with imgcopy.open(tar, "raw", member="after.raw") as img:  # skipped, not refused
        assert img.read(0, 512) == b"\x02" * 512
    gnutar = shutil.which("tar")
    if gnutar is None:
        return
    src = str(tmp_path / "holes.raw")
    make_sparse(src, 1 * MiB, [(64 * KiB, b"\x03" * 4096)])
    _small(tmp_path)
    for fmt in ("gnu", "pax"):
        out = str(tmp_path / ("gnutar-%s.tar" % fmt))
        subprocess.run([gnutar, "--sparse", "--format=" + fmt, "-cf", out, "-C", str(tmp_path),
                        "holes.raw", "small.txt"], check=True)
        with pytest.raises(ImageFormatError, match="GNU sparse"):
            imgcopy.open(out, member="holes.raw")
        with imgcopy.open(out, "raw", member="small.txt") as img:
            assert img.read(0, 11) == b"not a disk\n"


def test_members_cannot_be_written(tmp_path):
    tar = _errors_archive(tmp_path)
    before = open(tar, "rb").read()
    with pytest.raises(ValueError, match="can only be read"):
        imgcopy.open(tar, "raw", "r+", member="a.raw")
    with pytest.raises(ValueError, match="the destination is the source"):
        imgcopy.convert(tar, tar, src_member="a.raw", src_format="raw")
    assert open(tar, "rb").read() == before


def test_not_an_archive(tmp_path):
    p = str(tmp_path / "plain.raw")
    make_sparse(p, 1 * MiB, [(0, b"\x13" * 4096)])
    with pytest.raises(ImageFormatError, match="not a usable tar archive"):
        imgcopy.open(p, member="x")
    with pytest.raises(FileNotFoundError) as exc:
        imgcopy.open(str(tmp_path / "missing.ova"), member="x")
    assert exc.value.filename == str(tmp_path / "missing.ova")
    empty = _write(str(tmp_path / "empty.tar"), ta.end_blocks())
    with pytest.raises(ValueError, match="has no files"):
        imgcopy.open(empty, member="x")


def test_python_keywords_typed():
    with pytest.raises(TypeError):
        imgcopy.open("x.tar", member=3)
    assert sys.modules["imgcopy"].convert.__kwdefaults__["src_member"] is None
    assert imgcopy.plan.__kwdefaults__["src_external_files"] is False


def test_external_files_keyword_travels(tmp_path):
    """external_files reaches the core (a vmdk's extents use it; a raw file
    is the same with or without it)."""
    p = str(tmp_path / "plain.raw")
    make_sparse(p, 1 * MiB + 5, [(4096, b"\x21" * 4096)])
    m = imgcopy.map(p, external_files=True)
    assert m.to_json() == imgcopy.map(p).to_json() == qemu_map(p).text
    assert imgcopy.info(p, external_files=True).virtual_size == 1 * MiB + 5
    with imgcopy.open(p, external_files=True) as img:
        assert img.read(4096, 4) == b"\x21" * 4
    dst = str(tmp_path / "o.raw")
    r = imgcopy.convert(p, dst, src_external_files=True)
    assert _common(imgcopy.plan(p, src_external_files=True).totals()) == _common(r.to_dict())
    assert_same_content(dst, p)
