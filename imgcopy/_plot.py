"""matplotlib views of extent maps (imported only when plotting)."""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from ._html import COLORS, LABELS, STACKED
from .extents import KINDS, human_size

if TYPE_CHECKING:  # pragma: no cover
    from .extents import ExtentMap

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


def plot_strip(emap: "ExtentMap", ax: Any, runs: List[Tuple[str, int, int]]) -> None:
    from matplotlib.patches import Patch

    span = emap.end - emap.start
    div, unit = _unit(max(emap.end, 1))
    totals: Dict[str, int] = {}
    for kind, s, e in runs:
        totals[kind] = totals.get(kind, 0) + e - s
    ax.set_facecolor(COLORS["hole"])
    for kind in STACKED:
        bars = [(s / div, (e - s) / div) for k, s, e in runs if k == kind]
        if bars:
            # an edge as wide as a hairline keeps tiny runs visible
            ax.broken_barh(bars, (0, 1), facecolors=COLORS[kind], edgecolors=COLORS[kind],
                           linewidth=0.3)
    ax.set_xlim(emap.start / div, (emap.end if span else emap.start + 1) / div)
    ax.set_ylim(0, 1)
    ax.set_yticks([])
    ax.set_xlabel(f"guest offset ({unit})")
    handles = [Patch(facecolor=COLORS[k], edgecolor="#999",
                     label=f"{LABELS[k]} {human_size(totals[k])}")
               for k in KINDS if totals.get(k)]
    if handles:
        ax.legend(handles=handles, loc="lower left", bbox_to_anchor=(0, 1.0), ncol=len(handles),
                  frameon=False, fontsize="small", borderaxespad=0.2)


def plot_histogram(emap: "ExtentMap", ax: Any, bins: int) -> None:
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


def plot_extent_map(emap: "ExtentMap", ax: Any = None, *, bins: int = 40,
                    title: Optional[str] = None) -> Tuple[Any, ...]:
    strip_ax, hist_ax = _split_axes(ax)
    runs = emap.runs()
    plot_strip(emap, strip_ax, runs)
    if title is None:
        title = (f"{os.path.basename(emap.filename)} ({emap.format}, {human_size(emap.size)}): "
                 f"{len(emap):,} extents, {human_size(emap.data_bytes)} data")
    strip_ax.set_title(title, pad=20, fontsize="medium")
    if hist_ax is None:
        return (strip_ax,)
    plot_histogram(emap, hist_ax, bins)
    return (strip_ax, hist_ax)
