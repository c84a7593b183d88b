"""VMDK images made by qemu-img (the oracle) from seeded raw sources: every
subformat qemu writes, some creation options, a delta chain, and the
sample images from other producers.

- :func:`make_source`: a raw file of an odd size (a multiple of 512) with
  seeded data runs, holes, written zero runs and data up to the last byte;
- :func:`build`: one image of :data:`NAMES` in a directory, returning
  :class:`VmdkImage` (the path, the raw file it must read as, if any).
"""

import bz2
import os
import random
import shutil
from typing import NamedTuple, Optional

from ..oracles import qemu_img, qemu_io
from ..units import GiB, KiB, MiB
from .sparse import make_sparse, pattern

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data",
                    "qemu-iotests")


class VmdkImage(NamedTuple):
    path: str
    raw: Optional[str]  # what it reads as (None: only qemu knows)


def make_source(path, size, seed):
    """Seeded data runs, holes, zero runs written as data, and the last bytes."""
    rng = random.Random(seed)
    data = []
    pos = 0
    while pos < size - 64 * KiB:
        pos += rng.choice([0, 512, 4 * KiB, 60 * KiB, 200 * KiB, 1 * MiB])
        n = rng.choice([512, 3 * KiB, 64 * KiB, 100 * KiB])
        if pos + n > size:
            break
        zeros = rng.random() < 0.25
        data.append((pos, bytes(n) if zeros else pattern(rng, n, zero_runs=True)))
        pos += n
    data.append((size - 1536, pattern(rng, 1536)))
    return make_sparse(path, size, data)


SIZE = 5 * MiB + 7 * 512
BIG = 2 * GiB + 3 * MiB + 512  # two extents in the twoGb* subformats

# name: (subformat, options, size)
CONVERTED = {
    "monolithicSparse": ("monolithicSparse", [], SIZE),
    "monolithicFlat": ("monolithicFlat", [], SIZE),
    "twoGbMaxExtentSparse": ("twoGbMaxExtentSparse", [], SIZE),
    "twoGbMaxExtentFlat": ("twoGbMaxExtentFlat", [], SIZE),
    "streamOptimized": ("streamOptimized", [], SIZE),
    "lsilogic": ("monolithicSparse", ["adapter_type=lsilogic"], SIZE),
    "ide-compat6": ("monolithicSparse", ["adapter_type=ide", "hwversion=6"], SIZE),
    "stream-compat6": ("streamOptimized", ["compat6=on"], SIZE),
    "zeroed-grain": ("monolithicSparse", ["zeroed_grain=on"], SIZE),
    "big-twoGbSparse": ("twoGbMaxExtentSparse", [], BIG),
    "big-twoGbFlat": ("twoGbMaxExtentFlat", [], BIG),
}
CHAINS = ["delta", "delta-zeroed", "delta-of-twoGb"]
SAMPLES = ["iotest-version3"]
NAMES = list(CONVERTED) + CHAINS + SAMPLES


def _source(d, size, seed):
    path = os.path.join(d, "src-%d-%d.raw" % (size, seed))
    if not os.path.exists(path):
        if size > GiB:
            # cheap: data at the start, around the 2 GiB extent boundary, at the end
            rng = random.Random(seed)
            make_sparse(path, size, [(0, pattern(rng, 100 * KiB)),
                                     (2 * GiB - 70 * KiB, pattern(rng, 150 * KiB)),
                                     (size - 3 * 512, pattern(rng, 3 * 512))])
        else:
            make_source(path, size, seed)
    return path


def _convert(d, name, subformat, options, size, seed=1):
    src = _source(d, size, seed)
    path = os.path.join(d, name + ".vmdk")
    opts = ",".join(["subformat=" + subformat] + options)
    qemu_img("convert", "-f", "raw", "-O", "vmdk", "-o", opts, src, path)
    return VmdkImage(path, src)


def _delta(d, name, base_name, base_opts, delta_opts, size):
    """A base image and a delta over it with qemu-io writes into the delta."""
    base = _convert(d, name + "-base", "monolithicSparse" if size < GiB else
                    "twoGbMaxExtentSparse", base_opts, size, seed=3)
    path = os.path.join(d, name + ".vmdk")
    opts = ["-o", ",".join(delta_opts)] if delta_opts else []
    qemu_img("create", "-f", "vmdk", "-b", os.path.basename(base.path), "-F", "vmdk", *opts,
             path, cwd=d)
    qemu_io(path, ["write -P 0x55 100k 200k", "write -z 1M 128k", "write -P 7 %d 512" %
                   (size - 512), "write -P 9 3M 64k"], fmt="vmdk")
    return VmdkImage(path, None)


def build(d, name) -> VmdkImage:
    os.makedirs(d, exist_ok=True)
    if name in CONVERTED:
        sub, options, size = CONVERTED[name]
        img = _convert(d, name, sub, options, size)
        if name == "zeroed-grain":
            # zeroed-grain entries over data, and over nothing
            qemu_io(img.path, ["write -z 64k 128k", "write -z 4M 64k"], fmt="vmdk")
            img = VmdkImage(img.path, None)
        return img
    if name == "delta":
        return _delta(d, name, "base", [], [], SIZE)
    if name == "delta-zeroed":
        return _delta(d, name, "base", [], ["zeroed_grain=on"], SIZE)
    if name == "delta-of-twoGb":
        return _delta(d, name, "base", [], [], BIG)
    if name in SAMPLES:
        path = os.path.join(d, name + ".vmdk")
        with bz2.open(os.path.join(DATA, name + ".vmdk.bz2")) as f, open(path, "wb") as out:
            shutil.copyfileobj(f, out)
        return VmdkImage(path, None)
    raise KeyError(name)


def sample(d, name) -> str:
    """A sample image (tests/data/qemu-iotests/NAME.vmdk.bz2) decompressed into d."""
    path = os.path.join(d, name + ".vmdk")
    with bz2.open(os.path.join(DATA, name + ".vmdk.bz2")) as f, open(path, "wb") as out:
        shutil.copyfileobj(f, out)
    return path
