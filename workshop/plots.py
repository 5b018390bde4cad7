"""Figure conventions shared by the notebooks.

Helpers build ``matplotlib.figure.Figure`` objects directly instead of going through
``pyplot``: such a figure is shown exactly once when it is a cell's last expression, in
Jupyter and in marimo alike (a pyplot figure is also auto-shown by Jupyter's inline backend,
so it would appear twice), and it never leaks into a later cell. Every figure gets a title,
axis labels with units, and a legend when it has more than one series.
"""

from __future__ import annotations

from matplotlib.figure import Figure

_DISPLAY_READY = False


def _enable_jupyter_png() -> None:
    # IPython draws a Figure as PNG only if a formatter is registered for it; the inline
    # backend registers one for pyplot figures, not reliably for bare Figures, so do it here.
    global _DISPLAY_READY
    if _DISPLAY_READY:
        return
    _DISPLAY_READY = True
    from workshop.ui import frontend
    if frontend() != "jupyter":
        return
    from IPython import get_ipython
    from IPython.core.pylabtools import print_figure

    png = get_ipython().display_formatter.formatters["image/png"]
    png.for_type(Figure, lambda fig: print_figure(fig, "png", bbox_inches="tight", dpi=110))


def new_figure(size: tuple[float, float]) -> Figure:
    """An empty figure that a notebook shows once, in Jupyter and marimo alike (for grids of
    axes: ``new_figure(size).subplots(2, 3)``)."""
    _enable_jupyter_png()
    return Figure(figsize=size, layout="constrained")


def figure(title: str, xlabel: str, ylabel: str, size: tuple[float, float] = (7.5, 4.2)):
    """A new (figure, axes) pair with title, labels and a light grid."""
    fig = new_figure(size)
    ax = fig.subplots()
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    return fig, ax
