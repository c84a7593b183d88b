"""imgcopy.map() on raw images versus the ``qemu-img map -f raw`` oracle.

For every seeded image the JSON output must be *byte-identical* to what
qemu-img prints (qemu's 512-byte rounding of the virtual size and the empty
range placeholder included), the parsed extents must match qemu's entries
clipped to the exact file size, and the human format must be identical too.
"""

import json
import random

import pytest

from .gen import raw_kinds
from .oracles import clip_entries, extent_tuple, needs_qemu_img, qemu_map, qemu_map_human
from .units import MiB

import imgcopy

pytestmark = needs_qemu_img

# ~30 seeded images: two seeds of every kind plus extra seeds of the rich kinds.
CASES = [(k, s) for k in raw_kinds.KINDS for s in (1, 2)]
CASES += [(k, 3) for k in ("holes_and_data", "alloc_zeros", "unaligned", "qemu_io", "small_extents")]
IDS = ["%s-%d" % c for c in CASES]


def _round512(n):
    return (n + 511) // 512 * 512


def windows_for(size, entries, seed):
    """~10 (start, length) windows for one image; length None = to the end.

    Every image gets: the whole image, a start in qemu's past-EOF sector tail
    (or exactly at EOF), a start beyond the end, a length past the end, an
    unaligned random window, an exact qemu extent, a multi-extent span and a
    window around the last byte.  Which variant of each is picked rotates
    with the seed, so the ~30 images together cover all of them.
    """
    rng = random.Random("windows-%d-%d" % (size, seed))
    pick = lambda *xs: xs[rng.randrange(len(xs))]  # noqa: E731
    w = [(0, None)]
    # at / just past EOF: qemu's sector tail or the empty placeholder
    tail = [(size, None), (size, 4096), (_round512(size), None), (size + 1, None)]
    if size % 512 and size % 512 < 511:
        tail.append((size + rng.randint(1, 511 - size % 512), None))
    w.append(pick(*tail))
    # beyond the end
    w.append(pick((size + 12345, 100), (size + 5 * MiB, None), (2 * size + 4096, None), (1 << 40, 1)))
    # zero / tiny / past-the-end lengths from 0
    w.append(pick((0, 0), (0, 1), (0, size), (0, size + 1), (0, 10 * size + 12345)))
    if size > 0:
        w.append(pick((size - 1, None), (size - 1, 1), (size - 1, 2)))
        w.append((rng.randrange(size), rng.randint(1, size)))
        w.append((rng.randrange(size) | 1, pick(rng.randint(1, 4096), size * 3, None)))
    # exact qemu extents and multi-extent spans
    real = [e for e in entries if e["length"] > 0 and e["start"] < size]
    if real:
        e = rng.choice(real)
        w.append(pick((e["start"], e["length"]), (e["start"], None)))
        if e["length"] > 1:
            mid = e["start"] + rng.randrange(1, e["length"])
            w.append((mid, rng.randint(1, 3 * e["length"])))
    if len(real) >= 3:
        a = rng.randrange(len(real) - 2)
        s = real[a]["start"] + real[a]["length"] // 2
        w.append((s, real[a + 2]["start"] + 1 - s))
    seen, out = set(), []
    for x in w:
        if x not in seen:
            seen.add(x)
            out.append(x)
    return out


def check_map_against_qemu(m, q, size, start, length, what):
    """Full comparison of an ExtentMap with a QemuMap of the same window."""
    got = m.to_json()
    assert isinstance(got, str)
    assert json.loads(got) == q.extents, what
    assert got == q.text, what
    # extents themselves: qemu's entries clipped to [start, min(end, size))
    exp = clip_entries(q.extents, size, start, length)
    ext = [extent_tuple(e) for e in m]
    assert ext == exp, what
    assert len(m) == len(exp), what
    # coverage is contiguous from .start
    assert m.start == start, what
    assert m.size == size, what
    cov_end = max(start, min(size, start + length) if length is not None else size)
    pos = start
    for e in m:
        assert e.start == pos and e.length > 0 and e.end == e.start + e.length, (what, e)
        pos = e.end
    assert pos == cov_end, what
    assert max(m.start, min(m.end, m.size)) == cov_end, (what, m.start, m.end, m.size)


