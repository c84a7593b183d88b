"""Hand-made hostile copy journals for tests/fuzz/fuzz_journal, written
from the format journal.h documents (not through csrc/journal.c: a second
reading of the format).

Each file is the harness's input: one byte picking the copy of
tests/fuzz/journal_ids.h (IDS below mirrors it), then the journal.  Each case
says what opening must do: refuse it with a message holding the given text,
or open it ("ok").

    python3 tests/fuzz/hostile_journal.py [OUTDIR]      write hostile-*.bin
    python3 tests/fuzz/hostile_journal.py --check       run each through
        ./fuzz_journal (built: make -C tests/fuzz FORMAT=journal) and check
        the outcome it reports
"""
import os
import random
import struct
import subprocess
import sys
import tempfile
import zlib
from typing import Callable, Dict, List, NamedTuple, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
MAGIC = b"ICJRNL\r\n"
U64 = (1 << 64) - 1


class Ident(NamedTuple):
    source: bytes
    destination: bytes
    size: int
    options: bytes
    algorithm: Optional[bytes]
    block_size: int
    digest_size: int


# journal_ids.h, in its order
IDS = [
    Ident(b"raw:/src.raw dev=2049,ino=12,size=1048676,mtime=1700000000.0", b"raw:/dst.raw",
          (1 << 20) + 100, b"sparse_threshold=4096 format=raw", b"sha256", 4096, 32),
    Ident(b"nbd+unix:///disk?socket=/run/src.sock", b"raw:/dst.raw", 1 << 20,
          b"sparse_threshold=0 format=raw", None, 512, 0),
    Ident(b"raw:/tiny", b"raw:/tiny.out", 101, b"", b"t", 2, 1),
    Ident(b"raw:/huge", b"nbd://host/huge", (1 << 62) + 3, b"format=qcow2", b"blake2b",
          1 << 16, 64),
    Ident(b"raw:/max", b"raw:/max.out", U64, b"o", None, 1, 0),
]


def crc(b: bytes) -> int:
    return zlib.crc32(b) & 0xffffffff


def header(i: Ident, version: int = 1, hlen: Optional[int] = None,
           lens: Optional[List[int]] = None, bad_crc: bool = False) -> bytes:
    texts = [i.algorithm or b"", i.source, i.destination, i.options]
    h = 52 + sum(map(len, texts)) + 4
    b = MAGIC + struct.pack("<IIQQI", version, h if hlen is None else hlen, i.size,
                            i.block_size, i.digest_size)
    b += struct.pack("<4I", *(lens or [len(t) for t in texts])) + b"".join(texts)
    return b + struct.pack("<I", crc(b) ^ (1 if bad_crc else 0))


def record(payload: bytes, length: Optional[int] = None, bad_crc: bool = False,
           bad_head: bool = False) -> bytes:
    head = struct.pack("<QI", len(payload) if length is None else length,
                       crc(payload) ^ (1 if bad_crc else 0))
    return head + struct.pack("<I", crc(head) ^ (1 if bad_head else 0)) + payload


