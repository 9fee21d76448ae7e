"""Bi-Level reshaping: raw attribution scores of one response -> one weight per reasoning token.

Reads the scores of one span (any attribution method: OAR-P, OAR-G, entropy, random); writes
float32 weights, one per score, that multiply the sequence advantage (section 5 of
docs/method.md). Tokens scoring below the q-quantile are suppressed towards `floor`, the
others boosted up to 1 + beta; with `preserve_mass` the weights are rescaled to sum to the span
length, so the token advantages of a response still sum to the GRPO total.

Where we deviate from the reference code (OAR-main.py; sizes measured in section 7 of docs/method.md):
- the quantile level q and the threshold tau are separate variables (the reference overwrote q
  with tau, so every response after the first in a batch used a wrong cut-off);
  `reshape.quantile_carry` reproduces the overwrite (`carried_bilevel_weights`);
- scores are cleaned first (NaN -> 0, +inf -> largest finite score, negatives -> 0), because
  `answer_joint` deltas can be negative and log1p below -1 is NaN;
- the edge cases tau == 0 and tau == 1 are defined instead of dividing by zero (see `_cut`), without
  the reference's `+ 1e-8` beside tau, which shrinks suppressed weights by 1e-8 / (tau + 1e-8):
  percents, since OAR-P's tau is often below 1e-6.
"""
from __future__ import annotations

import numpy as np

from oarctl.registry import Registry

# cleaned scores (R,) -> values in [0, 1] for the quantile cut, or None when they carry no ranking
SCORE_NORMALIZERS = Registry("score normalization")


@SCORE_NORMALIZERS.register("log1p_minmax")
def log1p_minmax(scores: np.ndarray) -> np.ndarray | None:
    """The paper's: log1p, then min-max. Heavy-tailed scores (OAR-P's KLs: one token at 5 nats, the
    median at 1e-6) put all but the top few tokens near 0, so the weights come out nearly flat."""
    logged = np.log1p(scores)
    low, high = logged.min(), logged.max()
    if high == low:
        return None
    return (logged - low) / (high - low)


@SCORE_NORMALIZERS.register("rank")
def rank(scores: np.ndarray) -> np.ndarray | None:
    """A deviation from the paper: each score's rank within the response (ties share their mean rank),
    min-max scaled. Only the order counts, so a heavy tail keeps its contrast; two-valued scores
    (truth) give exactly what log1p_minmax gives."""
    values, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
    if values.size == 1:
        return None
    mean_ranks = np.cumsum(counts) - counts + (counts - 1) / 2.0  # of each distinct value, ascending
    ranks = mean_ranks[inverse.reshape(-1)]
    return (ranks - ranks.min()) / (ranks.max() - ranks.min())


def _check_arguments(quantile: float, beta: float, floor: float) -> None:
    # Written as `not (...)` so that NaN arguments fail too.
    if not 0.0 < quantile < 1.0:
        raise ValueError(f"quantile must lie strictly between 0 and 1; got {quantile}")
    if not beta >= 0.0:
        raise ValueError(f"beta must be >= 0; got {beta}")
    if not 0.0 <= floor <= 1.0:
        raise ValueError(f"floor must lie in [0, 1]; got {floor}")


def _clean(scores: np.ndarray) -> np.ndarray | None:
    """NaN -> 0, negatives (and -inf) -> 0, +inf -> largest finite score.

    Returns None when there is no finite score to stand in for +inf (all +inf, or +inf mixed only
    with NaN/-inf): the span carries no usable ranking and every weight is 1.
    """
    scores = np.where(np.isnan(scores), 0.0, scores)
    scores = np.maximum(scores, 0.0)
    infinite = np.isposinf(scores)
    if infinite.any():
        finite = scores[~infinite]
        if finite.size == 0:
            return None
        scores = np.where(infinite, finite.max(), scores)
    return scores


