"""`oarctl compare RUN_DIR...`: runs grouped by attribution method (and reshape options changed from
their defaults), seeds aggregated.

Per run: attribute.method and run.seed from its config.yaml, accuracies from the last eval line of
metrics.jsonl, the first eval at or above the target accuracy, and wall time per step = the sum of
the step's stage `wall_seconds` (from the `*.manifest.json` beside each step output; a cache hit
keeps the time of the run that computed it), averaged over steps. Per method: mean +- std over
seeds (sample std, 0 for one seed). With `uniform` (GRPO) runs present, two more tables give each
method's paired difference to it, in greedy and in sampled accuracy: the same seed draws the same
prompts and starts from the same base, so acc(method, seed) - acc(uniform, seed) removes the
seed-to-seed spread; mean and a 95% Student-t interval over the seeds. A third paired table takes
the on-policy accuracy: the mean training reward over steps 1.. (a step's reward is the sampled
accuracy of that step's policy on its prompts, which are fresh until the training set's first epoch
ends; step 0 is the base, the same for every method of a seed), a measure of learning speed with far
less seed noise than one final evaluation. Last, the seconds per step split by stage, with each
method's credit / sampling (attribute seconds over sample seconds: what its credit costs against
sampling the same rollouts), and one line saying where the runs ran. Runs whose machine or versions
differ, or were not recorded, are refused unless `allow_mixed` (oarctl/provenance.py): their
differences would be the machine's as much as the method's. Writes a Markdown table and an HTML page
with the overlaid curves (mean over seeds, min-max band) embedded, plus the curves as PNGs beside the page.
"""
from __future__ import annotations

import html
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from oarctl.errors import OarError
from oarctl.report.run_report import _data_uri, eval_series, read_metrics, sampled_key, step_series
from oarctl.report.stats import t_interval

DEFAULT_TARGET = 0.45  # held-out greedy accuracy for "steps to target" (the demo's trained level)
BASELINE = "uniform"  # plain GRPO: the paired differences are taken to it
# the stage outputs of a step folder, in pipeline order, by the name of their manifest
STAGE_OUTPUTS = {"sample": "rollouts", "verify": "verified", "attribute": "attributions", "reshape": "advantages",
                 "update": "policy"}
SECONDS_FILE = "seconds.json"  # a kept run's stage seconds per step, when its step folders are not kept


@dataclass
class RunSummary:
    folder: Path
    method: str
    seed: int
    greedy: float
    sampled: float | None
    sampled_name: str | None
    steps_to_target: int | None
    seconds_per_step: float | None
    on_policy: float | None = None  # mean training reward over steps >= 1
    stage_seconds: dict = field(repr=False, default_factory=dict)  # stage -> mean wall seconds per step
    lines: list = field(repr=False, default_factory=list)


def _config(run_dir: Path, missing: str = "not a run folder?") -> dict:
    """The run's config.yaml as a mapping, or a one-line OarError naming the file (`missing` says why it is needed)."""
    from oarctl.config import read_yaml_mapping

    path = run_dir / "config.yaml"
    if not path.is_file():
        raise OarError(f"{path}: file not found ({missing})")
    return read_yaml_mapping(path, "run config")


def configured_steps(run_dir: Path) -> int:
    """run.steps of the run's config.yaml (the schema's default where the file leaves it out)."""
    from oarctl.schema import RunConfig

    run = _config(run_dir, "the configured steps tell when a run has finished").get("run") or {}
    steps = run.get("steps", RunConfig().steps) if isinstance(run, dict) else None
    if not isinstance(steps, int) or isinstance(steps, bool):
        raise OarError(f"{run_dir / 'config.yaml'}: run.steps must be an integer")
    return steps


def complete_steps(steps: list[dict[str, float]], configured: int) -> list[dict[str, float]] | None:
    """The first `configured` steps of step_stage_seconds' list when there are that many and each has every
    stage's seconds, else None (the run has not finished, or a step folder lost a manifest)."""
    kept = steps[:configured]
    if len(kept) < configured or any(set(step) != set(STAGE_OUTPUTS) for step in kept):
        return None
    return kept


def _wall_seconds(manifest: Path) -> float:
    return float(json.loads(manifest.read_text()).get("wall_seconds", 0.0))


