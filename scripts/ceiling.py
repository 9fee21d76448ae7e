"""The analysis of docs/results.md's pre-registered credit experiment: how much of the ceiling does a method capture?

    python scripts/ceiling.py runs/credit                  # every method found, against uniform and truth
    python scripts/ceiling.py runs/credit --sesoi 1.0 --baseline uniform --ceiling truth
    python scripts/ceiling.py runs/credit-local --ceiling none    # no ceiling among the runs
    python scripts/ceiling.py docs/results/credit --allow-mixed   # kept runs made before provenance was recorded
    python scripts/ceiling.py runs/screen --seeds 100-109         # one seed set -> runs/screen/ceiling-s100-109.md
    python scripts/ceiling.py runs/credit --figures               # + forest.png and curves.png beside ceiling.md
    python scripts/ceiling.py runs/credit --metric heldout_greedy # -> ceiling-heldout_greedy.md
    python scripts/ceiling.py runs/wide --predict truth=2.09,ktae=0.82 --control uniform_1.5x=1.5  # + the bench's prediction

Reads OUT/<method>-s<seed>/{config.yaml,metrics.jsonl} and takes the on-policy accuracy of each run (the
mean training reward over steps >= 1, as `oarctl compare`). A run counts once it has finished: its metrics
hold every step its config.yaml's run.steps asked for. Only seeds where every method has a finished run
count (pairs stay whole). The runs counted must share machine and versions (oarctl/provenance.py:
config.yaml and the stage manifests record them); runs that differ, or recorded none, are refused unless
--allow-mixed. Per method, in points:
- the paired difference to the baseline: mean, 95% Student-t interval, seeds won; beside it the
  Hodges-Lehmann estimate (the median of the Walsh averages (d_i + d_j) / 2, i <= j) and the two-sided
  p of Wilcoxon's signed-rank test, exact (zero differences dropped, tied |d| given their mean rank, the
  p from the exact distribution of the signed-rank sum over the 2^n sign flips of those ranks);
- the fraction of the ceiling captured, F = mean(method - baseline) / mean(ceiling - baseline), with a
  95% paired-bootstrap interval (seeds resampled with replacement, 10,000 times, numpy seed 0), reported
  only when the ceiling's own 95% interval (ceiling - baseline) excludes 0: a ratio over a headroom
  that may be nothing says nothing;
- the equivalence test against the baseline (two one-sided t-tests at 5%): equivalent when the 90%
  interval lies inside [-SESOI, +SESOI].
- with a ceiling, the half-ceiling contrast (method - baseline) - 0.5 x (ceiling - baseline), paired by seed:
  above 0, the method captured more than half of the ceiling.
--metric scores a run by something else than its on-policy accuracy (the same table and tests):
heldout_greedy / heldout_sampled, the held-out accuracy after the last step (eval greedy_accuracy / avg@k);
equal_time, the on-policy accuracy over the steps that fit in the baseline's wall-clock (at_equal_time says
how; the seconds come from the runs' manifests or their kept seconds.json, scripts/keep_seconds.py).
--predict truth=2.09,ktae=0.82 --control uniform_1.5x=1.5 adds the bench's prediction of training beside the
measured gains: a method worth k batches by the gradient bench should gain what k x the samples gain, and the
control (the baseline with `factor` x the samples) measures that, so predicted gain = (k - 1) / (factor - 1) x
mean(control - baseline); per method, measured gain with its 95% interval and whether the prediction lies
inside it, and whether the measured gains fall in the predicted order (descriptive: no test).
--figures also writes forest[-sSEEDS].png (each method's paired difference to the baseline with its 95%
interval) and curves[-sSEEDS].png (the mean training reward per step of each method, 95% band over seeds).
Errors (no such folder, a run without config.yaml, too few seeds, refused provenance) are one line,
`error: ...`, exit code 2.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as `python scripts/ceiling.py` from a clone
    sys.path.insert(0, str(REPO))

from oarctl.report.stats import hodges_lehmann, signed_rank_test, t_interval, t_quantile  # noqa: E402

RUN = re.compile(r"^(?P<method>.+)-s(?P<seed>\d+)$")
# --metric: what a run is scored by (the column's name)
METRICS = {"on_policy": "on-policy accuracy", "heldout_greedy": "held-out greedy accuracy",
           "heldout_sampled": "held-out sampled accuracy", "equal_time": "on-policy accuracy at equal time"}


class Refused(Exception):
    """A one-line reason the analysis cannot run (main prints it as `error: ...`, exit code 2)."""


def configured_steps(run_dir: Path) -> int:
    """run.steps of the run's config.yaml (the schema's default when the file leaves it out), at least 2."""
    from oarctl.errors import OarError
    from oarctl.report.compare import configured_steps as recorded_steps

    try:
        steps = recorded_steps(run_dir)
    except OarError as error:
        raise Refused(str(error)) from None
    if steps < 2:
        raise Refused(f"{run_dir / 'config.yaml'}: run.steps must be an integer >= 2 (steps >= 1 give the "
                      f"on-policy accuracy)")
    return steps


def on_policy(run_dir: Path) -> float | None:
    """The run's on-policy accuracy, or None until it has finished: every step 0 .. run.steps - 1 recorded."""
    from oarctl.report.compare import on_policy_accuracy
    from oarctl.report.run_report import read_metrics

    if not (run_dir / "metrics.jsonl").is_file():
        return None
    steps = configured_steps(run_dir)
    lines = read_metrics(run_dir)
    recorded = {x.get("step") for x in lines if x.get("kind") == "step"}
    if not set(range(steps)) <= recorded:
        return None  # still training (or stopped early): not finished
    return on_policy_accuracy([x for x in lines if x.get("kind") != "step" or x.get("step") < steps])