# --------------------------------------------------------------------------


@pytest.mark.parametrize("kind,seed", CASES, ids=IDS)
def test_map_json_matches_qemu(shared_images, kind, seed):
    im = shared_images.get(kind, seed)
    q = shared_images.qemu_map(im.path)
    m = imgcopy.map(im.path)
    check_map_against_qemu(m, q, im.size, 0, None, "full map of %s" % (im,))
    # explicit format and the Image API give the same answer
    assert imgcopy.map(im.path, format="raw").to_json() == q.text
    with imgcopy.open(im.path) as img:
        assert img.size == im.size
        assert img.extents().to_json() == q.text
        assert img.extents(0, im.size).to_json() == shared_images.qemu_map(im.path, 0, im.size).text


@pytest.mark.parametrize("kind,seed", CASES, ids=IDS)
def test_map_windows_match_qemu(shared_images, kind, seed):
    im = shared_images.get(kind, seed)
    full = shared_images.qemu_map(im.path)
    failures = []
    for start, length in windows_for(im.size, full.extents, seed):
        what = "window start=%r length=%r of %s" % (start, length, im)
        q = shared_images.qemu_map(im.path, start, length)
        m = None
        try:
            m = imgcopy.map(im.path, start=start, length=length)
            check_map_against_qemu(m, q, im.size, start, length, what)
        except AssertionError as e:
            failures.append("%s: %s\n  qemu:    %r\n  imgcopy: %r" % (what, e, q.text, _safe_json(m)))
        except Exception as e:  # a crash is a failure too, but report all windows
            failures.append("%s: raised %r" % (what, e))
    assert not failures, "\n".join(failures)


def _safe_json(m):
    if m is None:
        return None
    try:
        return m.to_json()
    except Exception as e:  # pragma: no cover - diagnostics only
        return "<to_json raised %r>" % (e,)


@pytest.mark.parametrize("kind,seed", CASES, ids=IDS)
def test_map_human_matches_qemu(shared_images, kind, seed):
    im = shared_images.get(kind, seed)
    m = imgcopy.map(im.path)
    assert m.to_human(im.path) == shared_images.qemu_map_human(im.path)
    full = shared_images.qemu_map(im.path)
    for start, length in windows_for(im.size, full.extents, seed)[-3:]:
        m = imgcopy.map(im.path, start=start, length=length)
        assert m.to_human(im.path) == shared_images.qemu_map_human(im.path, start, length), (start, length)


@pytest.mark.parametrize("kind,seed", CASES, ids=IDS)
def test_summary_matches_qemu(shared_images, kind, seed):
    im = shared_images.get(kind, seed)
    full = shared_images.qemu_map(im.path)
    for start, length in [(0, None)] + windows_for(im.size, full.extents, seed)[-3:]:
        q = shared_images.qemu_map(im.path, start, length)
        exp = clip_entries(q.extents, im.size, start, length)
        data = sum(t[1] for t in exp if t[5])
        zero = sum(t[1] for t in exp if t[4])
        alloc = sum(t[1] for t in exp if t[3])
        m = imgcopy.map(im.path, start=start, length=length)
        assert (m.data_bytes, m.zero_bytes, m.allocated_bytes) == (data, zero, alloc), (start, length)
        s = m.summary()
        assert isinstance(s, dict)
        assert s["data_bytes"] == data and s["zero_bytes"] == zero and s["allocated_bytes"] == alloc


# --------------------------------------------------------------------------
# hand-made layouts with readable expectations

HANDMADE = {
    # name: (size, [(offset, bytes), ...])
    "512-all-data": (512, [(0, b"\x11" * 512)]),
    "513-last-byte": (513, [(512, b"\x22")]),
    "1-hole": (1, []),
    "1-data": (1, [(0, b"\x33")]),
    "511-data": (511, [(0, b"\x44" * 511)]),
    "3x4k+512-last-sector": (3 * 4096 + 512, [(3 * 4096, b"\x55" * 512)]),
    "written-zeros-between-data": (1 * MiB, [(4096, b"\x66" * 4096), (8192, bytes(4096)),
                                             (12288, b"\x77" * 100)]),
    "only-written-zeros": (65536 + 7, [(0, bytes(65536 + 7))]),
    "data-at-unaligned-1M+3": (2 * MiB + 3, [(1 * MiB + 3, b"\x88" * 5)]),
    "4k-alternating": (64 * 4096, [(i * 4096, b"\x99" * 4096) for i in range(0, 64, 2)]),
}


