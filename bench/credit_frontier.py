"""The credit frontier: effective batch against the price of credit over sampling, every method, one
marker per policy, from `oarctl gradient-check` tables (issue 38, item 3).

    python bench/credit_frontier.py --base base/check.parquet [more.parquet ...] \
        --trained trained/check.parquet [...] -o docs/results/credit-frontier.png

Reads gradient-check Parquets (columns `method`, `effective_batch`, `cost_vs_sampling`, `vs_uniform_low`;
several per policy when the bench ran as parts, a method found twice keeps its first row); writes one PNG
(written atomically). A method pays for itself above the break-even line effective_batch - 1 = cost:
the extra samples its credit is worth cost more than the credit. Filled markers: the 95% interval of
`vs_uniform` is above 0 (the method is shown better than uniform); hollow: it is not. The shaded corner
is issue 38's target (effective batch >= 1.2x at cost <= 0.2x). The uniform row (1x at ~0 cost) is drawn
too: it is the origin every method is measured from. Prints the table it plotted.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as `python bench/credit_frontier.py` from a clone
    sys.path.insert(0, str(REPO))

from oarctl.errors import OarError  # noqa: E402

COLUMNS = ("method", "effective_batch", "cost_vs_sampling", "vs_uniform_low")
MARKERS = {"base": "o", "trained": "s"}
TARGET_BATCH, TARGET_COST = 1.2, 0.2  # issue 38's bar for credit that pays


def read_points(paths: list[Path]) -> list[dict]:
    """One dict per method (first table that has it wins) with the four columns; NaN costs are kept."""
    import pyarrow.parquet as pq

    points: dict[str, dict] = {}
    for path in paths:
        try:
            table = pq.read_table(path)
        except (OSError, ValueError) as error:
            raise OarError(f"{path}: not a readable Parquet ({error})") from error
        missing = [c for c in COLUMNS if c not in table.column_names]
        if missing:
            raise OarError(f"{path}: missing column(s) {', '.join(missing)}; expected an oarctl gradient-check table")
        for row in table.select(list(COLUMNS)).to_pylist():
            points.setdefault(row["method"], row)
    return list(points.values())


def shown_better(point: dict) -> bool:
    """The interval of the paired difference to uniform lies above 0 (uniform itself: no)."""
    low = point["vs_uniform_low"]
    return low is not None and not math.isnan(low) and low > 0


def plottable(point: dict) -> bool:
    return all(v is not None and not math.isnan(v) for v in (point["effective_batch"], point["cost_vs_sampling"]))


def _number_points(figure, axes, points: list[dict], numbers: dict[str, int]) -> None:
    """Each point gets its method's number; points within a few pixels of each other share one label
    ("3,7"), so no two labels print over each other where cheap methods crowd."""
    figure.canvas.draw()  # fixes the axes' transform
    clusters: list[tuple] = []  # (display x, display y, data point, numbers)
    for p in points:
        x, y = axes.transData.transform((p["cost_vs_sampling"], p["effective_batch"]))
        near = next((c for c in clusters if abs(c[0] - x) < 30 and abs(c[1] - y) < 9), None)
        if near:
            near[3].append(numbers[p["method"]])
        else:
            clusters.append((x, y, (p["cost_vs_sampling"], p["effective_batch"]), [numbers[p["method"]]]))
    for _, _, xy, found in clusters:
        axes.annotate(",".join(str(n) for n in sorted(found)), xy, xytext=(4, 3), textcoords="offset points",
                      fontsize=7)


def draw(policies: dict[str, list[dict]], title: str) -> bytes:
    """The PNG bytes: one panel per policy, the break-even line, the target corner, labelled points."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from oarctl.report.plots import figure_png

    figure, panels = plt.subplots(1, len(policies), figsize=(5.2 * len(policies), 5.6), sharey=True, squeeze=False)
    shown = [p for ps in policies.values() for p in ps if plottable(p)]
    right = max([TARGET_COST * 2] + [p["cost_vs_sampling"] for p in shown]) * 1.3
    top = max([TARGET_BATCH + 0.3] + [p["effective_batch"] for p in shown]) + 0.1
    bottom = min([0.95] + [p["effective_batch"] for p in shown]) - 0.05
    costs = np.linspace(0, right, 400)
    for axes, (policy, points) in zip(panels[0], policies.items()):
        axes.plot(costs, 1 + costs, color="black", linewidth=1, label="break-even: batch - 1 = cost")
        axes.fill_between([0, TARGET_COST], TARGET_BATCH, top, color="tab:green", alpha=0.12,
                          label="target: >= 1.2x at <= 0.2x")
        axes.axhline(1, color="grey", linestyle="--", linewidth=0.8)
        for point in filter(plottable, points):
            better = shown_better(point)
            axes.plot(point["cost_vs_sampling"], point["effective_batch"], MARKERS.get(policy, "D"),
                      color="tab:blue" if better else "tab:red", markerfacecolor=None if better else "none")
        axes.set_xscale("symlog", linthresh=0.1)  # the cheap methods crowd near 0; the costly ones reach 2x and more
        axes.set(xlim=(0, right), ylim=(bottom, top), xlabel="credit seconds / sampling seconds (same rollouts)",
                 title=f"{policy} policy")
        axes.grid(alpha=0.3)
    panels[0][0].set_ylabel("effective batch vs uniform (x)")
    numbers: dict[str, int] = {}
    for p in (p for ps in policies.values() for p in ps):
        numbers.setdefault(p["method"], len(numbers) + 1)
    figure.tight_layout(rect=(0, 0.1 + 0.035 * (len(numbers) // 6), 1, 0.95))
    for axes, points in zip(panels[0], policies.values()):
        _number_points(figure, axes, [p for p in points if plottable(p)], numbers)
    key = [f"{n} {m}" for m, n in numbers.items()]
    figure.text(0.02, 0.02, "\n".join("    ".join(key[i:i + 6]) for i in range(0, len(key), 6)), fontsize=7,
                va="bottom", family="monospace")
    panels[0][0].legend(fontsize=7, loc="upper right")
    figure.suptitle(title + "   (filled: vs uniform 95% interval above 0)", fontsize=9)
    return figure_png(figure)


def table_text(policies: dict[str, list[dict]]) -> str:
    lines = ["| policy | method | effective batch | cost vs sampling | vs uniform low | pays | shown better |",
             "|---|---|---:|---:|---:|---|---|"]
    for policy, points in policies.items():
        for p in points:
            pays = plottable(p) and p["effective_batch"] - 1 >= p["cost_vs_sampling"]
            lines.append(f"| {policy} | {p['method']} | {p['effective_batch']:.2f}x | {p['cost_vs_sampling']:.2f} | "
                         f"{p['vs_uniform_low'] if p['vs_uniform_low'] is not None else math.nan:+.3f} | "
                         f"{'yes' if pays else 'no'} | {'yes' if shown_better(p) else 'no'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", nargs="+", type=Path, default=[], help="gradient-check tables of the base policy")
    parser.add_argument("--trained", nargs="+", type=Path, default=[], help="... of a trained policy")
    parser.add_argument("-o", "--output", type=Path, required=True, help="PNG to write")
    parser.add_argument("--title", default="credit frontier (oarctl gradient-check)")
    args = parser.parse_args(argv)
    from oarctl.artifacts import write_bytes_atomically

    try:
        if not (args.base or args.trained):
            raise OarError("give --base and/or --trained gradient-check tables")
        policies = {name: read_points(paths) for name, paths in (("base", args.base), ("trained", args.trained))
                    if paths}
        write_bytes_atomically(args.output, draw(policies, args.title))
    except OarError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(table_text(policies))
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
