"""The formulas: every FLOP, byte moved and byte held that a prediction adds up, each with its formula
in its docstring. bench/scaling/calibration.py checks the forward FLOPs and the kept bytes per token per
layer against torch on CPU (python bench/scale.py --calibrate)."""
from __future__ import annotations

import numpy as np

from bench.scaling.model import Hardware, Shape


def layer_matmul_params(s: Shape) -> int:
    """Weights one decoder layer multiplies by: q, o: H x H; k, v: H x (kv_heads x head_dim);
    gate, up, down: H x I.   N_layer = 2 H^2 + 2 H kv d + 3 H I"""
    kv = s.kv_heads * s.head_dim
    return 2 * s.hidden * s.hidden + 2 * s.hidden * kv + 3 * s.hidden * s.intermediate


def parameters(s: Shape) -> int:
    """All weights: L (N_layer + q/k/v biases H + 2 kv d + two norms 2H) + final norm H
    + embeddings V H (+ an untied output projection V H)."""
    kv = s.kv_heads * s.head_dim
    per_layer = layer_matmul_params(s) + s.hidden + 2 * kv + 2 * s.hidden
    return s.layers * per_layer + s.hidden + s.vocab * s.hidden * (1 if s.tied else 2)


def forward_flops(s: Shape, tokens: float, attended: float, logits: float) -> float:
    """One forward: 2 N_layer L per computed token + attention 4 L heads d per (query, key) pair
    (QK^T and AV) + the vocabulary projection 2 H V per projected position.
        F = 2 L N_layer T + 4 L h d A + 2 H V K
    T tokens computed, A (query, key) pairs attended, K positions projected to the vocabulary.
    Norms, activations and softmax are left out (FlopCounterMode counts only matmuls too)."""
    return 2 * s.layers * layer_matmul_params(s) * tokens + 4 * s.layers * s.heads * s.head_dim * attended \
        + 2 * s.hidden * s.vocab * logits


def causal_keys(first, end):
    """(query, key) pairs when positions [first, end) are computed with a causal mask over a full
    prefix: sum_{j=first}^{end-1} (j + 1) = (end (end + 1) - first (first + 1)) / 2."""
    return (end * (end + 1) - first * (first + 1)) / 2


def backward_to_inputs_flops(forward: float) -> float:
    """OAR-G's torch.autograd.grad w.r.t. inputs_embeds: every matmul's input gradient (one matmul
    each) and no weight gradient.   F_bwd,inputs ~= 1 x F_fwd   (attention's backward is 2x its
    forward, a few % of F at these lengths; the calibration measures the ratio)."""
    return forward


def backward_full_flops(forward: float) -> float:
    """Training backward: input and weight gradients of every matmul.   F_bwd = 2 x F_fwd"""
    return 2 * forward


def kv_bytes_per_token(s: Shape, b: int) -> int:
    """Keys and values of one token over all layers: 2 L kv_heads d b."""
    return 2 * s.layers * s.kv_heads * s.head_dim * b


def activation_bytes_per_token_layer(s: Shape, b: int) -> int:
    """What one decoder layer keeps for the backward, per token (calibrated below):
        b (9H + 4I) + 2H (4 - b)
    9H: two RMSNorms (input and normalised, 2H each), q, rotated q, the keys and values repeated to
    all heads (GQA), the attention output and its reshaped copy; 4I: gate, silu(gate), up,
    silu(gate) x up. In bfloat16 the norms keep their float32 upcast input: 2 norms x H x 2 bytes more."""
    return b * (9 * s.hidden + 4 * s.intermediate) + 2 * s.hidden * (4 - b)


def checkpoint_bytes_per_token_layer(s: Shape, b: int) -> int:
    """With gradient checkpointing a layer keeps only its input: H b per token."""
    return s.hidden * b


def working_set_bytes_per_token(s: Shape, b: int) -> int:
    """One layer's working set per token: what it keeps for a backward (activation_bytes_per_token_layer),
    also used as the bound of a no-grad layer's live tensors (an overestimate: without grad most
    intermediates die at once)."""
    return activation_bytes_per_token_layer(s, b)


def forward_hbm_bytes(s: Shape, b: int, tokens: float, attended: float) -> float:
    """HBM traffic of one forward: the weights once (P b) + each layer's intermediates written and read
    once (2 b (9H + 4I) per token per layer) + keys/values read once per 128-query block (flash
    attention): P b + 2 L b (9H + 4I) T + kv_bytes A / 128."""
    return parameters(s) * b + 2 * s.layers * b * (9 * s.hidden + 4 * s.intermediate) * tokens \
        + kv_bytes_per_token(s, b) * attended / 128


def update_logits_bytes_per_token(s: Shape) -> int:
    """The update's vocabulary projection holds, per projected position, ~6 float32 V-vectors at its
    peak (the logits, float32 upcast / temperature, log_softmax, the entropy's exp and product, and in
    the backward their gradients): 6 x 4 x V bytes (3.65 MB at V = 152k). Only
    min(micro-batch tokens, update.logit_chunk_tokens) positions are projected at once
    (oarctl.policy.logprobs.response_token_stats; 0: the whole micro-batch)."""
    return 6 * 4 * s.vocab


def projected_positions(tokens: float, chunk_tokens: int) -> float:
    return min(tokens, chunk_tokens) if chunk_tokens > 0 else tokens


def fsdp_state_bytes(s: Shape, gpus: int) -> float:
    """FSDP full shard, fp32 master weights, fp32 gradient shards, AdamW m and v: 16 P / G bytes per GPU."""
    return 16 * parameters(s) / gpus


def trl_attribution_weight_bytes(s: Shape, gpus: int) -> dict[str, float]:
    """Weight bytes per GPU while OARGRPOTrainer attributes (activations: as the attribute stage's), with
    fp32 master weights, gradients and AdamW (16 P) and bf16 compute weights:
    - DDP: every GPU holds all of it: 16 P;
    - FSDP / ZeRO-3 on the shards (attribution_params="sharded", padded calls): 16 P / G, plus the units
      gathered at once: the root unit in fp32 for the embedding lookup (FSDP1 summon_full_params gathers
      full precision; V H, x2 untied) and two decoder layers in bf16 (one running, one prefetched):
      16 P / G + 4 V H (2 untied) + 2 x 2 N_layer;
    - FSDP1 gathered (summon_full_params, full precision): 16 P / G + 4 P;
    - ZeRO-3 gathered (GatheredParameters of the bf16 partitions): 16 P / G + 2 P."""
    params, embeddings = parameters(s), s.vocab * s.hidden * (1 if s.tied else 2)
    shards = fsdp_state_bytes(s, gpus)
    return {"ddp": 16 * params, "sharded": shards + 4 * embeddings + 2 * 2 * layer_matmul_params(s),
            "fsdp_gathered": shards + 4 * params, "zero3_gathered": shards + 2 * params}


def roofline_seconds(flops, hbm_bytes, link_bytes, hw: Hardware, dtype: str):
    """A kernel's time: max(F / peak, bytes / HBM bandwidth, link bytes / NVLink bandwidth) / efficiency."""
    return np.maximum(np.maximum(np.asarray(flops) / hw.peak(dtype), np.asarray(hbm_bytes) / (hw.hbm_tbps * 1e12)),
                      np.asarray(link_bytes) / (hw.nvlink_gbps * 1e9)) / hw.efficiency
