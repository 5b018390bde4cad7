"""Drawing roofs and the points measured or predicted under them (notebook 3)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from workshop.compute.roofline import Machine, Point, attainable_flops
from workshop.plots import figure


def plot_roofline(ax, machine: Machine, points: Sequence[Point] = (),
                  intensity_range: tuple[float, float] = (0.1, 1e4), color: str | None = None,
                  marker: str = "o", annotate: bool = True):
    """Draw ``machine``'s roof (log-log) and ``points`` on a matplotlib axis."""
    x = np.logspace(np.log10(intensity_range[0]), np.log10(intensity_range[1]), 200)
    y = attainable_flops(x, machine.flops, machine.bandwidth)
    (line,) = ax.loglog(x, y, color=color, label=f"{machine.name} roof")
    c = line.get_color()
    ax.axvline(machine.ridge, color=c, linestyle=":", linewidth=0.8)
    for dtype, flops in machine.ceilings:
        if flops < 0.95 * machine.flops:      # a lower ceiling: the roof for that dtype
            ax.loglog(x, attainable_flops(x, flops, machine.bandwidth), color=c,
                      linestyle="--", linewidth=0.9, label=f"{machine.name}: {dtype} ceiling")
    for p in points:
        ax.loglog(p.intensity, p.flops, "s" if p.label.startswith("prefill") else marker,
                  color=c)
        if annotate:
            ax.annotate(p.label, (p.intensity, p.flops), textcoords="offset points",
                        xytext=(4, -10), fontsize=7, color=c)
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("FLOP/s")
    ax.grid(True, which="both", linewidth=0.3)
    return ax


def roofline_figure(title: str, machines: Sequence[Machine],
                    points: dict[str, Sequence[Point]] | None = None,
                    intensity_range: tuple[float, float] = (0.1, 1e4)):
    """A figure with each machine's roof and its points (squares: prefill, circles: decode)."""
    fig, ax = figure(title, "arithmetic intensity (FLOP / byte)", "attained FLOP/s")
    for i, m in enumerate(machines):
        # Label the first machine's points only; the others repeat the same labels.
        plot_roofline(ax, m, (points or {}).get(m.name, ()), intensity_range, annotate=i == 0)
    ax.legend(fontsize=8)
    return fig


__all__ = [
    "plot_roofline", "roofline_figure",
]
