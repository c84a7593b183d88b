"""imgcopy.info() against ``qemu-img info`` (and ``qemu-img check`` for the
compressed-cluster count), on raw and qcow2 images of every shape."""
import json
import os
import subprocess
import sys

import pytest

import imgcopy
from .gen import qcow2_meta
from .gen.raw_kinds import make_image
from .gen.sparse import make_sparse
from .oracles import needs_qemu, qemu_img, qemu_info
from .units import MiB
from imgcopy.extents import human_size
from imgcopy.info import ImageInfo, chain_to_human, chain_to_json, info_chain

pytestmark = needs_qemu

def without_compressed(i: ImageInfo):
    d = i.to_dict()
    d.pop("compressed-clusters", None)
    human = i.to_human()
    if i.compressed_clusters is not None:
        line = "compressed clusters: %d\n" % i.compressed_clusters
        assert line in human
        human = human.replace(line, "")
    return d, human


# --------------------------------------------------------------------------
# qemu's size strings

@pytest.mark.parametrize("n,text", [
    (0, "0 B"), (1, "1 B"), (999, "999 B"), (1000, "0.977 KiB"), (1023, "0.999 KiB"),
    (1024, "1 KiB"), (1376256, "1.31 MiB"), (1000448, "977 KiB"), (1023999, "1e+03 KiB"),
    (1 << 30, "1 GiB"), (6 << 40, "6 TiB"), (1 << 62, "4 EiB")])
def test_human_size_is_qemus(n, text):
    assert human_size(n) == text


# --------------------------------------------------------------------------
# raw: the whole output is qemu's, byte for byte

RAW_KINDS = [("holes_and_data", 1), ("odd_size", 2), ("empty", 0), ("tiny", 3), ("all_data", 4),
             ("big_sparse", 5), ("last_byte", 6)]


