"""The qcow2 L2 table store: clean tables evicted least recently used
first, tables a write changes kept until finish() writes them back.  Small
clusters give many tables (512-byte clusters: one table per 32 KiB, 256
cached), so reads and writes in any order cross evictions; qemu-img reads
the result."""
import random

import pytest

import imgcopy

from .gen.sparse import make_sparse
from .oracles import qemu_check, qemu_img, qemu_map

CLUSTER = 512
TABLE_SPAN = CLUSTER // 8 * CLUSTER  # guest bytes one L2 table maps
SLOTS = 256
SIZE = (SLOTS * 3) * TABLE_SPAN      # three times the cache


def scattered_image(path, seed):
    """A qcow2 image with a little data under every table; returns its
    contents."""
    rng = random.Random(seed)
    data = []
    for t in range(SIZE // TABLE_SPAN):
        off = t * TABLE_SPAN + rng.randrange(0, TABLE_SPAN // CLUSTER - 4) * CLUSTER
        data.append((off, bytes([rng.randrange(1, 256)]) * (CLUSTER * rng.randrange(1, 4))))
    raw = path.with_suffix(".raw")
    make_sparse(raw, SIZE, data)
    qemu_img("convert", "-f", "raw", "-O", "qcow2", "-o", f"cluster_size={CLUSTER}", raw, path)
    return raw.read_bytes()


def raw_of(path, tmp_path):
    raw = tmp_path / "now.raw"
    qemu_img("convert", "-f", "qcow2", "-O", "raw", path, raw)
    return raw.read_bytes()


@pytest.mark.parametrize("seed", [1, 2])
def test_reads_in_random_order_cross_evictions(tmp_path, seed):
    path = tmp_path / "scattered.qcow2"
    expected = scattered_image(path, seed)
    rng = random.Random(seed)
    tables = list(range(SIZE // TABLE_SPAN))
    rng.shuffle(tables)
    with imgcopy.open(path) as img:
        for t in tables + tables[:SLOTS // 2]:
            off = t * TABLE_SPAN
            assert img.read(off, TABLE_SPAN) == expected[off:off + TABLE_SPAN], t
        emap = img.extents()
    assert emap.to_json() == qemu_map(path, "qcow2").text


def test_writes_pinned_while_reads_evict(tmp_path):
    """Tables written in an r+ session stay in memory while reads of many
    other tables cycle the cache; finish() writes each back in place."""
    path = tmp_path / "rw.qcow2"
    expected = bytearray(scattered_image(path, 3))
    rng = random.Random(3)
    nt = SIZE // TABLE_SPAN
    with imgcopy.open(path, mode="r+") as img:
        for step in range(400):
            t = rng.randrange(nt)
            if step % 3 == 0:
                off = t * TABLE_SPAN + rng.randrange(0, TABLE_SPAN - 4096)
                data = bytes([step % 251 + 1]) * rng.randrange(1, 4096)
                img.write(off, data)
                expected[off:off + len(data)] = data
            else:
                off = t * TABLE_SPAN
                assert img.read(off, TABLE_SPAN) == bytes(expected[off:off + TABLE_SPAN])
    qemu_check(str(path))
    assert raw_of(path, tmp_path) == bytes(expected)
