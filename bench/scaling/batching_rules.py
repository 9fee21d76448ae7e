"""The code's own batching rules, mirrored (tests/test_scale.py checks them against oarctl)."""
from __future__ import annotations

import math

import numpy as np

from oarctl.batching import fixed_size, token_budget  # (no torch)


def batches_within(indices: list[int], widths, batch_size: int, max_batch_tokens: int) -> list[list[int]]:
    """oarctl.attribution.oar.batches_within: token budget (longest first), then batch_size rows."""
    groups = token_budget(indices, list(widths), max_batch_tokens) if max_batch_tokens else [indices]
    return [batch for g in groups for batch in fixed_size(g, batch_size)]


def chunk_rows(first: int, end: int, chunk_size: int, max_batch_tokens: int) -> int:
    """oarctl.attribution.oar.chunk_rows: chunk_size perturbed rows, fewer under the token budget."""
    if not max_batch_tokens:
        return chunk_size
    return max(1, min(chunk_size, max_batch_tokens // max(1, end - first)))


def perturbation_chunks(starts: np.ndarray, end: int, chunk_size: int, max_batch_tokens: int) -> list[tuple[int, int]]:
    """(first start, rows) of every chunk of the sorted perturbations (oar._perturbation_chunks)."""
    chunks, index = [], 0
    while index < len(starts):
        rows = min(chunk_rows(int(starts[index]), end, chunk_size, max_batch_tokens), len(starts) - index)
        chunks.append((int(starts[index]), rows))
        index += rows
    return chunks


def windows(reasoning_start: int, reasoning_end: int, span_tokens: int, max_perturbations: int) -> np.ndarray:
    """Starts of oar_p_span's windows (oar_p_cheap.windows): span_tokens wide, wider so that there are
    at most max_perturbations."""
    width = max(span_tokens, math.ceil((reasoning_end - reasoning_start) / max_perturbations))
    return np.arange(reasoning_start, reasoning_end, width)


def screened_count(reasoning: int, screen_fraction: float, audit_fraction: float, max_perturbations: int) -> int:
    """oar_p_screened's perturbations (oar_p_cheap.screened_positions): top = min(R, cap, max(1, ceil(f R)));
    audit = min(R - top, cap - top, round(a (R - top)))."""
    top = min(reasoning, max_perturbations, max(1, math.ceil(screen_fraction * reasoning)))
    audit = min(reasoning - top, max_perturbations - top, round(audit_fraction * (reasoning - top)))
    return top + audit


def local_chunks(prompt: int, reasoning: int, horizon: int, chunk_size: int,
                 max_batch_tokens: int) -> list[tuple[int, int]]:
    """(last start, rows) of every forward of oar_flow_local's rows (flow_local.local_drops with
    local_rows_per_call): chunk_size x max(1, R // (2 horizon)) rows, fewer where rows x (prefix +
    horizon) keys exceed the budget (the last row's prefix counts)."""
    per_call = chunk_size * max(1, reasoning // (2 * horizon))
    chunks, row = [], 0
    while row < reasoning:
        rows = min(per_call, reasoning - row)
        if max_batch_tokens:
            rows = max(1, min(rows, max_batch_tokens // (prompt + row + horizon)))
            while rows > 1 and rows * (prompt + row + rows - 1 + horizon) > max_batch_tokens:
                rows -= 1
        chunks.append((prompt + row + rows - 1, rows))
        row += rows
    return chunks
