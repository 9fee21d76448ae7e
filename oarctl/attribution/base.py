"""The attribution registry and what every method shares: one signature, one registry, the segmented
rollout a method receives and the shape of the scores it returns.

Every method maps segmented rollouts (`Rollout`: spans and the attributed sequence), the verified
table, the `attribute` config section and the stage context (seed, step, policy) to one raw score
per response token: a score on reasoning tokens, NaN on the others (conclude, answer, closing
brace, eos), which keep the plain GRPO advantage.

This module imports no method, so a method module registers itself here without a circle through
the package; `import oarctl.attribution` imports every method (the full registry).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from oarctl.attribution.segments import Segments, attributed_sequence, segment, sequence_spans
from oarctl.registry import Registry

ATTRIBUTION_METHODS = Registry("attribution method")

Span = tuple[int, int]


@dataclass(frozen=True)
class Rollout:
    """One table row, segmented: the attributed sequence and its absolute spans."""
    segments: Segments
    input_ids: torch.Tensor  # (T,) prompt + reasoning + conclude + answer (or + probe)
    reasoning: Span
    answer: Span
    response_length: int
    row: int  # index in the table: seeds the row's noise, wherever (on whichever rank) it is scored


def segment_rows(table, tokenizer) -> list[Rollout]:
    """Segment every row of a verified table from its sampled token ids."""
    rows = []
    pairs = zip(table["prompt_token_ids"].to_pylist(), table["response_token_ids"].to_pylist())
    for row, (prompt, response) in enumerate(pairs):
        segments = segment(response, tokenizer)
        spans = sequence_spans(len(prompt), segments)
        ids = torch.tensor(attributed_sequence(prompt, response, segments), dtype=torch.long)
        rows.append(Rollout(segments, ids, spans["reasoning"], spans["answer"], len(response), row))
    return rows


def row_seed(seed: int, step: int, row: int) -> int:
    """The noise seed of one row: independent streams per (run seed, step, row)."""
    return int(np.random.SeedSequence([seed, step, row]).generate_state(1)[0])


def on_reasoning(rollout, values) -> np.ndarray:
    """Scores in place on the reasoning tokens, NaN on the others (they keep the plain advantage)."""
    full = np.full(rollout.response_length, np.nan, dtype=np.float32)
    start, end = rollout.segments.reasoning
    full[start:end] = values
    return full
