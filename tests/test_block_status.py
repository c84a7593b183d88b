"""Image.block_status() versus the qemu-img map oracle, and the extent cache.

Every answer must start at the asked offset, have length > 0, stay inside the
image, lie within one qemu extent (clipped to the exact file size) with the
same depth/present/zero/data flags, and for raw carry offset == asked offset.
Whatever the query order, the number of lseek(SEEK_DATA/SEEK_HOLE) calls the
cache makes must stay <= 2*E + 8 where E is the number of qemu-img map
extents.
"""

import random

import pytest

from .gen import raw_kinds
from .oracles import clip_entries, extent_tuple, find_covering, needs_qemu_img

import imgcopy

pytestmark = needs_qemu_img

NONEMPTY_KINDS = [k for k in raw_kinds.KINDS if k != "empty"]
CASES = [(k, s) for k in NONEMPTY_KINDS for s in (1, 2)]
IDS = ["%s-%d" % c for c in CASES]
ORDERS = ("forward", "backward", "random", "every4096", "walk")


def check_answer(e, off, qext, size, length=None):
    """Assert block_status(off[, length]) answer `e` agrees with the oracle."""
    t = extent_tuple(e)
    what = "block_status(%d%s) = %r" % (off, "" if length is None else ", %d" % length, t)
    assert t[0] == off, what
    assert t[1] > 0, what
    assert off + t[1] <= size, what + " extends past the image size %d" % size
    if length is not None:
        assert t[1] <= length, what + " not clipped to length"
    q = find_covering(qext, off)
    assert q is not None, what + " (no qemu extent covers the offset)"
    assert off + t[1] <= q[0] + q[1], what + " crosses the qemu extent %r" % (q,)
    assert t[2:6] == q[2:6], what + " has flags different from qemu extent %r" % (q,)
    assert t[6] == off, what + " (raw: offset must equal the asked offset)"
    assert e.end == off + t[1]
    return t


def query_offsets(order, size, qext, seed):
    starts = [t[0] for t in qext]
    if order == "forward":
        return starts
    if order == "backward":
        return starts[::-1]
    if order == "random":
        rng = random.Random("bs-%d-%d" % (size, seed))
        offs = [rng.randrange(size) for _ in range(150)]
        # also some exact boundaries and last bytes of extents, shuffled in
        offs += [t[0] + t[1] - 1 for t in qext]
        offs += starts
        rng.shuffle(offs)
        return offs
    if order == "every4096":
        return list(range(0, size, 4096))
    raise AssertionError(order)


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("kind,seed", CASES, ids=IDS)
def test_block_status_orders(shared_images, kind, seed, order):
    im = shared_images.get(kind, seed)
    if order == "every4096" and im.size > raw_kinds.SMALL_LIMIT:
        pytest.skip("every-4096 probing only for images <= %d bytes" % raw_kinds.SMALL_LIMIT)
    q = shared_images.qemu_map(im.path)
    qext = clip_entries(q.extents, im.size)
    E = len(q.extents)
    budget = 2 * E + 8
    with imgcopy.open(im.path) as img:
        assert img.size == im.size
        if order == "walk":
            # the canonical loop: walk the image extent by extent
            off, got = 0, []
            while off < im.size:
                t = check_answer(img.block_status(off), off, qext, im.size)
                got.append(t)
                off += t[1]
            assert off == im.size
            assert _merge(got) == qext
        else:
            for off in query_offsets(order, im.size, qext, seed):
                check_answer(img.block_status(off), off, qext, im.size)
        st = img.cache_stats()
        assert st["lseek_calls"] <= budget, (
            "order=%s: %d lseek calls for %d qemu extents (budget %d); stats=%r"
            % (order, st["lseek_calls"], E, budget, st))


def _merge(tuples):
    """Merge adjacent extents with identical flags and contiguous offsets (qemu's rule)."""
    out = []
    for t in tuples:
        if out:
            p = out[-1]
            if (p[0] + p[1] == t[0] and p[2:6] == t[2:6]
                    and (p[6] is None) == (t[6] is None)
                    and (p[6] is None or p[6] + p[1] == t[6])):
                out[-1] = (p[0], p[1] + t[1]) + p[2:]
                continue
        out.append(t)
    return out


@pytest.mark.parametrize("kind,seed", [c for c in CASES if c[1] == 1], ids=[i for i in IDS if i.endswith("-1")])
def test_block_status_length_clipping(shared_images, kind, seed):
    im = shared_images.get(kind, seed)
    q = shared_images.qemu_map(im.path)
    qext = clip_entries(q.extents, im.size)
    rng = random.Random("clip-%s-%d" % (kind, seed))
    offs = [t[0] for t in qext] + [rng.randrange(im.size) for _ in range(30)]
    with imgcopy.open(im.path) as img:
        for off in offs:
            full = check_answer(img.block_status(off), off, qext, im.size)
            for L in {1, 511, 512, 4096, 4097, rng.randint(1, im.size - off), im.size - off}:
                if L > im.size - off:
                    continue
                t = check_answer(img.block_status(off, L), off, qext, im.size, length=L)
                assert t[1] == min(L, full[1]), (off, L, t, full)
                assert t[2:6] == full[2:6]
        # length reaching exactly the end of the image is valid
        check_answer(img.block_status(0, im.size), 0, qext, im.size, length=im.size)
        t = check_answer(img.block_status(im.size - 1), im.size - 1, qext, im.size)
        assert t[1] == 1


