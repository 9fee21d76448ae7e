"""The attribute stage's cost, per attribution method: OAR-G, entropy and the OAR-P family (exact, span,
screened, flow), groups dealt over the ranks of attribute.accelerate_config."""
from __future__ import annotations

import functools

import numpy as np

from bench.scaling.assumptions import fragmentation
from bench.scaling.batching_rules import batches_within, local_chunks, perturbation_chunks, screened_count, windows
from bench.scaling.cost import Cost, spread_over_ranks
from bench.scaling.formulas import (activation_bytes_per_token_layer, backward_to_inputs_flops, causal_keys,
                                    checkpoint_bytes_per_token_layer, forward_flops, forward_hbm_bytes,
                                    kv_bytes_per_token, parameters, working_set_bytes_per_token)
from bench.scaling.lengths import attributed_end, outcome_positions, reasoning_tokens
from bench.scaling.model import FLOW_LOGIT_TOKENS, GB, Hardware, Shape, dtype_bytes
from bench.scaling.setting import Setting, accelerate_processes


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


def entropy_batches(setting: Setting, hw: Hardware, rows: np.ndarray, whole_response: bool = False) -> Cost:
    """Entropy: one no-grad forward over prompt + reasoning, the vocabulary projection at every reasoning
    position (whole_response, entropy_mask: over prompt + response, projected at every response position).
    Held: one layer's working set, the (b, U, V) logits in the policy dtype and one row's float32
    log-softmax and probabilities (2 R V x 4)."""
    s, L, a = setting.shape, setting.lengths, setting.config.attribute
    b = dtype_bytes(a.dtype)
    cost = Cost()
    reasoning = L.responses[rows] if whole_response else reasoning_tokens(L.responses[rows])
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


@functools.lru_cache(maxsize=None)
def local_links(s: Shape, hw: Hardware, dtype: str, chunk_size: int, max_batch_tokens: int, prompt: int,
                response: int, horizon: int) -> Cost:
    """oar_flow_local's links (flow_local.local_drops) for one response: a clean forward of prompt +
    reasoning projecting every reasoning position, then forwards of k rows x `horizon` positions, each
    row attending the clean keys left of its token (a chunk's rows all see its last start's prefix,
    masked): ~R x horizon token-forwards against exact oar_flow's ~R^2 / 2. Held: the clean cache, one
    layer's keys/values for k rows x (prefix + horizon), the working set of k x horizon tokens,
    FLOW_LOGIT_TOKENS x V logits (float64 log-probabilities)."""
    b = dtype_bytes(dtype)
    R = int(reasoning_tokens(response))
    end = prompt + R
    cost = Cost()
    clean_keys = causal_keys(0, end)
    cost.add(forward_flops(s, end, clean_keys, R), forward_hbm_bytes(s, b, end, clean_keys), hw, dtype)
    chunks = np.array(local_chunks(prompt, R, horizon, chunk_size, max_batch_tokens), dtype=np.float64).reshape(-1, 2)
    last, k = chunks[:, 0], chunks[:, 1]
    tokens = k * horizon
    keys = k * (horizon * last + horizon * (horizon + 1) / 2)
    cost.add(forward_flops(s, tokens, keys, tokens), forward_hbm_bytes(s, b, tokens, keys), hw, dtype)
    if len(tokens):
        worst = int(np.argmax(k * (last + horizon)))
        rows, width = k[worst], last[worst] + horizon
        cost.hold(activations=rows * horizon * working_set_bytes_per_token(s, b) * fragmentation(),
                  prefix_kv=end * kv_bytes_per_token(s, b) + rows * width * kv_bytes_per_token(s, b) / s.layers,
                  logits=min(FLOW_LOGIT_TOKENS, rows * horizon) * s.vocab * (b + 8))
    cost.token_forwards = float(tokens.sum())
    return cost


def oar_flow_local_group(setting: Setting, hw: Hardware, rows: np.ndarray) -> Cost:
    """oar_flow_local on one group: one OAR-G pass (the direct effects), then each response's local links."""
    a = setting.config.attribute
    cost = oar_g_group(setting, hw, rows)
    for response in setting.lengths.responses[rows]:
        cost.merge(local_links(setting.shape, hw, a.dtype, a.chunk_size, a.max_batch_tokens, setting.lengths.prompt,
                               int(response), a.flow_horizon))
    return cost


def attribute_stage(setting: Setting, hw: Hardware, method: str) -> Cost:
    """The attribute stage with `method` and the config's attribute knobs: groups dealt over the ranks
    of attribute.accelerate_config (each a replica of the policy in attribute.dtype), or one GPU."""
    a = setting.config.attribute
    ranks = accelerate_processes(a.accelerate_config, hw.gpus)
    if method in ("uniform", "random"):
        cost = Cost(note="free (no model call)")
        return cost
    if method == "ktae":  # token counts per group on the CPU, no model call (not modelled: ~0.1 s per step)
        return Cost(note="no model call (token statistics per group, CPU)")
    parts = []
    for rows in _group_rows(setting, a.skip_uniform_groups):
        if method == "oar_g":
            parts.append(oar_g_group(setting, hw, rows))
        elif method == "entropy":
            parts.append(entropy_batches(setting, hw, rows))
        elif method == "entropy_mask":  # in OARGRPOTrainer: free, TRL's loss forward computes the entropies
            parts.append(entropy_batches(setting, hw, rows, whole_response=True))
        elif method == "oar_flow_local":
            parts.append(oar_flow_local_group(setting, hw, rows))
        else:
            parts.append(oar_p_group(setting, hw, rows, method))
    cost = spread_over_ranks(parts, ranks)
    cost.hold(weights=parameters(setting.shape) * dtype_bytes(a.dtype), cuda_overhead=hw.overhead_gb * GB)
    token_forwards = sum(p.token_forwards for p in parts)
    cost.note = f"{ranks} GPU{'s' if ranks > 1 else ''}, {a.dtype}"
    if token_forwards:
        cost.note += f", {token_forwards / 1e6:.1f} M perturbed token-forwards"
    return cost
