"""Log-probs and entropy without the (B, T, V) logits: the chunked path gives the loss, gradients and
entropy of the full-logits path it replaced, for every loss aggregation and with the k3 KL term."""
from __future__ import annotations

import copy

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from oarctl.losses import LOSS_AGGREGATIONS, policy_loss
from oarctl.policy.logprobs import full_vocabulary_stats, pad_rows, response_token_stats

PAD = 0


def _model(seed=0, vocab=97, tied=True):
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128,
                         tie_word_embeddings=tied, pad_token_id=PAD)
    return Qwen2ForCausalLM(config)


def _batch(seed=1, vocab=97):
    generator = torch.Generator().manual_seed(seed)
    lengths = [(5, 9), (3, 14), (7, 1), (4, 11)]  # prompts and responses of different lengths
    prompts = [torch.randint(1, vocab, (p,), generator=generator).tolist() for p, _ in lengths]
    responses = [torch.randint(1, vocab, (r,), generator=generator).tolist() for _, r in lengths]
    old = [(-torch.rand(len(r), generator=generator) * 4).tolist() for r in responses]
    advantages = [(torch.randn(len(r), generator=generator)).tolist() for r in responses]
    return prompts, responses, old, advantages, [1.0, 0.7, 1.3, 1.0]


def _loss(model, reference, batch, aggregation, chunk_tokens):
    """The update's micro-batch loss through the chunked path (chunk_tokens) or the full logits (None)."""
    prompts, responses, old, advantages, temperatures = batch
    mask = pad_rows([[1.0] * len(r) for r in responses], 0.0, torch.float32)
    if chunk_tokens is None:
        logprobs, entropy = full_vocabulary_stats(model, prompts, responses, PAD, temperatures)
        with torch.no_grad():
            ref, _ = full_vocabulary_stats(reference, prompts, responses, PAD, temperatures)
    else:
        logprobs, entropy = response_token_stats(model, prompts, responses, PAD, temperatures, chunk_tokens)
        with torch.no_grad():
            ref, _ = response_token_stats(reference, prompts, responses, PAD, temperatures, chunk_tokens)
    loss, _ = policy_loss(logprobs, pad_rows(old, 0.0, torch.float32), pad_rows(advantages, 0.0, torch.float32),
                          mask, clip_low=0.2, clip_high=0.28, aggregation=aggregation, max_length=16,
                          ref_logprobs=ref, kl_coef=0.05)
    return loss, float((entropy * mask).sum() / mask.sum())


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-30))


@pytest.mark.parametrize("aggregation", sorted(LOSS_AGGREGATIONS.names()))
@pytest.mark.parametrize("chunk_tokens", [5, 12, 0])
def test_chunked_loss_and_gradients_equal_the_full_logits(aggregation, chunk_tokens):
    model, batch = _model(), _batch()
    reference = _model(seed=7)
    chunked = copy.deepcopy(model)
    loss, entropy = _loss(model, reference, batch, aggregation, None)
    loss.backward()
    chunked_loss, chunked_entropy = _loss(chunked, reference, batch, aggregation, chunk_tokens)
    chunked_loss.backward()
    assert abs(float(chunked_loss) - float(loss)) <= 1e-6 * abs(float(loss))
    assert chunked_entropy == pytest.approx(entropy, rel=1e-6)
    for (name, p), q in zip(model.named_parameters(), chunked.parameters()):
        assert _relative(q.grad, p.grad) <= 1e-6, name
    assert chunked.get_output_embeddings() is chunked.lm_head  # the output layer is put back


def test_untied_output_layer_gets_its_gradient():
    model = _model(tied=False)
    prompts, responses, *_ = _batch()
    logprobs, _ = response_token_stats(model, prompts, responses, PAD, 1.0, chunk_tokens=8)
    logprobs.sum().backward()
    assert model.lm_head.weight.grad is not None and float(model.lm_head.weight.grad.abs().sum()) > 0


def test_log_probs_match_the_full_logits_in_their_positions():
    model = _model()
    prompts, responses, *_ = _batch()
    with torch.no_grad():
        full, _ = full_vocabulary_stats(model, prompts, responses, PAD)
        chunked, entropy = response_token_stats(model, prompts, responses, PAD, chunk_tokens=3)
    for row, response in enumerate(responses):
        torch.testing.assert_close(chunked[row, :len(response)], full[row, :len(response)], rtol=0, atol=1e-6)
    assert bool(torch.isfinite(chunked).all()) and bool(torch.isfinite(entropy).all())  # filler is finite