def collect(out: Path) -> dict[str, dict[int, tuple[float, Path]]]:
    """{method: {seed: (on-policy accuracy, run folder)}} of the finished runs under `out`."""
    runs: dict[str, dict[int, tuple[float, Path]]] = {}
    for path in sorted(p for p in out.iterdir() if p.is_dir()):
        match = RUN.match(path.name)
        value = on_policy(path) if match else None
        if value is not None:
            runs.setdefault(match["method"], {})[int(match["seed"])] = (value, path)
    return runs


def heldout(run_dir: Path, sampled: bool) -> float | None:
    """The held-out accuracy after the run's last step, greedy or sampled (eval avg@k), or None when the
    run has not finished or its final evaluation did not record it."""
    from oarctl.report.run_report import read_metrics, sampled_key

    if on_policy(run_dir) is None:
        return None
    lines, steps = read_metrics(run_dir), configured_steps(run_dir)
    key = sampled_key(lines) if sampled else "eval/greedy_accuracy"
    final = [x for x in lines if x.get("kind") == "eval" and x.get("after_steps") == steps and key in x]
    return float(final[-1][key]) if final else None


def seconds_a_step(run_dir: Path) -> float:
    """The run's wall seconds per step, every stage, from its step folders' manifests or its kept seconds.json."""
    from oarctl.report.compare import complete_steps, step_stage_seconds

    configured = configured_steps(run_dir)
    steps = complete_steps(step_stage_seconds(run_dir), configured)
    if steps is None:
        raise Refused(f"{run_dir}: no stage seconds for each of its {configured} steps "
                      f"(scripts/keep_seconds.py keeps them beside a kept run)")
    return sum(sum(step.values()) for step in steps) / len(steps)


def at_equal_time(found: dict[str, dict[int, tuple[float, Path]]], baseline: str) -> tuple[dict, list[str]]:
    """Each run's on-policy accuracy over the steps whose policy the baseline's wall-clock reaches, and the
    lines that say how. A method's price is the median over its runs of seconds a step; the policy of
    step i exists after i steps, so the baseline's last scored policy (step S-1) comes after (S-1) x its
    price, and a method costing c a step reaches b = (S-1) x c_baseline / c steps, at most S-1 (a cheaper
    method has no steps beyond its run's). Its score is the mean training reward over steps 1 .. b, the
    last one counted for the fraction of it that fits: (r_1 + ... + r_k + (b - k) r_k+1) / b, k = floor(b),
    so that a method 2% dearer does not lose a whole step."""
    from oarctl.report.run_report import read_metrics, step_series

    if baseline not in found:
        raise Refused(f"no finished run of {baseline!r}")
    price = {method: float(np.median([seconds_a_step(path) for _, path in by_seed.values()]))
             for method, by_seed in found.items()}
    last = {configured_steps(path) - 1 for by_seed in found.values() for _, path in by_seed.values()}
    if len(last) != 1:
        raise Refused(f"--metric equal_time: the runs were configured for different step counts ({sorted(last)})")
    last = last.pop()
    lines = [f"equal time: {baseline}'s last scored policy (step {last}) comes after {last} x "
             f"{price[baseline]:.1f} s; each method counts the steps that fit (seconds a step, median over its runs):"]
    values = {}
    for method, by_seed in sorted(found.items()):
        reach = min(float(last), last * price[baseline] / price[method])
        if reach < 1:
            raise Refused(f"--metric equal_time: {method} reaches no step in {baseline}'s time")
        weights = np.clip(reach - np.arange(last), 0.0, 1.0)  # of steps 1 .. last: 1, ..., 1, the fraction, 0, ...
        lines.append(f"- {method}: {price[method]:.1f} s a step, {reach:.2f} steps"
                     + (" (capped: its runs have no later steps)" if price[method] < price[baseline] else ""))
        values[method] = {}
        for seed, (_, path) in by_seed.items():
            rewards = dict(zip(*step_series(read_metrics(path), "verify/reward_mean")))
            values[method][seed] = float(np.dot(weights, [rewards[step] for step in range(1, last + 1)]) / reach), path
    return values, lines + [""]


