"""HTML and SVG views of extent maps for notebooks, with no plotting library."""
from __future__ import annotations

from html import escape
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple

from .extents import KINDS, human_size

if TYPE_CHECKING:  # pragma: no cover
    from .extents import ExtentMap

# Shared with the matplotlib plot (imgcopy/_plot.py).
COLORS = {"data": "#1f77b4", "backing": "#9ecae1", "zero": "#ff7f0e", "hole": "#e8e8e8"}
LABELS = {"data": "data", "backing": "backing data", "zero": "allocated zeros", "hole": "holes"}
# stacking order in a column, bottom first; holes are the background
STACKED = ("data", "backing", "zero")

STRIP_WIDTH = 600
STRIP_HEIGHT = 24


def strip_columns(runs: Sequence[Tuple[str, int, int]], start: int, end: int,
                  width: int) -> Tuple[List[int], List[Dict[str, int]]]:
    """Cut ``[start, end)`` into at most ``width`` columns of (nearly) equal
    byte counts and count the bytes of each kind in each.

    Returns (bounds, columns): column c covers ``[bounds[c], bounds[c+1])``;
    ``columns[c]`` maps kind -> bytes (holes included)."""
    span = end - start
    ncol = min(width, span)
    if ncol <= 0:
        return [start], []
    bounds = [start + span * c // ncol for c in range(ncol + 1)]
    columns: List[Dict[str, int]] = [{} for _ in range(ncol)]
    for kind, s, e in runs:
        s, e = max(s, start), min(e, end)
        if s >= e:
            continue
        # the last column whose first byte is at or before s
        c = ((s - start + 1) * ncol + span - 1) // span - 1
        while c < ncol and bounds[c] < e:
            n = min(e, bounds[c + 1]) - max(s, bounds[c])
            if n > 0:
                col = columns[c]
                col[kind] = col.get(kind, 0) + n
            c += 1
    return bounds, columns


def _heights(col: Dict[str, int], total: int, height: int) -> Dict[str, int]:
    """Pixel heights of the stacked kinds of a column: proportional, at
    least one pixel for any kind present, never more than ``height``."""
    h = {}
    for kind in STACKED:
        n = col.get(kind, 0)
        if n:
            h[kind] = max(1, round(height * n / total))
    while sum(h.values()) > height:
        k = max(h, key=lambda x: h[x])
        h[k] -= 1
    return h


def svg_strip(emap: "ExtentMap", width: int = STRIP_WIDTH, height: int = STRIP_HEIGHT,
              runs: Optional[Sequence[Tuple[str, int, int]]] = None) -> str:
    """An inline SVG allocation strip of ``emap``: one column per
    ``(end - start) / width`` bytes, filled from the bottom in proportion to
    its data, backing data and allocated zeros (holes are the background).
    Neighbouring columns that look the same are drawn as one rectangle
    (``class`` is the kind), so the SVG stays small whatever the map."""
    if runs is None:
        runs = emap.runs()
    bounds, columns = strip_columns(runs, emap.start, emap.end, width)
    ncol = max(len(columns), 1)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="imgcopy-strip" width="{width}" '
             f'height="{height}" viewBox="0 0 {ncol} {height}" preserveAspectRatio="none" '
             f'shape-rendering="crispEdges">',
             f'<rect class="hole" x="0" y="0" width="{ncol}" height="{height}" '
             f'fill="{COLORS["hole"]}"/>']
    heights = [_heights(col, bounds[c + 1] - bounds[c], height)
               for c, col in enumerate(columns)]
    for kind in STACKED:
        # rectangles of (x0, x1, y, h): equal (y, h) in neighbouring columns merge
        rects: List[List[int]] = []
        for c, h in enumerate(heights):
            if kind not in h:
                continue
            below = sum(h[k] for k in STACKED[:STACKED.index(kind)] if k in h)
            y = height - below - h[kind]
            if rects and rects[-1][1] == c and rects[-1][2:] == [y, h[kind]]:
                rects[-1][1] = c + 1
            else:
                rects.append([c, c + 1, y, h[kind]])
        for x0, x1, y, hh in rects:
            parts.append(f'<rect class="{kind}" x="{x0}" y="{y}" width="{x1 - x0}" '
                         f'height="{hh}" fill="{COLORS[kind]}"/>')
    parts.append("</svg>")
    return "".join(parts)


def _size(n: int) -> str:
    return f"{human_size(n)} <span style=\"color:#777\">({n:,} B)</span>"


def _pct(n: int, span: int) -> str:
    return f" &middot; {100.0 * n / span:.1f}%" if span else ""


def extent_map_html(emap: "ExtentMap", width: int = STRIP_WIDTH) -> str:
    """The notebook view of an ExtentMap: a title, the SVG strip with its
    legend, and the summary as a table."""
    s = emap.summary()
    span = s["end"] - s["start"]
    rows = [("virtual size", _size(s["virtual_size"]))]
    if (s["start"], s["end"]) != (0, s["virtual_size"]):
        rows.append(("range", f"[{s['start']:,}, {s['end']:,})"))
    rows.append(("extents", f"{s['extents']:,} ({s['data_extents']:,} with data, "
                            f"{s['hole_extents']:,} without)"))
    rows.append(("data", _size(s["data_bytes"]) + _pct(s["data_bytes"], span)))
    if s["backing_bytes"]:
        rows.append(("from backing files", _size(s["backing_bytes"])))
    if s["zero_data_bytes"]:
        rows.append(("allocated zeros", _size(s["zero_data_bytes"])))
    if s["compressed_bytes"]:
        rows.append(("compressed", f"{_size(s['compressed_bytes'])} in "
                                   f"{s['compressed_extents']:,} extents"))
    rows.append(("holes", _size(s["hole_bytes"]) + _pct(s["hole_bytes"], span)))
    for what in ("data", "hole"):
        if s[f"{what}_runs"]:
            rows.append((f"{what} runs", f"{s[what + '_runs']:,}: largest "
                                         f"{human_size(s['largest_' + what + '_run'])}, median "
                                         f"{human_size(s['median_' + what + '_run'])}"))
    runs = emap.runs()
    kinds_present = {k for k, _, _ in runs}
    legend = "".join(
        f'<span style="margin-right:1em"><span style="display:inline-block;width:10px;'
        f'height:10px;background:{COLORS[k]};border:1px solid #aaa;margin-right:4px"></span>'
        f'{LABELS[k]}</span>' for k in KINDS if k in kinds_present)
    table = "".join(f'<tr><th style="text-align:left;padding-right:1em">{escape(k)}</th>'
                    f'<td style="text-align:left">{v}</td></tr>' for k, v in rows)
    strip = svg_strip(emap, width, runs=runs) if span else "<i>(empty range)</i>"
    return (f'<div class="imgcopy-extent-map" style="font-family:sans-serif;font-size:12px">'
            f'<div style="margin-bottom:4px"><b>ExtentMap</b> <code>{escape(s["filename"])}'
            f'</code> ({escape(s["format"])})</div>'
            f'<div style="border:1px solid #aaa;display:inline-block;line-height:0">{strip}</div>'
            f'<div style="display:flex;justify-content:space-between;width:{width}px;'
            f'color:#777"><span>{human_size(s["start"])}</span>'
            f'<span>{human_size(s["end"])}</span></div>'
            f'<div style="margin:4px 0">{legend}</div>'
            f'<table>{table}</table></div>')
