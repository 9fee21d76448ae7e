"""The 7B arithmetic: FLOPs, bytes moved, bytes held per GPU and predicted seconds of every stage of
one RL step, for the shipped real-size configs (issue 14). Nothing here runs on a GPU: every number
printed for a GPU is a prediction from the formulas below, and is labelled so.

    python bench/scale.py                       # every configs/qwen2.5-*/*.yaml: the arithmetic, no torch, seconds
    python bench/scale.py --calibrate           # + the CPU calibration (torch, transformers: ~30-60 s on 2 cores)
    python bench/scale.py --quick               # the arithmetic only, never the calibration (for tests)
    python bench/scale.py --config FILE.yaml [--shape 7b|1.5b] [--gpus 8 --tflops 989 --memory-gb 80 ...]
    python bench/scale.py --set attribute.max_batch_tokens=8192 ...   # what-if: override options in every file

What a prediction assumes (all printed at the top of a run):
- the model shape follows from policy.path's name (Qwen2.5[-Math]-7B or -1.5B), or --shape;
- one step = prompts_per_step x group_size responses; prompts of --prompt-tokens tokens; response
  lengths R = min(X, max_new_tokens), X lognormal with shape --sigma and its scale solved so that
  E[R] = --mean-response (a censored lognormal: responses that hit the cap stay at the cap). The
  distribution is evaluated at the n quantiles (i + 1/2) / n, shuffled (seed 0) into groups: exact
  moments, and groups as mixed in length as independent draws (real groups are more alike, so
  padding is overestimated a little);
- a response is reasoning + 4 conclude + 4 answer + 2 closing tokens (answer_mean: 4 outcome
  positions, last: 1);
- every kernel (a forward pass, a decode step, a micro-batch) takes max(FLOPs / peak, HBM bytes /
  bandwidth, NVLink bytes / link bandwidth) / efficiency: one --efficiency for every stage;
- engine starts, model loads, verification and the checkpoint write (~90 GB per step) are not in
  the seconds: they add to every stage but attribute, so the attribute shares printed are upper bounds.

The formulas are the small functions of the "formulas" section, each with its formula in its
docstring. --calibrate checks two of them on CPU against a
random-init Qwen2 of the 7B's proportions scaled down: the forward FLOPs (torch's FlopCounterMode)
and the bytes per token per layer that OAR-G's backward keeps (saved-tensor hooks, without and
with gradient checkpointing).
"""
from __future__ import annotations

import argparse
import functools
import math
import statistics
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from oarctl.batching import fixed_size, pad_plan, plan_step, token_budget  # noqa: E402  (no torch)
from oarctl.config import Config  # noqa: E402

from bench import gpu_check  # noqa: E402  (its part long's knobs; imports no torch)

GB = 1e9
CONCLUDE_TOKENS, ANSWER_TOKENS, CLOSING_TOKENS = 4, 4, 2  # `\boxed{`, the answer, `}` + eos
METHODS = ("uniform", "random", "entropy", "oar_p", "oar_p_span", "oar_p_screened", "oar_g", "oar_flow",
           "oar_flow_span")  # the registry, but:
# the truth methods read labels only the chains toy world has; mc_value (sampled continuations) is not modelled
NOT_MODELLED = ("truth", "truth_shuffled", "truth_last", "mc_value")
OAR_P_FAMILY = ("oar_p", "oar_p_span", "oar_p_screened", "oar_flow", "oar_flow_span")
FLOW_LOGIT_TOKENS = 1024  # oarctl.attribution.flow.LOGIT_TOKENS: rows x positions projected at once


# ---- model shapes --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Shape:
    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    tied: bool

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


# From the models' config.json. Qwen2.5-7B (and -Math-7B) pad their vocabulary to 152,064 rows;
# the 1.5B models have 151,936 (the tokenizer's 151,665 tokens either way).
SHAPES = {
    "7b": Shape("Qwen2.5-7B", 3584, 28, 28, 4, 18944, 152064, False),
    "1.5b": Shape("Qwen2.5-1.5B", 1536, 28, 12, 2, 8960, 151936, True),
}


def shape_of(policy_path: str) -> Shape:
    name = policy_path.lower()
    for key in ("1.5b", "7b"):
        if f"-{key}" in name:
            return SHAPES[key]
    raise SystemExit(f"{policy_path}: no known shape in the name; pass --shape 7b or --shape 1.5b")


# ---- hardware ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Hardware:
    gpus: int
    tflops: float  # dense bf16 peak
    fp32_tflops: float  # plain fp32 (PyTorch's default: no TF32 in matmuls)
    memory_gb: float
    hbm_tbps: float
    nvlink_gbps: float  # per GPU, one direction
    efficiency: float  # share of every peak that every kernel reaches
    overhead_gb: float  # per GPU and process: CUDA context, cuBLAS/NCCL workspaces

    def peak(self, dtype: str) -> float:
        return (self.tflops if dtype == "bfloat16" else self.fp32_tflops) * 1e12


def dtype_bytes(dtype: str) -> int:
    return 2 if dtype in ("bfloat16", "float16") else 4


# ---- formulas ------------------------------------------------------------------------------------

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


# ---- response lengths ----------------------------------------------------------------------------

def _lognormal_censored_moment(mu: float, sigma: float, cap: float, k: int) -> float:
    """E[min(X, cap)^k], X ~ LogNormal(mu, sigma):
    e^{k mu + k^2 sigma^2 / 2} Phi((ln cap - mu - k sigma^2) / sigma) + cap^k (1 - Phi((ln cap - mu) / sigma))."""
    phi = statistics.NormalDist().cdf
    z = (math.log(cap) - mu) / sigma
    return math.exp(k * mu + k * k * sigma * sigma / 2) * phi(z - k * sigma) + cap ** k * (1 - phi(z))


@dataclass(frozen=True)
class Lengths:
    responses: np.ndarray  # (n,) response tokens, grouped: rows [g G, (g + 1) G) are prompt g's samples
    prompt: int
    group: int
    cap: int
    mean: float  # E[R] of the distribution
    second: float  # E[R^2]
    at_cap: float  # P(R = cap)
    sigma: float


def response_lengths(n: int, group: int, prompt: int, mean: float, cap: int, sigma: float, seed: int = 0) -> Lengths:
    """n lengths R = min(X, cap), X ~ LogNormal(mu, sigma), mu solved (bisection) so that E[R] = mean;
    taken at the quantiles (i + 1/2) / n and shuffled (seeded) into groups of `group`."""
    low, high = -5.0, math.log(cap) + 5
    for _ in range(200):
        mu = (low + high) / 2
        low, high = (mu, high) if _lognormal_censored_moment(mu, sigma, cap, 1) < mean else (low, mu)
    inverse = statistics.NormalDist(mu, sigma).inv_cdf
    quantiles = [min(cap, max(CONCLUDE_TOKENS + ANSWER_TOKENS + CLOSING_TOKENS + 1, round(math.exp(inverse((i + 0.5) / n)))))
                 for i in range(n)]
    shuffled = np.random.default_rng(seed).permutation(np.array(quantiles, dtype=np.int64))
    at_cap = 1 - statistics.NormalDist().cdf((math.log(cap) - mu) / sigma)
    return Lengths(shuffled, prompt, group, cap, _lognormal_censored_moment(mu, sigma, cap, 1),
                   _lognormal_censored_moment(mu, sigma, cap, 2), at_cap, sigma)


def reasoning_tokens(response):
    return np.maximum(1, np.asarray(response) - CONCLUDE_TOKENS - ANSWER_TOKENS - CLOSING_TOKENS)


def attributed_end(prompt: int, response):
    """The attributed sequence is cut at the last outcome position (the one predicting the last answer
    token): prompt + reasoning + conclude + answer - 1."""
    return prompt + reasoning_tokens(response) + CONCLUDE_TOKENS + ANSWER_TOKENS - 1


