"""KTAE (Sun et al., arXiv 2505.16826): a key-token value per response token from the rollouts of its group
alone, no forward pass. Registers `ktae`.

Reads each row's response token ids, its reward and its group (prompt_id); writes one score per response
token (every response token, not only the reasoning): the key-token value k(v) of the token's id v within
its group, in [-ktae_scale, ktae_scale]. The reshape stage adds it to the sequence advantage
(`credit_rules.ktae`: A_it = A_i + k), as the released code does.

Per group (correct: reward > 0, as the released code splits them), per token id v of its responses:
  a, b  correct / incorrect responses that contain v; c = n_correct - a, d = n_incorrect - b;
  F     = exp(-2 p) with p Fisher's two-sided exact p-value of [[a, b], [c, d]] (with ktae_unit_p_zero, 0
          where p = 1);
  IG    = H(correct) - H(correct | contains v), in bits;
  x     = asin(sqrt(a / n_correct)) - asin(sqrt(b / n_incorrect))  (Cohen's h without its factor 2)
          + with ktae_tf: tf_c / (tf_i + 1e-5) - tf_i / (tf_c + 1e-5), tf the BM25-saturated frequency of v
          among the group's correct / incorrect tokens (k1 = 2, b = 0.5, lengths against their mean);
  k(v)  = (sigmoid((alpha F + beta IG) x / (alpha + beta)) - 0.5) * 2 * ktae_scale.
A group whose responses are all correct or all incorrect gets k = 0 throughout; so do the tokenizer's
eos and pad ids (the released code zeroes id 151643, Qwen2.5's <|endoftext|>).

Where we deviate from the released code (xiaolizh1/KTAE, verl/workers/actor/compute_key_tokens.py;
sizes measured in section 10 of docs/method.md): float64 instead of float32; Fisher's p sums the tables
at most as likely as the observed one with scipy's relative tolerance 1e-7 (the released sum compares
float32 values exactly, so tables tied in probability can drop out); `p = 1` is read with the same
tolerance; the released float32 sum comes out at 1.0000005 where p = 1, so its `p != 1.0` guard does not
fire and such tokens get F = exp(-2): the default reproduces that, `ktae_unit_p_zero: true` applies the guard
(a different value on about a third of the tokens, up to 0.63, measured); the zeroed ids are the tokenizer's, not a fixed Qwen id (which would be out of range for a
smaller vocabulary).
"""
from __future__ import annotations

import math

import numpy as np

from oarctl.attribution.base import ATTRIBUTION_METHODS

BM25_K1, BM25_B = 2.0, 0.5  # the released code's term-frequency saturation constants
TF_EPS = 1e-5  # the released code's guard in the tf ratio
TIE_TOLERANCE = 1e-7  # scipy.stats.fisher_exact's relative tolerance on equal table probabilities


def _log_choose(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def fisher_two_sided(a: int, b: int, c: int, d: int) -> float:
    """Two-sided p-value of Fisher's exact test on [[a, b], [c, d]]: the summed hypergeometric probability
    of every table with the observed margins at most as likely as the observed one."""
    row, column, total = a + b, a + c, a + b + c + d

    def probability(k: int) -> float:
        return math.exp(_log_choose(column, k) + _log_choose(total - column, row - k) - _log_choose(total, row))

    observed = probability(a)
    tables = (probability(k) for k in range(max(0, row + column - total), min(row, column) + 1))
    return min(1.0, sum(p for p in tables if p <= observed * (1 + TIE_TOLERANCE)))


def _entropy_bits(*counts: float) -> float:
    total = sum(counts)
    return -sum(c / total * math.log2(c / total) for c in counts if c > 0) if total else 0.0


def information_gain(a: int, b: int, c: int, d: int) -> float:
    """H(correct) - H(correct | contains the token), in bits."""
    total = a + b + c + d
    conditional = (a + b) / total * _entropy_bits(a, b) + (c + d) / total * _entropy_bits(c, d)
    return _entropy_bits(a + c, b + d) - conditional


def _bm25(frequency: float, length: int, mean_length: float) -> float:
    saturation = BM25_K1 * (1 - BM25_B + BM25_B * length / mean_length)
    return frequency * (BM25_K1 + 1) / (frequency + saturation)


def key_values(responses: list[list[int]], correct: list[bool], alpha: float = 1.0, beta: float = 1.0,
               use_tf: bool = True, scale: float = 1.0, zero_ids=(), unit_p_zero: bool = False) -> dict[int, float]:
    """{token id: key-token value} of one group's responses ({} when the group is not mixed)."""
    wins = [set(r) for r, ok in zip(responses, correct) if ok]
    losses = [set(r) for r, ok in zip(responses, correct) if not ok]
    if not wins or not losses:
        return {}
    counts = [_counts([r for r, ok in zip(responses, correct) if ok]),
              _counts([r for r, ok in zip(responses, correct) if not ok])]
    lengths = [sum(c.values()) for c in counts]
    mean_length = sum(lengths) / 2
    values = {}
    for token in set().union(*wins, *losses):
        a, b = sum(token in s for s in wins), sum(token in s for s in losses)
        c, d = len(wins) - a, len(losses) - b
        p = fisher_two_sided(a, b, c, d)
        strength = 0.0 if unit_p_zero and p >= 1 - TIE_TOLERANCE else math.exp(-2 * p)
        x = math.asin(math.sqrt(a / len(wins))) - math.asin(math.sqrt(b / len(losses)))
        if use_tf:
            tf_win, tf_loss = (_bm25(counts[i].get(token, 0) / lengths[i], lengths[i], mean_length) for i in (0, 1))
            x += tf_win / (tf_loss + TF_EPS) - tf_loss / (tf_win + TF_EPS)
        combined = (alpha * strength + beta * information_gain(a, b, c, d)) * x / (alpha + beta)
        values[token] = 0.0 if token in zero_ids else math.tanh(combined / 2) * scale  # (sigmoid - 0.5) * 2, no overflow
    return values


def _counts(responses: list[list[int]]) -> dict[int, int]:
    counts: dict[int, int] = {}
    for response in responses:
        for token in response:
            counts[token] = counts.get(token, 0) + 1
    return counts


def group_key_values(responses: list[list[int]], rewards: list[float], groups: list, config,
                     zero_ids=()) -> list[np.ndarray]:
    """Per response, the key-token value of each of its tokens within its group (float32)."""
    members: dict = {}
    for index, group in enumerate(groups):
        members.setdefault(group, []).append(index)
    scores: list[np.ndarray] = [np.zeros(0, dtype=np.float32)] * len(responses)
    for rows in members.values():
        values = key_values([responses[i] for i in rows], [rewards[i] > 0 for i in rows], config.ktae_alpha,
                            config.ktae_beta, config.ktae_tf, config.ktae_scale, zero_ids, config.ktae_unit_p_zero)
        for i in rows:
            scores[i] = np.array([values.get(t, 0.0) for t in responses[i]], dtype=np.float32)
    return scores


@ATTRIBUTION_METHODS.register("ktae")
def ktae_method(rollouts, table, config, context) -> list[np.ndarray]:
    """KTAE key-token values on every response token, from the rows' groups and rewards (no model)."""
    tokenizer = context.policy.load_tokenizer()
    zero_ids = {i for i in (tokenizer.eos_token_id, tokenizer.pad_token_id) if i is not None}
    return group_key_values(table["response_token_ids"].to_pylist(), table["reward"].to_pylist(),
                            table["prompt_id"].to_pylist(), config, zero_ids)
