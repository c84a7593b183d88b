"""The catalogue of qcow2 test images, built with qemu-img / qemu-io and
shared by every test module through conftest's ``qcow2_store`` fixture.

qemu is both the builder and the oracle: every image here is made with
``qemu-img create`` / ``qemu-io`` / ``qemu-img convert`` (or a corpus recipe
from benchmarks/make_corpus.py), and the expected answers are whatever
``qemu-img map`` / ``qemu-img convert -O raw`` say about it.

A single :class:`Store` per test session (conftest's ``qcow2_store``) builds
images lazily, by name, and memoizes qemu's answers, so the test modules
share both the images and the oracle output.  Tests must never modify a
stored image.

Reproduce an image by hand::

    python3 -m tests.gen.qcow2_images NAME OUTDIR   # prints the path and qemu-img map

Image families (``NAMES``; builders in ``_SPECS`` below):

  uni-c{512,4096,65536,2097152}-{v2,v3}  the same guest writes (pattern,
        unaligned zero writes, 2 MiB compressed writes, discards) for every
        cluster size and compat level: identical guest bytes
  odd-64k[-v2], odd-64k-tail   virtual size 1000448 (not a cluster multiple),
        compressed / written partial last cluster
  frag-{backward,forward}      64k clusters written last-to-first / even-then-odd
  conv-*, convc-*              qemu-img convert [-c] of a seeded raw file with
        random, text-like (compressible), zero and hole runs
  chain-mid/top/small/probe    raw base (odd size) <- v2 qcow2 <- v3 qcow2,
        overlays larger and smaller than their backing; "probe" hides the
        backing format extension
  tree-over                    sub/deeper/over.qcow2 -> ../top.qcow2 -> base.qcow2
  prealloc-*                   preallocation=metadata (+ writes, 4k/2M clusters,
        v2, refcount_bits 1/64), falloc, full
  snapshot                     internal snapshots, COW after them
  petabyte                     1 PiB, one 64k cluster at 500 TiB
  corpus-*                     benchmarks/make_corpus.py images at --scale 0.0625

Host files get real holes instead of ext4 unwritten extents (``dig_holes``),
so their maps never change when somebody reads them.
"""

import functools
import os
import subprocess
import sys
import threading
from typing import Dict, List, NamedTuple, Tuple

from ..oracles import map_args, qemu_img, qemu_info, qemu_io, run
from ..units import GiB, KiB, MiB, PiB, TiB
from .qcow2_meta import header_patch
from .raw_layouts import mixed_raw
from .sparse import dig_holes

_HERE = os.path.dirname(os.path.abspath(__file__))
_REPO = os.path.dirname(os.path.dirname(_HERE))
MAKE_CORPUS = os.path.join(_REPO, "benchmarks", "make_corpus.py")
CORPUS_SCALE = 0.0625
CORPUS_SEED = 4


def build_named(directory, builders, suffix=".qcow2") -> Dict[str, str]:
    """{name: path} of the images ``builders[name](path)`` make in directory."""
    paths = {}
    for name, build in builders.items():
        paths[name] = os.path.join(os.fspath(directory), name + suffix)
        build(paths[name])
    return paths


# qemu-io in cache=unsafe mode: the same image, many times faster
_qemu_io = functools.partial(qemu_io, fmt="qcow2", cache="unsafe")


def create(path, size, cluster_size=64 * KiB, compat="1.1", backing=None, backing_fmt=None,
           prealloc=None, cwd=None, extra=()):
    """``qemu-img create -f qcow2 -o cluster_size=..,compat=..[,..] [-b -F] PATH SIZE``."""
    opts = ["cluster_size=%d" % cluster_size, "compat=%s" % compat]
    if prealloc:
        opts.append("preallocation=%s" % prealloc)
    opts += list(extra)
    args = ["create", "-q", "-f", "qcow2", "-o", ",".join(opts)]
    if backing is not None:
        args += ["-b", backing, "-F", backing_fmt]
    qemu_img(*(args + [path, str(size)]), cwd=cwd)


def convert_to_qcow2(src, dst, src_fmt="raw", compress=False, cluster_size=64 * KiB,
                     compat="1.1"):
    args = ["convert", "-f", src_fmt, "-O", "qcow2", "-o",
            "cluster_size=%d,compat=%s" % (cluster_size, compat)]
    if compress:
        args.append("-c")
    qemu_img(*(args + [src, dst]))


