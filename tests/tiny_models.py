"""A tiny random Qwen2 in float64, the model the exactness tests of the flow attributions share: small enough
for a forward per perturbed sequence, float64 so that two computations of the same credit agree to 1e-6."""
from __future__ import annotations

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM


def float64_qwen2(vocab: int, pad: int) -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                         initializer_range=0.3, tie_word_embeddings=True, pad_token_id=pad)
    return Qwen2ForCausalLM(config).double().eval()
