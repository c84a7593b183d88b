"""Ctrl-C while the imgcopy command starts (the interpreter importing the
package, the C core, the command line's modules) ends it as a later one
does: ``imgcopy: interrupted`` on stderr, exit status 130, no traceback.
Deterministic: a sitecustomize sends SIGINT to the child itself when one
given module is about to be imported; then with real delays."""
import os
import signal
import subprocess
import sys
import time

import pytest

from .convert_helpers import imgcopy_cmd
from .units import MiB

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE_DIR = os.path.join(REPO, "imgcopy") + os.sep

HOOK = '''
import os, signal, sys
_WHEN = os.environ.get("IMGCOPY_TEST_SIGINT_AT")

class _Interrupt:
    def find_spec(self, name, path=None, target=None):
        global _WHEN
        if name == _WHEN:
            _WHEN = None
            os.kill(os.getpid(), signal.SIGINT)
        return None

sys.meta_path.insert(0, _Interrupt())
'''

# the package's first module, its C core, modules deep in a command's
# import, the command line's (imported by bin/imgcopy and __main__ after the
# package); each with arguments that import it and then end (the package
# imports its modules as they are used: --version only the C core's side,
# --help the command line, a command what it runs)
MODULES = {"imgcopy._program": ["--version"], "imgcopy.errors": ["--version"],
           "imgcopy._core": ["--version"], "imgcopy.features": ["--version"],
           "imgcopy.convert": ["convert", "-T", "none", "--request-size", "4k", "SOURCE",
                               "null:"],
           "imgcopy.measure": ["measure", "--size", "1M"], "imgcopy.info": ["info", "SOURCE"],
           "imgcopy.cli": ["--help"], "imgcopy.cli_checksum": ["--help"],
           "imgcopy.cli_compare": ["--help"], "imgcopy.cli_measure": ["--help"],
           "argparse": ["--help"]}


@pytest.fixture
def hooked_env(tmp_path, imgcopy_env):
    d = tmp_path / "hook"
    d.mkdir()
    (d / "sitecustomize.py").write_text(HOOK)
    env = dict(imgcopy_env)
    env["PYTHONPATH"] = os.pathsep.join([str(d)] + [p for p in
                                                    [env.get("PYTHONPATH")] if p])
    return env


@pytest.fixture(scope="module")
def long_source(tmp_path_factory):
    """Seconds of data read 4 KiB at a time with O_DIRECT (zeros cost a
    copy next to nothing: they cannot make one last)."""
    path = str(tmp_path_factory.mktemp("early") / "data.raw")
    with open(path, "wb") as f:
        block = bytes(range(1, 256)) * 4112  # no zero run
        for _ in range(256 * MiB // len(block) + 1):
            f.write(block)
    return path


def commands(source):
    args = ["convert", "-T", "none", "--request-size", "4k", source, "null:"]
    return {"script": imgcopy_cmd() + args, "module": [sys.executable, "-m", "imgcopy"] + args}


@pytest.mark.parametrize("how", ["script", "module"])
@pytest.mark.parametrize("module", MODULES)
def test_sigint_during_an_import(long_source, hooked_env, how, module):
    cmd = commands(long_source)[how][:-7] + [long_source if a == "SOURCE" else a
                                             for a in MODULES[module]]
    if how == "script" and not cmd[0].endswith("imgcopy"):
        pytest.skip("no imgcopy console script next to %s" % sys.executable)
    env = dict(hooked_env, IMGCOPY_TEST_SIGINT_AT=module)
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
    assert (p.returncode, p.stderr, p.stdout) == (130, "imgcopy: interrupted\n", ""), p.stderr


SET_NAME_HOOK = '''
import dataclasses, os, signal
_set_name = dataclasses.Field.__set_name__

def _interrupting(self, owner, name):
    if owner.__name__ == os.environ.get("IMGCOPY_TEST_SIGINT_IN"):
        os.environ["IMGCOPY_TEST_SIGINT_IN"] = ""
        os.kill(os.getpid(), signal.SIGINT)
    return _set_name(self, owner, name)

dataclasses.Field.__set_name__ = _interrupting
'''


@pytest.mark.parametrize("how", ["script", "module"])
def test_sigint_while_a_dataclass_is_made(long_source, tmp_path, imgcopy_env, how):
    """Python 3.11 turns a KeyboardInterrupt raised in a __set_name__ (a
    dataclass's field, as a module the command imports lazily is run) into
    a RuntimeError whose cause it is: still an interrupt, not a traceback
    (one suite run in eight sent its delayed Ctrl-C there)."""
    d = tmp_path / "hook"
    d.mkdir()
    (d / "sitecustomize.py").write_text(SET_NAME_HOOK)
    env = dict(imgcopy_env, IMGCOPY_TEST_SIGINT_IN="CopyResult")
    env["PYTHONPATH"] = os.pathsep.join([str(d)] + [p for p in [env.get("PYTHONPATH")] if p])
    cmd = commands(long_source)[how]
    if how == "script" and not cmd[0].endswith("imgcopy"):
        pytest.skip("no imgcopy console script next to %s" % sys.executable)
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
    assert (p.returncode, p.stderr, p.stdout) == (130, "imgcopy: interrupted\n", ""), p.stderr


def test_a_program_that_imports_imgcopy_gets_its_keyboardinterrupt(hooked_env):
    """Only the command exits: another program sees the KeyboardInterrupt
    (here while the package imports a name the program asks for: the
    package imports its modules as their names are first used)."""
    code = ("try:\n"
            "    from imgcopy import convert\n"
            "except KeyboardInterrupt:\n"
            "    print('caught')\n")
    env = dict(hooked_env, IMGCOPY_TEST_SIGINT_AT="imgcopy.convert")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=60)
    assert (p.returncode, p.stdout) == (0, "caught\n"), p.stderr


