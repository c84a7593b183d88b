"""The libFuzzer harnesses of the format parsers (tests/fuzz/fuzz_FORMAT.c),
under ASan/UBSan, for every format that has one:

1. builds tests/fuzz/fuzz_FORMAT with clang (skipped, with the reason, when
   clang or its libFuzzer runtime is missing: `make deps` installs them);
2. runs every input of tests/fuzz/regressions/FORMAT/ once (each crash the fuzzer
   ever found, and the hand-made hostile files): must exit 0;
3. fuzzes for IMGCOPY_FUZZ_SECONDS (default 20; 0 skips) from the seeds
   and the regressions: libFuzzer must exit 0 and leave no crash file.
New corpus entries and artifacts go to a temporary directory, never into
the source tree.
"""
import os
import re
import shutil
import subprocess

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
FUZZ_DIR = os.path.join(HERE, "fuzz")
FORMATS = sorted(f[len("fuzz_"):-len(".c")] for f in os.listdir(FUZZ_DIR)
                 if f.startswith("fuzz_") and f.endswith(".c"))
# per format
FUZZ_SECONDS = int(os.environ.get("IMGCOPY_FUZZ_SECONDS", "8"))
ARTIFACT_PREFIXES = ("crash-", "leak-", "timeout-", "oom-", "slow-unit-")


def _no_fuzzer_reason(tmp):
    """None when clang can build a libFuzzer target, else why not."""
    clang = shutil.which("clang")
    if not clang:
        return "needs clang (make deps installs it)"
    if not shutil.which("make"):
        return "needs make"
    src = os.path.join(tmp, "probe.c")
    with open(src, "w") as f:
        f.write("#include <stddef.h>\n#include <stdint.h>\n"
                "int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n)"
                "{ (void)d; (void)n; return 0; }\n")
    proc = subprocess.run([clang, "-fsanitize=fuzzer,address,undefined", "-o",
                           os.path.join(tmp, "probe"), src],
                          capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        return ("clang cannot link a libFuzzer target (Debian: libclang-rt-14-dev; "
                "make deps installs it): " + proc.stderr.strip()[-500:])
    return None


@pytest.fixture(scope="module")
def can_fuzz(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("fuzz-probe"))
    reason = _no_fuzzer_reason(tmp)
    if reason:
        pytest.skip(reason)


@pytest.fixture(scope="module", params=FORMATS)
def fuzzer(request, can_fuzz):
    """The format whose harness is built."""
    fmt = request.param
    proc = subprocess.run(["make", "-s", "-j2", "-C", FUZZ_DIR, "all", "FORMAT=" + fmt],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, "building the %s fuzzer failed:\n%s%s" % (
        fmt, proc.stdout, proc.stderr)
    return fmt


def _tail(text, n=6000):
    return text if len(text) <= n else "...\n" + text[-n:]


def _summary(text):
    """The sanitizer's or libFuzzer's verdict and the top frames, if any."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if "ERROR: AddressSanitizer" in line or "ERROR: libFuzzer" in line or \
                "runtime error:" in line:
            return "\n".join(lines[max(0, i - 3):i + 25])
    return ""


def test_regressions(fuzzer, tmp_path):
    """Every file of tests/fuzz/regressions/FORMAT runs once, cleanly."""
    regs = sorted(os.listdir(os.path.join(FUZZ_DIR, "regressions", fuzzer)))
    assert regs, "tests/fuzz/regressions/%s is empty" % fuzzer
    proc = subprocess.run(["make", "-s", "-C", FUZZ_DIR, "regress", "FORMAT=" + fuzzer,
                           "WORK=%s" % tmp_path],
                          capture_output=True, text=True, timeout=120 + 15 * len(regs))
    out = proc.stdout + proc.stderr
    summary = _summary(out)
    assert proc.returncode == 0, "a regression input fails again:\n%s\n---\n%s" % (
        summary, _tail(out, 1500 if summary else 6000))
    ran = len(re.findall(r"^Executed ", out, re.M))
    assert ran >= len(regs), "only %d of %d inputs ran:\n%s" % (ran, len(regs), _tail(out))


@pytest.mark.skipif(FUZZ_SECONDS <= 0, reason="IMGCOPY_FUZZ_SECONDS=0")
def test_fuzz_bounded(fuzzer, tmp_path, capsys):
    """libFuzzer for IMGCOPY_FUZZ_SECONDS from the format's seeds and regressions."""
    work = tmp_path / "work"
    proc = subprocess.run(["make", "-s", "-C", FUZZ_DIR, "run", "FORMAT=" + fuzzer,
                           "FUZZ_SECONDS=%d" % FUZZ_SECONDS, "WORK=%s" % work],
                          capture_output=True, text=True, timeout=FUZZ_SECONDS + 300)
    out = proc.stdout + proc.stderr
    m = re.search(r"stat::number_of_executed_units:\s*(\d+)", out)
    execs = int(m.group(1)) if m else None
    rate = re.search(r"stat::average_exec_per_sec:\s*(\d+)", out)
    with capsys.disabled():
        print("\nfuzz_%s: %s executions in %d s (%s/s)"
              % (fuzzer, execs if execs is not None else "?", FUZZ_SECONDS,
                 rate.group(1) if rate else "?"))
    artifacts = sorted(f for f in os.listdir(work) if f.startswith(ARTIFACT_PREFIXES)) \
        if work.is_dir() else []
    assert proc.returncode == 0 and not artifacts, (
        "the fuzzer found a problem (exit %d); inputs: %s\nsave each into "
        "tests/fuzz/regressions/%s/ (make -C tests/fuzz FORMAT=%s minimize CRASH=...)\n%s\n---\n%s"
        % (proc.returncode, [str(work / a) for a in artifacts], fuzzer, fuzzer, _summary(out),
           _tail(out, 1500 if _summary(out) else 6000)))
    assert execs, "no execution count in libFuzzer's output:\n" + _tail(out)
