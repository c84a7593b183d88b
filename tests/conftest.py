"""Shared fixtures of the imgcopy test-suite: the ones that make images,
mount file systems or set up devices for more than one test module.

qemu's tools are the oracle (tests/oracles.py); the images come from the
generators in tests/gen/.  Nothing here imports imgcopy at collection time
and nothing is autouse, so this conftest is harmless for test modules that
do not need qemu (tests/test_c_units.py).
"""

import os
import shutil
import sys

import pytest

from .convert_helpers import corpus_script, imgcopy_child_env
from .gen import raw_kinds
from .gen.convert_sources import SourceSet
from .gen.qcow2_images import Store
from .gen.raw_kinds import GenImage
from .gen.sparse import make_sparse as _make_sparse
from .oracles import QemuMap, qemu_map, qemu_map_human, require_qemu_img, require_qemu_io, run


@pytest.fixture
def image_dir(tmp_path):
    d = tmp_path / "images"
    d.mkdir()
    return d


@pytest.fixture
def make_image(image_dir):
    """Factory: make_image(kind, seed) -> GenImage(path, size, kind, seed)."""

    def _make(kind, seed, name=None):
        if raw_kinds.needs_qemu_io(kind):
            require_qemu_io()
        path = str(image_dir / (name or "%s-%d.img" % (kind, seed)))
        size = raw_kinds.make_image(path, kind, seed)
        return GenImage(path, size, kind, seed)

    return _make


@pytest.fixture
def make_sparse(image_dir):
    """Factory: make_sparse(name, size, [(off, bytes), ...]) -> path (str)."""

    def _make(name, size, data=()):
        path = str(image_dir / name)
        _make_sparse(path, size, data)
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
            if raw_kinds.needs_qemu_io(kind):
                require_qemu_io()
            path = str(self.root / ("%s-%d.img" % key))
            size = raw_kinds.make_image(path, kind, seed)
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
    require_qemu_img()
    return SharedImages(tmp_path_factory.mktemp("shared-images"))


@pytest.fixture(scope="session")
def convert_sources(tmp_path_factory):
    """SourceSet: convert_sources.get(name) -> GenImage, .layout(name) (never modify them)."""
    require_qemu_img()
    return SourceSet(tmp_path_factory.mktemp("convert-sources"))


@pytest.fixture(scope="session")
def qcow2_store(tmp_path_factory) -> Store:
    """The session's qcow2 catalogue (tests/gen/qcow2_images.py): images built
    on first use (a test skips there if qemu is missing), qemu's answers
    memoized.  Never modify a stored image."""
    return Store(tmp_path_factory.mktemp("qcow2-images"))


@pytest.fixture(scope="session")
def qcow2_all(qcow2_store) -> Store:
    """qcow2_store with every image of the catalogue built (in parallel)."""
    qcow2_store.build_all()
    return qcow2_store


@pytest.fixture(scope="session")
def corpus_raw(tmp_path_factory):
    """benchmarks/make_corpus.py's sparse-6g.raw at scale 1/16: (path, size).
    Read-only."""
    d = tmp_path_factory.mktemp("corpus-raw")
    run([sys.executable, corpus_script(), d, "--scale", "0.0625", "--only", "sparse-6g.raw"])
    p = str(d / "sparse-6g.raw")
    return p, os.path.getsize(p)


@pytest.fixture
def imgcopy_env():
    """Environment for child processes that run imgcopy (the venv's
    editable install: the same build as ours)."""
    return imgcopy_child_env()


# --------------------------------------------------------------------------
# file systems and devices (root only)

@pytest.fixture
def mount_tmpfs():
    """Factory: mount_tmpfs(path, size="8m") mounts a tmpfs of that size at
    path (made if missing) and returns path; unmounted after the test.
    Skips the test where no tmpfs can be mounted (not root)."""
    mounted = []

    def _mount(path, size="8m"):
        os.makedirs(str(path), exist_ok=True)
        if os.geteuid() != 0:
            pytest.skip("mounting a tmpfs needs root")
        p = run(["mount", "-t", "tmpfs", "-o", "size=%s" % size, "tmpfs", path], check=False)
        if p.returncode != 0:
            pytest.skip("cannot mount a tmpfs: %s" % p.stderr.strip())
        mounted.append(str(path))
        return path

    yield _mount
    for path in reversed(mounted):
        if run(["umount", path], check=False).returncode != 0:
            run(["umount", "-l", path], check=False)


