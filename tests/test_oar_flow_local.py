"""oar_flow_local (links within a horizon, OAR-G's direct effect) against full forwards of each perturbed
sequence, and, with a horizon as long as the reasoning and OAR-P's direct effect, against oar_flow itself.

The model is test_oar_flow's: a random-init Qwen2 with a large initialiser range, in float64, so that
1e-6 is a statement about the batching (rows at their own positions over one clean cache, each masked
to its own prefix), not about float32 rounding.
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from oarctl.attribution import flow, flow_local, oar
from oarctl.attribution.base import Rollout

from tiny_models import float64_qwen2  # tests/tiny_models.py

VOCAB = 64
PAD = VOCAB - 1


@pytest.fixture(scope="module")
def model():
    return float64_qwen2(VOCAB, PAD)


def item(prompt: int = 5, reasoning: int = 14, seed: int = 0):
    ids = torch.randint(1, VOCAB - 1, (prompt + reasoning + 4,), generator=torch.Generator().manual_seed(seed))
    return ids, (prompt, prompt + reasoning), (prompt + reasoning + 1, prompt + reasoning + 4)


@torch.no_grad()
def naive_drops(model, ids, reasoning, horizon):
    """D[u, k] from a full forward of the sequence with token start + u padded, no cache, plain loops."""
    def log_probs(sequence):
        return torch.log_softmax(model(input_ids=sequence[None]).logits[0].double(), -1)

    clean = log_probs(ids)
    drops = np.full((reasoning[1] - reasoning[0], horizon), np.nan)
    for u, t in enumerate(range(*reasoning)):
        perturbed = ids.clone()
        perturbed[t] = PAD
        changed = log_probs(perturbed)
        for k in range(horizon):
            s = t + 1 + k
            if s < reasoning[1]:
                drops[u, k] = float(clean[s - 1, ids[s]] - changed[s - 1, ids[s]])
    return drops


@pytest.mark.parametrize("horizon", [1, 4, 40])
def test_local_drops_equal_full_forwards_of_each_perturbed_sequence(model, horizon):
    ids, reasoning, _ = item(seed=1)
    expected = naive_drops(model, ids, reasoning, horizon)
    assert np.nanmax(np.abs(expected)) > 1e-1  # perturbations move later tokens: 1e-6 means something
    for rows_per_call, budget in ((1, 0), (3, 0), (64, 0), (64, 40)):
        got = flow_local.local_drops(model, ids, reasoning, horizon, PAD, rows_per_call, budget)
        assert np.array_equal(np.isnan(got), np.isnan(expected))  # links past the reasoning are absent
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6)


def test_a_prompt_free_sequence_and_a_one_token_reasoning(model):
    ids, _, _ = item(seed=2)
    for reasoning in ((0, 9), (4, 5)):
        got = flow_local.local_drops(model, ids, reasoning, 4, PAD, 2)
        np.testing.assert_allclose(got, naive_drops(model, ids, reasoning, 4), rtol=0, atol=1e-6)


@pytest.mark.parametrize("mode", ["last", "answer_mean", "answer_joint"])
def test_a_whole_reasoning_horizon_with_oar_p_direct_effects_is_oar_flow(model, mode):
    """The two engines agree where they should: links over the whole reasoning + perturbation's A = oar_flow."""
    ids, reasoning, answer = item(seed=3)
    units = [(t, t + 1) for t in range(*reasoning)]
    direct = oar.perturbation_scores(model, ids, reasoning, answer, units, mode).numpy()
    drops = flow_local.local_drops(model, ids, reasoning, reasoning[1] - reasoning[0], PAD)
    for rule in flow.FLOW_RULES.names():
        expected = flow.flow_scores(model, ids, reasoning, answer, units, mode, rules=(rule,))[rule]
        np.testing.assert_allclose(flow_local.propagate(direct, drops, rule), expected, rtol=0, atol=1e-6)


def test_a_horizon_keeps_only_links_within_it(model):
    """Credit arrives through later tokens (not only directly), and only from within the horizon."""
    ids, reasoning, _ = item(seed=4)
    direct = np.zeros(reasoning[1] - reasoning[0])
    direct[-1] = 1.0  # only the last token touches the answer
    near = flow_local.propagate(direct, flow_local.local_drops(model, ids, reasoning, 1, PAD), "product")
    far = flow_local.propagate(direct, flow_local.local_drops(model, ids, reasoning, 40, PAD), "product")
    assert (far >= near - 1e-12).all() and (far > near + 1e-3).any()  # longer links only add paths
    assert near[-2] == pytest.approx(-np.expm1(-max(naive_drops(model, ids, reasoning, 1)[-2, 0], 0.0)))


def test_registry_entry_scores_the_reasoning_with_oar_g_direct_effects(model):
    from oarctl.attribution import ATTRIBUTION_METHODS
    from oarctl.attribution.rows import outcome_mode
    from oarctl.config import AttributeConfig

    ids, reasoning, answer = item(seed=5, reasoning=12)
    rollout = Rollout(SimpleNamespace(reasoning=(0, 12)), ids, reasoning, answer, response_length=16, row=0)
    context = SimpleNamespace(policy=SimpleNamespace(load=lambda: (model, SimpleNamespace(pad_token_id=PAD))),
                              seed=0, step=0, call_sync=None)
    config = AttributeConfig(method="oar_flow_local", flow_horizon=3, chunk_size=2)
    got = ATTRIBUTION_METHODS.get("oar_flow_local")([rollout], None, config, context)[0]
    direct = oar.oar_g_scores(model, [rollout], config, context)[0].double().numpy()
    expected = flow_local.propagate(direct, naive_drops(model, ids, reasoning, 3), "product")
    np.testing.assert_allclose(got[:12], expected, rtol=1e-6, atol=1e-7)  # float32 scores
    assert np.isnan(got[12:]).all()
    assert outcome_mode(config) == config.oar_g_mode  # the attributions' outcome_mode column names OAR-G's


def test_bad_knobs_are_refused(model):
    ids, reasoning, _ = item()
    with pytest.raises(ValueError, match="horizon"):
        flow_local.local_drops(model, ids, reasoning, 0, PAD)
