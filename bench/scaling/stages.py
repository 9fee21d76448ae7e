"""The sample and update stages' costs (the attribute stage's: bench/scaling/attribute.py)."""
from __future__ import annotations

import numpy as np

from oarctl.batching import pad_plan, plan_step  # (no torch)

from bench.scaling.assumptions import fragmentation
from bench.scaling.cost import Cost
from bench.scaling.formulas import (activation_bytes_per_token_layer, backward_full_flops, causal_keys,
                                    checkpoint_bytes_per_token_layer, forward_flops, forward_hbm_bytes,
                                    fsdp_state_bytes, kv_bytes_per_token, layer_matmul_params, parameters,
                                    projected_positions, roofline_seconds, update_logits_bytes_per_token,
                                    working_set_bytes_per_token)
from bench.scaling.model import GB, Hardware, dtype_bytes
from bench.scaling.setting import Setting, accelerate_kind, accelerate_processes


def sample_stage(setting: Setting, hw: Hardware) -> Cost:
    """vLLM, data_parallel_size engines of one GPU each, a contiguous share of the prompts each.
    Prefill: every prompt once (vLLM's prefix cache serves the group's other samples).
    Decode: one step per token of the engine's longest response; a step reads the weights and the
    keys/values of every live sequence and computes one token for each of them."""
    s, L, cfg = setting.shape, setting.lengths, setting.config
    engines = max(1, cfg.vllm.data_parallel_size)
    b = dtype_bytes("bfloat16" if cfg.vllm.dtype in ("auto", "bfloat16") else cfg.vllm.dtype)
    dtype = "bfloat16" if b == 2 else "float32"
    weights = parameters(s) * b
    kv = kv_bytes_per_token(s, b)
    prompts = np.arange(len(L.responses)) // L.group
    engines_costs = []
    for share in np.array_split(np.arange(prompts.max() + 1), engines):
        cost = Cost()
        rows = L.responses[np.isin(prompts, share)]
        n = len(share)
        cost.add(forward_flops(s, n * L.prompt, n * causal_keys(0, L.prompt), n),
                 forward_hbm_bytes(s, b, n * L.prompt, n * causal_keys(0, L.prompt)), hw, dtype)
        steps = np.arange(int(rows.max()))
        live = (rows[None, :] > steps[:, None]).sum(axis=1)  # sequences still decoding at each step
        context = live * (L.prompt + steps + 1)  # keys each step attends to, over the live sequences
        cost.add(forward_flops(s, live, context, live), weights + kv * context, hw, dtype)
        cost.hold(weights=weights, kv_cache=float(context.max()) * kv, vllm_workspace=2 * GB)
        cost.decode_steps = len(steps)
        engines_costs.append(cost)
    stage = Cost(flops=sum(c.flops for c in engines_costs), hbm_bytes=sum(c.hbm_bytes for c in engines_costs),
                 seconds=max(c.seconds for c in engines_costs))
    need = max(c.held_bytes for c in engines_costs)
    reserved = cfg.vllm.gpu_memory_utilization * hw.memory_gb * GB
    stage.hold(vllm_reserved=max(reserved, need))
    # no model copy for the canary: its reference travels with the checkpoint (oarctl/policy/canary.py)
    stage.hold(cuda_overhead=hw.overhead_gb * GB)
    stage.vllm_fits = need <= reserved
    biggest = max(engines_costs, key=lambda c: c.held_bytes)
    stage.note = (f"{engines} engines, the slowest decodes {max(c.decode_steps for c in engines_costs)} steps; vLLM "
                  f"needs {need / GB:.1f} of its {reserved / GB:.0f} GB (weights {weights / GB:.1f}, peak KV "
                  f"{biggest.held['kv_cache'] / GB:.1f}, workspace 2)")
    return stage


