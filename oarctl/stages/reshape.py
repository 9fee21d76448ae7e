"""reshape: attributions -> advantages (sequence advantage, token weights, token advantages).

The sequence advantage comes from the estimator registry (GRPO by default, groups = prompt_id).
Token weights are Bi-Level weights of the reasoning tokens' raw scores; every other response token
(conclude, answer, closing brace, eos) keeps weight 1. With mass preservation on, the reasoning
weights sum to the reasoning length, so every sequence's token advantages sum to its GRPO total
(advantage x length), which this stage checks.
"""
from __future__ import annotations

from collections import Counter

import numpy as np

from oarctl.advantages import ADVANTAGE_ESTIMATORS, token_advantages
from oarctl.artifacts import extend_table
from oarctl.errors import InputError
from oarctl.reshaping import bilevel_weights
from oarctl.runner import StageContext, StageOutput

VERSION = "3"  # 3: credit-concentration metrics (top10_mass_share, effective_tokens)


def group_ids(prompt_ids: list[str]) -> np.ndarray:
    index: dict[str, int] = {}
    return np.array([index.setdefault(p, len(index)) for p in prompt_ids], dtype=np.int64)


def _check_groups(prompt_ids: list[str]) -> None:
    """Group baselines need two or more responses per prompt; a lone one would get advantage 0."""
    counts = Counter(prompt_ids)
    for row, prompt_id in enumerate(prompt_ids):
        if counts[prompt_id] < 2:
            raise InputError(f"row {row}: prompt_id {prompt_id!r} has a group of 1 response; "
                             f"group advantages need at least 2 (sample.group_size)")


def _check_mass(advantage: float, weighted: np.ndarray, row: int) -> None:
    expected = advantage * len(weighted)
    if not np.isclose(weighted.sum(dtype=np.float64), expected, rtol=1e-4, atol=1e-4):
        raise InputError(f"row {row}: token advantages sum to {weighted.sum():.6g}, "
                         f"expected the GRPO total {expected:.6g}")


def top_mass_share(weights: np.ndarray, share: float = 0.1) -> float:
    """Share of the reasoning's |token advantage| mass carried by its top `share` tokens by weight.

    |A x w| = |A| x w within one sequence, so |A| cancels: this is a ratio of weights.
    """
    count = max(1, int(np.ceil(share * len(weights))))
    return float(np.sort(weights)[::-1][:count].sum() / weights.sum())


def effective_tokens(weights: np.ndarray) -> float:
    """(sum w)^2 / sum w^2: R for uniform weights, 1 when one token carries everything."""
    return float(weights.sum(dtype=np.float64) ** 2 / np.square(weights, dtype=np.float64).sum())


def concentration_metrics(weights: list[np.ndarray], advantages: np.ndarray) -> dict:
    """How concentrated credit is, over reasoning spans with positive total weight.

    top10_mass_share only counts sequences with nonzero advantage (others carry no credit at all);
    a metric with no sequence to average over is left out rather than reported as 0.
    """
    spans = [(w, a) for w, a in zip(weights, advantages) if len(w) and w.sum() > 0]
    metrics = {}
    shares = [top_mass_share(w) for w, a in spans if a != 0]
    if shares:
        metrics["top10_mass_share"] = float(np.mean(shares))
    if spans:
        metrics["effective_tokens"] = float(np.mean([effective_tokens(w) for w, _ in spans]))
        metrics["effective_token_fraction"] = float(np.mean([effective_tokens(w) / len(w) for w, _ in spans]))
    return metrics


def run(inputs, config, context: StageContext) -> StageOutput:
    table = inputs["attributions"]
    rewards = np.asarray(table["reward"].to_numpy(zero_copy_only=False), dtype=np.float64)
    prompt_ids = table["prompt_id"].to_pylist()
    _check_groups(prompt_ids)
    groups = group_ids(prompt_ids)
    advantages = ADVANTAGE_ESTIMATORS.get(config.estimator)(rewards, groups, scale=config.scale, eps=config.eps)
    weights, per_token, reasoning = [], [], []
    spans = zip(table["reasoning_start"].to_pylist(), table["reasoning_end"].to_pylist())
    for row, (scores, (start, end)) in enumerate(zip(table["token_scores"].to_pylist(), spans)):
        w = np.ones(len(scores), dtype=np.float32)
        w[start:end] = bilevel_weights(np.asarray(scores[start:end], dtype=np.float32), quantile=config.quantile,
                                       beta=config.beta, floor=config.floor, preserve_mass=config.preserve_mass)
        weighted = token_advantages(float(advantages[row]), w)
        if config.preserve_mass:
            _check_mass(float(advantages[row]), weighted, row)
        weights.append(w.tolist())
        reasoning.append(w[start:end])
        per_token.append(weighted.tolist())
    mixed = [len(set(rewards[groups == g])) > 1 for g in np.unique(groups)]
    metrics = {"advantage_abs_mean": float(np.abs(advantages).mean()),
               "mixed_group_fraction": float(np.mean(mixed)), **concentration_metrics(reasoning, advantages)}
    columns = {"advantage": advantages.tolist(), "token_weights": weights, "token_advantages": per_token}
    return StageOutput(extend_table(table, columns, "advantages"), metrics)
