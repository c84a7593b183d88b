"""qcow2 overlays written by convert(backing_file=...) must be laid out exactly
as ``qemu-img convert -O qcow2 -B BASE -F FMT -S N -o cluster_size=C,compat=X``
lays them out: same ``qemu-img map --output=json`` (host offsets dropped,
neighbours merged again), same content, a clean ``qemu-img check``.

The source is always the usual pair: ``top.qcow2`` (4 KiB clusters) over
``base.raw`` or ``base.qcow2``; the new overlay gets the same base.  What
qemu-img (7.2) does, in short (the research note has the details):

- Only the source's top layer is asked: what it does not hold (depth > 0) is
  left unallocated.
- Past the end of the new overlay's backing file (L), what the top layer
  reads as zeros (zero clusters, unallocated clusters) is left unallocated
  too, whatever -S; qemu also cuts its requests at L.  Data there is
  written, its zero runs found as usual.                               (a)
- Zero runs in data are found as without a backing file: blocks aligned to
  the largest power of two not above -S, holes at least -S long or at the
  edge of a request; -S 0 writes all the top layer holds before L as
  data.                                                                (b)
- A hole is a zero write: whole clusters become v3 zero clusters (v2:
  zeros written as data); a cluster covered only in part becomes a zero
  cluster only when, at that moment, the rest of the cluster reads as
  zeros by block status (the backing file's holes, zero or unallocated
  clusters, the range past its end, or zero clusters written before) and
  it is not allocated yet; otherwise zeros are written as data.        (c)
"""
import itertools
import os

import pytest

import imgcopy

from .oracles import (assert_same_content, layout, needs_qemu, qemu_check, qemu_img, qemu_io,
                      qemu_map, run)
from .units import KiB, MiB

SIZE = 4 * MiB                       # the source (top.qcow2)
BASE_LEN = {"shorter": 2 * MiB + 36 * KiB,  # ends inside a 64 KiB cluster of the overlay
            "equal": SIZE,
            "longer": 5 * MiB}
SPARSE = (0, 4 * KiB, 64 * KiB, MiB)
CLUSTERS = (512, 4 * KiB, 64 * KiB, 2 * MiB)
COMPATS = ("1.1", "0.10")

# Source patterns: (commands on the base, commands on top.qcow2, extra
# commands for a qcow2 base).  Base writes stay below the shortest base's
# end; top writes go in ascending guest order, so that the top's data
# clusters are contiguous in its file and qemu-img sees them as one
# extent.  Offsets in the comments are in KiB; L is the shorter base's end
# (2084).
PATTERNS = {
    # (a) around and past the end of a shorter backing file
    "past_end": (
        ["write -P 1 0 128k", "write -P 2 1984k 100k"],
        ["write -P 3 64k 64k",                          # data over base data
         "write -z 256k 64k",                           # a whole zero cluster
         "write -P 3 1984k 192k", "write -P 0 2040k 54k",  # data across L, zeros touching L
         "write -P 3 2200k 32k", "write -P 0 2212k 12k",   # a 12k zero run in data
         "write -z 2304k 8k",                           # zero clusters past L
         "write -z 2368k 64k",
         "write -P 4 2496k 8k", "write -P 0 2500k 4k",  # data ending in zeros
         "write -P 0 2560k 128k",                       # data that is all zeros
         "write -P 0 3M 1020k", "write -P 5 4092k 4k"],  # long zeros, data at the end
        ["write -z 1024k 64k"],
    ),
    # (b) zero runs of every length and alignment inside data
    "zero_runs": (
        ["write -P 1 0 1M"],
        ["write -P 7 0 3M",
         "write -P 0 60k 8k", "write -P 0 136k 16k", "write -P 0 256k 32k",
         "write -P 0 384k 64k", "write -P 0 480k 64k", "write -P 0 600k 96k",
         "write -P 0 768k 200k", "write -P 0 1M 1088k",    # 1M..2112k, across 2M
         "write -P 0 3068k 4k"],                           # zeros at the data's end
        ["write -z 1M 64k"],
    ),
    # (c) overlay clusters that mix top-layer zeros with backing ranges
    "mixed_clusters": (
        ["write -P 1 32k 4k",          # [0,64k): base data beside the top's zeros
         "write -P 0 192k 64k",        # [192k,256k): base data that reads as zeros
         "write -P 1 288k 32k",        # [256k,320k): base data under the second piece
         "write -P 1 320k 32k",        # [320k,384k): base data under the first piece
         "write -P 0 640k 4k",         # [640k,704k): a little base data of zeros
         "write -P 0 2080k 4k"],       # [2048k,2112k) and the 2M cluster from 2048k
        ["write -z 4k 4k",                           # [0,64k)
         "write -P 0 68k 4k",                        # [64k,128k): zero data, base hole
         "write -z 132k 4k", "write -P 5 160k 4k",   # [128k,192k): zeros and data
         "write -z 196k 4k",                         # [192k,256k)
         "write -P 0 256k 32k", "write -z 288k 32k",  # [256k,320k): zero data first
         "write -z 320k 32k", "write -P 0 352k 32k",  # [320k,384k): zero cluster first
         "write -z 392k 4k", "write -z 440k 4k",     # [384k,448k): two pieces, base hole
         "write -P 6 448k 4k", "write -P 0 452k 8k",  # [448k,512k): data ending in zeros
         "write -z 580k 4k",                         # [576k,640k)
         "write -z 680k 4k",                         # [640k,704k)
         "write -z 2052k 4k"],                       # [2048k,2112k)
        ["write -P 1 576k 64k", "write -z 576k 64k"],  # a zero cluster in a qcow2 base
    ),
}