def outcome_positions(mode: str) -> int:
    return 1 if mode == "last" else ANSWER_TOKENS


# ---- the code's own batching rules (mirrored; tests/test_scale.py checks them against oarctl) -----

def batches_within(indices: list[int], widths, batch_size: int, max_batch_tokens: int) -> list[list[int]]:
    """oarctl.attribution.oar.batches_within: token budget (longest first), then batch_size rows."""
    groups = token_budget(indices, list(widths), max_batch_tokens) if max_batch_tokens else [indices]
    return [batch for g in groups for batch in fixed_size(g, batch_size)]


def chunk_rows(first: int, end: int, chunk_size: int, max_batch_tokens: int) -> int:
    """oarctl.attribution.oar.chunk_rows: chunk_size perturbed rows, fewer under the token budget."""
    if not max_batch_tokens:
        return chunk_size
    return max(1, min(chunk_size, max_batch_tokens // max(1, end - first)))


def perturbation_chunks(starts: np.ndarray, end: int, chunk_size: int, max_batch_tokens: int) -> list[tuple[int, int]]:
    """(first start, rows) of every chunk of the sorted perturbations (oar._perturbation_chunks)."""
    chunks, index = [], 0
    while index < len(starts):
        rows = min(chunk_rows(int(starts[index]), end, chunk_size, max_batch_tokens), len(starts) - index)
        chunks.append((int(starts[index]), rows))
        index += rows
    return chunks


def windows(reasoning_start: int, reasoning_end: int, span_tokens: int, max_perturbations: int) -> np.ndarray:
    """Starts of oar_p_span's windows (oar_p_cheap.windows): span_tokens wide, wider so that there are
    at most max_perturbations."""
    width = max(span_tokens, math.ceil((reasoning_end - reasoning_start) / max_perturbations))
    return np.arange(reasoning_start, reasoning_end, width)


def screened_count(reasoning: int, screen_fraction: float, audit_fraction: float, max_perturbations: int) -> int:
    """oar_p_screened's perturbations (oar_p_cheap.screened_positions): top = min(R, cap, max(1, ceil(f R)));
    audit = min(R - top, cap - top, round(a (R - top)))."""
    top = min(reasoning, max_perturbations, max(1, math.ceil(screen_fraction * reasoning)))
    audit = min(reasoning - top, max_perturbations - top, round(audit_fraction * (reasoning - top)))
    return top + audit


# ---- cost bookkeeping ----------------------------------------------------------------------------

@dataclass
class Cost:
    """A stage (or a part of one): work summed over all GPUs, seconds of the slowest GPU, bytes held
    per GPU at the peak (by term)."""
    flops: float = 0.0
    hbm_bytes: float = 0.0
    link_bytes: float = 0.0
    seconds: float = 0.0
    held: dict = field(default_factory=dict)
    note: str = ""
    token_forwards: float = 0.0  # OAR-P: perturbed token-forwards
    vllm_fits: bool = True  # sample: vLLM's needs within gpu_memory_utilization
    decode_steps: int = 0

    def add(self, flops, hbm_bytes, hw: Hardware, dtype: str, link_bytes=0.0) -> float:
        seconds = float(np.sum(roofline_seconds(flops, hbm_bytes, link_bytes, hw, dtype)))
        self.flops += float(np.sum(flops))
        self.hbm_bytes += float(np.sum(hbm_bytes))
        self.link_bytes += float(np.sum(link_bytes))
        self.seconds += seconds
        return seconds

    def hold(self, **terms) -> None:
        """Keep, per term, the largest value seen (transient terms peak at the biggest batch)."""
        for name, value in terms.items():
            self.held[name] = max(self.held.get(name, 0.0), float(value))

    @property
    def held_bytes(self) -> float:
        return sum(self.held.values())

    def merge(self, other: "Cost") -> None:
        self.flops += other.flops
        self.hbm_bytes += other.hbm_bytes
        self.link_bytes += other.link_bytes
        self.seconds += other.seconds
        self.token_forwards += other.token_forwards
        self.hold(**other.held)


def spread_over_ranks(parts: list[Cost], ranks: int) -> Cost:
    """Whole groups dealt to `ranks` replicas, largest first to the least loaded (as even as
    oarctl.distributed.deal's token counts): the stage lasts as long as its busiest rank."""
    loads = [0.0] * ranks
    total = Cost()
    for part in sorted(parts, key=lambda p: -p.seconds):
        loads[loads.index(min(loads))] += part.seconds
        total.flops += part.flops
        total.hbm_bytes += part.hbm_bytes
        total.token_forwards += part.token_forwards
        total.hold(**part.held)
    total.seconds = max(loads) if parts else 0.0
    return total


# ---- stages --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Setting:
    """A config file reduced to what the arithmetic reads."""
    path: str
    shape: Shape
    config: Config
    lengths: Lengths
    mixed_fraction: float  # assumed share of groups with mixed rewards (skip_uniform_groups scores only those)


def _accelerate_processes(path: str, default: int) -> int:
    file = ROOT / path
    if not path or not file.is_file():
        return 1 if not path else default
    return int((yaml.safe_load(file.read_text()) or {}).get("num_processes", default))


def _accelerate_kind(path: str) -> str:
    if not path:
        return "none"
    file = ROOT / path
    settings = yaml.safe_load(file.read_text()) if file.is_file() else {}
    return {"FSDP": "fsdp", "DEEPSPEED": "zero3"}.get(settings.get("distributed_type"), "ddp")


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


def _group_rows(setting: Setting, skip_uniform: bool) -> list[np.ndarray]:
    """Row indices of each group the attribute stage scores (mixed groups first when skipping)."""
    L = setting.lengths
    groups = [np.arange(g * L.group, (g + 1) * L.group) for g in range(len(L.responses) // L.group)]
    if skip_uniform:
        groups = groups[:round(setting.mixed_fraction * len(groups))]
    return groups


def oar_g_group(setting: Setting, hw: Hardware, rows: np.ndarray) -> Cost:
    """OAR-G of one group (one prompt's samples), batched as oar._prefix_batches does. Per batch of b rows
    padded to S suffix tokens: the prompt once without grad; the teacher (no grad), the noisy forward
    and the backward to inputs_embeds (~1 forward) over b S tokens; +1 forward with gradient
    checkpointing. Held: b S L x the kept bytes per token per layer (all activations, or the layer
    inputs plus one layer's working set), the embeddings, noise and their gradient (3 b S H), the
    prompt's keys/values, logits at the union of outcome positions."""
    s, L, a = setting.shape, setting.lengths, setting.config.attribute
    b = dtype_bytes(a.dtype)
    cost = Cost()
    ends = attributed_end(L.prompt, L.responses[rows])
    order = list(np.argsort(ends, kind="stable"))
    widths = {i: int(ends[i]) for i in order}
    forwards = 3 + (1 if a.gradient_checkpointing else 0)
    K = outcome_positions(a.oar_g_mode)
    for batch in batches_within(order, [widths[i] for i in range(len(rows))], a.batch_size, a.max_batch_tokens):
        n = len(batch)
        width = max(widths[i] for i in batch)
        suffix = width - L.prompt
        keys = n * causal_keys(L.prompt, width)
        union = n * K  # rows' outcome positions differ: every row is projected at the union
        cost.add(forward_flops(s, L.prompt, causal_keys(0, L.prompt), 0), forward_hbm_bytes(s, b, L.prompt, causal_keys(0, L.prompt)),
                 hw, a.dtype)
        f = forward_flops(s, n * suffix, keys, n * union)
        m = forward_hbm_bytes(s, b, n * suffix, keys)
        cost.add(f * (forwards - 1) + backward_to_inputs_flops(f), m * forwards, hw, a.dtype)  # teacher, noisy (, recompute), backward
        tokens = n * suffix
        if a.gradient_checkpointing:
            activations = tokens * (s.layers * checkpoint_bytes_per_token_layer(s, b) + working_set_bytes_per_token(s, b))
        else:
            activations = tokens * s.layers * activation_bytes_per_token_layer(s, b)
        cost.hold(activations=activations * fragmentation(),
                  embeddings_noise_grad=3 * tokens * s.hidden * b,
                  prompt_kv=L.prompt * kv_bytes_per_token(s, b) + n * width * kv_bytes_per_token(s, b) / s.layers,
                  logits=n * union * s.vocab * (b + 8))
    return cost


def entropy_batches(setting: Setting, hw: Hardware, rows: np.ndarray) -> Cost:
    """Entropy: one no-grad forward over prompt + reasoning, the vocabulary projection at every reasoning
    position. Held: one layer's working set, the (b, U, V) logits in the policy dtype and one row's
    float32 log-softmax and probabilities (2 R V x 4)."""
    s, L, a = setting.shape, setting.lengths, setting.config.attribute
    b = dtype_bytes(a.dtype)
    cost = Cost()
    reasoning = reasoning_tokens(L.responses[rows])
    ends = L.prompt + reasoning
    for batch in batches_within(list(range(len(rows))), [int(e) for e in ends], a.batch_size, a.max_batch_tokens):
        n, width = len(batch), int(max(ends[i] for i in batch))
        projected = n * (width - L.prompt)  # every row at the union of reasoning positions
        cost.add(forward_flops(s, n * width, n * causal_keys(0, width), n * projected),
                 forward_hbm_bytes(s, b, n * width, n * causal_keys(0, width)) + n * projected * s.vocab * b, hw, a.dtype)
        cost.hold(activations=n * width * working_set_bytes_per_token(s, b) * fragmentation(),
                  logits=n * projected * s.vocab * b + 2 * (width - L.prompt) * s.vocab * 4)
    return cost


def perturbation_starts(method: str, prompt: int, reasoning: int, span_tokens: int, max_perturbations: int,
                        screen_fraction: float, audit_fraction: float) -> np.ndarray:
    """Sorted starts of one response's perturbations: every reasoning token (oar_p), the windows
    (oar_p_span), or screen + audit positions spread evenly over the reasoning (oar_p_screened)."""
    if method in ("oar_p", "oar_flow"):
        return np.arange(prompt, prompt + reasoning)
    if method in ("oar_p_span", "oar_flow_span"):
        return windows(prompt, prompt + reasoning, span_tokens, max_perturbations)
    count = screened_count(reasoning, screen_fraction, audit_fraction, max_perturbations)
    return np.unique(prompt + np.floor((np.arange(count) + 0.5) * reasoning / count).astype(np.int64))


@functools.lru_cache(maxsize=None)
def perturbations(s: Shape, hw: Hardware, dtype: str, chunk_size: int, max_batch_tokens: int, prompt: int,
                  response: int, method: str, mode: str, span_tokens: int, max_perturbations: int,
                  screen_fraction: float, audit_fraction: float, fragmentation: float) -> Cost:
    """OAR-P's engine (oar.perturbation_scores) for one response: a clean forward of the sequence with its
    key/value cache, then chunks of perturbed rows; a chunk of k rows whose first perturbation starts at
    f recomputes k (end - f) tokens, attending to the cached prefix, projecting K outcome positions per
    row, no grad. Held: the clean cache, one layer's keys/values concatenated for k rows, one layer's
    working set for k (end - f) tokens, the k x K logits (float64 outcome math). Cached: the same
    response under the same knobs costs the same.

    oar_flow / oar_flow_span (flow.flow_scores) also project every row at the reasoning positions after
    its chunk's first start (the log-probability drops of later tokens), and the clean pass at all
    reasoning positions: + 2 H V per such position, FLOW_LOGIT_TOKENS x V logits (b + 8 bytes) held."""
    b = dtype_bytes(dtype)
    end = int(attributed_end(prompt, response))
    reasoning_end = prompt + int(reasoning_tokens(response))
    flow = method in ("oar_flow", "oar_flow_span")
    starts = perturbation_starts(method, prompt, int(reasoning_tokens(response)), span_tokens, max_perturbations,
                                 screen_fraction, audit_fraction)
    K = outcome_positions(mode)
    cost = Cost()
    clean_projected = K + (reasoning_end - prompt if flow else 0)
    cost.add(forward_flops(s, end, causal_keys(0, end), clean_projected), forward_hbm_bytes(s, b, end, causal_keys(0, end)),
             hw, dtype)
    chunks = np.array(perturbation_chunks(starts, end, chunk_size, max_batch_tokens), dtype=np.float64).reshape(-1, 2)
    first, k = chunks[:, 0], chunks[:, 1]
    tokens = k * (end - first)
    keys = k * causal_keys(first, end)
    projected = k * K + (k * np.maximum(reasoning_end - 1 - first, 0) if flow else 0)
    cost.add(forward_flops(s, tokens, keys, projected), forward_hbm_bytes(s, b, tokens, keys), hw, dtype)
    if len(tokens):
        worst = int(np.argmax(tokens))
        rows, suffix = k[worst], end - first[worst]
        cost.hold(activations=rows * suffix * working_set_bytes_per_token(s, b) * fragmentation,
                  prefix_kv=end * kv_bytes_per_token(s, b) + rows * end * kv_bytes_per_token(s, b) / s.layers,
                  logits=(rows * K + (FLOW_LOGIT_TOKENS if flow else 0)) * s.vocab * (b + 8))
    cost.token_forwards = float(tokens.sum())
    return cost


def oar_p_group(setting: Setting, hw: Hardware, rows: np.ndarray, method: str) -> Cost:
    """The OAR-P family on one group: exact (every reasoning token, ~R^2/2 token-forwards), span
    (one window of span_tokens per perturbation, at most max_perturbations; + one OAR-G pass when
    span_spread is oar_g), screened (one OAR-G pass, then screen + audit fractions of the tokens,
    capped at max_perturbations, spread evenly over the reasoning: average suffix ~R/2)."""
    a = setting.config.attribute
    cost = Cost()
    if method == "oar_p_screened" or (method == "oar_p_span" and a.span_spread == "oar_g"):
        cost.merge(oar_g_group(setting, hw, rows))
    for response in setting.lengths.responses[rows]:
        cost.merge(perturbations(setting.shape, hw, a.dtype, a.chunk_size, a.max_batch_tokens, setting.lengths.prompt,
                                 int(response), method, a.oar_p_mode, a.span_tokens, a.max_perturbations,
                                 a.screen_fraction, a.audit_fraction, fragmentation()))
    return cost


_FRAGMENTATION = {"value": 1.25}  # --fragmentation
_IO = {"disk": 3.0, "hash": 1.07}  # --disk-gbps, --hash-gbps


def fragmentation() -> float:
    """Allocator headroom on activations: the caching allocator's peak over the saved tensors
    (measured 2026-12-03 on a scaled random Qwen2, hidden 448: ~1.24x on OAR-G)."""
    return _FRAGMENTATION["value"]


def attribute_stage(setting: Setting, hw: Hardware, method: str) -> Cost:
    """The attribute stage with `method` and the config's attribute knobs: groups dealt over the ranks
    of attribute.accelerate_config (each a replica of the policy in attribute.dtype), or one GPU."""
    a = setting.config.attribute
    ranks = _accelerate_processes(a.accelerate_config, hw.gpus)
    if method in ("uniform", "random"):
        cost = Cost(note="free (no model call)")
        return cost
    parts = []
    for rows in _group_rows(setting, a.skip_uniform_groups):
        if method == "oar_g":
            parts.append(oar_g_group(setting, hw, rows))
        elif method == "entropy":
            parts.append(entropy_batches(setting, hw, rows))
        else:
            parts.append(oar_p_group(setting, hw, rows, method))
    cost = spread_over_ranks(parts, ranks)
    cost.hold(weights=parameters(setting.shape) * dtype_bytes(a.dtype), cuda_overhead=hw.overhead_gb * GB)
    token_forwards = sum(p.token_forwards for p in parts)
    cost.note = f"{ranks} GPU{'s' if ranks > 1 else ''}, {a.dtype}"
    if token_forwards:
        cost.note += f", {token_forwards / 1e6:.1f} M perturbed token-forwards"
    return cost


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
    kind = _accelerate_kind(u.accelerate_config)
    ranks = _accelerate_processes(u.accelerate_config, hw.gpus) if kind != "none" else 1
    dtype = "bfloat16" if u.bf16 else "float32"
    b = dtype_bytes(dtype)
    P = parameters(s)
    widths = L.prompt + L.responses
    rows = [{"prompt_token_ids": [0] * L.prompt, "response_token_ids": [0] * int(r)} for r in L.responses]
    order = np.random.default_rng([0, 0, 0]).permutation(len(rows))  # update._mini_batches' shuffle
    minis = [[rows[i] for i in order[start:start + u.mini_batch_size]] for _ in range(u.epochs)
             for start in range(0, len(rows), u.mini_batch_size)]
    plans = [[plan_step(mini, u, r, ranks) for r in range(ranks)] for mini in minis]
    count = max(len(plan) for per_rank in plans for plan in per_rank)
    sharded = kind in ("fsdp", "zero3")
    forwards = 3 + (1 if u.gradient_checkpointing else 0)
    link_per_micro = (2 * P * b * (ranks - 1) / ranks) * (2 if sharded else 0)  # all-gather fwd + bwd
    cost = Cost()
    for mini, per_rank in zip(minis, plans):
        per_rank = [pad_plan(plan, count) for plan in per_rank]
        mini_widths = [L.prompt + len(row["response_token_ids"]) for row in mini]
        for j in range(count):
            slowest = 0.0
            for plan in per_rank:
                micro = plan[j]
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
            cost.seconds += slowest
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


# ---- reporting -----------------------------------------------------------------------------------

def _set(config: Config, section: str, key: str, value, where: str) -> None:
    part = getattr(config, section, None)
    if part is None or not hasattr(part, key):
        raise SystemExit(f"{where}: unknown option {section}.{key}")
    setattr(part, key, value)


def apply_overrides(config: Config, overrides) -> None:
    """`section.key=value` strings (YAML values) onto `config`, as `oarctl --set` reads them."""
    for override in overrides:
        name, _, raw = override.partition("=")
        section, _, key = name.strip().partition(".")
        _set(config, section, key, yaml.safe_load(raw), f"--set {override}")


def load_setting(path: Path, shape: Shape | None, lengths_args, mixed_fraction: float, overrides=()) -> Setting:
    """The config's sections over the defaults (oarctl.config's dataclasses), then `section.key=value`
    overrides. tests/test_configs_real.py validates the files themselves; this does not import the
    registries, so it needs no torch."""
    config = Config()
    for section, values in (yaml.safe_load(path.read_text()) or {}).items():
        for key, value in (values or {}).items():
            _set(config, section, key, value, str(path))
    apply_overrides(config, overrides)
    lengths = response_lengths(config.sample.prompts_per_step * config.sample.group_size, config.sample.group_size,
                               lengths_args.prompt_tokens, lengths_args.mean_response, config.sample.max_new_tokens,
                               lengths_args.sigma)
    name = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
    return Setting(name, shape or shape_of(config.policy.path), config, lengths, mixed_fraction)


def _gb(value: float) -> str:
    return f"{value / GB:7.1f}"


def _fmt_seconds(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 120:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.1f} s"


@dataclass
class Report:
    setting: Setting
    stages: dict
    methods: dict
    fits: dict


    every_group: dict  # method -> seconds when every group is scored (for the mixed-fraction break-even)


def resident_update_bytes(setting: Setting, hw: Hardware) -> float:
    """Per GPU, what a persistent FSDP update worker (update.persistent) keeps between steps, beside the
    engines and the attribute stage: its shard of the fp32 weights and of AdamW's two moments, 12 P / G
    (the gradients are freed after each step)."""
    cfg = setting.config
    if not (cfg.update.persistent and _accelerate_kind(cfg.update.accelerate_config) == "fsdp"):
        return 0.0
    return 12 * parameters(setting.shape) / _accelerate_processes(cfg.update.accelerate_config, hw.gpus)


def evaluate_setting(setting: Setting, hw: Hardware) -> Report:
    method = setting.config.attribute.method
    methods = {m: attribute_stage(setting, hw, m) for m in METHODS}
    stages = {"sample": sample_stage(setting, hw), f"attribute ({method})": methods[method], "update": update_stage(setting, hw)}
    resident = resident_update_bytes(setting, hw)
    for cost in [stages["sample"], *methods.values()]:
        if resident and cost.held_bytes:  # a stage that holds nothing (uniform) does not run
            cost.hold(update_resident=resident)
    limit = hw.memory_gb * GB
    fits = {name: cost.held_bytes <= limit and cost.vllm_fits for name, cost in stages.items()}
    every_group = {}
    if setting.config.attribute.skip_uniform_groups:
        everyone = Setting(setting.path, setting.shape, setting.config, setting.lengths, 1.0)
        every_group = {m: attribute_stage(everyone, hw, m).seconds for m in ("oar_g", "oar_p_span", "oar_p_screened")}
    return Report(setting, stages, methods, fits, every_group)


def print_report(report: Report, hw: Hardware, check: bool) -> list[str]:
    setting, stages = report.setting, report.stages
    cfg, a = setting.config, setting.config.attribute
    print(f"\n== {setting.path}: {setting.shape.name}, attribute.method {a.method}, {hw.gpus}x "
          f"{hw.memory_gb:.0f} GB ==")
    print(f"   attribute: dtype {a.dtype}, accelerate_config {a.accelerate_config or '(none: one GPU)'}, "
          f"max_batch_tokens {a.max_batch_tokens}, batch_size {a.batch_size}, checkpointing {a.gradient_checkpointing}, "
          f"chunk_size {a.chunk_size}, span_tokens {a.span_tokens} ({a.span_spread}), max_perturbations "
          f"{a.max_perturbations}, screen/audit {a.screen_fraction}/{a.audit_fraction}, skip_uniform_groups "
          f"{a.skip_uniform_groups}" + (f" (assumed mixed-group fraction {setting.mixed_fraction})" if a.skip_uniform_groups else ""))
    u = cfg.update
    print(f"   update: {u.accelerate_config or '(one process)'}, micro_batch_tokens {u.micro_batch_tokens}, "
          f"micro_batch_size {u.micro_batch_size}, mini_batch_size {u.mini_batch_size}, bf16 {u.bf16}, "
          f"checkpointing {u.gradient_checkpointing}")
    total = sum(c.seconds for c in stages.values())
    print(f"   {'stage (predicted)':<26}{'PFLOP':>9}{'HBM TB moved':>14}{'held GB/GPU':>13}  fits  {'predicted s':>12}{'share':>7}")
    for name, cost in stages.items():
        print(f"   {name:<26}{cost.flops / 1e15:9.1f}{cost.hbm_bytes / 1e12:14.1f}{_gb(cost.held_bytes):>13}  "
              f"{'yes ' if report.fits[name] else 'NO  '}  {cost.seconds:12.1f}{100 * cost.seconds / total:6.1f}%")
        terms = ", ".join(f"{k} {v / GB:.1f}" for k, v in cost.held.items() if v)
        print(f"      {cost.note}; held (GB): {terms}")
    attribute_name = next(n for n in stages if n.startswith("attribute"))
    attribute = stages[attribute_name].seconds
    rest = total - attribute
    print(f"   predicted step: {total:.1f} s; attribute / (rest of the step) = {attribute / rest:.3f}"
          f" (rest = sample + update = {rest:.1f} s)")
    compute = {name.split()[0]: cost.seconds for name, cost in stages.items()}  # sample, attribute, update
    io_verdict = print_checkpoint_io(setting, hw, _IO["disk"], _IO["hash"], compute)
    update = stages["update"]
    print(f"   update's vocabulary-projection term (predicted): {update.held.get('logits_chunk', 0) / GB:.1f} GB/GPU "
          f"({update_logits_bytes_per_token(setting.shape) / 1e6:.2f} MB per projected position, "
          f"update.logit_chunk_tokens {setting.config.update.logit_chunk_tokens})")
    print(f"   every method with this file's attribute knobs (predicted; * = the file's method):")
    print(f"     {'method':<16}{'PFLOP':>9}{'held GB/GPU':>13}  fits  {'predicted':>10}  {'x rest of step':>14}")
    for name, cost in report.methods.items():
        held = cost.held_bytes
        fit = "yes " if held <= hw.memory_gb * GB else "NO  "
        mark = "*" if name == a.method else " "
        print(f"   {mark} {name:<16}{cost.flops / 1e15:9.1f}{_gb(held) if held else '      -':>13}  {fit if held else '    '}  "
              f"{_fmt_seconds(cost.seconds):>10}  {cost.seconds / rest:14.3f}")
    lines = []
    if not check:
        return lines
    tag = setting.path
    for name, ok in report.fits.items():
        cost = stages[name]
        lines.append(f"{'PASS' if ok else 'FAIL'} (a) {tag}: {name} fits in {hw.memory_gb:.0f} GB per GPU "
                     f"(predicted {cost.held_bytes / GB:.1f} GB)")
    if a.method == "oar_g":
        share = attribute / total
        lines.append(f"{'PASS' if share <= 0.10 else 'FAIL'} (b) {tag}: OAR-G attribute is {100 * share:.1f}% of the "
                     f"step (predicted {attribute:.1f} s of {total:.1f} s; limit 10%)" + _break_even(report, "oar_g", rest / 9))
    if a.method in OAR_P_FAMILY:
        cheap = {m: report.methods[m].seconds for m in ("oar_p_span", "oar_p_screened")}
        best = min(cheap, key=cheap.get)
        ratio = cheap[best] / rest
        lines.append(f"{'PASS' if ratio <= 1.0 else 'FAIL'} (c) {tag}: cheapest OAR-P variant {best} costs {ratio:.2f}x "
                     f"the rest of the step (predicted {cheap[best]:.1f} s vs {rest:.1f} s; limit 1x; "
                     f"{'oar_p_span' if best != 'oar_p_span' else 'oar_p_screened'} {max(cheap.values()) / rest:.2f}x)"
                     + _break_even(report, best, rest))
        if a.method != best:
            lines.append(f"FAIL (c) {tag}: attribute.method is {a.method}, not the cheapest variant {best}")
        exact = report.methods["oar_p"].seconds
        lines.append(f"INFO (c) {tag}: exact oar_p with these knobs: predicted {_fmt_seconds(exact)} per step "
                     f"({exact / rest:.1f}x the rest of the step)")
    lines.append(io_verdict)
    return lines


def _break_even(report: Report, method: str, budget: float) -> str:
    """With skip_uniform_groups the attribute seconds scale with the mixed-group fraction m: the largest m
    within `budget` seconds, from the cost of scoring every group."""
    if method not in report.every_group:
        return ""
    return (f"; holds while the mixed-group fraction is <= {min(1.0, budget / report.every_group[method]):.2f} "
            f"(assumed {report.setting.mixed_fraction})")


def exact_oar_p_references(setting: Setting, hw: Hardware) -> list[str]:
    """Exact OAR-P at the issue's two settings: fp32 on one GPU, bf16 on every GPU; every group scored."""
    lines = []
    for dtype, accelerate, label in (("float32", "", "fp32, 1 GPU"), ("bfloat16", "configs/accelerate/ddp.yaml",
                                                                        f"bf16, {hw.gpus} GPUs")):
        config = Config()
        for section in ("sample", "vllm", "update"):
            setattr(config, section, getattr(setting.config, section))
        config.attribute = type(setting.config.attribute)(**{**vars(setting.config.attribute), "dtype": dtype,
                                                             "accelerate_config": accelerate,
                                                             "skip_uniform_groups": False, "method": "oar_p"})
        variant = Setting(setting.path, setting.shape, config, setting.lengths, setting.mixed_fraction)
        cost = attribute_stage(variant, hw, "oar_p")
        lines.append(f"INFO exact oar_p, {label}, every row, chunk_size {config.attribute.chunk_size}, max_batch_tokens "
                     f"{config.attribute.max_batch_tokens}: predicted {_fmt_seconds(cost.seconds)} per step, "
                     f"{cost.flops / 1e18:.2f} EFLOP (the issue estimated 21-45 h fp32 on one GPU, 16-30 min bf16 on 8)")
    return lines


def print_shapes(hw: Hardware, lengths: Lengths) -> None:
    print("Model shapes (built in; from each model's config.json):")
    print(f"  {'model':<14}{'H':>6}{'L':>4}{'heads':>6}{'kv':>4}{'I':>7}{'V':>8} tied  {'params':>7}  "
          f"{'fwd GFLOP/token':>15}  {'KV KB/token':>11}  {'kept KB/token/layer bf16 (ckpt)':>31}")
    for s in SHAPES.values():
        f = forward_flops(s, 1, 0, 1) / 1e9
        print(f"  {s.name:<14}{s.hidden:>6}{s.layers:>4}{s.heads:>6}{s.kv_heads:>4}{s.intermediate:>7}{s.vocab:>8} "
              f"{'yes ' if s.tied else 'no  '} {parameters(s) / 1e9:6.2f}B  {f:15.2f}  "
              f"{kv_bytes_per_token(s, 2) / 1024:11.1f}  {activation_bytes_per_token_layer(s, 2) / 1024:20.1f} "
              f"({checkpoint_bytes_per_token_layer(s, 2) / 1024:.1f})")
    print(f"Hardware (assumed): {hw.gpus}x GPU, {hw.tflops:g} dense bf16 TFLOPS ({hw.fp32_tflops:g} fp32), "
          f"{hw.memory_gb:g} GB, {hw.hbm_tbps:g} TB/s HBM, {hw.nvlink_gbps:g} GB/s NVLink per direction; "
          f"efficiency {hw.efficiency:g} of every peak, for every kernel of every stage; "
          f"{hw.overhead_gb:g} GB CUDA/NCCL overhead per process; allocator headroom x{_FRAGMENTATION['value']:g} on activations")
    R = lengths.responses
    print(f"Response lengths (assumed): min(X, {lengths.cap}), X lognormal, sigma {lengths.sigma:g}, scale so that "
          f"E[R] = {lengths.mean:.0f}; E[R^2] = {lengths.second:.3g} (sqrt {math.sqrt(lengths.second):.0f}); "
          f"P(R = {lengths.cap}) = {100 * lengths.at_cap:.2f}%; the {len(R)} representative lengths: mean {R.mean():.0f}, "
          f"median {int(np.median(R))}, max {R.max()}, {int((R == lengths.cap).sum())} at the cap; prompt "
          f"{lengths.prompt} tokens; groups of {lengths.group}")


# ---- calibration (CPU, torch) --------------------------------------------------------------------

TINY = Shape("tiny Qwen2", 448, 2, 7, 1, 2368, 512, False)  # as the 7B: heads / kv heads 7, I / H 5.29; head dim 64


def _tiny_model(layers: int, dtype: str = "float32", attention: str = "sdpa"):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(hidden_size=TINY.hidden, intermediate_size=TINY.intermediate, num_hidden_layers=layers,
                         num_attention_heads=TINY.heads, num_key_value_heads=TINY.kv_heads, vocab_size=TINY.vocab,
                         max_position_embeddings=2048, pad_token_id=0, tie_word_embeddings=False)
    config._attn_implementation = attention
    return Qwen2ForCausalLM(config).to(getattr(torch, dtype)).eval()


def _tiny_items(prompt: int, reasoning: list[int]):
    """One group: a shared prompt, responses reasoning + conclude + answer (+ closing)."""
    import torch

    generator = torch.Generator().manual_seed(0)
    head = torch.randint(1, TINY.vocab, (prompt,), generator=generator)
    items = []
    for r in reasoning:
        tail = torch.randint(1, TINY.vocab, (r + CONCLUDE_TOKENS + ANSWER_TOKENS + CLOSING_TOKENS,), generator=generator)
        answer = prompt + r + CONCLUDE_TOKENS
        items.append((torch.cat([head, tail]), (prompt, prompt + r), (answer, answer + ANSWER_TOKENS)))
    return items


def _oar_g(model, items, checkpointing: bool):
    """oar_g_batch on one batch; (scores, note). Falls back, marked, when the API has no checkpointing yet."""
    import inspect

    from oarctl.attribution.oar import oar_g_batch

    if "gradient_checkpointing" in inspect.signature(oar_g_batch).parameters:
        return oar_g_batch(model, items, "answer_mean", 1e-3, list(range(len(items))), len(items),
                           max_batch_tokens=0, gradient_checkpointing=checkpointing), ""
    if not checkpointing:
        return oar_g_batch(model, items, "answer_mean", 1e-3, list(range(len(items))), len(items)), ""
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})  # FALLBACK
    model.train()
    import torch
    ids = torch.nn.utils.rnn.pad_sequence([i for i, _, _ in items], batch_first=True)
    embeds = model.get_input_embeddings()(ids).detach().requires_grad_(True)
    loss = model(inputs_embeds=embeds, use_cache=False).logits[:, -1].float().logsumexp(-1).sum()
    torch.autograd.grad(loss, embeds)
    model.gradient_checkpointing_disable()
    model.eval()
    return None, "FALLBACK: oar_g_batch has no gradient_checkpointing; plain forward/backward, no prefix cache"


def _saved_bytes(model, items, checkpointing: bool) -> tuple[int, str]:
    """Bytes of the distinct non-parameter storages autograd saves during one oar_g_batch call."""
    import torch

    parameters_ = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in parameters_:
            seen[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        _, note = _oar_g(model, items, checkpointing)
    return sum(seen.values()), note


def _suffix_tokens(items) -> int:
    """Rows x padded suffix of one OAR-G batch: what the graph is built over (the prompt is cached)."""
    P = items[0][1][0]
    return len(items) * max(answer[1] - 1 - P for _, _, answer in items)


def calibrate() -> list[str]:
    """Measured vs predicted on CPU: forward FLOPs (FlopCounterMode, eager attention: it counts the
    full score matrix, so A = T^2 per row), OAR-G's backward/forward FLOPs ratio, and the bytes per token per layer
    OAR-G keeps, from the difference of a 2- and a 4-layer model (fp32 and bf16, without and with checkpointing)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    lines = []
    started = time.time()
    model = _tiny_model(2, attention="eager")
    B, T = 2, 128
    ids = torch.randint(1, TINY.vocab, (B, T), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(input_ids=ids)
    measured = counter.get_total_flops()
    predicted = forward_flops(TINY, B * T, B * T * T, B * T)
    lines.append(f"forward FLOPs, tiny Qwen2 (H {TINY.hidden}, 2 layers, {TINY.heads} heads of {TINY.head_dim}, "
                 f"{TINY.kv_heads} kv head, I {TINY.intermediate}, V {TINY.vocab}), {B} x {T} tokens: measured "
                 f"{measured / 1e9:.3f} GFLOP, predicted {predicted / 1e9:.3f} ({100 * (measured / predicted - 1):+.2f}%)")
    items = _tiny_items(24, [160, 140, 120, 100])
    with FlopCounterMode(display=False) as counter:
        _oar_g(model, items, False)
    measured = counter.get_total_flops()
    P, S, n = 24, _suffix_tokens(items) // len(items), len(items)
    f = forward_flops(TINY, n * S, n * (P + S) * S, n * n * ANSWER_TOKENS)  # eager: every (query, key), union logits
    prefix = forward_flops(TINY, P, P * P, 0)
    predicted = prefix + 2 * f + backward_to_inputs_flops(f)
    lines.append(f"OAR-G FLOPs (oar_g_batch, one group of {n}, eager attention): measured {measured / 1e9:.3f} GFLOP, "
                 f"predicted {predicted / 1e9:.3f} ({100 * (measured / predicted - 1):+.2f}%): backward to inputs "
                 f"= {(measured - prefix - 2 * f) / f:.2f}x forward (formula: 1x)")
    notes = set()
    for dtype, reasoning in (("float32", [160, 140, 120, 100]), ("bfloat16", [32, 24])):  # bf16 matmuls are slow on CPU
        items = _tiny_items(24, reasoning)
        tokens = _suffix_tokens(items)
        b = dtype_bytes(dtype)
        for checkpointing in (False, True):
            saved = {}
            for layers in (2, 4):
                saved[layers], note = _saved_bytes(_tiny_model(layers, dtype), items, checkpointing)
                notes.add(note)
            per_layer = (saved[4] - saved[2]) / 2 / tokens
            predicted = (checkpoint_bytes_per_token_layer if checkpointing else activation_bytes_per_token_layer)(TINY, b)
            formula = "H b" if checkpointing else "b (9H + 4I) + 2H (4 - b)"
            lines.append(f"OAR-G kept bytes per token per layer, {dtype}, {'with' if checkpointing else 'without'} "
                         f"checkpointing ({tokens} suffix tokens): measured {per_layer:.0f}, predicted {predicted} "
                         f"[{formula}] ({100 * (per_layer / predicted - 1):+.2f}%)")
    lines += [f"NOTE {n}" for n in notes if n]
    lines.append(f"(calibration took {time.time() - started:.0f} s on this CPU)")
    return lines


# ---- checkpoint I/O per step --------------------------------------------------------------------

HASH_THREADS = 8  # oarctl.checkpoints.sha256_files: up to 8 files of one checkpoint hashed at once
FILES_PER_RANK = 8  # oarctl.sharded_state.FILES_PER_RANK (not imported here: it would import torch)


def _hash_seconds(size: float, files: int, hash_bytes_per_s: float) -> float:
    """sha256 of `size` bytes spread over `files` files, one thread per file (at most HASH_THREADS)."""
    return size / (min(HASH_THREADS, max(1, files)) * hash_bytes_per_s)


def saved_bytes(setting: Setting) -> tuple[float, float]:
    """(W, O): the weights in update.save_dtype; the training state, AdamW fp32 (8P) plus the fp32 weights
    (4P) when W is 16-bit."""
    P, cfg = parameters(setting.shape), setting.config
    return dtype_bytes(cfg.update.save_dtype) * P, (8 if cfg.update.save_dtype == "float32" else 12) * P


def checkpoint_io(setting: Setting, hw: Hardware, disk_gbps: float, hash_gbps: float,
                  compute: dict[str, float]) -> list[tuple[str, float, float]]:
    """(term, bytes, seconds) of the checkpoint traffic on one step's critical path, as the code is today.

    Saved: weights W = P x bytes of update.save_dtype, in F files of update.weight_file_mb: under FSDP the
    R ranks write and hash them in turn (file i by rank i mod R, so ceil(F/R) files each, hashed in
    threads), else rank 0 writes all F; and AdamW O = 8P, plus the fp32 weights 4P when W is 16-bit: under
    FSDP each of the R ranks writes and hashes its own O/R at once (sharded_state, in FILES_PER_RANK
    files) after the policy folder is committed, while `oarctl run` goes on: the engines reload W in place
    beside it and map their KV cache once the launch has ended (launch.wait_for_gpus), so only what
    outlasts their reload is on the critical path; else rank 0 writes and hashes all of it before the
    commit. Loaded: every process that loads the
    policy verifies the weight files it reads once: the sampling process for its engines (while they
    load them, so only what outlasts the load is on the critical path), and the
    attribute and update ranks shared out (each file hashed by one rank, ceil(F/R) files each; the update
    ranks the AdamW files too), in a background thread beside their own work (distributed.checked_beside:
    only what outlasts `compute[stage]`, the stage's predicted seconds, is on the critical path); the
    engines' first read comes from disk at `disk_gbps`, the others from the page cache.
    The disk is taken as `disk_gbps` per writer: ranks writing at once are not slowed by each other (a
    parallel file system or a disk per GPU pair; a node with one disk for all is slower: see the note).
    The canary needs no copy of the model (its reference travels with the checkpoint) and the engines are
    kept from step to step, so neither is a cost here."""
    cfg = setting.config
    W, O = saved_bytes(setting)
    weight_files = max(1, math.ceil(W / (cfg.update.weight_file_mb * 1e6)))
    disk, hashing = disk_gbps * GB, hash_gbps * GB
    engines = max(1, cfg.vllm.data_parallel_size) if cfg.policy.backend in ("vllm", "auto") else 1
    attribute_ranks = (_accelerate_processes(cfg.attribute.accelerate_config, hw.gpus)
                       if cfg.attribute.method not in ("uniform", "random") else 0)
    update_ranks = _accelerate_processes(cfg.update.accelerate_config, hw.gpus)
    sharded = _accelerate_kind(cfg.update.accelerate_config) == "fsdp"
    writers = update_ranks if sharded else 1
    shard, shard_files = O / writers, FILES_PER_RANK if sharded else 1
    verify_weights = _hash_seconds(W, weight_files, hashing)
    own_files = math.ceil(weight_files / writers)  # the most weight files one writer has
    own_weights = own_files * W / weight_files
    state = "AdamW + fp32 weights" if cfg.update.save_dtype != "float32" else "AdamW"
    write_state, hash_state = shard / disk, _hash_seconds(shard, shard_files, hashing)
    reload = W / disk  # the engines' weights, read in place
    if sharded:  # written after the policy is committed, while the engines reload it (their KV cache waits)
        terms = [(f"{state}: {writers} ranks write and hash their share once the policy is committed, beside "
                  "the engines' reload (only what outlasts it)", O, max(0.0, write_state + hash_state - reload))]
    else:  # rank 0 writes it before the policy is committed
        terms = [(f"{state}: rank 0 writes it", O, write_state), (f"{state}: rank 0 hashes it", O, hash_state)]
    terms += [(f"weights ({cfg.update.save_dtype}, {weight_files} files): {writers} rank(s) write them in turn", W,
               own_weights / disk),
              (f"weights: each writer hashes its files (up to {own_files})", W,
               _hash_seconds(own_weights, own_files, hashing)),
              ("engines reload the weights in place (first read from disk)", engines * W, reload),
             # the sampling process checks them while its engines load them (the same bytes: whichever reads a
             # page first takes it from disk, the other from the page cache): only what outlasts the load counts
              (f"the sampling process verifies them for its {engines} engine(s), beside the load", W,
               max(0.0, verify_weights - reload))]

    def shared_out(ranks: int) -> float:  # ranks that all read the weights verify ceil(F / R) files each
        files = math.ceil(weight_files / ranks)
        return _hash_seconds(files * W / weight_files, files, hashing)

    if attribute_ranks:
        terms.append((f"{attribute_ranks} attribute ranks verify the weights shared out, beside their scoring", W,
                      max(0.0, shared_out(attribute_ranks) - compute["attribute"])))
    if sharded and cfg.update.persistent:
        terms.append((f"{update_ranks} update ranks keep the model and {state} in memory (update.persistent): "
                      "nothing read", 0.0, 0.0))
    elif sharded:  # the ranks' share of the weights and the AdamW shards, beside their training
        update_check = shared_out(update_ranks) + _hash_seconds(O / update_ranks, shard_files, hashing)
        terms.append((f"{update_ranks} update ranks verify the weights and {state} shared out, beside their "
                      "training", W + O, max(0.0, update_check - compute["update"])))
    else:  # the weights beside the training; the AdamW state (every rank reads all of it) before it
        terms.append((f"{update_ranks} update ranks verify the weights (shared out, beside their training) "
                      f"and {state} (each rank all of it, before)", W + O,
                      max(0.0, shared_out(update_ranks) - compute["update"]) + _hash_seconds(O, 1, hashing)))
    return terms


def print_checkpoint_io(setting: Setting, hw: Hardware, disk_gbps: float, hash_gbps: float,
                        compute: dict[str, float]) -> str:
    terms = checkpoint_io(setting, hw, disk_gbps, hash_gbps, compute)
    step_seconds = sum(compute.values())
    total = sum(seconds for _, _, seconds in terms)
    print(f"   checkpoint I/O per step (predicted; disk {disk_gbps} GB/s per writer, sha256 {hash_gbps} GB/s per "
          "thread; seconds = bytes on the critical path / rate):")
    for name, size, seconds in terms:
        print(f"     {name:<66} {size / GB:8.1f} GB {seconds:8.1f} s")
    share = total / (total + step_seconds)
    W, O = saved_bytes(setting)
    # One disk for the whole node instead of one per writer: the weights are written (W), then the engines
    # read them while the training state (O) is written beside them, sharing the disk (up to 2W for the read
    # to end); the rest of O is written beside sampling, so the disk keeps up while it is busy less than a step.
    rate = disk_gbps * GB
    one_disk, busy = (W + min(2 * W, W + O)) / rate, (2 * W + O) / rate
    print(f"     {'total':<66} {sum(b for _, b, _ in terms) / GB:8.1f} GB {total:8.1f} s = {share:.0%} of the step "
          f"({step_seconds:.1f} s of compute)")
    print(f"     note: with one {disk_gbps} GB/s disk for the whole node, the weights' write and their read by the "
          f"engines beside the training state's write take (W + 2W) / disk = {one_disk:.0f} s "
          f"= {one_disk / (one_disk + step_seconds):.0%} of the step; the disk is busy (2W + O) / disk = {busy:.0f} s "
          f"a step ({'it keeps up' if busy <= one_disk + step_seconds else 'MORE than the step: it falls behind'})")
    if share <= 0.10:
        return f"PASS (d) {setting.path}: checkpoint I/O {share:.0%} of the step"
    largest = sorted(terms, key=lambda term: -term[2])[:3]
    return (f"OPEN (d) {setting.path}: checkpoint I/O is {share:.0%} of the step (predicted {total:.0f} s beside "
            f"{step_seconds:.0f} s of compute; 10% target not met; largest: "
            + "; ".join(f"{name} {seconds:.0f} s" for name, _, seconds in largest) + ")")


# ---- against a GPU measurement --------------------------------------------------------------------

# bench/gpu_check.py's part long: its rows' methods and the attribute knobs it ran them with (its defaults)
GPU_CHECK_LONG = {f"long_attribute_{method}": (method, extra)
                  for method, extra in {**gpu_check.LONG_METHODS, "oar_p": []}.items()}
GPU_CHECK_KNOBS = gpu_check.long_attribute_knobs(gpu_check.LONG_BUDGET, gpu_check.LONG_CHUNK)


def one_gpu_attribute(shape: Shape, hw: Hardware, method: str, rows: int, group: int, prompt: int, response: int,
                      overrides: list[str]) -> Cost:
    """The attribute stage's predicted cost on one GPU for `rows` responses of one length."""
    config = Config()
    apply_overrides(config, overrides)
    lengths = Lengths(np.full(rows, response, dtype=np.int64), prompt, min(group, rows), response, response,
                      response ** 2, 1.0, 0.0)
    return attribute_stage(Setting("gpu_check", shape, config, lengths, 1.0), hw, method)


def measured_rows(log: Path) -> dict[str, tuple[float, float, int]]:
    """{row: (seconds, peak GiB, responses)} of a bench/gpu_check.py output's long attribute rows."""
    rows = {}
    for line in log.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 5 and parts[0] in GPU_CHECK_LONG and parts[3].isdigit():
            rows[parts[0]] = (float(parts[1]), float(parts[2]), int(parts[3]))
    return rows


def against_measured(log: Path, hw: Hardware, prompt: int, response: int) -> list[str]:
    """Predicted (these formulas, 1 GPU) beside measured (the log) for gpu_check's long attribute rows at
    the 1.5B shape; the efficiency each row really reached is predicted_at_1.0 / measured."""
    one = replace(hw, gpus=1)
    perfect = replace(one, efficiency=1.0)
    lines = [f"{'row':<32} {'responses':>9} {'measured s':>10} {'predicted s':>11} {'ratio':>6} "
             f"{'reached':>8} {'measured GiB':>12} {'predicted GB':>12}"]
    for name, (seconds, peak, rows) in measured_rows(log).items():
        method, extra = GPU_CHECK_LONG[name]
        knobs = GPU_CHECK_KNOBS + extra
        predicted = one_gpu_attribute(SHAPES["1.5b"], one, method, rows, 8, prompt, response, knobs)
        best = one_gpu_attribute(SHAPES["1.5b"], perfect, method, rows, 8, prompt, response, knobs)
        lines.append(f"{name:<32} {rows:>9} {seconds:>10.1f} {predicted.seconds:>11.1f} "
                     f"{seconds / predicted.seconds:>6.2f} {best.seconds / seconds:>8.2f} {peak:>12.2f} "
                     f"{predicted.held_bytes / GB:>12.2f}")
    return lines


def print_trl_memory(shape: Shape, gpus: int) -> None:
    print(f"OARGRPOTrainer attribution, {shape.name} ({parameters(shape) / 1e9:.2f} B parameters) on {gpus} GPUs: "
          f"weight bytes per GPU (PREDICTED; formulas in trl_attribution_weight_bytes)")
    for mode, held in trl_attribution_weight_bytes(shape, gpus).items():
        print(f"  {mode:<15} {held / GB:7.1f} GB")


# ---- main ----------------------------------------------------------------------------------------

def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", action="append", type=Path, help="config YAML (repeatable; default: "
                        "every configs/qwen2.5-*/*.yaml)")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", dest="overrides",
                        help="override a config option in every file, as `oarctl --set` does (what-if runs)")
    parser.add_argument("--shape", choices=sorted(SHAPES), help="model shape (default: from policy.path's name)")
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--tflops", type=float, default=989.0, help="dense bf16 peak TFLOPS per GPU (H100 SXM)")
    parser.add_argument("--fp32-tflops", type=float, default=67.0, help="fp32 peak (no TF32: PyTorch's default)")
    parser.add_argument("--memory-gb", type=float, default=80.0)
    parser.add_argument("--hbm-tbps", type=float, default=3.35)
    parser.add_argument("--nvlink-gbps", type=float, default=450.0)
    parser.add_argument("--efficiency", "--mfu", type=float, default=0.4, dest="efficiency",
                        help="share of every peak (FLOPS, HBM, NVLink) every kernel reaches, all stages alike")
    parser.add_argument("--overhead-gb", type=float, default=3.0)
    parser.add_argument("--fragmentation", type=float, default=1.25, help="allocator headroom on activations")
    parser.add_argument("--prompt-tokens", type=int, default=150)
    parser.add_argument("--mean-response", type=float, default=700.0)
    parser.add_argument("--sigma", type=float, default=0.75, help="lognormal shape of the response lengths")
    parser.add_argument("--mixed-fraction", type=float, default=0.5,
                        help="assumed share of groups with mixed rewards (what skip_uniform_groups scores)")
    parser.add_argument("--quick", action="store_true", help="never calibrate (no torch import), even with --calibrate")
    parser.add_argument("--disk-gbps", type=float, default=3.0, help="checkpoint disk read/write GB/s")
    parser.add_argument("--hash-gbps", type=float, default=1.07,
                        help="sha256 GB/s per thread (1.07 measured on one core of the development machine)")
    parser.add_argument("--measured", type=Path, metavar="LOG",
                        help="a bench/gpu_check.py output: its long attribute rows beside this arithmetic's "
                             "prediction for one GPU (use --tflops/--hbm-tbps of that GPU)")
    parser.add_argument("--measured-lengths", type=int, nargs=2, default=[12, 2036], metavar=("PROMPT", "RESPONSE"),
                        help="prompt and response tokens of gpu_check's long rows")
    parser.add_argument("--trl", action="store_true", help="only OARGRPOTrainer's weight memory per GPU while it "
                                                          "attributes, per mode (--shape, default 7b; --gpus)")
    parser.add_argument("--calibrate", action="store_true",
                        help="also run the CPU calibration (~30-60 s): measured vs predicted FLOPs and kept bytes")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse(argv)
    _FRAGMENTATION["value"] = args.fragmentation
    _IO.update(disk=args.disk_gbps, hash=args.hash_gbps)
    hw = Hardware(args.gpus, args.tflops, args.fp32_tflops, args.memory_gb, args.hbm_tbps, args.nvlink_gbps,
                  args.efficiency, args.overhead_gb)
    if args.trl:
        print_trl_memory(SHAPES[args.shape or "7b"], args.gpus)
        return 0
    if args.measured:
        print(f"bench/scale.py against {args.measured} (measured there; predicted here for 1 GPU of "
              f"{args.tflops:.0f} bf16 TFLOPS, {args.hbm_tbps} TB/s at efficiency {args.efficiency}; 'reached': "
              f"the efficiency the measurement implies)")
        for line in against_measured(args.measured, hw, *args.measured_lengths):
            print(f"  {line}")
        return 0
    paths = args.config or sorted(ROOT.glob("configs/qwen2.5-*/*.yaml"))
    missing = [str(p) for p in paths if not Path(p).is_file()]
    if missing:
        print(f"error: --config {missing[0]}: file not found", file=sys.stderr)
        return 2
    shape = SHAPES[args.shape] if args.shape else None
    settings = [load_setting(p.resolve(), shape, args, args.mixed_fraction, args.overrides) for p in paths]
    print("bench/scale.py: the arithmetic of one RL step; every GPU number below is PREDICTED (not run on a GPU)")
    print_shapes(hw, settings[0].lengths)
    if args.calibrate and not args.quick:
        print("\nCalibration on this CPU (measured vs predicted by the formulas above):")
        for line in calibrate():
            print(f"  {line}")
    verdicts = []
    for setting in settings:
        check = setting.shape == SHAPES["7b"] and hw.memory_gb == 80 and hw.gpus == 8
        verdicts += print_report(evaluate_setting(setting, hw), hw, check)
    references = [s for s in settings if s.config.attribute.method in OAR_P_FAMILY]
    if references:
        verdicts += exact_oar_p_references(references[0], hw)
    print("\nCriteria (8x 80 GB, the 7B configs; predicted):")
    for line in verdicts:
        print(f"  {line}")
    if not any(s.shape == SHAPES["7b"] for s in settings) or hw.gpus != 8 or hw.memory_gb != 80:
        print("  (criteria are checked for 7B shapes on 8x 80 GB only)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
