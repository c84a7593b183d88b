"""Tables sized by a header field cost what the file holds.

A header may claim a table far larger than its file (an L1 table of 4 M
entries in a file of 4 KiB, a grain directory of 92 MB, a BAT of millions
of entries): the entries past the end of the file read as zeros (or as
whatever the format says a missing entry is), so a reader holds, byte-swaps
and walks only those inside the file.  Each case here is one of the fuzz
regressions (tests/fuzz/regressions/FORMAT/hostile-*) timed against a
baseline on the same machine: the same small image without the claim.
Opening, mapping, reading (and checking, for qcow2) the hostile file must
cost about what the baseline costs, whatever else runs on the machine:
the best of a few rounds, under a generous bound (a few times the
baseline plus some milliseconds, and under a second in any case).
"""
import json
import os
import subprocess
import sys

import pytest

from .convert_helpers import imgcopy_child_env
from .fuzz import hostile, hostile_vhdx, hostile_vmdk, hostile_vpc

SANITIZED = "asan" in os.environ.get("LD_PRELOAD", "")
SLOW = 5 if SANITIZED else 1
ROUNDS = 5
# the hostile file's best round against the baseline's best round
FACTOR = 5
SLACK = 0.03 * SLOW
CEILING = 1.0 * SLOW

# One child times every file of a case, rounds interleaved (the machine's
# load weighs on both alike), and says how each ended: what imgcopy makes
# of a hostile file is part of what must not change.
CHILD = r"""
import json, sys, time
import imgcopy

WINDOW = 64 << 20

def once(path, fmt, op):
    t = time.perf_counter()
    outcome = "ok"
    try:
        if op == "check":
            r = imgcopy.check(path, format=fmt)
            outcome = "check: %d corruptions, %d leaks, %d errors" % (
                r.corruptions, r.leaks, r.check_errors)
        else:
            with imgcopy.open(path, fmt) as img:
                size = img.size
                img.extents(0, min(size, WINDOW))
                if size > WINDOW:
                    img.extents(size - WINDOW)
                img.read(0, min(size, 1 << 20))
                if size:
                    img.read(size - min(size, 65536), min(size, 65536))
    except (imgcopy.ImageFormatError, OSError) as e:
        outcome = "%s: %s" % (type(e).__name__, e)
    return time.perf_counter() - t, outcome

files = json.loads(sys.argv[1])
best = [None] * len(files)
outcomes = [None] * len(files)
for _ in range(int(sys.argv[2])):
    for i, (path, fmt, op) in enumerate(files):
        secs, outcomes[i] = once(path, fmt, op)
        best[i] = secs if best[i] is None else min(best[i], secs)
print(json.dumps({"best": best, "outcomes": outcomes}))
"""


def time_files(files, cwd, rounds=ROUNDS):
    """[(path, format, "open" | "check")] -> (best seconds, outcomes)."""
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(files), str(rounds)],
                          capture_output=True, text=True, env=imgcopy_child_env(), cwd=cwd,
                          timeout=120 * SLOW)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    return r["best"], r["outcomes"]


def assert_bounded(name, hostile_secs, baseline_secs, factor=FACTOR):
    bound = min(CEILING, factor * baseline_secs + SLACK)
    assert hostile_secs < bound, (
        "%s: %.1f ms, the baseline %.1f ms (bound %.1f ms): reading or checking it "
        "costs more than its file justifies" % (
            name, hostile_secs * 1e3, baseline_secs * 1e3, bound * 1e3))


def write(tmp_path, name, data):
    path = str(tmp_path / name)
    with open(path, "wb") as f:
        f.write(data)
    return path


# -- qcow2 ---------------------------------------------------------------

def qcow2_case(name):
    return hostile.CASES_BY_NAME[name].build()


def qcow2_baseline():
    """The image every hostile qcow2 case starts from: 13 clusters of 512
    bytes, 4 of them data."""
    return bytes(hostile.base_image()[0])


