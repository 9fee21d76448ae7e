"""Paired comparison of two methods: the same seeds, the same held-out prompts, per-prompt differences.

Two runs with the same `run.seed` start from the same policy and see the same data order and the
same held-out set, so their final evaluations can be compared prompt by prompt. Per seed, each
held-out prompt gives a difference (method minus baseline) of its greedy reward and of its mean
sampled reward; the margin is the mean difference over all (seed, prompt) pairs, with a normal 95%
interval (mean +- 1.96 standard errors). The interval covers the held-out sampling noise and, when
several seeds are pooled, part of the training noise; one seed pair says nothing about how another
seed would go, which is why the per-seed margins are listed too.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

Z95 = 1.959964


def final_eval(run_dir: Path):
    """The last evaluation file of a run (eval/step_NNNN.parquet with the highest step), as pandas."""
    import pandas as pd

    files = sorted((run_dir / "eval").glob("step_*.parquet"))
    return pd.read_parquet(files[-1]) if files else None


def per_prompt(frame) -> dict:
    """{prompt_id: (greedy reward, mean sampled reward)} of one evaluation."""
    greedy = frame[frame["mode"] == "greedy"].groupby("prompt_id")["reward"].mean()
    sampled = frame[frame["mode"] == "sampled"].groupby("prompt_id")["reward"].mean()
    return {prompt: (float(greedy[prompt]), float(sampled.get(prompt, math.nan))) for prompt in greedy.index}


def differences(method: dict, baseline: dict) -> np.ndarray:
    """(P, 2) differences method - baseline over the prompts both scored: greedy, sampled."""
    shared = sorted(set(method) & set(baseline))
    return np.array([[method[p][i] - baseline[p][i] for i in (0, 1)] for p in shared], dtype=np.float64)


def margin(diffs: np.ndarray) -> tuple[float, float, float]:
    """(mean, low, high) of the 95% normal interval of the mean of `diffs` (NaN when fewer than 2)."""
    diffs = diffs[~np.isnan(diffs)]
    if diffs.size < 2:
        return math.nan, math.nan, math.nan
    mean, error = float(diffs.mean()), float(diffs.std(ddof=1) / math.sqrt(diffs.size))
    return mean, mean - Z95 * error, mean + Z95 * error


def paired_table(groups: dict, baseline: str = "uniform") -> str:
    """Markdown table: every method against `baseline` over the seeds both ran, margins in points with
    their 95% intervals; '' when nothing pairs."""
    if baseline not in groups:
        return ""
    base = {run.seed: run for run in groups[baseline]}
    lines = []
    for method, runs in groups.items():
        pairs = [(run, base[run.seed]) for run in runs if method != baseline and run.seed in base]
        tables = [(run.seed, final_eval(run.folder), final_eval(other.folder)) for run, other in pairs]
        diffs = [(seed, differences(per_prompt(a), per_prompt(b))) for seed, a, b in tables
                 if a is not None and b is not None]
        if not diffs:
            continue
        pooled = np.concatenate([d for _, d in diffs])
        cells = [_cell(margin(pooled[:, i])) for i in (0, 1)]
        seeds = ", ".join(f"s{seed}: {100 * d[:, 0].mean():+.1f}" for seed, d in diffs)
        lines.append(f"| {method} | {len(diffs)} | {len(pooled)} | {cells[0]} | {cells[1]} | {seeds} |")
    if not lines:
        return ""
    header = ["| method | seeds | prompts | greedy margin | sampled margin | greedy margin per seed |",
              "|---|---|---|---|---|---|"]
    return "\n".join(header + lines) + "\n"


def _cell(values: tuple[float, float, float]) -> str:
    mean, low, high = values
    if math.isnan(mean):
        return "—"
    return f"{100 * mean:+.1f} [{100 * low:+.1f}, {100 * high:+.1f}]"
