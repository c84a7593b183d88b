"""imgcopy.steps.CopySteps: a copy built from its arguments without running,
then run step by step; what convert() and plan() are made of (qemu-img the
oracle)."""

import os

import pytest

from .gen.sparse import make_sparse
from .oracles import assert_same_content, qemu_img, require_qemu_img
from .units import KiB, MiB

imgcopy = pytest.importorskip("imgcopy")
from imgcopy.job import NULL_TARGET, CopySteps  # noqa: E402


def test_steps_are_built_without_touching_anything(tmp_path):
    """Building checks and opens nothing: a missing source, a bad option and
    an unknown format all wait for the step that deals with them."""
    dst = tmp_path / "out.raw"
    steps = CopySteps(str(tmp_path / "missing.raw"), str(dst), dst_format="vdi",
                      option_keywords={"concurrency": 0})
    assert not dst.exists() and steps.source is None and steps.core is None
    with pytest.raises(ValueError, match="unknown destination format 'vdi'"):
        steps.validate()
    assert not dst.exists()


def test_steps_before_their_turn_are_refused(tmp_path):
    steps = CopySteps(str(tmp_path / "a.raw"), str(tmp_path / "b.raw"))
    with pytest.raises(RuntimeError, match="open_source"):
        steps.open_destination()
    with pytest.raises(RuntimeError, match="open_source"):
        steps.run()
    with pytest.raises(RuntimeError, match="open_destination"):
        steps.commit()


def test_the_steps_one_by_one_copy_as_convert_does(tmp_path):
    require_qemu_img()
    src = str(tmp_path / "src.raw")
    make_sparse(src, 4 * MiB, [(0, b"\x5a" * 64 * KiB), (1 * MiB, os.urandom(192 * KiB)),
                               (3 * MiB, b"\x01" * 4 * KiB)])
    by_steps, by_convert = str(tmp_path / "steps.qcow2"), str(tmp_path / "convert.qcow2")
    steps = CopySteps(src, by_steps, dst_format="qcow2", checksum=True,
                      layout_keywords={"cluster_size": "64k"})
    steps.validate()
    with steps.open_source():
        steps.open_destination()
        assert not os.path.exists(by_steps)  # a new file appears when committed
        steps.run()
        assert not os.path.exists(by_steps)
        steps.commit()
        steps.core.close()
    assert os.path.exists(by_steps)
    assert steps.report is not None and steps.cache is not None
    ref = imgcopy.convert(src, by_convert, dst_format="qcow2", cluster_size="64k",
                          checksum=True)
    assert steps.report["checksum"] == ref.checksum
    assert steps.report["bytes_written"] == ref.bytes_written
    assert_same_content(by_steps, by_convert)
    assert qemu_img("check", by_steps).returncode == 0


def test_a_plan_is_the_steps_into_the_null_target(tmp_path):
    """plan() is these steps with the request log, into the null target:
    its requests are theirs, its counters those of convert() to "null:"."""
    src = str(tmp_path / "src.raw")
    make_sparse(src, 4 * MiB, [(0, b"\x5a" * 64 * KiB), (1 * MiB, bytes(192 * KiB)),
                               (3 * MiB, b"\x01" * 4 * KiB)])
    steps = CopySteps(src, NULL_TARGET, dst_format="null", request_log=True,
                      option_keywords={"sparse_threshold": "8k"})
    steps.validate()
    with steps.open_source():
        sink = steps.open_destination()
        steps.run()
        sink.close()
    assert steps.report is not None and steps.report["requests"]
    plan = imgcopy.plan(src, sparse_threshold="8k")
    assert plan._packed == steps.report["requests"]
    assert plan.options == steps.options
    assert (plan.options.offload, plan.options.flush) == (False, False)
    copied = imgcopy.convert(src, NULL_TARGET, sparse_threshold="8k").to_dict()
    assert {k: plan.totals()[k] for k in ("bytes_read", "bytes_written", "bytes_zeroed",
                                          "write_requests", "zero_requests")} == \
        {k: copied[k] for k in ("bytes_read", "bytes_written", "bytes_zeroed",
                                "write_requests", "zero_requests")}
