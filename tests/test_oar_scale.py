"""OAR at scale: checkpointing, token budgets, float64 outcome math, the cheap OAR-P variants, and
memory per token that stays flat as responses grow.

Every fast path is compared with a path that shares none of its shortcuts: checkpointing with no
checkpointing, a token budget with none, float32 with the same computation in float64, the cheap
variants at their exact limits (one-token windows, screening everything) with exact OAR-P.
"""
from __future__ import annotations

import copy
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from oarctl.attribution import oar, oar_p_cheap
from oarctl.config import AttributeConfig

MODES = ["last", "answer_mean", "answer_joint"]


def qwen2(vocab=512, hidden=32, layers=2, initializer_range=0.2, seed=0):
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
                         initializer_range=initializer_range, tie_word_embeddings=True, pad_token_id=vocab - 1)
    return Qwen2ForCausalLM(config).eval()


@pytest.fixture(scope="module")
def model():
    return qwen2()


def item(prompt: list[int], reasoning: int, seed: int, vocab=512):
    """prompt + `reasoning` random tokens + a conclude token + 3 answer tokens, with its spans."""
    body = torch.randint(4, vocab - 1, (reasoning + 4,), generator=torch.Generator().manual_seed(seed))
    ids = torch.cat([torch.tensor(prompt, dtype=torch.long), body])
    start = len(prompt)
    return ids, (start, start + reasoning), (start + reasoning + 1, start + reasoning + 4)


def group(prompt_length=7, sizes=(9, 14, 5, 11), seed=0):
    prompt = torch.randint(4, 500, (prompt_length,), generator=torch.Generator().manual_seed(100 + seed)).tolist()
    return [item(prompt, size, seed * 10 + i) for i, size in enumerate(sizes)]


def assert_scores_close(got, expected, tolerance):
    for a, b in zip(got, expected, strict=True):
        scale = max(float(b.abs().max()), 1e-30)
        assert float((a.double() - b.double()).abs().max()) <= tolerance * scale


# ---- checkpointing and token budgets -------------------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
def test_checkpointing_gives_the_same_oar_g_scores_with_a_shared_prompt(model, mode):
    items = group() + group(prompt_length=7, seed=1) + [item([], 6, 99)]  # two prompts and one without
    plain = oar.oar_g_batch(model, items, mode, 0.05, list(range(len(items))), batch_size=3)
    checkpointed = oar.oar_g_batch(model, items, mode, 0.05, list(range(len(items))), batch_size=3,
                                   gradient_checkpointing=True)
    assert_scores_close(checkpointed, plain, 1e-6)
    assert all(p.grad is None for p in model.parameters())
    assert all("forward" not in vars(layer) for layer in model.model.layers)  # the layers are restored


def _saved_bytes(function) -> int:
    """Bytes of the tensors autograd keeps for the backward pass while `function` runs."""
    total = [0]

    def pack(tensor):
        total[0] += tensor.numel() * tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        function()
    return total[0]


def test_checkpointing_keeps_a_fraction_of_the_activations():
    model = qwen2(hidden=64, layers=4)
    items = group(sizes=(40, 40, 40))
    kept = {flag: _saved_bytes(lambda: oar.oar_g_batch(model, items, "answer_mean", 1e-3, [0, 1, 2],
                                                       gradient_checkpointing=flag)) for flag in (False, True)}
    assert kept[True] < kept[False] / 4  # one layer input per layer instead of every intermediate


def test_batches_stay_within_the_token_budget():
    widths = [10, 50, 20, 200, 30, 40]
    batches = oar.batches_within(list(range(6)), widths, batch_size=3, max_batch_tokens=100)
    assert sorted(i for b in batches for i in b) == list(range(6))
    for batch in batches:
        assert len(batch) <= 3
        assert len(batch) == 1 or len(batch) * max(widths[i] for i in batch) <= 100  # 200 runs alone
    assert [3] in batches
    assert oar.batches_within([0, 1, 2, 3], widths, 3, 0) == [[0, 1, 2], [3]]  # no budget: fixed size


