"""Guest-order turns of the copy engine: in-kernel copy (offload) taken or
refused, in and out of order, into every kind of destination, each under a
timeout (a refused offload once handed the write turn on and then waited
for it: `convert -C --in-order` into null: or qcow2 hung)."""
import json
import os
import subprocess
import sys

import pytest

from .gen.sparse import make_sparse
from .units import MiB

SIZE = 24 * MiB
TIMEOUT = 60

DESTINATIONS = ["raw", "raw-existing", "qcow2", "qcow2-compressed", "qcow2-existing", "null"]

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Runs in a child (in the repository, so that it imports the tests' oracles):
# a hang fails the test by its timeout instead of hanging pytest; each
# combination says when it starts, so a hang names itself.
CHILD = r"""
import itertools, json, os, sys
import imgcopy
from tests.oracles import assert_same_content, qemu_img

src, dest, workdir = sys.argv[1:4]
size = os.path.getsize(src)
for offload, in_order, threads in itertools.product((False, True), (False, True), (1, 4)):
    combo = dict(dest=dest, offload=offload, in_order=in_order, threads=threads)
    print("start", json.dumps(combo), flush=True)
    kw = dict(offload=offload, out_of_order=not in_order, concurrency=threads,
              request_size=256 << 10)
    if dest == "null":
        dst = "null:"
    else:
        fmt = "qcow2" if dest.startswith("qcow2") else "raw"
        dst = os.path.join(workdir, "out." + fmt)
        kw["dst_format"] = fmt
        if dest.endswith("-existing"):
            qemu_img("create", "-f", fmt, dst, str(size))
            kw["create"] = False
        if dest == "qcow2-compressed":
            kw["compress"] = True
    result = imgcopy.convert(src, dst, **kw)
    assert result.bytes_written + result.bytes_zeroed + result.bytes_skipped == size
    if dst != "null:":
        assert_same_content(src, dst, "raw", kw["dst_format"])
        os.unlink(dst)
    print("done", json.dumps(combo), flush=True)
"""


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("turns") / "src.raw")
    data = []
    for i, off in enumerate(range(0, SIZE, 3 * MiB)):
        chunk = bytes([(i * 37 + k) % 251 + 1 for k in range(4096)]) * 64
        data.append((off, chunk[: (i % 3 + 1) * 256 * 1024]))
    make_sparse(path, SIZE, data)
    return path


@pytest.mark.parametrize("dest", DESTINATIONS)
def test_offload_in_order_never_hangs(source, tmp_path, dest):
    try:
        proc = subprocess.run([sys.executable, "-c", CHILD, source, dest, str(tmp_path)],
                              capture_output=True, text=True, timeout=TIMEOUT, cwd=REPO)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        started = [line for line in out.splitlines() if line.startswith("start")]
        pytest.fail("hung: %s" % (started[-1] if started else "before the first copy"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    done = [json.loads(line.split(" ", 1)[1]) for line in proc.stdout.splitlines()
            if line.startswith("done")]
    assert len(done) == 8, proc.stdout
