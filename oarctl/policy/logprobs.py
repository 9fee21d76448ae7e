"""Teacher-forced logits and log-probs of given responses: what the update trains on and the vLLM
canary checks against.

Reads a causal LM and token id lists (prompts, responses; Python lists, any lengths); writes logits
(B, R, V) left-aligned on the response, and per-token log-probs under a sampling temperature.
Sequences are right padded: causal attention never lets a real token see a pad.
"""
from __future__ import annotations

import torch


def pad_rows(rows: list[list], value, dtype) -> torch.Tensor:
    """(B, max length) tensor of `rows`, right padded with `value`."""
    width = max(len(r) for r in rows)
    return torch.tensor([list(r) + [value] * (width - len(r)) for r in rows], dtype=dtype)


def model_device(model) -> torch.device:
    return next(model.parameters()).device  # a DDP/FSDP wrapper has no `.device`


def response_logits(model, prompts: list[list[int]], responses: list[list[int]], pad_id: int) -> torch.Tensor:
    """Logits predicting each response token, left-aligned on the response: (B, R, V)."""
    sequences = [p + r for p, r in zip(prompts, responses)]
    input_ids = pad_rows(sequences, pad_id, torch.long)  # (B, T), right padded
    attention = pad_rows([[1] * len(s) for s in sequences], 0, torch.long)
    device = model_device(model)
    logits = model(input_ids=input_ids.to(device), attention_mask=attention.to(device)).logits
    width = max(len(r) for r in responses)
    gathered = [logits[i, len(p) - 1:len(p) - 1 + width] for i, p in enumerate(prompts)]
    return torch.stack([torch.nn.functional.pad(g, (0, 0, 0, width - g.shape[0])) for g in gathered])


def token_logprobs(logits: torch.Tensor, responses: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """log_softmax(logits / temperature) of each response token: (B, R); temperature (B,)."""
    scaled = logits.float() / temperature[:, None, None]  # (B, R, V)
    return torch.log_softmax(scaled, dim=-1).gather(-1, responses.unsqueeze(-1)).squeeze(-1)  # (B, R)
