"""The notebook views (ExtentMap, CopyPlan, ImageInfo) and plot() on images
whose layout is known and holds every kind of range: the kinds drawn and
told apart, legend = table rows = repr = plot legend, an axis with round
ticks, tiny runs visible, accessible names, colours with enough contrast,
and qemu's meanings kept where a field is qemu's."""
import colorsys
import re
import xml.etree.ElementTree as ET

import pytest

import imgcopy
from imgcopy._html import (COLORS, MIN_HEIGHT, MIN_WIDTH, STACKED, axis_ticks, offset_label,
                           svg_strip)
from imgcopy.extents import KINDS, LABELS, human_size, share_text
from .gen import kinds_chain
from .gen.sparse import make_sparse
from .oracles import qemu_img, qemu_io, qemu_map, require_qemu
from .units import GiB, KiB, MiB

SVG = "{http://www.w3.org/2000/svg}"
# the kinds of a plain extent map: all but a dirty map's own
MAP_KINDS = tuple(k for k in KINDS if k != "dirty")
MAP_STACKED = tuple(k for k in STACKED if k != "dirty")


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    require_qemu()
    return kinds_chain.build(str(tmp_path_factory.mktemp("kinds")))


@pytest.fixture(scope="module")
def dirty(tmp_path_factory):
    """An 8 MiB qcow2 image with data in [0, 2 MiB), then bitmap b0 (64 KiB
    granules) recording a write over data, one over a hole and write
    zeroes: 256 KiB dirty in 3 ranges."""
    require_qemu()
    path = str(tmp_path_factory.mktemp("dirty") / "d.qcow2")
    qemu_img("create", "-q", "-f", "qcow2", path, str(8 * MiB))
    qemu_io(path, ["write -P 1 0 2M"], fmt="qcow2")
    qemu_img("bitmap", "--add", path, "b0")
    qemu_io(path, ["write -P 2 1M 128k", "write -P 3 4M 64k", "write -z 6M 64k"], fmt="qcow2")
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    require_qemu()
    return kinds_chain.build_tiny(str(tmp_path_factory.mktemp("tiny")))


def svg_of(html: str) -> ET.Element:
    return ET.fromstring(html[html.index("<svg"):html.index("</svg>") + len("</svg>")])


def rects(svg: ET.Element, cls: str):
    return [r for r in svg.iter(SVG + "rect") if r.get("class") == cls]


