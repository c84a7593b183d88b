"""imgcopy measure / imgcopy.measure() against qemu-img measure, the oracle:
seeded sources (sparse raw with odd sizes and written zeros, qcow2 with zero
and compressed clusters, backing chains and bitmaps, vhdx/vpc/vmdk made by
qemu-img, samples from other producers, an NBD export) x output layouts
(raw; qcow2 with cluster sizes 512..2M, compat 0.10/1.1, every
preallocation mode, refcount widths, extended L2, a backing file) x --size;
JSON and human output byte for byte, errors message for message and exit
code for exit code; and new images no larger than measure said."""
import bz2
import os
import random

import pytest

import imgcopy
from imgcopy import cli
from imgcopy.measure import MeasureError

from .gen.sparse import make_sparse, seeded_bytes
from .oracles import qemu_img, qemu_io, qemu_io_args, require_qemu_img
from .units import KiB, MiB

pytestmark = pytest.mark.usefixtures("_qemu")

SAMPLES = os.path.join(os.path.dirname(__file__), "data", "qemu-iotests")


@pytest.fixture(scope="module")
def _qemu():
    require_qemu_img()


def qemu_measure(*args, cwd):
    p = qemu_img("measure", *args, cwd=cwd, check=False)
    return p.returncode, p.stdout, p.stderr


def imgcopy_measure(capsys, *args, cwd):
    old = os.getcwd()
    os.chdir(cwd)
    try:
        capsys.readouterr()
        rc = cli.main(["measure", *args])
    finally:
        os.chdir(old)
    out, err = capsys.readouterr()
    return rc, out, err.replace("imgcopy: ", "qemu-img: ")


def assert_twin(capsys, *args, cwd):
    """imgcopy measure ARGS prints what qemu-img measure ARGS prints and
    exits as it does."""
    want = qemu_measure(*args, cwd=cwd)
    got = imgcopy_measure(capsys, *args, cwd=cwd)
    assert got == want, args
    return want


# -- sources -------------------------------------------------------------------

def _random_extents(rng, size, n, max_len):
    out = []
    for _ in range(n):
        length = rng.randrange(1, max_len)
        off = rng.randrange(0, max(1, size - length))
        out.append((off, seeded_bytes(length, rng.randrange(1 << 30))))
    return out


