"""HTML and SVG views for notebooks (ExtentMap, CopyPlan, ImageInfo), with
no plotting library.  Text takes the notebook's own colour (light or dark
theme); only the strip's fills are fixed colours."""
from __future__ import annotations

import os
from bisect import bisect_left, bisect_right
from html import escape
from typing import Any, Dict, Iterable, List, Sequence, Tuple

from ._drawables import DrawnExtentMap, DrawnInfo, DrawnPlan
from .sizes import LABELS, human_size, parse_size, share_text

# Shared with the matplotlib plot (imgcopy/_plot.py).  Every kind has at
# least 3:1 contrast with the hole colour (WCAG 1.4.11, graphics), and the
# hues (blue, orange, teal, purple; a dirty map's red) stay apart for
# colour-blind readers and in greyscale from the holes.
COLORS = {"dirty": "#d62839", "data": "#0b4f9c", "backing": "#c46a00", "zero": "#138a8a",
          "zeroed": "#9b3f8c", "hole": "#f0f0f0"}
# stacking order in a column, bottom first (a dirty map's changes first);
# holes are the background
STACKED = ("dirty", "data", "backing", "zero", "zeroed")
COMPRESSED_LABEL = "compressed"

# A copy plan's requests, drawn the same way (skips are the background).
PLAN_KINDS = ("write", "zero", "skip")
PLAN_COLORS = {"write": COLORS["data"], "zero": COLORS["zero"], "skip": COLORS["hole"]}
PLAN_LABELS = {"write": "written", "zero": "zeroed", "skip": "skipped"}

STRIP_WIDTH = 600     # px, the strip's largest width; it shrinks with its output
BAR_HEIGHT = 32       # px
MIN_HEIGHT = 8        # px: the least height a kind present in a column gets
MIN_WIDTH = 4         # px: the least width of a drawn range (one column may be < 1 px)
LANE_HEIGHT = 5       # px: the compressed marker lane above the bar
AXIS_HEIGHT = 18      # px: tick marks and labels below the bar
MAX_TICKS = 7

# secondary text: the theme's text colour, lighter (keeps AA contrast on
# light and dark backgrounds alike, where a fixed grey fails one of them)
SECONDARY = "opacity:0.78"
CELL = "text-align:left;padding:1px 1em 1px 0;vertical-align:top"
NUMBER = "text-align:right;padding:1px 1em 1px 0;font-variant-numeric:tabular-nums"


# --------------------------------------------------------------------------
# the strip: columns, heights, axis

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


