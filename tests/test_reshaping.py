"""Bi-Level reshaping: hand-computed cases, edge cases, invariants, and a slow loop reference."""
import math
import warnings

import numpy as np
import pytest

from oarctl.config import ReshapeConfig
from oarctl.reshaping import (batch_response_weights, bilevel_weights, carried_bilevel_weights,
                               response_weights)

E = math.e
# Scores s = e^k - 1 have log1p(s) = k exactly enough to reason about by hand.
SCORES_0_TO_4 = [0.0, E - 1, E**2 - 1, E**3 - 1, E**4 - 1]  # l = 0..4, n = 0, .25, .5, .75, 1


def test_hand_case_without_mass():
    # n = [0, .25, .5, .75, 1]; tau = quantile .25 at position (5 - 1) * .25 = 1 -> n[1] = .25
    # n=0    < tau: max(0 / .25, .1)         = .1
    # n=.25 >= tau: 1 + (.25 - .25) / .75    = 1
    # n=.5:         1 + .25 / .75            = 1.333333
    # n=.75:        1 + .5 / .75             = 1.666667
    # n=1:          1 + .75 / .75            = 2
    weights = bilevel_weights(SCORES_0_TO_4, preserve_mass=False)
    assert weights.dtype == np.float32
    np.testing.assert_allclose(weights, [0.1, 1.0, 1.333333, 1.666667, 2.0], atol=1e-5)


def test_hand_case_with_mass():
    # raw weights above sum to .1 + 1 + 4/3 + 5/3 + 2 = 6.1; scale 5 / 6.1 = 0.819672
    # -> [.0819672, .819672, 1.092896, 1.366120, 1.639344]
    weights = bilevel_weights(SCORES_0_TO_4)
    np.testing.assert_allclose(weights, [0.0819672, 0.819672, 1.092896, 1.366120, 1.639344], atol=1e-5)


def test_positions_are_kept():
    # the same five scores shuffled: each weight follows its score
    order = [3, 0, 4, 1, 2]
    weights = bilevel_weights([SCORES_0_TO_4[i] for i in order], preserve_mass=False)
    expected = np.array([0.1, 1.0, 1.333333, 1.666667, 2.0])[order]
    np.testing.assert_allclose(weights, expected, atol=1e-5)


def test_suppression_between_zero_and_tau():
    # quantile .5: tau = n[2] = .5
    # n=0: max(0, .1) = .1;  n=.25: .25 / .5 = .5;  n=.5: 1;  n=.75: 1 + .25 / .5 = 1.5;  n=1: 2
    weights = bilevel_weights(SCORES_0_TO_4, quantile=0.5, preserve_mass=False)
    np.testing.assert_allclose(weights, [0.1, 0.5, 1.0, 1.5, 2.0], atol=1e-5)


def test_beta_and_floor():
    # beta 2, floor .3 (tau = .25): n=0 -> .3; .25 -> 1; .5 -> 1 + 2 * .25 / .75 = 1.666667;
    # .75 -> 1 + 2 * .5 / .75 = 2.333333; 1 -> 3
    weights = bilevel_weights(SCORES_0_TO_4, beta=2.0, floor=0.3, preserve_mass=False)
    np.testing.assert_allclose(weights, [0.3, 1.0, 1.666667, 2.333333, 3.0], atol=1e-5)


def test_quantile_uses_linear_interpolation():
    # l = [0, 1, 2, 3] -> n = [0, 1/3, 2/3, 1]; position (4 - 1) * .25 = .75
    # linear: tau = 0 + .75 * 1/3 = .25 ("lower" would give 0, "nearest" 1/3)
    # n=0 -> .1; n=1/3 -> 1 + (1/3 - 1/4) / (3/4) = 1 + 1/9; n=2/3 -> 1 + (5/12) / (3/4) = 1 + 5/9; n=1 -> 2
    weights = bilevel_weights([0.0, E - 1, E**2 - 1, E**3 - 1], preserve_mass=False)
    np.testing.assert_allclose(weights, [0.1, 1 + 1 / 9, 1 + 5 / 9, 2.0], atol=1e-5)