def table_rows(html: str):
    """(header text, cells text) of the view's table, tags stripped."""
    out = []
    for row in re.findall(r"<tr>(.*?)</tr>", html):
        cells = [re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", row)]
        out.append((cells[0], cells[1:]))
    return out


def kind_ranges(emap):
    out = {}
    for kind, s, e in emap.runs():
        out.setdefault(kind, []).append((s, e))
    return out


# --------------------------------------------------------------------------
# kinds

def test_every_kind_where_it_was_made(chain):
    m = imgcopy.map(chain)
    assert kind_ranges(m) == kinds_chain.EXPECTED
    assert [(e.start, e.end) for e in m if e.compressed] == kinds_chain.COMPRESSED
    assert {r["kind"] for r in m.breakdown()} == set(MAP_KINDS)
    # the fast scan behind the views agrees with Extent.kind
    merged = []
    for e in m:
        if merged and merged[-1][0] == e.kind and merged[-1][2] == e.start:
            merged[-1] = (e.kind, merged[-1][1], e.end)
        else:
            merged.append((e.kind, e.start, e.end))
    assert m.runs() == merged
    assert m.compressed_ranges() == kinds_chain.COMPRESSED


def test_kinds_agree_with_qemu_flags(chain):
    """zeroed = qemu's present, zero, no data in a qcow2 layer; the rest
    follows qemu's flags and depth."""
    m = imgcopy.map(chain)
    for q in qemu_map(chain, "qcow2").extents:
        e = next(x for x in m if x.start <= q["start"] < x.end)
        if q["data"]:
            want = "zero" if q["zero"] else "data" if q["depth"] == 0 else "backing"
        else:
            want = "zeroed" if q["present"] else "hole"
        assert e.kind == want, (q, e)


def test_raw_holes_are_holes_not_zeroed(tmp_path):
    """qemu calls a raw file's holes present: they are still holes, at any depth."""
    require_qemu()
    base = str(tmp_path / "base.raw")
    make_sparse(base, 4 * MiB, [(0, b"\x01" * MiB)])
    top = str(tmp_path / "top.qcow2")
    qemu_img("create", "-q", "-f", "qcow2", "-b", base, "-F", "raw", top)
    assert {e.kind for e in imgcopy.map(base)} == {"data", "hole"}
    assert kind_ranges(imgcopy.map(top)) == {"backing": [(0, MiB)], "hole": [(MiB, 4 * MiB)]}
    assert any(q["present"] and not q["data"] for q in qemu_map(top, "qcow2").extents)


@pytest.mark.parametrize("fmt, options", [("qcow2", "cluster_size=65536"),
                                          ("vhdx", "subformat=dynamic,block_size=1M"),
                                          ("vpc", "subformat=dynamic")])
def test_zeros_with_nothing_below_are_holes(tmp_path, fmt, options):
    """A zero cluster (or a vhdx ZERO block, qemu's choice for every new
    block) in an image without a backing file hides nothing: a hole."""
    require_qemu()
    p = str(tmp_path / f"alone.{fmt}")
    qemu_img("create", "-q", "-f", fmt, "-o", options, p, "8M")
    qemu_io(p, ["write -P 0x77 0 1M", "write -z 4M 1M"], fmt=fmt)
    m = imgcopy.map(p)
    assert {e.kind for e in m} == {"data", "hole"}
    assert not any(e.zeroed for e in m)
    assert [r["kind"] for r in m.breakdown()] == ["data", "hole"]


def test_zeroed_in_a_middle_layer(tmp_path):
    """A zero cluster of the middle of three layers hides the base's data;
    the top shows it at depth 1."""
    require_qemu()
    base, mid, top = (str(tmp_path / n) for n in ("b.qcow2", "m.qcow2", "t.qcow2"))
    qemu_img("create", "-q", "-f", "qcow2", base, "4M")
    qemu_io(base, ["write -P 0x01 0 4M"], fmt="qcow2")
    qemu_img("create", "-q", "-f", "qcow2", "-b", base, "-F", "qcow2", mid)
    qemu_io(mid, ["write -z 1M 1M"], fmt="qcow2")
    qemu_img("create", "-q", "-f", "qcow2", "-b", mid, "-F", "qcow2", top)
    m = imgcopy.map(top)
    assert m.runs() == [("backing", 0, MiB), ("zeroed", MiB, 2 * MiB),
                        ("backing", 2 * MiB, 4 * MiB)]
    assert [e.depth for e in m if e.zeroed] == [1]


def test_metadata_preallocation_is_not_data(tmp_path):
    """51 MiB written in a 256 MiB metadata-preallocated image: 51 MiB of
    data, the rest allocated zeros; qemu's data flag covers it all."""
    require_qemu()
    p = str(tmp_path / "prealloc.qcow2")
    qemu_img("create", "-q", "-f", "qcow2", "-o", "preallocation=metadata", p, "256M")
    qemu_io(p, ["write -P 0x5a 0 51M"], fmt="qcow2")
    m = imgcopy.map(p)
    sizes = {r["kind"]: r["bytes"] for r in m.breakdown()}
    assert sizes == {"data": 51 * MiB, "zero": 205 * MiB}
    assert m.data_bytes == 256 * MiB                       # qemu's flag, as documented
    html = m._repr_html_()
    rows = dict(table_rows(html))
    assert rows["data"][0].startswith("51 MiB") and rows["data"][1] == "19.9%"
    assert "allocated zeros" in rows and "qemu-img map" in rows
    assert "data 51 MiB (19.9%), allocated zeros 205 MiB (80.1%)" in repr(m)


def test_sparse_raw_shares(tmp_path):
    """A 16%-full sparse raw: the table says 16% data; qemu's present
    (allocated_bytes) stays 100%, and the view names it as qemu's."""
    p = str(tmp_path / "s.raw")
    make_sparse(p, 100 * MiB, [(i * 10 * MiB, b"\x07" * (1600 * KiB)) for i in range(10)])
    m = imgcopy.map(p)
    assert [r["share_text"] for r in m.breakdown()] == ["15.6%", "84.4%"]
    assert m.allocated_bytes == 100 * MiB
    html = m._repr_html_()
    assert "present 100 MiB" in html and "qemu's flags" in html


def test_summary_kind_bytes_add_up(chain):
    s = imgcopy.map(chain).summary()
    assert sum(s["kind_bytes"].values()) == kinds_chain.SIZE
    assert s["kind_bytes"] == {k: sum(e - b for b, e in kinds_chain.EXPECTED.get(k, ()))
                               for k in KINDS}
    assert [r["kind"] for r in s["breakdown"]] == list(MAP_KINDS)
    assert s["data_bytes"] == sum(s["kind_bytes"][k] for k in ("data", "backing", "zero"))


def test_share_text():
    assert share_text(0, 100) == "0.0%" and share_text(1, 1 << 40) == "<0.1%"
    assert share_text((1 << 40) - 1, 1 << 40) == ">99.9%" and share_text(5, 5) == "100.0%"
    assert share_text(1, 0) == "0%" and share_text(414, 1000) == "41.4%"


# --------------------------------------------------------------------------
# the strip, the table, the legend

def test_html_every_kind_legend_is_the_table(chain):
    m = imgcopy.map(chain)
    html = m._repr_html_()
    svg = svg_of(html)
    for kind in MAP_STACKED:
        assert rects(svg, kind), kind
    assert rects(svg, "hole")                                    # the background
    rows = table_rows(html)
    labelled = [h for h, _ in rows if h in LABELS.values()]
    assert labelled == [r["label"] for r in m.breakdown()]
    for kind in MAP_KINDS:
        assert f'class="swatch {kind}"' in html and COLORS[kind] in html
    # one sentence for repr, the SVG's accessible name and the table
    for r in m.breakdown():
        words = f"{r['label']} {human_size(r['bytes'])} ({r['share_text']})"
        assert words in repr(m) and words in svg.get("aria-label")
        cells = dict(rows)[r["label"]]
        assert cells[0].startswith(human_size(r["bytes"])) and cells[1] == r["share_text"]


def test_html_compressed_lane(chain):
    m = imgcopy.map(chain)
    html = m._repr_html_()
    svg = svg_of(html)
    marks = rects(svg, "compressed")
    assert len(marks) == 1
    x, w = float(marks[0].get("x")), float(marks[0].get("width"))
    # [5M, 5.5M) of 8 MiB on 600 px: columns 375 to 412 (the last in part)
    assert (x, w) == (375.0, 38.0)
    tip = marks[0].find(SVG + "title").text
    assert tip == "compressed: 512 KiB (524,288 B) in [5 MiB, 5.5 MiB)"
    assert "compressed" in dict(table_rows(html))
    assert 'class="swatch compressed"' in html


def test_html_tooltips_per_segment(chain):
    svg = svg_of(imgcopy.map(chain)._repr_html_())
    zeroed = rects(svg, "zeroed")
    tips = [r.find(SVG + "title").text for r in zeroed]
    # full columns, then the column [1.5 MiB] shares with backing data
    assert tips[:2] == ["zeroed: 505 KiB (517,297 B) in [1 MiB, 1.49 MiB)",
                        "zeroed: 6.83 KiB (6,991 B) in [1.49 MiB, 1.51 MiB)"]
    assert sum(int(re.search(r"\(([\d,]+) B\)", t).group(1).replace(",", "")) for t in tips) \
        == sum(e - s for s, e in kinds_chain.EXPECTED["zeroed"])
    for r in svg.iter(SVG + "rect"):
        if r.get("class") in KINDS:
            assert r.find(SVG + "title") is not None


def test_html_axis_caption_and_accessibility(chain):
    html = imgcopy.map(chain)._repr_html_()
    svg = svg_of(html)
    assert svg.get("role") == "img" and svg.get("aria-label").startswith("Allocation of top.qcow2")
    assert svg.find(SVG + "title").text == svg.get("aria-label")
    ticks = [t.text for t in svg.iter(SVG + "text") if t.get("class") == "tick"]
    assert ticks == ["0 B", "2 MiB", "4 MiB", "6 MiB", "8 MiB"]
    anchors = [t.get("text-anchor") for t in svg.iter(SVG + "text")]
    assert anchors[0] == "start" and anchors[-1] == "end"
    assert "guest offset" in html and "one column &asymp; 13.7 KiB" in html
    assert "bar height = share of the column" in html
    # no fixed grey text (fails contrast in one theme or the other), no Python words
    assert "#777" not in html and "False" not in html and "True" not in html
    assert 'fill="currentColor"' in html


def test_html_narrow_output(chain):
    """The strip scales with its output (labels inside the SVG), the name
    is the file's, its path a tooltip."""
    html = imgcopy.map(chain)._repr_html_()
    svg = svg_of(html)
    assert "max-width:100%" in svg.get("style") and "height:auto" in svg.get("style")
    width = float(svg.get("width"))
    assert svg.get("viewBox") == f"0 0 {int(width)} {svg.get('height')}"
    for t in svg.iter(SVG + "text"):
        assert 0 <= float(t.get("x")) <= width
    assert f'title="{chain}"' in html and ">top.qcow2</code>" in html
    assert "width:600px" not in html.replace("max-width:600px", "")


def test_tiny_run_stays_visible(tiny):
    m = imgcopy.map(tiny)
    html = m._repr_html_()
    svg = svg_of(html)
    (data,) = rects(svg, "data")
    assert int(data.get("height")) >= MIN_HEIGHT and float(data.get("width")) >= MIN_WIDTH
    assert dict(table_rows(html))["data"][1] == "<0.1%"
    assert "(<0.1%)" in repr(m)
    ticks = [t.text for t in svg.iter(SVG + "text") if t.get("class") == "tick"]
    assert ticks == ["0 B", "512 MiB", "1 GiB", "1.5 GiB", "2 GiB"]


def test_empty_window_draws_no_frame(chain):
    m = imgcopy.map(chain, start=MiB, length=0)
    assert (m.start, m.end) == (MiB, MiB)
    html = m._repr_html_()
    assert "<svg" not in html and "(empty range" in html and "frame" not in html


def test_window_ticks_are_round():
    assert axis_ticks(0, 2 * GiB) == [0, 512 * MiB, GiB, 1536 * MiB, 2 * GiB]
    assert axis_ticks(GiB, GiB + 300 * MiB) == [GiB + i * 64 * MiB for i in range(5)]
    assert axis_ticks(3, 4) == [3, 4] and axis_ticks(5, 5) == [5]
    for start, end in ((0, 1), (7, 10 ** 6), (12345, 1 << 40), (0, 6 * GiB + 7)):
        t = axis_ticks(start, end)
        assert 1 <= len(t) <= 7 and start <= t[0] and t[-1] <= end
    assert [offset_label(n) for n in (0, 1536 * MiB, 1088 * MiB, 4097, 64 * KiB)] == \
        ["0 B", "1.5 GiB", "1088 MiB", "4097 B", "64 KiB"]


def test_strip_of_many_extents_stays_small(tmp_path):
    p = str(tmp_path / "many.raw")
    make_sparse(p, 4096 * 20000, [(i * 8192, b"\x01" * 4096) for i in range(10000)])
    m = imgcopy.map(p)
    svg = svg_strip(m.runs(), m.start, m.end, title="t")
    assert len(svg) < 5000


# --------------------------------------------------------------------------
# colours

def _luminance(hex_colour: str) -> float:
    c = [int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5)]
    c = [x / 12.92 if x <= 0.04045 else ((x + 0.055) / 1.055) ** 2.4 for x in c]
    return 0.2126 * c[0] + 0.7152 * c[1] + 0.0722 * c[2]


