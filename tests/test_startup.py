"""Start-up: ``import imgcopy`` and the command line import only what they
use (the package's names are imported when first used, each command's
implementation when it runs).  Checked on what a fresh interpreter imports
(its sys.modules as it exits), not on timings, so a loaded machine cannot
fail it; ``benchmarks/bench_startup.py`` measures the times."""
import json
import os
import subprocess
import sys

import pytest

import imgcopy
from .oracles import HAVE_QEMU, NO_QEMU, qemu_img, qemu_io


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


# A sitecustomize that writes, as the interpreter exits, the modules it
# imported (-X importtime misses those `from . import x` imports).
HOOK = '''import atexit, os, sys
def _dump(path=os.environ.pop("IMGCOPY_TEST_MODULES", None)):
    if path:
        with open(path, "w") as f:
            f.write("\\n".join(sys.modules))
atexit.register(_dump)
'''

# what the command line itself imports, whichever command runs
CLI = {"imgcopy", "imgcopy._program", "imgcopy._interrupt", "imgcopy._version", "imgcopy._core", "imgcopy.errors",
       "imgcopy._defaults", "imgcopy.cli", "imgcopy.cli_common", "imgcopy.cli_check",
       "imgcopy.cli_checksum", "imgcopy.cli_compare", "imgcopy.cli_convert",
       "imgcopy.cli_convert_many", "imgcopy.cli_info", "imgcopy.cli_map", "imgcopy.cli_measure"}
# what reading an image imports
READ = {"imgcopy.image", "imgcopy.extents", "imgcopy.sizes", "imgcopy.uris",
        "imgcopy._keywords", "imgcopy._records"}
# standard modules no command needs: inspect (and ast, dis, tokenize with
# it), shutil (argparse asks it the terminal's width), difflib (only for
# a misspelt keyword)
NEVER = {"inspect", "ast", "dis", "tokenize", "shutil", "difflib"}
# ... and those only some need: the option objects are dataclasses, JSON is
# printed on demand
LATER = {"dataclasses", "typing", "json"}

# what the commands whose options are dataclasses import for them (their
# process is the command's own: dataclasses come without inspect)
LEAN = {"imgcopy._inspect_on_demand"}

# what a copy imports
CONVERT = LEAN | {"imgcopy.convert", "imgcopy.job", "imgcopy.options", "imgcopy.checksum",
                  "imgcopy.changes", "imgcopy.progress", "imgcopy._sharing"}

# command: (its arguments, imgcopy's modules it imports, standard modules it must not)
COMMANDS = {
    "version": (["--version"],
                {"imgcopy", "imgcopy._program", "imgcopy._interrupt", "imgcopy._version", "imgcopy.features",
                 "imgcopy._core", "imgcopy.errors"},
                NEVER | LATER | {"argparse", "re", "enum"}),
    "help": (["--help"], CLI, NEVER | LATER),
    "info": (["info", "QCOW2"], CLI | READ | {"imgcopy.info"}, NEVER | LATER),
    "map": (["map", "QCOW2"], CLI | READ, NEVER | LATER),
    # a dirty map is read by the same modules as a plain map
    "map --bitmap": (["map", "--bitmap", "b0", "BITMAPS"], CLI | READ, NEVER | LATER),
    "checksum": (["checksum", "RAW"], CLI | READ | {"imgcopy.checksum", "imgcopy.progress"},
                 NEVER | LATER),
    "compare": (["compare", "RAW", "QCOW2"], CLI | READ | {"imgcopy.compare"}, NEVER | LATER),
    "check": (["check", "QCOW2"], CLI | READ | {"imgcopy.check", "imgcopy.info"},
              NEVER | LATER),
    # the option objects are dataclasses, imported without inspect
    "measure": (["measure", "-O", "qcow2", "RAW"],
                CLI | READ | LEAN | {"imgcopy.measure", "imgcopy.measure_options",
                                     "imgcopy.options"},
                NEVER | {"json"}),
    # a fleet's sharing (its pool, its memory) reaches convert() through
    # _sharing's context variable; a single copy imports no fleet
    "convert": (["convert", "-O", "raw", "QCOW2", "OUT"], CLI | READ | CONVERT,
                NEVER | {"json", "typing", "threading", "hashlib", "imgcopy.fleet",
                         "imgcopy.distributed", "imgcopy.shards"}),
    # --bitmap: the changed ranges from the source's dirty map, no more
    "convert --bitmap": (["convert", "-n", "-O", "raw", "--bitmap", "b0", "BITMAPS", "COPY"],
                         CLI | READ | CONVERT,
                         NEVER | {"json", "typing", "threading", "imgcopy.fleet"}),
    # --journal: the journal's module (and hashlib) for a journalled copy only
    "convert --journal": (["convert", "-O", "raw", "--journal", "JOURNAL", "QCOW2", "RESUMED"],
                          CLI | READ | CONVERT | {"imgcopy.journal"},
                          NEVER | {"json", "typing", "imgcopy.fleet"}),
    "convert-many": (["convert-many", "JOBS"], CLI | READ | CONVERT | {"imgcopy.fleet"},
                     NEVER | {"imgcopy.distributed"}),
}