def step_stage_seconds(run_dir: Path) -> list[dict[str, float]]:
    """Per step, in step order, each stage's wall seconds: from the manifests in the run's step folders or,
    for a run kept without its step folders, from its seconds.json (scripts/keep_seconds.py wrote it from them)."""
    folders = sorted(run_dir.glob("step_*"))
    if not folders and (run_dir / SECONDS_FILE).is_file():
        return json.loads((run_dir / SECONDS_FILE).read_text())["steps"]
    steps = []
    for folder in folders:
        step = {}
        for stage, output in STAGE_OUTPUTS.items():
            manifests = list(folder.glob(f"{output}*.manifest.json"))
            if manifests:
                step[stage] = sum(_wall_seconds(m) for m in manifests)
        steps.append(step)
    return steps


def seconds_per_step(run_dir: Path) -> float | None:
    totals = [sum(step.values()) for step in step_stage_seconds(run_dir) if step]
    return float(np.mean(totals)) if totals else None


def stage_seconds(run_dir: Path) -> dict[str, float]:
    """Mean wall seconds per step of each stage that has manifests in the run's step folders."""
    steps = step_stage_seconds(run_dir)
    return {stage: float(np.mean([step[stage] for step in steps if stage in step]))
            for stage in STAGE_OUTPUTS if any(stage in step for step in steps)}


def on_policy_accuracy(lines: list[dict]) -> float | None:
    """The mean training reward over steps >= 1: how well the policy did on fresh prompts while it trained."""
    rewards = [r for step, r in zip(*step_series(lines, "verify/reward_mean")) if step >= 1]
    return float(np.mean(rewards)) if rewards else None


def method_label(document: dict) -> str:
    """run.group when set; else attribute.method, plus the reshape options a run sets away from their
    defaults (`truth [quantile=0.75]`): the same scores under other weights are another method."""
    from oarctl.schema import ReshapeConfig

    if (document.get("run") or {}).get("group"):
        return str(document["run"]["group"])
    defaults = ReshapeConfig()
    changed = [f"{name}={value}" for name, value in sorted((document.get("reshape") or {}).items())
               if hasattr(defaults, name) and value != getattr(defaults, name)]
    method = str(document.get("attribute", {}).get("method", "?"))
    return f"{method} [{', '.join(changed)}]" if changed else method


def summarise(run_dir: Path, target: float) -> RunSummary:
    document, lines = _config(run_dir), read_metrics(run_dir)
    evals = [x for x in lines if x.get("kind") == "eval"]
    if not evals:
        raise OarError(f"{run_dir / 'metrics.jsonl'}: no eval line yet")
    key = sampled_key(lines)
    # the base evaluation (after 0 steps) trained nothing: a base already at the target is not "0 steps"
    reached = [x["after_steps"] for x in evals if x["after_steps"] > 0 and x.get("eval/greedy_accuracy", -1) >= target]
    return RunSummary(run_dir, method_label(document),
                      int(document.get("run", {}).get("seed", 0)), evals[-1]["eval/greedy_accuracy"],
                      evals[-1].get(key) if key else None, key[5:] if key else None,
                      reached[0] if reached else None, seconds_per_step(run_dir), on_policy_accuracy(lines),
                      stage_seconds(run_dir), lines)


def _mean_std(values: list[float]) -> str:
    if not values:
        return "—"
    spread = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
    return f"{100 * np.mean(values):.1f} ± {100 * spread:.1f}%"


def _steps_cell(runs: list[RunSummary]) -> str:
    reached = [r.steps_to_target for r in runs if r.steps_to_target is not None]
    return "—" if not reached else f"{np.mean(reached):.3g} ({len(reached)}/{len(runs)} seeds)"


def table_rows(groups: dict[str, list[RunSummary]]) -> list[list[str]]:
    rows = []
    for method, runs in groups.items():
        sampled = [r.sampled for r in runs if r.sampled is not None]
        seconds = [r.seconds_per_step for r in runs if r.seconds_per_step is not None]
        rows.append([method, str(len(runs)), ",".join(str(r.seed) for r in runs), _mean_std([r.greedy for r in runs]),
                     _mean_std(sampled), _steps_cell(runs), f"{np.mean(seconds):.2f}" if seconds else "—"])
    return rows


def markdown_table(groups: dict[str, list[RunSummary]], target: float) -> str:
    names = sorted({r.sampled_name for runs in groups.values() for r in runs if r.sampled_name}) or ["avg@k"]
    header = ["method", "n", "seeds", "greedy accuracy", f"sampled {'/'.join(names)}",
              f"steps to {100 * target:.0f}%", "s / step"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(groups)]
    return "\n".join(lines) + "\n"


