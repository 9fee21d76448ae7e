"""The public functions `oarctl.attribution.oar_flow` and `oar_flow_local` (for users of other trainers)
give what their registry entries compute on the same row, with the same knobs.

The model is test_oar_flow's: a random-init Qwen2 with a large initialiser range, in float64, so scores
differ across tokens by much more than the tolerance.
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

import oarctl.attribution as attribution
from oarctl.attribution import ATTRIBUTION_METHODS
from oarctl.attribution.base import Rollout, row_seed
from oarctl.config import AttributeConfig

from tiny_models import float64_qwen2  # tests/tiny_models.py

VOCAB = 64
PAD = VOCAB - 1


@pytest.fixture(scope="module")
def model():
    return float64_qwen2(VOCAB, PAD)


def one_row(model, prompt: int = 5, reasoning: int = 12, seed: int = 7):
    """(the row as the registry sees it, its context): a reasoning of `reasoning` tokens after a prompt."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB - 1, (prompt + reasoning + 4,), generator=generator)
    spans = (prompt, prompt + reasoning), (prompt + reasoning + 1, prompt + reasoning + 4)
    rollout = Rollout(SimpleNamespace(reasoning=(0, reasoning)), ids, *spans, response_length=reasoning + 4, row=3)
    context = SimpleNamespace(policy=SimpleNamespace(load=lambda: (model, SimpleNamespace(pad_token_id=PAD))),
                              seed=11, step=2, call_sync=None)
    return rollout, context


def registry_scores(name: str, rollout, context, config) -> np.ndarray:
    scores = ATTRIBUTION_METHODS.get(name)([rollout], None, config, context)[0]
    return scores[:rollout.reasoning[1] - rollout.reasoning[0]]


@pytest.mark.parametrize("mode, rule", [("last", "product"), ("answer_joint", "widest")])
def test_oar_flow_equals_its_registry_entry(model, mode, rule):
    rollout, context = one_row(model)
    config = AttributeConfig(method="oar_flow", oar_p_mode=mode, flow_rule=rule, chunk_size=3)
    got = attribution.oar_flow(model, rollout.input_ids, rollout.reasoning, rollout.answer, mode=mode, rule=rule,
                               chunk_size=3)
    expected = registry_scores("oar_flow", rollout, context, config)
    assert got.dtype == torch.float32 and got.shape == expected.shape
    assert np.ptp(expected) > 1e-2  # the scores differ across tokens: equality below is about each token
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("mode, horizon", [("answer_mean", 3), ("last", 16)])
def test_oar_flow_local_equals_its_registry_entry(model, mode, horizon):
    rollout, context = one_row(model)
    config = AttributeConfig(method="oar_flow_local", oar_g_mode=mode, flow_horizon=horizon, chunk_size=2)
    seed = row_seed(context.seed, context.step, rollout.row)  # the registry's noise seed of this row
    got = attribution.oar_flow_local(model, rollout.input_ids, rollout.reasoning, rollout.answer, mode=mode,
                                     seed=seed, horizon=horizon, chunk_size=2)
    expected = registry_scores("oar_flow_local", rollout, context, config)
    assert got.dtype == torch.float32 and got.shape == expected.shape
    scale = float(np.abs(expected).max())
    assert np.ptp(expected) > 0.5 * scale > 0  # the scores differ across tokens: equality is about each token
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-5, atol=1e-6 * scale)
    other_seed = attribution.oar_flow_local(model, rollout.input_ids, rollout.reasoning, rollout.answer, mode=mode,
                                            seed=seed + 1, horizon=horizon, chunk_size=2)
    assert not torch.equal(other_seed, got)  # the seed reaches OAR-G's noise: matching it above meant something