@pytest.fixture(scope="module")
def modules_of(tmp_path_factory):
    """modules_of(args): the modules ``python ARGS`` imports beyond what
    ``python -c pass`` does."""
    from .convert_helpers import imgcopy_child_env

    work = tmp_path_factory.mktemp("startup")
    (work / "hook").mkdir()
    (work / "hook" / "sitecustomize.py").write_text(HOOK)
    env = imgcopy_child_env()
    env["PYTHONPATH"] = os.pathsep.join([str(work / "hook")] +
                                        [p for p in [env.get("PYTHONPATH")] if p])
    raw, qcow2 = work / "a.raw", work / "a.qcow2"
    with open(raw, "wb") as f:
        f.truncate(1 << 20)
        f.write(b"imgcopy" * 1000)
    imgcopy.convert(str(raw), str(qcow2), dst_format="qcow2")
    jobs = work / "jobs.json"
    jobs.write_text(json.dumps([{"src": str(qcow2), "dst": str(work / "many.raw")}]))
    names = {"RAW": str(raw), "QCOW2": str(qcow2), "OUT": str(work / "out.raw"),
             "JOBS": str(jobs), "BITMAPS": str(work / "bitmaps.qcow2"),
             "JOURNAL": str(work / "copy.journal"), "RESUMED": str(work / "resumed.raw")}
    if HAVE_QEMU:  # a persistent bitmap, and a guest's write it marks
        imgcopy.convert(str(raw), names["BITMAPS"], dst_format="qcow2")
        qemu_img("bitmap", "--add", names["BITMAPS"], "b0")
        qemu_io(names["BITMAPS"], ["write -P 7 64k 64k"], fmt="qcow2")
        names["COPY"] = str(work / "copy.raw")  # its earlier copy, brought up to date
        imgcopy.convert(str(raw), names["COPY"])

    def run(args):
        if "BITMAPS" in args and not HAVE_QEMU:
            pytest.skip(NO_QEMU)
        out = work / "modules.txt"
        p = subprocess.run([sys.executable] + [names.get(a, a) for a in args],
                           env=dict(env, IMGCOPY_TEST_MODULES=str(out)), cwd=str(work),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           timeout=120)
        assert p.returncode == 0, p.stderr
        return set(out.read_text().split("\n"))

    bare = run(["-c", "pass"])
    return lambda args: run(args) - bare


def test_the_hook_sees_what_is_imported(modules_of):
    assert modules_of(["-c", "import json"]) >= {"json", "json.decoder"}
    assert modules_of(["-c", "pass"]) == set()


def test_import_imgcopy_imports_nothing_else(modules_of):
    assert modules_of(["-c", "import imgcopy"]) == \
        {"imgcopy", "imgcopy._program", "imgcopy._interrupt", "imgcopy._version"}


