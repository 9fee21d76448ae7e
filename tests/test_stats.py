"""oarctl/report/stats.py: the t quantile against the tables, the t interval by hand, the exact
signed-rank p against every sign flip, Hodges-Lehmann by hand."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from oarctl.report.stats import hodges_lehmann, signed_rank_test, t_interval, t_quantile


def test_t_quantiles_match_the_tables_and_join_the_normal_limit():
    table = {1: 12.706, 4: 2.776, 10: 2.228, 30: 2.042, 120: 1.980}  # 0.975 quantiles, standard tables
    assert all(t_quantile(0.975, d) == pytest.approx(q, abs=5e-4) for d, q in table.items())
    assert t_quantile(0.95, 5) == pytest.approx(2.015, abs=5e-4)  # the 90% interval's quantile
    assert all(t_quantile(0.975, d) > t_quantile(0.975, d + 1) > 1.959964 for d in range(1, 200))


def test_the_t_interval_by_hand():
    # 1, 2, 3, 2: mean 2, sample std sqrt(2/3) = 0.8165, half-width 3.1824 x 0.8165 / sqrt(4) = 1.2992
    assert t_interval([1.0, 2.0, 3.0, 2.0]) == pytest.approx((2.0, 0.7008, 3.2992), abs=2e-4)
    # at 90% the quantile is 2.3534: half-width 0.9608
    assert t_interval(np.array([1.0, 2.0, 3.0, 2.0]), 0.90) == pytest.approx((2.0, 1.0392, 2.9608), abs=2e-4)


def _by_every_sign_flip(differences: list[float]) -> float:
    """The slow reference: p over all 2^n sign patterns of the ranks (zeros dropped, ties at mean ranks)."""
    nonzero = [d for d in differences if d != 0]
    magnitudes = sorted(abs(d) for d in nonzero)
    rank = {m: np.mean([i + 1 for i, x in enumerate(magnitudes) if x == m]) for m in magnitudes}
    ranks = [rank[abs(d)] for d in nonzero]
    observed, centre = sum(r for r, d in zip(ranks, nonzero) if d > 0), sum(ranks) / 2
    sums = [sum(r for r, sign in zip(ranks, signs) if sign) for signs in itertools.product([0, 1], repeat=len(ranks))]
    return sum(abs(s - centre) >= abs(observed - centre) - 1e-9 for s in sums) / len(sums)


def test_wilcoxon_signed_rank_and_hodges_lehmann_by_hand():
    # |d| ranks 2, 3, 4 positive, 1 negative: W+ = 9; of the 16 subsets of {1,2,3,4}, sums >= 9 ({2,3,4},
    # {1,2,3,4}) and <= 1 ({}, {1}) are 4: p = 0.25
    assert signed_rank_test(np.array([1.0, 2.0, 3.0, -0.5])) == (9.0, 0.25)
    assert signed_rank_test(np.array([0.0, 1.0, 2.0, 3.0, -0.5])) == (9.0, 0.25)  # the zero is dropped
    # ties: |d| 1, 1, 2, 2 take ranks 1.5, 1.5, 3.5, 3.5; W+ = 8.5, centre 5; sums at distance >= 3.5 from it:
    # 0 (1 way), 1.5 (2), 8.5 (2), 10 (1) of 16: p = 0.375
    assert signed_rank_test(np.array([1.0, -1.0, 2.0, 2.0])) == (8.5, 0.375)
    assert signed_rank_test(np.array([0.0, 0.0])) == (0.0, 1.0)
    # Walsh averages of 1, 2, 3, -0.5: 1, 2, 3, -0.5, 1.5, 2, 0.25, 2.5, 1.25, 1.25 -> median (1.25 + 1.5) / 2
    assert hodges_lehmann(np.array([1.0, 2.0, 3.0, -0.5])) == 1.375
    rng = np.random.default_rng(1)
    for _ in range(5):
        differences = rng.integers(-4, 6, size=11).astype(float)  # ties and zeros
        assert signed_rank_test(differences)[1] == pytest.approx(_by_every_sign_flip(list(differences)))


