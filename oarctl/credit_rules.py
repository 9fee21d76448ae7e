"""Token credit rules: a batch's raw token scores and sequence advantages -> token weights and token advantages.

Reads what the reshape stage (and OARGRPOTrainer) hold for a batch: per row its scores (one per response
token, NaN where a method did not score) and reasoning span, the rows' sequence advantages and the reshape
section; writes per row float32 token weights and float32 token advantages. Every rule in `CREDIT_RULES`
has the signature (rows, advantages, config) -> (weights, token_advantages); the method that made the
scores picks its rule (`rule_of`), so a user only sets attribute.method.

- bilevel: Bi-Level weights of the reasoning scores, 1 elsewhere (`reshaping`); A_it = A_i * w_it. Every
  OAR method, the controls and the chains labels.
- entropy_mask: TRL's 80/20 rule; w = 1 on tokens whose score (entropy) is at or above the
  (1 - reshape.top_entropy_quantile)-quantile of every scored token of the batch, else 0; A_it = A_i * w_it.
  TRL thresholds each loss call's micro-batch (gathered over processes); here the step's whole batch.
- ktae: KTAE's additive rule, A_it = A_i + k_it (k: the key-token value, 0 where NaN); the weight is the
  factor A_it / A_i (1 where A_i = 0), so token advantages still read as A_i x weight wherever A_i != 0.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from oarctl.advantages import token_advantages
from oarctl.registry import Registry
from oarctl.reshaping import batch_response_weights

CREDIT_RULES = Registry("token credit rule")
RULE_OF_METHOD = {"entropy_mask": "entropy_mask", "ktae": "ktae"}  # every other method: bilevel


def rule_of(method: str) -> str:
    return RULE_OF_METHOD.get(method, "bilevel")


def high_entropy_mask(entropies: torch.Tensor, mask: torch.Tensor, level: float,
                      gather: Callable[[torch.Tensor], torch.Tensor] = lambda values: values) -> torch.Tensor:
    """(B, T) bool: valid tokens whose entropy is at or above the `level`-quantile of all valid entropies
    (level = 1 - top_entropy_quantile, as TRL passes it); `gather` collects every process's 1-D values.

    TRL's `GRPOTrainer.get_high_entropy_mask` (trl 1.16) in oarctl's words: torch.quantile (linear
    interpolation) of the float32 entropies of every valid token of every process; ties at the threshold
    are all kept; no valid token anywhere keeps nothing."""
    values = gather(entropies[mask.bool()].float())  # (N,) every process's valid tokens
    if values.numel() == 0:
        return torch.zeros_like(entropies, dtype=torch.bool)
    threshold = torch.quantile(values, level)
    return ((entropies * mask.float()) >= threshold) & mask.bool()  # (B, T)


def mask_level(top_entropy_quantile: float) -> float:
    """The quantile level TRL thresholds at, computed as TRL computes it."""
    return 1 - top_entropy_quantile


def _times(advantages: np.ndarray, weights: list[np.ndarray]) -> list[np.ndarray]:
    return [token_advantages(float(a), w) for a, w in zip(advantages, weights)]


@CREDIT_RULES.register("bilevel")
def bilevel(rows: list, advantages: np.ndarray, config) -> tuple[list[np.ndarray], list[np.ndarray]]:
    weights = batch_response_weights(rows, config)
    return weights, _times(advantages, weights)


def batch_entropy_mask(scores: list[np.ndarray], top_entropy_quantile: float) -> list[np.ndarray]:
    """0/1 per token: TRL's `get_high_entropy_mask` over the whole batch as one micro-batch on one process.
    Rows without scores (NaN: not scored) get all ones; they do not enter the quantile."""
    scored = [i for i, s in enumerate(scores) if len(s) and not np.isnan(s).all()]
    masks = [np.ones(len(s), dtype=np.float32) for s in scores]
    if not scored:
        return masks
    width = max(len(scores[i]) for i in scored)
    entropies = torch.zeros(len(scored), width, dtype=torch.float32)  # (B, T)
    valid = torch.zeros(len(scored), width, dtype=torch.float32)  # (B, T)
    for row, i in enumerate(scored):
        entropies[row, :len(scores[i])] = torch.as_tensor(np.asarray(scores[i], dtype=np.float32))
        valid[row, :len(scores[i])] = 1.0
    kept = high_entropy_mask(entropies, valid, mask_level(top_entropy_quantile))
    for row, i in enumerate(scored):
        masks[i] = kept[row, :len(scores[i])].numpy().astype(np.float32)
    return masks


@CREDIT_RULES.register("entropy_mask")
def entropy_mask(rows: list, advantages: np.ndarray, config) -> tuple[list[np.ndarray], list[np.ndarray]]:
    weights = batch_entropy_mask([np.asarray(s, dtype=np.float32) for s, _ in rows], config.top_entropy_quantile)
    return weights, _times(advantages, weights)


@CREDIT_RULES.register("ktae")
def ktae(rows: list, advantages: np.ndarray, config) -> tuple[list[np.ndarray], list[np.ndarray]]:
    weights, per_token = [], []
    for (scores, _), advantage in zip(rows, advantages):
        keys = np.nan_to_num(np.asarray(scores, dtype=np.float64), nan=0.0)
        token = float(advantage) + keys
        per_token.append(token.astype(np.float32))
        weights.append((token / float(advantage) if advantage != 0 else np.ones_like(keys)).astype(np.float32))
    return weights, per_token


def token_credit(method: str, rows: list, advantages: np.ndarray, config):
    """(weights, token advantages) of a batch under the rule of `method`."""
    return CREDIT_RULES.get(rule_of(method))(rows, advantages, config)
