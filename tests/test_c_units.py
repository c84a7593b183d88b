"""The core's C unit tests (tests/c), built with ASan/UBSan."""
import os
import shutil
import subprocess

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.skipif(shutil.which("cc") is None or shutil.which("make") is None,
                    reason="needs a C compiler and make")
def test_c_unit_tests():
    proc = subprocess.run(["make", "-s", "-C", os.path.join(HERE, "c"), "check"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "passed" in proc.stdout
