"""Clipped surrogate policy loss, k3 KL to a reference, loss aggregation modes, entropy for logs.

Reads (B, T) tensors aligned on response tokens: current, old and optional reference
log-probabilities, token advantages (A_i * w_it after reshaping) and a validity mask; writes a
scalar loss and a dict of float metrics. Aggregation modes live in `LOSS_AGGREGATIONS`, one
signature each: (token_loss, mask, *, max_length) -> scalar.

Where we deviate from verl `core_algos.py`:
- no dual-clip (verl's clip_ratio_c) and no clamp of the log-ratio to [-20, 20]: the loss is the
  plain clipped surrogate of the paper (section 1 of docs/method.md);
- the k3 estimate is not clamped to [-10, 10] (verl's low_var_kl does);
- aggregation differences are listed in each aggregation's docstring.
"""
from __future__ import annotations

import torch

from oarctl.registry import Registry

LOSS_AGGREGATIONS = Registry("loss aggregation")


def k3_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(pi || ref): exp(ref - logp) - (ref - logp) - 1 >= 0.

    Unbiased for the sampled token and never negative (Schulman's k3), as verl's "low_var_kl".
    """
    log_ratio = ref_logprobs - logprobs  # (B, T)
    return torch.exp(log_ratio) - log_ratio - 1.0


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over valid entries; 0 (still attached to the graph) when there are none."""
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


@LOSS_AGGREGATIONS.register("seq-mean-token-mean")
def seq_mean_token_mean(token_loss: torch.Tensor, mask: torch.Tensor, *, max_length: int) -> torch.Tensor:
    """Mean over the valid tokens of each sequence, then mean over sequences.

    Sequences with no valid token are left out of the outer mean (verl divides 0 by 0 there and
    returns NaN). No valid token at all gives 0. max_length is unused.
    """
    mask = mask.to(token_loss.dtype)  # (B, T)
    token_counts = mask.sum(dim=-1)  # (B,)
    sequence_losses = (token_loss * mask).sum(dim=-1) / token_counts.clamp(min=1.0)  # (B,)
    has_tokens = (token_counts > 0).to(token_loss.dtype)  # (B,)
    return _masked_mean(sequence_losses, has_tokens)


@LOSS_AGGREGATIONS.register("token-mean")
def token_mean(token_loss: torch.Tensor, mask: torch.Tensor, *, max_length: int) -> torch.Tensor:
    """Sum over all valid tokens / number of valid tokens (DAPO). max_length is unused.

    As verl's masked_mean, except that an all-masked batch gives exactly 0 instead of 0 / 1e-8.
    """
    return _masked_mean(token_loss, mask.to(token_loss.dtype))


@LOSS_AGGREGATIONS.register("seq-mean-token-sum-norm")
def seq_mean_token_sum_norm(token_loss: torch.Tensor, mask: torch.Tensor, *, max_length: int) -> torch.Tensor:
    """Dr. GRPO: sum over the valid tokens of each sequence / max_length, then mean over all B rows.

    Every divisor is a constant, so no response length reweights the gradient. verl instead sums
    the row sums and divides by the tensor width T (no division by B, and T changes with the
    padding of each batch); we follow the Dr. GRPO formula, (1/G) sum_i (1/L_max) sum_t, with
    L_max the configured max_length. Rows without valid tokens count in the mean with loss 0.
    """
    if max_length < 1:
        raise ValueError(f"max_length must be >= 1; got {max_length}")
    mask = mask.to(token_loss.dtype)  # (B, T)
    sequence_losses = (token_loss * mask).sum(dim=-1) / max_length  # (B,)
    return sequence_losses.mean()


def _clip_fraction(ratio: torch.Tensor, advantages: torch.Tensor, clip_low: float, clip_high: float) -> torch.Tensor:
    """1 where the clipped branch is the active min: ratio above 1 + high with A > 0, or below
    1 - low with A < 0 (equals verl's `pg_losses2 > pg_losses1` wherever A != 0)."""
    clipped_high = (ratio > 1.0 + clip_high) & (advantages > 0)
    clipped_low = (ratio < 1.0 - clip_low) & (advantages < 0)
    return (clipped_high | clipped_low).float()  # (B, T)


def _check_shapes(**tensors: torch.Tensor) -> None:
    shapes = {name: tuple(tensor.shape) for name, tensor in tensors.items() if tensor is not None}
    if len(set(shapes.values())) != 1 or len(next(iter(shapes.values()))) != 2:
        raise ValueError(f"policy_loss inputs must all be (B, T) of one shape; got {shapes}")


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    aggregation: str = "seq-mean-token-mean",
    max_length: int,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO/GRPO clipped surrogate, plus kl_coef * k3 per token (verl use_kl_loss), aggregated.

    Token loss: -min(rho * A, clip(rho, 1 - clip_low, 1 + clip_high) * A) with rho = exp(logp - old).
    The KL term is added per token before aggregation, so it is weighted like the policy term.
    Metrics (python floats): loss, pg_loss (the aggregated surrogate alone), clip_fraction and
    ratio_mean (over valid tokens), kl (mean k3 over valid tokens; 0.0 without a reference).
    """
    _check_shapes(logprobs=logprobs, old_logprobs=old_logprobs, advantages=advantages, mask=mask, ref=ref_logprobs)
    aggregate = LOSS_AGGREGATIONS.get(aggregation)
    mask = mask.to(logprobs.dtype)  # (B, T)
    ratio = torch.exp(logprobs - old_logprobs)  # (B, T)
    unclipped = ratio * advantages  # (B, T)
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * advantages  # (B, T)
    surrogate_loss = -torch.minimum(unclipped, clipped)  # (B, T)
    pg_loss = aggregate(surrogate_loss, mask, max_length=max_length)
    loss, kl_value = pg_loss, 0.0
    if ref_logprobs is not None:
        kl = k3_kl(logprobs, ref_logprobs)  # (B, T)
        kl_value = _masked_mean(kl.detach(), mask).item()
        if kl_coef > 0:
            loss = aggregate(surrogate_loss + kl_coef * kl, mask, max_length=max_length)
    with torch.no_grad():
        metrics = {
            "loss": loss.item(),
            "pg_loss": pg_loss.item(),
            "clip_fraction": _masked_mean(_clip_fraction(ratio, advantages, clip_low, clip_high), mask).item(),
            "kl": kl_value,
            "ratio_mean": _masked_mean(ratio, mask).item(),
        }
    return loss, metrics


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) per position: (B, T, V) -> (B, T), from whole logits (the reference
    the update's chunked entropy, oarctl.policy.logprobs.response_token_stats, is tested against).

    Computed in float32 from log_softmax (a logsumexp inside), so large logits do not overflow
    and bfloat16 logits do not lose the small probabilities; a logit of -inf
    (a banned token) contributes 0 instead of 0 * -inf = NaN, in value and in gradient.
    """
    log_probabilities = torch.log_softmax(logits.float(), dim=-1)  # (B, T, V)
    probabilities = log_probabilities.exp()  # (B, T, V)
    safe_log_probabilities = torch.where(probabilities > 0, log_probabilities, torch.zeros_like(log_probabilities))
    return -(probabilities * safe_log_probabilities).sum(dim=-1)  # (B, T)