def paired_differences(groups: dict[str, list[RunSummary]], baseline: str = BASELINE,
                       metric: str = "greedy") -> list[dict]:
    """Per method, `metric` (greedy, sampled or on_policy accuracy) minus the baseline's at the same seed (same
    prompts, same base): mean, 95% t-interval, pairs, and how many seeds the method won. Methods
    without 2 shared seeds are left out (no interval)."""
    reference = {r.seed: getattr(r, metric) for r in groups.get(baseline, []) if getattr(r, metric) is not None}
    rows = []
    for method, runs in groups.items():
        differences = [getattr(r, metric) - reference[r.seed] for r in runs
                       if r.seed in reference and getattr(r, metric) is not None]
        if method == baseline or len(differences) < 2:
            continue
        mean, low, high = t_interval(differences)
        rows.append({"method": method, "pairs": len(differences), "mean": mean, "low": low, "high": high,
                     "wins": sum(d > 0 for d in differences)})
    return rows


def paired_tables(groups: dict[str, list[RunSummary]], baseline: str = BASELINE) -> list[tuple[str, str]]:
    """(title, Markdown table) of the paired differences of greedy accuracy, then of sampled accuracy
    (avg@k) and of on-policy accuracy when runs have them."""
    sampled = next((r.sampled_name for runs in groups.values() for r in runs if r.sampled_name), None)
    blocks = []
    for metric, name in (("greedy", "greedy accuracy"), ("sampled", f"sampled {sampled}"),
                         ("on_policy", "on-policy accuracy: mean training reward over steps >= 1")):
        rows = paired_differences(groups, baseline, metric)
        if not rows:
            continue
        lines = ["| method | pairs | mean difference | 95% CI | seeds won | CI excludes 0 |", "|---|---|---|---|---|---|"]
        for r in rows:
            excludes = "yes" if r["low"] > 0 or r["high"] < 0 else "no"
            lines.append(f"| {r['method']} | {r['pairs']} | {100 * r['mean']:+.1f} | [{100 * r['low']:+.1f}, "
                         f"{100 * r['high']:+.1f}] | {r['wins']}/{r['pairs']} | {excludes} |")
        title = f"Paired difference to {baseline} ({name}, points; same seed = same prompts and base)"
        blocks.append((title, "\n".join(lines) + "\n"))
    return blocks


def unpaired_note(groups: dict[str, list[RunSummary]], baseline: str = BASELINE) -> str:
    """Why there is no paired section (none of `paired_tables`): said, not silently left out."""
    if baseline not in groups:
        return f"No paired differences: no {baseline} runs to pair with (paired by seed)."
    seeds = {method: sorted({r.seed for r in runs}) for method, runs in groups.items()}
    shown = "; ".join(f"{method} {values}" for method, values in seeds.items())
    return (f"No paired differences: a method needs runs of at least 2 seeds that {baseline} also ran "
            f"(seeds here: {shown}).")


def stage_table(groups: dict[str, list[RunSummary]]) -> str:
    """Seconds per step by stage: per method, the mean over its runs of each run's mean over steps, and
    the price of its credit, credit / sampling = attribute seconds / sample seconds of the same steps."""
    stages = [s for s in STAGE_OUTPUTS if any(s in r.stage_seconds for runs in groups.values() for r in runs)]
    if not stages:
        return ""
    lines = ["| method | " + " | ".join(stages) + " | step total | credit / sampling |",
             "|---" * (len(stages) + 3) + "|"]
    for method, runs in groups.items():
        means = dict(zip(stages, (np.mean([r.stage_seconds[s] for r in runs if s in r.stage_seconds] or [np.nan])
                                  for s in stages)))
        price = means.get("attribute", np.nan) / means["sample"] if means.get("sample") else np.nan
        lines.append(f"| {method} | " + " | ".join("—" if np.isnan(m) else f"{m:.1f}" for m in means.values())
                     + f" | {np.nansum(list(means.values())):.1f} | {'—' if np.isnan(price) else f'{price:.2f}x'} |")
    return "\n".join(lines) + "\n"


def _band(runs: list[RunSummary], series) -> tuple | None:
    """x values shared by every seed, with the mean, min and max of y there."""
    curves = [dict(zip(*series(r.lines))) for r in runs]
    shared = sorted(set.intersection(*(set(c) for c in curves)))
    if not shared:
        return None
    ys = np.array([[c[x] for x in shared] for c in curves])
    return shared, ys.mean(axis=0), ys.min(axis=0), ys.max(axis=0)