# --------------------------------------------------------------------------
# the image catalogue

class Built(NamedTuple):
    name: str
    path: str               # absolute
    size: int               # virtual size
    compressed: bool        # holds compressed clusters (somewhere in the chain)
    chain: List[Tuple[str, str]]   # expected backing_chain (absolute paths), nearest first
    cluster_size: int


UNI_SIZE = 6 * MiB + 3 * 512


def uni_commands(size=UNI_SIZE):
    """The same guest writes for every cluster size / compat: compressed
    writes and discards are 2 MiB aligned, so they are cluster-aligned
    everywhere (a partial-cluster discard is advisory: content would differ)."""
    return [
        "write -P 0x41 0 1049000",
        "write -P 0x42 1300000 70000",
        "write -c -P 0x43 %d %d" % (2 * MiB, 2 * MiB),
        "write -P 0x44 %d 5000" % (3 * MiB + 777),         # partial overwrite of compressed data
        "write -z 400000 300000",                          # unaligned zeroes over data
        "write -P 0x48 %d %d" % (4 * MiB, 2 * MiB),
        "discard %d %d" % (4 * MiB, 2 * MiB),
        "write -z %d %d" % (4 * MiB + 64 * KiB, 1 * MiB),
        "write -P 0x45 %d 4096" % (4 * MiB + 512 * KiB),
        "write -P 0x46 %d 1000" % (size - 1000),          # the tail
        "write -P 0x47 %d 1" % (5 * MiB + 100 * KiB),
        "write -z -u %d %d" % (1 * MiB, 64 * KiB),
        "write -z -u %d %d" % (5 * MiB + 200 * KiB, 128 * KiB),
    ]


UNI_CLUSTERS = (512, 4 * KiB, 64 * KiB, 2 * MiB)
UNI_COMPATS = ("0.10", "1.1")
UNI_NAMES = ["uni-c%d-%s" % (c, "v2" if v == "0.10" else "v3") for c in UNI_CLUSTERS
             for v in UNI_COMPATS]

ODD_SIZE = 1000448   # 15.26 clusters of 64k


def _uni(store, name):
    _, c, v = name.split("-")
    cs = int(c[1:])
    p = store.path(name + ".qcow2")
    create(p, UNI_SIZE, cs, "0.10" if v == "v2" else "1.1")
    _qemu_io(p, uni_commands())
    # with 2 MiB clusters the partial overwrite decompresses the only compressed cluster
    return Built(name, p, UNI_SIZE, cs < 2 * MiB, [], cs)


def _odd(store, name):
    compat = "0.10" if name.endswith("v2") else "1.1"
    p = store.path(name + ".qcow2")
    create(p, ODD_SIZE, 64 * KiB, compat)
    last = ODD_SIZE // (64 * KiB) * 64 * KiB          # start of the partial cluster
    _qemu_io(p, [
        "write -P 0x51 1000 70000",
        "write -c -P 0x52 %d %d" % (last, ODD_SIZE - last),   # compressed partial last cluster
        "write -P 0x53 %d 100" % (ODD_SIZE - 100),            # ...then partly overwritten
        "write -c -P 0x54 %d %d" % (5 * 64 * KiB, 2 * 64 * KiB),
        "write -z %d %d" % (8 * 64 * KiB, 3 * 64 * KiB),
        "write -P 0x55 %d %d" % (11 * 64 * KiB - 3, 7),
    ])
    return Built(name, p, ODD_SIZE, True, [], 64 * KiB)


def _odd_tail_only(store, name):
    """Only the partial last cluster is written (plain data)."""
    p = store.path(name + ".qcow2")
    create(p, ODD_SIZE, 64 * KiB, "1.1")
    _qemu_io(p, ["write -P 0x61 %d %d" % (ODD_SIZE - 5000, 5000)])
    return Built(name, p, ODD_SIZE, False, [], 64 * KiB)