def _build_sources(d):
    """name -> (file name, format) of every source, made in ``d``."""
    rng = random.Random(14)
    src = {}

    def path(name):
        return os.path.join(d, name)

    # sparse raw files with odd sizes and unaligned data
    for seed in range(3):
        r = random.Random(seed)
        size = r.randrange(1 * MiB, 6 * MiB) + r.randrange(1, 511)
        make_sparse(path(f"sparse{seed}.raw"), size, _random_extents(r, size, 12, 80 * KiB))
        src[f"sparse{seed}"] = (f"sparse{seed}.raw", "raw")
    # data at both ends and nothing else; a tiny file; an empty one
    make_sparse(path("ends.raw"), 3 * MiB + 1001, [(0, b"\x01"), (3 * MiB + 1000, b"\x02")])
    src["ends"] = ("ends.raw", "raw")
    make_sparse(path("tiny.raw"), 1000, [(10, b"x" * 100)])
    src["tiny"] = ("tiny.raw", "raw")
    make_sparse(path("empty.raw"), 0)
    src["empty"] = ("empty.raw", "raw")
    # zeros written as data: counted, there is no content scan
    make_sparse(path("zeros.raw"), 2 * MiB, [(256 * KiB, bytes(300 * KiB)),
                                            (1 * MiB, b"z" * 5000)])
    src["zeros"] = ("zeros.raw", "raw")

    # qcow2: converted (4k clusters), with zero clusters, compressed, v2
    qemu_img("convert", "-f", "raw", "-O", "qcow2", "-o", "cluster_size=4096",
             path("sparse0.raw"), path("conv.qcow2"))
    src["conv"] = ("conv.qcow2", "qcow2")
    qemu_img("create", "-q", "-f", "qcow2", path("zc.qcow2"), "3M")
    qemu_io(path("zc.qcow2"), ["write -P 0x11 0 200k", "write -z 64k 64k",
                               "write -P 0x22 1M 4k", "write -z 1536k 512k",
                               "write -P 0x33 3070k 1k"], fmt="qcow2")
    src["zero_clusters"] = ("zc.qcow2", "qcow2")
    qemu_img("convert", "-c", "-f", "raw", "-O", "qcow2", path("sparse1.raw"),
             path("comp.qcow2"))
    src["compressed"] = ("comp.qcow2", "qcow2")
    qemu_img("convert", "-f", "raw", "-O", "qcow2", "-o", "compat=0.10",
             path("sparse2.raw"), path("v2.qcow2"))
    src["v2"] = ("v2.qcow2", "qcow2")
    # a backing chain: raw base, qcow2 middle, qcow2 top with zeros and data
    qemu_img("create", "-q", "-f", "qcow2", "-b", "ends.raw", "-F", "raw",
             path("mid.qcow2"), cwd=d)
    qemu_io(path("mid.qcow2"), ["write -P 0x44 512k 100k", "write -z 0 64k"], fmt="qcow2")
    qemu_img("create", "-q", "-f", "qcow2", "-o", "cluster_size=16k", "-b", "mid.qcow2",
             "-F", "qcow2", path("top.qcow2"), cwd=d)
    qemu_io(path("top.qcow2"), ["write -P 0x55 100k 3k", "write -z 2M 256k"], fmt="qcow2")
    src["chain"] = ("top.qcow2", "qcow2")
    # persistent bitmaps (one with a long name, one in a v3 image with data)
    qemu_img("create", "-q", "-f", "qcow2", path("bm.qcow2"), "5000k")
    qemu_io(path("bm.qcow2"), ["write -P 0x66 4M 70k"], fmt="qcow2")
    qemu_img("bitmap", "--add", "-g", "65536", path("bm.qcow2"), "bm0")
    qemu_img("bitmap", "--add", "-g", "512", path("bm.qcow2"), "b" * 77)
    qemu_img("bitmap", "--add", "-g", "2M", "--disable", path("bm.qcow2"), "x")
    src["bitmaps"] = ("bm.qcow2", "qcow2")
    # bitmaps left in use (qemu-io opened the image for writing, which marks
    # them so, and died), one with a name of 2-byte UTF-8 characters
    qemu_img("create", "-q", "-f", "qcow2", path("bm-in-use.qcow2"), "3M")
    qemu_img("bitmap", "--add", "-g", "4k", path("bm-in-use.qcow2"), "\u00e9" * 45)
    qemu_img("bitmap", "--add", "--disable", path("bm-in-use.qcow2"), "off")
    qemu_io_args("-f", "qcow2", "-c", "sigraise 9", path("bm-in-use.qcow2"), check=False)
    src["bitmaps-in-use"] = ("bm-in-use.qcow2", "qcow2")

    # metadata preallocation (zero clusters with an offset), an internal
    # snapshot (the active layer counts)
    qemu_img("create", "-q", "-f", "qcow2", "-o", "preallocation=metadata,cluster_size=8k",
             path("meta.qcow2"), "2M")
    qemu_io(path("meta.qcow2"), ["write -P 0x77 300k 9k"], fmt="qcow2")
    src["prealloc_metadata"] = ("meta.qcow2", "qcow2")
    qemu_img("create", "-q", "-f", "qcow2", path("snap.qcow2"), "2M")
    qemu_io(path("snap.qcow2"), ["write -P 0x12 0 256k"], fmt="qcow2")
    qemu_img("snapshot", "-c", "s1", path("snap.qcow2"))
    qemu_io(path("snap.qcow2"), ["write -P 0x13 1M 64k", "write -z 0 128k"], fmt="qcow2")
    src["snapshot"] = ("snap.qcow2", "qcow2")
    # a raw file with a preallocated (fallocated, unwritten) range: data to both
    make_sparse(path("falloc.raw"), 4 * MiB - 100, [(3 * MiB, b"f" * 10)])
    fd = os.open(path("falloc.raw"), os.O_RDWR)
    try:
        os.posix_fallocate(fd, 1 * MiB, 512 * KiB)
    finally:
        os.close(fd)
    src["falloc"] = ("falloc.raw", "raw")

    # foreign formats made by qemu-img, from an odd-sized sparse raw
    make_sparse(path("base.raw"), 3 * MiB + 512 * 3,
                _random_extents(rng, 3 * MiB, 6, 200 * KiB))
    for fmt, opts in [("vpc", "subformat=dynamic"), ("vpc", "subformat=fixed"),
                      ("vhdx", "subformat=dynamic,block_size=1M"), ("vhdx", "subformat=fixed"),
                      ("vmdk", "subformat=monolithicSparse"),
                      ("vmdk", "subformat=streamOptimized")]:
        name = f"{fmt}-{opts.split(',')[0].split('=')[1]}"
        qemu_img("convert", "-f", "raw", "-O", fmt, "-o", opts, path("base.raw"),
                 path(name + "." + fmt))
        src[name] = (name + "." + fmt, fmt)
    # a qcow2 overlay over a VHDX image (all data to qemu)
    qemu_img("create", "-q", "-f", "qcow2", "-b", "vhdx-dynamic.vhdx", "-F", "vhdx",
             path("over-vhdx.qcow2"), cwd=d)
    qemu_io(path("over-vhdx.qcow2"), ["write -P 0x88 64k 64k", "write -z 1M 1M"], fmt="qcow2")
    src["over-vhdx"] = ("over-vhdx.qcow2", "qcow2")
    # images from other producers
    for sample, fmt in [("hyperv2012r2-dynamic.vhd.bz2", "vpc"),
                        ("d2v-zerofilled.vhd.bz2", "vpc"),
                        ("iotest-dynamic-1G.vhdx.bz2", "vhdx"),
                        ("test-disk2vhd.vhdx.bz2", "vhdx"),
                        ("iotest-version3.vmdk.bz2", "vmdk")]:
        name = sample[:-4]
        with bz2.open(os.path.join(SAMPLES, sample)) as f, open(path(name), "wb") as out:
            out.write(f.read())
        src[name] = (name, fmt)
    return src


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("measure"))
    return d, _build_sources(d)


