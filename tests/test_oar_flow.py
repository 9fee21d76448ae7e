"""oar_flow (propagated OAR-P) against a naive reference that shares none of its shortcuts.

The reference perturbs each unit in a full sequence, runs the whole model with no cache, takes every
log-probability from the full logits, and walks the widest path with plain Python loops. The model
is a random-init Qwen2 with a large initialiser range (perturbations move later tokens by 1e-2..1),
run in float64 so that 1e-6 is a statement about the algorithm, not about float32 rounding.
"""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from oarctl.attribution import flow
from oarctl.attribution import oar
from oarctl.attribution.base import Rollout

from tiny_models import float64_qwen2  # tests/tiny_models.py

MODES = ["last", "answer_mean", "answer_joint"]
VOCAB = 64


@pytest.fixture(scope="module")
def model():
    return float64_qwen2(VOCAB, VOCAB - 1)


def item(prompt: int = 5, reasoning: int = 14, seed: int = 0):
    ids = torch.randint(1, VOCAB - 1, (prompt + reasoning + 4,), generator=torch.Generator().manual_seed(seed))
    return ids, (prompt, prompt + reasoning), (prompt + reasoning + 1, prompt + reasoning + 4)


def reference_outcome(logits, ids, answer, mode):
    start, end = answer
    if mode == "last":
        return torch.log_softmax(logits[start - 1], -1)
    if mode == "answer_mean":
        return torch.log_softmax(logits[start - 1:end - 1].mean(0), -1)
    log_probs = torch.log_softmax(logits[start - 1:end - 1], -1)
    return sum(log_probs[k, ids[start + k]] for k in range(end - start)) / (end - start)


def reference_importance(clean, changed, mode):
    if mode == "answer_joint":
        return float(clean - changed)
    return float((clean.exp() * (clean - changed)).sum())


@torch.no_grad()
def naive_flow(model, ids, answer, units, mode, rule="product", pad=VOCAB - 1):
    """A_u and D[u][v] from full forwards of each perturbed sequence, then the best path in plain Python."""
    def forward(sequence):
        logits = model(input_ids=sequence[None]).logits[0].double()
        return logits, torch.log_softmax(logits, -1)

    clean_logits, clean_log_probs = forward(ids)
    clean = reference_outcome(clean_logits, ids, answer, mode)
    direct, links = [], []
    for a, b in units:
        perturbed = ids.clone()
        perturbed[a:b] = pad
        logits, log_probs = forward(perturbed)
        direct.append(reference_importance(clean, reference_outcome(logits, ids, answer, mode), mode))
        links.append([sum(float(clean_log_probs[s - 1, ids[s]] - log_probs[s - 1, ids[s]]) for s in range(c, d))
                      for c, d in units])
    credit = [0.0] * len(units)
    for u in reversed(range(len(units))):
        best = direct[u]
        for v in range(u + 1, len(units)):
            if rule == "widest":
                best = max(best, min(links[u][v], credit[v]))
            else:  # product: a link passes a change with probability 1 - exp(-drop)
                best = max(best, (1 - math.exp(-max(links[u][v], 0.0))) * credit[v])
        credit[u] = best
    return np.array(credit), np.array(direct)


def token_units(reasoning):
    return [(t, t + 1) for t in range(*reasoning)]


@pytest.mark.parametrize("rule", ["product", "widest"])
@pytest.mark.parametrize("mode", MODES)
def test_oar_flow_equals_the_naive_reference(model, mode, rule):
    ids, reasoning, answer = item(seed=1)
    units = token_units(reasoning)
    expected, direct = naive_flow(model, ids, answer, units, mode, rule)
    assert np.abs(direct).max() > 1e-2  # the model is sensitive enough for the tolerance to mean something
    assert (expected > direct + 1e-3).any()  # some credit arrives through later tokens, not directly
    for chunk_size, budget in ((1, 0), (4, 0), (64, 0), (8, 40)):
        got = flow.flow_scores(model, ids, reasoning, answer, units, mode, chunk_size=chunk_size,
                               max_batch_tokens=budget, rules=(rule,))[rule]
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6)


def test_windows_equal_the_naive_reference_and_the_last_unit_is_oar_p(model):
    ids, reasoning, answer = item(seed=2, reasoning=17)
    units = [(a, min(a + 4, reasoning[1])) for a in range(reasoning[0], reasoning[1], 4)]
    expected, direct = naive_flow(model, ids, answer, units, "last", "widest")
    got = flow.flow_scores(model, ids, reasoning, answer, units, "last", chunk_size=3, rules=("widest",))["widest"]
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6)
    # the last window has nothing after it: its credit is its direct effect, OAR-P's window score
    window = oar.perturbation_scores(model, ids, reasoning, answer, units[-1:], "last")
    assert got[-1] == pytest.approx(float(window[0]), abs=1e-9)


def test_rules_bound_each_other(model):
    """widest >= direct effect; sum >= widest where all links are non-negative; every rule runs."""
    ids, reasoning, answer = item(seed=3)
    credit = flow.flow_scores(model, ids, reasoning, answer, token_units(reasoning), "answer_mean",
                              rules=tuple(flow.FLOW_RULES.names()))
    direct = oar.perturbation_scores(model, ids, reasoning, answer, token_units(reasoning), "answer_mean").numpy()
    assert (credit["widest"] >= direct - 1e-9).all() and (credit["product"] >= direct - 1e-9).all()
    assert not np.allclose(credit["widest"], credit["product"])


def test_units_must_tile_the_reasoning(model):
    ids, reasoning, answer = item()
    with pytest.raises(ValueError, match="tile"):
        flow.flow_scores(model, ids, reasoning, answer, token_units(reasoning)[1:], "last")


def test_float32_model_stays_close_to_float64(model):
    """The same engine on the float32 copy: differences are float32 rounding of the forwards only."""
    ids, reasoning, answer = item(seed=4)
    units = token_units(reasoning)
    exact = flow.flow_scores(model, ids, reasoning, answer, units, "last")["product"]
    single = flow.flow_scores(model.float(), ids, reasoning, answer, units, "last")["product"]
    model.double()
    assert np.abs(single - exact).max() <= 1e-4 * max(1.0, np.abs(exact).max())


def test_registry_entries_score_the_reasoning_only(model):
    from oarctl.attribution import ATTRIBUTION_METHODS
    from oarctl.config import AttributeConfig

    ids, reasoning, answer = item(seed=5, reasoning=12)
    rollout = Rollout(SimpleNamespace(reasoning=(0, 12)), ids, reasoning, answer, response_length=16, row=0)
    tokenizer = SimpleNamespace(pad_token_id=VOCAB - 1)
    context = SimpleNamespace(policy=SimpleNamespace(load=lambda: (model, tokenizer)), seed=0, step=0)
    config = AttributeConfig(span_tokens=4)
    token = ATTRIBUTION_METHODS.get("oar_flow")([rollout], None, config, context)[0]
    spans = ATTRIBUTION_METHODS.get("oar_flow_span")([rollout], None, config, context)[0]
    expected, _ = naive_flow(model, ids, answer, token_units(reasoning), "last")
    np.testing.assert_allclose(token[:12], np.maximum(expected, 0), atol=1e-6)
    assert np.isnan(token[12:]).all() and np.isnan(spans[12:]).all()
    windows = [(reasoning[0] + a, reasoning[0] + a + 4) for a in range(0, 12, 4)]
    per_window, _ = naive_flow(model, ids, answer, windows, "last")
    np.testing.assert_allclose(spans[:12], np.repeat(np.maximum(per_window, 0) / 4, 4), atol=1e-6)  # spread evenly
