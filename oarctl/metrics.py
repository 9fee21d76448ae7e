"""Metrics: pass@k and majority votes over groups of graded samples; recall@K and AUC of token
rankings (how well a method's scores find the tokens that matter, `oarctl fidelity`).

Recall@K: the method's top ceil(K x R) reasoning tokens (at least 1) by score, ties broken by
position (earlier first), NaN scores last; recall = |top ∩ causal| / |causal|, NaN for a rollout
without causal tokens, which the averages leave out (the table says how many had some).
"""
from __future__ import annotations

import math
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


# ---- token rankings: recall@K and AUC ---------------------------------------------------------

def top_k_count(reasoning_length: int, fraction: float) -> int:
    """ceil(K x R) tokens, at least one (a 5% budget of 12 tokens is 1 token, not 0)."""
    if reasoning_length <= 0:
        return 0
    return min(reasoning_length, max(1, math.ceil(fraction * reasoning_length - 1e-9)))


def top_positions(scores: np.ndarray, count: int) -> np.ndarray:
    """Indices of the `count` highest scores; ties go to the earlier position, NaN ranks last."""
    values = np.nan_to_num(np.asarray(scores, dtype=np.float64), nan=-np.inf)
    return np.argsort(-values, kind="stable")[:count]


def recall_at_k(scores: np.ndarray, causal: np.ndarray, fraction: float) -> tuple[int, int, float]:
    """(tokens selected, causal tokens among them, recall); recall is NaN without causal tokens."""
    causal = np.asarray(causal, dtype=bool)
    count = top_k_count(causal.size, fraction)
    hits = int(causal[top_positions(scores, count)].sum())
    total = int(causal.sum())
    return count, hits, (hits / total if total else math.nan)


def mean_recalls(table) -> dict[str, dict[float, float]]:
    """{method: {K: mean recall over rollouts with >= 1 causal token}} from a fidelity table."""
    frame = table.to_pandas()
    frame = frame[frame["causal_tokens"] > 0]
    means: dict[str, dict[float, float]] = {}
    for (method, k), group in frame.groupby(["method", "k_fraction"], sort=False):
        means.setdefault(method, {})[round(float(k), 6)] = float(group["recall"].mean())
    return means


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
