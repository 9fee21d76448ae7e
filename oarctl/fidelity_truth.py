"""Fidelity against the ground truth: how well each method's scores find the tokens the answer
depends on, where the rollouts carry `token_truth` (the chains toy world, oarctl/toy/truth.py).

Beside the regeneration oracle's causal tokens (oarctl/fidelity.py), a rollout with labels has a
second reference, known by construction: its label-1 reasoning tokens. Per rollout and method:
- truth recall@K: the share of label-1 tokens among the method's top ceil(K x R) reasoning tokens
  (the same selection as the oracle's recall@K; unknown tokens, label -1, are never hits);
- AUC: the probability that a random label-1 token scores above a random label-0 token (ties count
  one half, NaN scores rank lowest; unknown tokens left out); NaN without both kinds of tokens.
And once per input: how the oracle's causal tokens and the label-1 tokens overlap.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from oarctl.fidelity import recall_at_k

TRUTH_COLUMNS = ("truth_tokens", "truth_hits", "truth_recall", "truth_auc")


def reasoning_labels(table, rollouts) -> list[np.ndarray] | None:
    """The token_truth labels over each rollout's reasoning span, or None when the table has none."""
    if "token_truth" not in table.column_names:
        return None
    return [np.asarray(labels[r.segments.reasoning[0]:r.segments.reasoning[1]], dtype=np.int8)
            for labels, r in zip(table["token_truth"].to_pylist(), rollouts)]


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """P(score of a label-1 token > score of a label-0 token), ties 1/2; NaN scores rank lowest."""
    values = np.nan_to_num(np.asarray(scores, dtype=np.float64), nan=-np.inf)
    labels = np.asarray(labels)
    positive, negative = values[labels == 1], values[labels == 0]
    if positive.size == 0 or negative.size == 0:
        return math.nan
    greater = (positive[:, None] > negative[None, :]).sum()
    ties = (positive[:, None] == negative[None, :]).sum()
    return float((greater + 0.5 * ties) / (positive.size * negative.size))


def truth_columns(labels: list[np.ndarray], scores: dict, ks: Sequence[float]) -> dict:
    """The truth columns of the fidelity artifact, rows in fidelity_columns' order (rollout, method, K)."""
    columns = {name: [] for name in TRUTH_COLUMNS}
    for index, row_labels in enumerate(labels):
        depends = row_labels == 1
        for per_rollout in scores.values():
            area = auc(per_rollout[index], row_labels)
            for k in ks:
                _, hits, recall = recall_at_k(per_rollout[index], depends, k)
                for name, value in zip(TRUTH_COLUMNS, (int(depends.sum()), hits, recall, area)):
                    columns[name].append(value)
    return columns


def oracle_agreement(causal: list[np.ndarray], labels: list[np.ndarray]) -> str:
    """One line: how the regeneration oracle's causal tokens and the label-1 tokens overlap."""
    both = sum(int((mask & (truth == 1)).sum()) for mask, truth in zip(causal, labels))
    flagged = sum(int(mask.sum()) for mask in causal)
    depends = sum(int((truth == 1).sum()) for truth in labels)
    known = sum(int((truth >= 0).sum()) for truth in labels)
    share = lambda part, whole: f"{part / whole:.1%}" if whole else "n/a"  # noqa: E731
    return (f"- ground truth (token_truth): {depends} of {known} labelled reasoning tokens are label 1; "
            f"{share(both, flagged)} of the oracle's causal tokens are label 1, {share(both, depends)} of the "
            f"label-1 tokens are causal")


def truth_report(result, methods: Sequence[str], ks: Sequence[float]) -> list[str]:
    """The markdown table against the ground truth: mean AUC and mean truth recall@K per method."""
    frame = result.to_pandas()
    columns = [f"@{100 * k:g}%" for k in ks]
    lines = ["", "## Against the ground truth (label-1 tokens of token_truth)", "",
             "| method | AUC | " + " | ".join(columns) + " |", "|---|---:|" + "---:|" * len(columns)]
    for method in methods:
        rows = frame[(frame["method"] == method) & (frame["truth_tokens"] > 0)]
        area = rows["truth_auc"].dropna().mean() if len(rows) else math.nan
        recalls = [rows[np.isclose(rows["k_fraction"], k)]["truth_recall"].mean() if len(rows) else math.nan
                   for k in ks]
        cells = ["n/a" if math.isnan(v) else f"{v:.3f}" for v in [area, *recalls]]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return lines
