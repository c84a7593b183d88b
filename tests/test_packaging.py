"""Packaging: the checkout imports what was built, an sdist builds and
works alone on the oldest supported Python, the build tracks headers and
flags, only the module's init function is exported, and the `test` extra
lists what the tests import."""
import ast
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time

import pytest

import imgcopy

from .oracles import QEMU_IMG, assert_same_content

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OLDEST = (3, 9)


def run(cmd, **kw):
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    return subprocess.run(cmd, **kw)


def oldest_python():
    """An interpreter of the oldest supported version, if this machine has
    one (pyenv's or on PATH), else this one."""
    name = "python%d.%d" % OLDEST
    candidates = glob.glob(os.path.expanduser("~/.pyenv/versions/%d.%d*/bin/%s" % (OLDEST + (name,))))
    candidates += glob.glob("/root/.pyenv/versions/%d.%d*/bin/%s" % (OLDEST + (name,)))
    on_path = shutil.which(name)
    for exe in candidates + ([on_path] if on_path else []):
        if run([exe, "-c", "import venv, ensurepip"]).returncode == 0:
            return exe
    return sys.executable


def test_checkout_imports_its_build_from_anywhere(tmp_path):
    """From the repository root (where the source folder shadows any other
    install) and from elsewhere, `import imgcopy` gives the checkout's
    package with its compiled core."""
    for cwd in (REPO, str(tmp_path)):
        p = run([sys.executable, "-c", "import imgcopy, imgcopy._core; print(imgcopy.__file__)"],
                cwd=cwd)
        assert p.returncode == 0, p.stderr
        assert os.path.dirname(p.stdout.strip()) == os.path.join(REPO, "imgcopy")


def _clone(dest):
    """A git clone of this checkout at `dest`, with its uncommitted edits
    to tracked files applied; skips where the checkout is no git work tree."""
    git = shutil.which("git")
    if git is None or run([git, "-C", REPO, "rev-parse", "--git-dir"]).returncode != 0:
        pytest.skip("needs git and a git checkout")
    p = run([git, "clone", "-q", REPO, str(dest)])
    assert p.returncode == 0, p.stderr
    diff = run([git, "-C", REPO, "diff", "HEAD", "--binary"]).stdout
    if diff.strip():
        p = run([git, "-C", str(dest), "apply", "--whitespace=nowarn"], input=diff)
        assert p.returncode == 0, p.stderr
    return dest