def _contrast(a: str, b: str) -> float:
    hi, lo = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def test_colours_contrast_with_holes_and_differ_in_hue():
    for kind in STACKED:
        assert _contrast(COLORS[kind], COLORS["hole"]) >= 3.0, kind   # WCAG 1.4.11
    hues = sorted(colorsys.rgb_to_hsv(*(int(COLORS[k][i:i + 2], 16) / 255
                                        for i in (1, 3, 5)))[0] * 360 for k in STACKED)
    gaps = [b - a for a, b in zip(hues, hues[1:])] + [360 - hues[-1] + hues[0]]
    assert min(gaps) >= 30
    blue, orange = (colorsys.rgb_to_hsv(*(int(COLORS[k][i:i + 2], 16) / 255 for i in (1, 3, 5)))[0]
                    for k in ("data", "backing"))
    assert abs(blue - orange) * 360 >= 120  # backing is not a tint of the data blue
    assert _contrast(COLORS["data"], COLORS["backing"]) >= 2.0   # and apart in greyscale


# --------------------------------------------------------------------------
# CopyPlan and ImageInfo

def test_copy_plan_view(chain):
    plan = imgcopy.plan(chain)
    t = plan.totals()
    r = repr(plan)
    assert re.fullmatch(r"<CopyPlan 8 MiB, \d+ requests: \d+ writes \([\d.]+ [KM]iB\), "
                        r"\d+ zeroes \([\d.]+ [KMG]?i?B\), [\d.]+ MiB skipped>", r), r
    assert f"{t['bytes_written']} B" not in r
    html = plan._repr_html_()
    svg = svg_of(html)
    written = rects(svg, "write")
    assert written and rects(svg, "skip")
    rows = dict(table_rows(html))
    assert rows["written"][0].startswith(f"{t['write_requests']} write requests, "
                                         f"{human_size(t['bytes_written'])} "
                                         f"({t['bytes_written']:,} B)")
    assert rows["written"][1] == share_text(t["bytes_written"], plan.size)
    assert "False" not in html and "True" not in html and "target is zero: yes" in html
    zero_plan = imgcopy.plan(chain, target_is_zero=False)
    assert rects(svg_of(zero_plan._repr_html_()), "zero")


