"""Cheaper OAR-P: perturb fewer times than once per reasoning token, and say how.

Exact OAR-P (`oar.oar_p`) perturbs every reasoning token, each a forward of the suffix after it:
about R^2 / 2 token-forwards per response, hours per RL step at 7B and 3,072 tokens. The two
variants here run the same perturbation engine (`oar.perturbation_scores`) on at most
`max_perturbations` sets per response, so their cost grows like R, not R^2:

- `oar_p_span`: replace a whole window of w consecutive reasoning tokens by the pad token (fixed
  windows of `span_tokens`, widened on long responses to keep within `max_perturbations`), and
  spread the window's score over its tokens, evenly (score / w each) or in proportion to OAR-G's
  saliency (one OAR-G pass more). Deviation: windows are fixed token counts, not reasoning steps or
  sentences; a token's score is its window's effect, not its own.
- `oar_p_screened`: OAR-G ranks every token; exact OAR-P runs on the top `screen_fraction`, plus a
  random `audit_fraction` of the rest (seeded per row). Measured tokens keep their exact score; the
  others keep OAR-G's order, scaled into [0, m) below the smallest exact score m of the top set,
  so Bi-Level still sees their relative sizes but never ranks them above a measured top token. The
  audit shows how often screening misses: `audit_miss_rate` is the share of audited tokens whose
  exact score is above m.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from oarctl.attribution.base import ATTRIBUTION_METHODS, Rollout, on_reasoning, row_seed
from oarctl.attribution.collective import dummy_forward, padded_calls
from oarctl.attribution.oar import items, oar_g_scores, perturbation_calls, perturbation_scores

Span = tuple[int, int]


def windows(reasoning_span: Span, span_tokens: int, max_perturbations: int) -> list[Span]:
    """Consecutive windows covering the reasoning: span_tokens wide, or wider so that there are at
    most max_perturbations of them."""
    start, end = reasoning_span
    width = max(span_tokens, math.ceil((end - start) / max_perturbations))
    return [(a, min(a + width, end)) for a in range(start, end, width)]


def spread(window_scores: torch.Tensor, spans: list[Span], reasoning_start: int, weights: torch.Tensor | None,
           length: int) -> torch.Tensor:
    """Token scores (length,) from window scores: evenly, or in proportion to `weights` within a window
    (evenly where a window's weights sum to 0)."""
    scores = torch.zeros(length, dtype=torch.float64)
    for score, (a, b) in zip(window_scores.clamp(min=0), spans):
        a, b = a - reasoning_start, b - reasoning_start
        part = None if weights is None else weights[a:b].double()
        if part is None or not float(part.sum()) > 0:
            scores[a:b] = score / (b - a)
        else:
            scores[a:b] = score * part / part.sum()
    return scores


def span_scores(model, item, saliency: torch.Tensor | None, config, perturb_token_id: int) -> torch.Tensor:
    """oar_p_span of one response (R,): window scores, spread evenly or by `saliency`."""
    input_ids, reasoning, answer = item
    spans = windows(reasoning, config.span_tokens, config.max_perturbations)
    window_scores = perturbation_scores(model, input_ids, reasoning, answer, spans, config.oar_p_mode,
                                        perturb_token_id, config.chunk_size, config.max_batch_tokens)
    return spread(window_scores, spans, reasoning[0], saliency, reasoning[1] - reasoning[0]).float()


def screened_positions(saliency: np.ndarray, config, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(top, audit): relative positions of the top screen_fraction by saliency, and a random audit
    sample of the rest; together at most max_perturbations (the audit shrinks first)."""
    length = saliency.size
    order = np.argsort(-saliency, kind="stable")
    top_count = min(length, config.max_perturbations, max(1, math.ceil(config.screen_fraction * length)))
    rest = order[top_count:]
    audit_count = min(rest.size, config.max_perturbations - top_count, round(config.audit_fraction * rest.size))
    audit = np.random.default_rng(seed).choice(rest, size=audit_count, replace=False) if audit_count else rest[:0]
    return np.sort(order[:top_count]), np.sort(audit)


def place_below(exact: dict[int, float], top: np.ndarray, saliency: np.ndarray) -> np.ndarray:
    """Exact scores where measured; elsewhere saliency scaled into [0, m), m = the top set's least score."""
    floor = min(max(exact[int(i)], 0.0) for i in top)
    unmeasured = np.array([i for i in range(saliency.size) if i not in exact], dtype=int)
    scores = np.zeros(saliency.size, dtype=np.float64)
    if unmeasured.size and floor > 0:
        largest = float(saliency[unmeasured].max())
        if largest > 0:
            scores[unmeasured] = floor * (1 - 1e-3) * saliency[unmeasured] / largest
    for index, value in exact.items():
        scores[index] = value
    return scores


def _measured(reasoning: Span, saliency: torch.Tensor, config,
              seed: int) -> tuple[np.ndarray, np.ndarray, list[Span]]:
    """(top, audit, the spans perturbed): what oar_p_screened measures exactly in one response."""
    top, audit = screened_positions(saliency.double().numpy(), config, seed)
    measured = np.union1d(top, audit)
    return top, audit, [(reasoning[0] + int(i), reasoning[0] + int(i) + 1) for i in measured]


def screened_scores(model, item, saliency: torch.Tensor, config, perturb_token_id: int,
                    seed: int) -> tuple[torch.Tensor, float]:
    """oar_p_screened of one response: (scores (R,), audit miss rate or NaN without an audit)."""
    input_ids, reasoning, answer = item
    if reasoning[1] == reasoning[0]:
        return torch.zeros(0), float("nan")
    ranking = saliency.double().numpy()
    top, audit, spans = _measured(reasoning, saliency, config, seed)
    measured = np.union1d(top, audit)
    values = perturbation_scores(model, input_ids, reasoning, answer, spans, config.oar_p_mode, perturb_token_id,
                                 config.chunk_size, config.max_batch_tokens).numpy()
    exact = {int(i): float(v) for i, v in zip(measured, values)}
    scores = place_below(exact, top, ranking)
    floor = min(exact[int(i)] for i in top)
    miss_rate = float(np.mean([exact[int(i)] > floor for i in audit])) if audit.size else float("nan")
    return torch.from_numpy(scores).float(), miss_rate


def _pad_id(context) -> int:
    return context.policy.load()[1].pad_token_id


def _perturbation_forwards(item, spans: list[Span], config) -> int:
    """Forwards `perturbation_scores` makes for one response (none for an empty reasoning, never scored)."""
    input_ids, reasoning, answer = item
    if not spans:
        return 0
    return perturbation_calls(input_ids, reasoning, answer, spans, config.oar_p_mode, config.chunk_size,
                              config.max_batch_tokens)


@ATTRIBUTION_METHODS.register("oar_p_span")
def oar_p_span_method(rollouts: list[Rollout], table, config, context) -> list[np.ndarray]:
    """OAR-P on windows of span_tokens tokens, each window's score spread over its tokens."""
    model, _ = context.policy.load()
    saliencies = oar_g_scores(model, rollouts, config, context) if config.span_spread == "oar_g" else [None] * len(rollouts)
    calls = sum(_perturbation_forwards(item, windows(item[1], config.span_tokens, config.max_perturbations), config)
                for item in items(rollouts))
    with padded_calls(context.call_sync, calls, lambda: dummy_forward(model)):
        return [on_reasoning(r, span_scores(model, item, saliency, config, _pad_id(context)).numpy())
                for r, item, saliency in zip(rollouts, items(rollouts), saliencies)]


@ATTRIBUTION_METHODS.register("oar_p_screened")
def oar_p_screened_method(rollouts: list[Rollout], table, config, context) -> list[np.ndarray]:
    """Exact OAR-P on the tokens OAR-G ranks highest (plus an audit sample); OAR-G's order below them."""
    model, _ = context.policy.load()
    saliencies = oar_g_scores(model, rollouts, config, context)
    seeds = [row_seed(context.seed, context.step, r.row) + 1 for r in rollouts]  # the audit's stream, not the noise's
    calls = sum(_perturbation_forwards(item, _measured(item[1], saliency, config, seed)[2], config)
                for item, saliency, seed in zip(items(rollouts), saliencies, seeds))
    with padded_calls(context.call_sync, calls, lambda: dummy_forward(model)):
        return [on_reasoning(r, screened_scores(model, item, saliency, config, _pad_id(context), seed)[0].numpy())
                for r, item, saliency, seed in zip(rollouts, items(rollouts), saliencies, seeds)]