# from before the interpreter runs to the copy running, on a loaded machine too
DELAYS = [0.0, 0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.07, 0.08, 0.09, 0.1, 0.12, 0.14,
          0.17, 0.2, 0.25, 0.3, 0.4, 0.5, 0.7, 1.0]


@pytest.mark.parametrize("how", ["script", "module"])
def test_sigint_at_early_delays(long_source, imgcopy_env, how):
    """From the package's first statement on: the command's message and
    130.  Before it, Python's own start: until the interpreter has a SIGINT
    handler the signal kills it (status -2, nothing printed); while it
    imports its site module, or sets up its standard streams (or runpy, for -m) CPython fails in its own way;
    while bin/imgcopy
    (pip's wrapper) or runpy locates the package, the KeyboardInterrupt is
    raised at their import line.  None of these shows a frame of imgcopy's."""
    cmd = commands(long_source)[how]
    ours = 0
    for delay in DELAYS:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             env=imgcopy_env)
        try:
            time.sleep(delay)
            p.send_signal(signal.SIGINT)
            out, err = p.communicate(timeout=30)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        err = err.decode(errors="replace")
        if err == "imgcopy: interrupted\n":
            # the command's answer; its status 130, or (a signal caught as
            # the interpreter ends) death by SIGINT, which a shell shows as 130
            assert p.returncode in (130, -signal.SIGINT) and out == b"", (delay, p.returncode)
            ours += 1
        elif err.startswith("Exception ignored in: <function _get_module_lock.") and \
                err.rstrip().endswith("KeyboardInterrupt:"):
            # CPython's import machinery dropped it (raised in a module
            # lock's weakref callback, any import's, it can only be
            # printed): the command went on, whatever its version
            assert PACKAGE_DIR not in err and p.returncode == 0, (delay, p.returncode, err)
        else:
            # Python's own start: no frame of imgcopy's, whatever it prints
            assert PACKAGE_DIR not in err, (delay, p.returncode, err)
            assert p.returncode in (-signal.SIGINT, 1, 120), (delay, p.returncode, err)
            assert (err == "" or err.rstrip("\n").endswith("KeyboardInterrupt") or
                    err.startswith("Could not import runpy module")), (delay, err)
    assert ours, "no delay reached imgcopy's code"
