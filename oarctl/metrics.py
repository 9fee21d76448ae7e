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