def test_a_token_budget_changes_batches_not_scores(model):
    """In float64, so that any difference is a bug and not rounding."""
    exact = copy.deepcopy(model).double()
    items = group(sizes=(30, 8, 16, 24, 12))
    seeds = list(range(len(items)))
    unbounded = oar.oar_g_batch(exact, items, "answer_mean", 1e-3, seeds, batch_size=8)
    budgeted = oar.oar_g_batch(exact, items, "answer_mean", 1e-3, seeds, batch_size=8, max_batch_tokens=70,
                               gradient_checkpointing=True)
    assert_scores_close(budgeted, unbounded, 1e-9)
    ids, reasoning, answer = items[0]
    for chunk, budget in ((64, 0), (64, 100), (1, 0)):
        assert_scores_close([oar.oar_p(exact, ids, reasoning, answer, "answer_mean", chunk_size=chunk,
                                       max_batch_tokens=budget)], [oar.oar_p(exact, ids, reasoning, answer,
                                                                             "answer_mean", chunk_size=4)], 1e-9)
    entropies = [oar.token_entropy_batch(exact, [(i, r) for i, r, _ in items], None, 8, budget) for budget in (0, 50)]
    assert_scores_close(entropies[1], entropies[0], 1e-9)


# ---- precision ------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
def test_float32_scores_match_float64_where_scores_are_tiny(mode):
    """A random-init model with a small initialiser: KL scores ~1e-5, where float32 outcome math was off
    by ~3% of the largest score (a sum of 512 terms p (log p - log q) rounding at 1e-7 each)."""
    float32 = qwen2(hidden=64, initializer_range=0.02)
    float64 = copy.deepcopy(float32).double()
    ids, reasoning, answer = item(list(range(10, 30)), 90, seed=3)
    for method in (lambda m: oar.oar_p(m, ids, reasoning, answer, mode),
                   lambda m: oar.oar_g(m, ids, reasoning, answer, mode, seed=1)):
        expected = method(float64).double()
        assert float(expected.abs().max()) < 1e-2 or mode == "answer_joint"
        assert_scores_close([method(float32)], [expected], 1e-4)


# ---- the cheap OAR-P variants ---------------------------------------------------------------------

def cheap_config(**options) -> AttributeConfig:
    return AttributeConfig(**{"chunk_size": 8, "oar_p_mode": "last", **options})


def test_windows_cover_the_reasoning_within_the_cap():
    assert oar_p_cheap.windows((5, 25), 8, 100) == [(5, 13), (13, 21), (21, 25)]
    wide = oar_p_cheap.windows((0, 1000), 4, 10)
    assert len(wide) <= 10 and wide[0] == (0, 100) and wide[-1][1] == 1000
    assert oar_p_cheap.windows((3, 3), 8, 10) == []


def test_spread_keeps_each_window_score():
    spans = [(10, 13), (13, 15)]
    weights = torch.tensor([1.0, 0.0, 3.0, 0.0, 0.0])
    even = oar_p_cheap.spread(torch.tensor([0.6, 0.2], dtype=torch.float64), spans, 10, None, 5)
    torch.testing.assert_close(even, torch.tensor([0.2, 0.2, 0.2, 0.1, 0.1], dtype=torch.float64))
    weighted = oar_p_cheap.spread(torch.tensor([0.8, 0.2], dtype=torch.float64), spans, 10, weights, 5)
    torch.testing.assert_close(weighted, torch.tensor([0.2, 0.0, 0.6, 0.1, 0.1], dtype=torch.float64))


@pytest.mark.parametrize("mode", MODES)
def test_one_token_windows_are_exact_oar_p(model, mode):
    ids, reasoning, answer = item([1, 2, 3, 4], 20, seed=5)
    config = cheap_config(span_tokens=1, span_spread="even", oar_p_mode=mode)
    expected = oar.oar_p(model, ids, reasoning, answer, mode).clamp(min=0)
    assert_scores_close([oar_p_cheap.span_scores(model, (ids, reasoning, answer), None, config, 511)], [expected], 1e-6)