def _frag(store, name):
    size = 8 * MiB
    n = size // (64 * KiB)
    p = store.path(name + ".qcow2")
    create(p, size)
    idx = list(range(n - 1, -1, -1)) if "backward" in name else \
        list(range(0, n, 2)) + list(range(1, n, 2))
    _qemu_io(p, ["write -P 0x%02x %d 64k" % (i % 251 + 1, i * 64 * KiB) for i in idx])
    return Built(name, p, size, False, [], 64 * KiB)


MIXED_SIZE = 5 * MiB + 1234


_SOURCE_LOCK = threading.Lock()
_CORPUS_LOCK = threading.Lock()


def _mixed_source(store):
    p = store.path("mixed.raw")
    with _SOURCE_LOCK:
        if not os.path.exists(p):
            mixed_raw(p + ".tmp", MIXED_SIZE, 1)
            os.rename(p + ".tmp", p)
    return p


def _conv(store, name):
    # conv-4k / convc-64k / convc-64k-v2 ...
    parts = name.split("-")
    compress = parts[0] == "convc"
    cs = {"512": 512, "4k": 4 * KiB, "64k": 64 * KiB, "2m": 2 * MiB}[parts[1]]
    compat = "0.10" if parts[-1] == "v2" else "1.1"
    p = store.path(name + ".qcow2")
    convert_to_qcow2(_mixed_source(store), p, compress=compress, cluster_size=cs, compat=compat)
    size = (MIXED_SIZE + 511) // 512 * 512
    return Built(name, p, size, compress, [], cs)


CONV_NAMES = ["conv-512", "conv-4k", "conv-64k", "conv-2m", "convc-4k", "convc-64k",
              "convc-64k-v2", "convc-2m"]

# backing chains: chain-base.raw <- chain-mid.qcow2 (v2) <- chain-top.qcow2 (v3)
CHAIN_BASE_SIZE = 3 * MiB + 700          # odd raw size
CHAIN_MID_SIZE = 4 * MiB                 # larger than its backing
CHAIN_TOP_SIZE = 5 * MiB + 3 * 512       # larger again, not a cluster multiple
CHAIN_SMALL_SIZE = 2 * MiB + 512         # smaller than its backing


def _chain_dir(store):
    d = store.path("chain")
    os.makedirs(d, exist_ok=True)
    return d


def _chain_base(store):
    d = _chain_dir(store)
    p = os.path.join(d, "chain-base.raw")
    if not os.path.exists(p):
        mixed_raw(p, CHAIN_BASE_SIZE, 2)
    return p


def _chain_mid(store, name):
    d = _chain_dir(store)
    base = _chain_base(store)
    p = os.path.join(d, "chain-mid.qcow2")
    create("chain-mid.qcow2", CHAIN_MID_SIZE, 32 * KiB, "0.10", "chain-base.raw", "raw", cwd=d)
    _qemu_io(p, [
        "write -P 0x71 %d %d" % (1 * MiB, 512 * KiB),
        "write -P 0x72 %d %d" % (200000, 3000),                  # COW of backing data
        "write -z %d %d" % (600 * KiB, 96 * KiB),                # v2: written zeroes
        "discard %d %d" % (1 * MiB + 256 * KiB, 64 * KiB),       # v2: backing shows through
        "write -P 0x73 %d %d" % (3 * MiB + 300, 400 * KiB),      # across the backing's end
        "write -c -P 0x74 %d %d" % (2 * MiB, 64 * KiB),
    ])
    return Built(name, p, CHAIN_MID_SIZE, True, [(base, "raw")], 32 * KiB)


def _chain_top(store, name):
    mid = store.get("chain-mid")
    d = _chain_dir(store)
    p = os.path.join(d, "chain-top.qcow2")
    create("chain-top.qcow2", CHAIN_TOP_SIZE, 4 * KiB, "1.1", "chain-mid.qcow2", "qcow2", cwd=d)
    _qemu_io(p, [
        "write -P 0x81 %d %d" % (100, 9000),
        "write -z %d %d" % (1 * MiB + 64 * KiB, 128 * KiB),      # zero clusters over backing data
        "discard %d %d" % (250 * KiB, 32 * KiB),                 # v3 discard over backing
        "write -c -P 0x82 %d %d" % (2 * MiB + 32 * KiB, 16 * KiB),
        "write -P 0x83 %d %d" % (3 * MiB + 100 * KiB + 5, 10000),
        "write -P 0x84 %d %d" % (CHAIN_TOP_SIZE - 4000, 4000),  # beyond every backing file
        "write -P 0x85 %d %d" % (4 * MiB - 2048, 4096),          # across mid's end
    ])
    return Built(name, p, CHAIN_TOP_SIZE, True, [(mid.path, "qcow2")] + mid.chain, 4 * KiB)