def column_heights(col: Dict[str, int], total: int, height: int,
                   order: Sequence[str] = STACKED) -> Dict[str, int]:
    """Pixel heights of the stacked kinds of a column: proportional, at
    least MIN_HEIGHT for any kind present (a 4 KiB run in a 2 GiB image
    stays visible), never more than ``height`` in all."""
    present = [k for k in order if col.get(k, 0)]
    if not present:
        return {}
    least = min(MIN_HEIGHT, height // len(present)) or 1
    h = {k: max(least, round(height * col[k] / total)) for k in present}
    while sum(h.values()) > height:
        k = max(h, key=lambda x: h[x])
        if h[k] <= least:
            break
        h[k] -= 1
    return h


def axis_ticks(start: int, end: int, max_ticks: int = MAX_TICKS) -> List[int]:
    """Round guest offsets in ``[start, end]``: multiples of the smallest
    power of two that keeps at most ``max_ticks`` of them (disks are laid
    out in powers of two: 512 MiB, 1 GiB, 1.5 GiB...)."""
    span = end - start
    if span <= 0:
        return [start]
    step = 1
    while span // step + 1 > max_ticks:
        step *= 2
    first = -(-start // step) * step
    return list(range(first, end + 1, step))


_UNITS = ((1 << 60, "EiB"), (1 << 50, "PiB"), (1 << 40, "TiB"), (1 << 30, "GiB"),
          (1 << 20, "MiB"), (1 << 10, "KiB"))


def offset_label(n: int) -> str:
    """An offset exactly, in the largest unit that needs at most two
    decimals ("1.5 GiB", "1088 MiB", "4097 B")."""
    for unit, name in _UNITS:
        if n >= unit and (n * 100) % unit == 0:
            return f"{n / unit:g} {name}"
    return f"{n} B"


def _num(x: float) -> str:
    return f"{x:.6g}"


def svg_strip(runs: Sequence[Tuple[str, int, int]], start: int, end: int, *,
              order: Sequence[str] = STACKED, colors: Dict[str, str] = COLORS,
              labels: Dict[str, str] = LABELS, background: str = "hole",
              width: int = STRIP_WIDTH, title: str = "",
              marks: Sequence[Tuple[int, int]] = ()) -> str:
    """An inline SVG allocation strip of ``[start, end)``: one column per
    ``(end - start) / width`` bytes, filled from the bottom in proportion to
    the bytes of each kind of ``order`` in it (``background`` is what is
    left).  Neighbouring columns that look the same are one rectangle
    (``class`` is the kind) with a tooltip of its range and bytes, so the SVG
    stays small whatever the map.  ``marks``: ranges (compressed clusters)
    marked in a lane above the bar.  Round offsets are ticked below it.
    ``title`` is the SVG's accessible name."""
    bounds, columns = strip_columns(runs, start, end, width)
    ncol = max(len(columns), 1)
    scale = width / ncol
    lane = LANE_HEIGHT + 2 if marks else 0
    height = lane + BAR_HEIGHT + AXIS_HEIGHT
    label = escape(title, quote=True)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="imgcopy-strip" role="img" '
             f'aria-label="{label}" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" style="max-width:100%;height:auto;display:block" '
             f'font-family="sans-serif" font-size="12">',
             f'<title>{escape(title)}</title>',
             f'<rect class="{background}" x="0" y="{lane}" width="{width}" '
             f'height="{BAR_HEIGHT}" fill="{colors[background]}" shape-rendering="crispEdges">'
             f'<title>{escape(labels[background])}: the background</title></rect>']
    heights = [column_heights(col, bounds[c + 1] - bounds[c], BAR_HEIGHT, order)
               for c, col in enumerate(columns)]
    for kind in order:
        # rectangles of [c0, c1, y, h, bytes]: equal (y, h) in neighbouring
        # columns merge
        rects: List[List[int]] = []
        for c, h in enumerate(heights):
            if kind not in h:
                continue
            below = sum(h[k] for k in order[:order.index(kind)] if k in h)
            y = lane + BAR_HEIGHT - below - h[kind]
            n = columns[c][kind]
            if rects and rects[-1][1] == c and rects[-1][2:4] == [y, h[kind]]:
                rects[-1][1] = c + 1
                rects[-1][4] += n
            else:
                rects.append([c, c + 1, y, h[kind], n])
        # a run of columns holding the kind narrower than MIN_WIDTH is
        # widened; wider ones are drawn as they are
        narrow = {c for c0, c1 in _spans([c for c, h in enumerate(heights) if kind in h])
                  if (c1 - c0) * scale < MIN_WIDTH for c in range(c0, c1)}
        for c0, c1, y, hh, n in rects:
            tip = _tooltip(labels[kind], n, bounds[c0], bounds[c1])
            x, w = c0 * scale, (c1 - c0) * scale
            if c0 in narrow:
                x, w = _visible(x, w, width)
            parts.append(f'<rect class="{kind}" x="{_num(x)}" y="{y}" '
                         f'width="{_num(w)}" height="{hh}" '
                         f'fill="{colors[kind]}" shape-rendering="crispEdges">'
                         f'<title>{escape(tip)}</title></rect>')
    if marks:
        marked = [c for c, col in enumerate(strip_columns(
            [("m", s, e) for s, e in marks], start, end, width)[1]) if col]
        starts = [s for s, _ in marks]
        ends = [e for _, e in marks]
        for c0, c1 in _spans(marked):
            # marks are sorted and apart: those ending after the span's
            # start and starting before its end
            first, last = bisect_right(ends, bounds[c0]), bisect_left(starts, bounds[c1])
            inside = [(max(s, bounds[c0]), min(e, bounds[c1])) for s, e in marks[first:last]]
            n = sum(e - s for s, e in inside)
            tip = _tooltip(COMPRESSED_LABEL, n, inside[0][0], inside[-1][1])
            x, w = _visible(c0 * scale, (c1 - c0) * scale, width)
            parts.append(f'<rect class="{COMPRESSED_LABEL}" x="{_num(x)}" y="0" '
                         f'width="{_num(w)}" height="{LANE_HEIGHT}" '
                         f'fill="currentColor" shape-rendering="crispEdges">'
                         f'<title>{escape(tip)}</title></rect>')
    bottom = lane + BAR_HEIGHT
    parts.append(f'<rect class="frame" x="0.5" y="{lane + 0.5}" width="{width - 1}" '
                 f'height="{BAR_HEIGHT - 1}" fill="none" stroke="currentColor" '
                 f'stroke-opacity="0.5"/>')
    span = max(end - start, 1)
    for t in axis_ticks(start, end):
        x = (t - start) * width / span
        anchor = "start" if x < 30 else "end" if x > width - 30 else "middle"
        parts.append(f'<line class="tick" x1="{_num(x)}" x2="{_num(x)}" y1="{bottom}" '
                     f'y2="{bottom + 4}" stroke="currentColor"/>'
                     f'<text class="tick" x="{_num(min(max(x, 0), width))}" '
                     f'y="{bottom + 15}" text-anchor="{anchor}" fill="currentColor">'
                     f'{escape(offset_label(t))}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _tooltip(label: str, n: int, start: int, end: int) -> str:
    return f"{label}: {human_size(n)} ({n:,} B) in [{human_size(start)}, {human_size(end)})"


def _visible(x: float, w: float, width: int) -> Tuple[float, float]:
    """A range at least MIN_WIDTH wide, widened about its middle, inside
    the strip."""
    if w >= MIN_WIDTH:
        return x, w
    x = min(max(x + w / 2 - MIN_WIDTH / 2, 0), width - MIN_WIDTH)
    return x, MIN_WIDTH


def _spans(cols: List[int]) -> Iterable[Tuple[int, int]]:
    """Ascending column numbers as [c0, c1) spans of consecutive ones."""
    i = 0
    while i < len(cols):
        j = i
        while j + 1 < len(cols) and cols[j + 1] == cols[j] + 1:
            j += 1
        yield cols[i], cols[j] + 1
        i = j + 1


def strip_caption(start: int, end: int, width: int = STRIP_WIDTH) -> str:
    """What the strip's axes mean, under it."""
    span = end - start
    ncol = min(width, span)
    per = f"= {human_size(span // ncol)}" if span % ncol == 0 \
        else f"&asymp; {human_size(round(span / ncol))}"
    return (f'<div class="caption" style="{SECONDARY}">guest offset &middot; one column '
            f'{per} &middot; bar height = share of the column\'s bytes &middot; '
            f'hover for ranges</div>')


# --------------------------------------------------------------------------
# shared pieces

def swatch(color: str, kind: str) -> str:
    return (f'<span class="swatch {kind}" style="display:inline-block;width:10px;height:10px;'
            f'background:{color};border:1px solid currentColor;margin-right:5px;'
            f'vertical-align:-1px"></span>')


def lane_swatch() -> str:
    """The legend of the compressed lane: a short bar like its marks."""
    return ('<span class="swatch compressed" style="display:inline-block;width:12px;'
            'height:4px;background:currentColor;margin-right:5px;vertical-align:6px"></span>')


def size_cell(n: int) -> str:
    """A size for people, with its exact bytes."""
    return f'{human_size(n)} <span style="{SECONDARY}">({n:,} B)</span>'


def yes_no(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    return escape(str(value))


def file_name(path: str) -> str:
    """A file's name, its full path as a tooltip."""
    base = os.path.basename(path.rstrip("/")) or path
    return f'<code title="{escape(path, quote=True)}">{escape(base)}</code>'


def table(rows: Iterable[Tuple[str, ...]]) -> str:
    """Rows of (header, cell...) with their HTML already escaped."""
    out = []
    for row in rows:
        cells = "".join(f'<td style="{NUMBER if c.endswith("%") else CELL}">{c}</td>'
                        for c in row[1:])
        out.append(f'<tr><th style="{CELL};font-weight:bold;white-space:nowrap">{row[0]}</th>'
                   f'{cells}</tr>')
    return (f'<table style="border-collapse:collapse;margin-top:4px;font-size:inherit">'
            f'{"".join(out)}</table>')


def view(cls: str, head: str, body: str, width: int = STRIP_WIDTH) -> str:
    return (f'<div class="imgcopy-view {cls}" style="font-family:sans-serif;font-size:12px;'
            f'line-height:1.4;max-width:{width}px">'
            f'<div style="margin-bottom:4px">{head}</div>{body}</div>')


# --------------------------------------------------------------------------
# ExtentMap

def extent_map_html(emap: DrawnExtentMap, width: int = STRIP_WIDTH) -> str:
    """The notebook view of an ExtentMap: a title, the strip with its axis,
    and one table row per kind drawn (its swatch is the legend)."""
    s = emap.summary()
    start, end = s["start"], s["end"]
    span = end - start
    rows = s["breakdown"]
    what = (f'{escape(s["format"])} &middot; {human_size(s["virtual_size"])} virtual '
            f'({s["virtual_size"]:,} B)')
    if (start, end) != (0, s["virtual_size"]):
        what += f' &middot; range [{offset_label(start)}, {offset_label(end)})'
    bitmap = s.get("bitmap")
    if bitmap is not None:
        what += f' &middot; dirty map of bitmap <code>{escape(bitmap)}</code>'
    head = (f'<b>ExtentMap</b> {file_name(s["filename"])} '
            f'<span style="{SECONDARY}">{what}</span>')
    marks = emap.compressed_ranges()
    words = ", ".join(f"{r['label']} {human_size(r['bytes'])} ({r['share_text']})" for r in rows)
    if marks:
        words += f", {COMPRESSED_LABEL} {human_size(s['compressed_bytes'])}"
    shown = os.path.basename(s['filename']) or s['filename']
    title = f"Allocation of {shown}: {words}" if bitmap is None else \
        f"Changes in {shown} (bitmap {bitmap}), clean ranges by allocation: {words}"
    if span:
        strip = (svg_strip(emap.runs(), start, end, width=width, title=title, marks=marks)
                 + strip_caption(start, end, width))
    else:
        strip = f'<div style="{SECONDARY}">(empty range: nothing to draw)</div>'
    table_rows: List[Tuple[str, ...]] = [
        (swatch(COLORS[r["kind"]], r["kind"]) + escape(r["label"]), size_cell(r["bytes"]),
         r["share_text"]) for r in rows]
    if bitmap is not None:
        n = s["dirty_ranges"]
        table_rows.append(("dirty ranges", f"{n:,} range{'s' if n != 1 else ''} of bitmap "
                           f"<code>{escape(bitmap)}</code>, {size_cell(s['dirty_bytes'])}; "
                           f"with data {human_size(s['dirty_data_bytes'])} "
                           f'<span style="{SECONDARY}">(what a copy of the changes reads; '
                           f'the other kinds are the clean ranges)</span>', ""))
    if s["compressed_bytes"]:
        table_rows.append((lane_swatch() + COMPRESSED_LABEL,
                           size_cell(s["compressed_bytes"]) + f' in {s["compressed_extents"]:,}'
                           f' extent{"s" if s["compressed_extents"] != 1 else ""}',
                           share_text(s["compressed_bytes"], span)))
    table_rows.append(("extents", f"{s['extents']:,} ({s['data_extents']:,} with data, "
                                  f"{s['hole_extents']:,} without)", ""))
    for kind in ("data", "hole"):
        if s[f"{kind}_runs"]:
            table_rows.append((f"{'data' if kind == 'data' else 'no-data'} runs",
                               f"{s[kind + '_runs']:,}: largest "
                               f"{human_size(s['largest_' + kind + '_run'])}, median "
                               f"{human_size(s['median_' + kind + '_run'])}", ""))
    if len(emap.chain_formats) > 1:
        table_rows.append(("backing chain", " &rarr; ".join(
            f"{file_name(name)} ({escape(fmt)})"
            for name, fmt in zip(emap.chain_files, emap.chain_formats)), ""))
    table_rows.append(("qemu-img map",
                       f"data {human_size(s['data_bytes'])}, present "
                       f"{human_size(s['allocated_bytes'])}, zero {human_size(s['zero_bytes'])}"
                       f' <span style="{SECONDARY}">(qemu\'s flags: its data includes backing '
                       f'data and allocated zeros; a raw file\'s holes are present)</span>', ""))
    return view("imgcopy-extent-map", head, strip + table(table_rows), width)


# --------------------------------------------------------------------------
# CopyPlan

def copy_plan_html(plan: DrawnPlan, width: int = STRIP_WIDTH) -> str:
    """The notebook view of a CopyPlan: its requests as a strip (written,
    zeroed, skipped) and their totals."""
    t = plan.totals()
    size = plan.size
    runs = [(r.kind, r.offset, r.end) for r in plan]
    sizes = dict.fromkeys(PLAN_KINDS, 0)
    counts = dict.fromkeys(PLAN_KINDS, 0)
    for kind, s, e in runs:
        sizes[kind] += e - s
        counts[kind] += 1
    words = ", ".join(f"{PLAN_LABELS[k]} {human_size(sizes[k])} ({share_text(sizes[k], size)})"
                      for k in PLAN_KINDS if sizes[k])
    head = (f'<b>CopyPlan</b> <span style="{SECONDARY}">{len(plan):,} requests &middot; '
            f'{human_size(size)} virtual</span>')
    if size:
        strip = (svg_strip(runs, 0, size, order=("write", "zero"), colors=PLAN_COLORS,
                           labels=PLAN_LABELS, background="skip", width=width,
                           title=f"Copy plan: {words}") + strip_caption(0, size, width))
    else:
        strip = f'<div style="{SECONDARY}">(empty image: nothing to copy)</div>'
    names = {"write": "write requests", "zero": "zero requests", "skip": "skipped ranges"}
    rows: List[Tuple[str, ...]] = [
        (swatch(PLAN_COLORS[k], k) + f"{PLAN_LABELS[k]}",
         f"{counts[k]:,} {names[k]}, {size_cell(sizes[k])}", share_text(sizes[k], size))
        for k in PLAN_KINDS if counts[k]]
    rows.append(("reads", f"{t['read_requests']:,} requests, {size_cell(t['bytes_read'])}",
                 ""))
    o = plan.options
    rows.append(("options", escape(
        f"sparse threshold {human_size(parse_size(o.sparse_threshold))}, request size "
        f"{human_size(parse_size(o.request_size))}, concurrency {o.concurrency}, "
        f"target is zero: {yes_no(o.target_is_zero)}"), ""))
    return view("imgcopy-copy-plan", head, strip + table(rows), width)


# --------------------------------------------------------------------------
# ImageInfo

def _flatten(data: Any, prefix: str) -> Iterable[Tuple[str, str]]:
    if isinstance(data, dict):
        for k, v in data.items():
            yield from _flatten(v, f"{prefix} › {k.replace('-', ' ')}" if prefix
                                else k.replace("-", " "))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            yield from _flatten(v, f"{prefix} [{i}]")
    else:
        yield prefix, yes_no(data)


def image_info_html(info: DrawnInfo) -> str:
    """The notebook view of an ImageInfo: qemu-img info's fields in words,
    sizes with their exact bytes."""
    rows: List[Tuple[str, ...]] = [("format", escape(info.format))]
    rows.append(("virtual size", size_cell(info.qemu_virtual_size)))
    rows.append(("disk size", "unavailable" if info.actual_size is None
                 else size_cell(info.actual_size)))
    if info.cluster_size is not None:
        rows.append(("cluster size", size_cell(info.cluster_size)))
    if info.backing_filename is not None:
        backing = file_name(info.backing_filename)
        if info.full_backing_filename is None:
            backing += f' <span style="{SECONDARY}">(cannot determine actual path)</span>'
        elif info.full_backing_filename != info.backing_filename:
            backing += f' <span style="{SECONDARY}">(actual path: ' \
                       f'{escape(info.full_backing_filename)})</span>'
        rows.append(("backing file", backing))
        if info.backing_filename_format is not None:
            rows.append(("backing file format", escape(info.backing_filename_format)))
    if info.dirty_flag is not None:
        rows.append(("cleanly shut down", yes_no(not info.dirty_flag)))
    if info.compressed_clusters is not None:
        rows.append(("compressed clusters", f"{info.compressed_clusters:,}"))
    for sn in info.snapshots or ():
        rows.append(("snapshot", escape(sn.human_row().strip())))
    if info.format_specific is not None:
        rows.extend((escape(k), v) for k, v in _flatten(info.format_specific["data"], ""))
    head = f'<b>ImageInfo</b> {file_name(info.filename)}'
    return view("imgcopy-image-info", head, table(rows))
