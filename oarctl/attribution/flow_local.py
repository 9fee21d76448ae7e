"""oar_flow_local: oar_flow's credit at about oar_p_span's cost. Links are read within a horizon of
later tokens, and the direct effect on the answer comes from OAR-G's gradient.

Why: oar_flow (flow.py) perturbs every reasoning token and runs each perturbation to the answer:
about R^2 / 2 recomputed positions, where oar_p_span's windows of 8 need R^2 / 16. Measured on
sampled chains rollouts (bench/credit_gate.py, docs/results.md), most of that work buys nothing:
- links are short. The strongest link of an earlier-chain token (the later token whose
  log-probability drops most when it is perturbed) is at most 10 tokens away in 90% of cases.
  Dropping the links longer than 16 tokens *raised* oar_flow's AUC against the truth (0.776 ->
  0.807): the long links are mostly noise that the propagation carries along.
- the direct effect A_u on the answer is the only part that needs the forward to the answer.
  OAR-G's saliency (one forward and one backward per batch of responses) finds it as well as
  perturbation does (with it, AUC 0.825).

What, per response with reasoning tokens t = start + u:
- A_u: OAR-G's score (attribute.oar_g_mode, noise_std), as the oar_g method computes it;
- D[u, k]: the drop of log p(r_{t+1+k}), k < horizon, when token t alone is replaced by the pad
  token. Causal attention means a perturbation changes only positions after it. So a row needs only
  positions t .. t + horizon - 1, attending the clean sequence's keys left of t. Many rows share one
  forward over the clean cache, each masked to its own prefix and placed at its own positions. The
  numbers are exactly those of a full forward of the perturbed sequence (to rounding; the tests
  check 1e-6 in float64);
- I_u = rule(A_u, D[u, :], I[u+1 .. u+horizon]): oar_flow's propagation rules (attribute.flow_rule),
  from the last token back.

Cost: R x horizon recomputed positions plus OAR-G, against oar_p_span's ~R^2/16. Measured
(bench/flow_cost.py), it is 2.6x oar_p_span at R = 128 and 1.1x at 512, and cheaper from about 600
tokens. Every row still attends the whole clean prefix. Memory: a forward holds rows x
(prefix + horizon) keys per layer, within attribute.max_batch_tokens; the output layer runs at most
LOGIT_TOKENS positions at a time; D is used row by row (O(R x horizon) floats). Outcome and
log-probability math is float64.
"""
from __future__ import annotations

import numpy as np
import torch

from oarctl.attribution.base import ATTRIBUTION_METHODS, Rollout, on_reasoning
from oarctl.attribution.flow import CHUNK_SIZE, FLOW_RULE, FLOW_RULES, _decode, _perturb_token, _token_log_probs
from oarctl.attribution.oar import NOISE_STD, OAR_G_MODE, additive_causal_mask, oar_g, oar_g_scores
from oarctl.schema import AttributeConfig
from oarctl.attribution.prefix import frozen_prefix

Span = tuple[int, int]
FLOW_HORIZON = AttributeConfig.flow_horizon  # the Python API's default: the config's