def _chain_small(store, name):
    mid = store.get("chain-mid")
    d = _chain_dir(store)
    p = os.path.join(d, "chain-small.qcow2")
    create("chain-small.qcow2", CHAIN_SMALL_SIZE, 64 * KiB, "1.1", "chain-mid.qcow2", "qcow2",
           cwd=d)
    _qemu_io(p, ["write -P 0x91 %d %d" % (5000, 70000),
                "write -z %d %d" % (1 * MiB, 64 * KiB)])
    return Built(name, p, CHAIN_SMALL_SIZE, True, [(mid.path, "qcow2")] + mid.chain, 64 * KiB)


def _chain_probe(store, name):
    """chain-top with its backing format extension hidden: qemu and imgcopy probe."""
    top = store.get("chain-top")
    p = os.path.join(_chain_dir(store), "chain-probe.qcow2")
    header_patch(top.path, p, drop_backing_format=True)
    return top._replace(name=name, path=p)


CHAIN_NAMES = ["chain-mid", "chain-top", "chain-small", "chain-probe"]

# a tree: tree/sub/deeper/over.qcow2 -> ../top.qcow2 -> base.qcow2 (relative names)


def _tree(store, name):
    root = store.path("tree")
    sub = os.path.join(root, "sub")
    deeper = os.path.join(sub, "deeper")
    os.makedirs(deeper, exist_ok=True)
    base = os.path.join(sub, "base.qcow2")
    top = os.path.join(sub, "top.qcow2")
    over = os.path.join(deeper, "over.qcow2")
    create("base.qcow2", 2 * MiB, 4 * KiB, "1.1", cwd=sub)
    _qemu_io(base, ["write -P 0xa1 0 300000", "write -P 0xa2 1500000 20000"])
    create("top.qcow2", 3 * MiB, 64 * KiB, "0.10", "base.qcow2", "qcow2", cwd=sub)
    _qemu_io(top, ["write -P 0xa3 100000 200000", "write -P 0xa4 %d 4096" % (2 * MiB + 5)])
    create("over.qcow2", 3 * MiB, 64 * KiB, "1.1", "../top.qcow2", "qcow2", cwd=deeper)
    _qemu_io(over, ["write -P 0xa5 250000 100", "write -z 1400000 300000"])
    dig_holes(base)
    dig_holes(top)
    # the chain as imgcopy and qemu name it: joined to the overlay's directory
    chain = [(os.path.join(deeper, "../top.qcow2"), "qcow2"),
             (os.path.join(deeper, "../base.qcow2"), "qcow2")]
    return Built(name, over, 3 * MiB, False, chain, 64 * KiB)


def _prealloc(store, name):
    # prealloc-MODE[-4k|-2m][-v2][-rcBITS][-written]
    parts = name.split("-")
    mode = parts[1]
    cs = 4 * KiB if "4k" in parts else 2 * MiB if "2m" in parts else 64 * KiB
    compat = "0.10" if "v2" in parts else "1.1"
    extra = ["refcount_bits=%s" % x[2:] for x in parts if x.startswith("rc")]
    size = 4 * MiB if cs < 2 * MiB else 9 * MiB
    p = store.path(name + ".qcow2")
    create(p, size, cs, compat, prealloc=mode, extra=extra)
    if parts[-1] == "written":
        _qemu_io(p, [
            "write -P 0xb1 %d %d" % (64 * KiB, 100 * KiB),
            "write -P 0xb2 %d %d" % (1 * MiB + 5, 3000),
            "write -z %d %d" % (2 * MiB, 128 * KiB),
            "discard %d %d" % (3 * MiB, 256 * KiB),
            "write -P 0xb3 %d %d" % (size - 512, 512),
        ])
    return Built(name, p, size, False, [], cs)