def test_image_info_view(chain):
    html = imgcopy.info(chain)._repr_html_()
    rows = dict(table_rows(html))
    assert rows["virtual size"] == ["8 MiB (8,388,608 B)"]
    assert rows["cluster size"] == ["64 KiB (65,536 B)"]
    assert rows["cleanly shut down"] == ["yes"] and rows["lazy refcounts"] == ["no"]
    assert rows["compressed clusters"] == ["8"] and rows["backing file"] == ["base.qcow2"]
    assert "False" not in html and "True" not in html
    assert f'title="{chain}"' in html


# --------------------------------------------------------------------------
# plot()

def test_plot_legend_is_the_table(chain, plt):
    m = imgcopy.map(chain)
    strip, _ = m.plot()
    labels = [t.get_text() for t in strip.get_legend().get_texts()]
    words = [f"{r['label']} {human_size(r['bytes'])} ({r['share_text']})"
             for r in m.breakdown()]
    assert labels == words + ["compressed 512 KiB"]
    hatched = [c for c in strip.collections if c.get_hatch()]
    assert len(hatched) == 1
    for c in strip.collections:
        assert not c.get_antialiased().any()
    fills = {tuple(round(x, 3) for x in c.get_facecolor()[0]) for c in strip.collections
             if not c.get_hatch()}
    assert len(fills) == len(MAP_STACKED)
    assert "data 1.06 MiB" in strip.get_title()


