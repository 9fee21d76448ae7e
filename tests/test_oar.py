"""OAR attribution: segmentation, OAR-P / OAR-G / entropy against slow references, registry entries.

The references here recompute everything from scratch (a full forward pass of every perturbed
sequence, all logits, the outcome formulas written out again), so they share no fast path with
`oarctl/attribution/oar.py`. The model is a tiny random Qwen2 with a large initialiser range, so
perturbations move the outcome by 1e-2..1 and the tolerances below are meaningful.
"""
from __future__ import annotations

import copy
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pytest
import torch
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from oarctl.attribution import ATTRIBUTION_METHODS, outcome
from oarctl.attribution import oar
from oarctl.attribution.base import segment_rows
from oarctl.config import load_config
from oarctl.attribution.segments import (PROBE_TEXT, attributed_sequence, segment, sequence_spans,
                                         token_offsets)
from oarctl.toy.tokenizer import build_tokenizer

MODES = ["last", "answer_mean", "answer_joint"]
PROMPT = "<|im_start|>user\nCompute 3+4.<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="module")
def model(tokenizer):
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=1, intermediate_size=64, max_position_embeddings=256,
                         initializer_range=0.2, tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.eos_token_id)
    return Qwen2ForCausalLM(config).eval()


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def rollout(tokenizer, response_text: str, prompt: str = PROMPT):
    """(input_ids, reasoning span, answer span) of the attributed sequence of a toy response."""
    prompt_ids = encode(tokenizer, prompt)
    response = encode(tokenizer, response_text) + [tokenizer.eos_token_id]
    segments = segment(response, tokenizer)
    spans = sequence_spans(len(prompt_ids), segments)
    ids = torch.tensor(attributed_sequence(prompt_ids, response, segments))
    return ids, spans["reasoning"], spans["answer"]


def decoded(tokenizer, ids, span) -> str:
    return tokenizer.decode(ids[span[0]:span[1]])


# ---- (a) segmentation ----------------------------------------------------------------------------

def test_segment_boxed_response(tokenizer):
    response = encode(tokenizer, "3+4 is 7, so \\boxed{17} done") + [tokenizer.eos_token_id]
    segments = segment(response, tokenizer)
    assert not segments.uses_probe and segments.has_answer
    assert decoded(tokenizer, response, segments.reasoning) == "3+4 is 7, so "
    assert decoded(tokenizer, response, segments.conclude) == "\\boxed{"
    assert decoded(tokenizer, response, segments.answer) == "17"
    assert segments.reasoning[1] == segments.conclude[0] and segments.conclude[1] == segments.answer[0]
    assert response[segments.answer[1]] == encode(tokenizer, "}")[0]  # the closing brace is in no part


def test_segment_last_nested_box(tokenizer):
    response = encode(tokenizer, "\\boxed{1} no: \\boxed{\\frac{1}{2}}")
    segments = segment(response, tokenizer)
    assert decoded(tokenizer, response, segments.reasoning) == "\\boxed{1} no: "
    assert decoded(tokenizer, response, segments.answer) == "\\frac{1}{2}"


def test_segment_without_answer_appends_probe(tokenizer):
    response = encode(tokenizer, "I am not sure") + [tokenizer.eos_token_id]
    segments = segment(response, tokenizer)
    probe = encode(tokenizer, PROBE_TEXT)
    assert segments.probe_ids == probe and segments.uses_probe and not segments.has_answer
    assert segments.reasoning == (0, len(response) - 1)  # the eos is not reasoning
    assert segments.conclude == (len(response) - 1, len(response) - 1 + len(probe))
    assert segments.answer == (segments.conclude[1],) * 2
    prompt = [5, 6, 7]
    sequence = attributed_sequence(prompt, response, segments)
    assert sequence == prompt + response[:-1] + probe
    spans = sequence_spans(len(prompt), segments)
    assert spans["reasoning"] == (3, 3 + len(response) - 1) and spans["answer"] == (len(sequence),) * 2


def test_segment_empty_box_keeps_marker(tokenizer):
    response = encode(tokenizer, "so \\boxed{}")
    segments = segment(response, tokenizer)
    assert not segments.uses_probe and not segments.has_answer
    assert decoded(tokenizer, response, segments.conclude) == "\\boxed{"
    assert outcome.effective_mode("answer_mean", segments.answer) == "last"


