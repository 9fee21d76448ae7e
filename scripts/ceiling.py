"""The analysis of docs/results.md's pre-registered credit experiment: how much of the ceiling does a method capture?

    python scripts/ceiling.py runs/credit                  # every method found, against uniform and truth
    python scripts/ceiling.py runs/credit --sesoi 1.0 --baseline uniform --ceiling truth
    python scripts/ceiling.py runs/credit-local --ceiling none    # no ceiling among the runs

Reads OUT/<method>-s<seed>/metrics.jsonl and takes the on-policy accuracy of each run (the mean training
reward over steps >= 1, as `oarctl compare`). Only seeds where every method has a finished run count
(pairs stay whole). Per method, in points:
- the paired difference to the baseline: mean, 95% Student-t interval, seeds won;
- the fraction of the ceiling captured, F = mean(method - baseline) / mean(ceiling - baseline), with a
  95% paired-bootstrap interval (seeds resampled with replacement, 10,000 times, numpy seed 0);
- the equivalence test against the baseline (two one-sided t-tests at 5%): equivalent when the 90%
  interval lies inside [-SESOI, +SESOI].
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import numpy as np

RUN = re.compile(r"^(?P<method>.+)-s(?P<seed>\d+)$")


def on_policy(run_dir: Path) -> float | None:
    """The run's on-policy accuracy, or None until it has finished (its final evaluation is written)."""
    from oarctl.report.run_report import read_metrics
    from oarctl.report.compare import on_policy_accuracy

    if not (run_dir / "metrics.jsonl").is_file():
        return None
    lines = read_metrics(run_dir)
    steps = [x for x in lines if x.get("kind") == "eval"]
    if not steps or steps[-1]["after_steps"] == 0:
        return None  # only the base evaluated: the run is not finished
    return on_policy_accuracy(lines)


def collect(out: Path) -> dict[str, dict[int, float]]:
    """{method: {seed: on-policy accuracy}} of the finished runs under `out`."""
    runs: dict[str, dict[int, float]] = {}
    for path in sorted(p for p in out.iterdir() if p.is_dir()):
        match = RUN.match(path.name)
        value = on_policy(path) if match else None
        if value is not None:
            runs.setdefault(match["method"], {})[int(match["seed"])] = value
    return runs


def t_quantile(probability: float, degrees: int) -> float:
    """Student's t quantile for probability > 0.5: bisection on the CDF, 0.5 + the integral of the
    density from 0 (Simpson's rule, 2,000 panels; agrees with the tables to 1e-6)."""
    import math

    scale = math.exp(math.lgamma((degrees + 1) / 2) - math.lgamma(degrees / 2)) / math.sqrt(degrees * math.pi)

    def cdf(x: float) -> float:
        grid = np.linspace(0.0, x, 2001)
        density = scale * (1 + grid ** 2 / degrees) ** (-(degrees + 1) / 2)
        h = x / 2000
        return 0.5 + h / 3 * (density[0] + density[-1] + 4 * density[1:-1:2].sum() + 2 * density[2:-1:2].sum())

    low, high = 0.0, 50.0
    for _ in range(60):
        middle = (low + high) / 2
        low, high = (middle, high) if cdf(middle) < probability else (low, middle)
    return (low + high) / 2


def paired(differences: np.ndarray, level: float) -> tuple[float, float, float]:
    """(mean, low, high) of a two-sided Student-t interval at `level`."""
    mean, spread = float(differences.mean()), float(differences.std(ddof=1))
    half = t_quantile(0.5 + level / 2, differences.size - 1) * spread / np.sqrt(differences.size)
    return mean, mean - half, mean + half


def ceiling_fraction(method: np.ndarray, baseline: np.ndarray, ceiling: np.ndarray,
                     resamples: int = 10_000, seed: int = 0) -> tuple[float, float, float]:
    """F = mean(method - baseline) / mean(ceiling - baseline) and its 95% paired-bootstrap interval."""
    gain, headroom = method - baseline, ceiling - baseline
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, gain.size, size=(resamples, gain.size))
    fractions = gain[picks].mean(axis=1) / headroom[picks].mean(axis=1)
    low, high = np.percentile(fractions, [2.5, 97.5])
    return float(gain.mean() / headroom.mean()), float(low), float(high)


def report(runs: dict[str, dict[int, float]], baseline: str, ceiling: str | None, sesoi: float) -> str:
    """The table; `ceiling` None leaves out the fraction of the ceiling (a dash in its column)."""
    for name in (baseline, ceiling) if ceiling else (baseline,):
        if name not in runs:
            raise SystemExit(f"error: no finished run of {name!r} (directories <method>-s<seed> with metrics.jsonl)")
    seeds = sorted(set.intersection(*(set(by_seed) for by_seed in runs.values())))
    if len(seeds) < 2:
        raise SystemExit(f"error: {len(seeds)} seed(s) with every method finished; need 2")
    values = {m: 100 * np.array([by_seed[s] for s in seeds]) for m, by_seed in runs.items()}  # points
    lines = [f"seeds with every method finished: {len(seeds)} ({', '.join(map(str, seeds))})", "",
             f"| method | on-policy accuracy | - {baseline} (95% CI) | seeds won | fraction of the ceiling (95% "
             f"bootstrap) | 90% CI | equivalent within +-{sesoi:g} |", "|---|---:|---|---:|---|---|---|"]
    for method in sorted(values):
        if method == baseline:
            lines.append(f"| {method} | {values[method].mean():.1f} | — | — | {'0' if ceiling else '—'} | — | — |")
            continue
        difference = values[method] - values[baseline]
        mean, low, high = paired(difference, 0.95)
        _, low90, high90 = paired(difference, 0.90)
        fraction = ceiling_fraction(values[method], values[baseline], values[ceiling]) if ceiling else None
        captured = f"{fraction[0]:.2f} [{fraction[1]:.2f}, {fraction[2]:.2f}]" if fraction else "—"
        equivalent = "yes" if -sesoi < low90 and high90 < sesoi else "no"
        lines.append(f"| {method} | {values[method].mean():.1f} | {mean:+.2f} [{low:+.2f}, {high:+.2f}] | "
                     f"{int((difference > 0).sum())}/{len(seeds)} | {captured} | [{low90:+.2f}, {high90:+.2f}] | {equivalent} |")
    if "truth_shuffled" in values and ceiling in values:
        mean, low, high = paired(values[ceiling] - values["truth_shuffled"], 0.95)
        lines += ["", f"{ceiling} - truth_shuffled: {mean:+.2f} [{low:+.2f}, {high:+.2f}] points (95% CI)"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--baseline", default="uniform")
    parser.add_argument("--ceiling", default="truth", help="the ceiling method, or 'none' (no fraction column)")
    parser.add_argument("--sesoi", type=float, default=1.0, help="smallest effect of interest, points")
    args = parser.parse_args(argv)
    if not args.out.is_dir():
        raise SystemExit(f"error: {args.out} is not a directory")
    text = report(collect(args.out), args.baseline, None if args.ceiling == "none" else args.ceiling, args.sesoi)
    (args.out / "ceiling.md").write_text(text)
    sys.stdout.write(text)


if __name__ == "__main__":
    main()
