"""Stress for resumable copies (issue 27), run on demand, not by the suite:

    .venv/bin/python -m tests.stress.journal_kills [--rounds 200] [--seed 1]

Each round copies a data-and-holes image from a slow NBD source (nbdkit's
delay filter) with --journal and --checksum, SIGKILLs the command at a
random point of its progress (sometimes several times in a row), resumes
it to the end, into a raw file or a qcow2 image (compressed or not: its
tables checkpointed, the partial image reopened with resume=True), and
checks: the result equals the source (qemu-img compare; a qcow2 one also
passes qemu-img check with no leak),
its checksum is the source's, the resuming run copied exactly what the
journal did not hold, and no journal or partial file is left.  Exit 1 on
the first failure, with the round's seed."""
import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile

import imgcopy

from ..servers import nbdkit
from ..test_journal import (INTERVAL, SIZE, SLACK, Killed, convert_argv, kill_at_progress,
                            make_source, run_to_end)


def one_round(workdir, seed):
    rng = random.Random(seed)
    src = make_source(os.path.join(workdir, "src.raw"), seed=seed)
    kills = rng.choice([1, 1, 1, 2, 3])
    output = rng.choice([[], [], ["-O", "qcow2"], ["-O", "qcow2", "-c"]])
    fmt = "qcow2" if output else "raw"
    dst, journal = os.path.join(workdir, "dst." + fmt), os.path.join(workdir, "j")
    with nbdkit("file", src, "rdelay=%dms" % rng.choice([20, 50, 100]), filters=["delay"],
                log=False, extra=["--threads=1"]) as server:
        argv = convert_argv(server.uri, dst, journal, "--checksum=sha256", *output)
        killed = Killed(0.0, 0.0)
        for _ in range(kills):
            killed = kill_at_progress(argv, rng.uniform(0.05, 0.95))
        stats = run_to_end(argv)
    moved = stats["bytes_written"] + stats["bytes_zeroed"] + stats["bytes_skipped"]
    problems = []
    if moved != SIZE - stats["bytes_resumed"]:
        problems.append(f"moved {moved}, resumed {stats['bytes_resumed']}")
    lost = killed.fraction * SIZE - stats["bytes_resumed"]
    if kills == 1 and lost > INTERVAL + SLACK + killed.step * SIZE:
        problems.append(f"lost {lost:.0f} bytes (the progress's largest step: "
                        f"{killed.step * SIZE:.0f})")
    if stats["checksum"] != imgcopy.checksum(src):
        problems.append("checksum differs")
    same = subprocess.run(["qemu-img", "compare", "-q", "-f", "raw", "-F", fmt, src, dst])
    if same.returncode != 0:
        problems.append("content differs")
    if fmt == "qcow2":
        check = subprocess.run(["qemu-img", "check", "-f", "qcow2", dst], capture_output=True,
                               text=True)
        if check.returncode != 0 or "No errors were found" not in check.stdout or \
                "leaked" in check.stdout:
            problems.append("qemu-img check: " + (check.stdout + check.stderr).strip()[-300:])
    left = [n for n in os.listdir(workdir) if n.endswith(".partial") or n == "j"]
    if left:
        problems.append(f"left behind: {left}")
    return problems, stats["bytes_resumed"], kills, " ".join(output) or "raw"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    for r in range(args.rounds):
        seed = args.seed * 100003 + r
        workdir = tempfile.mkdtemp(prefix="journal-stress-")
        try:
            problems, resumed, kills, output = one_round(workdir, seed)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        print(f"round {r + 1}/{args.rounds} seed {seed}: {output}, {kills} kill(s), "
              f"{resumed} bytes resumed: {'; '.join(problems) or 'ok'}", flush=True)
        if problems:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
