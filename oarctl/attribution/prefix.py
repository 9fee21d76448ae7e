"""A prompt's key/value cache reused read-only, and layer-by-layer recomputation (checkpointing).

OAR-P and OAR-G run the shared part of a sequence (the prompt, or the clean prefix left of a
perturbation) once and feed its keys and values to the rows that continue it. transformers'
DynamicCache appends each layer's new keys and values to the cache it is given. That breaks
gradient checkpointing: the backward pass replays each layer, which appends a second time (a size
mismatch in attention), so transformers drops the cache altogether in training mode.
`FrozenPrefix` returns prefix + new keys/values without storing them, so a replay sees exactly
what the first pass saw, and `checkpointed_layers` recomputes each decoder layer in the backward
pass while the model stays in eval mode (no dropout, the cache kept). Scores are identical; the
backward keeps one layer input per layer instead of every intermediate.
"""
from __future__ import annotations

import contextlib
import functools

import torch
from torch.utils.checkpoint import checkpoint
from transformers import DynamicCache


class FrozenPrefix(DynamicCache):
    """A DynamicCache that never grows: `update` returns prefix + new states and keeps the prefix."""

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        layer = self.layers[layer_idx]
        return torch.cat([layer.keys, key_states], dim=-2), torch.cat([layer.values, value_states], dim=-2)


def frozen_prefix(cache: DynamicCache, config, length: int | None = None, rows: int | None = None,
                  select: torch.Tensor | None = None) -> FrozenPrefix | None:
    """The first `length` positions of `cache` (all by default), as rows `select` of it or its one row
    expanded to `rows` (a view: no copy); None for an empty prefix (the model then needs use_cache=False)."""
    if any(getattr(layer, "is_sliding", False) for layer in cache.layers):
        raise NotImplementedError("OAR prefix reuse needs full-attention layers; this model has sliding ones")
    length = cache.get_seq_length() if length is None else length
    if length == 0:
        return None

    def part(tensor: torch.Tensor) -> torch.Tensor:
        tensor = tensor[:, :, :length]  # (B, heads, length, head_dim)
        if select is not None:
            return tensor[select]
        return tensor.expand(rows, -1, -1, -1) if rows is not None else tensor

    return FrozenPrefix([(part(layer.keys), part(layer.values)) for layer in cache.layers], config=config)


def decoder_layers(model) -> torch.nn.ModuleList:
    return model.get_decoder().layers


def _recomputed(forward, *args, **kwargs):
    return checkpoint(forward, *args, use_reentrant=False, **kwargs)


@contextlib.contextmanager
def checkpointed_layers(model, enabled: bool = True):
    """Inside, every decoder layer keeps only its input for the backward pass and is recomputed there."""
    layers = list(decoder_layers(model)) if enabled else []
    for layer in layers:
        layer.forward = functools.partial(_recomputed, layer.forward)  # the instance attribute wins
    try:
        yield
    finally:
        for layer in layers:
            del layer.forward
