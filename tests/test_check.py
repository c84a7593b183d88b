"""imgcopy check against qemu-img check: clean images from qemu-img and from
imgcopy, and images damaged as qemu-iotests damage them (refcounts, L1 and
L2 entries edited in place).  For each: exit code, JSON and human output
(stdout) and the detail lines (stderr) equal qemu-img check's, the program
name aside."""
import json
import os
import random
import struct
import subprocess
import sys
from pathlib import Path

import pytest

import imgcopy
from imgcopy.cli import main as cli_main
from tests.oracles import qemu_img, qemu_io, require_qemu
from tests.units import KiB, MiB

REGRESSIONS = Path(__file__).parent / "fuzz" / "regressions" / "qcow2"
COPIED = 1 << 63


# ---- running both --------------------------------------------------------

def run_both(capfd, monkeypatch, path, *flags):
    """(qemu's, imgcopy's) (exit code, stdout, stderr), run in the image's
    directory on its base name (the name is in the JSON)."""
    path = Path(path)
    monkeypatch.chdir(path.parent)
    q = qemu_img("check", *flags, path.name, cwd=path.parent, check=False)
    capfd.readouterr()
    rc = cli_main(["check", *flags, path.name])
    out, err = capfd.readouterr()
    return ((q.returncode, q.stdout, q.stderr.replace("qemu-img:", "imgcopy:")),
            (rc, out, err))


def assert_same(capfd, monkeypatch, path, *flags):
    for output in ("human", "json"):
        ours_flags = (*flags, f"--output={output}")
        q, ours = run_both(capfd, monkeypatch, path, *ours_flags)
        assert ours == q, (path, ours_flags)
    return q


# ---- images --------------------------------------------------------------

def create(path, size, *opts, fmt="qcow2"):
    o = ["-o", ",".join(opts)] if opts else []
    qemu_img("create", "-q", "-f", fmt, *o, path, str(size))
    return path