def _readable(fmt):
    return fmt in imgcopy.image.FORMATS


SOURCE_NAMES = ["sparse0", "sparse1", "sparse2", "ends", "tiny", "empty", "zeros", "conv",
                "zero_clusters", "compressed", "v2", "chain", "bitmaps", "bitmaps-in-use",
                "prealloc_metadata",
                "snapshot", "falloc", "over-vhdx", "vpc-dynamic",
                "vpc-fixed", "vhdx-dynamic", "vhdx-fixed", "vmdk-monolithicSparse",
                "vmdk-streamOptimized", "hyperv2012r2-dynamic.vhd", "d2v-zerofilled.vhd",
                "iotest-dynamic-1G.vhdx", "test-disk2vhd.vhdx", "iotest-version3.vmdk"]

# output layouts: -O and -o
LAYOUTS = [
    ("raw", None),
    ("raw", "preallocation=full"),
    ("qcow2", None),
    ("qcow2", "cluster_size=512"),
    ("qcow2", "cluster_size=4k,compat=0.10"),
    ("qcow2", "cluster_size=2M"),
    ("qcow2", "cluster_size=16k,extended_l2=on"),
    ("qcow2", "preallocation=metadata,cluster_size=8k"),
    ("qcow2", "preallocation=falloc"),
    ("qcow2", "preallocation=full,compat=0.10"),
    ("qcow2", "refcount_bits=1,cluster_size=1k"),
    ("qcow2", "refcount_bits=64"),
    ("qcow2", "backing_file=other.qcow2"),
    ("qcow2", "lazy_refcounts=on,compression_type=zlib,cluster_size=128k"),
]


def _layout_args(out_fmt, opts):
    args = ["-O", out_fmt]
    if opts:
        args += ["-o", opts]
    return args


