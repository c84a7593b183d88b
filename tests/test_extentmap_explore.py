"""Exploring extent maps: summary(), runs(), to_numpy(), to_pandas(), plot(),
_repr_html_() and repr on images whose layout is known."""
import io
import os
import random
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

import imgcopy
from .gen.raw_kinds import make_image
from .gen.sparse import make_sparse
from .oracles import require_qemu
from .units import KiB, MiB
from imgcopy._html import STACKED, strip_columns, svg_strip
from imgcopy.extents import KINDS, Extent, extent_kind, human_size


SVG = "{http://www.w3.org/2000/svg}"

# 8 MiB: data [0, 1M), written zeros [2M, 2M+256K) (data, for a raw file),
# data [4M, 4M+64K); holes elsewhere
LAYOUT = [(0, b"\x11" * MiB), (2 * MiB, bytes(256 * KiB)), (4 * MiB, b"\x22" * (64 * KiB))]
LAYOUT_DATA = [(0, MiB), (2 * MiB, 2 * MiB + 256 * KiB), (4 * MiB, 4 * MiB + 64 * KiB)]


@pytest.fixture(scope="module")
def known(tmp_path_factory):
    d = tmp_path_factory.mktemp("explore")
    p = str(d / "known.raw")
    make_sparse(p, 8 * MiB, LAYOUT)
    return p


# --------------------------------------------------------------------------
# kinds, runs, summary

def test_extent_kinds():
    assert extent_kind(0, False, True) == "data"
    assert extent_kind(2, False, True) == "backing"
    assert extent_kind(0, True, True) == "zero"
    assert extent_kind(0, True, False) == "hole"
    assert extent_kind(0, True, False, True) == "zeroed"
    assert extent_kind(1, False, False) == "hole"
    assert Extent(0, 512, 0, True, False, True, 0).kind == "data"
    assert Extent(0, 512, 0, True, True, False, None, zeroed=True).kind == "zeroed"
    # a dirty map's changed ranges are dirty, whatever they hold
    assert extent_kind(0, False, True, dirty=True) == "dirty"
    assert extent_kind(0, True, False, True, True) == "dirty"
    assert Extent(0, 512, 0, True, False, True, 0, dirty=True).kind == "dirty"
    assert set(KINDS) == {"dirty", "data", "backing", "zero", "zeroed", "hole"}


def test_runs_and_summary_of_a_known_layout(known):
    m = imgcopy.map(known)
    runs = m.runs()
    assert [(s, e) for k, s, e in runs if k == "data"] == LAYOUT_DATA
    assert [k for k, _, _ in runs] == ["data", "hole"] * 3
    assert runs[0][1] == 0 and runs[-1][2] == 8 * MiB
    s = m.summary()
    data = MiB + 256 * KiB + 64 * KiB
    assert s["virtual_size"] == 8 * MiB and s["extents"] == 6
    assert s["data_bytes"] == data and s["hole_bytes"] == 8 * MiB - data
    assert s["data_extents"] == 3 and s["hole_extents"] == 3 and s["zero_extents"] == 3
    assert s["data_runs"] == 3 and s["hole_runs"] == 3
    assert s["largest_data_run"] == MiB and s["median_data_run"] == 256 * KiB
    holes = sorted([MiB, 2 * MiB - 256 * KiB, 4 * MiB - 64 * KiB])
    assert s["largest_hole_run"] == holes[-1] and s["median_hole_run"] == holes[1]
    assert s["backing_bytes"] == s["zero_data_bytes"] == s["compressed_bytes"] == 0
    assert s["compressed_extents"] == 0
    # the keys of the first version stay
    for k in ("filename", "format", "virtual_size", "start", "end", "extents", "data_extents",
              "data_bytes", "zero_bytes", "allocated_bytes"):
        assert k in s


def test_summary_of_a_window(known):
    m = imgcopy.map(known, start=512 * KiB, length=2 * MiB)
    s = m.summary()
    assert (s["start"], s["end"]) == (512 * KiB, 2 * MiB + 512 * KiB)
    assert s["data_bytes"] == 512 * KiB + 256 * KiB
    assert s["data_bytes"] + s["hole_bytes"] == 2 * MiB
    assert m.runs() == [("data", 512 * KiB, MiB), ("hole", MiB, 2 * MiB),
                        ("data", 2 * MiB, 2 * MiB + 256 * KiB),
                        ("hole", 2 * MiB + 256 * KiB, 2 * MiB + 512 * KiB)]


