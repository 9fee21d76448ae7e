"""Sequence-level advantage estimators (GRPO, RLOO) and their spread onto response tokens.

Reads one scalar reward and one group id (the prompt) per response; writes one float32 advantage
per response. Every estimator in `ADVANTAGE_ESTIMATORS` has the same signature

    (rewards, group_ids, *, scale, eps) -> advantages

so the update stage never special-cases a name. `token_advantages` then multiplies a sequence
advantage by per-token weights (Bi-Level reshaping, section 5 of docs/method.md).

Where we deviate from verl `core_algos.py`:
- `scale="batch"` is not in verl; it follows TRL's `scale_rewards="batch"` (std of the rewards of
  the whole batch, group means still per group).
- `rloo` gives a group of size 1 advantage 0 (verl leaves the raw reward there, which pushes a
  lone response up by its reward with no baseline at all).
"""
from __future__ import annotations

import numpy as np

from oarctl.errors import OarError
from oarctl.registry import Registry

ADVANTAGE_ESTIMATORS = Registry("advantage estimator")
SCALES = ("group", "batch", "none")


def _check_scale(scale: str) -> None:
    if scale not in SCALES:
        raise OarError(f"reshape.scale must be one of {', '.join(SCALES)}; got {scale!r}")


def _check_inputs(rewards: np.ndarray, group_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return rewards as float64 and group ids as dense indices 0..G-1."""
    rewards = np.asarray(rewards, dtype=np.float64)
    group_ids = np.asarray(group_ids)
    if rewards.ndim != 1 or group_ids.shape != rewards.shape:
        raise ValueError(
            f"rewards and group_ids must be 1-D of equal length; got {rewards.shape} and {group_ids.shape}"
        )
    if not np.all(np.isfinite(rewards)):
        raise ValueError("rewards must be finite (a NaN or inf reward would poison its whole group)")
    _, dense_ids = np.unique(group_ids, return_inverse=True)
    return rewards, dense_ids.reshape(-1)


def _group_statistics(rewards: np.ndarray, dense_ids: np.ndarray) -> tuple[np.ndarray, ...]:
    """Per-response group size, group mean and unbiased (ddof=1) group std."""
    counts = np.bincount(dense_ids)
    sums = np.bincount(dense_ids, weights=rewards)
    means = sums / counts
    deviations = rewards - means[dense_ids]
    squares = np.bincount(dense_ids, weights=deviations**2)
    stds = np.sqrt(squares / np.maximum(counts - 1, 1))
    return counts[dense_ids], means[dense_ids], stds[dense_ids]


def _batch_std(rewards: np.ndarray) -> float:
    """Unbiased std of all rewards; 1.0 for a batch of one (torch.std would give NaN)."""
    if rewards.size < 2:
        return 1.0
    return float(np.std(rewards, ddof=1))


@ADVANTAGE_ESTIMATORS.register("grpo")
def grpo(rewards: np.ndarray, group_ids: np.ndarray, *, scale: str = "group", eps: float = 1e-6) -> np.ndarray:
    """GRPO: A_i = (r_i - mean of its group) / (std + eps).

    Matches verl `compute_grpo_outcome_advantage`: the std is torch.std's default, the unbiased
    one (ddof=1), not the population std of the paper's formula; a group of size 1 gets mean 0 and
    std 1, so its advantage is r_i / (1 + eps). A group whose rewards are all equal has std 0 and
    advantage exactly 0.

    scale: "group" divides by the std of the response's group (verl norm_adv_by_std_in_grpo=True),
    "batch" by the unbiased std of all rewards in the batch (TRL scale_rewards="batch"), "none"
    does not divide (Dr. GRPO; eps unused).
    """
    _check_scale(scale)
    rewards, dense_ids = _check_inputs(rewards, group_ids)
    counts, means, stds = _group_statistics(rewards, dense_ids)
    singleton = counts == 1
    means = np.where(singleton, 0.0, means)
    centered = rewards - means
    if scale == "none":
        return centered.astype(np.float32)
    if scale == "batch":
        return (centered / (_batch_std(rewards) + eps)).astype(np.float32)
    stds = np.where(singleton, 1.0, stds)
    return (centered / (stds + eps)).astype(np.float32)


@ADVANTAGE_ESTIMATORS.register("rloo")
def rloo(rewards: np.ndarray, group_ids: np.ndarray, *, scale: str = "group", eps: float = 1e-6) -> np.ndarray:
    """RLOO: A_i = r_i - mean of the other members of its group (leave-one-out baseline).

    Equivalently n/(n-1) * (r_i - group mean), as verl computes it. RLOO never divides by a std,
    so every valid `scale` ("group", "batch", "none") gives the same result and `eps` is unused;
    both are accepted only to keep one signature for all estimators. An invalid scale still
    raises. A group of size 1 has no other member and gets 0 (verl leaves the raw reward).
    """
    _check_scale(scale)
    rewards, dense_ids = _check_inputs(rewards, group_ids)
    counts = np.bincount(dense_ids)[dense_ids]
    sums = np.bincount(dense_ids, weights=rewards)[dense_ids]
    others = np.maximum(counts - 1, 1)
    advantages = rewards - (sums - rewards) / others
    return np.where(counts == 1, 0.0, advantages).astype(np.float32)


def token_advantages(sequence_advantage: float, weights: np.ndarray) -> np.ndarray:
    """Spread one sequence advantage onto its tokens: Ahat_t = A_i * w_t.

    With mass-preserving weights (sum w = len) the token advantages sum to A_i * len, the GRPO
    total. The same weights multiply positive and negative advantages, as in the reference code.
    """
    weights = np.asarray(weights, dtype=np.float64)
    if weights.ndim != 1:
        raise ValueError(f"weights must be 1-D (one per response token); got shape {weights.shape}")
    return (float(sequence_advantage) * weights).astype(np.float32)