def scored(found: dict[str, dict[int, tuple[float, Path]]], metric: str, baseline: str) -> tuple[dict, list[str]]:
    """The finished runs scored by `metric` instead of their on-policy accuracy (runs without it dropped), and
    the lines that explain the score."""
    if metric == "on_policy":
        return found, []
    if metric == "equal_time":
        return at_equal_time(found, baseline)
    values = {method: {seed: (heldout(path, metric == "heldout_sampled"), path) for seed, (_, path) in by_seed.items()}
              for method, by_seed in found.items()}
    return {method: {seed: run for seed, run in by_seed.items() if run[0] is not None}
            for method, by_seed in values.items()}, []


def ceiling_fraction(method: np.ndarray, baseline: np.ndarray, ceiling: np.ndarray,
                     resamples: int = 10_000, seed: int = 0) -> tuple[float, float, float]:
    """F = mean(method - baseline) / mean(ceiling - baseline) and its 95% paired-bootstrap interval."""
    gain, headroom = method - baseline, ceiling - baseline
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, gain.size, size=(resamples, gain.size))
    fractions = gain[picks].mean(axis=1) / headroom[picks].mean(axis=1)
    low, high = np.percentile(fractions, [2.5, 97.5])
    return float(gain.mean() / headroom.mean()), float(low), float(high)


def _fraction_cell(values: dict, method: str, baseline: str, ceiling: str | None, reported: bool) -> str:
    if not ceiling:
        return "—"
    if not reported:
        return "not reported"
    fraction = ceiling_fraction(values[method], values[baseline], values[ceiling])
    return f"{fraction[0]:.2f} [{fraction[1]:.2f}, {fraction[2]:.2f}]"


def _row(values: dict, method: str, baseline: str, ceiling: str | None, reported: bool, sesoi: float) -> str:
    difference = values[method] - values[baseline]
    mean, low, high = t_interval(difference, 0.95)
    _, low90, high90 = t_interval(difference, 0.90)
    _, p = signed_rank_test(difference)
    equivalent = "yes" if -sesoi < low90 and high90 < sesoi else "no"
    return (f"| {method} | {values[method].mean():.1f} | {mean:+.2f} [{low:+.2f}, {high:+.2f}] | "
            f"{hodges_lehmann(difference):+.2f} | {p:.3g} | {int((difference > 0).sum())}/{difference.size} | "
            f"{_fraction_cell(values, method, baseline, ceiling, reported)} | [{low90:+.2f}, {high90:+.2f}] | "
            f"{equivalent} |")


def _ceiling_line(values: dict, baseline: str, ceiling: str | None) -> tuple[list[str], bool]:
    """The ceiling's own interval, and whether the fraction of it may be reported (the interval excludes 0)."""
    if not ceiling:
        return [], False
    mean, low, high = t_interval(values[ceiling] - values[baseline], 0.95)
    reported = low > 0 or high < 0
    verdict = "excludes 0: the fraction of it is reported" if reported else \
        "includes 0: the fraction of it is not reported (a ratio over a headroom that may be nothing)"
    line = f"ceiling {ceiling} - {baseline}: {mean:+.2f} [{low:+.2f}, {high:+.2f}] points (95% CI), {verdict}"
    return [line, ""], reported