@pytest.mark.parametrize("kind,seed", RAW_KINDS, ids=["%s-%d" % k for k in RAW_KINDS])
def test_raw_matches_qemu_img_info(tmp_path, kind, seed):
    path = str(tmp_path / ("%s.img" % kind))
    size = make_image(path, kind, seed)
    i = imgcopy.info(path)
    assert i.format == "raw" and i.virtual_size == size    # exact, unlike qemu's
    assert i.to_json() == qemu_img("info", "--output=json", path).stdout
    assert i.to_human() == qemu_img("info", path).stdout
    assert i.cluster_size is None and i.compressed_clusters is None
    assert i.backing_filename is None and i.backing_chain == []
    assert i.qemu_virtual_size == -(-size // 512) * 512


def test_raw_forced_on_qcow2_file(qcow2_store):
    b = qcow2_store.get("conv-64k")
    i = imgcopy.info(b.path, format="raw")
    assert i.format == "raw" and i.virtual_size == os.path.getsize(b.path)
    assert i.to_json() == qemu_img("info", "-f", "raw", "--output=json", b.path).stdout


# --------------------------------------------------------------------------
# qcow2: every field qemu prints; compressed clusters as qemu-img check counts them

QCOW2_NAMES = ["uni-c512-v2", "uni-c4096-v3", "uni-c2097152-v2", "uni-c2097152-v3", "odd-64k",
               "odd-64k-v2", "conv-2m", "convc-4k", "convc-64k-v2", "convc-2m", "chain-mid",
               "chain-top", "chain-small", "chain-probe", "tree-over", "prealloc-metadata",
               "frag-backward"]


@pytest.mark.parametrize("name", QCOW2_NAMES)
def test_qcow2_matches_qemu_img_info(qcow2_store, name):
    b = qcow2_store.get(name)
    i = imgcopy.info(b.path)
    d, human = without_compressed(i)
    assert d == qemu_info(b.path)
    # key order too: the JSON text is qemu's but for our extra key
    assert json.dumps(d, indent=4) + "\n" == qemu_img("info", "--output=json", b.path).stdout
    assert human == qemu_img("info", b.path).stdout
    check = json.loads(qemu_img("check", "--output=json", b.path).stdout)
    assert i.compressed_clusters == check.get("compressed-clusters", 0)
    assert i.cluster_size == b.cluster_size
    assert i.virtual_size == b.size
    assert [p for p, _ in i.backing_chain] == [p for p, _ in imgcopy.open(b.path).backing_chain]


def test_compressed_counts_are_not_zero(qcow2_store):
    # the images above do hold compressed clusters: the comparison means something
    for name in ("convc-4k", "convc-2m", "chain-top", "chain-mid"):
        assert imgcopy.info(qcow2_store.get(name).path).compressed_clusters > 0, name


def test_probed_backing_format_is_not_reported(qcow2_store):
    i = imgcopy.info(qcow2_store.get("chain-probe").path)
    assert i.backing_filename is not None and i.backing_filename_format is None
    assert i.backing_chain[0][1] == "qcow2"     # probed, as qemu does


def test_relative_names_from_another_directory(qcow2_store, monkeypatch):
    top = qcow2_store.get("tree-over")
    cwd = os.path.dirname(os.path.dirname(top.path))
    rel = os.path.relpath(top.path, cwd)
    monkeypatch.chdir(cwd)
    i = imgcopy.info(rel)
    assert i.filename == rel
    assert i.backing_filename is not None and i.full_backing_filename != i.backing_filename
    assert without_compressed(i)[0] == qemu_info(rel, cwd=cwd)
    assert without_compressed(i)[1] == qemu_img("info", rel, cwd=cwd).stdout


def test_backing_chain_like_qemu(qcow2_store):
    b = qcow2_store.get("chain-top")
    infos = info_chain(b.path)
    assert [i.filename for i in infos] == [b.path] + [p for p, _ in b.chain]
    q = qemu_info(b.path, backing_chain=True)
    ours = json.loads(chain_to_json(infos))
    for d in ours:
        d.pop("compressed-clusters", None)
    assert ours == q
    human = chain_to_human(infos)
    for i in infos:
        if i.compressed_clusters is not None:
            human = human.replace("compressed clusters: %d\n" % i.compressed_clusters, "", 1)
    assert human == qemu_img("info", "--backing-chain", b.path).stdout


@pytest.mark.parametrize("bits,dirty,corrupt", [([0], True, False), ([1], False, True),
                                                ([0, 1], True, True)])
def test_dirty_and_corrupt_images(qcow2_store, tmp_path, bits, dirty, corrupt):
    p = str(tmp_path / "flagged.qcow2")
    qcow2_meta.header_patch(qcow2_store.get("convc-4k").path, p, incompatible_set=bits)
    with pytest.raises(imgcopy.ImageFormatError):
        imgcopy.open(p)           # info reads what open refuses without force
    i = imgcopy.info(p)
    assert i.dirty_flag is dirty
    assert i.format_specific is not None and i.format_specific["data"]["corrupt"] is corrupt
    d, human = without_compressed(i)
    assert d == qemu_info(p)
    assert human == qemu_img("info", p).stdout
    assert ("cleanly shut down: no" in human) is dirty


def test_describe_is_what_the_header_says(qcow2_store, tmp_path):
    b = qcow2_store.get("uni-c4096-v3")
    with imgcopy.open(b.path) as img:
        d = img._img.describe()
    assert d["cluster_size"] == 4096 and d["dirty"] is False and d["backing_name"] is None
    assert d["format_specific"] == [("compat", "1.1"), ("compression-type", "zlib"),
                                    ("lazy-refcounts", False), ("refcount-bits", 16),
                                    ("corrupt", False), ("extended-l2", False)]
    assert (d["may_hold_compressed"], d["qemu_sees_all_data"], d["stores_bitmaps"]) == \
        (True, False, True)
    raw = str(tmp_path / "plain.raw")
    make_sparse(raw, MiB)
    with imgcopy.open(raw) as img:
        assert img._img.describe() == {"cluster_size": 0, "dirty": False, "backing_name": None,
                                       "backing_format": None, "backing_location": None,
                                       "format_specific": [], "may_hold_compressed": False,
                                       "qemu_sees_all_data": False, "stores_bitmaps": False}


# what each format's driver says of it (info and measure keep no list of
# formats): (format, qemu-img create options, facts)
FORMAT_FACTS = [
    ("qcow2", ["-o", "compat=0.10"], (True, False, False)),
    ("vmdk", ["-o", "subformat=streamOptimized"], (True, False, False)),
    ("vmdk", ["-o", "subformat=monolithicFlat"], (True, False, False)),
    ("vhdx", [], (False, True, False)),
    ("vpc", [], (False, False, False)),
]


@pytest.mark.parametrize("fmt,opts,facts", FORMAT_FACTS,
                         ids=[f"{f}{o[-1:]}" for f, o, _ in FORMAT_FACTS])
def test_describe_states_the_formats_facts(tmp_path, fmt, opts, facts):
    """The facts, and what they decide: compressed clusters counted where a
    format may hold some, a layer qemu takes as all data measured so (the
    oracle: qemu-img measure of an empty image of that format)."""
    path = str(tmp_path / f"img.{fmt}")
    qemu_img("create", "-q", "-f", fmt, *opts, path, "4M")
    with imgcopy.open(path, fmt) as img:
        d = img._img.describe()
        with pytest.raises(IndexError):
            img._img.describe(1)
    assert (d["may_hold_compressed"], d["qemu_sees_all_data"], d["stores_bitmaps"]) == facts
    assert (imgcopy.info(path, fmt).compressed_clusters is not None) is facts[0]
    want = json.loads(qemu_img("measure", "--output=json", "-f", fmt, "-O", "qcow2",
                               path).stdout)
    assert imgcopy.measure(path, src_format=fmt, dst_format="qcow2").to_dict() == want
    # an empty image: qemu's map says all data only where it has no block status
    assert (want["required"] > 4 * MiB) is facts[1]


def test_describe_down_the_chain(tmp_path):
    """describe(depth): each layer's own header and facts (measure asks
    each for qemu's view of it)."""
    base = str(tmp_path / "base.vhdx")
    top = str(tmp_path / "top.qcow2")
    qemu_img("create", "-q", "-f", "vhdx", base, "4M")
    qemu_img("create", "-q", "-f", "qcow2", "-b", base, "-F", "vhdx", top)
    with imgcopy.open(top) as img:
        layers = [img._img.describe(depth) for depth in range(2)]
        with pytest.raises(IndexError):
            img._img.describe(2)
    assert [d["qemu_sees_all_data"] for d in layers] == [False, True]
    assert layers[0]["backing_name"] == base and layers[1]["backing_name"] is None


def test_backing_name_bytes_as_stored(tmp_path):
    """A backing name that is not UTF-8, and one qemu would probe the format of."""
    base = os.fsencode(str(tmp_path)) + b"/b\xe4se.raw"
    make_sparse(base, MiB)
    top = str(tmp_path / "top.qcow2")
    qemu_img("create", "-q", "-f", "qcow2", "-b", base, "-F", "raw", top)
    i = imgcopy.info(top)
    assert i.backing_filename == os.fsdecode(base) and i.backing_filename_format == "raw"
    d, human = without_compressed(i)
    assert d == qemu_info(top)  # qemu's JSON: U+FFFD for the byte
    qemu_human = subprocess.run(["qemu-img", "info", top], stdout=subprocess.PIPE, check=True)
    assert os.fsencode(human) == qemu_human.stdout  # its text: the byte


def test_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        imgcopy.info(str(tmp_path / "missing.img"))
    with pytest.raises(IsADirectoryError):
        imgcopy.info(str(tmp_path))
    make_sparse(str(tmp_path / "x.raw"), 4096)
    with pytest.raises(ValueError):
        imgcopy.info(str(tmp_path / "x.raw"), format="vmdk")


def test_pathlike_and_bytes(tmp_path):
    p = tmp_path / "p.raw"
    make_sparse(str(p), 3 * MiB, [(MiB, b"x" * 4096)])
    a, b = imgcopy.info(p), imgcopy.info(os.fsencode(str(p)))
    assert a == b and a.filename == str(p)
    assert a.to_dict()["actual-size"] == os.stat(p).st_blocks * 512


# --------------------------------------------------------------------------
# the command line (once cli.py has an info subcommand)

def _cli_has_info() -> bool:
    from imgcopy import cli

    parser = cli._build_parser()
    sub = [a for a in parser._actions if a.dest == "command"][0]
    return sub.choices is not None and "info" in sub.choices


@pytest.mark.parametrize("extra", [[], ["--output=json"], ["--backing-chain"],
                                   ["--backing-chain", "--output=json"]])
def test_cli_info(qcow2_store, imgcopy_env, extra, tmp_path):
    if not _cli_has_info():
        pytest.skip("imgcopy/cli.py has no info subcommand yet")
    b = qcow2_store.get("chain-top")
    # not from the source tree, whose imgcopy/ has no compiled core
    p = subprocess.run([sys.executable, "-m", "imgcopy", "info"] + extra + [b.path],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       env=imgcopy_env, cwd=str(tmp_path))
    assert p.returncode == 0, p.stderr
    infos = info_chain(b.path) if "--backing-chain" in extra else [imgcopy.info(b.path)]
    if "--output=json" in extra:
        want = chain_to_json(infos) if "--backing-chain" in extra else infos[0].to_json()
    else:
        want = chain_to_human(infos) if "--backing-chain" in extra else infos[0].to_human()
    assert p.stdout == want


def test_cli_names_that_are_not_utf8(tmp_path, imgcopy_env):
    """imgcopy map and info print a file's name as qemu-img does: its bytes."""
    base = os.fsencode(str(tmp_path)) + b"/b\xe4se.raw"
    make_sparse(base, MiB, [(4096, b"x" * 4096)])
    top = str(tmp_path / "top.qcow2")
    qemu_img("create", "-q", "-f", "qcow2", "-b", base, "-F", "raw", top)
    for args in (["map", base], ["map", top], ["info", "--backing-chain", top]):
        ours = subprocess.run([sys.executable, "-m", "imgcopy"] + args, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, env=imgcopy_env, cwd=str(tmp_path))
        assert ours.returncode == 0, ours.stderr
        qemu = subprocess.run(["qemu-img"] + args, stdout=subprocess.PIPE, check=True)
        assert ours.stdout.replace(b"compressed clusters: 0\n", b"") == qemu.stdout


def test_cli_info_errors(tmp_path, imgcopy_env):
    if not _cli_has_info():
        pytest.skip("imgcopy/cli.py has no info subcommand yet")
    p = subprocess.run([sys.executable, "-m", "imgcopy", "info", str(tmp_path / "nope")],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       env=imgcopy_env, cwd=str(tmp_path))
    assert p.returncode == 1 and p.stdout == ""
    assert p.stderr.startswith("imgcopy: ") and "nope" in p.stderr


def test_notebook_view(tmp_path):
    p = str(tmp_path / "n.raw")
    make_sparse(p, 3 * MiB, [(0, b"x" * 4096)])
    html = imgcopy.info(p)._repr_html_()
    assert 'class="imgcopy-view imgcopy-image-info"' in html and "<table" in html
    assert "virtual size" in html and "3 MiB" in html and "(3,145,728 B)" in html


# --------------------------------------------------------------------------
# a backing file that is missing or unusable: info describes the image
# alone, as qemu-img info (which never opens it); whatever reads through it
# fails, naming the image it is the backing file of

def _overlay_of_missing(tmp_path):
    d = tmp_path / "vm"
    d.mkdir()
    base = str(d / "base.raw")
    make_sparse(base, MiB)
    qemu_img("create", "-q", "-f", "qcow2", "-b", "base.raw", "-F", "raw", str(d / "o.qcow2"))
    os.unlink(base)
    return d


@pytest.mark.parametrize("relative", [True, False])
def test_missing_backing_file_info_like_qemu(tmp_path, relative, monkeypatch):
    d = _overlay_of_missing(tmp_path)
    path = "o.qcow2" if relative else str(d / "o.qcow2")
    monkeypatch.chdir(str(d))
    i = imgcopy.info(path)
    dd, human = without_compressed(i)
    assert dd == qemu_info(path, cwd=str(d))
    assert human == qemu_img("info", path, cwd=str(d)).stdout
    assert i.backing_filename == "base.raw" and i.backing_chain == []
    assert i.full_backing_filename == ("base.raw" if relative else str(d / "base.raw"))


def test_missing_backing_file_reads_fail(tmp_path):
    d = _overlay_of_missing(tmp_path)
    path = str(d / "o.qcow2")
    assert qemu_img("info", "--backing-chain", path, check=False).returncode != 0
    for call in (lambda: info_chain(path), lambda: imgcopy.map(path),
                 lambda: imgcopy.convert(path, str(tmp_path / "x.raw")),
                 lambda: imgcopy.open(path)):
        with pytest.raises(FileNotFoundError) as e:
            call()
        assert e.value.filename == str(d / "base.raw")
        assert "the backing file of %s" % path in str(e.value), str(e.value)
    assert not os.path.exists(str(tmp_path / "x.raw"))


def test_missing_backing_file_cli(tmp_path, imgcopy_env):
    d = _overlay_of_missing(tmp_path)
    run = lambda *a: subprocess.run([sys.executable, "-m", "imgcopy"] + list(a), cwd=str(d),
                                    capture_output=True, text=True, env=imgcopy_env, timeout=60)
    for extra in ([], ["--output=json"]):
        p = run("info", *extra, "o.qcow2")
        assert p.returncode == 0, p.stderr
        q = qemu_img("info", *extra, "o.qcow2", cwd=str(d)).stdout
        if extra:
            got = json.loads(p.stdout)
            got.pop("compressed-clusters")
            assert got == json.loads(q)
        else:
            assert p.stdout.replace("compressed clusters: 0\n", "") == q
    for args in (["info", "--backing-chain", "o.qcow2"], ["map", "o.qcow2"],
                 ["convert", "o.qcow2", "x.raw"]):
        p = run(*args)
        assert p.returncode == 1 and "base.raw: No such file or directory" in p.stderr, p.stderr
        assert "the backing file of o.qcow2" in p.stderr


def test_backing_loop_info_like_qemu(tmp_path):
    """Two overlays naming each other: qemu-img info shows either; reading
    fails."""
    a, b = str(tmp_path / "a.qcow2"), str(tmp_path / "b.qcow2")
    qemu_img("create", "-q", "-f", "qcow2", a, "1M")
    qemu_img("create", "-q", "-f", "qcow2", "-b", "a.qcow2", "-F", "qcow2", b)
    qemu_img("rebase", "-u", "-b", "b.qcow2", "-F", "qcow2", a)
    assert without_compressed(imgcopy.info(a))[0] == qemu_info(a)
    with pytest.raises(imgcopy.ImageFormatError, match="loops back"):
        imgcopy.map(a)


def test_vmdk_delta_of_a_non_vmdk_parent(tmp_path):
    """qemu-iotests 225: a delta whose parentFileNameHint names a qcow2
    image: info works, map and convert fail."""
    d = str(tmp_path)
    base, delta = os.path.join(d, "base.vmdk"), os.path.join(d, "delta.vmdk")
    qemu_img("create", "-q", "-f", "vmdk", base, "1M")
    qemu_img("create", "-q", "-f", "vmdk", "-b", "base.vmdk", "-F", "vmdk", delta, "1M")
    qemu_img("create", "-q", "-f", "qcow2", base + ".q", "1M")
    os.replace(base + ".q", base)
    q = qemu_info(delta)
    i = imgcopy.info(delta)
    assert (i.format, i.virtual_size, i.backing_filename, i.full_backing_filename,
            i.backing_filename_format) == ("vmdk", q["virtual-size"], q["backing-filename"],
                                           q["full-backing-filename"],
                                           q["backing-filename-format"])
    assert qemu_img("map", delta, check=False).returncode != 0
    for call in (lambda: imgcopy.map(delta), lambda: imgcopy.convert(delta, delta + ".raw")):
        with pytest.raises(imgcopy.ImageFormatError, match="the backing file of " + delta):
            call()


def test_member_with_missing_backing_member(tmp_path):
    """An OVA-like archive lacking the overlay's backing member: info names
    the member it would be."""
    import tarfile
    vm = tmp_path / "vm"
    vm.mkdir()
    qemu_img("create", "-q", "-f", "qcow2", str(vm / "base.qcow2"), "1M")
    qemu_img("create", "-q", "-f", "qcow2", "-b", "base.qcow2", "-F", "qcow2",
             str(vm / "top.qcow2"))
    tar = str(tmp_path / "vm.tar")
    with tarfile.open(tar, "w") as t:
        t.add(str(vm / "top.qcow2"), arcname="d/top.qcow2")
    i = imgcopy.info(tar, member="d/top.qcow2")
    assert (i.backing_filename, i.full_backing_filename, i.backing_chain) == (
        "base.qcow2", "d/base.qcow2", [])
    with pytest.raises(ValueError, match="no member 'd/base.qcow2'"):
        imgcopy.map(tar, member="d/top.qcow2")


def test_results_behave_as_the_dataclasses_they_were():
    """ImageInfo, Snapshot and Bitmap, CompareResult and CheckResult are
    plain classes (importing dataclasses would cost `imgcopy info` most of
    its start): a repr and == over their fields in order, Snapshot and
    Bitmap frozen and hashable, the others mutable and unhashable; they
    copy, pickle and match."""
    import copy
    import pickle

    from imgcopy.info import Snapshot

    a = ImageInfo("a.raw", "raw", 4096, None)
    assert a.snapshots == [] and a.backing_chain == [] and a.backing_members == []
    assert a.snapshots is not ImageInfo("b", "raw", 0, None).snapshots
    assert repr(a).startswith("ImageInfo(filename='a.raw', format='raw', virtual_size=4096, "
                              "actual_size=None, dirty_flag=False, cluster_size=None, ")
    b = ImageInfo(filename="a.raw", format="raw", virtual_size=4096, actual_size=None)
    assert a == b and not (a != b)
    b.cluster_size = 65536
    assert a != b and a != ("a.raw",)
    with pytest.raises(TypeError):
        hash(a)
    assert pickle.loads(pickle.dumps(b)) == b and copy.deepcopy(b) == b

    s = Snapshot(b"1", b"base", 0, 1, 2, 3, None)
    t = Snapshot(id=b"1", name=b"base", vm_state_size=0, date_sec=1, date_nsec=2,
                 vm_clock_nsec=3, icount=None)
    assert s == t and hash(s) == hash(t) and len({s, t}) == 1
    assert repr(s) == ("Snapshot(id=b'1', name=b'base', vm_state_size=0, date_sec=1, "
                       "date_nsec=2, vm_clock_nsec=3, icount=None)")
    with pytest.raises(AttributeError):
        s.name = b"other"
    with pytest.raises(AttributeError):
        del s.name
    assert pickle.loads(pickle.dumps(s)) == s and copy.copy(s) == s

    bm = imgcopy.Bitmap("b0", 65536, False, True)
    assert bm == imgcopy.Bitmap(name="b0", granularity=65536, in_use=False, auto=True)
    assert bm.enabled and bm.consistent and hash(bm) == hash(imgcopy.Bitmap("b0", 65536, False,
                                                                            True))
    with pytest.raises(AttributeError):
        bm.auto = False
    assert pickle.loads(pickle.dumps(bm)) == bm
    assert imgcopy.Bitmap.__match_args__ == ("name", "granularity", "in_use", "auto")

    c = imgcopy.CompareResult(True, "identical", None, "Images are identical.", False, 1, 1,
                              progress=[(100.0, False)])
    assert "progress" not in repr(c) and repr(c).startswith("CompareResult(identical=True, ")
    assert c == imgcopy.CompareResult(True, "identical", None, "Images are identical.", False,
                                      1, 1, progress=[(100.0, False)])
    assert imgcopy.CompareResult(False, "size", None, "", True, 1, 2).progress == []
    k = imgcopy.CheckResult("a.qcow2", "qcow2", leaks=2)
    assert (k.messages, k.member, k.ok, k.exit_code) == ([], None, False, 3)
    assert pickle.loads(pickle.dumps(k)) == k and k != imgcopy.CheckResult("a.qcow2", "qcow2")
