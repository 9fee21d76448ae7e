"""Losses: k3 KL, aggregation modes on a hand-computed 2x3 case, clipping and its gradient, entropy."""
import math

import pytest
import torch

from oarctl.errors import OarError
from oarctl.losses import LOSS_AGGREGATIONS, entropy_from_logits, k3_kl, policy_loss

LN2 = math.log(2.0)


def test_k3_zero_when_equal_and_hand_values():
    logprobs = torch.tensor([[-1.3, -0.2, -4.0]])
    assert torch.equal(k3_kl(logprobs, logprobs.clone()), torch.zeros(1, 3))
    # ref - logp = ln 2:  2 - ln 2 - 1 = 0.306853
    # ref - logp = -ln 2: 0.5 + ln 2 - 1 = 0.193147
    kl = k3_kl(torch.zeros(1, 2), torch.tensor([[LN2, -LN2]]))
    torch.testing.assert_close(kl, torch.tensor([[0.306853, 0.193147]]), atol=1e-6, rtol=0)


# token_loss 2x3 with mask [[1, 1, 0], [1, 0, 0]]; masked entries are 100 so any leak is obvious.
TOKEN_LOSS = torch.tensor([[1.0, 2.0, 100.0], [4.0, 100.0, 100.0]])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])


@pytest.mark.parametrize(
    "name, expected",
    [
        # row means (1 + 2) / 2 = 1.5 and 4 / 1 = 4 -> mean 2.75
        ("seq-mean-token-mean", 2.75),
        # (1 + 2 + 4) / 3 valid tokens = 2.333333
        ("token-mean", 7.0 / 3.0),
        # row sums 3 and 4, / max_length 4 -> 0.75 and 1.0 -> mean 0.875
        ("seq-mean-token-sum-norm", 0.875),
    ],
)
def test_aggregation_hand_case(name, expected):
    aggregate = LOSS_AGGREGATIONS.get(name)
    assert aggregate(TOKEN_LOSS, MASK, max_length=4).item() == pytest.approx(expected, abs=1e-6)
    # a bool mask means the same
    assert aggregate(TOKEN_LOSS, MASK.bool(), max_length=4).item() == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize(
    "name, expected",
    [
        # the empty second row is left out: 1.5 (verl would give NaN)
        ("seq-mean-token-mean", 1.5),
        # (1 + 2) / 2 = 1.5
        ("token-mean", 1.5),
        # row sums 3 and 0, / 4 -> 0.75 and 0 -> mean over both rows 0.375
        ("seq-mean-token-sum-norm", 0.375),
    ],
)
def test_aggregation_with_an_empty_row(name, expected):
    mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    value = LOSS_AGGREGATIONS.get(name)(TOKEN_LOSS, mask, max_length=4)
    assert value.item() == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("name", ["seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm"])
def test_aggregation_all_masked_is_zero_with_finite_gradient(name):
    token_loss = TOKEN_LOSS.clone().requires_grad_(True)
    value = LOSS_AGGREGATIONS.get(name)(token_loss, torch.zeros(2, 3), max_length=4)
    value.backward()
    assert value.item() == 0.0
    assert torch.equal(token_loss.grad, torch.zeros(2, 3))


def test_aggregation_gradients_by_hand():
    # seq-mean-token-mean: d/dx = mask / (row count * number of rows) = [[1/4, 1/4, 0], [1/2, 0, 0]]
    # token-mean: mask / 3;  seq-mean-token-sum-norm: mask / (max_length 4 * 2 rows) = mask / 8
    expected = {
        "seq-mean-token-mean": torch.tensor([[0.25, 0.25, 0.0], [0.5, 0.0, 0.0]]),
        "token-mean": MASK / 3.0,
        "seq-mean-token-sum-norm": MASK / 8.0,
    }
    for name, gradient in expected.items():
        token_loss = TOKEN_LOSS.clone().requires_grad_(True)
        LOSS_AGGREGATIONS.get(name)(token_loss, MASK, max_length=4).backward()
        torch.testing.assert_close(token_loss.grad, gradient)


def test_aggregation_registry_lists_names():
    assert LOSS_AGGREGATIONS.names() == ["seq-mean-token-mean", "seq-mean-token-sum-norm", "token-mean"]
    with pytest.raises(OarError) as error:
        LOSS_AGGREGATIONS.get("seq-sum")
    for name in LOSS_AGGREGATIONS.names():
        assert name in str(error.value)


def _clip_case():
    # four tokens, clip 0.2 / 0.2, old logprobs 0, token-mean aggregation:
    #   A=+1, ratio 1.5: min(1.5, 1.2) = 1.2 -> loss -1.2, clipped, gradient 0
    #   A=-1, ratio 0.5: min(-0.5, -0.8) = -0.8 -> loss 0.8, clipped, gradient 0
    #   A=+1, ratio 0.5: min(0.5, 0.8) = 0.5 -> loss -0.5, not clipped, d/dlogp = -A * ratio = -0.5
    #   A=-1, ratio 1.5: min(-1.5, -1.2) = -1.5 -> loss 1.5, not clipped, d/dlogp = 1.5
    # loss = (-1.2 + 0.8 - 0.5 + 1.5) / 4 = 0.15; gradients / 4 -> [0, 0, -0.125, 0.375]
    ratios = torch.tensor([[1.5, 0.5, 0.5, 1.5]])
    logprobs = torch.log(ratios).requires_grad_(True)
    advantages = torch.tensor([[1.0, -1.0, 1.0, -1.0]])
    return logprobs, torch.zeros(1, 4), advantages, torch.ones(1, 4)