def report(runs: dict[str, dict[int, float]], baseline: str, ceiling: str | None, sesoi: float,
           label: str = METRICS["on_policy"], prediction: tuple[tuple[str, float], dict[str, float]] | None = None) -> str:
    """The table; `ceiling` None leaves out the fraction of the ceiling (a dash in its column); `prediction`
    ((control, factor), {method: bench k}) adds the bench's prediction beside the measured gains."""
    for name in (baseline, ceiling) if ceiling else (baseline,):
        if name not in runs:
            raise Refused(f"no finished run of {name!r} (directories <method>-s<seed> with config.yaml and "
                          f"metrics.jsonl)")
    seeds = sorted(set.intersection(*(set(by_seed) for by_seed in runs.values())))
    if len(seeds) < 2:
        raise Refused(f"{len(seeds)} seed(s) with every method finished; need 2")
    values = {m: 100 * np.array([by_seed[s] for s in seeds]) for m, by_seed in runs.items()}  # points
    ceiling_lines, reported = _ceiling_line(values, baseline, ceiling)
    lines = [f"seeds with every method finished: {len(seeds)} ({', '.join(map(str, seeds))})", "", *ceiling_lines,
             f"| method | {label} | - {baseline}: mean (95% CI) | Hodges-Lehmann | Wilcoxon p | seeds won | "
             f"fraction of the ceiling (95% bootstrap) | 90% CI | equivalent within +-{sesoi:g} |",
             "|---|---:|---|---:|---:|---:|---|---|---|"]
    for method in sorted(values):
        if method == baseline:
            zero = "0" if reported else "—"
            lines.append(f"| {method} | {values[method].mean():.1f} | — | — | — | — | {zero} | — | — |")
            continue
        lines.append(_row(values, method, baseline, ceiling, reported, sesoi))
    if ceiling and len(values) > 2:
        lines += ["", f"half-ceiling contrast, (method - {baseline}) - 0.5 x ({ceiling} - {baseline}), points (95% CI):"]
        for method in sorted(set(values) - {baseline, ceiling}):
            mean, low, high = t_interval(values[method] - values[baseline] - 0.5 * (values[ceiling] - values[baseline]), 0.95)
            lines.append(f"- {method}: {mean:+.2f} [{low:+.2f}, {high:+.2f}]")
    if "truth_shuffled" in values and ceiling in values:
        mean, low, high = t_interval(values[ceiling] - values["truth_shuffled"], 0.95)
        lines += ["", f"{ceiling} - truth_shuffled: {mean:+.2f} [{low:+.2f}, {high:+.2f}] points (95% CI)"]
    if prediction:
        lines += bench_prediction(values, baseline, *prediction)
    return "\n".join(lines) + "\n"


def bench_prediction(values: dict[str, np.ndarray], baseline: str, control: tuple[str, float],
                     batches: dict[str, float]) -> list[str]:
    """The bench's predicted gain of each method beside its measured one (points), and the verdict lines."""
    name, factor = control
    for method in (name, *batches):
        if method not in values:
            raise Refused(f"--predict/--control: no finished run of {method!r} among the seeds counted")
    per_batch = (values[name] - values[baseline]).mean() / (factor - 1)
    lines = ["", f"the bench's prediction: predicted gain = (k - 1) / ({factor:g} - 1) x ({name} - {baseline}) = "
                 f"(k - 1) x {per_batch:+.2f} points",
             f"| method | bench k | predicted - {baseline} | measured - {baseline} (95% CI) | prediction inside |",
             "|---|---:|---:|---|---|"]
    predicted, measured, inside = {}, {}, {}
    for method, k in sorted(batches.items(), key=lambda item: -item[1]):
        predicted[method] = (k - 1) * per_batch
        measured[method], low, high = t_interval(values[method] - values[baseline], 0.95)
        inside[method] = low <= predicted[method] <= high
        lines.append(f"| {method} | {k:.2f} | {predicted[method]:+.2f} | {measured[method]:+.2f} [{low:+.2f}, "
                     f"{high:+.2f}] | {'yes' if inside[method] else 'no'} |")
    order = sorted(batches, key=lambda m: -predicted[m]) == sorted(batches, key=lambda m: -measured[m])
    lines += ["", f"measured gains in the predicted order: {'yes' if order else 'no'}; every prediction inside its "
                  f"interval: {'yes' if all(inside.values()) else 'no'} -> the bench "
                  f"{'predicts' if order and all(inside.values()) else 'does not predict'} training here"]
    return lines


