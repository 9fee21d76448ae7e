"""Advantage estimators: hand-computed cases, group handling, scale modes, registry errors."""
import numpy as np
import pytest

from oarctl.advantages import ADVANTAGE_ESTIMATORS, grpo, rloo, token_advantages
from oarctl.errors import OarError
from oarctl.reshaping import bilevel_weights

EPS = 1e-6


def test_grpo_one_group_uses_unbiased_std():
    # rewards [1, 0, 0, 1]: mean 0.5, deviations +-0.5, sum of squares 1.0,
    # ddof=1 variance 1/3, std 0.57735 -> A = +-0.5 / 0.57735 = +-0.866025
    # (the population std would be 0.5 and give +-1.0, so this pins ddof=1)
    advantages = grpo(np.array([1.0, 0.0, 0.0, 1.0]), np.array([0, 0, 0, 0]), scale="group", eps=EPS)
    assert advantages.dtype == np.float32
    np.testing.assert_allclose(advantages, [0.866025, -0.866025, -0.866025, 0.866025], atol=1e-5)


def test_grpo_groups_are_found_by_id_not_position():
    # group 0 at positions 0, 2, 3, 5 with rewards 1, 0, 0, 0: mean 0.25, deviations 0.75, -0.25 x3,
    #   sum of squares 0.5625 + 3 * 0.0625 = 0.75, ddof=1 variance 0.25, std 0.5
    #   -> A = 1.5, -0.5, -0.5, -0.5
    # group 1 at positions 1, 4 with rewards 1, 1: std 0 -> A = 0 / (0 + eps) = 0
    rewards = np.array([1.0, 1.0, 0.0, 0.0, 1.0, 0.0])
    group_ids = np.array([0, 1, 0, 0, 1, 0])
    advantages = grpo(rewards, group_ids, scale="group", eps=EPS)
    np.testing.assert_allclose(advantages, [1.5, 0.0, -0.5, -0.5, 0.0, -0.5], atol=1e-5)


def test_grpo_singleton_group_gets_mean_zero_std_one_like_verl():
    # group 0: rewards 1, 0 -> mean 0.5, ddof=1 variance (0.25 + 0.25) / 1 = 0.5, std 0.707107
    #   -> A = +-0.5 / 0.707107 = +-0.707107
    # group 5 (alone): mean 0, std 1 -> A = 1 / (1 + 1e-6) ~= 1.0
    advantages = grpo(np.array([1.0, 0.0, 1.0]), np.array([0, 0, 5]), scale="group", eps=EPS)
    np.testing.assert_allclose(advantages, [0.707107, -0.707107, 1.0], atol=1e-5)


def test_grpo_scale_none_is_dr_grpo():
    # rewards [1, 0, 0, 0]: mean 0.25 -> A = r - 0.25, no division
    advantages = grpo(np.array([1.0, 0.0, 0.0, 0.0]), np.zeros(4, dtype=int), scale="none", eps=EPS)
    np.testing.assert_allclose(advantages, [0.75, -0.25, -0.25, -0.25], atol=1e-7)


def test_grpo_scale_batch_divides_by_std_of_all_rewards():
    # rewards [1, 0, 0, 0 | 1, 1]: batch mean 0.5, every deviation +-0.5, sum of squares 1.5,
    #   ddof=1 variance 1.5 / 5 = 0.3, std 0.547723
    # group means 0.25 and 1 -> centered 0.75, -0.25 x3, 0, 0
    #   -> 0.75 / 0.547723 = 1.369306, -0.25 / 0.547723 = -0.456435
    rewards = np.array([1.0, 0.0, 0.0, 0.0, 1.0, 1.0])
    group_ids = np.array([0, 0, 0, 0, 1, 1])
    advantages = grpo(rewards, group_ids, scale="batch", eps=EPS)
    expected = [1.369306, -0.456435, -0.456435, -0.456435, 0.0, 0.0]
    np.testing.assert_allclose(advantages, expected, atol=1e-5)


def test_rloo_leave_one_out_baseline():
    # group [1, 0, 0, 1]: A_0 = 1 - (0 + 0 + 1) / 3 = 2/3, A_1 = 0 - (1 + 0 + 1) / 3 = -2/3
    # group [1, 0, 0, 0] (ids 7): A_0 = 1 - 0 = 1, A_1 = 0 - 1/3 = -1/3
    # group of one (id 9): no other member -> 0
    rewards = np.array([1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0])
    group_ids = np.array([3, 3, 3, 3, 7, 7, 7, 7, 9])
    advantages = rloo(rewards, group_ids, scale="group", eps=EPS)
    third = 1.0 / 3.0
    expected = [2 * third, -2 * third, -2 * third, 2 * third, 1.0, -third, -third, -third, 0.0]
    np.testing.assert_allclose(advantages, expected, atol=1e-6)


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_rloo_ignores_valid_scale(scale):
    # rewards [2, 0, 1]: A_0 = 2 - 0.5 = 1.5, A_1 = 0 - 1.5 = -1.5, A_2 = 1 - 1 = 0
    advantages = rloo(np.array([2.0, 0.0, 1.0]), np.array([0, 0, 0]), scale=scale, eps=EPS)
    np.testing.assert_allclose(advantages, [1.5, -1.5, 0.0], atol=1e-6)


@pytest.mark.parametrize("name", ["grpo", "rloo"])
def test_invalid_scale_names_the_option_and_the_choices(name):
    estimator = ADVANTAGE_ESTIMATORS.get(name)
    with pytest.raises(OarError) as error:
        estimator(np.array([1.0, 0.0]), np.array([0, 0]), scale="prompt", eps=EPS)
    message = str(error.value)
    for word in ("reshape.scale", "group", "batch", "none", "prompt"):
        assert word in message


def test_registry_lists_names_and_rejects_unknown():
    assert ADVANTAGE_ESTIMATORS.names() == ["grpo", "rloo"]
    with pytest.raises(OarError) as error:
        ADVANTAGE_ESTIMATORS.get("ppo")
    assert "grpo" in str(error.value) and "rloo" in str(error.value) and "ppo" in str(error.value)


def test_mismatched_lengths_are_rejected():
    with pytest.raises(ValueError):
        grpo(np.array([1.0, 0.0, 1.0]), np.array([0, 0]), scale="group", eps=EPS)


def test_token_advantages_hand_case():
    # A = 2.0, weights [0.5, 1.5, 1.0] -> [1.0, 3.0, 2.0]; weights sum 3 -> tokens sum 6 = 2 * 3
    tokens = token_advantages(2.0, np.array([0.5, 1.5, 1.0]))
    assert tokens.dtype == np.float32
    np.testing.assert_allclose(tokens, [1.0, 3.0, 2.0])
    assert tokens.sum() == pytest.approx(6.0)


def test_token_advantages_sum_to_sequence_total_with_mass_preserving_weights():
    # With sum(w) == len, sum_t A * w_t == A * len: the GRPO total of the sequence is unchanged.
    rng = np.random.default_rng(0)
    for length in (1, 2, 7, 31):
        weights = bilevel_weights(rng.exponential(size=length), preserve_mass=True)
        for advantage in (-0.866025, 1.5):
            total = token_advantages(advantage, weights).sum(dtype=np.float64)
            assert total == pytest.approx(advantage * length, rel=1e-5)
