"""OAR-P, OAR-G and token entropy: one importance score per reasoning token of a rollout.

Reads a causal LM (the rollout policy) and attributed sequences (prompt + reasoning + conclude +
answer, or + probe; see `segments.py`) with absolute half-open spans; writes float32 scores, one
per reasoning token (sections 3 and 4 of docs/method.md). The registry entries at the bottom
wrap them for the attribute stage: one score per *response* token, NaN outside the reasoning
(conclude, answer, closing brace, eos), so reshaping must weight only the non-NaN tokens and give
the NaN ones weight 1 (the plain advantage).

OAR-P, exact and fast (the reference code materialises R full copies and all their logits):
- the clean sequence runs once with `use_cache=True`; its key/value cache is the shared prefix;
- perturbations run in chunks of `chunk_size` consecutive positions t1..tk: the prefix [0, t1) is
  sliced from the clean cache and expanded to k rows, and only the suffix [t1, end) is recomputed,
  row i with r_ti replaced by the perturbation token. Rows i > 1 recompute up to k - 1 unchanged
  positions, the price of one rectangular batch (about k / (2 x suffix length) extra work: on a
  CPU chunks of 4-16 are fastest, a GPU wants large ones); memory is O(chunk_size x length);
- the vocabulary projection runs only at the outcome positions (`logits_to_keep`);
- sequences end at the last outcome position: nothing right of it can change the outcome.
Needs full-attention layers (a sliding-window cache does not keep the whole prefix).

OAR-G: teacher outcome of the clean sequence without grad; the embeddings are a leaf tensor, seeded
Gaussian noise is added at the reasoning positions (not for answer_joint, whose objective has a
non-zero gradient at the clean point), J = KL(teacher || noisy) or phi_teacher - phi_noisy, and
dJ/de comes from `torch.autograd.grad`, so parameter `.grad` is never touched (the reference calls
`.backward()`). I_t = |sum_h dJ/de_th * e_th| with e the clean embeddings. Responses are batched
with right padding: causal attention never lets a real token see a pad, so a padded batch gives
the single-response scores (up to float tolerance), and each response draws its own noise. The
prompt is shared: it runs once per batch without grad and only the responses get a graph, which
is exact because no prompt state depends on a reasoning embedding; for a group of 8 samples per
prompt this saves about half of the work.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from oarctl.attribution import outcome
from oarctl.attribution.base import ATTRIBUTION_METHODS, Rollout, on_reasoning, row_seed
# re-export for one release: oarctl.attribution.base
from oarctl.attribution.base import segment_rows  # noqa: F401
from oarctl.attribution.collective import CallSync, dummy_forward, input_embeddings, padded_calls
from oarctl.attribution.prefix import checkpointed_layers, frozen_prefix
from oarctl.batching import fixed_size, token_budget
from oarctl.policy.logprobs import response_token_stats
from oarctl.schema import AttributeConfig

# Defaults of the Python API: the config's, except the chunk size, which the config tunes for a
# CPU (4-16 is fastest there) while a GPU wants large chunks.
OAR_P_MODE = AttributeConfig.oar_p_mode
OAR_G_MODE = AttributeConfig.oar_g_mode
NOISE_STD = AttributeConfig.noise_std
BATCH_SIZE = AttributeConfig.batch_size  # responses per OAR-G / entropy forward pass
CHUNK_SIZE = 64

Span = tuple[int, int]
Item = tuple[torch.Tensor, Span, Span]  # (input_ids (T,), reasoning span, answer span)


@dataclass(frozen=True)
class _Plan:
    """What one response's outcome needs: effective mode, positions, targets, sequence end."""
    mode: str
    positions: torch.Tensor  # (K,) absolute positions whose logits define the outcome
    answer_ids: torch.Tensor  # (A,) targets of answer_joint
    end: int  # the sequence is cut here: positions >= end cannot change the outcome