@pytest.mark.parametrize("name", SOURCE_NAMES)
def test_sources_against_qemu(sources, name, capsys):
    """Every layout of every source: JSON and human output as qemu-img's."""
    d, src = sources
    filename, fmt = src[name]
    if not _readable(fmt):
        pytest.skip(f"imgcopy does not read {fmt} images in this build")
    for i, (out_fmt, opts) in enumerate(LAYOUTS):
        args = _layout_args(out_fmt, opts)
        # the format named (-f) or probed (not a fixed VHD: qemu 7.2 probes
        # it as raw, imgcopy as vpc), JSON or human
        args += ["-f", fmt] if i % 2 or name == "vpc-fixed" else []
        args += ["--output=json"] if i % 3 else []
        rc, out, err = assert_twin(capsys, *args, filename, cwd=d)
        assert rc == 0, (args, err)


def test_python_api_agrees(sources):
    """measure() gives the CLI's numbers: keywords, Qcow2Options, an open Image."""
    d, src = sources
    import json
    for name in ["sparse1", "chain", "bitmaps", "bitmaps-in-use", "compressed"]:
        filename, fmt = src[name]
        path = os.path.join(d, filename)
        for out_fmt, opts in LAYOUTS[:8]:
            args = ["--output=json"] + _layout_args(out_fmt, opts) + [path]
            want = json.loads(qemu_img("measure", *args).stdout)
            keywords = {}
            for item in (opts or "").split(","):
                if item:
                    k, v = item.split("=")
                    keywords[k] = v
            if "extended_l2" in keywords:
                keywords["extended_l2"] = keywords["extended_l2"] == "on"
            r = imgcopy.measure(path, dst_format=out_fmt, **keywords)
            assert r.to_dict() == want, (name, opts)
            assert (r.required, r.fully_allocated) == (want["required"],
                                                      want["fully-allocated"])
            assert r.bitmaps == want.get("bitmaps")
        with imgcopy.open(path) as img:
            r = imgcopy.measure(img, dst_format="qcow2",
                                create_options=imgcopy.Qcow2Options(cluster_size="4k",
                                                                    compat="0.10"))
        want = json.loads(qemu_img("measure", "--output=json", "-O", "qcow2", "-o",
                                   "cluster_size=4k,compat=0.10", path).stdout)
        assert r.to_dict() == want


SIZES = ["0", "1", "512", "1000", "65537", "1.5M", "1G", "1073741947", "10G", "2T",
         "2199023255557", "1P", "0x100", "1.0005k", " +7k", "1.k", "0x1k", "010", "7.99E"]
SIZE_LAYOUTS = [("raw", None), ("qcow2", None), ("qcow2", "cluster_size=512"),
                ("qcow2", "cluster_size=2M,refcount_bits=64"),
                ("qcow2", "cluster_size=32k,extended_l2=on,preallocation=full"),
                ("qcow2", "compat=0.10,preallocation=metadata"),
                ("qcow2", "refcount_bits=2,cluster_size=4k")]


@pytest.mark.parametrize("out_fmt,opts", SIZE_LAYOUTS)
def test_size_against_qemu(tmp_path, out_fmt, opts, capsys):
    """--size N: every size, both outputs (too large images refused alike)."""
    for i, size in enumerate(SIZES):
        args = _layout_args(out_fmt, opts) + ["--size", size]
        args += ["--output=json"] if i % 2 else []
        assert_twin(capsys, *args, cwd=tmp_path)


