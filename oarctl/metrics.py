"""Evaluation metrics over groups of graded samples."""
from __future__ import annotations

from math import comb

import numpy as np


def pass_at_k(samples: int, correct: int, k: int) -> float:
    """Unbiased pass@k (Chen et al., 2021): 1 - C(n-c, k) / C(n, k)."""
    if samples - correct < k:
        return 1.0
    return 1.0 - comb(samples - correct, k) / comb(samples, k)


def group_metrics(rewards_by_prompt: dict[str, list[float]], ks: list[int]) -> dict[str, float]:
    """avg@n (mean reward) and mean pass@k over prompts."""
    counts = [(len(r), int(sum(x > 0.5 for x in r))) for r in rewards_by_prompt.values()]
    n = counts[0][0] if counts else 0
    metrics = {f"avg@{n}": float(np.mean([c / s for s, c in counts]))}
    for k in ks:
        metrics[f"pass@{k}"] = float(np.mean([pass_at_k(s, c, k) for s, c in counts]))
    return metrics


def majority_correct(answers: list[str | None], rewards: list[float]) -> float:
    """1.0 when the most frequent answer (normalized; None = no answer, which never votes) is correct.

    Ties go to the answer that appeared first, so the result depends only on the sample order.
    The reward of the winning answer is that of its first sample (equal answers get equal verdicts).
    """
    counts: dict[str, int] = {}
    first_reward: dict[str, float] = {}
    for answer, reward in zip(answers, rewards):
        if answer is None:
            continue
        counts[answer] = counts.get(answer, 0) + 1
        first_reward.setdefault(answer, reward)
    if not counts:
        return 0.0
    best = max(counts.values())
    winner = next(answer for answer in counts if counts[answer] == best)  # dicts keep first-seen order
    return float(first_reward[winner] > 0.5)


def maj_at_k(samples: list[tuple[str | None, float]], k: int) -> float:
    """Majority vote over the first k (answer, reward) samples of one prompt."""
    head = samples[:k]
    return majority_correct([a for a, _ in head], [r for _, r in head])


def vote_metrics(samples_by_prompt: dict[str, list[tuple[str | None, float]]], ks: list[int]) -> dict[str, float]:
    """Mean maj@k over prompts, for each k (samples in sample_index order)."""
    return {f"maj@{k}": float(np.mean([maj_at_k(s, k) for s in samples_by_prompt.values()])) for k in ks}
