"""update: advantages + policy -> a new policy checkpoint (+ update.parquet, one row per optimizer step).

PPO-style clipped surrogate on the token advantages, using the stored sampling log-probs as the old
policy, `epochs` passes over the batch in mini-batches, each accumulated over micro-batches (fixed
size, or packed to `micro_batch_tokens`; see oarctl/batching.py for the exact loss shares). AdamW
state travels with the checkpoint, so step k+1 continues the optimizer of step k, as in-process
trainers do. Logged token means (entropy, clip_fraction, ratio_mean, kl) are weighted like the loss:
by sequences in the seq-mean modes, so there they depend a little on how rows are cut.

Training at scale: the stage runs under `accelerate launch`, one config per strategy:
    accelerate launch --config_file configs/accelerate/ddp.yaml -m oarctl.cli update \
        step_0000/advantages.parquet -o step_0000/policy --policy MODEL_DIR -c CONFIG.yaml
with ddp.yaml (whole model per GPU), fsdp.yaml (full shard, one unit per Qwen2DecoderLayer) or
deepspeed_zero3.yaml (ZeRO-3, bf16); `--num_processes N` sets the GPU count, `--set update.bf16=true`
turns on bf16 autocast. cpu-2proc.yaml runs two CPU ranks (gloo), as the tests do. Every rank reads
the whole batch and takes rows i % ranks of each mini-batch; the ranks average the gradients and
accelerate divides by the accumulation steps, so each loss is multiplied by both and the sum is the
single-process gradient. Ranks pad with zero-weight micro-batches to the same count (FSDP/ZeRO-3
gather parameters in every forward). Only rank 0 writes the checkpoint, update.parquet and the
manifest. Without a launcher (one process, `bf16` off) no Accelerator is made and the bytes are
those of a plain PyTorch loop. Under FSDP/ZeRO-3 the full weights are gathered on rank 0 for the
safetensors save (16-bit under ZeRO-3), but the sharded AdamW state is neither saved nor loaded:
each step starts a fresh optimizer there; the KL reference model is replicated, not sharded.
"""
from __future__ import annotations

import contextlib
import os
import sys

import numpy as np
import torch
from tqdm.auto import tqdm

from oarctl.artifacts import make_table
from oarctl.batching import loss_share, pad_plan, plan_step
from oarctl.checkpoints import OPTIMIZER_TENSORS, load_optimizer, load_policy
from oarctl.losses import entropy_from_logits, policy_loss
from oarctl.runner import StageContext, StageOutput

VERSION = "2"  # 2: under token-mean, micro-batch losses and logged metrics are weighted by token share


def _pad(rows: list[list], value, dtype) -> torch.Tensor:
    width = max(len(r) for r in rows)
    return torch.tensor([list(r) + [value] * (width - len(r)) for r in rows], dtype=dtype)


def _device(model) -> torch.device:
    return next(model.parameters()).device  # a DDP/FSDP wrapper has no `.device`


def response_logits(model, prompts: list[list[int]], responses: list[list[int]], pad_id: int) -> torch.Tensor:
    """Logits predicting each response token, left-aligned on the response: (B, R, V)."""
    sequences = [p + r for p, r in zip(prompts, responses)]
    input_ids = _pad(sequences, pad_id, torch.long)  # (B, T), right padded
    attention = _pad([[1] * len(s) for s in sequences], 0, torch.long)
    device = _device(model)
    logits = model(input_ids=input_ids.to(device), attention_mask=attention.to(device)).logits
    width = max(len(r) for r in responses)
    gathered = [logits[i, len(p) - 1:len(p) - 1 + width] for i, p in enumerate(prompts)]
    return torch.stack([torch.nn.functional.pad(g, (0, 0, 0, width - g.shape[0])) for g in gathered])


