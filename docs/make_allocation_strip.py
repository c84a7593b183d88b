#!/usr/bin/env python3
"""Regenerate docs/allocation_strip.png (the README's picture): ExtentMap.plot()
of a guest's overlay on a compressed template, as a v2v pipeline or a cloud
leaves them:

  template.qcow2  the benchmark corpus's OS-like image at 1/16 scale (384 MiB),
                  compressed by imgcopy.convert(compress=True)
  overlay.qcow2   over it: the guest wrote data, zeroed ranges (zero clusters
                  that hide the template's data) and discarded others

so the picture shows every kind: data, backing data (hatched where the
template stores it compressed), zeroed, holes.

    python docs/make_allocation_strip.py   (needs pip install .[notebook] and qemu-io)
"""
import importlib.util
import os
import random
import subprocess
import sys
import tempfile

import matplotlib

matplotlib.use("Agg")

import imgcopy  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
MiB = 1 << 20


def guest_writes(emap, seed: int = 16) -> list:
    """qemu-io commands: writes, write-zeroes and discards a running guest
    makes, some over the template's data, some in its holes."""
    rng = random.Random(seed)
    size = emap.size
    cmds = []
    for _ in range(40):
        at = rng.randrange(0, size - 4 * MiB) // 65536 * 65536
        length = rng.choice([64 << 10, 256 << 10, MiB, 3 * MiB])
        what = rng.random()
        if what < 0.6:
            cmds.append(f"write -P 0x{rng.randrange(1, 255):02x} {at} {length}")
        elif what < 0.8:
            cmds.append(f"write -z {at} {length}")
        else:
            cmds.append(f"discard {at} {length}")
    return cmds


def main() -> int:
    spec = importlib.util.spec_from_file_location(
        "make_corpus", os.path.join(HERE, "..", "benchmarks", "make_corpus.py"))
    assert spec is not None and spec.loader is not None
    make_corpus = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_corpus)
    with tempfile.TemporaryDirectory() as d:
        src = make_corpus.build_sparse_6g(d, 0.0625, 4, {})
        template = os.path.join(d, "template.qcow2")
        imgcopy.convert(src, template, dst_format="qcow2", compress=True)
        overlay = os.path.join(d, "overlay.qcow2")
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", template,
                        "-F", "qcow2", overlay], check=True)
        args = ["qemu-io", "-f", "qcow2"]
        for c in guest_writes(imgcopy.map(template)):
            args += ["-c", c]
        subprocess.run(args + [overlay], check=True, stdout=subprocess.DEVNULL)
        strip, _ = imgcopy.map(overlay).plot()
        out = os.path.join(HERE, "allocation_strip.png")
        strip.figure.savefig(out, dpi=90)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
