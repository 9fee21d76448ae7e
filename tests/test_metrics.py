"""metrics: unbiased pass@k against hand values and brute force; group_metrics."""
from __future__ import annotations

from itertools import combinations
from math import comb

import pytest

from oarctl.metrics import group_metrics, pass_at_k


def brute_force_pass_at_k(n: int, c: int, k: int) -> float:
    """Fraction of the k-subsets of n samples (c correct) that contain a correct one."""
    samples = [1] * c + [0] * (n - c)
    subsets = list(combinations(range(n), k))
    return sum(any(samples[i] for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n, c, k, expected", [
    (4, 1, 2, 1 - comb(3, 2) / comb(4, 2)),  # 1 - 3/6 = 0.5
    (4, 1, 2, 0.5),
    (4, 0, 1, 0.0),
    (4, 0, 4, 0.0),
    (4, 4, 1, 1.0),
    (4, 2, 1, 0.5),
    (5, 2, 3, 0.9),                          # 1 - C(3,3)/C(5,3) = 1 - 1/10
    (4, 3, 2, 1.0),                          # n - c < k: every pair has a correct one
    (10, 1, 10, 1.0),
])
def test_pass_at_k_hand_values(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected)


@pytest.mark.parametrize("n", [1, 2, 4, 6])
def test_pass_at_k_matches_brute_force(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(brute_force_pass_at_k(n, c, k)), (n, c, k)
        assert pass_at_k(n, c, 1) == pytest.approx(c / n)


def test_group_metrics_hand_values():
    metrics = group_metrics({"a": [1.0, 0.0, 0.0, 0.0], "b": [1.0, 1.0, 0.0, 0.0]}, [1, 2, 4])
    assert set(metrics) == {"avg@4", "pass@1", "pass@2", "pass@4"}
    assert metrics["avg@4"] == pytest.approx((0.25 + 0.5) / 2)
    assert metrics["pass@1"] == pytest.approx(metrics["avg@4"])
    assert metrics["pass@2"] == pytest.approx((0.5 + (1 - 1 / 6)) / 2)
    assert metrics["pass@4"] == pytest.approx(1.0)
    assert all(type(v) is float for v in metrics.values())


def test_group_metrics_counts_rewards_above_one_half_as_correct():
    metrics = group_metrics({"a": [0.9, 0.2], "b": [0.5, 0.0]}, [1, 2])
    assert metrics["avg@2"] == pytest.approx(0.25)
    assert metrics["pass@2"] == pytest.approx(0.5)


def test_group_metrics_all_wrong_and_all_right():
    assert group_metrics({"a": [0.0] * 3, "b": [0.0] * 3}, [1, 3]) == {"avg@3": 0.0, "pass@1": 0.0, "pass@3": 0.0}
    assert group_metrics({"a": [1.0] * 3}, [1, 3]) == {"avg@3": 1.0, "pass@1": 1.0, "pass@3": 1.0}
