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
turns on bf16 autocast. cpu-2proc.yaml (DDP) and cpu-fsdp-2proc.yaml (FSDP) run two CPU ranks (gloo), as
the tests do (accelerate would turn FSDP on CPU into DDP; `distributed.keep_fsdp_on_cpu` keeps it FSDP). Every rank reads
the whole batch and takes rows i % ranks of each mini-batch; the ranks average the gradients and
accelerate divides by the accumulation steps, so each loss is multiplied by both and the sum is the
single-process gradient. Ranks pad with zero-weight micro-batches to the same count (FSDP/ZeRO-3
gather parameters in every forward). Only rank 0 writes the checkpoint, update.parquet and the
manifest. Without a launcher (one process, `bf16` off) no Accelerator is made and the bytes are
those of a plain PyTorch loop; the KL reference model is replicated, not sharded.
The loss of one micro-batch: oarctl/training/batch_loss.py.
Loading, preparing and AdamW under each strategy, and the state a persistent update worker keeps
between steps: oarctl/training/setup.py. Gathering the weights and writing the checkpoint and the
training state: oarctl/training/save.py.
"""
from __future__ import annotations

import contextlib

import numpy as np
import torch
from tqdm.auto import tqdm

from oarctl.artifacts import make_table
from oarctl.batching import loss_share, pad_plan, plan_step
from oarctl.contract import StageContext, StageOutput
from oarctl.distributed import fsdp, gather_to_rank_zero, make_accelerator, rank
from oarctl.training.batch_loss import micro_batch_loss
from oarctl.training.save import trained_checkpoint, training_state_after_commit
from oarctl.training.setup import KeptState, checked_inputs, continue_kept, kept_state, load_and_prepare

VERSION = "3"  # 2: under token-mean, losses and metrics weighted by token share; 3: entropy at the sampling temperature


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
            loss, metrics = micro_batch_loss(model, reference, batch, config, pad_id)
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


COLUMNS = ("prompt_token_ids", "response_token_ids", "response_logprobs", "token_advantages", "temperature")


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
    ranks = accelerator.num_processes
    everyone = [[plan_step(mini, config, r, ranks) for r in range(ranks)] for _, mini in steps]
    count = max(len(plan) for per_rank in everyone for plan in per_rank)
    return [pad_plan(per_rank[rank()], count) for per_rank in everyone], count


def _train(rows: list[dict], config, context: StageContext, accelerator, kept: KeptState | None = None):
    """(model, tokenizer, optimizer, parameter names, KL reference, one log entry per optimizer step, this
    process's peak host memory once the model and optimizer are loaded and prepared)."""
    steps = _mini_batches(rows, config, context)
    plans, accumulation = _plans(steps, config, accelerator)
    model, tokenizer, optimizer, names, reference = (continue_kept(kept, config, accumulation) if kept else
                                                     load_and_prepare(config, context, accelerator, accumulation))
    loaded_peak = _peak_rss_mb()
    scale = accumulation * accelerator.num_processes if accelerator is not None else 1
    model.train()
    log = []
    progress = context.progress and rank() == 0
    for (epoch, mini), plan in tqdm(list(zip(steps, plans)), desc="update", disable=not progress, leave=False):
        log.append({"optimizer_step": len(log), "epoch": epoch,
                    **_optimizer_step(model, optimizer, reference, mini, plan, config, tokenizer.pad_token_id,
                                      accelerator, scale)})
    model.eval()
    optimizer.zero_grad(set_to_none=True)  # the gradients' memory goes back before the checkpoint is written
    return model, tokenizer, optimizer, names, reference, log, loaded_peak


def run(inputs, config, context: StageContext) -> StageOutput:
    rows = inputs["advantages"].select(COLUMNS).to_pylist()
    kept = kept_state(context)
    accelerator = kept.accelerator if kept else make_accelerator(config.bf16)
    with contextlib.nullcontext() if kept else checked_inputs(context, accelerator):  # kept: nothing is read
        model, tokenizer, optimizer, names, reference, log, loaded_peak = _train(rows, config, context, accelerator,
                                                                                 kept)
    table = make_table({key: [entry[key] for entry in log] for key in log[0]}, "update_log")
    metrics = {key: float(np.mean([entry[key] for entry in log])) for key in log[0] if key not in ("optimizer_step", "epoch")}
    metrics["resident"] = int(kept is not None)  # 1: trained on the state a persistent worker kept in memory
    trained = trained_checkpoint(model, tokenizer, optimizer, names, config, context, accelerator)
    memory = _per_rank({"host_load_peak_rss_mb": loaded_peak, "host_peak_rss_mb": _peak_rss_mb()}, accelerator)
    after_commit = None
    if fsdp(accelerator):
        keep = KeptState(accelerator, model, tokenizer, optimizer, names, reference, context.output, "") \
            if config.persistent and context.resident is not None else None
        after_commit = training_state_after_commit(model, optimizer, config, context, accelerator, keep)
    return StageOutput(table, {**metrics, **memory}, trained=trained, after_commit=after_commit)


def _peak_rss_mb() -> float:
    """This process's peak resident host memory so far, MB (Linux reports KB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _per_rank(values: dict[str, float], accelerator) -> dict:
    """{NAME_rank0, NAME_other_ranks (the largest; under a launcher)} of each of this rank's `values` on
    rank 0, {} on the others: what the node's RAM must hold per rank (call on every rank; one gather)."""
    everyone = gather_to_rank_zero(values, accelerator)
    if everyone is None:
        return {}
    summary = {}
    for name in values:
        summary[f"{name}_rank0"] = round(everyone[0][name], 1)
        if len(everyone) > 1:
            summary[f"{name}_other_ranks"] = round(max(peaks[name] for peaks in everyone[1:]), 1)
    return summary