def test_nan_inf_and_negative_scores():
    # nan -> 0, -3 -> 0, +inf -> largest finite score e^2 - 1: l = [0, 0, 1, 2, 2], n = [0, 0, .5, 1, 1]
    # tau = sorted n at position 1 = 0: nothing is below it (tau == 0 guard), boost 1 + n / 1
    # -> [1, 1, 1.5, 2, 2]; with mass: sum 7.5, scale 5 / 7.5 -> [2/3, 2/3, 1, 4/3, 4/3]
    scores = [float("nan"), -3.0, E - 1, float("inf"), E**2 - 1]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        raw = bilevel_weights(scores, preserve_mass=False)
        kept = bilevel_weights(scores)
    np.testing.assert_allclose(raw, [1.0, 1.0, 1.5, 2.0, 2.0], atol=1e-6)
    np.testing.assert_allclose(kept, [2 / 3, 2 / 3, 1.0, 4 / 3, 4 / 3], atol=1e-6)


def test_tau_equal_to_one_does_not_divide_by_zero():
    # n = [0, 1, 1, 1, 1]: tau = sorted n at position 1 = 1
    # n=0 -> max(0 / 1, .1) = .1; n=1 -> excess 0, boost exactly 1 (not 0 / 0)
    # with mass: sum 4.1, scale 5 / 4.1 = 1.219512 -> [.1219512, 1.219512 x4]
    scores = [0.0, E - 1, E - 1, E - 1, E - 1]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        raw = bilevel_weights(scores, preserve_mass=False)
        kept = bilevel_weights(scores)
    np.testing.assert_allclose(raw, [0.1, 1.0, 1.0, 1.0, 1.0], atol=1e-6)
    np.testing.assert_allclose(kept, [0.1219512, 1.219512, 1.219512, 1.219512, 1.219512], atol=1e-6)


@pytest.mark.parametrize(
    "scores",
    [
        [3.0, 3.0, 3.0],
        [-1.0, -5.0],  # both clamp to 0
        [float("nan")] * 4,
        [float("inf")] * 3,
        [float("nan"), float("inf")],  # no finite score to stand in for +inf
        [5.0],
        [float("nan")],
    ],
)
def test_degenerate_spans_give_all_ones(scores):
    weights = bilevel_weights(scores)
    assert weights.dtype == np.float32
    np.testing.assert_array_equal(weights, np.ones(len(scores)))


def test_empty_span():
    weights = bilevel_weights([])
    assert weights.shape == (0,) and weights.dtype == np.float32


@pytest.mark.parametrize(
    "arguments, word",
    [
        ({"quantile": 0.0}, "quantile"),
        ({"quantile": 1.0}, "quantile"),
        ({"quantile": float("nan")}, "quantile"),
        ({"beta": -0.5}, "beta"),
        ({"floor": -0.1}, "floor"),
        ({"floor": 1.1}, "floor"),
    ],
)
def test_invalid_arguments(arguments, word):
    with pytest.raises(ValueError, match=word):
        bilevel_weights([0.0, 1.0, 2.0], **arguments)


# --- slow reference: plain Python, written from docs/method.md ("Bi-Level reshaping") -------------------


def _reference_quantile(values, level):
    ordered = sorted(values)
    position = (len(ordered) - 1) * level
    below = math.floor(position)
    above = min(below + 1, len(ordered) - 1)
    fraction = position - below
    return ordered[below] + (ordered[above] - ordered[below]) * fraction


def _reference_weights(scores, quantile, beta, floor, preserve_mass):
    finite = [s for s in scores if math.isfinite(s)]
    largest = max(finite) if finite else None
    cleaned = []
    for s in scores:
        if math.isnan(s):
            s = 0.0
        elif s == math.inf:
            if largest is None:
                return [1.0] * len(scores)
            s = largest
        cleaned.append(max(s, 0.0))
    logged = [math.log1p(s) for s in cleaned]
    low, high = min(logged), max(logged)
    if high == low:
        return [1.0] * len(scores)
    normalized = [(value - low) / (high - low) for value in logged]
    return _reference_cut(normalized, _reference_quantile(normalized, quantile), beta, floor, preserve_mass)


