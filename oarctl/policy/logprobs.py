"""Teacher-forced log-probs and entropies of given responses: what the update trains on, the vLLM
canary checks against and the entropy attribution scores.

Reads a causal LM and token id lists (prompts, responses; Python lists, any lengths); writes, per
response token, the log-prob of that token under log_softmax(logits / temperature) and the entropy
of that distribution, (B, R) each, left-aligned on the response. Sequences are right padded:
causal attention never lets a real token see a pad.

`response_token_stats` never holds the (B, R, V) logits whole: the model body runs once, then the
vocabulary projection runs `chunk_tokens` positions at a time, and only the (B, R) results are kept;
with gradients on, each chunk's logits are recomputed in the backward (activation checkpointing).
It does this by standing in for the model's output layer during its own forward, so a DDP, FSDP or
DeepSpeed wrapper still runs its hooks (FSDP's parameters are gathered while the projection runs).
`full_vocabulary_stats` is the path it replaced, projecting every position at once: the reference the
tests and bench/update_memory.py compare with.
"""
from __future__ import annotations

import contextlib

import torch
from torch.utils.checkpoint import checkpoint


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


def unwrapped(model):
    """The model inside DDP / FSDP / DeepSpeed wrappers (each keeps it as `.module`)."""
    while hasattr(model, "module") and isinstance(model.module, torch.nn.Module):
        model = model.module
    return model


def _chunk_stats(head, hidden: torch.Tensor, targets: torch.Tensor, temperature: torch.Tensor):
    """(log-prob of `targets`, entropy) under softmax(head(hidden) / temperature), float32: (B, C) each."""
    scaled = head(hidden).float() / temperature[:, None, None]  # (B, C, V): the only V-sized tensors
    log_probabilities = torch.log_softmax(scaled, dim=-1)
    logprobs = log_probabilities.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    with torch.no_grad():  # entropy is logged, never trained on; a -inf logit contributes 0
        probabilities = log_probabilities.exp()
        entropy = -torch.where(probabilities > 0, probabilities * log_probabilities, 0.0).sum(dim=-1)
    return logprobs, entropy


class _ResponseStatsHead(torch.nn.Module):
    """Stands in for the output layer during one forward: picks each row's response positions from
    the hidden states and returns (B, R, 2) = (log-prob, entropy), projected chunk by chunk."""

    def __init__(self, head, positions: torch.Tensor, targets: torch.Tensor, temperature: torch.Tensor,
                 chunk_tokens: int):
        super().__init__()
        self.head, self.positions, self.targets, self.temperature = head, positions, targets, temperature
        self.chunk_tokens = chunk_tokens

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # (B, T, H) -> (B, R, 2)
        rows, width = self.positions.shape
        index = self.positions.unsqueeze(-1).expand(-1, -1, hidden.shape[-1])
        picked = hidden.gather(1, index)  # (B, R, H)
        step = max(1, self.chunk_tokens // rows) if self.chunk_tokens > 0 else width
        parts = []
        for start in range(0, width, step):
            arguments = (self.head, picked[:, start:start + step], self.targets[:, start:start + step],
                         self.temperature)
            recompute = torch.is_grad_enabled() and step < width  # one chunk: nothing to save by recomputing
            logprobs, entropy = (checkpoint(_chunk_stats, *arguments, use_reentrant=False) if recompute
                                 else _chunk_stats(*arguments))
            parts.append(torch.stack([logprobs, entropy], dim=-1))
        return torch.cat(parts, dim=1)


@contextlib.contextmanager
def _output_layer(inner, stand_in):
    original = inner.get_output_embeddings()
    inner.set_output_embeddings(stand_in)
    try:
        yield
    finally:
        inner.set_output_embeddings(original)


def response_token_stats(model, prompts: list[list[int]], responses: list[list[int]], pad_id: int,
                         temperature: torch.Tensor | list[float] | float = 1.0,
                         chunk_tokens: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-probs, entropies), (B, R) float32 each, of the response tokens under
    softmax(logits / temperature); temperature is one float or one per row. Positions past a row's
    response hold finite filler (mask them). chunk_tokens: rows x positions projected at once (0: all)."""
    device = model_device(model)
    rows, width = len(responses), max(len(r) for r in responses)
    sequences = [p + r for p, r in zip(prompts, responses)]
    input_ids = pad_rows(sequences, pad_id, torch.long).to(device)  # (B, T), right padded
    attention = pad_rows([[1] * len(s) for s in sequences], 0, torch.long).to(device)
    last = input_ids.shape[1] - 1
    positions = torch.tensor([[min(len(p) - 1 + r, last) for r in range(width)] for p in prompts], device=device)
    targets = pad_rows(responses, pad_id, torch.long).to(device)  # (B, R)
    temperature = torch.as_tensor(temperature, dtype=torch.float32, device=device).expand(rows)
    inner = unwrapped(model)
    head = _ResponseStatsHead(inner.get_output_embeddings(), positions, targets, temperature, chunk_tokens)
    with _output_layer(inner, head):
        stats = model(input_ids=input_ids, attention_mask=attention).logits  # (B, R, 2)
    return stats[..., 0].float(), stats[..., 1].detach().float()


def full_vocabulary_stats(model, prompts: list[list[int]], responses: list[list[int]], pad_id: int,
                          temperature: torch.Tensor | list[float] | float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """What `response_token_stats` computes, from the whole (B, R, V) logits at once (the reference)."""
    from oarctl.losses import entropy_from_logits

    logits = response_logits(model, prompts, responses, pad_id)
    temperature = torch.as_tensor(temperature, dtype=torch.float32, device=logits.device).expand(len(responses))
    logprobs = token_logprobs(logits, pad_rows(responses, pad_id, torch.long).to(logits.device), temperature)
    with torch.no_grad():
        entropy = entropy_from_logits(logits.float() / temperature[:, None, None])
    return logprobs, entropy


def teacher_forced_logprobs(model, prompts: list[list[int]], responses: list[list[int]], pad_id: int,
                            temperature: float = 1.0) -> list[list[float]]:
    """log_softmax(logits / temperature) of given response tokens, one list per response, no gradients:
    what the update stage recomputes (`response_token_stats`). Used by oarctl.policy.canary and the
    tests, never in an engine's process."""
    with torch.no_grad():
        logprobs, _ = response_token_stats(model, prompts, responses, pad_id, temperature)
    return [logprobs[row, :len(response)].tolist() for row, response in enumerate(responses)]