def test_summary_kinds_of_qcow2_images(qcow2_store):
    require_qemu()
    top = imgcopy.map(qcow2_store.get("chain-top").path)
    s = top.summary()
    assert s["backing_bytes"] > 0 and s["compressed_bytes"] > 0 and s["zero_data_bytes"] > 0
    assert s["backing_bytes"] == sum(e.length for e in top if e.data and e.depth > 0)
    assert s["compressed_extents"] == sum(1 for e in top if e.compressed)
    assert {k for k, _, _ in top.runs()} == set(KINDS) - {"dirty"}   # a plain map
    pre = imgcopy.map(qcow2_store.get("prealloc-metadata").path)
    assert [k for k, _, _ in pre.runs()] == ["zero"]       # allocated, reads as zeros
    assert pre.summary()["zero_data_bytes"] == pre.size


def test_empty_image(tmp_path):
    p = str(tmp_path / "empty.raw")
    make_sparse(p, 0)
    m = imgcopy.map(p)
    s = m.summary()
    assert s["extents"] == 0 and s["data_runs"] == s["hole_runs"] == 0
    assert s["largest_data_run"] == s["median_data_run"] == s["median_hole_run"] == 0
    assert m.runs() == []
    assert "(empty range" in m._repr_html_() and "<svg" not in m._repr_html_()
    assert "0 extents" in repr(m)


# --------------------------------------------------------------------------
# numpy / pandas

COLUMNS = ["start", "end", "length", "depth", "present", "zero", "data", "host_offset"]


def test_to_numpy(known):
    np = pytest.importorskip("numpy")
    m = imgcopy.map(known)
    a = m.to_numpy()
    assert isinstance(a, np.ndarray) and len(a) == len(m)
    assert list(a.dtype.names) == COLUMNS + ["compressed", "zeroed", "dirty"]
    for row, e in zip(a.tolist(), m):
        assert row == (e.start, e.end, e.length, e.depth, e.present, e.zero, e.data,
                       -1 if e.host_offset is None else e.host_offset, e.compressed, e.zeroed,
                       bool(e.dirty))
    assert int(a["length"].sum()) == 8 * MiB
    assert int(a["length"][a["data"]].sum()) == m.data_bytes


def test_to_pandas_known_layout(known):
    pd = pytest.importorskip("pandas")
    m = imgcopy.map(known)
    df = m.to_pandas()
    assert isinstance(df, pd.DataFrame)
    assert list(df.columns)[:8] == COLUMNS
    assert list(df.columns) == COLUMNS + ["compressed", "zeroed", "dirty", "kind"]
    assert len(df) == 6
    data = df[df["data"]]
    assert list(zip(data["start"], data["end"])) == LAYOUT_DATA
    assert list(df["kind"]) == ["data", "hole"] * 3
    assert (df["end"] - df["start"] == df["length"]).all()
    assert df["host_offset"].tolist() == [e.host_offset for e in m]
    assert df.attrs == {"filename": known, "format": "raw", "virtual_size": 8 * MiB}
    assert df.groupby("kind")["length"].sum().to_dict() == {
        "data": m.data_bytes, "hole": m.hole_bytes}


def test_to_pandas_qcow2_offsets_and_compression(qcow2_store):
    require_qemu()
    pd = pytest.importorskip("pandas")
    m = imgcopy.map(qcow2_store.get("chain-top").path)
    df = m.to_pandas()
    assert str(df["host_offset"].dtype) == "Int64"
    assert df["host_offset"].isna().tolist() == [e.host_offset is None for e in m]
    assert df["compressed"].tolist() == [e.compressed for e in m]
    assert df["depth"].tolist() == [e.depth for e in m]
    assert df["kind"].tolist() == [e.kind for e in m]
    assert set(df["kind"]) == set(KINDS) - {"dirty"}
    assert not df["dirty"].any()
    assert pd.isna(df.loc[df["compressed"], "host_offset"]).all()