PREALLOC_NAMES = ["prealloc-metadata", "prealloc-metadata-written",
                  "prealloc-metadata-4k-v2-written", "prealloc-metadata-2m-written",
                  "prealloc-metadata-4k-rc1-written", "prealloc-metadata-rc64-written",
                  "prealloc-falloc-written", "prealloc-full-written"]


def _snapshot(store, name):
    """Internal snapshots: shared clusters (refcount 2, no COPIED flag), COW
    after the snapshot; the active L1 table is what counts."""
    p = store.path(name + ".qcow2")
    create(p, 2 * MiB, 4 * KiB)
    _qemu_io(p, ["write -P 0xc1 0 100k", "write -c -P 0xc2 1M 8k"])
    qemu_img("snapshot", "-c", "s1", p)
    _qemu_io(p, ["write -P 0xc3 50k 10k", "write -z 80k 8k", "discard 1M 4k"])
    qemu_img("snapshot", "-c", "s2", p)
    _qemu_io(p, ["write -P 0xc4 0 4k", "write -P 0xc5 %d 3000" % (2 * MiB - 3000)])
    return Built(name, p, 2 * MiB, True, [], 4 * KiB)


def _petabyte(store, name):
    p = store.path("petabyte.qcow2")
    create(p, "1P")
    _qemu_io(p, ["write -P 0x77 %d 64k" % PB_DATA_OFFSET])
    return Built(name, p, PiB, False, [], 64 * KiB)


PB_DATA_OFFSET = 500 * TiB

# benchmarks/make_corpus.py images at --scale 0.0625

CORPUS_NAMES = ["corpus-sparse-6g", "corpus-sparse-6g-compressed", "corpus-frag-backward",
                "corpus-frag-forward", "corpus-prealloc-meta"]


def corpus_dir(store):
    """Build (once) the corpus images this suite uses; return the directory."""
    with _CORPUS_LOCK:
        return _corpus_dir(store)


def _corpus_dir(store):
    d = store.path("corpus")
    if not os.path.exists(os.path.join(d, "sparse-6g-compressed.qcow2")):
        os.makedirs(d, exist_ok=True)
        run([sys.executable, MAKE_CORPUS, d, "--scale", str(CORPUS_SCALE), "--seed",
             str(CORPUS_SEED), "--only",
             "sparse-6g.raw,sparse-6g.qcow2,sparse-6g-compressed.qcow2,prealloc-meta.qcow2"])
        # make_corpus's frag recipe, with qemu-io in cache=unsafe mode (identical
        # image, 100x faster than the default cache mode)
        size = int(1 * GiB * CORPUS_SCALE) // MiB * MiB
        n = size // (64 * KiB)
        for order in ("backward", "forward"):
            p = os.path.join(d, "frag-%s.qcow2" % order)
            qemu_img("create", "-q", "-f", "qcow2", p, str(size))
            idx = list(range(n - 1, -1, -1)) if order == "backward" else \
                list(range(0, n, 2)) + list(range(1, n, 2))
            _qemu_io(p, ["write %d 64k" % (i * 64 * KiB) for i in idx])
    return d


def _corpus(store, name):
    d = corpus_dir(store)
    fname = {"corpus-prealloc-meta": "prealloc-meta"}.get(name, name[len("corpus-"):]) + ".qcow2"
    p = os.path.join(d, fname)
    size = qemu_info(p)["virtual-size"]
    return Built(name, p, size, "compressed" in name, [], 64 * KiB)


# (names, builder), in the order of NAMES
_FAMILIES = [
    (UNI_NAMES, _uni),
    (["odd-64k", "odd-64k-v2"], _odd),
    (["odd-64k-tail"], _odd_tail_only),
    (["frag-backward", "frag-forward"], _frag),
    (CONV_NAMES, _conv),
    (["chain-mid"], _chain_mid),
    (["chain-top"], _chain_top),
    (["chain-small"], _chain_small),
    (["chain-probe"], _chain_probe),
    (["tree-over"], _tree),
    (PREALLOC_NAMES, _prealloc),
    (["snapshot"], _snapshot),
    (["petabyte"], _petabyte),
    (CORPUS_NAMES, _corpus),
]
_SPECS = {name: build for names, build in _FAMILIES for name in names}