def _token_logprobs(logits: torch.Tensor, responses: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    scaled = logits.float() / temperature[:, None, None]  # (B, R, V)
    return torch.log_softmax(scaled, dim=-1).gather(-1, responses.unsqueeze(-1)).squeeze(-1)  # (B, R)


def _micro_batch_loss(model, reference, batch: dict, config, pad_id: int):
    device = _device(model)
    responses = _pad(batch["response_token_ids"], pad_id, torch.long).to(device)  # (B, R)
    mask = _pad([[1.0] * len(r) for r in batch["response_token_ids"]], 0.0, torch.float32).to(device)
    temperature = torch.tensor(batch["temperature"], dtype=torch.float32).to(device)
    logits = response_logits(model, batch["prompt_token_ids"], batch["response_token_ids"], pad_id)
    logprobs = _token_logprobs(logits, responses, temperature)
    ref_logprobs = None
    if reference is not None:
        with torch.no_grad():
            ref_logits = response_logits(reference, batch["prompt_token_ids"], batch["response_token_ids"], pad_id)
            ref_logprobs = _token_logprobs(ref_logits, responses, temperature)

    def padded(name, value):
        return _pad(batch[name], value, torch.float32).to(device)

    loss, metrics = policy_loss(
        logprobs, padded("response_logprobs", 0.0), padded("token_advantages", 0.0), mask,
        clip_low=config.clip_low, clip_high=config.clip_high, aggregation=config.loss_aggregation,
        max_length=config.sum_norm_length, ref_logprobs=ref_logprobs, kl_coef=config.kl_coef)
    with torch.no_grad():
        metrics["entropy"] = float((entropy_from_logits(logits) * mask).sum() / mask.sum())
    metrics["tokens"] = int(mask.sum())
    return loss, metrics


def _accumulating(accelerator, model):
    """accelerate's accumulate: gradients are reduced over ranks on the last micro-batch only."""
    return contextlib.nullcontext() if accelerator is None else accelerator.accumulate(model)


def _backward(loss, micro, accelerator, scale: int) -> None:
    share = loss * micro.numerator / micro.denominator
    if accelerator is None:
        share.backward()
    else:  # accelerate divides by the accumulation steps and the ranks average: `scale` undoes both
        accelerator.backward(share * scale)


def _clip(model, accelerator, max_grad_norm: float) -> float:
    max_norm = max_grad_norm if max_grad_norm > 0 else float("inf")
    if accelerator is None:
        parameters = [p for p in model.parameters() if p.requires_grad]
        return float(torch.nn.utils.clip_grad_norm_(parameters, max_norm))
    norm = accelerator.clip_grad_norm_(model.parameters(), max_norm)  # DeepSpeed clips in its step
    return float("nan") if norm is None else float(norm)


_METRIC_NAMES = ("loss", "pg_loss", "clip_fraction", "kl", "ratio_mean", "entropy")  # policy_loss + entropy


def _summed_metrics(collected: list, accelerator) -> dict:
    """Sum over micro-batches (and ranks) of loss share x metric, plus the token count."""
    if accelerator is None:
        names = [k for k in collected[0][1] if k != "tokens"]
        sums = {k: sum(n * m[k] for n, m in collected) for k in names}
        return {**sums, "tokens": sum(m["tokens"] for _, m in collected)}
    names = list(_METRIC_NAMES)  # fixed, so the reduced vectors line up on every rank
    local = [sum(n * m[k] for n, m in collected) for k in names] + [sum(m["tokens"] for _, m in collected)]
    total = accelerator.reduce(torch.tensor(local, dtype=torch.float64, device=accelerator.device), "sum")
    return {**dict(zip(names, total[:-1].tolist())), "tokens": int(total[-1])}


def _optimizer_step(model, optimizer, reference, rows: list[dict], plan: list, config, pad_id: int,
                    accelerator=None, scale: int = 1) -> dict:
    optimizer.zero_grad(set_to_none=True)
    collected = []
    for micro in plan:
        with _accumulating(accelerator, model):
            batch = {key: [rows[i][key] for i in micro.rows] for key in rows[0]}
            loss, metrics = _micro_batch_loss(model, reference, batch, config, pad_id)
            _backward(loss, micro, accelerator, scale)
        if not micro.filler:
            collected.append((micro.numerator, metrics))
    grad_norm = _clip(model, accelerator, config.max_grad_norm)
    optimizer.step()
    sums = _summed_metrics(collected, accelerator)
    # weighted like the loss, so `loss` is the mini-batch loss however rows were cut or spread
    total = loss_share(rows, [], config.loss_aggregation)[1]
    averaged = {k: v / total for k, v in sums.items() if k != "tokens"}
    return {**averaged, "tokens": sums["tokens"], "grad_norm": grad_norm}


COLUMNS = ["prompt_token_ids", "response_token_ids", "response_logprobs", "token_advantages", "temperature"]


def launched() -> bool:
    """True under `accelerate launch` / torchrun (they set WORLD_SIZE), even with one process."""
    return "WORLD_SIZE" in os.environ or "ACCELERATE_MIXED_PRECISION" in os.environ


def _make_accelerator(config):
    """None for a plain single process (the bytes of a plain PyTorch loop); else an Accelerator."""
    if not (launched() or config.bf16):
        return None
    from accelerate import Accelerator

    # without CUDA, ask for CPU: processes started by the MULTI_GPU launcher then use gloo
    return Accelerator(cpu=not torch.cuda.is_available(), mixed_precision="bf16" if config.bf16 else None)


def _sharded(accelerator) -> bool:
    from accelerate.utils import DistributedType

    return accelerator is not None and accelerator.distributed_type in (DistributedType.FSDP, DistributedType.DEEPSPEED)


def _mini_batches(rows: list[dict], config, context: StageContext) -> list[tuple[int, list[dict]]]:
    """(epoch, rows) of every optimizer step, a fresh shuffle per pass over the batch."""
    orders = [np.random.default_rng([context.seed, context.step, epoch]).permutation(len(rows))
              for epoch in range(config.epochs)]
    return [(epoch, [rows[i] for i in orders[epoch][start:start + config.mini_batch_size]])
            for epoch in range(config.epochs) for start in range(0, len(rows), config.mini_batch_size)]


def _plans(steps, config, accelerator) -> tuple[list[list], int]:
    """This rank's micro-batches per step, padded so every rank runs the same number; and that number."""
    if accelerator is None:
        return [plan_step(mini, config) for _, mini in steps], 1
    ranks, rank = accelerator.num_processes, accelerator.process_index
    everyone = [[plan_step(mini, config, r, ranks) for r in range(ranks)] for _, mini in steps]
    count = max(len(plan) for per_rank in everyone for plan in per_rank)
    return [pad_plan(per_rank[rank], count) for per_rank in everyone], count


def _configure_deepspeed(accelerator, config, accumulation: int) -> None:
    """DeepSpeed takes accumulation, micro-batch size and clipping from its own config: set them here
    so UpdateConfig stays the one source of truth."""
    plugin = accelerator.state.deepspeed_plugin
    if plugin is None:
        return
    micro = config.micro_batch_size
    plugin.deepspeed_config.update({
        "gradient_accumulation_steps": accumulation, "train_micro_batch_size_per_gpu": micro,
        "train_batch_size": micro * accumulation * accelerator.num_processes,
        "gradient_clipping": config.max_grad_norm if config.max_grad_norm > 0 else 0.0})


def _optimizer(model, names: list[str], config, context: StageContext, accelerator):
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay)
    if not _sharded(accelerator):
        load_optimizer(optimizer, names, context.policy.path)
    elif (context.policy.path / OPTIMIZER_TENSORS).exists() and accelerator.is_main_process:
        print("update: FSDP/ZeRO-3 run: the saved AdamW state is not loaded (fresh optimizer)", file=sys.stderr)
    for group in optimizer.param_groups:  # a config change of the learning rate takes effect
        group["lr"], group["weight_decay"] = config.learning_rate, config.weight_decay
    return optimizer


