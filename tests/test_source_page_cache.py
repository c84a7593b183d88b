"""A copy drops from the page cache what it read of a cold source (a big
disk copied does not push everything else out), and leaves a source that
was cached before it cached: dropping it would cost the copy time and the
next reader of the image a read from the disk."""
import random

import pytest

import imgcopy

from .page_cache import cached_share, evict, is_cold
from .units import MiB

SIZE = 32 * MiB


@pytest.fixture
def source(tmp_path):
    path = tmp_path / "src.raw"
    with open(path, "wb") as f:
        f.write(random.Random(11).randbytes(SIZE))
    evict(path)
    if not is_cold(path, SIZE // 2):
        pytest.skip("the page cache here cannot be emptied of the image (tmpfs?)")
    return path


def test_a_cold_source_is_left_cold(source, tmp_path):
    imgcopy.convert(source, tmp_path / "out.raw", src_format="raw")
    assert cached_share(source, SIZE) < 0.5


def test_a_cached_source_stays_cached(source, tmp_path):
    with open(source, "rb") as f:
        while f.read(1 << 20):
            pass
    assert cached_share(source, SIZE) > 0.9
    imgcopy.convert(source, tmp_path / "out.raw", src_format="raw")
    assert cached_share(source, SIZE) > 0.9
