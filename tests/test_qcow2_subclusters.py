"""qcow2 images with extended L2 entries (``-o extended_l2=on``: 32 subclusters
per cluster, each entry followed by its subcluster bitmap) read as qemu reads
them: random images made by qemu-io (subcluster writes at odd offsets, zero
writes, discards, compressed clusters, over a backing file or not), mapped,
converted and checked against qemu-img; bitmaps qemu calls corrupt refused
as qemu refuses them, and found by check with qemu's own words.  Writing
into such an image is refused: imgcopy writes standard entries only."""
import json
import random
import struct

import pytest

import imgcopy
from imgcopy.errors import ImageFormatError

from .gen.qcow2_meta import header_patch
from .oracles import assert_same_content, needs_qemu, qemu_img, qemu_io
from .test_check import assert_same
from .units import KiB, MiB

pytestmark = needs_qemu

OFFSET_MASK = 0x00fffffffffffe00


def qemu_json(path):
    return qemu_img("map", "--output=json", str(path)).stdout


def make_image(tmp_path, seed, cluster_size, backing):
    """A random extended-L2 image of 4-8 MiB, and its size."""
    rnd = random.Random(seed)
    size = rnd.choice([4, 6, 8]) * MiB + rnd.choice([0, 512, 64 * KiB])
    opts = [f"cluster_size={cluster_size}", "extended_l2=on"]
    if backing:
        # as long as the image, or shorter (a raw one ending inside a sector)
        fmt = rnd.choice(["qcow2", "raw"])
        bsize = rnd.choice([size, size // 2, size // 3 + 3000])
        base = tmp_path / f"base.{fmt}"
        if fmt == "raw":
            with open(base, "wb") as f:
                f.truncate(bsize)
        else:
            qemu_img("create", "-q", "-f", "qcow2", str(base), str(bsize))
        qemu_io(base, [f"write -P {rnd.randrange(1, 255)} {rnd.randrange(0, bsize // 2)} "
                       f"{rnd.randrange(1, bsize // 2)}" for _ in range(4)], fmt=fmt)
        opts += [f"backing_file={base.name}", f"backing_fmt={fmt}"]
    path = tmp_path / "sub.qcow2"
    qemu_img("create", "-q", "-f", "qcow2", "-o", ",".join(opts), str(path), str(size))
    sub = cluster_size // 32
    cmds = []
    # compressed clusters first (qemu compresses into unallocated clusters
    # only), then writes over them and everywhere
    if cluster_size <= 256 * KiB:
        clusters = size // cluster_size
        for first in sorted(rnd.sample(range(0, clusters - 1, 2), 3)):
            cmds.append(f"write -c -P {rnd.randrange(1, 255)} {first * cluster_size} "
                        f"{rnd.randrange(1, 3) * cluster_size}")
    for _ in range(rnd.randrange(10, 40)):
        kind = rnd.random()
        off = rnd.randrange(0, size - 1)
        if rnd.random() < 0.5:
            off = off // sub * sub                    # on a subcluster boundary
        length = min(rnd.choice([rnd.randrange(1, 2 * sub), rnd.randrange(1, 3 * cluster_size)]),
                     size - off)
        if kind < 0.55:
            cmds.append(f"write -P {rnd.randrange(1, 255)} {off} {length}")
        elif kind < 0.75:
            off = off // 512 * 512
            cmds.append(f"write -z {off} {max(512, length // 512 * 512)}")
        elif kind < 0.85:
            off = off // 512 * 512
            cmds.append(f"write -z -u {off} {max(512, length // 512 * 512)}")
        else:
            off = off // 512 * 512
            cmds.append(f"discard {off} {max(512, length // 512 * 512)}")
    qemu_io(path, cmds, fmt="qcow2")
    return path, size


@pytest.mark.parametrize("seed,cluster_size,backing", [
    (1, 64 * KiB, False), (2, 64 * KiB, True), (3, 16 * KiB, False), (4, 16 * KiB, True),
    (5, 256 * KiB, False), (6, 2 * MiB, True), (7, 32 * KiB, True), (8, 128 * KiB, False),
])
def test_random_images_read_as_qemu_reads_them(tmp_path, capfd, monkeypatch, seed,
                                               cluster_size, backing):
    path, size = make_image(tmp_path, seed, cluster_size, backing)
    m = imgcopy.map(path)
    assert m.to_json() == qemu_json(path)
    info = imgcopy.info(path)
    assert info.virtual_size == size
    # reads: a raw copy holds what qemu reads, and so does a qcow2 one
    out = tmp_path / "out.raw"
    imgcopy.convert(path, out, dst_format="raw")
    assert_same_content(path, out, "qcow2", "raw")
    out2 = tmp_path / "out.qcow2"
    imgcopy.convert(path, out2, dst_format="qcow2")
    assert_same_content(path, out2, "qcow2", "qcow2")
    # windows that start and end inside subclusters, against qemu's reading
    ref = tmp_path / "qemu.raw"
    qemu_img("convert", "-O", "raw", str(path), str(ref))
    rnd = random.Random(seed)
    with imgcopy.open(path) as img, open(ref, "rb") as f:
        for _ in range(20):
            start = rnd.randrange(0, size - 1)
            length = rnd.randrange(1, min(size - start, 3 * cluster_size) + 1)
            f.seek(start)
            assert img.read(start, length) == f.read(length), (start, length)
    assert_same(capfd, monkeypatch, path)


# ---- bitmaps qemu calls corrupt ------------------------------------------

def l2_entry_at(path, index):
    """File offset of L2 entry `index` of the first L2 table (16 bytes each)."""
    with open(path, "rb") as f:
        h = f.read(104)
        l1 = struct.unpack(">Q", h[40:48])[0]
        f.seek(l1)
        l2 = struct.unpack(">Q", f.read(8))[0] & OFFSET_MASK
    assert l2
    return l2 + 16 * index


def edit(path, at, value):
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(struct.pack(">Q", value))


def read_u64(path, at):
    with open(path, "rb") as f:
        f.seek(at)
        return struct.unpack(">Q", f.read(8))[0]


@pytest.fixture
def image(tmp_path):
    """1 MiB, 64 KiB clusters: cluster 0 data in subclusters 0-1, cluster 1
    compressed, cluster 2 unallocated, cluster 3 written whole."""
    p = tmp_path / "e.qcow2"
    qemu_img("create", "-q", "-f", "qcow2", "-o", "extended_l2=on", str(p), "1M")
    qemu_io(p, ["write -P 7 0 4k", "write -c -P 8 64k 64k", "write -P 9 192k 64k"],
            fmt="qcow2")
    return p


@pytest.mark.parametrize("damage", ["data-and-zeros", "data-in-unallocated"])
def test_corrupt_bitmaps_refused_and_checked_as_qemu_says(tmp_path, capfd, monkeypatch,
                                                          image, damage):
    if damage == "data-and-zeros":
        at = l2_entry_at(image, 0) + 8
        edit(image, at, read_u64(image, at) | (1 << 33))      # subcluster 1: data and zeros
    else:
        edit(image, l2_entry_at(image, 2) + 8, 1 << 4)          # data bit, no cluster
    assert qemu_img("convert", "-O", "raw", str(image), str(tmp_path / "q.raw"),
                    check=False).returncode != 0
    with pytest.raises(ImageFormatError, match="corrupt qcow2 image"):
        imgcopy.convert(image, tmp_path / "o.raw", dst_format="raw")
    q = assert_same(capfd, monkeypatch, image)
    assert q[0] == 2 and "subcluster" in q[2]


def test_compressed_cluster_with_a_bitmap(tmp_path, capfd, monkeypatch, image):
    """qemu reads it as the compressed cluster it is; its check calls it
    corrupt and does not count its data as used (a leak too)."""
    edit(image, l2_entry_at(image, 1) + 8, 0xff)
    imgcopy.convert(image, tmp_path / "o.raw", dst_format="raw")
    qemu_img("convert", "-O", "raw", str(image), str(tmp_path / "q.raw"))
    assert (tmp_path / "o.raw").read_bytes() == (tmp_path / "q.raw").read_bytes()
    q = assert_same(capfd, monkeypatch, image)
    assert q[0] == 2 and "non-zero subcluster allocation bitmap" in q[2]


def test_unallocated_subclusters_of_an_allocated_cluster_keep_their_offset(tmp_path, image):
    m = json.loads(imgcopy.map(image).to_json())
    # cluster 0: 4 KiB of data, then the rest of its subclusters unallocated,
    # at their places in the file (qemu-img map gives the offset)
    assert m[0]["data"] and m[0]["length"] == 4 * KiB
    assert not m[1]["present"] and m[1]["zero"] and "offset" in m[1]
    assert m[1]["offset"] == m[0]["offset"] + 4 * KiB
    assert imgcopy.map(image).to_json() == qemu_json(image)


def test_writing_into_it_is_refused_and_it_is_untouched(tmp_path, image):
    src = tmp_path / "s.raw"
    src.write_bytes(b"\x55" * MiB)
    before = image.read_bytes()
    with pytest.raises(ImageFormatError, match="extended L2"):
        imgcopy.convert(src, image, dst_format="qcow2", create=False)
    assert image.read_bytes() == before


@pytest.mark.parametrize("name", ["odd-64k-tail", "odd-64k"])
def test_standard_tables_under_the_extended_bit(qcow2_all, tmp_path, name):
    """A standard image whose header says extended L2: its tables are read
    as pairs of entry and bitmap, as qemu reads them; where qemu fails, so
    does imgcopy, with an ImageFormatError."""
    p = header_patch(qcow2_all.get(name).path, str(tmp_path / "x.qcow2"), incompatible_set=4)
    q = qemu_img("map", "--output=json", p, check=False)
    if q.returncode == 0:
        assert imgcopy.map(p).to_json() == q.stdout
        out = tmp_path / "o.raw"
        imgcopy.convert(p, out, dst_format="raw")
        assert_same_content(p, out, "qcow2", "raw")
    else:
        with pytest.raises(ImageFormatError):
            imgcopy.map(p)


def test_unallocated_subclusters_past_a_short_backing_file(tmp_path):
    """Below the backing file's end its bytes show through; past it the
    unallocated subclusters of an allocated cluster are zeros at their own
    place in the file (qemu-img map keeps their offset, at depth 0)."""
    base = tmp_path / "b.raw"
    base.write_bytes(b"x" * 3000)
    p = tmp_path / "o.qcow2"
    qemu_img("create", "-q", "-f", "qcow2", "-o", "extended_l2=on,backing_file=b.raw,"
             "backing_fmt=raw", str(p), "1M")
    qemu_io(p, ["write -P 5 0 1k", "write -P 6 70k 1k", "write -z 4k 2k"], fmt="qcow2")
    m = json.loads(imgcopy.map(p).to_json())
    assert [e for e in m if e["start"] == 3072][0]["depth"] == 0
    assert "offset" in [e for e in m if e["start"] == 3072][0]
    assert imgcopy.map(p).to_json() == qemu_json(p)
    out = tmp_path / "o.raw"
    imgcopy.convert(p, out, dst_format="raw")
    assert_same_content(p, out, "qcow2", "raw")