def write_seeded(path, size, seed, count=12, *, zeros=3):
    """Random writes (odd offsets and lengths) and a few zero writes."""
    rnd = random.Random(seed)
    cmds = []
    for i in range(count):
        off = rnd.randrange(0, size - 1)
        length = min(rnd.randrange(1, 96 * KiB), size - off)
        cmds.append(f"write -P {rnd.randrange(1, 255)} {off} {length}")
    for i in range(zeros):
        off = rnd.randrange(0, size // 4096 - 16) * 4096
        cmds.append(f"write -z {off} {rnd.randrange(1, 16) * 4096}")
    qemu_io(path, cmds, fmt="qcow2")


def seeded_raw(path, size, seed):
    rnd = random.Random(seed)
    with open(path, "wb") as f:
        f.truncate(size)
        for i in range(10):
            f.seek(rnd.randrange(0, size - 70000))
            # half random (incompressible), half repetitive (compressible)
            f.write(rnd.randbytes(30000) + bytes([rnd.randrange(256)]) * 30000)
    return path


class Qcow2:
    """The fields of a qcow2 file a test edits."""

    def __init__(self, path):
        self.path = path
        with open(path, "rb") as f:
            h = f.read(104)
        self.cluster_bits = struct.unpack(">I", h[20:24])[0]
        self.cs = 1 << self.cluster_bits
        self.l1_offset = struct.unpack(">Q", h[40:48])[0]
        self.reftable = struct.unpack(">Q", h[48:56])[0]
        version = struct.unpack(">I", h[4:8])[0]
        self.refcount_bits = 1 << (struct.unpack(">I", h[96:100])[0] if version >= 3 else 4)
        assert self.refcount_bits == 16

    def u64(self, off, value=None):
        with open(self.path, "r+b") as f:
            f.seek(off)
            if value is None:
                return struct.unpack(">Q", f.read(8))[0]
            f.write(struct.pack(">Q", value))

    def l1_entry_offset(self, i):
        return self.l1_offset + 8 * i

    def l2_entry_offset(self, l1_index, j):
        l2 = self.u64(self.l1_entry_offset(l1_index)) & 0x00fffffffffffe00
        return l2 + 8 * j

    def refcount_offset(self, cluster):
        block = self.u64(self.reftable) & ~0x1ff
        assert cluster < self.cs // 2
        return block + 2 * cluster

    def refcount(self, cluster, value=None):
        with open(self.path, "r+b") as f:
            f.seek(self.refcount_offset(cluster))
            if value is None:
                return struct.unpack(">H", f.read(2))[0]
            f.write(struct.pack(">H", value))


@pytest.fixture
def base(tmp_path):
    """A 4 MiB qcow2 (64 KiB clusters) with guest clusters 0, 1, 2 and 5
    written, 2 before 0 (fragmented)."""
    require_qemu()
    p = create(tmp_path / "base.qcow2", 4 * MiB)
    qemu_io(p, ["write -P 1 128k 64k", "write -P 2 0 128k", "write -P 3 320k 1k"],
            fmt="qcow2")
    return p


# ---- clean images --------------------------------------------------------

@pytest.mark.parametrize("cluster_size", [512, 4 * KiB, 64 * KiB, 2 * MiB])
@pytest.mark.parametrize("compat", ["1.1", "0.10"])
def test_clean_qemu_images(tmp_path, capfd, monkeypatch, cluster_size, compat):
    require_qemu()
    size = 3 * MiB + 4608
    p = create(tmp_path / "c.qcow2", size, f"cluster_size={cluster_size}", f"compat={compat}")
    write_seeded(p, size, seed=cluster_size + len(compat))
    q = assert_same(capfd, monkeypatch, p)
    assert q[0] == 0
    r = imgcopy.check(p)
    assert r and r.ok and r.exit_code == 0
    assert r.allocated_clusters > 0


def test_empty_and_zero_clusters(tmp_path, capfd, monkeypatch):
    require_qemu()
    p = create(tmp_path / "z.qcow2", 1 << 30)
    assert_same(capfd, monkeypatch, p)
    qemu_io(p, ["write -P 7 0 64k", "write -z 64k 128k", "write -z -u 1m 64k",
                "write -P 9 2m 4k", "write -z 2m 64k"], fmt="qcow2")
    assert_same(capfd, monkeypatch, p)


def test_preallocated_zero_clusters(tmp_path, capfd, monkeypatch):
    require_qemu()
    p = create(tmp_path / "pz.qcow2", 2 * MiB, "preallocation=metadata")
    qemu_io(p, ["write -P 5 0 64k", "write -z 64k 256k"], fmt="qcow2")
    assert_same(capfd, monkeypatch, p)


@pytest.mark.parametrize("cluster_size", [512, 64 * KiB])
def test_compressed(tmp_path, capfd, monkeypatch, cluster_size):
    require_qemu()
    src = seeded_raw(tmp_path / "src.raw", 2 * MiB + 512, seed=cluster_size)
    p = tmp_path / "c.qcow2"
    qemu_img("convert", "-c", "-O", "qcow2", "-o", f"cluster_size={cluster_size}", src, p)
    q = assert_same(capfd, monkeypatch, p)
    r = imgcopy.check(p)
    assert r.compressed_clusters > 0 and r.fragmented_clusters >= r.compressed_clusters
    # an overwrite of a compressed cluster leaves it shared no more
    qemu_io(p, ["write -P 3 0 1k"], fmt="qcow2")
    assert_same(capfd, monkeypatch, p)


def test_snapshots(tmp_path, capfd, monkeypatch):
    require_qemu()
    p = create(tmp_path / "sn.qcow2", 4 * MiB)
    write_seeded(p, 4 * MiB, seed=3)
    qemu_img("snapshot", "-c", "first", p)
    write_seeded(p, 4 * MiB, seed=4)
    qemu_img("snapshot", "-c", "second", p)
    qemu_io(p, ["write -P 8 1m 200k"], fmt="qcow2")
    assert_same(capfd, monkeypatch, p)
    qemu_img("snapshot", "-d", "first", p)
    assert_same(capfd, monkeypatch, p)


def test_snapshot_entry_without_extra_data(tmp_path, capfd, monkeypatch):
    """A version 3 image's snapshot entry without its 16 bytes of extra data
    (VM state size, disk size): qemu-img check calls it incomplete, a
    corruption, before it counts references."""
    require_qemu()
    p = create(tmp_path / "sn.qcow2", 4 * MiB)
    write_seeded(p, 4 * MiB, seed=5)
    qemu_img("snapshot", "-c", "first", p)
    with open(p, "r+b") as f:
        f.seek(64)
        table = struct.unpack(">Q", f.read(8))[0]
        f.seek(table)
        fixed = bytearray(f.read(40))
        id_size, name_size = struct.unpack_from(">HH", fixed, 12)
        extra = struct.unpack_from(">I", fixed, 36)[0]
        assert extra >= 16
        f.seek(table + 40 + extra)
        names = f.read(id_size + name_size)
        struct.pack_into(">I", fixed, 36, 0)
        f.seek(table)
        f.write(bytes(fixed) + names + bytes(extra))
    q = assert_same(capfd, monkeypatch, p)
    assert q[0] == 2 and "snapshot table entry 0 is incomplete" in q[2], q


def test_bitmaps(tmp_path, capfd, monkeypatch):
    require_qemu()
    p = create(tmp_path / "bm.qcow2", 4 * MiB)
    qemu_img("bitmap", "--add", "-g", "64k", p, "bm0")
    qemu_io(p, ["write -P 1 0 1m"], fmt="qcow2")
    qemu_img("bitmap", "--add", "-g", "512", p, "a-rather-long-bitmap-name")
    qemu_img("bitmap", "--add", "--disable", p, "off")
    assert_same(capfd, monkeypatch, p)
    assert imgcopy.check(p).ok


def test_backing_overlay(tmp_path, capfd, monkeypatch, base):
    ov = tmp_path / "ov.qcow2"
    qemu_img("create", "-q", "-f", "qcow2", "-b", base.name, "-F", "qcow2", ov)
    qemu_io(ov, ["write -P 4 64k 4k", "write -z 192k 64k"], fmt="qcow2")
    assert_same(capfd, monkeypatch, ov)


@pytest.mark.parametrize("layout", [
    {}, {"compress": True}, {"preallocation": "metadata"},
    {"compat": "0.10", "cluster_size": 4096}, {"cluster_size": 2 * MiB},
])
def test_images_imgcopy_writes(tmp_path, capfd, monkeypatch, layout):
    require_qemu()
    src = seeded_raw(tmp_path / "src.raw", 3 * MiB + 1024, seed=len(layout))
    dst = tmp_path / "dst.qcow2"
    imgcopy.convert(src, dst, dst_format="qcow2",
                    create_options=imgcopy.Qcow2Options(**layout))
    q = assert_same(capfd, monkeypatch, dst)
    assert q[0] == 0


# ---- damaged images ------------------------------------------------------

def damage_and_compare(capfd, monkeypatch, path, edit, expect_rc):
    edit(Qcow2(path))
    q = assert_same(capfd, monkeypatch, path)
    assert q[0] == expect_rc, q
    r = imgcopy.check(path)
    assert r.exit_code == expect_rc and not r.ok
    return q


def test_raised_refcount_is_a_leak(capfd, monkeypatch, base):
    def edit(q):
        data = q.u64(q.l2_entry_offset(0, 0)) & 0x00fffffffffffe00
        q.refcount(data // q.cs, 2)
    damage_and_compare(capfd, monkeypatch, base, edit, 2)  # and OFLAG_COPIED


def test_refcount_of_unreferenced_cluster_is_a_leak(capfd, monkeypatch, base):
    def edit(q):
        q.u64(q.l2_entry_offset(0, 5), 0)  # the cluster is referenced no more
    damage_and_compare(capfd, monkeypatch, base, edit, 3)


def test_refcount_zero_is_a_corruption(capfd, monkeypatch, base):
    def edit(q):
        data = q.u64(q.l2_entry_offset(0, 1)) & 0x00fffffffffffe00
        q.refcount(data // q.cs, 0)
    damage_and_compare(capfd, monkeypatch, base, edit, 2)


def test_two_l2_entries_one_cluster(capfd, monkeypatch, base):
    def edit(q):
        q.u64(q.l2_entry_offset(0, 3), q.u64(q.l2_entry_offset(0, 0)))
    damage_and_compare(capfd, monkeypatch, base, edit, 2)


def test_misaligned_l2_entry(capfd, monkeypatch, base):
    def edit(q):
        off = q.l2_entry_offset(0, 2)
        q.u64(off, q.u64(off) + 0x200)
    damage_and_compare(capfd, monkeypatch, base, edit, 2)


def test_misaligned_preallocated_zero_entry(capfd, monkeypatch, base):
    def edit(q):
        off = q.l2_entry_offset(0, 2)
        q.u64(off, (q.u64(off) + 0x400) | 1)
    damage_and_compare(capfd, monkeypatch, base, edit, 2)


def test_reserved_bits(capfd, monkeypatch, base):
    def edit(q):
        off = q.l2_entry_offset(0, 0)
        q.u64(off, q.u64(off) | 1 << 56)
        l1 = q.l1_entry_offset(0)
        q.u64(l1, q.u64(l1) | 1 << 57)
    damage_and_compare(capfd, monkeypatch, base, edit, 2)


def test_l1_entry_outside_the_file(capfd, monkeypatch, base):
    def edit(q):
        q.u64(q.l1_entry_offset(0), COPIED | 1 << 40)
    damage_and_compare(capfd, monkeypatch, base, edit, 2)


def test_misaligned_l1_entry(capfd, monkeypatch, base):
    def edit(q):
        off = q.l1_entry_offset(0)
        q.u64(off, q.u64(off) + 0x1000)
    damage_and_compare(capfd, monkeypatch, base, edit, 2)


def test_copied_flag_cleared(capfd, monkeypatch, base):
    def edit(q):
        off = q.l2_entry_offset(0, 1)
        q.u64(off, q.u64(off) & ~COPIED)
        off = q.l1_entry_offset(0)
        q.u64(off, q.u64(off) & ~COPIED)
    damage_and_compare(capfd, monkeypatch, base, edit, 2)


def test_copied_flag_set_on_shared_cluster(tmp_path, capfd, monkeypatch, base):
    qemu_img("snapshot", "-c", "s", base)

    def edit(q):
        off = q.l2_entry_offset(0, 0)
        assert not q.u64(off) & COPIED  # shared with the snapshot: refcount 2
        q.u64(off, q.u64(off) | COPIED)
    damage_and_compare(capfd, monkeypatch, base, edit, 2)


def test_copied_flag_on_compressed_cluster(tmp_path, capfd, monkeypatch):
    require_qemu()
    src = seeded_raw(tmp_path / "src.raw", 1 * MiB, seed=9)
    p = tmp_path / "c.qcow2"
    qemu_img("convert", "-c", "-O", "qcow2", src, p)

    def edit(q):
        for j in range(16):
            off = q.l2_entry_offset(0, j)
            e = q.u64(off)
            if e & 1 << 62:
                q.u64(off, e | COPIED)
                return
        raise AssertionError("no compressed cluster")
    damage_and_compare(capfd, monkeypatch, p, edit, 2)


def test_leaked_clusters_at_the_end(capfd, monkeypatch, base):
    def edit(q):
        end = os.path.getsize(q.path)
        with open(q.path, "ab") as f:
            f.write(b"\x55" * (3 * q.cs))
        for c in range(end // q.cs, end // q.cs + 3):
            q.refcount(c, 1)
    damage_and_compare(capfd, monkeypatch, base, edit, 3)


def test_refcount_block_past_eof(capfd, monkeypatch, base):
    def edit(q):
        q.u64(q.reftable, 0x10000000)
    damage_and_compare(capfd, monkeypatch, base, edit, 2)


def test_refcount_block_unreferenced_twice(capfd, monkeypatch, base):
    def edit(q):
        # a second table entry names the same block
        q.u64(q.reftable + 8, q.u64(q.reftable))
    damage_and_compare(capfd, monkeypatch, base, edit, 2)


def test_refcount_table_entry_reserved_bits(capfd, monkeypatch, base):
    def edit(q):
        q.u64(q.reftable + 8, 0x30000 | 0x100)
    damage_and_compare(capfd, monkeypatch, base, edit, 2)


def test_seeded_random_damage(tmp_path, capfd, monkeypatch):
    """Refcounts and L2 entries changed at random, a few at a time."""
    require_qemu()
    for seed in range(6):
        p = create(tmp_path / f"r{seed}.qcow2", 2 * MiB, "cluster_size=4096")
        write_seeded(p, 2 * MiB, seed=seed, count=8, zeros=1)
        q = Qcow2(p)
        rnd = random.Random(seed)
        nclusters = os.path.getsize(p) // q.cs
        for _ in range(3):
            if rnd.random() < 0.5:
                c = rnd.randrange(nclusters)
                q.refcount(c, rnd.choice([0, 1, 2, 3]))
            else:
                off = q.l2_entry_offset(0, rnd.randrange(q.cs // 8))
                e = q.u64(off)
                q.u64(off, rnd.choice([0, e ^ COPIED, e + q.cs, e | 0x200,
                                       COPIED | rnd.randrange(nclusters) * q.cs]))
        assert_same(capfd, monkeypatch, p)


def test_misaligned_refcount_block_is_a_check_error(capfd, monkeypatch, base):
    def edit(q):
        q.u64(q.reftable, q.u64(q.reftable) + 0x200)
    q = damage_and_compare(capfd, monkeypatch, base, edit, 1)
    assert "Check failed" in q[2]


def test_dirty_image_with_lazy_refcounts(tmp_path, capfd, monkeypatch):
    """An image whose writer died before it updated the refcounts (qemu-io
    abort): opened read-only, dirty as it is."""
    require_qemu()
    p = create(tmp_path / "lazy.qcow2", 4 * MiB, "lazy_refcounts=on")
    subprocess.run(["qemu-io", "-f", "qcow2", "-c", "write -P 1 0 200k",
                    "-c", "write -P 2 1m 64k", "-c", "abort", str(p)],
                   capture_output=True, timeout=60)
    q = assert_same(capfd, monkeypatch, p)
    assert q[0] == 2


@pytest.mark.parametrize("bits", [1, 2, 8, 32, 64])
def test_refcount_widths(tmp_path, capfd, monkeypatch, bits):
    require_qemu()
    p = create(tmp_path / "w.qcow2", 2 * MiB, f"refcount_bits={bits}", "cluster_size=4096")
    write_seeded(p, 2 * MiB, seed=bits, count=6, zeros=1)
    assert assert_same(capfd, monkeypatch, p)[0] == 0
    # the second reference to a cluster: a corruption, or past a 1-bit maximum
    # an overflow
    q = Qcow2.__new__(Qcow2)
    q.path = p
    with open(p, "rb") as f:
        h = f.read(48)
    q.l1_offset = struct.unpack(">Q", h[40:48])[0]
    entries = [q.u64(q.l2_entry_offset(0, j)) for j in range(512)]
    data = next(e for e in entries if e & 0x00fffffffffffe00)
    q.u64(q.l2_entry_offset(0, entries.index(0)), data)
    assert assert_same(capfd, monkeypatch, p)[0] == 2


# ---- refused, errors, the API ---------------------------------------------

def test_raw_is_not_supported(tmp_path, capfd, monkeypatch):
    require_qemu()
    p = tmp_path / "a.raw"
    p.write_bytes(os.urandom(5000))
    for flags in ((), ("-f", "raw")):
        q, ours = run_both(capfd, monkeypatch, p, *flags)
        assert q[0] == ours[0] == 63
        assert ours[1] == q[1] == ""
        assert ours[2] == q[2]
    with pytest.raises(OSError) as exc:
        imgcopy.check(p)
    assert exc.value.errno == 95


def test_quiet(capfd, monkeypatch, base):
    q = Qcow2(base)
    q.refcount((q.u64(q.l2_entry_offset(0, 0)) & 0x00fffffffffffe00) // q.cs, 0)
    q, ours = run_both(capfd, monkeypatch, base, "-q")
    assert ours == q and q[1] == "" and q[0] == 2


def test_result_fields_match_json(capfd, monkeypatch, base):
    qemu_io(base, ["write -P 6 1m 64k"], fmt="qcow2")
    q = Qcow2(base)
    q.u64(q.l2_entry_offset(0, 5), 0)  # its cluster is leaked
    r = imgcopy.check(base)
    monkeypatch.chdir(base.parent)
    j = json.loads(qemu_img("check", "--output=json", base.name, check=False).stdout)
    for key, value in j.items():
        attr = key.replace("-", "_")
        assert getattr(r, attr) == (value if attr != "filename" else str(base))
    assert r.leaks == j["leaks"] and bool(r) is False


def test_open_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        imgcopy.check(tmp_path / "missing.qcow2")
    p = tmp_path / "a.raw"
    p.write_bytes(b"\0" * 4096)
    with pytest.raises(imgcopy.ImageFormatError):
        imgcopy.check(p, format="qcow2")
    assert cli_main(["check", "-f", "qcow2", str(p)]) == 1


HOSTILE = sorted(os.listdir(REGRESSIONS)) if REGRESSIONS.is_dir() else []

_CHECK_ALL = """
import json, sys, imgcopy
for name in sys.argv[1:]:
    print(name, file=sys.stderr, flush=True)  # the last one named crashed, if any
    try:
        out = imgcopy.check(name).to_json()
    except (OSError, ValueError, imgcopy.Error) as e:
        out = "ERR %s %s" % (type(e).__name__, e)
    print(json.dumps([name, out]), flush=True)
"""


def test_hostile_images(tmp_path):
    """Every hostile image (tests/fuzz/regressions/qcow2/), checked through
    the Python API in a child process: an error or qemu's answer, never a
    crash or a hang."""
    assert HOSTILE
    for name in HOSTILE:
        (tmp_path / name).write_bytes((REGRESSIONS / name).read_bytes())
    proc = subprocess.run([sys.executable, "-c", _CHECK_ALL, *HOSTILE], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = dict(json.loads(line) for line in proc.stdout.splitlines())
    assert sorted(results) == HOSTILE
    compared = 0
    for name, ours in results.items():
        if ours.startswith("ERR"):
            continue
        try:  # qemu takes minutes on some (L1 tables naming one L2 table 8192 times)
            q = qemu_img("check", "--output=json", name, cwd=tmp_path, check=False, timeout=3)
        except subprocess.TimeoutExpired:
            continue
        if q.returncode in (0, 2, 3):
            assert ours == q.stdout, (name, q.stderr[-1000:])
            compared += 1
    assert compared > 0


def test_odd_file_names(tmp_path, capfd, monkeypatch, base):
    """The name in the JSON is escaped as qemu escapes it."""
    for name in ['we ird "q" \\ é.qcow2', "x\x01\x7f.qcow2", os.fsdecode(b"bad\xff.qcow2")]:
        p = tmp_path / name
        p.write_bytes(base.read_bytes())
        q, ours = run_both(capfd, monkeypatch, p, "--output=json")
        assert ours == q


@pytest.mark.parametrize("field,value", [("l1_offset", 0x200), ("l1_size", 0x1000000),
                                         ("l1_offset", 1 << 40)])
def test_snapshot_table_damage(capfd, monkeypatch, base, field, value):
    qemu_img("snapshot", "-c", "snap-one", base)
    qemu_io(base, ["write -P 9 0 64k"], fmt="qcow2")

    def edit(q):
        table = q.u64(64)
        if field == "l1_offset":
            q.u64(table, q.u64(table) + value)
        else:
            with open(q.path, "r+b") as f:
                f.seek(table + 8)
                f.write(struct.pack(">I", value))
    edit(Qcow2(base))
    q = assert_same(capfd, monkeypatch, base)
    assert q[0] in (2, 3)


@pytest.mark.parametrize("seed", range(4))
def test_seeded_damage_with_snapshots_and_compression(tmp_path, capfd, monkeypatch, seed):
    require_qemu()
    src = seeded_raw(tmp_path / "src.raw", 1 * MiB, seed=seed)
    p = tmp_path / "d.qcow2"
    qemu_img("convert", "-c", "-O", "qcow2", "-o", "cluster_size=4096", src, p)
    qemu_img("snapshot", "-c", "s1", p)
    write_seeded(p, 1 * MiB, seed=seed, count=4, zeros=1)
    assert assert_same(capfd, monkeypatch, p)[0] == 0
    q = Qcow2(p)
    rnd = random.Random(seed)
    nclusters = os.path.getsize(p) // q.cs
    for _ in range(4):
        if rnd.random() < 0.5:
            q.refcount(rnd.randrange(nclusters), rnd.choice([0, 1, 2, 3]))
        else:
            off = q.l2_entry_offset(0, rnd.randrange(q.cs // 8))
            e = q.u64(off)
            q.u64(off, rnd.choice([0, e ^ COPIED, e ^ (1 << 62), e + 512, e | 1]))
    assert_same(capfd, monkeypatch, p)


@pytest.mark.parametrize("bits", [1, 16])
def test_l1_entries_naming_one_l2_table(tmp_path, capfd, monkeypatch, bits):
    """The second L1 entry names the first one's L2 table: its pass is
    replayed (16 bits) or, where a count would overflow (1 bit), scanned
    again; qemu's output either way."""
    require_qemu()
    p = create(tmp_path / "twice.qcow2", 8 * MiB, f"refcount_bits={bits}", "cluster_size=4096")
    qemu_io(p, ["write -P 1 0 12k", "write -P 2 1m 8k", "write -P 3 3m 4k"], fmt="qcow2")
    q = Qcow2.__new__(Qcow2)
    q.path = p
    with open(p, "rb") as f:
        q.l1_offset = struct.unpack(">Q", f.read(48)[40:48])[0]
    first = q.u64(q.l1_entry_offset(0))
    for i in (1, 3):
        q.u64(q.l1_entry_offset(i), first)
    out = assert_same(capfd, monkeypatch, p)
    assert out[0] == 2
    if bits == 1:
        assert "overflow" in out[2]


@pytest.mark.parametrize("bits", [1, 2])
def test_l2_table_named_until_counts_saturate(tmp_path, capfd, monkeypatch, bits):
    """Six L1 entries name one L2 table, two of whose entries name one host
    cluster: with 1 or 2 refcount bits the counts reach the maximum, some
    in the middle of a pass (that pass is scanned again), then stay there
    (every reference an overflow: those passes are replayed).  qemu's
    output, overflow lines and counters included."""
    require_qemu()
    p = create(tmp_path / "saturate.qcow2", 8 * MiB, f"refcount_bits={bits}",
               "cluster_size=4096")
    qemu_io(p, ["write -P 1 0 12k", "write -P 2 1m 8k"], fmt="qcow2")
    q = Qcow2.__new__(Qcow2)
    q.path = p
    with open(p, "rb") as f:
        q.l1_offset = struct.unpack(">Q", f.read(48)[40:48])[0]
    q.u64(q.l2_entry_offset(0, 3), q.u64(q.l2_entry_offset(0, 0)))
    first = q.u64(q.l1_entry_offset(0))
    for i in range(1, 6):
        q.u64(q.l1_entry_offset(i), first)
    out = assert_same(capfd, monkeypatch, p)
    assert out[0] == 2
    assert out[2].count("ERROR: overflow cluster") > 6
