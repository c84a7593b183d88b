"""imgcopy.job.CopyJob: a copy built from its arguments without running,
then run step by step; what convert() is made of (qemu-img the oracle)."""

import os

import pytest

from .gen.sparse import make_sparse
from .oracles import assert_same_content, qemu_img, require_qemu_img
from .units import KiB, MiB

imgcopy = pytest.importorskip("imgcopy")
from imgcopy.job import CopyJob  # noqa: E402


def test_a_job_is_built_without_touching_anything(tmp_path):
    """Building checks and opens nothing: a missing source, a bad option and
    an unknown format all wait for the step that deals with them."""
    dst = tmp_path / "out.raw"
    job = CopyJob(str(tmp_path / "missing.raw"), str(dst), dst_format="vdi",
                  option_keywords={"concurrency": 0})
    assert not dst.exists() and job.source is None and job.core is None
    with pytest.raises(ValueError, match="unknown destination format 'vdi'"):
        job.validate()
    assert not dst.exists()


def test_steps_before_their_turn_are_refused(tmp_path):
    job = CopyJob(str(tmp_path / "a.raw"), str(tmp_path / "b.raw"))
    with pytest.raises(RuntimeError, match="open_source"):
        job.open_destination()
    with pytest.raises(RuntimeError, match="open_source"):
        job.run()
    with pytest.raises(RuntimeError, match="open_destination"):
        job.commit()


def test_the_steps_one_by_one_copy_as_convert_does(tmp_path):
    require_qemu_img()
    src = str(tmp_path / "src.raw")
    make_sparse(src, 4 * MiB, [(0, b"\x5a" * 64 * KiB), (1 * MiB, os.urandom(192 * KiB)),
                               (3 * MiB, b"\x01" * 4 * KiB)])
    by_job, by_convert = str(tmp_path / "job.qcow2"), str(tmp_path / "convert.qcow2")
    job = CopyJob(src, by_job, dst_format="qcow2", checksum=True,
                  layout_keywords={"cluster_size": "64k"})
    job.validate()
    with job.open_source():
        job.open_destination()
        assert not os.path.exists(by_job)  # a new file appears when committed
        job.run()
        assert not os.path.exists(by_job)
        job.commit()
        job.core.close()
    assert os.path.exists(by_job)
    assert job.report is not None and job.cache is not None
    ref = imgcopy.convert(src, by_convert, dst_format="qcow2", cluster_size="64k",
                          checksum=True)
    assert job.report["checksum"] == ref.checksum
    assert job.report["bytes_written"] == ref.bytes_written
    assert_same_content(by_job, by_convert)
    assert qemu_img("check", by_job).returncode == 0