@pytest.mark.parametrize("command", COMMANDS)
def test_a_command_imports_what_it_uses(modules_of, command):
    """``python -m imgcopy COMMAND``: imgcopy's modules exactly those it
    runs (a new module on this list, or a command importing another's, is a
    choice to make here), and none of the costly standard modules it does
    without."""
    args, ours, never = COMMANDS[command]
    loaded = modules_of(["-m", "imgcopy"] + args)
    assert {m for m in loaded if m.split(".")[0] == "imgcopy"} == ours
    assert loaded & never == set()


# dataclasses imported as the commands import them, then used as any
# program would: the stand-in gives way to the real inspect whenever asked
WITHOUT_INSPECT = """
import sys
from imgcopy._inspect_on_demand import import_dataclasses
import_dataclasses()
import dataclasses
assert "inspect" not in sys.modules and "dataclasses" in sys.modules
from imgcopy import CopyOptions
assert dataclasses.replace(CopyOptions(), concurrency=2).concurrency == 2
assert "inspect" not in sys.modules
if sys.argv[1] == "import-first":
    import inspect
    assert type(inspect.signature).__name__ == "function"
@dataclasses.dataclass
class Point:
    x: int = 1
assert Point.__doc__ == "Point(x: int = 1)", Point.__doc__
import inspect
assert sys.modules["inspect"] is inspect and dataclasses.inspect is inspect
assert str(inspect.signature(Point)) == "(x: int = 1) -> None"
print("ok")
"""


@pytest.mark.parametrize("order", ["import-first", "dataclass-first"])
def test_dataclasses_without_inspect_behave(order):
    """The commands' dataclasses without inspect: a class without a
    docstring still gets dataclasses' own, and ``import inspect`` the one
    real module, before or after."""
    from .convert_helpers import imgcopy_child_env

    p = subprocess.run([sys.executable, "-c", WITHOUT_INSPECT, order], env=imgcopy_child_env(),
                       capture_output=True, text=True, timeout=60)
    assert (p.returncode, p.stdout.strip()) == (0, "ok"), p.stderr


def test_the_help_is_as_wide_as_shutil_says(monkeypatch):
    """The command line's formatter finds the width shutil would (argparse
    would import shutil for it)."""
    import shutil

    from imgcopy import cli

    for columns in ("57", "200", "", "x", "-1"):
        monkeypatch.setenv("COLUMNS", columns)
        assert cli._columns() == shutil.get_terminal_size().columns, columns


# at the program's exit: a line printed by an atexit function
AT_EXIT = '''import atexit, sys
atexit.register(lambda: print("atexit ran"))
'''


@pytest.mark.parametrize("args", [["map", "--output", "json", "RAW"], ["--bogus"]],
                         ids=["map", "usage-error"])
def test_the_program_ends_as_its_exit_would(tmp_path, args):
    """The program ends its process without tearing every module down
    (_program.end_now): its atexit functions still run, every byte it
    printed is out (a map larger than a pipe holds), and its status is the
    command's."""
    from .convert_helpers import imgcopy_child_env
    from .gen.sparse import make_sparse

    raw = tmp_path / "many.raw"
    make_sparse(str(raw), 64 << 20, [(off, b"x" * 4096) for off in range(0, 64 << 20, 64 << 10)])
    (tmp_path / "hook").mkdir()
    (tmp_path / "hook" / "sitecustomize.py").write_text(AT_EXIT)
    env = imgcopy_child_env()
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "hook")] +
                                        [p for p in [env.get("PYTHONPATH")] if p])
    argv = [str(raw) if a == "RAW" else a for a in args]
    p = subprocess.run([sys.executable, "-m", "imgcopy"] + argv, env=env, cwd=str(tmp_path),
                       capture_output=True, text=True, timeout=120)
    printed, _, last = p.stdout.rstrip("\n").rpartition("\n")
    assert last == "atexit ran", p.stdout[-200:] + p.stderr
    if args[0] == "map":
        assert p.returncode == 0, p.stderr
        assert len(printed) > 1 << 16
        assert len(json.loads(printed)) == 2 * 1024  # data and hole, 1024 times
    else:
        assert p.returncode == 2 and "usage" in p.stderr, p.stderr
