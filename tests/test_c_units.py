"""The core's C unit tests (tests/c), built with ASan/UBSan."""
import os
import shutil
import subprocess

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


needs_cc = pytest.mark.skipif(shutil.which("cc") is None or shutil.which("make") is None,
                              reason="needs a C compiler and make")


@needs_cc
@pytest.mark.parametrize("target", ["check", "tsan"])
def test_c_unit_tests(target):
    """check: ASan+UBSan; tsan: ThreadSanitizer (the copy engine's threads)."""
    proc = subprocess.run(["make", "-s", "-j2", "-C", os.path.join(HERE, "c"), target],
                          capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "test_copy: raw and qcow2 copies passed" in proc.stdout
    assert "WARNING: ThreadSanitizer" not in proc.stderr