def _trained(model, tokenizer, optimizer, names: list[str], context: StageContext, accelerator):
    """What the runner saves (rank 0 only): (model, tokenizer, optimizer or its state, names)."""
    if accelerator is None:
        return model, tokenizer, optimizer, names
    state_dict = accelerator.get_state_dict(model)  # on every rank: FSDP/ZeRO-3 gather the shards
    sharded = _sharded(accelerator)
    optimizer_state = None if sharded else optimizer.state_dict()
    accelerator.wait_for_everyone()
    if not accelerator.is_main_process:
        return None
    if not sharded:
        return accelerator.unwrap_model(model), tokenizer, optimizer_state, names
    plain, _ = load_policy(context.policy.path)  # a plain copy to hold the gathered full weights
    plain.load_state_dict(state_dict)
    return plain, tokenizer, None, names


def _prepare(model, reference, config, context: StageContext, accelerator, accumulation: int):
    names = [name for name, _ in model.named_parameters()]
    if config.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    optimizer = _optimizer(model, names, config, context, accelerator)
    if accelerator is not None:
        accelerator.gradient_accumulation_steps = accumulation
        _configure_deepspeed(accelerator, config, accumulation)
        model, optimizer = accelerator.prepare(model, optimizer)
        reference = reference.to(accelerator.device) if reference is not None else None
    return model, reference, optimizer, names


def run(inputs, config, context: StageContext) -> StageOutput:
    rows = inputs["advantages"].select(COLUMNS).to_pylist()
    model, tokenizer = context.policy.load()
    reference = context.reference.load()[0].eval() if context.reference is not None else None
    accelerator = _make_accelerator(config)
    steps = _mini_batches(rows, config, context)
    plans, accumulation = _plans(steps, config, accelerator)
    model, reference, optimizer, names = _prepare(model, reference, config, context, accelerator, accumulation)
    scale = accumulation * accelerator.num_processes if accelerator is not None else 1
    model.train()
    log = []
    progress = context.progress and (accelerator is None or accelerator.is_main_process)
    for (epoch, mini), plan in tqdm(list(zip(steps, plans)), desc="update", disable=not progress, leave=False):
        log.append({"optimizer_step": len(log), "epoch": epoch,
                    **_optimizer_step(model, optimizer, reference, mini, plan, config, tokenizer.pad_token_id,
                                      accelerator, scale)})
    model.eval()
    table = make_table({key: [entry[key] for entry in log] for key in log[0]}, "update_log")
    metrics = {key: float(np.mean([entry[key] for entry in log])) for key in log[0] if key not in ("optimizer_step", "epoch")}
    return StageOutput(table, metrics, trained=_trained(model, tokenizer, optimizer, names, context, accelerator))