def _plan(input_ids: torch.Tensor, reasoning_span: Span, answer_span: Span, mode: str) -> _Plan:
    mode = outcome.effective_mode(mode, answer_span)
    positions = outcome.outcome_positions(answer_span, mode)
    end = int(positions[-1]) + 1
    if not 0 <= reasoning_span[0] <= reasoning_span[1] <= end or end > input_ids.numel():
        raise ValueError(f"spans do not fit the sequence: reasoning {reasoning_span}, answer {answer_span}, "
                         f"length {input_ids.numel()}")
    return _Plan(mode, positions, input_ids[answer_span[0]:answer_span[1]].cpu(), end)


# ---- OAR-P ---------------------------------------------------------------------------------------

def chunk_rows(first: int, end: int, chunk_size: int, max_batch_tokens: int) -> int:
    """Perturbed rows of a chunk whose suffix starts at `first`: chunk_size, fewer under the budget."""
    if not max_batch_tokens:
        return chunk_size
    return max(1, min(chunk_size, max_batch_tokens // max(1, end - first)))


def _perturbation_chunks(spans: list[Span], end: int, chunk_size: int, max_batch_tokens: int) -> list[list[int]]:
    """Consecutive groups of the (sorted) perturbations, each within chunk_size and the token budget:
    a chunk recomputes rows x (end - its first start) tokens."""
    chunks, index = [], 0
    while index < len(spans):
        rows = chunk_rows(spans[index][0], end, chunk_size, max_batch_tokens)
        chunks.append(list(range(index, min(index + rows, len(spans)))))
        index += rows
    return chunks


def _perturbed_chunk(model, ids: torch.Tensor, cache, spans: list[Span], plan: _Plan, clean: torch.Tensor,
                     perturb_token_id: int) -> torch.Tensor:
    """Importance of each perturbation (row i: tokens spans[i] replaced), one batched suffix pass."""
    first, rows = spans[0][0], len(spans)
    suffix = ids[:, first:plan.end].repeat(rows, 1)  # (k, end - first)
    for row, (start, stop) in enumerate(spans):
        suffix[row, start - first:stop - first] = perturb_token_id
    prefix = frozen_prefix(cache, model.config, first, rows=rows)
    logits = model(input_ids=suffix, past_key_values=prefix, use_cache=prefix is not None,
                   logits_to_keep=(plan.positions - first).to(ids.device)).logits  # (k, K, V)
    return outcome.importance(clean, outcome.outcome_from_logits(logits, plan.mode, plan.answer_ids), plan.mode)


def _perturb_token(model, perturb_token_id: int | None) -> int:
    perturb_token_id = model.config.pad_token_id if perturb_token_id is None else perturb_token_id
    if perturb_token_id is None:
        raise ValueError("OAR-P: the model has no pad token to perturb with; pass perturb_token_id")
    return perturb_token_id


@torch.no_grad()
def perturbation_scores(model, input_ids: torch.Tensor, reasoning_span: Span, answer_span: Span,
                        spans: list[Span], mode: str = OAR_P_MODE, perturb_token_id: int | None = None,
                        chunk_size: int = CHUNK_SIZE, max_batch_tokens: int = 0) -> torch.Tensor:
    """Importance (len(spans),) float64 of replacing each absolute span of reasoning tokens by the pad
    token: KL(P || P^(span)), or phi - phi^(span). Spans must be sorted by start, inside the reasoning."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1; got {chunk_size}")
    perturb_token_id = _perturb_token(model, perturb_token_id)
    plan = _plan(input_ids, reasoning_span, answer_span, mode)
    if any(not reasoning_span[0] <= a < b <= reasoning_span[1] for a, b in spans) or spans != sorted(spans):
        raise ValueError(f"perturbed spans must be sorted and inside the reasoning {reasoning_span}")
    device = model.device
    ids = input_ids[:plan.end].to(device).unsqueeze(0)  # (1, end)
    clean_run = model(input_ids=ids, use_cache=True, logits_to_keep=plan.positions.to(device))
    clean = outcome.outcome_from_logits(clean_run.logits, plan.mode, plan.answer_ids)  # (1, V) or (1,)
    scores = [torch.zeros(0, dtype=torch.float64)]
    for chunk in _perturbation_chunks(spans, plan.end, chunk_size, max_batch_tokens):
        scores.append(_perturbed_chunk(model, ids, clean_run.past_key_values, [spans[i] for i in chunk], plan,
                                       clean, perturb_token_id).cpu())
    return torch.cat(scores)


def perturbation_calls(input_ids: torch.Tensor, reasoning_span: Span, answer_span: Span, spans: list[Span],
                       mode: str = OAR_P_MODE, chunk_size: int = CHUNK_SIZE, max_batch_tokens: int = 0) -> int:
    """The forwards `perturbation_scores` makes for these arguments: the clean one and one per chunk."""
    end = _plan(input_ids, reasoning_span, answer_span, mode).end
    return 1 + len(_perturbation_chunks(spans, end, chunk_size, max_batch_tokens))


def token_spans(reasoning_span: Span) -> list[Span]:
    """Every reasoning token on its own: exact OAR-P's perturbations."""
    return [(t, t + 1) for t in range(*reasoning_span)]


def oar_p(model, input_ids: torch.Tensor, reasoning_span: Span, answer_span: Span, mode: str = OAR_P_MODE,
          perturb_token_id: int | None = None, chunk_size: int = CHUNK_SIZE, max_batch_tokens: int = 0) -> torch.Tensor:
    """OAR-P importance (R,) of each reasoning token: KL(P || P^(t)), or phi - phi^(t), every token perturbed."""
    spans = token_spans(reasoning_span)
    return perturbation_scores(model, input_ids, reasoning_span, answer_span, spans, mode, perturb_token_id,
                               chunk_size, max_batch_tokens).float()


def oar_p_batch(model, items: list[Item], mode: str = OAR_P_MODE, perturb_token_id: int | None = None,
                chunk_size: int = CHUNK_SIZE, max_batch_tokens: int = 0,
                sync: CallSync | None = None) -> list[torch.Tensor]:
    """OAR-P of several responses; the batch dimension is already filled by one response's chunk. With
    `sync` (a sharded model) every rank makes as many forwards as the busiest (collective.py)."""
    calls = sum(perturbation_calls(ids, reasoning, answer, token_spans(reasoning), mode, chunk_size, max_batch_tokens)
                for ids, reasoning, answer in items)
    with padded_calls(sync, calls, lambda: dummy_forward(model)):
        return [oar_p(model, ids, reasoning, answer, mode, perturb_token_id, chunk_size, max_batch_tokens)
                for ids, reasoning, answer in items]


# ---- OAR-G and entropy: right-padded batches -----------------------------------------------------

def _right_pad(sequences: list[torch.Tensor], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(s.numel() for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, sequence in enumerate(sequences):
        ids[row, :sequence.numel()] = sequence
        mask[row, :sequence.numel()] = 1
    return ids.to(device), mask.to(device)


def _kept_logits(model, positions: list[torch.Tensor], **inputs) -> list[torch.Tensor]:
    """Logits (1, K_i, V) of row i at its `positions[i]`, projecting only their union."""
    keep = torch.unique(torch.cat(positions))  # sorted
    logits = model(**inputs, logits_to_keep=keep.to(model.device)).logits  # (B, U, V)
    return [logits[row:row + 1, torch.searchsorted(keep, p).to(logits.device)] for row, p in enumerate(positions)]


def _noise(plans: list[_Plan], spans: list[Span], shape, noise_std: float, seeds: list[int]) -> torch.Tensor:
    """Per-response seeded N(0, sigma^2) at reasoning positions; drawn in float32 on the CPU so a
    response's noise depends only on its seed, not on the device or its batch."""
    noise = torch.zeros(shape)  # (B, T, H)
    for row, (plan, (start, end), seed) in enumerate(zip(plans, spans, seeds)):
        if plan.mode != "answer_joint" and end > start:
            generator = torch.Generator().manual_seed(int(seed))
            noise[row, start:end] = torch.randn((end - start, shape[-1]), generator=generator) * noise_std
    return noise


def _shared_prefix_length(item: Item, plan: _Plan) -> int:
    """Tokens before the reasoning and the first outcome position: the prompt, for a rollout.

    Nothing there depends on a reasoning embedding (causal attention), so it runs once without
    grad and its key/value cache is reused by every sample of the prompt.
    """
    return min(item[1][0], int(plan.positions[0]))


def batches_within(indices: list[int], widths: list[int], batch_size: int, max_batch_tokens: int) -> list[list[int]]:
    """`indices` cut into batches of at most `batch_size` rows and, with a budget, at most
    max_batch_tokens = rows x widest row (longest first; a row wider than the budget runs alone)."""
    groups = token_budget(indices, widths, max_batch_tokens) if max_batch_tokens else [indices]
    return [batch for group in groups for batch in fixed_size(group, batch_size)]


def _prefix_batches(items: list[Item], plans: list[_Plan], batch_size: int, max_batch_tokens: int = 0) -> list[list[int]]:
    """Batches of item indices that share one prefix (a prompt's group), suffixes of similar length
    together. A batch never mixes prompts, so its rows, padding and float rounding are the same
    whichever other groups are scored beside it: in one process or dealt over ranks alike (OAR-G's
    objective, a KL between outcomes 1e-3 apart, turns float32 rounding into ~1e-3 relative noise)."""
    by_prefix: dict[tuple, list[int]] = {}
    for index, (item, plan) in enumerate(zip(items, plans)):
        by_prefix.setdefault(tuple(item[0][:_shared_prefix_length(item, plan)].tolist()), []).append(index)
    widths = [plan.end for plan in plans]  # the attended length: prefix + suffix
    batches = []
    for members in by_prefix.values():
        members.sort(key=lambda i: plans[i].end)  # stable: samples of one prompt stay in order
        batches += batches_within(members, widths, batch_size, max_batch_tokens)
    return batches


def additive_causal_mask(keys: torch.Tensor, offset: int, dtype) -> torch.Tensor:
    """(B, 1, S, offset + S) float mask, 0 where query i may attend key j (j <= offset + i and key j is
    no pad), -inf elsewhere. Built here rather than by transformers (a boolean mask): with a float mask
    PyTorch's CPU attention takes its flash kernel, whose backward keeps no (S, S) score matrices, so
    OAR-G's memory per token stays flat on CPU as on GPUs (where both kinds run memory-efficiently)."""
    queries = keys.shape[1] - offset
    causal = torch.arange(keys.shape[1], device=keys.device)[None, :] <= offset + torch.arange(
        queries, device=keys.device)[:, None]  # (S, offset + S)
    allowed = causal[None, None] & keys.bool()[:, None, None, :]  # (B, 1, S, offset + S)
    return torch.zeros(allowed.shape, dtype=dtype, device=keys.device).masked_fill(~allowed, float("-inf"))


def _oar_g_chunk(model, items: list[Item], plans: list[_Plan], noise_std: float,
                 seeds: list[int]) -> list[torch.Tensor]:
    """OAR-G of responses with equal-length shared prefixes; only the suffixes get a graph."""
    length = _shared_prefix_length(items[0], plans[0])
    prefixes: dict[tuple, int] = {}
    rows = torch.tensor([prefixes.setdefault(tuple(i[:length].tolist()), len(prefixes)) for i, _, _ in items],
                        device=model.device)
    cache = None
    if length:
        with torch.no_grad():
            cache = model(input_ids=torch.tensor(list(prefixes), device=model.device), use_cache=True).past_key_values
    ids, mask = _right_pad([i[length:p.end].cpu() for (i, _, _), p in zip(items, plans)],
                           model.config.pad_token_id or 0, model.device)
    mask = additive_causal_mask(torch.cat([mask.new_ones((len(items), length)), mask], dim=1), length,
                                model.get_input_embeddings().weight.dtype)
    positions = [p.positions - length for p in plans]
    spans = [(start - length, end - length) for _, (start, end), _ in items]

    def outcome_logits(**inputs) -> list[torch.Tensor]:
        past = None if cache is None else frozen_prefix(cache, model.config, select=rows)  # read-only: replayable
        return _kept_logits(model, positions, attention_mask=mask, past_key_values=past, use_cache=False, **inputs)

    with torch.no_grad():
        teachers = [outcome.outcome_from_logits(logits, p.mode, p.answer_ids)
                    for logits, p in zip(outcome_logits(input_ids=ids), plans)]
    embeds = input_embeddings(model, ids).detach().requires_grad_(True)  # (B, S, H) leaf
    noise = _noise(plans, spans, embeds.shape, noise_std, seeds).to(embeds.device, embeds.dtype)
    noisy = outcome_logits(inputs_embeds=embeds + noise)
    objective = sum(outcome.importance(teacher, outcome.outcome_from_logits(logits, p.mode, p.answer_ids), p.mode).sum()
                    for teacher, logits, p in zip(teachers, noisy, plans))
    (gradient,) = torch.autograd.grad(objective, embeds)  # never .backward(): parameter grads stay None
    saliency = (gradient.double() * embeds.detach().double()).sum(dim=-1).abs()  # (B, S)
    return [saliency[row, start:end].float().cpu() for row, (start, end) in enumerate(spans)]


def _dummy_oar_g_chunk(model, mode: str, noise_std: float) -> None:
    """An OAR-G batch of one 3-token sequence (prompt, reasoning, answer token): the calls of a real batch."""
    ids = torch.zeros(3, dtype=torch.long)
    item = (ids, (1, 2), (2, 3))
    _oar_g_chunk(model, [item], [_plan(*item, mode)], noise_std, [0])


def _check_prefixes(items: list[Item], plans: list[_Plan]) -> None:
    """Under a CallSync every batch must make the calls of the dummy, a shared-prefix forward included."""
    if any(_shared_prefix_length(item, plan) == 0 for item, plan in zip(items, plans)):
        raise ValueError("OAR-G on a sharded model needs a prompt before every response (a prefix forward per batch)")


def oar_g_batch(model, items: list[Item], mode: str = OAR_G_MODE, noise_std: float = NOISE_STD,
                seeds: list[int] | None = None, batch_size: int = BATCH_SIZE, max_batch_tokens: int = 0,
                gradient_checkpointing: bool = False, sync: CallSync | None = None) -> list[torch.Tensor]:
    """OAR-G of several responses, up to `batch_size` (and max_batch_tokens) per forward/backward;
    response i uses `seeds[i]`. With gradient_checkpointing each layer is recomputed in the backward.

    Responses that share a prefix (a group of samples of one prompt) are batched together and the
    prefix runs once: the scores are those of each response alone, up to float tolerance. With `sync`
    (a sharded model) every rank runs as many batches as the busiest, padded with dummy ones.
    """
    seeds = list(range(len(items))) if seeds is None else list(seeds)
    if len(seeds) != len(items):
        raise ValueError(f"{len(seeds)} seeds for {len(items)} responses")
    plans = [_plan(ids, reasoning, answer, mode) for ids, reasoning, answer in items]
    if sync is not None:
        _check_prefixes(items, plans)
    scores: list[torch.Tensor | None] = [None] * len(items)
    batches = _prefix_batches(items, plans, batch_size, max_batch_tokens)
    was_training = model.training
    model.eval()
    try:
        with checkpointed_layers(model, gradient_checkpointing), \
                padded_calls(sync, len(batches), lambda: _dummy_oar_g_chunk(model, mode, noise_std)):
            for members in batches:
                chunk = _oar_g_chunk(model, [items[i] for i in members], [plans[i] for i in members], noise_std,
                                     [seeds[i] for i in members])
                for index, score in zip(members, chunk):
                    scores[index] = score
        return scores
    finally:
        model.train(was_training)


def oar_g(model, input_ids: torch.Tensor, reasoning_span: Span, answer_span: Span, mode: str = OAR_G_MODE,
          noise_std: float = NOISE_STD, seed: int = 0, gradient_checkpointing: bool = False) -> torch.Tensor:
    """OAR-G saliency (R,) of each reasoning token of one response."""
    return oar_g_batch(model, [(input_ids, reasoning_span, answer_span)], mode, noise_std, [seed],
                       gradient_checkpointing=gradient_checkpointing)[0]


@torch.no_grad()
def token_entropy_batch(model, items: list[tuple[torch.Tensor, Span]], temperatures: list[float] | None = None,
                        batch_size: int = BATCH_SIZE, max_batch_tokens: int = 0) -> list[torch.Tensor]:
    """Entropy (R,) of the distribution each reasoning token r_t was sampled from (logits at t - 1,
    divided by the sampling temperature): high at forking tokens."""
    temperatures = [1.0] * len(items) if temperatures is None else temperatures
    if any(span[0] < 1 for _, span in items):
        raise ValueError("entropy needs a token before the reasoning (the prompt) to predict it")
    scores: list[torch.Tensor | None] = [None] * len(items)
    for batch in batches_within(list(range(len(items))), [span[1] for _, span in items], batch_size, max_batch_tokens):
        prompts = [items[i][0][:items[i][1][0]].tolist() for i in batch]
        responses = [items[i][0][items[i][1][0]:items[i][1][1]].tolist() for i in batch]
        with torch.no_grad():  # the update's helper: the vocabulary projected max_batch_tokens positions at a time
            _, entropy = response_token_stats(model, prompts, responses, model.config.pad_token_id or 0,
                                              [temperatures[i] for i in batch], max_batch_tokens)
        for row, index in enumerate(batch):
            scores[index] = entropy[row, :len(responses[row])].cpu()
    return scores


# ---- registry entries: (table, context) -> one score per response token --------------------------

def items(rollouts: list[Rollout]) -> list[Item]:
    return [(r.input_ids, r.reasoning, r.answer) for r in rollouts]


@ATTRIBUTION_METHODS.register("oar_p")
def oar_p_method(rollouts: list[Rollout], table, config, context) -> list[np.ndarray]:
    """OAR-P: KL (or answer log-likelihood drop) when a reasoning token is replaced by the pad token."""
    model, tokenizer = context.policy.load()
    scores = oar_p_batch(model, items(rollouts), config.oar_p_mode, tokenizer.pad_token_id, config.chunk_size,
                         config.max_batch_tokens, context.call_sync)
    return [on_reasoning(r, s.numpy()) for r, s in zip(rollouts, scores)]


@ATTRIBUTION_METHODS.register("oar_g")
def oar_g_method(rollouts: list[Rollout], table, config, context) -> list[np.ndarray]:
    """OAR-G: gradient x input saliency of the outcome (`last` for rows without answer tokens)."""
    model, _ = context.policy.load()
    return [on_reasoning(r, s.numpy()) for r, s in zip(rollouts, oar_g_scores(model, rollouts, config, context))]


def oar_g_scores(model, rollouts: list[Rollout], config, context) -> list[torch.Tensor]:
    """OAR-G of the rollouts as the attribute config asks (the cheap OAR-P variants rank by it too)."""
    seeds = [row_seed(context.seed, context.step, r.row) for r in rollouts]
    return oar_g_batch(model, items(rollouts), config.oar_g_mode, config.noise_std, seeds, config.batch_size,
                       config.max_batch_tokens, config.gradient_checkpointing, context.call_sync)


@ATTRIBUTION_METHODS.register("entropy")
def entropy_method(rollouts: list[Rollout], table, config, context) -> list[np.ndarray]:
    """Next-token entropy at each reasoning token, at the row's sampling temperature (0 -> 1)."""
    model, _ = context.policy.load()
    temperatures = [t if t and t > 0 else 1.0 for t in table["temperature"].to_pylist()]
    scores = token_entropy_batch(model, [(r.input_ids, r.reasoning) for r in rollouts], temperatures,
                                 config.batch_size, config.max_batch_tokens)
    return [on_reasoning(r, s.numpy()) for r, s in zip(rollouts, scores)]