def _reference_cut(normalized, tau, beta, floor, preserve_mass):
    weights = []
    for n in normalized:
        if n < tau:
            weights.append(max(n / tau, floor))
        elif tau == 1.0:
            weights.append(1.0)
        else:
            weights.append(1.0 + beta * (n - tau) / (1.0 - tau))
    if preserve_mass:
        total = sum(weights)
        weights = [w * len(weights) / total for w in weights]
    return weights


def _random_cases(count, seed=1234):
    rng = np.random.default_rng(seed)
    specials = [float("nan"), float("inf"), -float("inf"), -2.0, 0.0]
    for _ in range(count):
        length = int(rng.integers(1, 40))
        scores = rng.lognormal(mean=-2.0, sigma=2.0, size=length)
        if rng.random() < 0.5:
            # a few special values, and sometimes ties
            for index in rng.integers(0, length, size=int(rng.integers(0, 4))):
                scores[index] = specials[int(rng.integers(0, len(specials)))]
        if rng.random() < 0.2:
            scores = np.round(scores, 1)
        yield (
            scores,
            float(rng.uniform(0.05, 0.95)),
            float(rng.uniform(0.0, 3.0)),
            float(rng.uniform(0.0, 1.0)),
            bool(rng.random() < 0.5),
        )


def test_matches_slow_reference_on_random_inputs():
    for scores, quantile, beta, floor, preserve_mass in _random_cases(300):
        fast = bilevel_weights(scores, quantile=quantile, beta=beta, floor=floor, preserve_mass=preserve_mass)
        slow = _reference_weights(list(scores), quantile, beta, floor, preserve_mass)
        np.testing.assert_allclose(fast, slow, rtol=1e-5, atol=1e-6, err_msg=f"scores={scores.tolist()}")


def test_invariants_on_random_inputs():
    for scores, quantile, beta, floor, _ in _random_cases(300, seed=99):
        kept = bilevel_weights(scores, quantile=quantile, beta=beta, floor=floor, preserve_mass=True)
        raw = bilevel_weights(scores, quantile=quantile, beta=beta, floor=floor, preserve_mass=False)
        assert kept.shape == raw.shape == scores.shape
        # mass preserved: sum w == R
        assert kept.sum(dtype=np.float64) == pytest.approx(len(scores), rel=1e-5)
        # floor respected before the rescale
        assert raw.min() >= np.float32(floor) - 1e-6
        # order preserved: a higher (cleaned) score never gets a lower weight
        cleaned = np.nan_to_num(scores, nan=0.0, posinf=np.inf, neginf=0.0).clip(min=0.0)
        finite = cleaned[np.isfinite(cleaned)]
        cleaned = np.where(np.isinf(cleaned), finite.max() if finite.size else 0.0, cleaned)
        order = np.argsort(cleaned, kind="stable")
        for weights in (kept, raw):
            assert np.all(np.diff(weights[order]) >= -1e-6)


# --- reshape.quantile_carry: the released code's batch loop ----------------------------------------


def _released_loop_reference(batch, quantile, beta, floor, preserve_mass):
    """The released code's loop over a batch, plain Python, from docs/method.md: the variable holding
    the quantile level is overwritten by each span's tau. With oarctl's cleaning and without the
    released epsilons; an all-equal span normalises to zeros (the released min-max divides by 1
    then); a span not scored (all NaN) or empty is skipped."""
    level, result = quantile, []
    for scores in batch:
        if not scores or all(math.isnan(s) for s in scores):
            result.append([1.0] * len(scores))
            continue
        logged = [math.log1p(0.0 if math.isnan(s) else max(s, 0.0)) for s in scores]
        low, high = min(logged), max(logged)
        spread = high - low if high > low else 1.0
        normalized = [(value - low) / spread for value in logged]
        tau = _reference_quantile(normalized, level)
        result.append(_reference_cut(normalized, tau, beta, floor, preserve_mass))
        level = tau
    return result


