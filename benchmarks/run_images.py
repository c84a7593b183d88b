"""Seeded sparse raw images made of data runs between holes, for the NBD
benchmarks (make_corpus.py's helpers: split_total, ContentGen, write_layout).
Each image is built once per corpus directory and reused while its stamp
(scale, seed, version) in IMAGE.json still matches.

  ref-640m.raw    the reference image of issue 25: 640 MiB virtual, 320 MiB
                  of data in 1,800 lognormal runs (x scale, both the bytes
                  and the number of runs: a smaller image sends fewer
                  requests), holes between
  mixed-1g.raw    1 GiB virtual, ~172 MiB in 400 lognormal runs (4 KiB ..
                  tens of MiB; the count is kept down to scale 1/16)

In both, a third of the runs of 64 KiB or more hold one written zero run
(4-256 KiB); the content is half text-like, half random.
"""
from __future__ import annotations

import json
import math
import os
import random
import sys
from typing import Dict, List, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_corpus import BLK, ContentGen, align_down, human, log, split_total, write_layout  # noqa: E402

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
REF, MIXED = "ref-640m.raw", "mixed-1g.raw"
VERSION = 1


def runs_layout(rng: random.Random, size: int, data_total: int, n: int) -> Dict:
    """`n` data runs of lognormal lengths adding up to `data_total`, holes of
    lognormal lengths between them (the last one trails); one written zero
    run in a third of the runs >= 64 KiB."""
    lengths = split_total(rng, data_total, n, 1.3, BLK)
    holes = split_total(rng, size - data_total, n, 1.0, BLK)
    data: List[Tuple[int, int]] = []
    zeros: List[Tuple[int, int]] = []
    off = 0
    for ln, hole in zip(lengths, holes):
        data.append((off, ln))
        if ln >= 64 * KiB and rng.random() < 1 / 3:
            z = align_down(int(math.exp(rng.uniform(math.log(4 * KiB), math.log(256 * KiB)))))
            z = max(BLK, min(z, align_down(ln // 4)))
            zeros.append((off + BLK + align_down(rng.randrange(ln - z - 2 * BLK)), z))
        off += ln + hole
    assert off == size, (off, size)
    return {"size": size, "data": data, "zeros": zeros}


def mixed_layout(scale: float, seed: int) -> Dict:
    rng = random.Random(seed * 1000003 + 7)
    size = align_down(int(GiB * scale), MiB)
    data_total = align_down(int(172 * MiB * scale))
    n = max(8, int(round(400 * min(1.0, scale * 16))))
    return runs_layout(rng, size, data_total, n)


def ref_layout(scale: float, seed: int) -> Dict:
    rng = random.Random(seed * 1000003 + 25)
    size = align_down(int(640 * MiB * scale), MiB)
    data_total = align_down(int(320 * MiB * scale))
    n = max(8, int(round(1800 * scale)))
    return runs_layout(rng, size, data_total, n)


LAYOUTS = {REF: (ref_layout, 25), MIXED: (mixed_layout, 17)}


def build(corpus: str, name: str, scale: float, seed: int = 4) -> str:
    """CORPUS/NAME at `scale`, built unless its stamp matches; its path."""
    layout, salt = LAYOUTS[name]
    path = os.path.join(corpus, name)
    stamp = {"scale": scale, "seed": seed, "version": VERSION}
    try:
        with open(path + ".json") as f:
            if json.load(f)["stamp"] == stamp and os.path.exists(path):
                return path
    except (OSError, ValueError, KeyError):
        pass
    os.makedirs(corpus, exist_ok=True)
    lay = layout(scale, seed)
    log("%s: building in %s (%s virtual, %s of data in %d runs, %d zero runs)" % (
        name, corpus, human(lay["size"]), human(sum(n for _, n in lay["data"])),
        len(lay["data"]), len(lay["zeros"])))
    write_layout(path, lay, ContentGen(seed * 7 + salt, text_fraction=0.5))
    with open(path + ".json", "w") as f:
        json.dump({"stamp": stamp, "layout": lay}, f)
    return path


def data_runs(path: str) -> int:
    """Data runs of an image built here (from its layout), 0 if unknown."""
    try:
        with open(path + ".json") as f:
            return len(json.load(f)["layout"]["data"])
    except (OSError, ValueError, KeyError):
        return 0