ERRORS = [
    [],
    ["a.raw", "b.raw"],
    ["--size", "1M", "a.raw"],
    ["-f", "raw", "--size", "1M"],
    ["-l", "snap", "--size", "1M"],
    ["--size", "1M", "--output=xml"],
    ["--size", "1Q"],
    ["--size", "-1"],
    ["--size", "8E"],
    ["--size", "1.5"],
    ["--size", "1.5e3k"],
    ["--size", "1M", "-O", "foo"],
    ["--size", "1M", "-O", "vmdk"],
    ["--size", "1M", "-O", "dmg"],
    ["--size", "1M", "-O", "qcow2", "-o", "foo=bar"],
    ["--size", "1M", "-O", "qcow2", "-o", "help"],
    ["--size", "1M", "-O", "raw", "-o", "cluster_size=4k"],
    ["--size", "1M", "-O", "qcow2", "-o", "cluster_size=1000"],
    ["--size", "1M", "-O", "qcow2", "-o", "cluster_size=4M"],
    ["--size", "1M", "-O", "qcow2", "-o", "cluster_size="],
    ["--size", "1M", "-O", "qcow2", "-o", "cluster_size=20E"],
    ["--size", "1M", "-O", "qcow2", "-o", "cluster_size=4k,extended_l2=on"],
    ["--size", "1M", "-O", "qcow2", "-o", "extended_l2=ON"],
    ["--size", "1M", "-O", "qcow2", "-o", "compat=v3"],
    ["--size", "1M", "-O", "qcow2", "-o", "compat=0.10,refcount_bits=8"],
    ["--size", "1M", "-O", "qcow2", "-o", "refcount_bits=3"],
    ["--size", "1M", "-O", "qcow2", "-o", "refcount_bits=abc"],
    ["--size", "1M", "-O", "qcow2", "-o", "refcount_bits=99999999999999999999999"],
    ["--size", "1M", "-O", "qcow2", "-o", "preallocation=bogus"],
    ["--size", "1M", "-O", "qcow2", "-o", "cluster_size=4k,"],
    ["--size", "1M", "-O", "qcow2", "-o", ",cluster_size=4k"],
    ["--size", "1M", "-O", "qcow2", "-o", ""],
    ["--size", "1M", "-O", "qcow2", "-o", "cluster_size=4k,,"],
    ["--size", "1M", "-O", "qcow2", "-o", "=4k"],
    ["--size", "3G", "-O", "qcow2", "-o", "cluster_size=512"],
    ["--size", "1M", "-O", "raw", "-o", "nocow=x"],
    ["nonexist.raw"],
    ["-O", "foo", "nonexist.raw"],
]

ACCEPTED = [
    ["--size", "1G", "-O", "qcow2", "-o", "extended_l2,cluster_size=16k"],
    ["--size", "1G", "-O", "qcow2", "-o", "noextended_l2,cluster_size=16k"],
    ["--size", "1G", "-O", "qcow2", "-o", "extended_l2=y,cluster_size=16k"],
    ["--size", "1G", "-O", "qcow2", "-o", "cluster_size=64k", "-o", "cluster_size=4k"],
    ["--size", "1G", "-O", "qcow2", "-o", "refcount_bits=010,cluster_size=0x1000"],
    ["--size", "1G", "-O", "qcow2", "-o", "backing_file=a,,b,backing_fmt=qcow2"],
    ["--size", "1G", "-O", "qcow2", "-o", "size=1T,id=x,nocow=on,extent_size_hint=1M"],
    ["--size", "1G", "-O", "qcow2", "-o", "encryption=off,data_file=x,data_file_raw=off"],
    ["--size", "1M", "-O", "raw", "-o", "preallocation=metadata"],
    ["--size", "1M", "--size", "2M", "-O", "raw", "-O", "qcow2"],
    ["--size=1M", "--output", "json", "-Oqcow2", "-ocompat=0.10"],
    ["--size", "1M", "-U"],
]


@pytest.mark.parametrize("args", ERRORS + ACCEPTED, ids=lambda a: " ".join(a) or "(none)")
def test_arguments_against_qemu(tmp_path, args, capsys):
    """Usage and option errors: qemu-img's messages (imgcopy: for qemu-img:)
    and exit codes; options it accepts, accepted alike."""
    assert_twin(capsys, *args, cwd=tmp_path)


def test_source_size_option_limit(sources, capsys):
    """With a source, qemu's "too large" check sees -o size, not the source."""
    d, src = sources
    filename = src["sparse0"][0]
    for opts in ["cluster_size=512,size=3G", "cluster_size=512,size=1G"]:
        assert_twin(capsys, "-O", "qcow2", "-o", opts, filename, cwd=d)


