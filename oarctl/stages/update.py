"""update: advantages + policy -> a new policy checkpoint (+ update.parquet, one row per optimizer step).

PPO-style clipped surrogate on the token advantages, using the stored sampling log-probs as the old
policy, `epochs` passes over the batch in mini-batches, each accumulated over micro-batches. AdamW
state travels with the checkpoint, so step k+1 continues the optimizer of step k, as in-process
trainers do. Deviation: with `token-mean`, micro-batch losses are weighted by their share of
sequences, not of tokens (exact for the seq-mean modes, as in verl).
"""
from __future__ import annotations

import numpy as np
import torch
from tqdm.auto import tqdm

from oarctl.artifacts import make_table
from oarctl.checkpoints import load_optimizer
from oarctl.losses import entropy_from_logits, policy_loss
from oarctl.runner import StageContext, StageOutput

VERSION = "1"


def _pad(rows: list[list], value, dtype) -> torch.Tensor:
    width = max(len(r) for r in rows)
    return torch.tensor([list(r) + [value] * (width - len(r)) for r in rows], dtype=dtype)


def response_logits(model, prompts: list[list[int]], responses: list[list[int]], pad_id: int) -> torch.Tensor:
    """Logits predicting each response token, left-aligned on the response: (B, R, V)."""
    sequences = [p + r for p, r in zip(prompts, responses)]
    input_ids = _pad(sequences, pad_id, torch.long)  # (B, T), right padded
    attention = _pad([[1] * len(s) for s in sequences], 0, torch.long)
    logits = model(input_ids=input_ids.to(model.device), attention_mask=attention.to(model.device)).logits
    width = max(len(r) for r in responses)
    gathered = [logits[i, len(p) - 1:len(p) - 1 + width] for i, p in enumerate(prompts)]
    return torch.stack([torch.nn.functional.pad(g, (0, 0, 0, width - g.shape[0])) for g in gathered])


def _token_logprobs(logits: torch.Tensor, responses: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    scaled = logits.float() / temperature[:, None, None]  # (B, R, V)
    return torch.log_softmax(scaled, dim=-1).gather(-1, responses.unsqueeze(-1)).squeeze(-1)  # (B, R)


def _micro_batch_loss(model, reference, batch: dict, config, pad_id: int):
    responses = _pad(batch["response_token_ids"], pad_id, torch.long)  # (B, R)
    mask = _pad([[1.0] * len(r) for r in batch["response_token_ids"]], 0.0, torch.float32)
    temperature = torch.tensor(batch["temperature"], dtype=torch.float32)
    logits = response_logits(model, batch["prompt_token_ids"], batch["response_token_ids"], pad_id)
    logprobs = _token_logprobs(logits, responses, temperature)
    ref_logprobs = None
    if reference is not None:
        with torch.no_grad():
            ref_logits = response_logits(reference, batch["prompt_token_ids"], batch["response_token_ids"], pad_id)
            ref_logprobs = _token_logprobs(ref_logits, responses, temperature)
    loss, metrics = policy_loss(
        logprobs, _pad(batch["response_logprobs"], 0.0, torch.float32),
        _pad(batch["token_advantages"], 0.0, torch.float32), mask,
        clip_low=config.clip_low, clip_high=config.clip_high, aggregation=config.loss_aggregation,
        max_length=config.sum_norm_length, ref_logprobs=ref_logprobs, kl_coef=config.kl_coef)
    with torch.no_grad():
        metrics["entropy"] = float((entropy_from_logits(logits) * mask).sum() / mask.sum())
    metrics["tokens"] = int(mask.sum())
    return loss, metrics


def _optimizer_step(model, optimizer, reference, rows: list[dict], config, pad_id: int) -> dict:
    optimizer.zero_grad(set_to_none=True)
    collected = []
    for start in range(0, len(rows), config.micro_batch_size):
        micro = rows[start:start + config.micro_batch_size]
        batch = {key: [row[key] for row in micro] for key in micro[0]}
        loss, metrics = _micro_batch_loss(model, reference, batch, config, pad_id)
        (loss * len(micro) / len(rows)).backward()
        collected.append((len(micro), metrics))
    parameters = [p for p in model.parameters() if p.requires_grad]
    max_norm = config.max_grad_norm if config.max_grad_norm > 0 else float("inf")
    grad_norm = float(torch.nn.utils.clip_grad_norm_(parameters, max_norm))
    optimizer.step()
    averaged = {k: sum(n * m[k] for n, m in collected) / len(rows) for k in collected[0][1] if k != "tokens"}
    return {**averaged, "tokens": sum(m["tokens"] for _, m in collected), "grad_norm": grad_norm}


COLUMNS = ["prompt_token_ids", "response_token_ids", "response_logprobs", "token_advantages", "temperature"]


def run(inputs, config, context: StageContext) -> StageOutput:
    rows = inputs["advantages"].select(COLUMNS).to_pylist()
    model, tokenizer = context.policy.load()
    reference = context.reference.load()[0].eval() if context.reference is not None else None
    names = [name for name, _ in model.named_parameters()]
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay)
    load_optimizer(optimizer, names, context.policy.path)
    for group in optimizer.param_groups:  # a config change of the learning rate takes effect
        group["lr"], group["weight_decay"] = config.learning_rate, config.weight_decay
    model.train()
    log = []
    orders = [np.random.default_rng([context.seed, context.step, epoch]).permutation(len(rows))
              for epoch in range(config.epochs)]  # a fresh shuffle per pass over the batch
    plan = [(epoch, start) for epoch in range(config.epochs) for start in range(0, len(rows), config.mini_batch_size)]
    for epoch, start in tqdm(plan, desc="update", disable=not context.progress, leave=False):
        mini = [rows[i] for i in orders[epoch][start:start + config.mini_batch_size]]
        log.append({"optimizer_step": len(log), "epoch": epoch,
                    **_optimizer_step(model, optimizer, reference, mini, config, tokenizer.pad_token_id)})
    model.eval()
    table = make_table({key: [entry[key] for entry in log] for key in log[0]}, "update_log")
    metrics = {key: float(np.mean([entry[key] for entry in log])) for key in log[0] if key not in ("optimizer_step", "epoch")}
    return StageOutput(table, metrics, trained=(model, tokenizer, optimizer, names))