def local_rows(rows_left: int, first: int, horizon: int, rows_per_call: int, max_batch_tokens: int) -> int:
    """Rows of the next forward, whose first token is at `first`: rows_per_call, fewer where its keys,
    rows x (the last row's prefix + horizon), exceed the budget (one row at least)."""
    rows = min(rows_per_call, rows_left)
    if max_batch_tokens:
        rows = max(1, min(rows, max_batch_tokens // (first + horizon)))
        while rows > 1 and rows * (first + rows - 1 + horizon) > max_batch_tokens:
            rows -= 1
    return rows


def _row_mask(starts: torch.Tensor, prefix: int, horizon: int, dtype) -> torch.Tensor:
    """(rows, 1, horizon, prefix + horizon) additive mask: row i sees the clean keys left of starts[i]
    and its own positions causally."""
    keys = torch.arange(prefix, device=starts.device)[None, :] < starts[:, None]  # (rows, prefix)
    keys = torch.cat([keys, keys.new_ones((len(starts), horizon))], dim=1)
    return additive_causal_mask(keys.long(), prefix, dtype)


def _local_chunk(model, ids: torch.Tensor, cache, starts: list[int], horizon: int, pad: int,
                 end: int) -> np.ndarray:
    """log p (rows, horizon) float64 of tokens t+1 .. t+horizon (NaN past `end`), token t = starts[i] padded."""
    device, rows = ids.device, len(starts)
    prefix = starts[-1]  # the last row attends the most clean keys
    offsets = torch.arange(horizon, device=device)
    positions = torch.tensor(starts, device=device)[:, None] + offsets  # (rows, horizon)
    window = ids[0, positions.clamp(max=end - 1)]
    window[:, 0] = pad
    targets = ids[0, (positions + 1).clamp(max=end - 1)]
    past = frozen_prefix(cache, model.config, prefix, rows=rows)
    mask = _row_mask(positions[:, 0], prefix, horizon, model.get_input_embeddings().weight.dtype)
    hidden = _decode(model, input_ids=window, position_ids=positions, attention_mask=mask, past_key_values=past,
                     use_cache=past is not None)
    log_probs = _token_log_probs(model, hidden, targets).cpu().numpy()
    log_probs[(positions + 1 >= end).cpu().numpy()] = np.nan
    return log_probs


@torch.no_grad()
def local_drops(model, input_ids: torch.Tensor, reasoning_span: Span, horizon: int,
                perturb_token_id: int | None = None, rows_per_call: int = 64, max_batch_tokens: int = 0) -> np.ndarray:
    """D (R, horizon) float64: D[u, k] = log p(r_s | clean) - log p(r_s | token t padded) for t = start + u,
    s = t + 1 + k; NaN where s leaves the reasoning."""
    if horizon < 1 or rows_per_call < 1:
        raise ValueError(f"oar_flow_local needs horizon >= 1 and rows_per_call >= 1; got {horizon}, {rows_per_call}")
    pad = _perturb_token(model, perturb_token_id)
    start, end = reasoning_span
    ids = input_ids[:end].to(model.device).unsqueeze(0)
    clean = model.get_decoder()(input_ids=ids, use_cache=True)
    clean_log_probs = np.full(end + horizon, np.nan)  # clean_log_probs[s]: log p(r_s), s in (start, end)
    clean_log_probs[start + 1:end] = _token_log_probs(model, clean.last_hidden_state[:, start:end - 1],
                                                      ids[:, start + 1:end])[0].cpu().numpy()
    drops, row = np.full((end - start, horizon), np.nan), 0
    while row < end - start:
        rows = local_rows(end - start - row, start + row, horizon, rows_per_call, max_batch_tokens)
        starts = list(range(start + row, start + row + rows))
        perturbed = _local_chunk(model, ids, clean.past_key_values, starts, horizon, pad, end)
        later = np.stack([clean_log_probs[t + 1:t + 1 + horizon] for t in starts])
        drops[row:row + rows] = later - perturbed
        row += rows
    return drops


def propagate(direct: np.ndarray, drops: np.ndarray, rule: str) -> np.ndarray:
    """I (R,) float64 from the last token back: I_u = rule(A_u, D[u, links], I[u+1 .. u+horizon])."""
    function, credit = FLOW_RULES.get(rule), np.zeros(len(direct))
    for u in reversed(range(len(direct))):
        links = drops[u][~np.isnan(drops[u])]
        credit[u] = function(float(direct[u]), links, credit[u + 1:u + 1 + len(links)])
    return credit


def local_rows_per_call(config, reasoning_tokens: int) -> int:
    """As many recomputed positions per forward as an average oar_flow chunk: chunk_size rows, each
    recomputing about half the reasoning."""
    return rows_per_call(config.chunk_size, config.flow_horizon, reasoning_tokens)


def rows_per_call(chunk_size: int, horizon: int, reasoning_tokens: int) -> int:
    return chunk_size * max(1, reasoning_tokens // (2 * horizon))


def oar_flow_local(model, input_ids: torch.Tensor, reasoning_span: Span, answer_span: Span, mode: str = OAR_G_MODE,
                   noise_std: float = NOISE_STD, seed: int = 0, horizon: int = FLOW_HORIZON, rule: str = FLOW_RULE,
                   perturb_token_id: int | None = None, chunk_size: int = CHUNK_SIZE,
                   max_batch_tokens: int = 0) -> torch.Tensor:
    """oar_flow_local credit (R,) float32 of each reasoning token of one response, as the `oar_flow_local`
    registry entry scores it: the public API beside `oar_p` and `oar_g`. `mode`, `noise_std` and `seed` are
    OAR-G's (the direct effect; the registry seeds each row with `base.row_seed`), `horizon` and `rule` the
    links' (attribute.flow_horizon, attribute.flow_rule)."""
    direct = oar_g(model, input_ids, reasoning_span, answer_span, mode, noise_std, seed)
    per_call = rows_per_call(chunk_size, horizon, reasoning_span[1] - reasoning_span[0])
    drops = local_drops(model, input_ids, reasoning_span, horizon, perturb_token_id, per_call, max_batch_tokens)
    return torch.from_numpy(propagate(direct.double().numpy(), drops, rule)).float()


@ATTRIBUTION_METHODS.register("oar_flow_local")
def oar_flow_local_method(rollouts: list[Rollout], table, config, context) -> list[np.ndarray]:
    """oar_flow with links within attribute.flow_horizon tokens and OAR-G's direct effect."""
    model, tokenizer = context.policy.load()
    direct = oar_g_scores(model, rollouts, config, context)
    scores = []
    for rollout, a in zip(rollouts, direct):
        length = rollout.reasoning[1] - rollout.reasoning[0]
        drops = local_drops(model, rollout.input_ids, rollout.reasoning, config.flow_horizon, tokenizer.pad_token_id,
                            local_rows_per_call(config, length), config.max_batch_tokens)
        scores.append(on_reasoning(rollout, propagate(a.double().numpy(), drops, config.flow_rule)))
    return scores