def test_refused_clearly(sources, capsys):
    """What imgcopy does not do is refused with a message, exit 1."""
    d, src = sources
    filename = src["sparse0"][0]
    for args in (["-l", "snap", filename], ["--image-opts", filename],
                 ["-O", "qcow2", "-o", "encrypt.format=luks", filename],
                 ["-O", "luks", "--size", "1M"], ["-x", filename]):
        rc, out, err = imgcopy_measure(capsys, *args, cwd=d)
        assert rc == 1 and out == "" and err, args
    rc, out, err = imgcopy_measure(capsys, "-f", "qcow2", filename, cwd=d)
    want = qemu_measure("-f", "qcow2", filename, cwd=d)
    assert (rc, out) == want[:2]
    assert err.startswith(f"qemu-img: Could not open '{filename}': ")
    rc, out, err = imgcopy_measure(capsys, "--help", cwd=d)
    assert rc == 0 and "--size N" in out


def test_python_errors(sources):
    d, src = sources
    path = os.path.join(d, src["sparse0"][0])
    with pytest.raises(ValueError):
        imgcopy.measure()
    with pytest.raises(ValueError):
        imgcopy.measure(path, size=1)
    with pytest.raises(MeasureError, match="Cluster size must be a power of two"):
        imgcopy.measure(path, dst_format="qcow2", cluster_size=3000)
    with pytest.raises(MeasureError, match="require compatibility level 1.1"):
        imgcopy.measure(size="1M", dst_format="qcow2", compat="0.10", refcount_bits=8)
    with pytest.raises(MeasureError, match="Invalid parameter 'cluster_size'"):
        imgcopy.measure(path, cluster_size=4096)
    with pytest.raises(MeasureError, match="does not support size measurement"):
        imgcopy.measure(path, dst_format="vmdk")
    with pytest.raises(MeasureError, match="too large"):
        imgcopy.measure(size="1P", dst_format="qcow2", cluster_size=512)
    with pytest.raises(FileNotFoundError):
        imgcopy.measure(os.path.join(d, "nonexist"))
    r = imgcopy.measure(size=1000)
    assert r.to_json() == '{\n    "required": 1024,\n    "fully-allocated": 1024\n}\n'
    assert r.to_human() == "required size: 1024\nfully allocated size: 1024\n"


def test_nbd_source(sources, capsys):
    """An NBD export measured over its URI, as qemu-img measures it."""
    from .servers import qemu_nbd

    d, src = sources
    for name in ("sparse1", "chain"):
        filename, fmt = src[name]
        with qemu_nbd(os.path.join(d, filename), fmt, read_only=True) as srv:
            for layout in (["-O", "raw"], ["-O", "qcow2", "-o", "cluster_size=4k"],
                           ["--output=json", "-O", "qcow2"]):
                rc, out, err = assert_twin(capsys, *layout, srv.uri, cwd=d)
                assert rc == 0, err


@pytest.mark.parametrize("name,opts", [
    ("sparse0", "cluster_size=4k"), ("zeros", "cluster_size=64k"),
    ("chain", "cluster_size=512"), ("compressed", "cluster_size=2M"),
    ("vhdx-dynamic", "compat=0.10"), ("tiny", "cluster_size=64k,preallocation=metadata"),
    ("bitmaps", "cluster_size=16k"),
])
def test_new_images_fit(sources, tmp_path, name, opts):
    """imgcopy convert's and qemu-img convert's new qcow2 images are no
    larger than the required size measure reports."""
    d, src = sources
    filename, fmt = src[name]
    if not _readable(fmt):
        pytest.skip(f"imgcopy does not read {fmt} images in this build")
    path = os.path.join(d, filename)
    keywords = dict(item.split("=") for item in opts.split(","))
    required = imgcopy.measure(path, dst_format="qcow2", **keywords).required
    ours = str(tmp_path / "ours.qcow2")
    imgcopy.convert(path, ours, dst_format="qcow2",
                    create_options=imgcopy.Qcow2Options(**keywords))
    theirs = str(tmp_path / "theirs.qcow2")
    qemu_img("convert", "-O", "qcow2", "-o", opts, path, theirs)
    assert os.path.getsize(ours) <= required
    assert os.path.getsize(theirs) <= required


