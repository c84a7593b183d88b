"""Types: mypy passes on the package and the tests, and the stubs of the C
core match the compiled module (mypy's stubtest)."""
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

try:
    import mypy  # noqa: F401
    HAVE_MYPY = True
except ImportError:
    HAVE_MYPY = False

needs_mypy = pytest.mark.skipif(not HAVE_MYPY, reason="mypy is not installed")


def run(args, cwd, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m"] + args, cwd=cwd, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@needs_mypy
def test_mypy_passes_on_package_and_tests():
    p = run(["mypy", "--config-file", "mypy.ini", "imgcopy", "tests"], cwd=REPO)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.startswith("Success"), p.stdout


@needs_mypy
def test_stubs_match_the_c_module(tmp_path, imgcopy_env):
    """imgcopy/_core.pyi against the compiled imgcopy._core (the installed
    package: run from elsewhere than the source tree)."""
    env = dict(imgcopy_env)
    env["MYPYPATH"] = ""
    args = ["mypy.stubtest", "--ignore-disjoint-bases", "imgcopy._core"]
    p = run(args, cwd=str(tmp_path), env=env)
    if p.returncode == 2 and "unrecognized arguments" in p.stderr:   # an older mypy
        p = run([a for a in args if a != "--ignore-disjoint-bases"], cwd=str(tmp_path), env=env)
    assert p.returncode == 0, p.stdout + p.stderr


def test_package_ships_its_types():
    import imgcopy

    here = os.path.dirname(imgcopy.__file__)
    for name in ("py.typed", "_core.pyi"):
        assert os.path.exists(os.path.join(here, name)), name