def test_plot_tiny_run_has_a_width(tiny, plt):
    m = imgcopy.map(tiny)
    strip, _ = m.plot()
    (bars,) = strip.collections
    (path,) = bars.get_paths()
    width = path.vertices[:, 0].max() - path.vertices[:, 0].min()
    assert width >= 2.0 / 1000 * 0.99                   # GiB: a thousandth of the strip


# --------------------------------------------------------------------------
# dirty maps: the changed ranges as a kind of their own

DIRTY_RANGES = [(MiB, MiB + 128 * KiB), (4 * MiB, 4 * MiB + 64 * KiB),
                (6 * MiB, 6 * MiB + 64 * KiB)]


def test_dirty_map_kinds_and_repr(dirty):
    m = imgcopy.dirty_map(dirty, "b0")
    assert m.dirty_ranges() == DIRTY_RANGES and m.dirty_bytes == 256 * KiB
    assert kind_ranges(m)["dirty"] == DIRTY_RANGES
    # the clean ranges keep their allocation's kinds
    assert kind_ranges(m)["data"] == [(0, MiB), (MiB + 128 * KiB, 2 * MiB)]
    assert [r["kind"] for r in m.breakdown()] == ["dirty", "data", "hole"]
    assert "bitmap 'b0'" in repr(m) and "dirty 256 KiB (3.1%)" in repr(m)
    s = m.summary()
    assert (s["bitmap"], s["dirty_bytes"], s["dirty_ranges"]) == ("b0", 256 * KiB, 3)
    assert s["dirty_data_bytes"] == 192 * KiB        # the zero cluster is no data
    assert "bitmap" not in imgcopy.map(dirty).summary()
    assert {e.dirty for e in m} == {True, False}
    assert {e.dirty for e in imgcopy.map(dirty)} == {None}     # a plain map says nothing