def update_stage(setting: Setting, hw: Hardware) -> Cost:
    """Forward + backward (3 forwards, 6 N T) + a recompute forward with gradient checkpointing, under
    update.accelerate_config (FSDP: bf16 compute params all-gathered per layer, fp32 master weights,
    gradients and AdamW sharded 16 P / G; gradients accumulate unsharded under accelerate's no_sync,
    in the bf16 param dtype: 2 P). Rows of each mini-batch are dealt i % G to the ranks and cut into
    micro-batches by oarctl.batching.plan_step (micro_batch_tokens, or micro_batch_size); every rank
    runs as many micro-batches as the fullest (pad_plan), in lockstep. Held per GPU: the shards, the
    unsharded gradients, the gathered root unit (embeddings + output projection) and two layers, the
    activations and the full-vocabulary logits of the largest micro-batch (printed apart)."""
    s, L, u = setting.shape, setting.lengths, setting.config.update
    kind = accelerate_kind(u.accelerate_config)
    ranks = accelerate_processes(u.accelerate_config, hw.gpus) if kind != "none" else 1
    dtype = "bfloat16" if u.bf16 else "float32"
    b = dtype_bytes(dtype)
    P = parameters(s)
    minis, plans, count = _update_plans(L, u, ranks)
    sharded = kind in ("fsdp", "zero3")
    link_per_micro = (2 * P * b * (ranks - 1) / ranks) * (2 if sharded else 0)  # all-gather fwd + bwd
    cost = Cost()
    for mini, per_rank in zip(minis, plans):
        per_rank = [pad_plan(plan, count) for plan in per_rank]
        mini_widths = [L.prompt + len(row["response_token_ids"]) for row in mini]
        for j in range(count):
            cost.seconds += _lockstep_micro_batch(cost, setting, hw, [plan[j] for plan in per_rank], mini_widths,
                                                  dtype, link_per_micro)
        # AdamW over this rank's shard: read p, g, m, v, write p, m, v (fp32); the gradient reduce-scatter
        cost.add(0.0, 28 * P / (ranks if sharded else 1), hw, "float32", link_bytes=(2 * P * b if ranks > 1 else 0))
    if sharded:
        root = s.vocab * s.hidden * (1 if s.tied else 2) * b
        layer = (layer_matmul_params(s) + 3 * s.hidden) * b
        cost.hold(sharded_state=fsdp_state_bytes(s, ranks), unsharded_grads_no_sync=(P * b if count > 1 else 0),
                  gathered_params=root + 2 * layer)
    else:
        cost.hold(weights_grads_adam=16 * P)
    cost.hold(cuda_overhead=hw.overhead_gb * GB)
    cost.note = (f"{kind} over {ranks} GPU{'s' if ranks > 1 else ''}, {count} micro-batches per rank per optimizer step"
                 f" x {len(minis)} steps, {dtype}{', checkpointing' if u.gradient_checkpointing else ''}")
    return cost


def _update_plans(L, u, ranks: int):
    """(mini-batches, each one's plan per rank, micro-batches per rank): the rows shuffled as
    update._mini_batches does, cut by oarctl.batching.plan_step; every rank runs as many as the fullest."""
    rows = [{"prompt_token_ids": [0] * L.prompt, "response_token_ids": [0] * int(r)} for r in L.responses]
    order = np.random.default_rng([0, 0, 0]).permutation(len(rows))  # update._mini_batches' shuffle
    minis = [[rows[i] for i in order[start:start + u.mini_batch_size]] for _ in range(u.epochs)
             for start in range(0, len(rows), u.mini_batch_size)]
    plans = [[plan_step(mini, u, r, ranks) for r in range(ranks)] for mini in minis]
    count = max(len(plan) for per_rank in plans for plan in per_rank)
    return minis, plans, count


def _lockstep_micro_batch(cost: Cost, setting: Setting, hw: Hardware, micros: list, mini_widths: list[int],
                          dtype: str, link_per_micro: float) -> float:
    """One micro-batch on every rank at once (`micros`: each rank's), its work and held bytes added to
    `cost`; returns the seconds of the slowest rank."""
    s, u = setting.shape, setting.config.update
    b = dtype_bytes(dtype)
    forwards = 3 + (1 if u.gradient_checkpointing else 0)
    slowest = 0.0
    for micro in micros:
        n, width = len(micro.rows), max(mini_widths[i] for i in micro.rows)
        tokens = n * width
        f = forward_flops(s, tokens, n * causal_keys(0, width), tokens)
        m = forward_hbm_bytes(s, b, tokens, n * causal_keys(0, width))
        seconds = float(roofline_seconds(f + backward_full_flops(f) + (f if u.gradient_checkpointing else 0),
                                         m * forwards, link_per_micro, hw, dtype))
        slowest = max(slowest, seconds)
        cost.flops += f * forwards
        cost.hbm_bytes += m * forwards
        cost.link_bytes += link_per_micro
        if u.gradient_checkpointing:
            activations = tokens * (s.layers * checkpoint_bytes_per_token_layer(s, b) + working_set_bytes_per_token(s, b))
        else:
            activations = tokens * s.layers * activation_bytes_per_token_layer(s, b)
        cost.hold(activations=activations * fragmentation(),
                  logits_chunk=projected_positions(tokens, u.logit_chunk_tokens) * update_logits_bytes_per_token(s))
    return slowest
