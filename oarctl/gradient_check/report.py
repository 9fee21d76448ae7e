"""The bench's printed table (also saved as OUTPUT.md) and its plot (OUTPUT.png): cosine per method with
its 95% interval."""
from __future__ import annotations

import math
from pathlib import Path

from oarctl.artifacts import write_bytes_atomically


def _number(value, digits: int = 3, signed: bool = False) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:+.{digits}f}" if signed else f"{value:.{digits}f}"


def _times(value: float) -> str:
    return _number(value, 2) + ("x" if not math.isnan(value) else "")


def markdown(columns: dict, header: list[str]) -> str:
    names = ["method", "cosine [95% CI]", "vs uniform [95% CI]", "corrected", "expected cosine",
             "effective batch", "split-half", "|g|^2", "seconds", "cost vs sampling", "pays"]
    lines = [*header, "", "| " + " | ".join(names) + " |", "|---|" + "---:|" * (len(names) - 1)]
    for i, method in enumerate(columns["method"]):
        c = {name: values[i] for name, values in columns.items()}
        difference = "—" if method == "uniform" else (
            f"{_number(c['vs_uniform'], signed=True)} [{_number(c['vs_uniform_low'], signed=True)}, "
            f"{_number(c['vs_uniform_high'], signed=True)}]")
        pays = "n/a" if c["pays"] is None else ("yes" if c["pays"] else "no")
        cells = [method, f"{_number(c['cosine'])} [{_number(c['cosine_low'])}, {_number(c['cosine_high'])}]",
                 difference, _number(c["corrected_cosine"]), _number(c["expected_cosine"]),
                 _times(c["effective_batch"]), _times(c["effective_batch_split"]),
                 f"{c['grad_sq_norm']:.4g}", f"{c['seconds']:.1f}", _number(c["cost_vs_sampling"], 2), pays]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(columns: dict, path: Path, title: str) -> None:
    """Cosine per method with its interval (matplotlib imported here: `oarctl --help` stays fast)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from oarctl.report.plots import figure_png

    methods = columns["method"]
    means = columns["cosine"]
    errors = [[m - low for m, low in zip(means, columns["cosine_low"])],
              [high - m for m, high in zip(means, columns["cosine_high"])]]
    figure, axes = plt.subplots(figsize=(6, 0.45 * len(methods) + 1.5))
    axes.errorbar(means, range(len(methods)), xerr=errors, fmt="o", capsize=3)
    axes.axvline(means[methods.index("uniform")], color="grey", linestyle="--", linewidth=1, label="uniform")
    axes.set(yticks=range(len(methods)), yticklabels=methods, xlabel="cosine of a batch gradient to the reference",
             title=title)
    axes.invert_yaxis()
    axes.grid(alpha=0.3, axis="x")
    axes.legend()
    figure.tight_layout()
    write_bytes_atomically(path, figure_png(figure))