def test_screening_every_token_is_exact_oar_p(model):
    ids, reasoning, answer = item([1, 2, 3], 24, seed=6)
    saliency = oar.oar_g(model, ids, reasoning, answer, "answer_mean", 0.05)
    scores, miss_rate = oar_p_cheap.screened_scores(model, (ids, reasoning, answer), saliency,
                                                    cheap_config(screen_fraction=1.0), 511, seed=0)
    assert_scores_close([scores], [oar.oar_p(model, ids, reasoning, answer, "last")], 1e-6)
    assert np.isnan(miss_rate)  # nothing left to audit


def test_screened_positions_respect_fractions_and_the_cap():
    saliency = np.arange(100, dtype=float)[::-1]  # token 0 ranks first
    top, audit = oar_p_cheap.screened_positions(saliency, cheap_config(screen_fraction=0.1, audit_fraction=0.1), 7)
    assert top.tolist() == list(range(10)) and audit.size == 9 and audit.min() >= 10
    again = oar_p_cheap.screened_positions(saliency, cheap_config(screen_fraction=0.1, audit_fraction=0.1), 7)
    assert audit.tolist() == again[1].tolist()  # seeded
    top, audit = oar_p_cheap.screened_positions(saliency, cheap_config(screen_fraction=0.5, max_perturbations=12), 7)
    assert top.size == 12 and audit.size == 0


def test_unmeasured_tokens_keep_their_order_below_the_top_set():
    saliency = np.array([0.9, 0.1, 0.5, 0.3, 0.8])
    exact = {0: 2.0, 4: 1.0, 1: 3.0}  # tokens 0 and 4 screened, 1 audited
    scores = oar_p_cheap.place_below(exact, np.array([0, 4]), saliency)
    assert scores[[0, 4, 1]].tolist() == [2.0, 1.0, 3.0]
    assert 1.0 > scores[2] > scores[3] > 0  # by saliency, below the least top score


# ---- memory per token ------------------------------------------------------------------------------

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))


@pytest.mark.parametrize("method", ["oar_g", "oar_p"])
def test_peak_memory_per_token_stays_flat_from_256_to_3072_tokens(method):
    """At a 4,096-token budget, in a fresh process each (bench/memory_probe.py; ~15 s a probe)."""
    from memory_probe import probe

    options = {"method": method, "budget": 4096, "checkpointing": method == "oar_g"}
    per_token = [probe(length=length, **options) for length in (256, 3072)]
    ratios = [m["peak_mib"] / m["tokens"] for m in per_token]
    print(method, [f"{m['length']}: {m['peak_mib']:.0f} MiB / {m['tokens']} tokens" for m in per_token])
    assert max(ratios) / min(ratios) <= 1.5


def test_oar_flow_memory_per_token_stays_flat_from_256_to_2048_tokens():
    """oar_flow keeps O(R) state beside OAR-P's chunks (D is used row by row, last chunk first): at a
    4,096-token budget its peak per in-flight token stays within 1.5x as responses grow 8x."""
    from memory_probe import probe

    per_token = [probe(method="oar_flow", length=length, budget=4096) for length in (256, 2048)]
    ratios = [m["peak_mib"] / m["tokens"] for m in per_token]
    print("oar_flow", [f"{m['length']}: {m['peak_mib']:.0f} MiB / {m['tokens']} tokens" for m in per_token])
    assert max(ratios) / min(ratios) <= 1.5


def test_oar_flow_local_memory_per_key_stays_flat_from_256_to_2048_tokens():
    """oar_flow_local's rows attend the clean keys left of their token: at a 16,384-key budget each forward
    takes fewer rows as the prefix grows, and its peak per key held stays within 1.5x as responses grow 8x."""
    from memory_probe import probe

    per_key = [probe(method="oar_flow_local", length=length, budget=16384) for length in (256, 2048)]
    ratios = [m["peak_mib"] / m["tokens"] for m in per_key]
    print("oar_flow_local", [f"{m['length']}: {m['peak_mib']:.0f} MiB / {m['tokens']} keys" for m in per_key])
    assert max(ratios) / min(ratios) <= 1.5
