"""From the bench's dot products to its table: cosines with 95% intervals, paired differences to uniform,
noise-corrected cosines, effective batches and the check of the assumption they rest on.

Model: a batch gradient under method m is g = mu_m + noise, the reference R = mu + its own noise, mu the
true (expected uniform) policy gradient, the noises independent (no shared sample). Then
- `cosine`: mean over batches of cos(g, R), with a Student-t 95% interval over the 2K batches (batches of
  one half share their reference, so the interval is somewhat narrow);
- `vs_uniform`: the same for the paired difference cos(g_m, R) - cos(g_uniform, R), batch by batch;
- |mu|^2 and |mu_m|^2 without bias from the batches of one half: (|sum g_b|^2 - sum |g_b|^2) / (K (K - 1)),
  the mean of <g_b, g_b'> over pairs of different batches, averaged over the halves;
- `corrected_cosine`: cos(g, R) / cos(R, mu) with cos(R, mu)^2 = |mu|^2 / |R|^2, i.e. the cosine with the
  true gradient, c^2 = 1 / (1 + r), r the batch's noise-to-signal ratio;
- `effective_batch` = (1/c_uniform^2 - 1) / (1/c_m^2 - 1) = r_uniform / r_m: how many uniform batches the
  method's batch is worth (noise falls as 1 / batch size). It assumes mu_m points along mu;
- `expected_cosine` checks that: <mu_m, mu> / (|mu_m| |mu|), <mu_m, mu> estimated by the mean <g, R>. It is
  a ratio of unbiased estimates, so it can exceed 1 by noise; well below 1, the method's expected gradient
  is bent off the true one and `effective_batch` overstates it.
- `effective_batch_split`: the same ratio with the reference's noise taken from the two references instead
  of from pairs of batches: cos(R_A, R_B) ~ cos(R, mu)^2 (independent noises of equal size), so
  c = cosine / sqrt(cos(R_A, R_B)). One measured dot product of two half-pool gradients, where |mu|^2 rests on
  K (K - 1) batch pairs: with few batches a half, or a small signal, the pair estimate is the noisier one
  (uniform's `expected_cosine` far from 1 says so), and this column is the one to read.
"""
from __future__ import annotations

import math
from collections import defaultdict

import numpy as np

from oarctl.report.stats import t_interval


def _signal(scores, sums, method: str) -> float:
    """|mu_m|^2 from the pairs of different batches within each half, averaged over the halves."""
    estimates = []
    for total in (s for s in sums if s.method == method):
        norms = [b.squared_norm for b in scores if b.method == method and b.half == total.half]
        k = len(norms)
        estimates.append((total.squared_norm - sum(norms)) / (k * (k - 1)))
    return float(np.mean(estimates))


def _cosine(score) -> float:
    """cos(g, R); 0 for a batch whose gradient is 0 (all its groups' rewards equal): it moves nothing."""
    if score.squared_norm == 0:
        return 0.0
    return score.dot / math.sqrt(score.squared_norm * score.reference_squared_norm)


def _effective(uniform: float, method: float) -> float:
    """r_uniform / r_method; a method without signal along mu (c <= 0: r infinite) is worth 0 batches."""
    if not 0 < uniform < 1 or not method < 1:
        return math.nan  # a corrected cosine of 1 or more has no noise ratio (the estimates are too noisy)
    return 0.0 if method <= 0 else (1 / uniform ** 2 - 1) / (1 / method ** 2 - 1)


def summarise(scores, sums, methods: list[str], references_cosine: float) -> dict[str, list]:
    """The table's columns (without the cost columns), one row per method in `methods` order;
    `references_cosine` is reference_checks(scores, sums)'s cos(R_A, R_B)."""
    by_method = defaultdict(list)
    for score in sorted(scores, key=lambda s: (s.half, s.batch)):
        by_method[score.method].append(score)
    mu = _signal(scores, sums, "uniform")
    cosines = {m: np.array([_cosine(s) for s in by_method[m]]) for m in methods}
    reference_cosines = np.array([math.sqrt(mu / s.reference_squared_norm) if mu > 0 else math.nan
                                  for s in by_method["uniform"]])
    corrected = {m: float(np.mean(cosines[m] / reference_cosines)) for m in methods}
    split = {m: float(np.mean(cosines[m])) / math.sqrt(references_cosine) if references_cosine > 0 else math.nan
             for m in methods}
    columns = defaultdict(list)
    for method in methods:
        cosine, differences = cosines[method], cosines[method] - cosines["uniform"]
        signal = _signal(scores, sums, method)
        mean_dot = float(np.mean([s.dot for s in by_method[method]]))
        values = {"method": method, "batches": int(cosine.size),
                  **dict(zip(("cosine", "cosine_low", "cosine_high"), t_interval(cosine))),
                  **dict(zip(("vs_uniform", "vs_uniform_low", "vs_uniform_high"), t_interval(differences))),
                  "corrected_cosine": corrected[method],
                  "expected_cosine": mean_dot / math.sqrt(signal * mu) if signal > 0 and mu > 0 else math.nan,
                  "grad_sq_norm": float(np.mean([s.squared_norm for s in by_method[method]])),
                  "effective_batch": _effective(corrected["uniform"], corrected[method]),
                  "effective_batch_split": _effective(split["uniform"], split[method])}
        for name, value in values.items():
            columns[name].append(value)
    return dict(columns)


def reference_checks(scores, sums) -> dict[str, float]:
    """cos(R, mu) of each half's reference (estimated) and cos(R_A, R_B) (measured): the second should be
    about the product of the first two, the references' noise being independent."""
    mu = _signal(scores, sums, "uniform")
    norms = {s.half: s.reference_squared_norm for s in scores if s.method == "uniform"}  # keyed by scored half
    (half_b,) = [s for s in sums if s.method == "uniform" and s.half == 1]
    k = sum(1 for s in scores if s.method == "uniform" and s.half == 1)
    cross = half_b.dot / k / math.sqrt(norms[1] * norms[0])  # <R_B, R_A> / (|R_B| |R_A|)
    estimated = [math.sqrt(mu / norms[h]) if mu > 0 else math.nan for h in (1, 0)]
    return {"reference_cosine_a": estimated[0], "reference_cosine_b": estimated[1], "references_cosine": cross}


def cost_columns(seconds: list[float], sampling: float, effective: list[float]) -> dict[str, list]:
    """seconds, cost_vs_sampling = seconds / the sample stage's seconds, pays = effective_batch - 1 >= cost
    (None where either is unknown)."""
    costs = [s / sampling if sampling > 0 else math.nan for s in seconds]
    pays = [None if math.isnan(c) or math.isnan(e) else bool(e - 1 >= c) for c, e in zip(costs, effective)]
    return {"seconds": seconds, "cost_vs_sampling": costs, "pays": pays}