def curve_images(groups: dict[str, list[RunSummary]]) -> dict[str, bytes]:
    from oarctl.report.plots import band_png

    panels = {"accuracy": ("held-out greedy accuracy", "steps trained",
                           lambda lines: eval_series(lines, "eval/greedy_accuracy")),
              "reward": ("training reward", "step", lambda lines: step_series(lines, "verify/reward_mean")),
              # chains runs only (token_truth): does uniform credit collapse the free tokens' entropy faster?
              "entropy_free": ("entropy of answer-irrelevant tokens (nats)", "step",
                               lambda lines: step_series(lines, "sample/entropy_free_tokens")),
              "entropy_answer": ("entropy of tokens the answer depends on (nats)", "step",
                                 lambda lines: step_series(lines, "sample/entropy_answer_tokens"))}
    images = {}
    for name, (title, xlabel, series) in panels.items():
        bands = {m: b for m, runs in groups.items() if (b := _band(runs, series)) is not None}
        if bands:
            images[name] = band_png(title + " (mean over seeds, min-max shaded)", bands, xlabel=xlabel)
    return images


def _html_table(markdown: str) -> str:
    rows = [line.strip("|").split(" | ") for line in markdown.strip().splitlines() if not line.startswith("|---")]
    cells = lambda row, tag: "".join(f"<{tag}>{html.escape(c.strip())}</{tag}>" for c in row)  # noqa: E731
    return ("<table><tr>" + cells(rows[0], "th") + "</tr>"
            + "".join("<tr>" + cells(r, "td") + "</tr>" for r in rows[1:]) + "</table>")


def compare_runs(run_dirs: list[Path], output: Path, target: float | None = None, log=print,
                 allow_mixed: bool = False) -> str:
    """Write OUTPUT (HTML), OUTPUT with .md and OUTPUT_STEM/{accuracy,reward,entropy_*}.png; returns the table.
    Refuses runs whose machine or versions differ or are unknown unless `allow_mixed` (oarctl/provenance.py)."""
    from oarctl.artifacts import write_bytes_atomically
    from oarctl.provenance import check_runs

    target = DEFAULT_TARGET if target is None else target
    groups: dict[str, list[RunSummary]] = {}
    for summary in sorted((summarise(d, target) for d in run_dirs), key=lambda s: (s.method, s.seed)):
        groups.setdefault(summary.method, []).append(summary)
    provenance = check_runs(run_dirs, allow_mixed)  # once each folder is known to be a run; before any output
    main, sections, images = markdown_table(groups, target), paired_tables(groups), curve_images(groups)
    note = unpaired_note(groups) if not sections and len(groups) > 1 else ""
    if note:
        log(note)
    if stages := stage_table(groups):
        sections.append(("Seconds per step by stage (wall, mean over steps and seeds; credit / sampling = "
                         "attribute / sample: the price of the credit against sampling the same rollouts)", stages))
    table = (main + (f"\n{note}\n" if note else "") + "".join(f"\n{title}:\n\n{block}" for title, block in sections)
             + f"\n{provenance}\n")
    for name, png in images.items():
        write_bytes_atomically(output.parent / output.stem / f"{name}.png", png)
    write_bytes_atomically(output.with_suffix(".md"), table)
    figures = "".join(f'<img src="{_data_uri(png)}" alt="{name}">' for name, png in images.items())
    style = "body{font-family:sans-serif;margin:24px}td,th{border:1px solid #ccc;padding:4px 8px}" \
            "table{border-collapse:collapse}img{width:520px;margin:6px}"
    write_bytes_atomically(output, f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>oarctl compare</title>'
                                   f'<style>{style}</style></head><body><h1>Runs compared</h1>{_html_table(main)}'
                                   + (f"<p>{html.escape(note)}</p>" if note else "")
                                   + "".join(f"<h2>{html.escape(title)}</h2>{_html_table(block)}" for title, block in sections)
                                   + f'<p>{html.escape(provenance)}</p><h2>Curves</h2>{figures}</body></html>')
    log(f"compare: {sum(len(r) for r in groups.values())} runs, {len(groups)} methods -> wrote {output}, "
        f"{output.with_suffix('.md')}" + (f" and {len(images)} figures in {output.parent / output.stem}/" if images else ""))
    return table