def _cut(normalized: np.ndarray, tau: float, beta: float, floor: float) -> np.ndarray:
    """Suppress below tau, boost at or above it.

    tau == 0: no normalized value is below it (all lie in [0, 1]), so nothing is suppressed and
    the suppress division n / tau never runs. tau == 1: only values equal to 1 are boosted, and
    their excess n - tau is 0, so the boost is exactly 1 (instead of 0 / 0). Otherwise
    (n - tau) / (1 - tau) lies in [0, 1] and the boost in [1, 1 + beta]. Both guards give what
    the reference code's `+ 1e-8` on its denominators gives, without the epsilon bias.
    """
    suppressed = normalized < tau
    weights = np.empty_like(normalized)
    if suppressed.any():
        weights[suppressed] = np.maximum(normalized[suppressed] / tau, floor)
    boosted = ~suppressed
    if tau < 1.0:
        weights[boosted] = 1.0 + beta * (normalized[boosted] - tau) / (1.0 - tau)
    else:
        weights[boosted] = 1.0
    return weights


def _normalized(scores: np.ndarray, normalize: str = "log1p_minmax") -> np.ndarray | None:
    """n = normalize(clean(s)) in [0, 1]; None when the span has no ranking (all-ones weights)."""
    cleaned = _clean(scores)
    return None if cleaned is None else SCORE_NORMALIZERS.get(normalize)(cleaned)


def _weights(normalized: np.ndarray, tau: float, beta: float, floor: float, preserve_mass: bool) -> np.ndarray:
    weights = _cut(normalized, tau, beta, floor)
    if preserve_mass:
        # sum >= 1: the maximum (n = 1 >= tau) always gets a boost >= 1.
        weights = weights * (weights.size / weights.sum())
    return weights.astype(np.float32)


def bilevel_weights(
    scores: np.ndarray,
    quantile: float = 0.25,
    beta: float = 1.0,
    floor: float = 0.1,
    preserve_mass: bool = True,
    normalize: str = "log1p_minmax",
) -> np.ndarray:
    """Bi-Level weights for one span of scores (section 5 of docs/method.md).

    n = normalize(clean(s)), log1p then min-max by default (or `rank`, SCORE_NORMALIZERS);
    tau = np.quantile(n, quantile) with numpy's default "linear" interpolation (type 7, position
    (R - 1) * q between the sorted values; the paper does not say, the reference code calls
    np.quantile with the same default);
    w = max(n / tau, floor) if n < tau else 1 + beta * (n - tau) / (1 - tau); then, with
    preserve_mass, w * R / sum(w). All-equal cleaned scores (including a span of one token)
    give all ones. The mapping is monotone: a higher score never gets a lower weight.
    Returns float32 of the same length as `scores` (empty in, empty out).
    """
    _check_arguments(quantile, beta, floor)
    SCORE_NORMALIZERS.get(normalize)  # an unknown name fails before any work
    scores = np.asarray(scores, dtype=np.float64)
    if scores.ndim != 1:
        raise ValueError(f"scores must be 1-D (one per reasoning token); got shape {scores.shape}")
    if scores.size == 0:
        return np.zeros(0, dtype=np.float32)
    normalized = _normalized(scores, normalize)
    if normalized is None:
        return np.ones(scores.size, dtype=np.float32)
    return _weights(normalized, float(np.quantile(normalized, quantile)), beta, floor, preserve_mass)