def payload(i: Ident, ranges: List[Tuple[int, int]], zeros: Optional[List[bool]] = None,
            count: Optional[int] = None, flags: int = 0, extra: bytes = b"",
            digest_bytes: Optional[int] = None) -> bytes:
    """Ranges (offset, length); with digests, each block zero per `zeros`
    (data when not given) and digests for the data blocks."""
    b = struct.pack("<II", len(ranges) if count is None else count, flags)
    b += b"".join(struct.pack("<QQ", o, n) for o, n in ranges)
    if i.algorithm:
        blocks = sum(-(-n // i.block_size) for _, n in ranges)
        zeros = zeros if zeros is not None else [False] * blocks
        bits = bytearray(-(-len(zeros) // 8))
        for k, z in enumerate(zeros):
            if z:
                bits[k // 8] |= 1 << (k % 8)
        b += bytes(bits)
        ndata = sum(1 for z in zeros if not z)
        n = ndata * i.digest_size if digest_bytes is None else digest_bytes
        b += bytes((k * 7 + 1) & 0xff for k in range(n))
    return b + extra


def case(sel: int, body: bytes) -> bytes:
    return bytes([sel]) + body


ID0 = IDS[0]
BS0 = ID0.block_size


def good(k: int = 0) -> bytes:
    """A whole record of ID0: block k and k + 1, the second zero"""
    return record(payload(ID0, [(k * BS0, 2 * BS0)], [False, True]))


def scan_bait() -> bytes:
    """After a damaged record, a tail where every 16 bytes look like a
    record header (its checksum right, its length inside the file) whose
    payload checksum fails: the search for a whole record gives up."""
    tail = bytearray()
    n = 12000
    for k in range(n):
        length = (n - k - 1) * 16 + 8
        head = struct.pack("<QI", length, 0x12345678)
        tail += head + struct.pack("<I", crc(head))
    tail += b"\0" * 8
    return case(0, header(ID0) + good() + record(b"x" * 40, bad_crc=True) + bytes(tail))


def sweep_stress() -> bytes:
    """3000 records of ID2 over all 51 blocks, alternating zero and data:
    150000 runs to resolve at open"""
    i = IDS[2]
    body = bytearray(header(i))
    for k in range(3000):
        zeros = [(b + k) % 2 == 0 for b in range(51)]
        body += record(payload(i, [(0, i.size)], zeros))
    return case(2, bytes(body))


def many_ranges() -> bytes:
    """One record of ID4 (bytes, no digests) with 15000 ranges in any order"""
    rnd = random.Random(7)
    ranges = [(rnd.randrange(0, 1 << 40), rnd.randrange(1, 1 << 20)) for _ in range(15000)]
    return case(4, header(IDS[4]) + record(payload(IDS[4], ranges)))


def huge_blocks() -> bytes:
    """ID3: ranges whose block counts add up past 2^64 in a short record"""
    i = IDS[3]
    rs = [(0, i.size)] * 40
    return case(3, header(i) + record(payload(i, rs, zeros=[], digest_bytes=0)))


def random_tail() -> bytes:
    rnd = random.Random(11)
    return case(0, header(ID0) + good() + bytes(rnd.randrange(256) for _ in range(200000)))


CASES: Dict[str, Tuple[Callable[[], bytes], str]] = {
    # the header
    "magic": (lambda: case(0, b"ICJRNL\n\n" + header(ID0)[8:] + good()), "not an imgcopy journal"),
    "version-2": (lambda: case(0, header(ID0, version=2) + good()), "unsupported version 2"),
    "version-max": (lambda: case(0, header(ID0, version=0xffffffff)), "unsupported version"),
    "header-length-max": (lambda: case(0, header(ID0, hlen=0xffffffff) + good()),
                          "corrupt journal header"),
    "header-length-short": (lambda: case(0, header(ID0, hlen=20) + good()),
                            "corrupt journal header"),
    "header-length-past-eof": (lambda: case(0, header(ID0, hlen=4000)), "corrupt journal header"),
    "header-crc": (lambda: case(0, header(ID0, bad_crc=True) + good()), "its checksum fails"),
    "header-text-length-max": (
        lambda: case(0, header(ID0, lens=[0xffffffff, 0, 0, 0])), "corrupt journal header"),
    "header-texts-short": (lambda: case(0, header(ID0, lens=[6, 10, 12, 32])),
                           "corrupt journal header"),
    "header-only-another-copy": (lambda: case(1, header(ID0)), "belongs to another copy"),
    "header-creation-other": (lambda: case(1, header(ID0)[:60]), "corrupt journal header"),
    # records: lengths and checksums
    "record-length-max": (lambda: case(0, header(ID0) + record(b"x" * 24, length=U64) + good()),
                          "records follow it"),
    "record-length-tiny": (lambda: case(0, header(ID0) + record(b"", length=0)), "ok"),
    "record-head-crc-middle": (lambda: case(0, header(ID0) + record(
        payload(ID0, [(0, BS0)]), bad_head=True) + good()), "records follow it"),
    "record-crc-middle": (lambda: case(0, header(ID0) + record(
        payload(ID0, [(0, BS0)]), bad_crc=True) + good()), "records follow it"),
    "record-crc-last": (lambda: case(0, header(ID0) + good() + record(
        payload(ID0, [(0, BS0)]), bad_crc=True)), "ok"),
    "record-cut": (lambda: case(0, header(ID0) + good() + good(4)[:-7]), "ok"),
    "scan-bait": (scan_bait, "records follow it"),
    "random-tail": (random_tail, "ok"),
    # records: contents
    "flags": (lambda: case(0, header(ID0) + record(payload(ID0, [(0, BS0)], flags=2))),
              "unknown flags"),
    "no-ranges": (lambda: case(0, header(ID0) + record(payload(ID0, [], count=0))), "0 ranges"),
    "count-max": (lambda: case(0, header(ID0) + record(payload(ID0, [(0, BS0)],
                                                               count=0xffffffff))), "ranges in"),
    "range-empty": (lambda: case(0, header(ID0) + record(payload(ID0, [(0, 0)]))), "range 0+0"),
    "range-misaligned": (lambda: case(0, header(ID0) + record(payload(ID0, [(1, BS0)]))),
                         "range 1+"),
    "range-past-size": (lambda: case(0, header(ID0) + record(payload(
        ID0, [(256 * BS0, 2 * BS0)]))), "range"),
    "range-wraps": (lambda: case(0, header(ID0) + record(payload(
        ID0, [(U64 - BS0 + 1, BS0)]))), "range"),
    "range-max-length": (lambda: case(4, header(IDS[4]) + record(payload(IDS[4], [(1, U64)]))),
                         "range"),
    "bitmap-bits-past": (lambda: case(0, header(ID0) + record(
        payload(ID0, [(0, BS0)], digest_bytes=0)[:-1] + b"\xfe")), "bits set past"),
    "digests-short": (lambda: case(0, header(ID0) + record(payload(
        ID0, [(0, 2 * BS0)], digest_bytes=63))), "digest bytes"),
    "digests-long": (lambda: case(0, header(ID0) + record(payload(
        ID0, [(0, BS0)], digest_bytes=33))), "digest bytes"),
    "bytes-after-ranges": (lambda: case(1, header(IDS[1]) + record(
        payload(IDS[1], [(0, 512)], extra=b"\0"))), "bytes after its ranges"),
    "blocks-past-bitmap": (huge_blocks, "more blocks"),
    # sizes that must stay cheap
    "sweep-stress": (sweep_stress, "ok"),
    "many-ranges": (many_ranges, "ok"),
    "overlaps-last-wins": (lambda: case(0, header(ID0) + good(0) + good(1) + record(
        payload(ID0, [(0, 3 * BS0), (BS0, BS0)], [True, False, True, False]))), "ok"),
}


def write(outdir: str) -> None:
    os.makedirs(outdir, exist_ok=True)
    for name, (make, _) in CASES.items():
        with open(os.path.join(outdir, "hostile-%s.bin" % name), "wb") as f:
            f.write(make())


def check() -> int:
    """Each case through the harness (verbose): its outcome as expected"""
    binary = os.path.join(HERE, "fuzz_journal")
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        write(tmp)
        for name, (_, want) in CASES.items():
            path = os.path.join(tmp, "hostile-%s.bin" % name)
            p = subprocess.run([binary, path], capture_output=True, text=True,
                               env=dict(os.environ, IMGCOPY_FUZZ_VERBOSE="1"), timeout=60)
            opened = [ln for ln in p.stderr.splitlines() if ln.startswith("  open:")]
            said = opened[0] if opened else "(nothing)"
            ok = p.returncode == 0 and (
                said.startswith("  open: resumed") if want == "ok" else want in said)
            if not ok:
                bad += 1
                print("%s: expected %r, got %s (exit %d)" % (name, want, said, p.returncode))
    print("%d cases, %d unexpected" % (len(CASES), bad))
    return 1 if bad else 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--check"]:
        sys.exit(check())
    write(sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "regressions", "journal"))
