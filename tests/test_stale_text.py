"""What the code says about itself stays true: layout checks survive
``python -O`` (no ``assert`` in imgcopy/), the stubs and convert() name every
option, and the docs list every format imgcopy reads."""
import ast
import dataclasses
import inspect
import os
import re
import subprocess
import sys

import pytest

import imgcopy
from imgcopy import CopyOptions, Qcow2Options
from imgcopy.image import FORMATS

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(REPO, "imgcopy")


def package_sources():
    return sorted(os.path.join(PACKAGE, n) for n in os.listdir(PACKAGE) if n.endswith(".py"))


def test_no_assert_in_the_package():
    """python -O drops assert statements: a check made with one is no check."""
    found = []
    for path in package_sources():
        with open(path) as f:
            tree = ast.parse(f.read(), path)
        found += ["%s:%d" % (os.path.basename(path), n.lineno)
                  for n in ast.walk(tree) if isinstance(n, ast.Assert)]
    assert found == []


@pytest.mark.parametrize("constant, module", [("EXTENT_SIZE", "imgcopy.extents"),
                                              ("SNAPSHOT_SIZE", "imgcopy.info"),
                                              ("REQUEST_SIZE", "imgcopy.plan")])
def test_layout_checks_survive_python_O(constant, module, imgcopy_env):
    """The packed structs' sizes are checked against the compiled core's when
    the module is imported, under -O too: a module whose layout is not the
    extension's (here: the extension's size changed, the module reloaded) is
    refused."""
    code = ("import importlib, sys, imgcopy, imgcopy.info, imgcopy.plan\n"
            f"module = sys.modules['{module}']\n"
            "importlib.reload(module)  # as it is: fine\n"
            f"imgcopy._core.{constant} += 8\n"
            "try:\n"
            "    importlib.reload(module)\n"
            "except ImportError as e:\n"
            "    print('refused:', e)\n")
    p = subprocess.run([sys.executable, "-O", "-c", code], capture_output=True, text=True,
                       env=imgcopy_env, cwd="/")
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("refused: imgcopy._core packs struct ic_"), p.stdout


def stub_keywords(name):
    with open(os.path.join(PACKAGE, "_core.pyi")) as f:
        tree = ast.parse(f.read())
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return {a.arg for a in node.args.kwonlyargs}
    raise AssertionError(name)


def test_every_option_is_a_keyword_of_convert_and_of_the_stubs():
    engine = set(CopyOptions().engine_options())
    layout = {f.name for f in dataclasses.fields(Qcow2Options)}
    convert = set(inspect.signature(imgcopy.convert).parameters)
    assert {f.name for f in dataclasses.fields(CopyOptions)} - convert == set()
    assert layout - convert == set()
    assert engine - stub_keywords("copy") == set()
    assert engine - stub_keywords("check_copy_options") == set()
    assert layout - stub_keywords("create") == set()
    assert layout - stub_keywords("check_create_options") == set()


def test_convert_documents_every_source_format():
    doc = imgcopy.convert.__doc__
    source = doc[doc.index("Source:"):doc.index("Destination:")]
    assert all(f in source for f in FORMATS), source
    assert '"raw" or "qcow2"' not in source


def test_readme_usage_lists_no_format_imgcopy_reads_as_the_only_ones():
    with open(os.path.join(REPO, "README.md")) as f:
        readme = f.read()
    usage = readme[readme.index("## Command line"):]
    usage = usage[:usage.index("```", usage.index("```") + 3)]
    assert re.findall(r"-f raw\|qcow2", usage) == [], usage


def test_comments_describe_what_is_there():
    def read(*parts):
        with open(os.path.join(REPO, *parts)) as f:
            return f.read()
    assert "later NBD" not in read("csrc", "driver.h")
    assert "Every blocking call of the core goes through here" not in read("csrc", "py", "glue.h")
    assert "nothing between them spells it out again" not in read("imgcopy", "options.py")
