"""imgcopy.checksum() and `imgcopy checksum`: blkhash (>= 0.10) checksums.

Oracles: the published vectors (libnbd's copy-blkhash-known.sh and
blkhash 0.10's blkhash-test.c, i14 spec §1.3), a plain hashlib reference of
the construction fed the guest content that qemu-img itself decodes
(qemu-img convert -O raw), and the same content in every readable format."""
import errno
import hashlib
import os
import random
import subprocess
import sys
import time

import pytest

import imgcopy
from imgcopy.cli import main as cli_main

from .gen.sparse import make_sparse, seeded_bytes
from .oracles import qemu_img, qemu_io
from .servers import needs_libnbd, needs_nbdkit, nbdkit

KiB = 1024
MiB = 1 << 20
H = 32 * KiB


# ---- the reference ------------------------------------------------------

def reference(data, algorithm="sha256", block_size=65536):
    """blkhash's flat construction, straight from the spec."""
    outer = hashlib.new(algorithm)
    for i in range(0, len(data), block_size):
        outer.update(hashlib.new(algorithm, data[i:i + block_size]).digest())
    outer.update(len(data).to_bytes(8, "little"))
    return outer.hexdigest()


def reference_sparse(size, pieces, algorithm="sha256", block_size=65536):
    """The same for a large image of zeros with `pieces` [(offset, bytes)]:
    only the blocks that hold data are built."""
    by_block = {}
    for off, buf in pieces:
        for b in range(off // block_size, (off + len(buf) - 1) // block_size + 1):
            by_block.setdefault(b, []).append((off, buf))
    zero = hashlib.new(algorithm, bytes(block_size)).digest()
    outer = hashlib.new(algorithm)
    nblocks = -(-size // block_size)
    run = 0
    for b in range(nblocks):
        start, end = b * block_size, min(size, (b + 1) * block_size)
        if b not in by_block and end - start == block_size:
            run += 1
            continue
        if run:
            outer.update(zero * run)
            run = 0
        block = bytearray(end - start)
        for off, buf in by_block.get(b, ()):
            lo, hi = max(off, start), min(off + len(buf), end)
            block[lo - start:hi - start] = buf[lo - off:hi - off]
        outer.update(hashlib.new(algorithm, bytes(block)).digest())
    if run:
        outer.update(zero * run)
    outer.update(size.to_bytes(8, "little"))
    return outer.hexdigest()


def guest_bytes(path, fmt, tmp_path):
    """What qemu reads from the image: qemu-img convert -O raw."""
    out = str(tmp_path / ("guest-%s.raw" % os.path.basename(path)))
    qemu_img("convert", "-f", fmt, "-O", "raw", path, out)
    with open(out, "rb") as f:
        return f.read()


# ---- the spec's vectors -------------------------------------------------

HELLO_GOODBYE = b"hello" + bytes(1048576 - 5) + b"goodbye"
PATTERN = b"12345678" * 131072

# (name, [(length, byte or "-" for a hole)], algorithm, block size, hex)
VECTORS = [
    ("empty", b"", "sha256", 65536,
     "af5570f5a1810b7af78caf4bc70a660f0df51e42baf91d4de5b2328de0e83dfc"),
    ("hello-md5", b"hello", "md5", 65536, "f741ac9ce55f5325906bb14e9c05d467"),
    ("hello-sha256", b"hello", "sha256", 65536,
     "337355feb53a5309d5aba92796223c2c84ffab930e706c01fef573a2722545e6"),
    ("hello-sha512", b"hello", "sha512", 65536,
     "eca04a593cf12ec4132993da709048e25a2f1be3526e132fb521ec9d41f023ec4018b3fd07b014a33e36bb5fa145b36991f431e62f9e1a93bebea6c9565682c1"),
    ("hello-md5-4", b"hello", "md5", 4, "8262896de34125dec173722c920e8bd0"),
    ("hello-goodbye", HELLO_GOODBYE, "sha256", 65536,
     "61b8f3a8cea76e16eeff7ce27f1b7711c1f1e437f5038cec17773772a4bded28"),
    ("pattern-md5", PATTERN, "md5", 65536, "84fc21ac2f49ac283ff399378d834d1a"),
    ("pattern-sha256", PATTERN, "sha256", 65536,
     "cbb388edd25e567b85f504c7b345497f9fb4f6bbf4e39768809184b9f9e678f8"),
    ("pattern-sha512-512k", PATTERN, "sha512", 524288,
     "379f7eb1628058c7abbc4c96941ac972074815ea9ef4aca95eefb2b4f9c29f64023fff8d966e9fddf08d07bdba548e75298917f10268fdf9ba636c2321a2214e"),
    ("block_data", [(65536, b"A")], "sha256", 65536,
     "2e3a5f57d5e726ee5de62db1a85ff816f4fa6ea4627807d9a51bdc4c883e165e"),
    ("block_data_zero", [(65536, b"0")], "sha256", 65536,
     "8ab067ab7939a3d4f40cbb118956c07c06aeae2d075d6e0a2ebbb94bd42832af"),
    ("block_zero", [(65536, b"-")], "sha256", 65536,
     "8ab067ab7939a3d4f40cbb118956c07c06aeae2d075d6e0a2ebbb94bd42832af"),
    ("partial_block_data", [(H, b"A")], "sha256", 65536,
     "9467334d6d7668a2f06898185b5cddc78cdfbd962f50c6bf250101f03a0e54dc"),
    ("partial_block_zero", [(H, b"-")], "sha256", 65536,
     "842d185f0ff348b0d689e184bddc47f69a19032a6934c89b879479f1e86f9d56"),
    ("sparse", [(8 * 65536, b"-")], "sha256", 65536,
     "722ac11a3a81034edf196aa3ee68d1a2e345cd0838b0c78c2ce2fb015d4d817d"),
    ("zero", [(8 * 65536, b"0")], "sha256", 65536,
     "722ac11a3a81034edf196aa3ee68d1a2e345cd0838b0c78c2ce2fb015d4d817d"),
    ("sparse_large", [(1 << 30, b"-")], "sha256", 65536,
     "c6d6562c3074a2caa0ceea3e1f460f3af678c792ed05e64157eb51e68ae5260d"),
    ("sparse_unaligned", [(8 * 65536 + H, b"-")], "sha256", 65536,
     "e623a5702b1feb08fbb3d18e35bbb7ec10146b8cd1bcff811200a3948c78c55c"),
    ("full", [(H, c) for c in (b"A", b"B", b"C", b"D", b"E", b"F")], "sha256", 65536,
     "4ab1586084326f5beb911621282e9557cd26856105eff7f78cace5986af4738b"),
    ("full_unaligned", [(H, c) for c in (b"A", b"B", b"C", b"D", b"E")], "sha256", 65536,
     "2cad558b3a2a8d87435e80fe7bae69fa664d92eaa1b9411f573b9fbb412a4d43"),
    ("mix", [(H, b"A"), (H, b"-"), (H, b"-"), (H, b"0"), (H, b"E"), (H, b"-"), (H, b"-"),
             (H, b"0")], "sha256", 65536,
     "4b2b5acd96f8105f4fb26abaf35c7c5756338ef9ccce19ffe7714c9ad94b4398"),
    ("mix_unaligned", [(H, b"A"), (H, b"-"), (H, b"-"), (H, b"0"), (H, b"E"), (H, b"-"),
                       (H, b"-")], "sha256", 65536,
     "2510ac29c7103f2e68c672d728cbd43db4ed3dc809a24cde96e62dc5862a0f57"),
]


def write_vector(path, content):
    """A raw file of the vector's content: "-" extents are holes, "0"
    extents written zeros, other bytes written."""
    if isinstance(content, bytes):
        with open(path, "wb") as f:
            f.write(content)
        return len(content)
    size = sum(n for n, _ in content)
    pieces, pos = [], 0
    for n, c in content:
        if c != b"-":
            pieces.append((pos, b"\0" * n if c == b"0" else c * n))
        pos += n
    make_sparse(path, size, pieces)
    return size


@pytest.mark.parametrize("name,content,alg,bs,want", VECTORS, ids=[v[0] for v in VECTORS])
def test_vectors_raw(tmp_path, name, content, alg, bs, want):
    path = str(tmp_path / (name + ".raw"))
    write_vector(path, content)
    assert imgcopy.checksum(path, alg, bs, format="raw") == want
    # the threads never change the value
    assert imgcopy.checksum(path, alg, bs, format="raw", threads=1) == want


FORMAT_VECTORS = [v for v in VECTORS if v[0] in (
    "hello-goodbye", "pattern-sha256", "pattern-sha512-512k", "block_data", "sparse",
    "sparse_unaligned", "full_unaligned", "mix", "mix_unaligned")]


@pytest.mark.parametrize("fmt", ["qcow2", "vhdx", "vpc", "vmdk"])
def test_vectors_in_other_formats(tmp_path, fmt):
    """The same content converted by qemu-img hashes the same: the
    vector's value when the format keeps the size, else the reference of
    the content padded with zeros to the format's virtual size."""
    if fmt not in imgcopy.image.FORMATS:
        pytest.skip(f"imgcopy does not read {fmt} here")
    for name, content, alg, bs, want in FORMAT_VECTORS:
        raw = str(tmp_path / (name + ".raw"))
        size = write_vector(raw, content)
        img = str(tmp_path / (name + "." + fmt))
        qemu_img("convert", "-f", "raw", "-O", fmt, raw, img)
        with imgcopy.open(img, fmt) as opened:
            vsize = opened.size
        got = imgcopy.checksum(img, alg, bs)
        if vsize == size:
            assert got == want, (name, fmt)
        else:
            with open(raw, "rb") as f:
                data = f.read()
            assert got == reference(data + bytes(vsize - size), alg, bs), (name, fmt, vsize)


@needs_nbdkit
@needs_libnbd
@pytest.mark.parametrize("expr,alg,bs,want", [
    ('"hello"', "sha256", 65536,
     "337355feb53a5309d5aba92796223c2c84ffab930e706c01fef573a2722545e6"),
    ('"hello" @1048576 "goodbye"', "sha256", 65536,
     "61b8f3a8cea76e16eeff7ce27f1b7711c1f1e437f5038cec17773772a4bded28"),
    ('"12345678"*512*256', "sha512", 524288,
     "379f7eb1628058c7abbc4c96941ac972074815ea9ef4aca95eefb2b4f9c29f64023fff8d966e9fddf08d07bdba548e75298917f10268fdf9ba636c2321a2214e"),
])
def test_vectors_over_nbd(expr, alg, bs, want):
    """libnbd's copy-blkhash-known.sh, as it runs them: nbdkit's data plugin."""
    with nbdkit("data", expr) as srv:
        assert imgcopy.checksum(srv.uri, alg, bs) == want


# ---- seeded images against the reference --------------------------------

def random_pieces(rng, size, count):
    pieces = []
    for _ in range(count):
        n = min(size, rng.randrange(1, 300 * KiB))
        off = rng.randrange(0, size - n + 1)
        buf = bytearray(rng.randbytes(n))
        if rng.random() < 0.3:  # written zeros inside data
            z = rng.randrange(0, n)
            buf[z:z + rng.randrange(1, 128 * KiB)] = bytes(min(n - z, 128 * KiB))
            buf = buf[:n]
        pieces.append((off, bytes(buf)))
    return pieces


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("alg,bs", [("sha256", 65536), ("sha1", 4096), ("md5", 1 << 20),
                                    ("blake2b", 65536 + 2), ("sha3_256", 512)])
def test_seeded_sparse_raw(tmp_path, seed, alg, bs):
    rng = random.Random(seed * 1000 + bs)
    size = rng.randrange(1, 6 * MiB) | 1  # odd, sometimes tiny
    path = str(tmp_path / "s.raw")
    make_sparse(path, size, random_pieces(rng, size, rng.randrange(0, 8)))
    with open(path, "rb") as f:
        data = f.read()
    want = reference(data, alg, bs)
    assert imgcopy.checksum(path, alg, bs, threads=1 + seed) == want


def test_qcow2_chain_zero_and_compressed_clusters(tmp_path):
    """qcow2 with a backing file, zero clusters, compressed clusters and
    an odd-sized backing file: the checksum is that of what qemu reads."""
    base_raw = str(tmp_path / "base.raw")
    rng = random.Random(7)
    make_sparse(base_raw, 3 * MiB + 512, random_pieces(rng, 3 * MiB, 5))
    base = str(tmp_path / "base.qcow2")
    qemu_img("convert", "-c", "-f", "raw", "-O", "qcow2", base_raw, base)
    top = str(tmp_path / "top.qcow2")
    qemu_img("create", "-f", "qcow2", "-b", "base.qcow2", "-F", "qcow2", top, "5M")
    qemu_io(top, ["write -P 0x5a 100k 200k", "write -z 1M 512k", "write -z -u 2M 64k",
                  "write -P 0x11 4M 4k", "discard 2560k 64k"], fmt="qcow2")
    data = guest_bytes(top, "qcow2", tmp_path)
    for alg in ("sha256", "blake2b", "md5"):
        assert imgcopy.checksum(top, alg) == reference(data, alg)
    assert imgcopy.checksum(base, "sha1", 4096) == reference(
        guest_bytes(base, "qcow2", tmp_path), "sha1", 4096)


def test_holes_are_not_read(tmp_path):
    """A 64 GiB raw file with a few KiB of data: reading its holes would
    take many seconds; the extent map makes them free."""
    path = str(tmp_path / "big.raw")
    size = (64 << 30) + 1000
    pieces = [(5 * MiB + 3, b"data" * 1000), (40 << 30, seeded_bytes(70000, 3))]
    make_sparse(path, size, pieces)
    t0 = time.monotonic()
    got = imgcopy.checksum(path)
    elapsed = time.monotonic() - t0
    assert got == reference_sparse(size, pieces)
    assert elapsed < 3, elapsed


def test_openssl_names_and_threads(tmp_path):
    path = str(tmp_path / "a.raw")
    make_sparse(path, 3 * MiB + 7, [(1000, seeded_bytes(MiB, 1))])
    assert imgcopy.checksum(path, "SHA2-256") == imgcopy.checksum(path, "sha256")
    assert imgcopy.checksum(path, "BLAKE2b512") == imgcopy.checksum(path, "blake2b")
    one = imgcopy.checksum(path, "sha256", 4096, threads=1)
    assert imgcopy.checksum(path, "sha256", "4k", threads=7) == one
    assert "sha256" in imgcopy.checksum_algorithms()
    assert {"md5", "sha1", "sha256", "sha512", "blake2b"} <= set(imgcopy.checksum_algorithms())


def test_progress_is_reported(tmp_path):
    path = str(tmp_path / "a.raw")
    make_sparse(path, 8 * MiB, [(0, seeded_bytes(8 * MiB, 2))])
    seen = []
    imgcopy.checksum(path, progress=lambda done, total: seen.append((done, total)))
    assert all(total == 8 * MiB and 0 <= done <= total for done, total in seen)


# ---- errors -------------------------------------------------------------

def test_unknown_algorithm_lists_supported(tmp_path):
    path = str(tmp_path / "a.raw")
    make_sparse(path, 1000)
    with pytest.raises(ValueError, match="unknown checksum algorithm 'sha257'.*sha256.*blake2b"):
        imgcopy.checksum(path, "sha257")
    with pytest.raises(ValueError, match="block size must be even"):
        imgcopy.checksum(path, "sha256", 65537)
    with pytest.raises(ValueError, match="block size must be even"):
        imgcopy.checksum(path, "sha256", 0)


def test_missing_libcrypto_is_a_clear_error(tmp_path):
    path = str(tmp_path / "a.raw")
    make_sparse(path, 1000)
    code = ("import errno, imgcopy, sys\n"
            "try:\n"
            "    imgcopy.checksum(sys.argv[1])\n"
            "except OSError as exc:\n"
            "    assert exc.errno == errno.ENOSYS, exc.errno\n"
            "    print(exc)\n")
    env = dict(os.environ, IMGCOPY_LIBCRYPTO="libcrypto-nonexistent.so.9")
    out = subprocess.run([sys.executable, "-c", code, path], env=env, capture_output=True,
                         text=True, check=True).stdout
    assert "libssl3" in out and "libcrypto-nonexistent.so.9" in out
    cli = subprocess.run([sys.executable, "-m", "imgcopy", "checksum", path], env=env,
                         capture_output=True, text=True)
    assert cli.returncode == 1 and "libssl3" in cli.stderr and not cli.stdout


def test_missing_file_raises_oserror(tmp_path):
    with pytest.raises(OSError) as info:
        imgcopy.checksum(str(tmp_path / "nope.raw"))
    assert info.value.errno == errno.ENOENT


# ---- the command line ---------------------------------------------------

def test_cli_prints_like_blksum(tmp_path, capsys):
    a, b = str(tmp_path / "a.raw"), str(tmp_path / "b.qcow2")
    make_sparse(a, 2 * MiB + 3, [(100, seeded_bytes(70000, 5))])
    qemu_img("convert", "-f", "raw", "-O", "qcow2", a, b)
    assert cli_main(["checksum", a, b]) == 0
    out = capsys.readouterr().out
    assert out == (f"{imgcopy.checksum(a)}  {a}\n"
                   f"{imgcopy.checksum(b)}  {b}\n")
    assert cli_main(["checksum", "-a", "md5", "--block-size", "4k", "-f", "raw", a]) == 0
    assert capsys.readouterr().out == f"{imgcopy.checksum(a, 'md5', 4096)}  {a}\n"
    assert cli_main(["checksum", "--algorithm", "blake2b", "-U", "-p", a]) == 0
    progress = "    (0.00/100%)\r    (100.00/100%)\r    (100.00/100%)\r\n"  # convert -p's
    assert capsys.readouterr().out == f"{progress}{imgcopy.checksum(a, 'blake2b')}  {a}\n"


def test_cli_lists_digests(capsys):
    assert cli_main(["checksum", "-l"]) == 0
    assert capsys.readouterr().out.split() == list(imgcopy.checksum_algorithms())
    with pytest.raises(SystemExit) as info:
        cli_main(["checksum"])
    assert info.value.code == 2  # argparse: a file is needed


def test_cli_errors(tmp_path, capsys):
    a = str(tmp_path / "a.raw")
    make_sparse(a, 4096)
    missing = str(tmp_path / "missing.raw")
    assert cli_main(["checksum", missing, a]) == 1
    captured = capsys.readouterr()
    assert captured.out == f"{imgcopy.checksum(a)}  {a}\n"  # the others are still done
    assert "missing.raw" in captured.err and "No such file" in captured.err
    assert cli_main(["checksum", "-a", "nope", a]) == 1
    assert "unknown checksum algorithm 'nope'" in capsys.readouterr().err
