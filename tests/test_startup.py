"""Start-up: ``import imgcopy`` and the command line import only what they
use (the package's names are imported when first used, each command's
implementation when it runs).  Checked on what a fresh interpreter imports
(``-X importtime``), not on timings, so a loaded machine cannot fail it;
``benchmarks/bench_startup.py`` measures the times."""
import subprocess
import sys

import pytest

import imgcopy


def _imports(args, env):
    """The modules a fresh interpreter imports running ``args`` (its own
    start-up's included), in order."""
    p = subprocess.run([sys.executable, "-X", "importtime"] + args, env=env,
                       capture_output=True, text=True, timeout=120)
    mods = [line.rsplit("|", 1)[1].strip() for line in p.stderr.splitlines()
            if line.startswith("import time:") and "self [us]" not in line]
    return p, mods


def _ours(mods):
    return {m for m in mods if m == "imgcopy" or m.startswith("imgcopy.")}


def test_import_imgcopy_imports_next_to_nothing(imgcopy_env):
    p, mods = _imports(["-c", "import imgcopy"], imgcopy_env)
    assert p.returncode == 0, p.stderr
    assert _ours(mods) == {"imgcopy", "imgcopy._program", "imgcopy._version"}
    _, bare = _imports(["-c", "pass"], imgcopy_env)
    assert set(mods) - set(bare) == _ours(mods)  # and nothing of the standard library


@pytest.mark.parametrize("name", imgcopy.__all__)
def test_every_public_name_imports(name, imgcopy_env):
    """Each alone, in a fresh interpreter: no name depends on another's
    module having been imported first."""
    code = f"import imgcopy\nfrom imgcopy import {name}\nassert {name} is imgcopy.{name}\n"
    p = subprocess.run([sys.executable, "-c", code], env=imgcopy_env, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr


def test_dir_and_star_import():
    assert set(imgcopy.__all__) <= set(dir(imgcopy))
    namespace: dict = {}
    exec("from imgcopy import *", namespace)
    assert {k for k in namespace if k != "__builtins__"} == set(imgcopy.__all__)


def test_functions_keep_their_names_over_submodules(imgcopy_env):
    """``imgcopy.info`` is the function, not the module imgcopy.info, even
    when the module was imported first (importlib binds it on the package)."""
    code = ("import imgcopy.info, imgcopy.convert, imgcopy.check, imgcopy.measure\n"
            "from imgcopy.compare import CompareResult\n"
            "import imgcopy, types\n"
            "for name in ('info', 'convert', 'check', 'measure', 'compare', 'plan',\n"
            "             'checksum', 'features'):\n"
            "    assert callable(getattr(imgcopy, name)), name\n"
            "    assert not isinstance(getattr(imgcopy, name), types.ModuleType), name\n"
            "import imgcopy.plan, imgcopy.checksum, imgcopy.features\n"
            "assert callable(imgcopy.plan) and callable(imgcopy.features)\n"
            "assert imgcopy.image.FORMATS and imgcopy._core.formats()\n")
    p = subprocess.run([sys.executable, "-c", code], env=imgcopy_env, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'copy_image'"):
        imgcopy.copy_image  # noqa: B018
    assert not hasattr(imgcopy, "__wrapped__")
