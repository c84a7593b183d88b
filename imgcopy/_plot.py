"""matplotlib views of extent maps (imported only when plotting)."""
from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Tuple

from ._drawables import DrawnExtentMap
from ._html import COLORS, COMPRESSED_LABEL, STACKED
from .sizes import KINDS, LABELS, human_size

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def _unit(n: int) -> Tuple[int, str]:
    """The largest binary unit not above n (bytes for small n)."""
    i = 0
    while i + 1 < len(_UNITS) and n >= 1 << (10 * (i + 1)):
        i += 1
    return 1 << (10 * i), _UNITS[i]


def _split_axes(ax: Any) -> Tuple[Any, Optional[Any]]:
    if ax is None:
        import matplotlib.pyplot as plt

        _, axes = plt.subplots(2, 1, figsize=(10, 4.2), layout="constrained",
                               gridspec_kw={"height_ratios": [1, 3]})
        return axes[0], axes[1]
    if hasattr(ax, "__len__"):  # a pair (list, tuple or numpy array of Axes)
        if len(ax) != 2:
            raise ValueError("ax must be one Axes or a pair of Axes (strip, histogram)")
        return ax[0], ax[1]
    return ax, None


def plot_strip(emap: DrawnExtentMap, ax: Any, runs: List[Tuple[str, int, int]]) -> None:
    from matplotlib.patches import Patch

    span = emap.end - emap.start
    div, unit = _unit(max(emap.end, 1))
    # a run narrower than this still shows (a 4 KiB run in 2 GiB would be
    # a fraction of a pixel): about one pixel of a 1000-pixel-wide strip
    least = span / 1000 / div
    ax.set_facecolor(COLORS["hole"])
    for kind in STACKED:
        bars = [(s / div, max((e - s) / div, least)) for k, s, e in runs if k == kind]
        if bars:
            # no antialiasing: a hairline run keeps its own colour instead
            # of blending into its neighbours
            ax.broken_barh(bars, (0, 1), facecolors=COLORS[kind], linewidth=0,
                           antialiased=False)
    compressed = [(s / div, max((e - s) / div, least)) for s, e in emap.compressed_ranges()]
    if compressed:
        ax.broken_barh(compressed, (0, 1), facecolors="none", edgecolors="white",
                       hatch="////", linewidth=0, antialiased=False)
    ax.set_xlim(emap.start / div, (emap.end if span else emap.start + 1) / div)
    ax.set_ylim(0, 1)
    ax.set_yticks([])
    ax.set_xlabel(f"guest offset ({unit})")
    handles = [Patch(facecolor=COLORS[r["kind"]], edgecolor="#777",
                     label=f"{r['label']} {human_size(r['bytes'])} ({r['share_text']})")
               for r in emap.breakdown()]
    if compressed:
        handles.append(Patch(facecolor=COLORS["data"], edgecolor="white", hatch="////",
                             label=f"{COMPRESSED_LABEL} {human_size(emap.compressed_bytes)}"))
    if handles:
        ax.legend(handles=handles, loc="lower left", bbox_to_anchor=(0, 1.0),
                  ncol=min(len(handles), 3), frameon=False, fontsize="small",
                  borderaxespad=0.2)


def plot_histogram(emap: DrawnExtentMap, ax: Any, bins: int) -> None:
    import numpy as np
    from matplotlib.ticker import FuncFormatter, MaxNLocator, NullLocator

    lengths: Dict[str, List[int]] = {}
    for e in emap:
        lengths.setdefault(e.kind, []).append(e.length)
    kinds = [k for k in KINDS if k in lengths]
    if not kinds:
        ax.text(0.5, 0.5, "no extents", ha="center", va="center", transform=ax.transAxes)
        return
    lo = min(min(v) for v in lengths.values())
    hi = max(max(v) for v in lengths.values())
    edges = np.geomspace(lo / 1.5, hi * 1.5, bins + 1)
    ax.hist([lengths[k] for k in kinds], bins=edges, stacked=True,
            color=[COLORS[k] if k != "hole" else "#aaaaaa" for k in kinds],
            label=[f"{LABELS[k]} ({len(lengths[k]):,})" for k in kinds])
    ax.set_xscale("log", base=2)
    # ticks on powers of two, at most about 8 of them
    k0, k1 = int(np.ceil(np.log2(edges[0]))), int(np.floor(np.log2(edges[-1])))
    step = max(1, -(-(k1 - k0 + 1) // 8))
    ax.set_xticks([2.0 ** k for k in range(k0, k1 + 1, step)])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: human_size(int(round(x)))))
    ax.set_xlabel("extent length")
    ax.set_ylabel("extents")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(fontsize="small", frameon=False)


def plot_extent_map(emap: DrawnExtentMap, ax: Any = None, *, bins: int = 40,
                    title: Optional[str] = None) -> Tuple[Any, ...]:
    strip_ax, hist_ax = _split_axes(ax)
    runs = emap.runs()
    plot_strip(emap, strip_ax, runs)
    if title is None:
        data = sum(r["bytes"] for r in emap.breakdown() if r["kind"] == "data")
        title = (f"{os.path.basename(emap.filename)} ({emap.format}, {human_size(emap.size)}): "
                 f"{len(emap):,} extents, data {human_size(data)}")
        if emap.bitmap is not None:
            title += f"; bitmap {emap.bitmap}: dirty {human_size(emap.dirty_bytes)}"
    strip_ax.set_title(title, pad=34, fontsize="medium")
    if hist_ax is None:
        return (strip_ax,)
    plot_histogram(emap, hist_ax, bins)
    return (strip_ax, hist_ax)
