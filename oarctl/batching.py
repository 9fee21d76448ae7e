"""Micro-batch plans of one optimizer step: which rows each forward/backward takes, on which rank, and
with what weight.

A mini-batch is dealt row by row over the ranks (row i goes to rank i % ranks), and each rank cuts
its shard into micro-batches, either `micro_batch_size` rows at a time or, with a token budget,
longest rows first while rows x longest row stays within the budget. Each micro-batch loss is
scaled by its exact share of the mini-batch loss (sequences for the seq-mean modes, response tokens
for token-mean), so the summed gradients equal those of one forward over the whole mini-batch
however the rows are cut or spread. With one rank and no token budget, the micro-batches are the
consecutive slices of the mini-batch, as before ranks existed.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MicroBatch:
    rows: tuple[int, ...]  # indices into the mini-batch
    numerator: int  # the micro-batch loss is scaled by numerator / denominator; 0 for a filler
    denominator: int

    @property
    def filler(self) -> bool:
        return self.numerator == 0


def row_tokens(row: dict) -> int:
    """Width of the row in the (B, T) input: prompt + response tokens."""
    return len(row["prompt_token_ids"]) + len(row["response_token_ids"])


def fixed_size(indices: list[int], size: int) -> list[list[int]]:
    return [indices[start:start + size] for start in range(0, len(indices), size)]


def token_budget(indices: list[int], widths: list[int], budget: int) -> list[list[int]]:
    """Longest first (ties by position, so the packing is deterministic), packed while rows x the
    longest row <= budget: what the padded (B, T) tensors cost, which bounds the sum of tokens too.
    A row wider than the budget alone gets a micro-batch of its own."""
    order = sorted(indices, key=lambda i: (-widths[i], i))
    groups, current = [], []
    for index in order:
        if current and (len(current) + 1) * widths[current[0]] > budget:
            groups.append(current)
            current = []
        current.append(index)
    return groups + [current] if current else groups


def loss_share(rows: list[dict], micro: list[int], aggregation: str) -> tuple[int, int]:
    """(numerator, denominator) making the micro-batch losses sum to the mini-batch loss."""
    if aggregation == "token-mean":  # a mean over all tokens: weigh by tokens
        tokens = [len(row["response_token_ids"]) for row in rows]
        return sum(tokens[i] for i in micro), sum(tokens)
    return len(micro), len(rows)  # a mean over sequences (every response has >= 1 token)


def plan_step(rows: list[dict], config, rank: int = 0, ranks: int = 1) -> list[MicroBatch]:
    """This rank's micro-batches of the mini-batch `rows` (an UpdateConfig gives the sizes)."""
    shard = list(range(rank, len(rows), ranks))
    if config.micro_batch_tokens:
        groups = token_budget(shard, [row_tokens(row) for row in rows], config.micro_batch_tokens)
    else:
        groups = fixed_size(shard, config.micro_batch_size)
    return [MicroBatch(tuple(group), *loss_share(rows, group, config.loss_aggregation)) for group in groups]


def pad_plan(plan: list[MicroBatch], count: int) -> list[MicroBatch]:
    """Append zero-weight micro-batches (row 0 again) up to `count`: under FSDP and ZeRO-3 every
    forward gathers parameters collectively, so all ranks must run the same number of them."""
    return plan + [MicroBatch((0,), 0, 1)] * (count - len(plan))