@pytest.fixture(scope="module")
def byte_level_tokenizer():
    """A byte-level BPE trained here: multi-byte characters split over several tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<eos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(["the answer is \\boxed{12}", "so x = 3 and y = 4, \\boxed{7}"] * 20, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>")


def test_segment_byte_level_bpe(byte_level_tokenizer):
    text = "ré∑ume \\boxed{π/2}"
    response = byte_level_tokenizer(text)["input_ids"] + [byte_level_tokenizer.eos_token_id]
    assert any("\ufffd" in byte_level_tokenizer.decode([i]) for i in response)  # really split bytes
    decoded_text, offsets = token_offsets(byte_level_tokenizer, response)
    assert offsets[-1] == len(decoded_text) and offsets == sorted(offsets)
    segments = segment(response, byte_level_tokenizer)
    # the token " \\" straddles reasoning and marker: it goes to the later part, the conclude
    assert decoded(byte_level_tokenizer, response, segments.reasoning) == "ré∑ume"
    assert decoded(byte_level_tokenizer, response, segments.conclude) == " \\boxed{"
    assert decoded(byte_level_tokenizer, response, segments.answer) == "π/2"


# ---- slow references -----------------------------------------------------------------------------

def reference_outcome(logits: torch.Tensor, ids: torch.Tensor, answer_span, mode):
    """logits (T, V) of the whole sequence -> outcome, written out from section 2 of the method."""
    start, end = answer_span
    if mode == "last" or end == start:
        return torch.log_softmax(logits[start - 1], dim=-1)
    if mode == "answer_mean":
        return torch.log_softmax(logits[start - 1:end - 1].mean(dim=0), dim=-1)
    log_probs = torch.log_softmax(logits[start - 1:end - 1], dim=-1)
    return log_probs[torch.arange(end - start), ids[start:end]].mean()


def reference_importance(clean, changed, mode, answer_span):
    if mode == "answer_joint" and answer_span[1] > answer_span[0]:
        return clean - changed
    return (clean.exp() * (clean - changed)).sum()


@torch.no_grad()
def naive_oar_p(model, ids, reasoning_span, answer_span, mode):
    clean = reference_outcome(model(input_ids=ids[None]).logits[0], ids, answer_span, mode)
    scores = []
    for t in range(*reasoning_span):
        perturbed = ids.clone()
        perturbed[t] = model.config.pad_token_id
        changed = reference_outcome(model(input_ids=perturbed[None]).logits[0], ids, answer_span, mode)
        scores.append(reference_importance(clean, changed, mode, answer_span))
    return torch.stack(scores)


def reference_noise(reasoning_span, hidden, std, seed):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn((reasoning_span[1] - reasoning_span[0], hidden), generator=generator) * std


def naive_objective(model, embeds, ids, answer_span, mode, teacher):
    logits = model(inputs_embeds=embeds[None]).logits[0]
    return reference_importance(teacher, reference_outcome(logits, ids, answer_span, mode), mode, answer_span)


def naive_oar_g(model, ids, reasoning_span, answer_span, mode, std, seed):
    with torch.no_grad():
        teacher = reference_outcome(model(input_ids=ids[None]).logits[0], ids, answer_span, mode)
    leaf = model.get_input_embeddings()(ids).detach().requires_grad_(True)
    noise = torch.zeros_like(leaf)
    if mode != "answer_joint" or answer_span[1] == answer_span[0]:
        noise[reasoning_span[0]:reasoning_span[1]] = reference_noise(reasoning_span, leaf.shape[-1], std, seed)
    (gradient,) = torch.autograd.grad(naive_objective(model, leaf + noise, ids, answer_span, mode, teacher), leaf)
    return (gradient * leaf).sum(-1).abs()[reasoning_span[0]:reasoning_span[1]].detach()


# ---- (b) OAR-P -----------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
def test_oar_p_matches_naive_for_every_chunk_size(model, tokenizer, mode):
    ids, reasoning, answer = rollout(tokenizer, "3+4 is 7, so \\boxed{17}")
    expected = naive_oar_p(model, ids, reasoning, answer, mode)
    assert expected.abs().max() > 1e-2  # the test model is sensitive enough for atol to mean something
    length = reasoning[1] - reasoning[0]
    for chunk_size in (1, 3, length + 5):
        got = oar.oar_p(model, ids, reasoning, answer, mode, chunk_size=chunk_size)
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)


def test_oar_p_reasoning_at_the_start_has_an_empty_prefix(model, tokenizer):
    ids, reasoning, answer = rollout(tokenizer, "7, so \\boxed{7}", prompt="")
    assert reasoning[0] == 0
    torch.testing.assert_close(oar.oar_p(model, ids, reasoning, answer, chunk_size=2),
                               naive_oar_p(model, ids, reasoning, answer, "last"), atol=1e-5, rtol=1e-4)


def test_oar_p_probe_rollout_falls_back_to_last(model, tokenizer):
    ids, reasoning, answer = rollout(tokenizer, "I think it is 7")
    assert answer[0] == answer[1] == ids.numel()
    expected = naive_oar_p(model, ids, reasoning, answer, "last")
    for mode in MODES:
        torch.testing.assert_close(oar.oar_p(model, ids, reasoning, answer, mode, chunk_size=4), expected,
                                   atol=1e-5, rtol=1e-4)


def test_oar_p_batch_and_explicit_perturbation_token(model, tokenizer):
    items = [rollout(tokenizer, text) for text in ("so \\boxed{7}", "3+4=7 \\boxed{7}")]
    batched = oar.oar_p_batch(model, items, "answer_mean", chunk_size=2)
    for item, got in zip(items, batched, strict=True):
        torch.testing.assert_close(got, oar.oar_p(model, *item, "answer_mean"))
    ids, reasoning, answer = items[1]
    other = oar.oar_p(model, ids, reasoning, answer, perturb_token_id=encode(tokenizer, "x")[0])
    assert not torch.allclose(other, oar.oar_p(model, ids, reasoning, answer))


# ---- (c) OAR-G -----------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
def test_oar_g_matches_naive_autograd_and_leaves_parameter_grads(model, tokenizer, mode):
    ids, reasoning, answer = rollout(tokenizer, "3+4 is 7, so \\boxed{17}")
    got = oar.oar_g(model, ids, reasoning, answer, mode, noise_std=0.05, seed=3)
    expected = naive_oar_g(model, ids, reasoning, answer, mode, 0.05, 3)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-4)
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("mode", ["answer_mean", "answer_joint"])
def test_oar_g_matches_finite_differences(model, tokenizer, mode):
    """I_t = |d/d alpha J(e + noise + alpha e_t)| at alpha = 0, by central differences."""
    double = copy.deepcopy(model).double()
    ids, reasoning, answer = rollout(tokenizer, "so 7, \\boxed{17}")
    scores = oar.oar_g(double, ids, reasoning, answer, mode, noise_std=0.05, seed=1)
    with torch.no_grad():
        teacher = reference_outcome(double(input_ids=ids[None]).logits[0], ids, answer, mode)
        embeds = double.get_input_embeddings()(ids)
        if mode != "answer_joint":
            embeds[reasoning[0]:reasoning[1]] += reference_noise(reasoning, embeds.shape[-1], 0.05, 1).double()
        clean = double.get_input_embeddings()(ids)
        for t in (reasoning[0], reasoning[0] + 2, reasoning[1] - 1):
            step = 1e-2  # Qwen2's RMSNorm and rotary run in float32 even in a float64 model
            direction = torch.zeros_like(embeds)
            direction[t] = clean[t]
            plus = naive_objective(double, embeds + step * direction, ids, answer, mode, teacher)
            minus = naive_objective(double, embeds - step * direction, ids, answer, mode, teacher)
            finite = abs(float(plus - minus) / (2 * step))
            assert finite == pytest.approx(float(scores[t - reasoning[0]]), rel=2e-3, abs=1e-10)


def test_oar_g_batched_equals_single(model, tokenizer):
    items = [rollout(tokenizer, text) for text in ("3+4 is 7, so \\boxed{17}", "so \\boxed{7}", "no idea")]
    seeds = [11, 12, 13]
    batched = oar.oar_g_batch(model, items, "answer_mean", noise_std=0.05, seeds=seeds, batch_size=3)
    for item, seed, got in zip(items, seeds, batched, strict=True):
        torch.testing.assert_close(got, oar.oar_g(model, *item, "answer_mean", noise_std=0.05, seed=seed),
                                   atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("mode", MODES)
def test_oar_g_shared_prompt_batches_match_naive(model, tokenizer, mode):
    """Groups of samples per prompt, prompts of equal and unequal length, an empty prompt, a probe
    row and batches that split a group: each row scores as the naive single-response reference."""
    other = PROMPT.replace("3+4", "5+2")  # same length, different tokens
    longer = PROMPT.replace("3+4", "13+24")
    texts = [(PROMPT, "3+4 is 7, so \\boxed{17}"), (other, "so \\boxed{7}"), (PROMPT, "no idea"),
             (longer, "13+24=37 \\boxed{37}"), (PROMPT, "7 \\boxed{7}"), ("", "7, so \\boxed{7}"),
             (other, "5+2=7. \\boxed{7}")]
    items = [rollout(tokenizer, text, prompt=prompt) for prompt, text in texts]
    seeds = list(range(20, 20 + len(items)))
    for batch_size in (2, len(items)):
        batched = oar.oar_g_batch(model, items, mode, noise_std=0.05, seeds=seeds, batch_size=batch_size)
        for (ids, reasoning, answer), seed, got in zip(items, seeds, batched, strict=True):
            torch.testing.assert_close(got, naive_oar_g(model, ids, reasoning, answer, mode, 0.05, seed),
                                       atol=1e-6, rtol=1e-4)


def test_oar_g_noise_is_seeded_and_restores_training_mode(model, tokenizer):
    ids, reasoning, answer = rollout(tokenizer, "3+4 is 7, so \\boxed{17}")
    model.train()
    try:
        first = oar.oar_g(model, ids, reasoning, answer, seed=5)
        assert model.training
    finally:
        model.eval()
    assert torch.equal(first, oar.oar_g(model, ids, reasoning, answer, seed=5))
    assert not torch.equal(first, oar.oar_g(model, ids, reasoning, answer, seed=6))


# ---- (d) one `last` position for both methods ----------------------------------------------------

def test_last_is_the_position_predicting_the_first_answer_token(model, tokenizer, monkeypatch):
    ids, reasoning, answer = rollout(tokenizer, "so \\boxed{17}")
    seen = []
    original = outcome.outcome_positions

    def spy(answer_span, mode):
        positions = original(answer_span, mode)
        seen.append(positions.tolist())
        return positions

    monkeypatch.setattr(outcome, "outcome_positions", spy)
    oar.oar_p(model, ids, reasoning, answer, "last")
    oar.oar_g(model, ids, reasoning, answer, "last")
    assert seen == [[answer[0] - 1]] * 2
    assert ids[answer[0] - 1] == encode(tokenizer, "\\boxed{")[0]  # the last conclude token


# ---- (e) entropy and the registry entries --------------------------------------------------------

def test_entropy_matches_direct_computation(model, tokenizer):
    items = [rollout(tokenizer, text)[:2] for text in ("3+4 is 7, so \\boxed{17}", "so \\boxed{7}")]
    got = oar.token_entropy_batch(model, items, temperatures=[1.0, 0.7])
    for (ids, (start, end)), temperature, scores in zip(items, [1.0, 0.7], got, strict=True):
        with torch.no_grad():
            probs = torch.softmax(model(input_ids=ids[None]).logits[0] / temperature, dim=-1)
        expected = -(probs * probs.log()).sum(-1)[start - 1:end - 1]
        torch.testing.assert_close(scores, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("method", ["oar_p", "oar_p_span", "oar_p_screened", "oar_g", "entropy"])
def test_registry_entries_score_every_response_token(model, tokenizer, method):
    texts = ["3+4 is 7, so \\boxed{17}", "no idea"]
    prompt = encode(tokenizer, PROMPT)
    responses = [encode(tokenizer, t) + [tokenizer.eos_token_id] for t in texts]
    table = pa.table({"prompt_token_ids": [prompt] * 2, "response_token_ids": responses,
                      "temperature": [1.0, 0.0]})
    context = SimpleNamespace(seed=0, step=1, policy=SimpleNamespace(load=lambda: (model, tokenizer)), call_sync=None)
    config = load_config(None, ["attribute.chunk_size=3"]).attribute
    scores = ATTRIBUTION_METHODS.get(method)(segment_rows(table, tokenizer), table, config, context)
    for response, row in zip(responses, scores, strict=True):
        assert row.dtype == np.float32 and row.shape == (len(response),)
        reasoning_end = segment(response, tokenizer).reasoning[1]
        assert np.isfinite(row[:reasoning_end]).all() and np.isnan(row[reasoning_end:]).all()
