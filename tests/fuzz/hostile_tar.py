"""Hand-made hostile tar archives, for tests/fuzz/regressions/tar/.

Each case is an archive the tar parser and the member protocol must turn
into an error (or read correctly) without crashing, hanging, reading
outside the file or allocating without bound.  The harness asks for the
members "disk.raw", "disk.qcow2", "vm/top.qcow2", "a.raw" and the name in
the first header.  Cases with qcow2 members need qemu-img (they are
skipped without it).

    python3 tests/fuzz/hostile_tar.py [OUTDIR]
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from typing import Callable, Dict

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from tests.gen.tar_archives import end_blocks, header, pad  # noqa: E402

DATA = b"\x5a" * 1536


def member(name, body, **kw):
    return header(name, len(body), **kw) + body + pad(len(body))


def pax(records: Dict[str, str], typeflag=b"x") -> bytes:
    out = b""
    for key, value in records.items():
        rec = (" %s=%s\n" % (key, value)).encode()
        n = len(rec) + 1
        while len(rec) + len(str(n)) != n:  # the length counts its own digits
            n = len(rec) + len(str(n))
        out += str(n).encode() + rec
    return member("PaxHeader", out, typeflag=typeflag, magic="posix")


def qcow2(path, backing=None, size="64k"):
    args = ["qemu-img", "create", "-q", "-f", "qcow2", "-o", "cluster_size=512"]
    if backing:
        args += ["-u", "-b", backing, "-F", "qcow2"]
    subprocess.run(args + [path, size], check=True)
    with open(path, "rb") as f:
        return f.read()


def cases(tmp) -> Dict[str, Callable[[], bytes]]:
    c: Dict[str, Callable[[], bytes]] = {
        "bad-checksum": lambda: header("disk.raw", 1536, checksum_delta=7) + DATA + end_blocks(),
        "checksum-spaces": lambda: header("disk.raw", 0, extra={148: b" " * 8})[:148] +
        b" " * 8 + header("disk.raw", 0)[156:] + end_blocks(),
        "long-name-claims-1g": lambda: header("././@LongLink", 1 << 30, typeflag=b"L") +
        b"disk.raw\0" + bytes(503) + member("x", DATA),
        "long-name-over-64k": lambda: member("././@LongLink", b"d" * 65537, typeflag=b"L") +
        member("x", DATA) + end_blocks(),
        "long-name-no-nul": lambda: member("././@LongLink", b"disk.raw", typeflag=b"L") +
        member("x", DATA) + end_blocks(),
        "base256-negative": lambda: header("disk.raw", 0, extra={124: b"\xff" * 12}) + DATA,
        "base256-huge": lambda: header("disk.raw", (1 << 80) + 5, base256=True) + DATA,
        "base256-8g": lambda: header("disk.raw", 8 << 30, base256=True) + DATA + end_blocks(),
        "member-past-eof": lambda: header("disk.raw", 1 << 20) + DATA,
        "truncated-header": lambda: member("a.raw", DATA) + header("disk.raw", 512)[:300],
        "pax-length-too-long": lambda: member("PaxHeader", b"99 path=disk.raw\n",
                                              typeflag=b"x") + member("x", DATA),
        "pax-length-zero": lambda: member("PaxHeader", b"0 path=disk.raw\n", typeflag=b"x") +
        member("x", DATA),
        "pax-no-equals": lambda: pax({"pathdisk.raw": "x"}).replace(b"=x", b"xx") +
        member("x", DATA),
        "pax-size-huge": lambda: pax({"path": "disk.raw", "size": "18446744073709551615"}) +
        member("x", DATA) + end_blocks(),
        "pax-size-overflow": lambda: pax({"size": "99999999999999999999999"}) +
        member("disk.raw", DATA),
        "pax-size-past-eof": lambda: pax({"size": str(1 << 40)}) + member("disk.raw", DATA),
        "pax-size-nondigit": lambda: pax({"size": "12x"}) + member("disk.raw", DATA),
        "pax-path-nul": lambda: pax({"path": "disk.raw\0evil"}) + member("x", DATA),
        "pax-global-path": lambda: pax({"path": "disk.raw"}, typeflag=b"g") +
        member("other", DATA) + end_blocks(),
        "pax-sparse-name": lambda: pax({"GNU.sparse.name": "disk.raw", "GNU.sparse.major": "1",
                                        "GNU.sparse.minor": "0"}) +
        member("GNUSparseFile.1/disk.raw", DATA) + end_blocks(),
        "gnu-sparse-extensions-to-eof": lambda: header("disk.raw", 512, typeflag=b"S",
                                                       extra={482: b"\x01"}) +
        (bytes(504) + b"\x01" + bytes(7)) * 40,
        "gnu-sparse-then-member": lambda: header("s.raw", 512, typeflag=b"S",
                                                 extra={482: b"\x01"}) +
        bytes(512) + bytes(512) + member("disk.raw", DATA) + end_blocks(),
        "many-empty-members": lambda: b"".join(header("e%d" % i, 0) for i in range(400)) +
        member("disk.raw", DATA) + end_blocks(),
        "directory-named-disk": lambda: header("disk.raw", 0, typeflag=b"5") + end_blocks(),
        "hardlink-named-disk": lambda: header("disk.raw", 4096, typeflag=b"1",
                                              extra={157: b"a.raw"}) +
        member("a.raw", DATA) + end_blocks(),
        "lone-zero-block": lambda: member("a.raw", DATA) + bytes(512) + member("disk.raw", DATA),
        "prefix-full": lambda: header("n" * 100, 1536, magic="posix", prefix=b"p" * 155) + DATA +
        end_blocks(),
        "multivolume-named-disk": lambda: member("disk.raw", DATA, typeflag=b"M") + end_blocks(),
        "contiguous-type-7": lambda: member("disk.raw", DATA, typeflag=b"7") + end_blocks(),
        "odd-size-member-at-end": lambda: header("disk.raw", 1000) + DATA[:1000],
    }
    if shutil.which("qemu-img"):
        def q(name, backing=None):
            return qcow2(os.path.join(tmp, name.replace("/", "_")), backing)
        c.update({
            "backing-self": lambda: member("vm/top.qcow2", q("vm/top.qcow2", "top.qcow2")) +
            end_blocks(),
            "backing-loop-pair": lambda: member("vm/top.qcow2", q("vm/top.qcow2", "base.qcow2")) +
            member("vm/base.qcow2", q("vm/base.qcow2", "top.qcow2")) + end_blocks(),
            "backing-escapes": lambda: member("vm/top.qcow2", q("vm/top.qcow2", "../a.raw")) +
            member("a.raw", DATA) + end_blocks(),
            "backing-absolute": lambda: member("disk.qcow2", q("disk.qcow2", "/etc/hostname")) +
            end_blocks(),
            "backing-missing": lambda: member("disk.qcow2", q("disk.qcow2", "nope.qcow2")) +
            end_blocks(),
            "qcow2-cut-short": lambda: member("disk.qcow2", q("disk.qcow2")[:700]) +
            end_blocks(),
        })
    return c


def main(out=None) -> None:
    out = out or os.path.join(HERE, "regressions", "tar")
    os.makedirs(out, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name, make in sorted(cases(tmp).items()):
            with open(os.path.join(out, "hostile-%s.tar" % name), "wb") as f:
                f.write(make())


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
