"""benchmarks/demo.py (`make demo`): the library's copy timed in-process
beside qemu-img convert's process, the command's time on a line of its own,
rounds that take turns, and every copy checked by qemu-img compare."""
import importlib.util
import os
import re
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO = os.path.join(REPO, "benchmarks", "demo.py")


def load_demo():
    spec = importlib.util.spec_from_file_location("demo", DEMO)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_rounds_take_turns():
    demo = load_demo()
    order = demo.turns(["a", "b", "c"], 3)
    assert order == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]]
    assert demo.turns(["a", "b"], 3) == [["a", "b"], ["b", "a"], ["a", "b"]]


def test_the_makefile_demos_an_image_whose_copy_is_timed():
    with open(os.path.join(REPO, "Makefile")) as f:
        scale = float(re.search(r"^SAMPLE_SCALE \?= ([\d.]+)$", f.read(), re.M).group(1))
    assert scale >= 0.25  # 300 MiB of data: the copy, not a process starting


@pytest.mark.skipif(not (shutil.which("qemu-img") and shutil.which("strace")),
                    reason="the demo needs qemu-img and strace")
def test_demo_runs_and_checks_every_copy(tmp_path, imgcopy_env):
    p = subprocess.run([sys.executable, DEMO, str(tmp_path), "--scale", "0.0625",
                        "--rounds", "1"], capture_output=True, text=True, env=imgcopy_env,
                       timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout
    sections = out.split("\n== raw -> ")[1:]
    assert [s.split(" ==")[0] for s in sections] == ["raw", "qcow2"], out
    for section in sections:
        for tool in ("imgcopy.convert():", "qemu-img convert:", "imgcopy convert:"):
            verdict = [line for line in section.splitlines() if line.strip().startswith(tool)]
            assert len(verdict) == 1 and "Images are identical. (exit 0)" in verdict[0], section
        rows = {}
        for line in section.splitlines():
            m = re.match(r"  (imgcopy\.convert\(\)|qemu-img convert|imgcopy convert) +"
                         r"\d+\.\d\ds ", line)
            if m:
                rows[m.group(1)] = line
        assert set(rows) == {"imgcopy.convert()", "qemu-img convert", "imgcopy convert"}, section
        # the command's time is on its own line, saying what it adds
        assert "interpreter" in rows["imgcopy convert"], section
        assert "interpreter" not in rows["imgcopy.convert()"], section
    assert "MISMATCH" not in out
