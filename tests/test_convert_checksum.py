"""convert(..., checksum=, verify=): the source's blkhash from what the copy
reads, equal to imgcopy.checksum() of the source and of the destination
(and to the hashlib reference of what qemu reads), across formats, copy
options and overlays; verify catches a destination that is not the source."""
import os
import random

import pytest

import imgcopy
from imgcopy.cli import main as cli_main

from .gen.sparse import garbage, make_sparse, seeded_bytes
from .oracles import qemu_img, qemu_io
from .servers import needs_libnbd, needs_nbdkit, nbdkit
from .test_checksum import guest_bytes, random_pieces, reference

MiB = 1 << 20


def seeded_raw(path, seed, size=None):
    rng = random.Random(seed)
    size = size or (rng.randrange(2 * MiB, 7 * MiB) // 512 * 512 + 512)
    make_sparse(path, size, random_pieces(rng, size, rng.randrange(2, 9)))
    return size


def source_image(tmp_path, fmt, seed):
    raw = str(tmp_path / "src-base.raw")
    seeded_raw(raw, seed)
    if fmt == "raw":
        return raw
    path = str(tmp_path / ("src." + fmt))
    qemu_img("convert", "-f", "raw", "-O", fmt, raw, path)
    return path


PAIRS = [("raw", "raw"), ("raw", "qcow2"), ("qcow2", "raw"), ("qcow2", "qcow2"),
         ("vhdx", "qcow2"), ("vpc", "raw"), ("vmdk", "qcow2")]


@pytest.mark.parametrize("src_fmt,dst_fmt", PAIRS, ids=["%s-%s" % p for p in PAIRS])
def test_checksum_while_copying(tmp_path, src_fmt, dst_fmt):
    if src_fmt not in imgcopy.image.FORMATS:
        pytest.skip(f"imgcopy does not read {src_fmt} here")
    src = source_image(tmp_path, src_fmt, seed=len(src_fmt) * 10 + len(dst_fmt))
    dst = str(tmp_path / ("dst." + dst_fmt))
    result = imgcopy.convert(src, dst, dst_format=dst_fmt, checksum=True, verify=True)
    want = reference(guest_bytes(src, src_fmt, tmp_path))
    assert result.checksum == want
    assert imgcopy.checksum(src) == want
    assert result.dst_checksum == want == imgcopy.checksum(dst)


@pytest.mark.parametrize("options", [
    {"sparse_threshold": 0},
    {"concurrency": 1, "request_size": "64k"},
    {"out_of_order": False, "request_size": "12k"},
    {"offload": True},
    {"direct": (False, False), "concurrency": 7},
], ids=["fully-allocated", "one-thread", "in-order", "offload", "threads"])
def test_copy_options_do_not_change_it(tmp_path, options):
    src = str(tmp_path / "src.raw")
    seeded_raw(src, 42, size=5 * MiB + 1536)
    dst = str(tmp_path / "dst.raw")
    result = imgcopy.convert(src, dst, checksum="sha256", verify=True, **options)
    assert result.checksum == imgcopy.checksum(src) == result.dst_checksum


def test_compressed_destination_and_algorithms(tmp_path):
    src = str(tmp_path / "src.raw")
    seeded_raw(src, 5, size=3 * MiB + 512)
    for alg, bs in (("md5", 65536), ("blake2b", 4096), ("sha1", 1 << 20), ("SHA2-512", 512)):
        dst = str(tmp_path / ("dst-%s.qcow2" % alg))
        result = imgcopy.convert(src, dst, dst_format="qcow2", compress=True, checksum=alg,
                                 checksum_block_size=bs, verify=True)
        assert result.checksum == imgcopy.checksum(src, alg, bs) == result.dst_checksum
        assert result.checksum == imgcopy.checksum(dst, alg, bs)


def test_backing_chain_source(tmp_path):
    """A qcow2 overlay: what its backing file holds is read (depth > 0)."""
    base_raw = str(tmp_path / "base.raw")
    seeded_raw(base_raw, 9, size=4 * MiB)
    base = str(tmp_path / "base.qcow2")
    qemu_img("convert", "-f", "raw", "-O", "qcow2", base_raw, base)
    top = str(tmp_path / "top.qcow2")
    qemu_img("create", "-f", "qcow2", "-b", "base.qcow2", "-F", "qcow2", top, "4M")
    qemu_io(top, ["write -P 0x33 1M 100k", "write -z 2M 1M"], fmt="qcow2")
    want = reference(guest_bytes(top, "qcow2", tmp_path))
    for dst_fmt in ("raw", "qcow2"):
        dst = str(tmp_path / ("out." + dst_fmt))
        result = imgcopy.convert(top, dst, dst_format=dst_fmt, checksum=True, verify=True)
        assert result.checksum == want == result.dst_checksum


def test_overlay_destination_counts_what_it_skips(tmp_path):
    """convert -B: ranges the destination's backing file holds are not
    copied, yet the source's checksum covers them (they are hashed from
    the source), and the overlay read back through its backing file
    verifies."""
    base_raw = str(tmp_path / "base.raw")
    seeded_raw(base_raw, 11, size=4 * MiB)
    base = str(tmp_path / "base.qcow2")
    qemu_img("convert", "-f", "raw", "-O", "qcow2", base_raw, base)
    top = str(tmp_path / "top.qcow2")
    qemu_img("create", "-f", "qcow2", "-b", "base.qcow2", "-F", "qcow2", top, "6M")
    qemu_io(top, ["write -P 0x44 512k 64k", "write -z 3M 256k", "write -P 0x55 5M 4k"],
            fmt="qcow2")
    dst = str(tmp_path / "new-top.qcow2")
    result = imgcopy.convert(top, dst, dst_format="qcow2", backing_file="base.qcow2",
                             backing_format="qcow2", checksum=True, verify=True)
    assert result.bytes_skipped > 0
    want = reference(guest_bytes(top, "qcow2", tmp_path))
    assert result.checksum == want == result.dst_checksum == imgcopy.checksum(dst)


def test_odd_sized_source(tmp_path):
    """A raw source of 1000 bytes: the checksum covers its 1000 bytes; a
    qcow2 copy (512-rounded by qemu's rules or not) verifies over them."""
    src = str(tmp_path / "odd.raw")
    with open(src, "wb") as f:
        f.write(seeded_bytes(1000, 4))
    for fmt in ("raw", "qcow2"):
        dst = str(tmp_path / ("odd-out." + fmt))
        result = imgcopy.convert(src, dst, dst_format=fmt, checksum=True, verify=True)
        assert result.checksum == reference(seeded_bytes(1000, 4)) == result.dst_checksum


def test_null_target(tmp_path):
    src = str(tmp_path / "src.raw")
    seeded_raw(src, 3)
    result = imgcopy.convert(src, "null:", checksum="md5")
    assert result.checksum == imgcopy.checksum(src, "md5")
    assert result.dst_checksum is None
    with pytest.raises(ValueError, match="null"):
        imgcopy.convert(src, "null:", verify=True)


def test_no_checksum_unless_asked(tmp_path):
    src = str(tmp_path / "src.raw")
    seeded_raw(src, 3)
    result = imgcopy.convert(src, str(tmp_path / "d.raw"))
    assert result.checksum is None and result.dst_checksum is None


def tampered_destination(tmp_path):
    """A deterministic mismatch: -n --target-is-zero into a destination
    that is NOT zero.  The copy skips the source's zero ranges, trusting
    the caller, and the destination keeps its old bytes there."""
    src = str(tmp_path / "src.raw")
    make_sparse(src, 4 * MiB, [(MiB, seeded_bytes(100000, 8))])
    dst = str(tmp_path / "dst.raw")
    garbage(dst, 4 * MiB, seed=1)
    return src, dst


def test_verify_catches_a_mismatch(tmp_path):
    src, dst = tampered_destination(tmp_path)
    with pytest.raises(imgcopy.ChecksumMismatch) as info:
        imgcopy.convert(src, dst, create=False, target_is_zero=True, verify=True)
    exc = info.value
    assert isinstance(exc, imgcopy.Error)
    assert exc.source == imgcopy.checksum(src) and exc.destination == imgcopy.checksum(dst)
    assert exc.source != exc.destination and exc.algorithm == "sha256"
    assert exc.source in str(exc) and exc.destination in str(exc) and "dst.raw" in str(exc)
    # the same copy without the false promise verifies
    result = imgcopy.convert(src, dst, create=False, verify=True)
    assert result.dst_checksum == result.checksum == imgcopy.checksum(src)


def test_bad_checksum_options_touch_nothing(tmp_path):
    src = str(tmp_path / "src.raw")
    seeded_raw(src, 3)
    dst = str(tmp_path / "never.raw")
    with pytest.raises(ValueError, match="unknown checksum algorithm 'nope'"):
        imgcopy.convert(src, dst, checksum="nope")
    with pytest.raises(ValueError, match="block size"):
        imgcopy.convert(src, dst, checksum=True, checksum_block_size=3)
    with pytest.raises(ValueError, match="block size"):
        imgcopy.convert(src, dst, verify=True, checksum_block_size=0)
    with pytest.raises(TypeError):
        imgcopy.convert(src, dst, checksum=5)
    assert not os.path.exists(dst)


@needs_nbdkit
@needs_libnbd
def test_nbd_source(tmp_path):
    with nbdkit("data", '"hello" @1048576 "goodbye"') as srv:
        dst = str(tmp_path / "from-nbd.qcow2")
        result = imgcopy.convert(srv.uri, dst, dst_format="qcow2", checksum=True, verify=True)
    want = "61b8f3a8cea76e16eeff7ce27f1b7711c1f1e437f5038cec17773772a4bded28"
    assert result.checksum == want == result.dst_checksum


def test_cli(tmp_path, capsys):
    src = str(tmp_path / "src.raw")
    seeded_raw(src, 21)
    dst = str(tmp_path / "dst.qcow2")
    assert cli_main(["convert", "-O", "qcow2", "--checksum", "--verify", src, dst]) == 0
    assert capsys.readouterr().out == f"{imgcopy.checksum(src)}  {src}\n"
    assert cli_main(["convert", "--checksum=md5", "--checksum-block-size", "4k", src,
                     str(tmp_path / "d2.raw")]) == 0
    assert capsys.readouterr().out == f"{imgcopy.checksum(src, 'md5', 4096)}  {src}\n"
    assert cli_main(["convert", src, str(tmp_path / "d3.raw")]) == 0
    assert capsys.readouterr().out == ""
    src2, dst2 = tampered_destination(tmp_path)
    assert cli_main(["convert", "-n", "--target-is-zero", "--verify", src2, dst2]) == 1
    err = capsys.readouterr().err
    assert "checksum mismatch" in err and imgcopy.checksum(src2) in err
    assert cli_main(["convert", "--checksum=nope", src, str(tmp_path / "d4.raw")]) == 1
    assert "unknown checksum algorithm" in capsys.readouterr().err


@pytest.mark.parametrize("dst_fmt", ["raw", "qcow2"])
def test_no_second_read(tmp_path, dst_fmt):
    """The checksum costs no read: the copy reads exactly what it reads
    without one (holes and zero clusters not at all)."""
    src = str(tmp_path / "src.qcow2")
    raw = str(tmp_path / "src.raw")
    seeded_raw(raw, 77, size=6 * MiB)
    qemu_img("convert", "-f", "raw", "-O", "qcow2", raw, src)
    plain = imgcopy.convert(src, str(tmp_path / ("a." + dst_fmt)), dst_format=dst_fmt)
    hashed = imgcopy.convert(src, str(tmp_path / ("b." + dst_fmt)), dst_format=dst_fmt,
                             checksum=True)
    assert hashed.bytes_read == plain.bytes_read < 6 * MiB
    assert hashed.read_requests == plain.read_requests
    assert hashed.checksum == imgcopy.checksum(src)