pytestmark = needs_qemu

_sources: dict = {}  # (pattern, base) -> a source built once


def sources(tmp_path_factory, pattern, base_fmt, base_len):
    """Builds base + top.qcow2 once per (pattern, base); returns their directory."""
    key = (pattern, base_fmt, base_len)
    if key not in _sources:
        d = str(tmp_path_factory.mktemp(f"{pattern}-{base_fmt}-{base_len}"))
        base_cmds, top_cmds, qcow2_extra = PATTERNS[pattern]
        base = "base." + base_fmt
        if base_fmt == "raw":
            run(["truncate", "-s", BASE_LEN[base_len], base], cwd=d)
        else:
            qemu_img("create", "-q", "-f", "qcow2", "-o", "cluster_size=4096", base,
                     BASE_LEN[base_len], cwd=d)
            base_cmds = base_cmds + qcow2_extra
        if base_cmds:
            qemu_io(base, base_cmds, fmt=base_fmt, cwd=d)
        qemu_img("create", "-q", "-f", "qcow2", "-o", "cluster_size=4096", "-b", base,
                 "-F", base_fmt, "top.qcow2", SIZE, cwd=d)
        if top_cmds:
            qemu_io("top.qcow2", top_cmds, fmt="qcow2", cwd=d)
        _sources[key] = d
    return _sources[key]


def check_like_qemu(tmp_path_factory, tmp_path, pattern, base_fmt, base_len, sparse,
                    cluster, compat):
    src = sources(tmp_path_factory, pattern, base_fmt, base_len)
    d = str(tmp_path)
    base = "base." + base_fmt
    for name in (base, "top.qcow2"):  # the case's own directory, the same files
        os.link(os.path.join(src, name), os.path.join(d, name))
    qemu_img("convert", "-q", "-O", "qcow2", "-B", base, "-F", base_fmt,
             "-S", sparse, "-o", f"cluster_size={cluster},compat={compat}",
             "top.qcow2", "qemu.qcow2", cwd=d)
    imgcopy.convert(os.path.join(d, "top.qcow2"), os.path.join(d, "imgcopy.qcow2"),
                    dst_format="qcow2", backing_file=base, backing_format=base_fmt,
                    sparse_threshold=sparse, cluster_size=cluster, compat=compat)
    qemu_check("imgcopy.qcow2", cwd=d)
    assert_same_content("qemu.qcow2", "imgcopy.qcow2", cwd=d)
    assert layout(qemu_map("imgcopy.qcow2", None, cwd=d).extents) == \
        layout(qemu_map("qemu.qcow2", None, cwd=d).extents)


def _ids(cases):
    return ["-".join(f"S{v}" if i == 2 else f"c{v}" if i == 3 else str(v)
                     for i, v in enumerate(c)) for c in cases]


# (base_fmt, base_len, sparse_threshold, cluster_size, compat)
PAST_END = list(itertools.product(("raw", "qcow2"), ("shorter", "equal"), SPARSE, CLUSTERS,
                                  COMPATS))
ZERO_RUNS = list(itertools.product((("raw", "equal"), ("qcow2", "longer")), SPARSE[1:],
                                   CLUSTERS, COMPATS))
ZERO_RUNS = [(fmt, length, s, c, v) for (fmt, length), s, c, v in ZERO_RUNS]
MIXED = [c for c in itertools.product(("raw", "qcow2"), ("equal", "longer"), SPARSE,
                                      CLUSTERS[1:], COMPATS)
         if c[0] == "raw" or c[1] == "equal"]


@pytest.mark.parametrize("base_fmt,base_len,sparse,cluster,compat", PAST_END,
                         ids=_ids(PAST_END))
def test_past_backing_end(tmp_path_factory, tmp_path, base_fmt, base_len, sparse, cluster,
                          compat):
    """(a): past the end of a shorter backing file what the top reads as zeros
    stays unallocated (at -S 0 too), data there is written with its zero runs
    found as usual, and requests are cut at the backing file's end.  "equal"
    bases are the control.  Where sparse > cluster the pattern's zero runs in
    data meet (b) as well."""
    check_like_qemu(tmp_path_factory, tmp_path, "past_end", base_fmt, base_len, sparse,
                    cluster, compat)


@pytest.mark.parametrize("base_fmt,base_len,sparse,cluster,compat", ZERO_RUNS,
                         ids=_ids(ZERO_RUNS))
def test_zero_runs_in_data(tmp_path_factory, tmp_path, base_fmt, base_len, sparse, cluster,
                           compat):
    """(b): zero runs inside the top's data are judged on blocks of the sparse
    threshold (not of the cluster size) and become holes only when at least
    the threshold long or at a request's edge; with cluster_size >= sparse the
    holes' partial clusters follow (c)."""
    check_like_qemu(tmp_path_factory, tmp_path, "zero_runs", base_fmt, base_len, sparse,
                    cluster, compat)


@pytest.mark.parametrize("base_fmt,base_len,sparse,cluster,compat", MIXED, ids=_ids(MIXED))
def test_mixed_clusters(tmp_path_factory, tmp_path, base_fmt, base_len, sparse, cluster,
                        compat):
    """(c): an overlay cluster holding both top-layer zeros (zero clusters,
    data of zeros) and ranges left to the backing file: a zero cluster only
    when the first zero write into it finds the rest reading as zeros by block
    status (holes, zero or unallocated clusters of the base; base data that
    merely contains zeros does not count), else zeros written as data.  -S 0,
    compat 0.10 and 4 KiB clusters (no partial clusters) are the control."""
    check_like_qemu(tmp_path_factory, tmp_path, "mixed_clusters", base_fmt, base_len, sparse,
                    cluster, compat)