@pytest.fixture
def small_tmpfs(tmp_path, mount_tmpfs):
    """An 8 MiB tmpfs (root only), unmounted afterwards: for ENOSPC."""
    return mount_tmpfs(tmp_path / "tmpfs", "8m")


@pytest.fixture
def loop_device():
    """Factory: loop_device(backing_file) -> the /dev/loopN that shows it;
    detached after the test.  Skips the test without root, losetup or a
    free loop device."""
    attached = []

    def _attach(backing):
        if os.geteuid() != 0 or shutil.which("losetup") is None:
            pytest.skip("needs root and losetup for a loop device")
        p = run(["losetup", "--find", "--show", backing], check=False)
        if p.returncode != 0 or not p.stdout.strip():
            pytest.skip("losetup failed: %s" % p.stderr.strip())
        dev = p.stdout.strip()
        attached.append(dev)
        return dev

    yield _attach
    for dev in reversed(attached):
        run(["losetup", "-d", dev], check=False)


# --------------------------------------------------------------------------
# plots

@pytest.fixture
def plt():
    """matplotlib.pyplot on the Agg backend (skips without matplotlib);
    every figure closed after the test."""
    mpl = pytest.importorskip("matplotlib")
    mpl.use("Agg")
    import matplotlib.pyplot as plt

    yield plt
    plt.close("all")


# --------------------------------------------------------------------------
# running in parallel: `make test` runs `pytest -n 2` (pytest-xdist)
#
# A test module is one unit of work, run whole by one worker: its
# module-scoped fixtures are made once, and modules whose tests share
# something outside tmp_path stay together (test_fuzz.py builds its
# harnesses into tests/fuzz/, test_notebooks.py runs both notebooks once for
# its four tests).  The tests of the SPLIT modules are units of their own
# (each long and self-contained) but for those GROUPED, which share a
# module fixture.  The longest units go first (HEAVY_FIRST, about longest
# first), so that the two workers finish together; the rest keep the order
# of collection.

SPLIT = ("tests/test_packaging.py", "tests/test_c_units.py", "tests/test_copy_outcome.py")
GROUPED = {
    "tests/test_packaging.py::test_build_says_which_libraries_it_lacks": "packaging-build",
    "tests/test_packaging.py::test_header_edit_rebuilds_the_extension": "packaging-build",
}

HEAVY_FIRST = (
    "tests/test_packaging.py::test_build_says_which_libraries_it_lacks",
    "tests/test_packaging.py::test_header_edit_rebuilds_the_extension",
    "tests/test_packaging.py::test_sdist_builds_alone_and_converts_on_the_oldest_python",
    "tests/test_packaging.py::test_wheel_bundles_the_optional_libraries",
    "tests/test_packaging.py::test_clone_named_imgcopy_imports_from_its_parent",
    "tests/test_fuzz.py",
    "tests/test_c_units.py::test_c_unit_tests[check]",
    "tests/test_c_units.py::test_c_unit_tests[tsan]",
    "tests/test_copy_outcome.py::test_sigint_at_any_moment_agrees_with_the_destination",
    "tests/test_overlay_layout.py",
    "tests/test_qcow2_compression.py",
    "tests/test_typing.py",
    "tests/test_nbd.py",
    "tests/test_qcow2_write.py",
    "tests/test_check.py",
    "tests/test_vpc.py",
    "tests/test_sparse_threshold_qemu.py",
    "tests/test_qcow2_map.py",
    "tests/test_fleet.py",
)


def work_unit(nodeid):
    """The unit of work (a name) a test belongs to: what one worker runs whole."""
    module, _, name = nodeid.partition("::")
    if module not in SPLIT:
        return module
    return GROUPED.get(nodeid.split("[")[0], nodeid)


def _heavy_rank(nodeid):
    for rank, prefix in enumerate(HEAVY_FIRST):
        if nodeid == prefix or nodeid.startswith((prefix + "::", prefix + "[")):
            return rank
    return len(HEAVY_FIRST)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`pytest -n N`: xdist's load scheduling, by work_unit(), in the order
    of collection (the items are sorted on the workers, which collect)."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class WorkUnits(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            return work_unit(nodeid)

    config.option.loadscopereorder = False
    return WorkUnits(config, log)


def pytest_collection_modifyitems(config, items):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        order = {id(item): i for i, item in enumerate(items)}
        items.sort(key=lambda item: (_heavy_rank(item.nodeid), order[id(item)]))
