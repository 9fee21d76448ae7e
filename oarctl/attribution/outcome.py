"""The outcome of a rollout, P_final or phi, from the logits at its outcome positions.

Reads logits of a causal LM at the positions `outcome_positions` names; writes the outcome
(section 2 of docs/method.md), computed in float64 whatever the model dtype. The scores that
decide Bi-Level's quantile are KLs of nearly equal distributions over ~152k tokens: in float32 the
sum's rounding (~1e-7 x entropy) is a few percent of a score of 1e-5. There are only K positions x V
values, so float64 costs nothing that shows:

- `last`: log P, the next-token distribution at the position that predicts a_1, i.e. the last
  conclude token (answer_start - 1). One definition, used by OAR-P and OAR-G alike (the reference
  code's two paths meant different positions).
- `answer_mean`: log softmax of the mean of the logits at the A positions predicting a_1..a_A.
- `answer_joint`: phi = (1/A) sum_k log p(a_k | prefix, a_<k), a scalar.

All spans are half-open absolute indices into the attributed sequence. A response without answer
tokens (the probe, or an empty box) has only `last`: `effective_mode` falls back to it. For a probe
rollout the sequence is prompt + reasoning + probe ids and the answer span is empty at its end, so
`last` is the distribution after the probe's `\\boxed{`.
"""
from __future__ import annotations

import torch

MODES = ("last", "answer_mean", "answer_joint")
# The outcome math's dtype; bench/method_deviations.py sets float32 (the released code's) to measure
# what this deviation changes.
OUTCOME_DTYPE = torch.float64
DISTRIBUTION_MODES = ("last", "answer_mean")


def effective_mode(mode: str, answer_span: tuple[int, int]) -> str:
    """`mode`, or `last` when there are no answer tokens to average over."""
    if mode not in MODES:
        raise ValueError(f"unknown outcome mode {mode!r}; choose one of: {', '.join(MODES)}")
    return mode if answer_span[1] > answer_span[0] else "last"


def outcome_positions(answer_span: tuple[int, int], mode: str) -> torch.Tensor:
    """Absolute positions whose logits define the outcome: the ones predicting a_1 (.. a_A)."""
    start, end = answer_span
    if start < 1:
        raise ValueError(f"the answer span {answer_span} leaves no position to predict it from")
    if effective_mode(mode, answer_span) == "last":
        return torch.tensor([start - 1])
    return torch.arange(start - 1, end - 1)


def outcome_from_logits(logits: torch.Tensor, mode: str, answer_ids: torch.Tensor) -> torch.Tensor:
    """logits (B, K, V) at the K outcome positions -> log P (B, V), or phi (B,) for answer_joint.

    `mode` must already be effective; `answer_ids` (A,) are the targets of answer_joint.
    """
    logits = logits.to(OUTCOME_DTYPE)
    if mode == "last":
        return torch.log_softmax(logits[:, 0], dim=-1)  # (B, V)
    if mode == "answer_mean":
        return torch.log_softmax(logits.mean(dim=1), dim=-1)  # (B, V)
    log_probs = torch.log_softmax(logits, dim=-1)  # (B, A, V)
    targets = answer_ids.to(logits.device).view(1, -1, 1).expand(logits.shape[0], -1, 1)
    return log_probs.gather(-1, targets).squeeze(-1).mean(dim=1)  # (B,)


def kl_divergence(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """KL(P || Q) over the last dimension, from log-probabilities; (..., V) -> (...)."""
    p = log_p.exp()
    terms = torch.where(p > 0, p * (log_p - log_q), 0.0)  # 0 log 0 = 0 where P underflows
    return terms.sum(dim=-1)


def importance(clean: torch.Tensor, changed: torch.Tensor, mode: str) -> torch.Tensor:
    """KL(clean || changed) for distributions, phi_clean - phi_changed for answer_joint."""
    if mode == "answer_joint":
        return clean - changed
    return kl_divergence(clean, changed)
