#!/usr/bin/env python3
"""Regenerate docs/allocation_strip.png (the README's picture): ExtentMap.plot()
of the benchmark corpus's OS-like image at 1/16 scale.

    python docs/make_allocation_strip.py        (needs pip install .[notebook])
"""
import importlib.util
import os
import sys
import tempfile

import matplotlib

matplotlib.use("Agg")

import imgcopy  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> int:
    spec = importlib.util.spec_from_file_location(
        "make_corpus", os.path.join(HERE, "..", "benchmarks", "make_corpus.py"))
    assert spec is not None and spec.loader is not None
    make_corpus = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_corpus)
    with tempfile.TemporaryDirectory() as d:
        src = make_corpus.build_sparse_6g(d, 0.0625, 4, {})
        strip, _ = imgcopy.map(src).plot()
        out = os.path.join(HERE, "allocation_strip.png")
        strip.figure.savefig(out, dpi=90)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