def named_numbers(text: str, option: str) -> dict[str, float]:
    """`truth=2.09,ktae=0.82` -> {"truth": 2.09, "ktae": 0.82}, or a one-line refusal naming the option."""
    refusal = Refused(f"{option}: expected METHOD=NUMBER[,METHOD=NUMBER...], got {text!r}")
    numbers = {}
    for part in filter(None, text.split(",")):
        name, equals, number = part.partition("=")
        try:
            numbers[name.strip()] = float(number)
        except ValueError:
            raise refusal from None
        if not equals or not name.strip():
            raise refusal
    if not numbers:
        raise refusal
    return numbers


def prediction_options(predict: str | None, control: str | None) -> tuple[tuple[str, float], dict[str, float]] | None:
    """--predict and --control read: ((control, factor), {method: bench k}), or None when neither is given."""
    if (predict is None) != (control is None):
        raise Refused("--predict and --control go together (the control measures what more samples gain)")
    if predict is None:
        return None
    controls = named_numbers(control, "--control")
    if len(controls) != 1 or min(controls.values()) <= 1:
        raise Refused(f"--control: expected one METHOD=FACTOR with FACTOR above 1, got {control!r}")
    return next(iter(controls.items())), named_numbers(predict, "--predict")


def seed_set(text: str) -> set[int]:
    """`100-109` or `100,103,107` (or both, comma-separated) -> the seeds."""
    seeds: set[int] = set()
    try:
        for part in filter(None, text.split(",")):
            first, _, last = part.partition("-")
            seeds |= set(range(int(first), int(last or first) + 1))
    except ValueError:
        raise Refused(f"--seeds: expected FIRST-LAST or a comma-separated list of seeds, got {text!r}") from None
    if not seeds:
        raise Refused(f"--seeds: no seed in {text!r}")
    return seeds


def analyse(out: Path, baseline: str, ceiling: str | None, sesoi: float, allow_mixed: bool,
            seeds: set[int] | None = None, metric: str = "on_policy",
            prediction: tuple[tuple[str, float], dict[str, float]] | None = None) -> tuple[str, dict[str, dict[int, Path]]]:
    """The report of OUT's finished runs (of `seeds` only, when given), after checking they share machine
    and versions (its last line says on what they ran), and the runs it counted: {method: {seed: folder}},
    the seeds where every method finished."""
    from oarctl.errors import OarError
    from oarctl.provenance import check_runs

    if not out.is_dir():
        raise Refused(f"{out}: not a directory")
    found, notes = scored(finished_runs(out, seeds), metric, baseline)
    accuracies = {method: {seed: value for seed, (value, _) in by_seed.items()} for method, by_seed in found.items()}
    text = "\n".join(notes) + report(accuracies, baseline, ceiling, sesoi, METRICS[metric], prediction)
    common = sorted(set.intersection(*(set(by_seed) for by_seed in found.values())))
    counted = {method: {seed: by_seed[seed][1] for seed in common} for method, by_seed in found.items()}
    try:
        where = check_runs([path for by_seed in counted.values() for path in by_seed.values()], allow_mixed)
    except OarError as error:
        raise Refused(str(error)) from None
    return text + f"\n{where}\n", counted


def finished_runs(out: Path, seeds: set[int] | None = None) -> dict[str, dict[int, tuple[float, Path]]]:
    """collect(out), of `seeds` only when given (methods left without a run dropped)."""
    found = {method: {seed: run for seed, run in by_seed.items() if seeds is None or seed in seeds}
             for method, by_seed in collect(out).items()}
    return {method: by_seed for method, by_seed in found.items() if by_seed}


def _reward_curves(runs: dict[str, dict[int, Path]]) -> dict[str, np.ndarray]:
    """{method: (seeds, steps) training reward in points}, the seeds in the same order for every method."""
    from oarctl.report.run_report import read_metrics

    curves = {}
    for method, by_seed in runs.items():
        per_seed = []
        for path in by_seed.values():
            rewards = {x["step"]: x["verify/reward_mean"] for x in read_metrics(path) if x.get("kind") == "step"}
            per_seed.append([100 * rewards[step] for step in range(configured_steps(path))])
        curves[method] = np.array(per_seed)
    return curves