def _random_span(rng):
    length = int(rng.integers(0, 30))
    kind = rng.random()
    if kind < 0.08:
        return [float("nan")] * length  # a row not scored (skip_uniform_groups)
    if kind < 0.16:
        return [0.5] * length  # no ranking: all ones, and the level becomes 0
    # heavy-tailed like OAR-P KLs: most scores tiny, a few large, so the carried level collapses
    scores = np.exp(rng.normal(-14.0, 4.0, size=length))
    for index in rng.integers(0, max(length, 1), size=int(rng.integers(0, 3)) if length else 0):
        scores[index] = [float("nan"), -1.0, 0.0][int(rng.integers(0, 3))]
    return scores.tolist()


@pytest.mark.parametrize("seed", range(6))
def test_carried_weights_match_the_released_loop(seed):
    rng = np.random.default_rng(seed)
    for _ in range(10):
        batch = [_random_span(rng) for _ in range(int(rng.integers(1, 24)))]
        knobs = (float(rng.uniform(0.05, 0.95)), float(rng.uniform(0.0, 3.0)), float(rng.uniform(0.0, 1.0)),
                 bool(rng.random() < 0.7))
        fast = carried_bilevel_weights(batch, *knobs)
        slow = _released_loop_reference(batch, *knobs)
        assert len(fast) == len(slow)
        for index, (got, expected) in enumerate(zip(fast, slow)):
            np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6, err_msg=f"span {index} of {batch}")


def _span(*logs):
    return [math.expm1(value) for value in logs]  # log1p gives the values back


def test_carried_level_by_hand():
    # span 1: n = [0, .25, 1], q = .25 at position .5 -> tau = .125 (what the paper's text uses too)
    # span 2: n = [0, .25, .5, .75, 1] at level .125, position .5 -> tau = .125, not the paper's .25
    # span 3: not scored (all NaN): all ones, the level stays .125
    # span 4: all equal: all ones, tau = 0 carried; span 5 at level 0: tau = 0, nothing suppressed
    batch = [_span(0, 1, 4), _span(0, 1, 2, 3, 4), [math.nan] * 3, [2.0, 2.0], _span(0, 1, 2, 3, 4)]
    weights = carried_bilevel_weights(batch, quantile=0.25, beta=1.0, floor=0.1, preserve_mass=False)
    np.testing.assert_allclose(weights[0], bilevel_weights(batch[0], preserve_mass=False))
    np.testing.assert_allclose(weights[1], [0.1, 1 + 0.125 / 0.875, 1 + 0.375 / 0.875, 1 + 0.625 / 0.875, 2.0],
                               rtol=1e-6)
    assert bilevel_weights(batch[1], preserve_mass=False)[1] == pytest.approx(1.0)  # q = .25: tau = .25
    np.testing.assert_array_equal(weights[2], [1.0, 1.0, 1.0])
    np.testing.assert_array_equal(weights[3], [1.0, 1.0])
    np.testing.assert_allclose(weights[4], [1.0, 1.25, 1.5, 1.75, 2.0], rtol=1e-6)


def test_batch_weights_carry_only_when_asked():
    rng = np.random.default_rng(5)
    rows = []
    for _ in range(6):
        scores = np.exp(rng.normal(-14.0, 4.0, size=20)).astype(np.float32)
        scores[:3] = np.nan  # prompt-side positions outside the reasoning
        rows.append((scores.tolist(), (3, 17)))
    plain = batch_response_weights(rows, ReshapeConfig())
    for (scores, reasoning), weights in zip(rows, plain):
        np.testing.assert_array_equal(weights, response_weights(scores, reasoning, ReshapeConfig()))
    carried = batch_response_weights(rows, ReshapeConfig(quantile_carry=True))
    spans = [np.asarray(scores[3:17], dtype=np.float32) for scores, _ in rows]
    for weights, expected in zip(carried, carried_bilevel_weights(spans)):
        np.testing.assert_array_equal(weights[3:17], expected)
        assert np.all(weights[:3] == 1.0) and np.all(weights[17:] == 1.0)
    np.testing.assert_array_equal(carried[0], plain[0])  # the first row uses q itself
    assert any(not np.array_equal(a, b) for a, b in zip(carried[1:], plain[1:]))
