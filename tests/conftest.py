"""Shared fixtures for the imgcopy test-suite.

qemu-img is the oracle: every map/block-status answer of imgcopy is compared
with what ``qemu-img map -f raw`` prints for the same file.  The oracle
helpers live in tests/imagegen.py (a plain module, importable from test
modules); they are re-exported here and offered as fixtures.  Nothing here
imports imgcopy at collection time and nothing is autouse, so this conftest
is harmless for test modules that do not need qemu (tests/test_c_units.py).
"""

import os
import subprocess
import types

import pytest

from . import imagegen
from .imagegen import (  # noqa: F401  (re-exported)
    NO_QEMU_IO_REASON,
    NO_QEMU_REASON,
    QEMU_IMG,
    QEMU_IO,
    GenImage,
    QemuMap,
    _require_qemu_img,
    clip_entries,
    entry_tuple,
    extent_tuple,
    find_covering,
    map_args,
    qemu_img,
    qemu_map,
    qemu_map_human,
    sha256_file,
)


@pytest.fixture(name="qemu_map")
def _qemu_map_fixture():
    """qemu_map(path, fmt="raw", start=None, length=None) -> QemuMap(extents, text).

    Skips the test if qemu-img is missing.
    """
    _require_qemu_img()
    return qemu_map


@pytest.fixture(name="qemu_map_human")
def _qemu_map_human_fixture():
    """qemu_map_human(path, fmt="raw", start=None, length=None) -> stdout (str)."""
    _require_qemu_img()
    return qemu_map_human


@pytest.fixture
def oracle():
    """Namespace with all oracle helpers (qemu_map, clip_entries, ...)."""
    _require_qemu_img()
    names = ("qemu_img", "map_args", "qemu_map", "qemu_map_human", "entry_tuple",
             "extent_tuple", "clip_entries", "find_covering", "sha256_file")
    return types.SimpleNamespace(QEMU_IMG=QEMU_IMG, **{n: getattr(imagegen, n) for n in names})


@pytest.fixture
def image_dir(tmp_path):
    d = tmp_path / "images"
    d.mkdir()
    return d


@pytest.fixture
def make_image(image_dir):
    """Factory: make_image(kind, seed) -> GenImage(path, size, kind, seed)."""

    def _make(kind, seed, name=None):
        if imagegen.needs_qemu_io(kind) and QEMU_IO is None:
            pytest.skip(NO_QEMU_IO_REASON)
        path = str(image_dir / (name or "%s-%d.img" % (kind, seed)))
        size = imagegen.make_image(path, kind, seed)
        return GenImage(path, size, kind, seed)

    return _make


@pytest.fixture
def make_sparse(image_dir):
    """Factory: make_sparse(name, size, [(off, bytes), ...]) -> path (str)."""

    def _make(name, size, data=()):
        path = str(image_dir / name)
        imagegen.make_sparse(path, size, data)
        return path

    return _make


class SharedImages:
    """Session-wide, read-only seeded images and memoized qemu-img answers.

    Tests using these images must never modify them (map/block_status/read
    only): qemu-img output is cached per (path, start, length, format).
    """

    def __init__(self, root):
        self.root = root
        self._images = {}
        self._json = {}
        self._human = {}

    def get(self, kind, seed):
        key = (kind, seed)
        if key not in self._images:
            if imagegen.needs_qemu_io(kind) and QEMU_IO is None:
                pytest.skip(NO_QEMU_IO_REASON)
            path = str(self.root / ("%s-%d.img" % key))
            size = imagegen.make_image(path, kind, seed)
            self._images[key] = GenImage(path, size, kind, seed)
        return self._images[key]

    def qemu_map(self, path, start=None, length=None, fmt="raw") -> QemuMap:
        key = (path, start, length, fmt)
        if key not in self._json:
            self._json[key] = qemu_map(path, fmt=fmt, start=start, length=length)
        return self._json[key]

    def qemu_map_human(self, path, start=None, length=None, fmt="raw") -> str:
        key = (path, start, length, fmt)
        if key not in self._human:
            self._human[key] = qemu_map_human(path, fmt=fmt, start=start, length=length)
        return self._human[key]


@pytest.fixture(scope="session")
def shared_images(tmp_path_factory):
    """SharedImages: shared_images.get(kind, seed) -> GenImage (never modify it)."""
    _require_qemu_img()
    return SharedImages(tmp_path_factory.mktemp("shared-images"))


@pytest.fixture
def imgcopy_env():
    """Environment for child processes that run imgcopy (the venv's
    editable install: the same build as ours)."""
    env = dict(os.environ)
    env.pop("PYTHONSTARTUP", None)
    env["LC_ALL"] = "C"
    return env


@pytest.fixture
def small_tmpfs(tmp_path):
    """An 8 MiB tmpfs (root only), unmounted afterwards: for ENOSPC."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if p.returncode != 0:
        pytest.skip("cannot mount a tmpfs: %s" % p.stderr.strip())
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