def test_to_pandas_empty(tmp_path):
    pytest.importorskip("pandas")
    p = str(tmp_path / "e.raw")
    make_sparse(p, 0)
    df = imgcopy.map(p).to_pandas()
    assert len(df) == 0 and list(df.columns) == COLUMNS + ["compressed", "zeroed", "dirty", "kind"]


# --------------------------------------------------------------------------
# the HTML view: a summary table and an SVG strip

def svg_of(html: str) -> ET.Element:
    start = html.index("<svg")
    end = html.index("</svg>") + len("</svg>")
    return ET.fromstring(html[start:end])


def rects(svg: ET.Element, kind: str):
    return [(float(r.attrib["x"]), float(r.attrib["width"]), int(r.attrib["y"]),
             int(r.attrib["height"])) for r in svg.iter(SVG + "rect") if r.get("class") == kind]


def test_repr_html_known_layout(known):
    m = imgcopy.map(known)
    html = m._repr_html_()
    svg = svg_of(html)
    assert svg.get("viewBox") == "0 0 600 50"          # the bar (32) and its axis (18)
    data = rects(svg, "data")
    # 8 MiB in 600 columns: [0, 1M) is columns 0-74, [4M, 4M+64K) fills columns 300-303
    assert data[0] == (0, 75, 0, 32)
    assert (300, 4, 0, 32) in data
    # [2M, 2M+256K): columns 150-167 full, 168 three quarters
    assert (150, 18, 0, 32) in data and (168, 1, 8, 24) in data
    full = [r for r in data if r[3] == 32]
    assert sum(w for _, w, _, _ in full) == 75 + 18 + 4
    assert rects(svg, "hole") == [(0, 600, 0, 32)]          # the background
    assert not rects(svg, "zero") and not rects(svg, "backing")
    for text in ("8 MiB virtual", "(8,388,608 B)", "1.31 MiB", "16.4%", "83.6%", "data runs",
                 "3: largest 1 MiB, median 256 KiB", "holes", "guest offset"):
        assert text in html, text
    assert "swatch backing" not in html and "compressed" not in html


def test_repr_html_escapes_the_name(tmp_path):
    p = str(tmp_path / "a<b>&c.raw")
    make_sparse(p, 64 * KiB, [(0, b"x" * 4096)])
    html = imgcopy.map(p)._repr_html_()
    assert "a&lt;b&gt;&amp;c.raw" in html and "a<b>" not in html
    svg_of(html)


def test_repr_html_qcow2_kinds(qcow2_store):
    require_qemu()
    m = imgcopy.map(qcow2_store.get("chain-top").path)
    html = m._repr_html_()
    svg = svg_of(html)
    for kind in ("data", "backing", "zero"):
        assert rects(svg, kind), kind
    for text in ("backing data", "allocated zeros", "compressed"):
        assert text in html


def test_svg_stays_small_on_many_extents(tmp_path):
    p = str(tmp_path / "many.raw")
    make_sparse(p, 4096 * 4800, [(i * 8192, b"\x01" * 4096) for i in range(2400)])
    m = imgcopy.map(p)
    assert len(m) == 4800
    svg = svg_strip(m.runs(), m.start, m.end)
    n = svg.count("<rect")
    assert n <= 2 + 4 * 600
    # every column (8 blocks) is half data: one merged rectangle
    assert rects(ET.fromstring(svg), "data") == [(0, 600, 16, 16)]
    assert len(svg) < 4000


def test_strip_columns_add_up():
    rng = random.Random(7)
    for _ in range(200):
        start = rng.randint(0, 10000)
        pos, runs = start, []
        for _ in range(rng.randint(1, 30)):
            n = rng.randint(1, rng.choice([10, 1000, 100000]))
            runs.append((rng.choice(KINDS), pos, pos + n))
            pos += n
        width = rng.choice([1, 7, 600, 5000])
        bounds, cols = strip_columns(runs, start, pos, width)
        assert len(cols) == min(width, pos - start) == len(bounds) - 1
        assert bounds[0] == start and bounds[-1] == pos
        for c, col in enumerate(cols):
            assert sum(col.values()) == bounds[c + 1] - bounds[c]
        for kind in KINDS:
            assert sum(col.get(kind, 0) for col in cols) == \
                sum(e - s for k, s, e in runs if k == kind)