def test_dirty_map_html(dirty):
    m = imgcopy.dirty_map(dirty, "b0")
    html = m._repr_html_()
    svg = svg_of(html)
    assert rects(svg, "dirty") and rects(svg, "data") and rects(svg, "hole")
    assert 'class="swatch dirty"' in html and COLORS["dirty"] in html
    assert svg.get("aria-label").startswith("Changes in d.qcow2 (bitmap b0)")
    assert "dirty map of bitmap <code>b0</code>" in html
    rows = dict(table_rows(html))
    assert rows["dirty"][0].startswith("256 KiB") and rows["dirty"][1] == "3.1%"
    assert rows["dirty ranges"][0].startswith("3 ranges of bitmap b0, 256 KiB")
    assert "with data 192 KiB" in rows["dirty ranges"][0]
    labelled = [h for h, _ in table_rows(html) if h in LABELS.values()]
    assert labelled == [r["label"] for r in m.breakdown()]
    tips = [r.find(SVG + "title").text for r in rects(svg, "dirty")]
    assert all(t.startswith("dirty: ") for t in tips)


def test_dirty_map_pandas(dirty):
    pytest.importorskip("pandas")
    m = imgcopy.dirty_map(dirty, "b0")
    df = m.to_pandas()
    assert df["dirty"].tolist() == [e.dirty for e in m]
    assert df["kind"].tolist() == [e.kind for e in m]
    assert int(df.loc[df["dirty"], "length"].sum()) == 256 * KiB
    assert df.attrs["bitmap"] == "b0"


def test_dirty_map_plot(dirty, plt):
    m = imgcopy.dirty_map(dirty, "b0")
    strip, _ = m.plot()
    labels = [t.get_text() for t in strip.get_legend().get_texts()]
    assert labels == [f"{r['label']} {human_size(r['bytes'])} ({r['share_text']})"
                      for r in m.breakdown()]
    assert labels[0] == "dirty 256 KiB (3.1%)"
    fills = {tuple(round(x, 3) for x in c.get_facecolor()[0]) for c in strip.collections}
    assert len(fills) == 2                            # dirty and data on the holes
    assert "bitmap b0: dirty 256 KiB" in strip.get_title()