def _forest(curves: dict[str, np.ndarray], baseline: str) -> bytes:
    """Each method's paired difference to the baseline in on-policy accuracy (steps >= 1), 95% interval."""
    import matplotlib.pyplot as plt

    from oarctl.report.plots import figure_png

    accuracy = {m: curve[:, 1:].mean(axis=1) for m, curve in curves.items()}
    others = sorted(set(curves) - {baseline})
    means, lows, highs = zip(*(t_interval(accuracy[m] - accuracy[baseline], 0.95) for m in others))
    figure, axes = plt.subplots(figsize=(6.5, 0.5 * len(others) + 1.6))
    axes.errorbar(means, range(len(others)), xerr=[np.subtract(means, lows), np.subtract(highs, means)], fmt="o",
                  capsize=3)
    axes.axvline(0, color="grey", linestyle="--", linewidth=1)
    axes.set(yticks=range(len(others)), yticklabels=others, title=f"paired differences, {len(accuracy[baseline])} seeds",
             xlabel=f"on-policy accuracy - {baseline}, points (95% CI)")
    axes.invert_yaxis()
    axes.grid(alpha=0.3, axis="x")
    figure.tight_layout()
    return figure_png(figure)


def _curves(curves: dict[str, np.ndarray]) -> bytes:
    """The mean training reward per step of each method, with a 95% Student-t band over seeds."""
    import matplotlib.pyplot as plt

    from oarctl.report.plots import figure_png

    figure, axes = plt.subplots(figsize=(6.5, 4))
    for method, curve in sorted(curves.items()):
        n, steps = curve.shape
        mean = curve.mean(axis=0)
        half = t_quantile(0.975, n - 1) * curve.std(axis=0, ddof=1) / np.sqrt(n)
        axes.plot(range(steps), mean, label=method)
        axes.fill_between(range(steps), mean - half, mean + half, alpha=0.2)
    axes.set(xlabel="step", ylabel="training reward, % (mean, 95% band over seeds)", title=f"{n} seeds")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    return figure_png(figure)


def figures(out: Path, counted: dict[str, dict[int, Path]], baseline: str, suffix: str) -> list[Path]:
    """forest{suffix}.png and curves{suffix}.png in `out`, of the runs the analysis counted; their paths."""
    import matplotlib
    matplotlib.use("Agg")

    from oarctl.artifacts import write_bytes_atomically

    curves = _reward_curves(counted)
    written = {out / f"forest{suffix}.png": _forest(curves, baseline), out / f"curves{suffix}.png": _curves(curves)}
    for path, data in written.items():
        write_bytes_atomically(path, data)
    return list(written)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--baseline", default="uniform")
    parser.add_argument("--ceiling", default="truth", help="the ceiling method, or 'none' (no fraction column)")
    parser.add_argument("--sesoi", type=float, default=1.0, help="smallest effect of interest, points")
    parser.add_argument("--allow-mixed", action="store_true",
                        help="analyse runs whose machine or versions differ or were not recorded (refused otherwise)")
    parser.add_argument("--seeds", default=None, help="only these seeds (FIRST-LAST or a comma-separated list); the "
                                                      "report goes to ceiling-sSEEDS.md")
    parser.add_argument("--figures", action="store_true", help="also write forest[-sSEEDS].png and curves[-sSEEDS].png")
    parser.add_argument("--metric", choices=METRICS, default="on_policy",
                        help="what a run is scored by; other than on_policy the report goes to ceiling[-sSEEDS]-METRIC.md")
    parser.add_argument("--predict", default=None, metavar="METHOD=K,...",
                        help="each method's effective batch by the gradient bench: adds its predicted gain beside "
                             "the measured one (needs --control)")
    parser.add_argument("--control", default=None, metavar="METHOD=FACTOR",
                        help="the baseline with FACTOR x the samples a step (e.g. uniform_1.5x=1.5), for --predict")
    args = parser.parse_args(argv)
    try:
        prediction = prediction_options(args.predict, args.control)
        if args.figures and args.metric != "on_policy":
            raise Refused("--figures draws the on-policy accuracy: run it without --metric")
        seeds = None if args.seeds is None else seed_set(args.seeds)
        ceiling = None if args.ceiling == "none" else args.ceiling
        text, counted = analyse(args.out, args.baseline, ceiling, args.sesoi, args.allow_mixed, seeds, args.metric,
                                prediction)
    except Refused as error:
        sys.stderr.write(f"error: {error}\n")
        raise SystemExit(2) from None
    from oarctl.artifacts import write_bytes_atomically

    suffix = "" if args.seeds is None else f"-s{args.seeds.replace(',', '_')}"
    named = suffix if args.metric == "on_policy" else f"{suffix}-{args.metric}"
    write_bytes_atomically(args.out / f"ceiling{named}.md", text)
    sys.stdout.write(text)
    if args.figures:
        for path in figures(args.out, counted, args.baseline, suffix):
            sys.stdout.write(f"wrote {path}\n")


if __name__ == "__main__":
    main()