def test_clone_named_imgcopy_imports_from_its_parent(tmp_path):
    """A clone named imgcopy, built with `make build`: a script, `python
    -c` and a pytest file in the clone's parent import the checkout's
    package, not the clone's folder as an empty namespace package (which
    setuptools' editable import hook, running after the path search, lets
    win)."""
    clone = _clone(tmp_path / "imgcopy")
    p = run(["make", "-C", str(clone), "build", "PYTHON=" + sys.executable], timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    vpy = str(clone / ".venv" / "bin" / "python")
    expected = str(clone / "imgcopy" / "__init__.py")
    check = ("import imgcopy, imgcopy._core\n"
             "assert imgcopy.__file__ == %r, imgcopy\n"
             "assert callable(imgcopy.convert)\n" % expected)
    (tmp_path / "beside.py").write_text(check + "print('ok')\n")
    for args in (["-c", check + "print('ok')"], ["beside.py"]):
        p = run([vpy] + args, cwd=str(tmp_path))
        assert p.returncode == 0 and p.stdout == "ok\n", (args, p.stdout + p.stderr)

    p = run([vpy, "-m", "pip", "install", "-q", "pytest"], timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    (tmp_path / "test_beside.py").write_text(
        "def test_beside():\n"
        "    exec(%r)\n" % check)
    p = run([vpy, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_beside.py"],
            cwd=str(tmp_path), timeout=300)
    assert p.returncode == 0 and "1 passed" in p.stdout, p.stdout + p.stderr


def test_version_has_one_source():
    from imgcopy._version import __version__

    assert imgcopy.__version__ == __version__
    p = run([sys.executable, "-m", "imgcopy", "--version"])
    assert p.returncode == 0 and p.stdout.strip() == "imgcopy " + __version__
    pyproject = open(os.path.join(REPO, "pyproject.toml")).read()
    assert not re.search(r'^version\s*=\s*"', pyproject, re.M), "a second version in pyproject"
    assert 'dynamic = ["version"]' in pyproject


def test_only_the_init_function_is_exported():
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("needs nm (binutils)")
    lib = imgcopy._core.__file__
    p = run([nm, "-D", "--defined-only", lib])
    assert p.returncode == 0, p.stderr
    names = {line.split()[-1] for line in p.stdout.splitlines() if line.split()[1:2] in
             (["T"], ["D"], ["B"], ["R"], ["W"])}
    assert names == {"PyInit__core"}, sorted(names)


def test_header_edit_rebuilds_the_extension(tmp_path):
    """`setup.py build_ext --inplace` skips an up-to-date extension and
    rebuilds it when a header changes (depends=)."""
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(os.path.join(REPO, name), tmp_path)
    shutil.copytree(os.path.join(REPO, "csrc"), tmp_path / "csrc")
    shutil.copytree(os.path.join(REPO, "imgcopy"), tmp_path / "imgcopy",
                    ignore=shutil.ignore_patterns("*.so", "__pycache__"))

    def build():
        p = run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=str(tmp_path))
        assert p.returncode == 0, p.stdout + p.stderr
        return p.stdout + p.stderr

    assert "module.c" in build()
    assert "module.c" not in build(), "an up-to-date extension was rebuilt"
    # an edit made after the build (a build and an edit within one
    # second are not told apart by file times)
    header = tmp_path / "csrc" / "drivers" / "qcow2_format.h"
    later = time.time() + 5
    os.utime(header, (later, later))
    assert "module.c" in build(), "editing a header did not rebuild the extension"


def test_sdist_builds_alone_and_converts_on_the_oldest_python(tmp_path):
    """An sdist holds every source and header; installed into a fresh
    virtualenv of the oldest supported Python it converts an image, away
    from the checkout."""
    p = run([sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir",
             str(tmp_path / "dist"), REPO], timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    (sdist,) = glob.glob(str(tmp_path / "dist" / "imgcopy-*.tar.gz"))
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    for header in glob.glob(os.path.join(REPO, "csrc", "**", "*.h"), recursive=True):
        assert os.path.relpath(header, REPO) in names
    assert {"LICENSE", "imgcopy/py.typed", "imgcopy/_core.pyi"} <= names

    python = oldest_python()
    venv = tmp_path / "venv"
    p = run([python, "-m", "venv", str(venv)])
    assert p.returncode == 0, p.stderr
    vpy = str(venv / "bin" / "python")
    p = run([vpy, "-m", "pip", "install", "-q", sdist], cwd=str(tmp_path), timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr

    work = tmp_path / "work"
    work.mkdir()
    src = work / "disk.raw"
    with open(src, "wb") as f:
        f.truncate(8 << 20)
        f.seek(1 << 20)
        f.write(os.urandom(300000))
    script = (
        "import imgcopy, imgcopy.cli, imgcopy.info, imgcopy.plan, imgcopy.progress, sys\n"
        "assert imgcopy.__file__.startswith(sys.prefix), imgcopy.__file__\n"
        "r = imgcopy.convert('disk.raw', 'disk.qcow2', dst_format='qcow2')\n"
        "assert r.bytes_written >= 300000, r\n"
        "print(imgcopy.info('disk.qcow2').format, len(imgcopy.map('disk.qcow2')))\n"
        "print(sys.version_info[:2])\n")
    p = run([vpy, "-c", script], cwd=str(work))
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.splitlines()[0].startswith("qcow2 ")
    if python != sys.executable:
        assert p.stdout.splitlines()[1] == str(OLDEST)
    if QEMU_IMG:
        assert_same_content(str(src), str(work / "disk.qcow2"), "raw", "qcow2")
    p = run([str(venv / "bin" / "imgcopy"), "--version"], cwd=str(work))
    assert p.returncode == 0 and p.stdout.strip() == "imgcopy " + imgcopy.__version__


# Distributions of the `test` extra that tests run rather than import.
RUN_NOT_IMPORTED = {
    "build": "python -m build, in test_sdist_builds_alone_and_converts_on_the_oldest_python",
}


def _extra(name):
    """The distributions an extra of pyproject.toml lists, lower case."""
    text = open(os.path.join(REPO, "pyproject.toml")).read()
    block = re.search(r'^%s\s*=\s*\[(.*?)\]' % name, text, re.M | re.S)
    assert block, f"no {name} extra in pyproject.toml"
    return {re.split(r"[<>=!~ \[;]", req, maxsplit=1)[0].lower()
            for req in re.findall(r'"([^"]+)"', block.group(1))}


def _test_extra():
    return _extra("test")


def _imports(source, filename):
    """The top-level modules a Python source imports (importorskip too),
    but the standard library's and imgcopy's own."""
    top = set()
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            top.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            top.add(node.module.split(".")[0])
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "importorskip"
              and node.args and isinstance(node.args[0], ast.Constant)):
            top.add(str(node.args[0].value).split(".")[0])
        elif (isinstance(node, ast.For) and isinstance(node.target, ast.Name)
              and isinstance(node.iter, (ast.Tuple, ast.List))
              and any(isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "importorskip"
                      and n.args and isinstance(n.args[0], ast.Name)
                      and n.args[0].id == node.target.id for n in ast.walk(node))):
            # for name in ("a", "b"): pytest.importorskip(name)
            top.update(str(e.value).split(".")[0] for e in node.iter.elts
                       if isinstance(e, ast.Constant))
    stdlib = set(getattr(sys, "stdlib_module_names", ())) | set(sys.builtin_module_names)
    return {m for m in top if m not in stdlib and m not in ("imgcopy", "tests", "__future__")}


def _imported_modules():
    top = set()
    for path in glob.glob(os.path.join(REPO, "tests", "**", "*.py"), recursive=True):
        top |= _imports(open(path).read(), path)
    return top


def _distributions(module, providers):
    dists = {d.lower() for d in providers.get(module, [])}
    assert dists, f"{module!r} is imported, but no installed distribution provides it"
    return dists


@pytest.mark.skipif(sys.version_info < (3, 10), reason="needs packages_distributions()")
def test_test_extra_matches_what_the_tests_import():
    from importlib.metadata import packages_distributions

    extra = _test_extra()
    providers = packages_distributions()
    imported = set()
    for module in _imported_modules():
        dists = _distributions(module, providers)
        assert dists & extra, f"tests import {module!r} ({sorted(dists)}), not in the test extra"
        imported |= dists & extra
    unused = extra - imported - set(RUN_NOT_IMPORTED)
    assert not unused, f"the test extra lists {sorted(unused)}, which no test imports"


@pytest.mark.skipif(sys.version_info < (3, 10), reason="needs packages_distributions()")
def test_notebook_extra_runs_the_notebooks():
    """The `notebook` extra is what running the notebooks takes: what
    tests/test_notebooks.py runs them with (nbclient, nbformat, ipykernel:
    `jupyter execute`), what their cells import, and what imgcopy imports
    for its notebook views and progress bars; nothing else; README says
    the same."""
    from importlib.metadata import packages_distributions

    runner = os.path.join(REPO, "tests", "test_notebooks.py")
    needed = {m: runner for m in _imports(open(runner).read(), runner) if m != "pytest"}
    for path in glob.glob(os.path.join(REPO, "notebooks", "*.ipynb")):
        cells = json.load(open(path))["cells"]
        code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        code = "\n".join(line for line in code.splitlines() if not line.startswith(("%", "!")))
        needed.update({m: path for m in _imports(code, path)})
    for path in glob.glob(os.path.join(REPO, "imgcopy", "*.py")):
        needed.update({m: path for m in _imports(open(path).read(), path)})

    extra = _extra("notebook")
    providers = packages_distributions()
    used = set()
    for module, where in sorted(needed.items()):
        dists = _distributions(module, providers)
        assert dists & extra, (f"{os.path.relpath(where, REPO)} imports {module!r} "
                               f"({sorted(dists)}), not in the notebook extra {sorted(extra)}")
        used |= dists & extra
    assert not extra - used, f"the notebook extra lists {sorted(extra - used)}, which nothing uses"

    readme = open(os.path.join(REPO, "README.md")).read()
    said = re.search(r"`pip install \.\[notebook\]`: ([^;]*);", readme)
    assert said, "README no longer lists the notebook extra"
    listed = {w.strip().lower() for w in re.split(r",|\band\b", said.group(1)) if w.strip()}
    assert listed == extra, (sorted(listed), sorted(extra))
