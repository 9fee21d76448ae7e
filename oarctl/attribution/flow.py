"""oar_flow: OAR-P whose credit follows the model's own chain of reasoning (propagated OAR-P).

Why: teacher-forced OAR-P sees a token's *direct* effect on the answer only. When the box copies
the last step (`e=44-2=42. \\boxed{42}`), perturbing an earlier step changes the answer only
through the later tokens that copy it, and teacher forcing holds those fixed; so OAR-P scores the
earlier chain like filler (docs/method.md, section 8).

What: a perturbation (one reasoning token, or a window of them, replaced by the pad token, exactly
as OAR-P) is already a forward pass over everything after it. The same pass gives
- A_u, the outcome drop (OAR-P's score: KL(P || P^u), or phi - phi^u for answer_joint), and
- d_s, the drop in log-probability of every later sampled reasoning token s:
  d_s = log p(r_s | clean) - log p(r_s | unit u perturbed),
  summed per later unit v into D[u, v] (the drop of v's joint log-likelihood; one token per unit for
  `oar_flow`, a window for `oar_flow_span`).
Credit then flows back from the answer over the units, last first, by a propagation rule
(`attribute.flow_rule`, the registry below):
    widest:   I_u = max(A_u, max_{v > u} min(D[u, v], I_v))
    product:  I_u = max(A_u, max_{v > u} (1 - exp(-D[u, v])) I_v)      (the default)
A unit is as important as its strongest chain of "changing it changes that" links to the answer;
`widest` makes a chain as strong as its weakest link (the first probe's rule), `product` reads a
link's drop as the probability 1 - exp(-D) that a change gets through and multiplies them, so long
chains of weak links fade. On the same perturbations of sampled chains rollouts `product` ranked the
answer's tokens best (bench/credit_gate.py; docs/results.md), so it is the default.

Cost: the forwards of OAR-P over the same units, plus the output layer at the suffix's reasoning
positions, projected `LOGIT_TOKENS` (rows x positions) at a time and never as (B, T, V) for the
whole chunk, plus an O(units^2) pass on the CPU. Memory: the chunks are OAR-P's (within
`attribute.max_batch_tokens`); the perturbation chunks run last first, so each row of D is used as
soon as it is computed and only the per-unit scores are kept: O(R), not O(R^2). All outcome and
log-probability math is float64.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch

from oarctl.attribution import outcome
from oarctl.attribution.base import ATTRIBUTION_METHODS, Rollout, on_reasoning
from oarctl.attribution.oar import OAR_P_MODE, _perturb_token, _perturbation_chunks, _plan, items
from oarctl.attribution.oar_p_cheap import spread, windows
from oarctl.attribution.prefix import frozen_prefix
from oarctl.registry import Registry
from oarctl.schema import AttributeConfig

Span = tuple[int, int]
FLOW_RULE = AttributeConfig.flow_rule  # defaults of the Python API: the config's
CHUNK_SIZE = AttributeConfig.chunk_size
LOGIT_TOKENS = 1024  # rows x positions projected to the vocabulary at once (with V = 152k: ~1.2 GB float64)

# (A_u, D[u, later units], I[later units]) -> I_u, all float64
Rule = Callable[[float, np.ndarray, np.ndarray], float]
FLOW_RULES: Registry[Rule] = Registry("oar_flow propagation rule")


@FLOW_RULES.register("widest")
def widest(answer: float, drops: np.ndarray, later: np.ndarray) -> float:
    """The widest path: the strongest chain of links, each as strong as its weakest hop."""
    return max(answer, float(np.minimum(drops, later).max(initial=-math.inf)))


@FLOW_RULES.register("product")
def product(answer: float, drops: np.ndarray, later: np.ndarray) -> float:
    """Links as probabilities 1 - exp(-D) that a change gets through; a path multiplies them."""
    passing = -np.expm1(-np.maximum(drops, 0.0))
    return max(answer, float((passing * later).max(initial=-math.inf)))


@FLOW_RULES.register("sum")
def total(answer: float, drops: np.ndarray, later: np.ndarray) -> float:
    """Every path counts: the direct effect plus each later unit's credit, capped by its link."""
    return answer + float(np.maximum(np.minimum(drops, later), 0.0).sum())