def carried_bilevel_weights(spans: list, quantile: float = 0.25, beta: float = 1.0, floor: float = 0.1,
                            preserve_mass: bool = True, normalize: str = "log1p_minmax") -> list[np.ndarray]:
    """Bi-Level weights of a batch's spans the way the released code's batch loop computes them
    (`reshape.quantile_carry`; sections 5 and 7 of docs/method.md).

    The released loop writes each span's threshold tau into the variable that held the quantile
    level, so span 1 uses `quantile` and every later span uses the previous span's tau as its level
    (0.25 -> ~1e-6 -> ~1e-12 on OAR-P scores: after the first span about one token per span is
    suppressed). A span without a ranking (all equal) gets all ones and carries tau = 0, as the
    released min-max gives it; an empty span, or one whose scores are all NaN (a row not scored,
    `attribute.skip_uniform_groups`), gets all ones and leaves the level as it was.
    """
    _check_arguments(quantile, beta, floor)
    level, batch = quantile, []
    for scores in spans:
        scores = np.asarray(scores, dtype=np.float64)
        if scores.size == 0 or np.isnan(scores).all():
            batch.append(np.ones(scores.size, dtype=np.float32))
            continue
        normalized = _normalized(scores, normalize)
        if normalized is None:
            batch.append(np.ones(scores.size, dtype=np.float32))
            level = 0.0
            continue
        tau = float(np.quantile(normalized, level))
        batch.append(_weights(normalized, tau, beta, floor, preserve_mass))
        level = tau
    return batch


def _on_response(length: int, reasoning: tuple[int, int], reasoning_weights: np.ndarray) -> np.ndarray:
    weights = np.ones(length, dtype=np.float32)
    weights[reasoning[0]:reasoning[1]] = reasoning_weights
    return weights


def response_weights(scores, reasoning: tuple[int, int], config) -> np.ndarray:
    """One float32 weight per response token: Bi-Level weights of the reasoning span's scores, 1 on every
    other token (conclude, answer, closing brace, eos keep the plain advantage). `config` holds
    quantile, beta, floor, preserve_mass and normalize (a ReshapeConfig)."""
    start, end = reasoning
    return _on_response(len(scores), reasoning, bilevel_weights(
        np.asarray(scores[start:end], dtype=np.float32), quantile=config.quantile, beta=config.beta,
        floor=config.floor, preserve_mass=config.preserve_mass, normalize=config.normalize))


def batch_response_weights(rows: list, config) -> list[np.ndarray]:
    """`response_weights` of every (scores, reasoning span) row of a batch, in order; with
    config.quantile_carry, the released code's carried quantile level (`carried_bilevel_weights`)."""
    if not config.quantile_carry:
        return [response_weights(scores, reasoning, config) for scores, reasoning in rows]
    spans = [np.asarray(scores[start:end], dtype=np.float32) for scores, (start, end) in rows]
    carried = carried_bilevel_weights(spans, quantile=config.quantile, beta=config.beta, floor=config.floor,
                                      preserve_mass=config.preserve_mass, normalize=config.normalize)
    return [_on_response(len(scores), reasoning, weights) for (scores, reasoning), weights in zip(rows, carried)]


def top_mass_share(weights: np.ndarray, share: float = 0.1) -> float:
    """Share of the reasoning's |token advantage| mass carried by its top `share` tokens by weight.

    |A x w| = |A| x w within one sequence, so |A| cancels: this is a ratio of weights.
    """
    count = max(1, int(np.ceil(share * len(weights))))
    return float(np.sort(weights)[::-1][:count].sum() / weights.sum())


def effective_tokens(weights: np.ndarray) -> float:
    """(sum w)^2 / sum w^2: R for uniform weights, 1 when one token carries everything."""
    return float(weights.sum(dtype=np.float64) ** 2 / np.square(weights, dtype=np.float64).sum())


def concentration_metrics(weights: list[np.ndarray], advantages: np.ndarray) -> dict:
    """How concentrated credit is, over reasoning spans with positive total weight.

    top10_mass_share only counts sequences with nonzero advantage (others carry no credit at all);
    a metric with no sequence to average over is left out rather than reported as 0.
    """
    spans = [(w, a) for w, a in zip(weights, advantages) if len(w) and w.sum() > 0]
    metrics = {}
    shares = [top_mass_share(w) for w, a in spans if a != 0]
    if shares:
        metrics["top10_mass_share"] = float(np.mean(shares))
    if spans:
        metrics["effective_tokens"] = float(np.mean([effective_tokens(w) for w, _ in spans]))
        metrics["effective_token_fraction"] = float(np.mean([effective_tokens(w) / len(w) for w, _ in spans]))
    return metrics
