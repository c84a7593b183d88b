"""imgcopy._core, the glue over the C core: arguments are keywords (no
rows of positional booleans), converted and named in errors as the function
and the argument; copy() returns one shape; the lists of formats are the C
registry's, and qemu-img reads back every format the core says it writes."""
import json
import os
import subprocess

import pytest

import imgcopy
from imgcopy import _core
from imgcopy.convert import DEST_FORMATS
from imgcopy.image import FORMATS

from .oracles import require_qemu_img
from .gen.sparse import make_sparse
from .units import MiB


COUNTERS = ("bytes_read", "bytes_written", "bytes_zeroed", "bytes_skipped", "bytes_already_zero",
            "read_requests", "write_requests", "zero_requests", "extents", "bytes_changed",
            "bytes_compared", "bytes_equal")


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("glue") / "src.raw")
    make_sparse(path, 5 * MiB + 4321, [(0, b"a" * 65536 + bytes(65536) + b"b" * 4096),
                                       (3 * MiB, b"c" * MiB)])
    return path


def qemu_info(path):
    p = subprocess.run(["qemu-img", "info", "--output=json", path], capture_output=True,
                       text=True, check=True)
    return json.loads(p.stdout)


def test_format_lists_come_from_the_core(source, tmp_path):
    require_qemu_img()
    assert FORMATS == _core.formats() and "raw" in FORMATS and "qcow2" in FORMATS
    assert DEST_FORMATS == _core.writable_formats() + ("null",)
    # every format the core says it writes is one qemu-img reads back
    for fmt in _core.writable_formats():
        dst = str(tmp_path / ("out." + fmt))
        imgcopy.convert(source, dst, dst_format=fmt)
        assert qemu_info(dst)["format"] == fmt
        with imgcopy.open(dst) as img:
            assert img.format == fmt
    with pytest.raises(ValueError, match="known: " + ", ".join(FORMATS)):
        imgcopy.open(source, "qed")


def test_copy_returns_one_shape(source):
    src = _core.Image(source, "raw")
    shapes = []
    for log in (False, True):
        sink, _ = _core.create("null:", "null", os.path.getsize(source))
        report = _core.copy(src, sink, log=log, sparse_threshold=4096)
        sink.close()
        shapes.append(report)
    src.close()
    plain, logged = shapes
    assert set(plain) == set(logged) == set(COUNTERS) | {"requests", "options"}
    assert plain["requests"] is None and isinstance(logged["requests"], bytes)
    # the options the copy ran with: every option, decided
    assert plain["options"] == logged["options"] == dict(
        _core.copy_option_defaults(), target_is_zero=True, flush=False)
    assert len(logged["requests"]) % _core.REQUEST_SIZE == 0 and logged["requests"]
    assert {k: plain[k] for k in COUNTERS} == {k: logged[k] for k in COUNTERS}


def test_arguments_are_keywords_named_in_errors(source):
    with pytest.raises(TypeError):
        _core.Image(source, "raw", True)  # no rows of positional booleans
    img = _core.Image(source, "raw")
    try:
        with pytest.raises(ValueError, match=r"read\(\) argument 'offset' must not be negative"):
            img.read(-1, 5)
        with pytest.raises(TypeError, match=r"read\(\) argument 'length' must be an int, not"):
            img.read(0, "5")
        with pytest.raises(ValueError, match=r"zero\(\) argument 'length' is too large"):
            img.zero(0, 1 << 64)
        with pytest.raises(TypeError, match=r"finish"):
            img.finish(True)
        with pytest.raises(TypeError, match="unexpected|invalid keyword"):
            _core.copy(img, img, no_such_option=1)
    finally:
        img.close()
    with pytest.raises(ValueError, match="null"):
        _core.probe(source + "\0x")