# ---- the engine ------------------------------------------------------------------------------------

def _decode(model, **inputs) -> torch.Tensor:
    """The last hidden states (B, T, H): the model's forward without its output layer."""
    return model.get_decoder()(**inputs).last_hidden_state


def _projected(model, hidden: torch.Tensor) -> torch.Tensor:
    return model.get_output_embeddings()(hidden)


def _token_log_probs(model, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log p(targets) (B, P) float64 from hidden states (B, P, H), LOGIT_TOKENS rows x positions at a time."""
    rows, positions = targets.shape
    step = max(1, LOGIT_TOKENS // max(1, rows))
    parts = [torch.zeros((rows, 0), dtype=torch.float64, device=hidden.device)]
    for start in range(0, positions, step):
        logits = _projected(model, hidden[:, start:start + step]).double()
        log_probs = torch.log_softmax(logits, dim=-1)
        parts.append(log_probs.gather(-1, targets[:, start:start + step, None]).squeeze(-1))
    return torch.cat(parts, dim=1)


def _unit_drops(drops: np.ndarray, first: int, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """D[u, v] for the units v = [starts, ends): `drops` (positions first + 1 ..) summed per unit."""
    cumulative = np.concatenate([[0.0], np.cumsum(drops)])  # cumulative[j]: the drops of s < first + 1 + j
    return cumulative[ends - first - 1] - cumulative[starts - first - 1]


@torch.no_grad()
def flow_scores(model, input_ids: torch.Tensor, reasoning_span: Span, answer_span: Span, units: list[Span],
                mode: str, perturb_token_id: int | None = None, chunk_size: int = 8, max_batch_tokens: int = 0,
                rules: tuple[str, ...] = ("product",)) -> dict[str, np.ndarray]:
    """Propagated OAR-P credit (len(units),) float64 per rule. `units` are sorted, disjoint spans
    tiling the reasoning (one token each for oar_flow); each is perturbed once."""
    if [a for a, _ in units] != sorted(a for a, _ in units) or any(
            b != c for (_, b), (c, _) in zip(units, units[1:])) or (units and (
            units[0][0] != reasoning_span[0] or units[-1][1] != reasoning_span[1])):
        raise ValueError(f"oar_flow units must tile the reasoning {reasoning_span} in order; got {units}")
    functions = [FLOW_RULES.get(rule) for rule in rules]
    pad = _perturb_token(model, perturb_token_id)
    plan = _plan(input_ids, reasoning_span, answer_span, mode)
    device, end_reasoning = model.device, reasoning_span[1]
    ids = input_ids[:plan.end].to(device).unsqueeze(0)
    clean = model.get_decoder()(input_ids=ids, use_cache=True)
    at_outcome = clean.last_hidden_state[:, plan.positions.to(device)]
    clean_outcome = outcome.outcome_from_logits(_projected(model, at_outcome), plan.mode, plan.answer_ids)
    start = reasoning_span[0]
    clean_log_probs = _token_log_probs(model, clean.last_hidden_state[:, start:end_reasoning - 1],
                                       ids[:, start + 1:end_reasoning])[0].cpu().numpy()  # s = start+1 .. end-1
    credit = {rule: np.full(len(units), np.nan) for rule in rules}
    starts, ends = np.array([a for a, _ in units], dtype=np.int64), np.array([b for _, b in units], dtype=np.int64)
    for chunk in reversed(_perturbation_chunks(units, plan.end, chunk_size, max_batch_tokens)):
        first, rows = units[chunk[0]][0], len(chunk)
        suffix = ids[:, first:plan.end].repeat(rows, 1)
        for row, index in enumerate(chunk):
            a, b = units[index]
            suffix[row, a - first:b - first] = pad
        prefix = frozen_prefix(clean.past_key_values, model.config, first, rows=rows)
        hidden = _decode(model, input_ids=suffix, past_key_values=prefix, use_cache=prefix is not None)
        at_outcome = hidden[:, (plan.positions - first).to(device)]
        changed = outcome.outcome_from_logits(_projected(model, at_outcome), plan.mode, plan.answer_ids)
        answer = outcome.importance(clean_outcome, changed, plan.mode).cpu().numpy()  # (rows,)
        log_probs = _token_log_probs(model, hidden[:, :end_reasoning - 1 - first],
                                     suffix[:, 1:end_reasoning - first]).cpu().numpy()  # s = first+1 .. end-1
        drops = clean_log_probs[first - start:] - log_probs  # (rows, end - 1 - first)
        for row in reversed(range(rows)):
            index = chunk[row]
            link = _unit_drops(drops[row], first, starts[index + 1:], ends[index + 1:])
            for rule, function in zip(rules, functions):
                credit[rule][index] = function(float(answer[row]), link, credit[rule][index + 1:])
    return credit


# ---- registry entries ----------------------------------------------------------------------------

def flow_units(reasoning: Span, config, span: bool) -> list[Span]:
    """One unit per reasoning token (oar_flow), or oar_p_span's windows (oar_flow_span)."""
    if not span:
        return [(t, t + 1) for t in range(*reasoning)]
    return windows(reasoning, config.span_tokens, config.max_perturbations)


def flow_method_scores(rollouts: list[Rollout], config, context, span: bool,
                       rules: tuple[str, ...] | None = None) -> dict[str, list[np.ndarray]]:
    """{rule: per rollout, one float32 score per reasoning token} (a window's credit spread evenly over
    it), for `rules` (default: config.flow_rule) from one pass of the engine."""
    model, tokenizer = context.policy.load()
    rules = rules or (config.flow_rule,)
    scores = {rule: [] for rule in rules}
    for input_ids, reasoning, answer in items(rollouts):
        units = flow_units(reasoning, config, span)
        credit = flow_scores(model, input_ids, reasoning, answer, units, config.oar_p_mode, tokenizer.pad_token_id,
                             config.chunk_size, config.max_batch_tokens, rules)
        for rule in rules:
            scores[rule].append(spread(torch.from_numpy(credit[rule]), units, reasoning[0], None,
                                       reasoning[1] - reasoning[0]).numpy().astype(np.float32))
    return scores


def oar_flow(model, input_ids: torch.Tensor, reasoning_span: Span, answer_span: Span, mode: str = OAR_P_MODE,
             rule: str = FLOW_RULE, perturb_token_id: int | None = None, chunk_size: int = CHUNK_SIZE,
             max_batch_tokens: int = 0) -> torch.Tensor:
    """oar_flow credit (R,) float32 of each reasoning token of one response, as the `oar_flow` registry entry
    scores it (negative credit clipped to 0): the public API beside `oar_p` and `oar_g`. `mode` is OAR-P's
    outcome (attribute.oar_p_mode), `rule` the propagation rule (attribute.flow_rule)."""
    units = flow_units(reasoning_span, None, span=False)
    credit = flow_scores(model, input_ids, reasoning_span, answer_span, units, mode, perturb_token_id, chunk_size,
                         max_batch_tokens, (rule,))[rule]
    return spread(torch.from_numpy(credit), units, reasoning_span[0], None,
                  reasoning_span[1] - reasoning_span[0]).float()


@ATTRIBUTION_METHODS.register("oar_flow")
def oar_flow_method(rollouts: list[Rollout], table, config, context) -> list[np.ndarray]:
    """Propagated OAR-P: a token's credit is its strongest chain of effects to the answer."""
    scores = flow_method_scores(rollouts, config, context, span=False)[config.flow_rule]
    return [on_reasoning(r, s) for r, s in zip(rollouts, scores)]


@ATTRIBUTION_METHODS.register("oar_flow_span")
def oar_flow_span_method(rollouts: list[Rollout], table, config, context) -> list[np.ndarray]:
    """oar_flow over oar_p_span's windows (attribute.span_tokens), each window's credit spread evenly."""
    scores = flow_method_scores(rollouts, config, context, span=True)[config.flow_rule]
    return [on_reasoning(r, s) for r, s in zip(rollouts, scores)]
