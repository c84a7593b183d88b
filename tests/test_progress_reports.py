"""Every long operation's progress callback: called at least once, never
going back, and its last report is (total, total) when the operation ran to
its end, however short it was (a checksum that took less than the glue's
100 ms wait slice used to report nothing at all, and one that took longer
stopped at its last slice: 87.7% on a 600 MiB image)."""
import os
import subprocess
import sys

import pytest

import imgcopy

from .gen.sparse import make_sparse, seeded_bytes
from .units import MiB


def check_reports(seen, total):
    assert seen, "the progress callback was never called"
    assert all(t == total for _, t in seen), seen
    dones = [d for d, _ in seen]
    assert dones == sorted(dones), "progress went back: %r" % dones
    assert all(0 <= d <= total for d in dones), seen
    assert seen[-1] == (total, total), "the last report is %r, not 100%%" % (seen[-1],)


class Bar:
    """An object with update(n) and a total it learns (as tqdm)."""

    def __init__(self):
        self.total = None
        self.n = 0
        self.steps = []

    def update(self, n):
        assert n >= 0
        self.n += n
        self.steps.append(n)


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    d = tmp_path_factory.mktemp("reports")
    small = str(d / "small.raw")             # done in well under 100 ms
    make_sparse(small, 3 * MiB + 512, [(4096, seeded_bytes(MiB, 3))])
    big = str(d / "big.raw")                 # long enough for reports on the way
    make_sparse(big, 96 * MiB, [(0, seeded_bytes(48 * MiB, 4)), (64 * MiB, b"x" * MiB)])
    empty = str(d / "empty.raw")
    make_sparse(empty, 0)
    return {"small": small, "big": big, "empty": empty}


@pytest.mark.parametrize("name", ["small", "big", "empty"])
def test_checksum(images, name):
    seen = []
    imgcopy.checksum(images[name], threads=1,
                     progress=lambda done, total: seen.append((done, total)))
    check_reports(seen, os.path.getsize(images[name]))


def test_checksum_of_a_prefix_and_in_an_update_bar(images):
    seen = []
    imgcopy.checksum(images["big"], progress=lambda d, t: seen.append((d, t)))
    check_reports(seen, 96 * MiB)
    bar = Bar()
    imgcopy.checksum(images["small"], progress=bar)
    assert bar.total == 3 * MiB + 512 and bar.n == bar.total, (bar.total, bar.n)


def test_checksum_of_a_qcow2_image(images, tmp_path):
    dst = str(tmp_path / "big.qcow2")
    imgcopy.convert(images["big"], dst, dst_format="qcow2", flush=False)
    seen = []
    imgcopy.checksum(dst, threads=1, progress=lambda d, t: seen.append((d, t)))
    check_reports(seen, 96 * MiB)


@pytest.mark.parametrize("name", ["small", "big", "empty"])
@pytest.mark.parametrize("dst_format", ["raw", "qcow2", "null"])
def test_convert(images, tmp_path, name, dst_format):
    seen = []
    dst = "null:" if dst_format == "null" else str(tmp_path / ("out." + dst_format))
    kw = {} if dst_format == "null" else {"dst_format": dst_format}
    imgcopy.convert(images[name], dst, flush=False, checksum=name == "small",
                    progress=lambda d, t: seen.append((d, t)), **kw)
    check_reports(seen, os.path.getsize(images[name]))


def test_convert_in_an_update_bar(images, tmp_path):
    bar = Bar()
    imgcopy.convert(images["big"], str(tmp_path / "o.raw"), flush=False, progress=bar)
    assert bar.total == 96 * MiB and bar.n == bar.total


@pytest.mark.parametrize("size_b", [None, 4 * MiB])
def test_compare_reaches_100_when_it_runs_to_the_end(images, tmp_path, size_b):
    """compare reports percents (qemu-img compare -p's); one that compared
    every byte ends at 100.00, as qemu-img's does."""
    b = str(tmp_path / "b.raw")
    with open(images["small"], "rb") as f:
        data = f.read()
    with open(b, "wb") as f:
        f.write(data)
        if size_b:
            f.truncate(size_b)
    seen = []
    res = imgcopy.compare(images["small"], b, on_progress=lambda p, tail: seen.append(p))
    assert res.identical
    assert seen and seen == sorted(seen) and seen[-1] == 100.0, seen


def test_cli_checksum_bar_reaches_100(images, imgcopy_env):
    p = subprocess.run([sys.executable, "-m", "imgcopy", "checksum", "-p", images["big"],
                        images["small"]], capture_output=True, env=imgcopy_env)
    assert p.returncode == 0, p.stderr
    text = (p.stdout + p.stderr).decode()
    finals = [[r for r in line.split("\r") if r][-1] for line in text.split("\n") if "%" in line]
    assert len(finals) == 2 and all("100.0" in f for f in finals), repr(text)


def test_checksum_callback_raising_at_100_fails_the_call(images):
    class Stop(Exception):
        pass

    def cb(done, total):
        if done == total:
            raise Stop

    with pytest.raises(Stop):
        imgcopy.checksum(images["small"], progress=cb)
