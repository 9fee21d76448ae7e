"""PNG plots with matplotlib's Agg backend (no display needed); each function returns PNG bytes.

matplotlib is imported inside the functions: `oarctl --help` and every stage stay free of it.
"""
from __future__ import annotations

import io


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as pyplot
    return pyplot


def _style(axes, title: str, xlabel: str) -> None:
    from matplotlib.ticker import MaxNLocator

    axes.set_title(title, fontsize=10)
    axes.set_xlabel(xlabel, fontsize=9)
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
    axes.grid(alpha=0.3)


def figure_png(figure, dpi: int = 120, **savefig) -> bytes:
    """The figure as PNG bytes, then closed. No version stamp in the file: the same figure drawn by another
    matplotlib gives the same bytes, so a committed PNG changes only when its picture does."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi, metadata={"Software": None}, **savefig)
    _pyplot().close(figure)
    return buffer.getvalue()


def _png(figure) -> bytes:
    return figure_png(figure, dpi=100, bbox_inches="tight")


def curve_png(title: str, series: dict[str, tuple[list, list]], xlabel: str = "step") -> bytes:
    """One small line plot; `series` maps a legend label to (x values, y values)."""
    pyplot = _pyplot()
    figure, axes = pyplot.subplots(figsize=(4.6, 3.0))
    for label, (xs, ys) in series.items():
        axes.plot(xs, ys, marker="o" if len(xs) < 30 else None, markersize=3, label=label)
    _style(axes, title, xlabel)
    if len(series) > 1:
        axes.legend(fontsize=8)
    return _png(figure)


def band_png(title: str, bands: dict[str, tuple[list, list, list, list]], xlabel: str = "step") -> bytes:
    """Mean lines with shaded min-max bands; `bands` maps a label to (x, mean, low, high)."""
    pyplot = _pyplot()
    figure, axes = pyplot.subplots(figsize=(5.5, 3.4))
    for label, (xs, mean, low, high) in bands.items():
        (line,) = axes.plot(xs, mean, marker="o" if len(xs) < 30 else None, markersize=3, label=label)
        axes.fill_between(xs, low, high, color=line.get_color(), alpha=0.2)
    _style(axes, title, xlabel)
    axes.legend(fontsize=8)
    return _png(figure)
