"""Sessions of an image opened "r+": close() while other threads still
write, and many sessions in a row, leave a healthy, clean image of stable
size (qemu-img check is the oracle)."""
import os
import random
import threading

import pytest

import imgcopy

from .oracles import qemu_check, qemu_img, qemu_info
from .units import MiB


def assert_healthy(path):
    qemu_check(path)
    info = qemu_info(path)
    assert info["format-specific"]["data"]["corrupt"] is False, info
    assert info["dirty-flag"] is False, info
    imgcopy.open(path).close()  # no force needed


@pytest.mark.parametrize("round_", range(10))
def test_close_while_threads_write(tmp_path, round_):
    """Writers racing a close(): each write either lands or fails as on a
    closed image; the image is finished, never left marked corrupt."""
    path = str(tmp_path / "img.qcow2")
    qemu_img("create", "-f", "qcow2", path, str(64 * MiB))
    img = imgcopy.open(path, mode="r+")
    rng = random.Random(round_)
    errors = []
    written = []
    start = threading.Barrier(5)

    def writer(i):
        r = random.Random(round_ * 10 + i)
        start.wait()
        for _ in range(200):
            # each writer has its own quarter of the disk, in whole 64k units
            off = i * 16 * MiB + r.randrange(0, 16 * MiB, 65536)
            data = bytes([r.randrange(1, 256)]) * 65536
            try:
                img.write(off, data)
                written.append((off, data))
            except ValueError as exc:
                if "closed image" not in str(exc):
                    errors.append(repr(exc))
                return
            except Exception as exc:  # anything else is the bug
                errors.append(repr(exc))
                return

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    start.wait()
    threading.Event().wait(rng.uniform(0, 0.02))
    img.close()
    for t in threads:
        t.join()
    assert errors == []
    assert_healthy(path)
    last = dict(written)  # in each writer's order: the last write of a unit wins
    with imgcopy.open(path) as check:
        for off, data in last.items():
            assert check.read(off, len(data)) == data, off


def test_writes_after_close_fail_cleanly(tmp_path):
    path = str(tmp_path / "img.qcow2")
    qemu_img("create", "-f", "qcow2", path, str(8 * MiB))
    img = imgcopy.open(path, mode="r+")
    img.write(0, b"x" * 4096)
    img.close()
    with pytest.raises(ValueError, match="closed image"):
        img.write(0, b"y" * 4096)
    assert_healthy(path)


def test_repeated_sessions_keep_a_stable_size(tmp_path):
    """300 sessions overwriting allocated clusters: no growth (the
    refcount structures of one session are reused by the next), as
    qemu-io doing the same."""
    path = str(tmp_path / "img.qcow2")
    qemu_img("create", "-f", "qcow2", path, str(64 * MiB))
    with imgcopy.open(path, mode="r+") as img:
        img.write(0, os.urandom(8 * MiB))
    first = os.path.getsize(path)
    rng = random.Random(5)
    for i in range(300):
        with imgcopy.open(path, mode="r+") as img:
            img.write(rng.randrange(0, 8 * MiB, 65536), bytes([i % 255 + 1]) * 65536)
    assert os.path.getsize(path) <= first + 2 * 65536, (first, os.path.getsize(path))
    assert_healthy(path)
