"""Internal snapshots in ``imgcopy.info()`` against ``qemu-img info`` (7.2).

qemu-img's JSON lists them under "snapshots" (only when there is at least
one), each an object whose keys come in the order qemu's QDict prints them:
"icount" (absent when the entry stores none, or stores -1), "vm-clock-nsec",
"name", "date-sec", "date-nsec", "vm-clock-sec", "id", "vm-state-size".
The human output has a "Snapshot list:" table whose dates are local time:
both qemu-img and this process run with TZ set (UTC unless a test says
otherwise).

The images come from qemu-img (snapshot -c/-d, writes with qemu-io between
them) and from snapshot tables written here byte by byte, to reach what
qemu-img cannot make: no extra data, unknown extra data, icount -1 and
negative, VM state sizes above 4 GiB and 2**63, clocks past 99 hours,
IDs and names longer than qemu keeps (127 and 255 bytes), NULs, non-ASCII
and invalid UTF-8.  Those tables point every entry at the active L1 table:
refcounts are not updated (qemu-img check would complain; info does not).

``ImageInfo.snapshots`` is read here only through to_dict(), to_json() and
to_human().
"""
import json
import os
import struct
import sys
import time

import pytest

import imgcopy

from .gen.qcow2_images import build_named
from .oracles import qemu_img, qemu_io, run

SNAPSHOT_HEADER = struct.Struct(">QIHHIIQII")
U64_MAX = (1 << 64) - 1


def qemu_info_json(path):
    """qemu-img info --output=json: (parsed, text)."""
    text = qemu_img("info", "-f", "qcow2", "--output=json", path).stdout
    return json.loads(text), text


def qemu_info_human(path):
    return qemu_img("info", "-f", "qcow2", path).stdout


# --------------------------------------------------------------------------
# hand-written snapshot tables


def extra_data(vm_state_size=None, disk_size=None, icount=None, unknown=b""):
    out = b""
    for value in (vm_state_size, disk_size, icount):
        if value is None:
            break
        out += struct.pack(">Q", value)
    return out + unknown


def entry(id_str, name, l1=(0, 0), date_sec=0, date_nsec=0, vm_clock_nsec=0,
          vm_state_size32=0, extra=b""):
    id_b = id_str if isinstance(id_str, bytes) else id_str.encode("utf-8")
    name_b = name if isinstance(name, bytes) else name.encode("utf-8")
    e = SNAPSHOT_HEADER.pack(l1[0], l1[1], len(id_b), len(name_b), date_sec, date_nsec,
                             vm_clock_nsec, vm_state_size32, len(extra)) + extra + id_b + name_b
    return e + b"\0" * (-len(e) % 8)