def qcow2_metadata_preallocated(path, clusters=1 << 19):
    """A valid image with every cluster allocated (metadata preallocation,
    512-byte clusters: the data clusters are holes of the file): what a
    check of `clusters` L2 entries and as many refcounts costs, about the
    most a check of a hostile file gives itself before it stops (1 Mi
    steps, tests/fuzz/../csrc/drivers/qcow2_check.c)."""
    import struct

    cs = 512
    l2_tables = -(-clusters // (cs // 8))
    l1_clusters = -(-l2_tables * 8 // cs)
    per_block = cs // 2  # 16-bit refcounts
    nblocks = rt_clusters = 1
    while True:  # the refcount structures count themselves
        total = 1 + rt_clusters + l1_clusters + l2_tables + nblocks + clusters
        need = -(-total // per_block)
        if need <= nblocks and -(-nblocks * 8 // cs) <= rt_clusters:
            break
        nblocks = max(nblocks, need)
        rt_clusters = -(-nblocks * 8 // cs)
    reftable, l1_off = cs, (1 + rt_clusters) * cs
    l2_first = 1 + rt_clusters + l1_clusters
    blocks_first = l2_first + l2_tables
    data_first = blocks_first + nblocks
    hdr = hostile._small_header(9, clusters * cs, l2_tables, l1_off, reftable, rt_clusters)
    with open(path, "wb") as f:
        f.truncate(total * cs)
        f.write(bytes(hdr))
        f.seek(reftable)
        f.write(b"".join(struct.pack(">Q", (blocks_first + b) * cs) for b in range(nblocks)))
        f.seek(l1_off)
        f.write(b"".join(struct.pack(">Q", hostile.COPIED | (l2_first + t) * cs)
                         for t in range(l2_tables)))
        f.seek(l2_first * cs)
        f.write(b"".join(struct.pack(">Q", hostile.COPIED | (data_first + k) * cs)
                         for k in range(clusters)))
        f.seek(blocks_first * cs)
        f.write(struct.pack(">H", 1) * total)
    return path


@pytest.mark.parametrize("op", ["open", "check"])
@pytest.mark.parametrize("name", ["l1-size-32MiB-beyond-eof", "reftable-8MiB-beyond-eof-with-data"])
def test_qcow2_table_past_eof(name, op, tmp_path):
    """The largest L1 table qemu takes (32 MiB), or refcount table (8 MiB),
    claimed by a file of a few KiB: opened, mapped and checked as cheaply
    as the base image."""
    base = write(tmp_path, "base.qcow2", qcow2_baseline())
    bad = write(tmp_path, "hostile.qcow2", qcow2_case(name))
    (t_base, t_bad), _ = time_files([(base, "qcow2", op), (bad, "qcow2", op)], str(tmp_path))
    assert_bounded("%s (%s)" % (name, op), t_bad, t_base)


@pytest.mark.parametrize("name", ["bitmaps-tables-beyond-eof", "bitmaps-tables-overlapping"])
def test_qcow2_bitmap_tables_at_open(name, tmp_path):
    """2000 bitmaps whose tables claim 64 Ki entries each, past the end of
    the file or overlapping in its last 64 KiB: opened (or refused) as
    cheaply as the base image."""
    base = write(tmp_path, "base.qcow2", qcow2_baseline())
    bad = write(tmp_path, "hostile.qcow2", qcow2_case(name))
    (t_base, t_bad), (_, outcome) = time_files([(base, "qcow2", "open"),
                                                (bad, "qcow2", "open")], str(tmp_path))
    if hostile.CASES_BY_NAME[name].expect == "any":
        assert outcome == "ok", outcome
    else:
        assert "overlapping" in outcome, outcome
    assert_bounded(name, t_bad, t_base)


@pytest.mark.parametrize("name", ["check-l2-tables-in-turn", "check-reftable-8MiB-beyond-eof",
                                  "check-bitmaps-in-use-tables-beyond-eof",
                                  "bitmaps-tables-beyond-eof", "check-snapshots-beyond-eof"])
def test_qcow2_check_cost_of_small_file(name, tmp_path):
    """Tables named over and over, stored refcounts of many blocks in turn,
    a refcount table mostly past the end: checked about as cheaply as the
    small image they are made from (qemu's answer, tests/test_check.py)."""
    base = write(tmp_path, "base.qcow2", qcow2_baseline())
    bad = write(tmp_path, "hostile.qcow2", qcow2_case(name))
    (t_base, t_bad), (_, outcome) = time_files([(base, "qcow2", "check"),
                                                (bad, "qcow2", "check")], str(tmp_path))
    assert outcome.startswith("check:"), outcome
    assert_bounded(name, t_bad, t_base)


@pytest.mark.parametrize("name", ["check-overlapping-l2-tables", "check-snapshots-naming-one-l1"])
def test_qcow2_check_stops(name, tmp_path):
    """L2 tables overlapping each other, snapshots naming one L1 table over
    and over: more work than the file could ever need, so the check stops
    with an error after no more work than a valid image of 256 MiB of
    512-byte clusters (the baseline) costs."""
    base = qcow2_metadata_preallocated(str(tmp_path / "base.qcow2"))
    bad = write(tmp_path, "hostile.qcow2", qcow2_case(name))
    (t_base, t_bad), (ok, outcome) = time_files([(base, "qcow2", "check"),
                                                 (bad, "qcow2", "check")], str(tmp_path))
    assert ok == "check: 0 corruptions, 0 leaks, 0 errors", ok
    assert "corrupt qcow2 image" in outcome, outcome
    assert_bounded(name, t_bad, t_base, factor=2)


# -- vmdk ----------------------------------------------------------------

def vmdk_layout(d, name, data):
    """The fuzz harness's files beside `name` (tests/fuzz/hostile_vmdk.py)."""
    for helper, content in hostile_vmdk.helper_files().items():
        write(d, helper, content)
    return write(d, name, data)


@pytest.mark.parametrize("name", ["capacity-gd-92MB-past-eof"])
def test_vmdk_grain_directory_past_eof(name, tmp_path):
    """A grain directory of 23 Mi entries (92 MB) claimed by a file of 28 KB:
    opened, mapped and read as cheaply as the same extent with its own
    capacity, and to the same end (qemu's, tests/test_vmdk_hostile.py)."""
    base = vmdk_layout(tmp_path, "base.vmdk", hostile_vmdk.sparse())
    bad = vmdk_layout(tmp_path, "input.vmdk", hostile_vmdk.CASES[name][0])
    (t_base, t_bad), (ok, outcome) = time_files([(base, "vmdk", "open"), (bad, "vmdk", "open")],
                                                str(tmp_path))
    assert ok == "ok" and outcome == "ok", (ok, outcome)
    assert_bounded(name, t_bad, t_base)


# -- vhdx ----------------------------------------------------------------

def write_sparse(path, data, block=4096):
    """`data` with its all-zero blocks left as holes of the file."""
    zero = bytes(block)
    with open(path, "wb") as f:
        for off in range(0, len(data), block):
            chunk = data[off:off + block]
            if chunk != zero[:len(chunk)]:
                f.seek(off)
                f.write(chunk)
        f.truncate(len(data))
    return path


@pytest.mark.parametrize("name", ["bat-34MiB-in-holes"])
def test_vhdx_bat_in_holes(name, tmp_path):
    """A BAT of 4 Mi entries (34 MiB) in a sparse file holding a few KiB of
    data: opened, mapped and read as cheaply as the 3 MiB image it is made
    from (the BAT's holes read as zeros: blocks not present)."""
    base = write_sparse(str(tmp_path / "base.vhdx"), bytes(hostile_vhdx.base()[0]))
    bad = write_sparse(str(tmp_path / "input.vhdx"), bytes(hostile_vhdx.CASES[name][1]()))
    (t_base, t_bad), (ok, outcome) = time_files([(base, "vhdx", "open"), (bad, "vhdx", "open")],
                                                str(tmp_path))
    assert ok == "ok" and outcome == "ok", (ok, outcome)
    assert_bounded(name, t_bad, t_base)


# -- vpc -----------------------------------------------------------------

def vpc_bat_in_holes(path, entries):
    """hostile_vpc.bat_in_holes() with a BAT of `entries` entries, written
    sparse: the file is its first blocks, its six real entries, holes, and
    its end footer."""
    import struct

    small = hostile_vpc.bat_in_holes(6)
    at = struct.unpack_from(">Q", small, hostile_vpc.HDR + 16)[0]
    head = bytearray(small[:at + 24])
    struct.pack_into(">I", head, hostile_vpc.HDR + 28, entries)
    with open(path, "wb") as f:
        f.write(head)
        f.seek(at + 4 * entries)
        f.write(small[-512:])
    return path


def test_vpc_bat_in_holes(tmp_path):
    """A BAT of 64 Mi entries (256 MiB) in holes of a sparse file, all but
    six zeros (blocks at sector 0, past the virtual size): opened, mapped
    and read as cheaply as the small disk it is made from.  (The fuzz
    regression, hostile-bat-48k-entries-in-holes, is one of 48 Ki: the
    fuzzer's inputs are at most 256 KiB.)"""
    base = write_sparse(str(tmp_path / "base.vhd"), bytes(hostile_vpc.base()))
    bad = vpc_bat_in_holes(str(tmp_path / "input.vhd"), 64 << 20)
    (t_base, t_bad), (ok, outcome) = time_files([(base, "vpc", "open"), (bad, "vpc", "open")],
                                                str(tmp_path))
    assert ok == "ok" and outcome == "ok", (ok, outcome)
    assert_bounded("bat-64M-entries-in-holes", t_bad, t_base)
