"""The update's loss on one micro-batch, and the gradient of one whole mini-batch.

Reads rows of an advantages table (prompt and response token ids, sampling log-probs, token
advantages, temperature) and the policy; `micro_batch_loss` returns the clipped-surrogate loss of
oarctl/losses.py (+ its metrics), and `mini_batch_gradient` accumulates into the parameters' `.grad`
the gradient of the whole mini-batch, cut into micro-batches as oarctl/batching.py plans them, each
loss scaled by its exact share. The update stage (oarctl/stages/update.py) trains with them; `oarctl
gradient-check` (oarctl/gradient_check/) measures gradients with them, so both see one loss.
"""
from __future__ import annotations

import torch

from oarctl.batching import plan_step
from oarctl.losses import policy_loss
from oarctl.policy.logprobs import model_device, pad_rows, response_token_stats


def micro_batch_loss(model, reference, batch: dict, config, pad_id: int):
    device = model_device(model)
    mask = pad_rows([[1.0] * len(r) for r in batch["response_token_ids"]], 0.0, torch.float32).to(device)
    stats = dict(prompts=batch["prompt_token_ids"], responses=batch["response_token_ids"], pad_id=pad_id,
                 temperature=batch["temperature"], chunk_tokens=config.logit_chunk_tokens)
    logprobs, entropy = response_token_stats(model, **stats)
    ref_logprobs = None
    if reference is not None:
        with torch.no_grad():
            ref_logprobs, _ = response_token_stats(reference, **stats)

    def padded(name, value):
        return pad_rows(batch[name], value, torch.float32).to(device)

    loss, metrics = policy_loss(
        logprobs, padded("response_logprobs", 0.0), padded("token_advantages", 0.0), mask,
        clip_low=config.clip_low, clip_high=config.clip_high, aggregation=config.loss_aggregation,
        max_length=config.sum_norm_length, ref_logprobs=ref_logprobs, kl_coef=config.kl_coef)
    metrics["entropy"] = float((entropy * mask).sum() / mask.sum())
    metrics["tokens"] = int(mask.sum())
    return loss, metrics


def mini_batch_gradient(model, rows: list[dict], config, pad_id: int) -> dict:
    """Add the gradient of the mini-batch `rows` (one process, no KL reference) to `.grad`; returns the
    loss-weighted means of the micro-batches' metrics (ratio_mean, clip_fraction, ...)."""
    sums: dict[str, float] = {}
    for micro in plan_step(rows, config):
        batch = {key: [rows[i][key] for i in micro.rows] for key in rows[0]}
        loss, metrics = micro_batch_loss(model, None, batch, config, pad_id)
        share = micro.numerator / micro.denominator
        (loss * share).backward()
        for name, value in metrics.items():
            if name != "tokens":
                sums[name] = sums.get(name, 0.0) + share * value
    return sums