def test_clipping_value_gradient_and_metrics():
    logprobs, old_logprobs, advantages, mask = _clip_case()
    loss, metrics = policy_loss(logprobs, old_logprobs, advantages, mask, aggregation="token-mean", max_length=4)
    loss.backward()
    assert loss.item() == pytest.approx(0.15, abs=1e-6)
    torch.testing.assert_close(logprobs.grad, torch.tensor([[0.0, 0.0, -0.125, 0.375]]))
    assert metrics["clip_fraction"] == pytest.approx(0.5)  # 2 of 4 tokens clipped
    assert metrics["ratio_mean"] == pytest.approx(1.0)  # (1.5 + 0.5 + 0.5 + 1.5) / 4
    assert metrics["pg_loss"] == pytest.approx(0.15, abs=1e-6)
    assert metrics["loss"] == pytest.approx(0.15, abs=1e-6)
    assert metrics["kl"] == 0.0
    assert all(isinstance(value, float) for value in metrics.values())
    assert set(metrics) == {"loss", "pg_loss", "clip_fraction", "kl", "ratio_mean"}


def test_clip_high_is_separate_from_clip_low():
    # A=+1, ratio 1.25: clip_high 0.28 -> not clipped, loss -1.25; clip_high 0.2 -> clipped, loss -1.2
    logprobs = torch.log(torch.tensor([[1.25]]))
    arguments = (logprobs, torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1))
    wide, wide_metrics = policy_loss(*arguments, clip_low=0.2, clip_high=0.28, max_length=1)
    narrow, narrow_metrics = policy_loss(*arguments, clip_low=0.2, clip_high=0.2, max_length=1)
    assert wide.item() == pytest.approx(-1.25, abs=1e-6) and wide_metrics["clip_fraction"] == 0.0
    assert narrow.item() == pytest.approx(-1.2, abs=1e-6) and narrow_metrics["clip_fraction"] == 1.0


def test_policy_loss_respects_mask_and_aggregation():
    # ratio 1 everywhere -> token loss = -A; A rows +1 and -2, mask [[1, 1, 0], [1, 0, 0]]
    # seq-mean-token-mean: rows -1 and 2 -> 0.5;  token-mean: (-1 - 1 + 2) / 3 = 0
    # seq-mean-token-sum-norm (max_length 4): rows -2 / 4 and 2 / 4 -> mean 0
    zeros = torch.zeros(2, 3)
    advantages = torch.tensor([[1.0, 1.0, 1.0], [-2.0, -2.0, -2.0]])
    expected = {"seq-mean-token-mean": 0.5, "token-mean": 0.0, "seq-mean-token-sum-norm": 0.0}
    for name, value in expected.items():
        loss, _ = policy_loss(zeros, zeros, advantages, MASK, aggregation=name, max_length=4)
        assert loss.item() == pytest.approx(value, abs=1e-6)


def test_kl_term_is_added_per_token():
    # A = 0 so the surrogate is 0; ref - logp = ln 2 -> k3 = 0.306853 on every token
    # kl_coef 0.5 -> loss 0.5 * 0.306853 = 0.153426 (token-mean); pg_loss stays 0
    zeros = torch.zeros(1, 3)
    reference = torch.full((1, 3), LN2)
    loss, metrics = policy_loss(
        zeros, zeros, zeros, torch.ones(1, 3),
        aggregation="token-mean", max_length=3, ref_logprobs=reference, kl_coef=0.5,
    )
    assert loss.item() == pytest.approx(0.153426, abs=1e-6)
    assert metrics["pg_loss"] == 0.0
    assert metrics["kl"] == pytest.approx(0.306853, abs=1e-6)
    # with kl_coef 0 the reference is only logged
    loss, metrics = policy_loss(zeros, zeros, zeros, torch.ones(1, 3), max_length=3, ref_logprobs=reference)
    assert loss.item() == 0.0 and metrics["kl"] == pytest.approx(0.306853, abs=1e-6)


def test_policy_loss_rejects_unknown_aggregation_and_bad_shapes():
    zeros = torch.zeros(2, 3)
    with pytest.raises(OarError, match="token-mean"):
        policy_loss(zeros, zeros, zeros, zeros, aggregation="sum", max_length=3)
    with pytest.raises(ValueError):
        policy_loss(zeros, zeros, torch.zeros(2, 1), zeros, max_length=3)


def test_entropy_from_logits():
    # uniform over 4 -> ln 4 = 1.386294
    # probabilities [.25, .75] -> -(.25 ln .25 + .75 ln .75) = .346574 + .215762 = .562335
    # logits [1000, 1000] -> ln 2 = .693147 (a naive softmax overflows)
    # logits [0, -inf] -> one certain token -> 0, not NaN
    logits = torch.tensor(
        [
            [[0.0, 0.0, 0.0, 0.0], [0.0, math.log(3.0), -float("inf"), -float("inf")]],
            [[1000.0, 1000.0, -float("inf"), -float("inf")], [0.0, -float("inf"), -float("inf"), -float("inf")]],
        ]
    )  # (B=2, T=2, V=4)
    entropy = entropy_from_logits(logits)
    assert entropy.shape == (2, 2)
    torch.testing.assert_close(entropy, torch.tensor([[1.386294, 0.562335], [0.693147, 0.0]]), atol=1e-5, rtol=0)


def test_entropy_gradient_is_finite_with_banned_tokens():
    logits = torch.tensor([[[0.5, -float("inf"), 1.0]]], requires_grad=True)
    entropy_from_logits(logits).sum().backward()
    assert torch.isfinite(logits.grad).all()