def write_snapshot_table(path, make_entries):
    """Replace the snapshot table by make_entries(l1) (l1: the active L1
    table's offset and size), appended at the next cluster boundary."""
    with open(path, "r+b") as f:
        hdr = f.read(72)
        cluster_size = 1 << struct.unpack_from(">I", hdr, 20)[0]
        l1_size, l1_offset = struct.unpack_from(">IQ", hdr, 36)
        entries = make_entries((l1_offset, l1_size))
        at = -(-os.path.getsize(path) // cluster_size) * cluster_size
        f.seek(at)
        f.write(b"".join(entries))
        f.seek(60)
        f.write(struct.pack(">IQ", len(entries), at))


def crafted_ascii(l1):
    return [
        # extra data up to icount: the 64-bit VM state size wins over the 32-bit one
        entry("1", "full extra", l1, date_sec=1700000000, date_nsec=999999999,
              vm_clock_nsec=3723 * 10**9 + 456789123, vm_state_size32=5,
              extra=extra_data(1 << 40, 1 << 20, 12345)),
        # no extra data (a v2-era entry): 32-bit VM state size, no icount
        entry("abc", "no extra data", l1, date_sec=0xFFFFFFFF, vm_clock_nsec=U64_MAX,
              vm_state_size32=0xFFFFFFFF),
        entry("x" * 200, "vm state size only", l1, vm_state_size32=7, extra=extra_data(3)),
        entry("7", "no icount", l1, extra=extra_data(1536, 1 << 20)),
        # the most extra data qemu accepts, 1000 bytes of it unknown
        entry("8", "unknown extra data", l1, extra=extra_data(1, 2, 3, b"\xff" * 1000)),
        entry("9", "icount -1", l1, extra=extra_data(1, 2, U64_MAX)),
        # int64 in QAPI: these print as -1 and -2
        entry("10", "huge", l1, extra=extra_data(U64_MAX, 0, U64_MAX - 1)),
        entry("11", "clock past 99 hours", l1, vm_clock_nsec=360000 * 10**9 + 5 * 10**6),
        entry("12", "N" * 300, l1, date_sec=86399, date_nsec=1),
        entry("", "", l1),
        entry("13", b"cut at\0the NUL", l1),
        entry("14", 'quote " backslash \\ tab \t slash /', l1),
        entry("15", "x", l1, vm_state_size32=1023, date_sec=951782400),
        entry("16", "y", l1, extra=extra_data(1023 * 1024 * 1024 * 1024)),
    ]


def crafted_utf8(l1):
    return [
        entry("1", "café ü", l1, date_sec=1234567890),
        entry("2", "astral \U0001F600 char", l1),
        entry("é", "id not ASCII", l1),
        entry("4", "ü" * 127 + "x", l1),          # 255 bytes: kept whole
        entry("5", "del \x7f char", l1),
    ]


def crafted_bytes(l1):
    # only for the JSON: qemu prints these names raw in its human table
    return [
        entry("1", b"bad \xff byte", l1),
        entry("2", "é" * 200, l1),                # cut at 255 bytes: in the middle of a char
        entry("3", b"x" * 254 + "é".encode(), l1),
        entry("4", "new\nline", l1),
        entry("5", b"\x01\x02 control", l1),
    ]


def make_crafted(make_entries, compat="1.1"):
    def build(path):
        qemu_img("create", "-f", "qcow2", "-o", "compat=" + compat, path, "1M")
        write_snapshot_table(path, make_entries)
    return build


def make_with_commands(*steps, compat="1.1"):
    """steps: ("snap", name) | ("delete", name) | ("write", qemu-io command)."""
    def build(path):
        qemu_img("create", "-f", "qcow2", "-o", "compat=" + compat, path, "1M")
        for kind, arg in steps:
            if kind == "snap":
                qemu_img("snapshot", "-c", arg, path)
            elif kind == "delete":
                qemu_img("snapshot", "-d", arg, path)      # qemu 7.2: by name only
            else:
                qemu_io(path, [arg], fmt="qcow2")
    return build


def make_overlay(path):
    base = path + ".base.raw"
    with open(base, "wb") as f:
        f.truncate(1 << 20)
    qemu_img("create", "-f", "qcow2", "-b", os.path.basename(base), "-F", "raw", path)
    qemu_img("snapshot", "-c", "over", path)
    qemu_io(path, ["write -P 7 0 4k"], fmt="qcow2")


LONG_NAME = "L" * 255       # the longest name qemu-img snapshot -c keeps

IMAGES = {
    "no-snapshots": make_with_commands(),
    "all-deleted": make_with_commands(("snap", "a"), ("snap", "b"), ("delete", "a"),
                                      ("delete", "b")),
    "one": make_with_commands(("snap", "first")),
    # ids 1, 3, 4 after the delete; data written between the snapshots
    "several": make_with_commands(("snap", "first"), ("write", "write -P 0xab 0 64k"),
                                  ("snap", "name with spaces"),
                                  ("write", "write -P 0xcd 64k 64k"),
                                  ("snap", LONG_NAME), ("snap", "third"),
                                  ("delete", "name with spaces"),
                                  ("write", "write -z 0 4k")),
    "v2": make_with_commands(("snap", "a"), ("write", "write -P 1 0 512"), ("snap", "b"),
                             compat="0.10"),
    "overlay": make_overlay,
    "crafted-ascii": make_crafted(crafted_ascii),
    "crafted-ascii-v2": make_crafted(crafted_ascii, compat="0.10"),
    "crafted-utf8": make_crafted(crafted_utf8),
    "crafted-bytes": make_crafted(crafted_bytes),
}
# images whose names print as valid UTF-8 text on one line
HUMAN_IMAGES = [n for n in IMAGES if n != "crafted-bytes"]
CLI_IMAGES = ["no-snapshots", "several", "crafted-ascii", "crafted-utf8"]


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return build_named(tmp_path_factory.mktemp("snapshot-images"), IMAGES)


@pytest.fixture
def tz(monkeypatch):
    """set_tz(name): TZ for this process (time.tzset) and for qemu-img; UTC first."""
    def set_tz(name):
        monkeypatch.setenv("TZ", name)
        time.tzset()
    set_tz("UTC")
    yield set_tz
    monkeypatch.undo()
    time.tzset()


def json_block(text):
    """The lines of the top-level "snapshots" list of a JSON text (indent 4)."""
    lines = text.splitlines()
    if '    "snapshots": [' not in lines:
        return None
    start = lines.index('    "snapshots": [')
    end = lines.index("    ],", start)
    return lines[start:end + 1]


def human_block(text, count):
    """The "Snapshot list:" line, the table header and ``count`` rows."""
    lines = text.split("\n")
    if "Snapshot list:" not in lines:
        return None
    start = lines.index("Snapshot list:")
    return lines[start:start + 2 + count]


# --------------------------------------------------------------------------
# what qemu 7.2 prints: the report's findings, pinned so the oracle's format
# does not drift under the tests


def test_qemu_format_is_the_one_described(images, tz):
    q, text = qemu_info_json(images["crafted-ascii"])
    first, second = q["snapshots"][:2]
    assert list(first) == ["icount", "vm-clock-nsec", "name", "date-sec", "date-nsec",
                           "vm-clock-sec", "id", "vm-state-size"]
    assert list(second) == ["vm-clock-nsec", "name", "date-sec", "date-nsec",
                            "vm-clock-sec", "id", "vm-state-size"]
    assert first["vm-clock-sec"] == 3723 and first["vm-clock-nsec"] == 456789123
    assert first["vm-state-size"] == 1 << 40 and second["vm-state-size"] == 0xFFFFFFFF
    assert second["vm-clock-sec"] == U64_MAX // 10**9
    by_id = {s["id"]: s for s in q["snapshots"]}
    assert len(by_id["x" * 127]["id"]) == 127                 # IDs cut to 127 bytes
    assert by_id["12"]["name"] == "N" * 255                    # names to 255
    assert by_id["10"]["vm-state-size"] == -1 and by_id["10"]["icount"] == -2
    assert "icount" not in by_id["9"]
    assert by_id["13"]["name"] == "cut at"
    human = qemu_info_human(images["crafted-ascii"])
    block = human_block(human, len(q["snapshots"]))
    assert block[1] == ("ID        TAG               VM SIZE                DATE     VM CLOCK"
                        "     ICOUNT")
    # "%-9s %-16s %8s%20s%13s%11s": ID, TAG, VM SIZE, DATE, VM CLOCK, ICOUNT
    assert block[2] == "%-9s %-16s %8s%20s%13s%11s" % (
        "1", "full extra", "1 TiB", "2023-11-14 22:13:20", "01:02:03.456", "12345")
    assert block[3].endswith("4 GiB 2106-02-07 06:28:155124095:34:33.709           ")
    _, utf8_text = qemu_info_json(images["crafted-utf8"])
    assert '"caf\\u00E9 \\u00FC"' in utf8_text          # qemu escapes in upper case
    assert '"astral \\uD83D\\uDE00 char"' in utf8_text
    assert '"del \\u007F char"' in utf8_text


# --------------------------------------------------------------------------
# to_dict() / to_json()


@pytest.mark.parametrize("name", list(IMAGES))
def test_snapshots_in_to_dict_are_qemus(images, tz, name):
    path = images[name]
    q, _ = qemu_info_json(path)
    d = imgcopy.info(path).to_dict()
    if "snapshots" not in q:
        assert "snapshots" not in d
        return
    assert "snapshots" in d
    # values, key names and key order of every entry
    assert json.dumps(d["snapshots"]) == json.dumps(q["snapshots"])


@pytest.mark.parametrize("name", list(IMAGES))
def test_snapshots_key_sits_where_qemu_puts_it(images, tz, name):
    path = images[name]
    q, _ = qemu_info_json(path)
    d = imgcopy.info(path).to_dict()
    assert [k for k in d if k != "compressed-clusters"] == list(q)


@pytest.mark.parametrize("name", list(IMAGES))
def test_to_json_snapshots_text_is_qemus(images, tz, name):
    """Byte for byte, escapes included (qemu writes \\u00E9, \\u007F, surrogate
    pairs, \\uFFFD for bytes that are not UTF-8)."""
    path = images[name]
    _, text = qemu_info_json(path)
    assert json_block(imgcopy.info(path).to_json()) == json_block(text)


# --------------------------------------------------------------------------
# to_human()


@pytest.mark.parametrize("name", HUMAN_IMAGES)
def test_to_human_snapshot_list_is_qemus(images, tz, name):
    path = images[name]
    q, _ = qemu_info_json(path)
    count = len(q.get("snapshots", []))
    human = imgcopy.info(path).to_human()
    want = human_block(qemu_info_human(path), count)
    got = human_block(human, count)
    if want is None:
        assert got is None
        return
    assert got is not None, human
    for i, (g, w) in enumerate(zip(got, want)):
        assert g == w, "line %d of the snapshot list" % i
    assert len(got) == len(want)
    # the table comes right before "Format specific information:" in qemu's
    # output; imgcopy may put its own lines (compressed clusters) elsewhere
    lines = human.split("\n")
    after = lines[lines.index("Snapshot list:") + 2 + count]
    assert not after.startswith(" ") and after != "", after


@pytest.mark.parametrize("zone", ["Asia/Kolkata", "America/New_York", "Pacific/Chatham"])
def test_to_human_dates_are_local_time(images, tz, zone):
    tz(zone)
    for name in ("crafted-ascii", "several"):
        path = images[name]
        q, _ = qemu_info_json(path)
        count = len(q["snapshots"])
        assert human_block(imgcopy.info(path).to_human(), count) == \
            human_block(qemu_info_human(path), count)


# --------------------------------------------------------------------------
# the command line


@pytest.mark.parametrize("name", CLI_IMAGES)
def test_cli_info_json(images, tz, imgcopy_env, name):
    path = images[name]
    q, text = qemu_info_json(path)
    env = dict(imgcopy_env, TZ="UTC")
    out = run([sys.executable, "-m", "imgcopy", "info", "--output=json", path], env=env).stdout
    mine = json.loads(out)
    if "snapshots" not in q:
        assert "snapshots" not in mine
    else:
        assert json.dumps(mine["snapshots"]) == json.dumps(q["snapshots"])
    assert json_block(out) == json_block(text)


@pytest.mark.parametrize("name", CLI_IMAGES)
def test_cli_info_human(images, tz, imgcopy_env, name):
    path = images[name]
    q, _ = qemu_info_json(path)
    count = len(q.get("snapshots", []))
    env = dict(imgcopy_env, TZ="UTC")
    out = run([sys.executable, "-m", "imgcopy", "info", path], env=env).stdout
    assert human_block(out, count) == human_block(qemu_info_human(path), count)