@pytest.mark.parametrize("name", sorted(HANDMADE))
def test_handmade_layouts(make_sparse, name):
    size, data = HANDMADE[name]
    path = make_sparse(name + ".img", size, data)
    q = qemu_map(path)
    m = imgcopy.map(path)
    check_map_against_qemu(m, q, size, 0, None, name)
    assert m.to_human(path) == qemu_map_human(path)
    # Sequence protocol
    items = list(m)
    assert len(items) == len(m)
    for i, e in enumerate(items):
        assert m[i] == e
        assert m[i - len(m)] == e
    with pytest.raises(IndexError):
        m[len(m)]
    for e in items:
        assert (e.start, e.length, e.depth, e.present, e.zero, e.data,
                e.host_offset) == tuple(e)[:7]
        assert e.end == e.start + e.length
        if e.host_offset is not None:
            assert e.host_offset == e.start  # raw: guest offset == host offset


def test_extent_fields_contract(make_sparse):
    """Extent is a NamedTuple (start, length, depth, present, zero, data,
    host_offset, compressed, zeroed, dirty): qemu-img map's fields (its
    "offset" is the host offset), `compressed` as qemu 8 has it, `zeroed`
    imgcopy's, `dirty` a dirty map's (None in a plain map)."""
    path = make_sparse("f.img", 8192, [(0, b"x")])
    e = imgcopy.map(path)[0]
    assert isinstance(e, tuple)
    assert e._fields == ("start", "length", "depth", "present", "zero", "data",
                         "host_offset", "compressed", "zeroed", "dirty")
    s, l, depth, present, zero, data, off, compressed, zeroed, dirty = e
    assert (s, l, depth, present, zero, data, off, compressed, zeroed, dirty) == (
        0, 4096, 0, True, False, True, 0, False, False, None)
    with imgcopy.open(path) as img:
        assert type(img.block_status(0)) is type(e)


def test_written_zeros_are_data(make_sparse):
    """Allocated (written) zeros are data, not zero, exactly as qemu says."""
    path = make_sparse("wz.img", 1 * MiB, [(65536, bytes(65536))])
    m = imgcopy.map(path)
    q = qemu_map(path)
    assert m.to_json() == q.text
    [e] = [e for e in m if e.data]
    assert e.start <= 65536 and e.end >= 131072
    assert e.zero is False or e.zero == 0


def test_empty_file_prints_placeholder(make_sparse):
    path = make_sparse("empty.img", 0)
    m = imgcopy.map(path)
    assert len(m) == 0
    assert m.to_json() == ('[{ "start": 0, "length": 0, "depth": 0, "present": false, '
                           '"zero": false, "data": false}]\n')
    assert m.to_json() == qemu_map(path).text
    assert m.to_human(path) == qemu_map_human(path)
    assert (m.data_bytes, m.zero_bytes, m.allocated_bytes) == (0, 0, 0)


@pytest.mark.parametrize("name", ["my disk.img", "d\u00efsk-\u00fc.raw", "x%s%d.img"])
def test_human_filename_verbatim(make_sparse, name):
    path = make_sparse(name, 100000, [(8192, b"\x01" * 5000), (99999, b"\x02")])
    assert imgcopy.map(path).to_human(path) == qemu_map_human(path)


def test_odd_size_tail_quirk(make_sparse):
    """size 1000001: .size is exact, to_json() shows qemu's zero tail to 1000448."""
    path = make_sparse("odd.img", 1000001, [(1000000, b"\x01")])
    m = imgcopy.map(path)
    assert m.size == 1000001
    assert m[-1].end == 1000001
    q = qemu_map(path)
    assert q.extents[-1]["start"] + q.extents[-1]["length"] == 1000448  # sanity of the oracle
    assert m.to_json() == q.text