def _stats(img):
    st = img.cache_stats()
    assert isinstance(st, dict)
    for k in ("hits", "misses", "lseek_calls", "intervals"):
        assert k in st, k
        assert isinstance(st[k], int) and st[k] >= 0, (k, st[k])
    return st


@pytest.mark.parametrize("kind,seed", [("holes_and_data", 1), ("small_extents", 2), ("alloc_zeros", 1),
                                       ("all_hole", 1), ("all_data", 1), ("last_byte", 2)])
def test_cache_hits_and_misses(shared_images, kind, seed):
    im = shared_images.get(kind, seed)
    qext = clip_entries(shared_images.qemu_map(im.path).extents, im.size)
    off = qext[len(qext) // 2][0]
    with imgcopy.open(im.path) as img:
        s0 = _stats(img)
        e1 = check_answer(img.block_status(off), off, qext, im.size)
        s1 = _stats(img)
        assert s1["misses"] == s0["misses"] + 1, (s0, s1)
        assert s1["hits"] == s0["hits"], (s0, s1)
        assert s1["lseek_calls"] > s0["lseek_calls"], (s0, s1)
        assert s1["intervals"] >= 1, s1

        # the very same query again: a hit, no new lseek
        e2 = extent_tuple(img.block_status(off))
        s2 = _stats(img)
        assert e2 == e1
        assert s2["hits"] == s1["hits"] + 1, (s1, s2)
        assert s2["misses"] == s1["misses"], (s1, s2)
        assert s2["lseek_calls"] == s1["lseek_calls"], (s1, s2)

        # a query inside the cached answer is a hit too
        if e1[1] > 1:
            inner = off + e1[1] // 2
            e3 = check_answer(img.block_status(inner), inner, qext, im.size)
            s3 = _stats(img)
            assert e3[0] + e3[1] == e1[0] + e1[1]
            assert s3["hits"] == s2["hits"] + 1, (s2, s3)
            assert s3["misses"] == s2["misses"], (s2, s3)
            assert s3["lseek_calls"] == s2["lseek_calls"], (s2, s3)
        else:
            s3 = s2

        # drop_cache empties it; the next query is a miss again
        img.drop_cache()
        s4 = _stats(img)
        assert s4["intervals"] == 0, s4
        e5 = check_answer(img.block_status(off), off, qext, im.size)
        s5 = _stats(img)
        assert e5 == e1
        assert s5["misses"] > s4["misses"], (s4, s5)
        assert s5["lseek_calls"] > s4["lseek_calls"], (s4, s5)


@pytest.mark.parametrize("kind,seed", [("holes_and_data", 2), ("small_extents", 1), ("unaligned", 1),
                                       ("odd_size", 1), ("big_sparse", 1)])
def test_map_fills_cache(shared_images, kind, seed):
    """After img.extents() every block_status in the mapped range is a hit."""
    im = shared_images.get(kind, seed)
    q = shared_images.qemu_map(im.path)
    qext = clip_entries(q.extents, im.size)
    with imgcopy.open(im.path) as img:
        assert img.extents().to_json() == q.text
        s0 = _stats(img)
        assert s0["lseek_calls"] <= 2 * len(q.extents) + 8, s0
        assert s0["intervals"] >= 1
        offs = [t[0] for t in qext] + [t[0] + t[1] - 1 for t in qext]
        for off in offs[::-1]:
            check_answer(img.block_status(off), off, qext, im.size)
        s1 = _stats(img)
        assert s1["lseek_calls"] == s0["lseek_calls"], (s0, s1)
        assert s1["misses"] == s0["misses"], (s0, s1)
        assert s1["hits"] == s0["hits"] + len(offs), (s0, s1)
        # mapping again costs nothing either
        assert img.extents().to_json() == q.text
        assert _stats(img)["lseek_calls"] == s0["lseek_calls"]


def test_block_status_bad_offsets(make_sparse):
    path = make_sparse("bad.img", 10000, [(4096, b"x" * 10)])
    with imgcopy.open(path) as img:
        for args in [(10000,), (-1,), (0, 10001), (9999, 2), (10001,), (1 << 62,), (0, -1)]:
            with pytest.raises(ValueError):
                img.block_status(*args)
        # still usable after errors
        assert img.block_status(9999).length == 1