def test_stacking_order():
    assert STACKED == ("dirty", "data", "backing", "zero", "zeroed")


# --------------------------------------------------------------------------
# repr

def test_repr(known, qcow2_store):
    r = repr(imgcopy.map(known))
    assert r == ("<ExtentMap %r raw 8 MiB: 6 extents; data 1.31 MiB (16.4%%), "
                 "holes 6.69 MiB (83.6%%)>" % known)
    w = repr(imgcopy.map(known, start=MiB, length=MiB))
    assert "[1048576, 2097152) of 8 MiB" in w and "1 extents" in w
    require_qemu()
    c = repr(imgcopy.map(qcow2_store.get("convc-64k").path))
    assert "compressed" in c


# --------------------------------------------------------------------------
# plot (matplotlib, Agg)

def test_plot_new_figure(known, plt):
    m = imgcopy.map(known)
    axes = m.plot()
    assert len(axes) == 2
    strip, hist = axes
    assert strip.get_xlim() == (0.0, 8.0) and strip.get_xlabel() == "guest offset (MiB)"
    bars = [c for c in strip.collections]
    assert len(bars) == 1                       # data only: holes are the background
    paths = bars[0].get_paths()
    spans = sorted((round(p.vertices[:, 0].min(), 6), round(p.vertices[:, 0].max(), 6))
                   for p in paths)
    assert spans == [(s / MiB, e / MiB) for s, e in LAYOUT_DATA]
    labels = [t.get_text() for t in strip.get_legend().get_texts()]
    assert labels == ["data 1.31 MiB (16.4%)", "holes 6.69 MiB (83.6%)"]
    assert "known.raw" in strip.get_title()
    assert hist.get_xlabel() == "extent length" and hist.get_xscale() == "log"
    heights = sum(p.get_height() for p in hist.patches)
    assert heights == len(m)                    # every extent counted once
    buf = io.BytesIO()
    strip.figure.savefig(buf, format="png")
    assert buf.getvalue()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_on_given_axes(known, plt):
    m = imgcopy.map(known)
    fig, (a, b) = plt.subplots(2)
    assert m.plot((a, b)) == (a, b)
    fig, ax = plt.subplots()
    assert m.plot(ax, title="mine") == (ax,)
    assert ax.get_title() == "mine"
    with pytest.raises(ValueError):
        m.plot([ax, ax, ax])


def test_plot_kinds_and_edge_cases(qcow2_store, tmp_path, plt):
    require_qemu()
    axes = imgcopy.map(qcow2_store.get("chain-top").path).plot()
    labels = [t.get_text().split(" ")[0] for t in axes[0].get_legend().get_texts()]
    assert labels == ["data", "backing", "allocated", "zeroed", "holes", "compressed"]
    p = str(tmp_path / "e.raw")
    make_sparse(p, 0)
    imgcopy.map(p).plot()
    make_sparse(p, 1)
    imgcopy.map(p).plot()
    q = str(tmp_path / "d.raw")
    make_image(q, "all_data", 3)
    imgcopy.map(q).plot(bins=5)


# --------------------------------------------------------------------------
# the core package imports none of the optional libraries

def test_no_optional_imports(known, imgcopy_env):
    code = (
        "import sys, imgcopy\n"
        "m = imgcopy.map(%r)\n"
        "m.summary(); repr(m); m._repr_html_(); m.runs(); imgcopy.info(%r).to_json()\n"
        "import imgcopy.progress\n"
        "bad = [n for n in ('numpy', 'pandas', 'matplotlib', 'tqdm') if n in sys.modules]\n"
        "assert not bad, bad\n" % (known, known))
    p = subprocess.run([sys.executable, "-c", code], env=imgcopy_env, cwd=os.path.dirname(known),
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.returncode == 0, p.stderr


def test_human_size():
    assert human_size(8 * MiB) == "8 MiB" and human_size(1376256) == "1.31 MiB"