NAMES = list(_SPECS)
# everything small enough to read whole / convert in a blink
SMALL_NAMES = [n for n in NAMES if n != "petabyte" and not n.startswith("corpus-")]
CORPUS = CORPUS_NAMES


# --------------------------------------------------------------------------
# the store

class Store:
    """Lazily built images plus memoized qemu answers (never modify an image)."""

    def __init__(self, root):
        self.root = os.path.abspath(os.fspath(root))
        self._built: Dict[str, Built] = {}
        self._json: Dict[tuple, str] = {}
        self._human: Dict[tuple, subprocess.CompletedProcess] = {}
        self._raw: Dict[str, str] = {}
        self._bytes: Dict[str, bytes] = {}
        self._lock = threading.Lock()
        self._name_locks: Dict[str, threading.Lock] = {}

    def path(self, *parts):
        return os.path.join(self.root, *parts)

    def get(self, name) -> Built:
        if name not in _SPECS:
            raise KeyError(name)
        with self._lock:
            lock = self._name_locks.setdefault(name, threading.Lock())
        with lock:
            if name not in self._built:
                b = _SPECS[name](self, name)
                if not name.startswith(("corpus-", "prealloc-falloc", "prealloc-full")):
                    # (falloc/full: qemu's heuristic never asks the host
                    # file about them, and their unwritten extents are the point)
                    dig_holes(b.path)
                self._built[name] = b
        return self._built[name]

    def build_all(self, names=None, workers=4):
        """Build many images at once (qemu spends most of its time waiting)."""
        from concurrent.futures import ThreadPoolExecutor

        names = list(NAMES if names is None else names)
        # the slow corpus first, so that it overlaps with everything else
        names.sort(key=lambda n: not n.startswith("corpus-"))
        with ThreadPoolExecutor(workers) as ex:
            for f in [ex.submit(self.get, n) for n in names]:
                f.result()

    # -- oracle ---------------------------------------------------------
    def qemu_json(self, path, start=None, length=None, cwd=None) -> str:
        key = (path, start, length, cwd)
        if key not in self._json:
            args = map_args(path, None, start, length, "json", force_share=False)
            self._json[key] = qemu_img(*args, cwd=cwd).stdout
        return self._json[key]

    def qemu_human(self, path, start=None, length=None, cwd=None) -> subprocess.CompletedProcess:
        """CompletedProcess of ``qemu-img map`` (human); may fail (compressed clusters)."""
        key = (path, start, length, cwd)
        if key not in self._human:
            args = map_args(path, None, start, length, None, force_share=False)
            self._human[key] = qemu_img(*args, cwd=cwd, check=False)
        return self._human[key]

    def prefetch(self, json_keys=(), human_keys=(), workers=4):
        """Run many ``qemu-img map`` calls in parallel (each is ~90% waiting):
        keys are (path, start, length[, cwd]) tuples."""
        from concurrent.futures import ThreadPoolExecutor

        jobs = [(self.qemu_json, k) for k in json_keys] + [(self.qemu_human, k) for k in human_keys]
        with ThreadPoolExecutor(workers) as ex:
            for f in [ex.submit(fn, *k) for fn, k in jobs]:
                f.result()

    def raw(self, name) -> str:
        """Path of ``qemu-img convert -O raw`` of the image (its guest bytes)."""
        if name not in self._raw:
            b = self.get(name)
            out = self.path("oracle-raw", name + ".raw")
            os.makedirs(os.path.dirname(out), exist_ok=True)
            qemu_img("convert", "-O", "raw", b.path, out)
            self._raw[name] = out
        return self._raw[name]

    def raw_bytes(self, name) -> bytes:
        """The guest bytes, in memory (small images only)."""
        if name not in self._bytes:
            with open(self.raw(name), "rb") as f:
                data = f.read()
            assert len(data) == self.get(name).size, (name, len(data))
            self._bytes[name] = data
        return self._bytes[name]

    def raw_read(self, name, off, n) -> bytes:
        if name in self._bytes:
            return self._bytes[name][off:off + n]
        with open(self.raw(name), "rb") as f:
            f.seek(off)
            return f.read(n)


if __name__ == "__main__":  # pragma: no cover - manual reproduction helper
    name, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    st = Store(out)
    b = st.get(name)
    print(b)
    print(qemu_img("map", "--output=json", b.path).stdout)