# each option's plausible values (good ones mostly, a few bad)
_VALUES = {
    "cluster_size": ["512", "4k", "64k", "2M", "0x1000", "16384", "4096b", "1000", "4M", "1.5k"],
    "compat": ["0.10", "1.1", "1.1", "v3"],
    "preallocation": ["off", "metadata", "falloc", "full", "Full"],
    "refcount_bits": ["1", "2", "8", "16", "64", "010", "0x10", " 16", "3", "16 ", "-16"],
    "extended_l2": ["on", "off", "y", "no", "true", "ON"],
    "backing_file": ["b.qcow2", "a,,b", ""],
    "lazy_refcounts": ["on", "off", "yes"],
    "size": ["1G", "5T", "20E", "1.5M"],
    "nocow": ["on", "off"],
    "encrypt.iter-time": ["10", "abc"],
    "compression_type": ["zlib", "zstd"],
    "id": ["x"],
    "foo": ["1"],
    "": ["4k"],
}
_OPTION_NAMES = list(_VALUES)
_WEIGHTS = [6, 3, 4, 4, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1]


def _random_option_list(rng):
    items = []
    for _ in range(rng.randrange(1, 4)):
        name = rng.choices(_OPTION_NAMES, _WEIGHTS)[0]
        if rng.random() < 0.05:
            items.append(rng.choice(["extended_l2", "noextended_l2", "cluster_size", "help"]))
        else:
            items.append(f"{name}={rng.choice(_VALUES[name])}")
    return ",".join(items) + ("," * rng.choice([1, 2]) if rng.random() < 0.05 else "")


def test_random_option_lists_against_qemu(tmp_path, capsys):
    """Seeded -o lists (names known and not, values of every type, good and
    bad, escaped commas, stray commas): accepted, measured and refused as
    qemu-img does, message for message."""
    rng = random.Random(1414)
    for _ in range(80):
        out_fmt = rng.choice(["qcow2", "qcow2", "raw"])
        args = ["-O", out_fmt]
        for _ in range(rng.randrange(1, 3)):
            args += ["-o", _random_option_list(rng)]
        args += ["--size", rng.choice(["1M", "3G", "100G", "1000"])]
        assert_twin(capsys, *args, cwd=tmp_path)


def test_image_in_use(sources, tmp_path, capsys):
    """An image another process writes: refused as qemu-img refuses it,
    measured with -U."""
    import shutil
    import subprocess

    from .oracles import QEMU_IO

    d, src = sources
    for name in ("chain", "sparse1"):
        filename, fmt = src[name]
        busy = str(tmp_path / filename)
        shutil.copy(os.path.join(d, filename), busy)
        if name == "chain":
            for f in ("mid.qcow2", "ends.raw"):
                shutil.copy(os.path.join(d, f), str(tmp_path / f))
        # interactive qemu-io prints its prompt once the image is open (and
        # locked); nothing may probe the image before that, or qemu-io
        # itself would find it in use
        writer = subprocess.Popen([QEMU_IO, "-f", fmt, busy], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE)
        try:
            assert writer.stdout.read(9) == b"qemu-io> ", "qemu-io did not open the image"
            if fmt == "raw":  # qemu lets a raw file written elsewhere be read
                assert assert_twin(capsys, "-O", "qcow2", filename, cwd=tmp_path)[0] == 0
                continue
            assert qemu_measure(filename, cwd=tmp_path)[0] != 0, "qemu-io holds no lock"
            rc, out, err = assert_twin(capsys, "-O", "qcow2", filename, cwd=tmp_path)
            assert rc == 1 and "lock" in err
            rc, out, err = assert_twin(capsys, "-U", "-O", "qcow2", filename, cwd=tmp_path)
            assert rc == 0
        finally:
            writer.kill()
            writer.wait()
            writer.stdin.close()
            writer.stdout.close()
