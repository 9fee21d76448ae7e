"""The toy task families by name (data.toy_family): their problem streams and level lists."""
from __future__ import annotations

from typing import Iterator

from oarctl.toy import chains, task

FAMILIES = {"arithmetic": task.iter_problems, "chains": chains.iter_problems,
            "chains_wide": chains.iter_wide_problems}
DEFAULT_LEVELS = {"arithmetic": task.DEFAULT_LEVELS, "chains": chains.DEFAULT_LENGTHS,
                  "chains_wide": chains.WIDE_LENGTHS}
CHAIN_FAMILIES = ("chains", "chains_wide")  # their levels are data.chain_lengths; they carry token_truth


def iter_problems(family: str, seed: int, levels) -> Iterator[dict]:
    """Endless seeded stream of a family's problems; `levels` are its levels (chains: lengths)."""
    return FAMILIES[family](seed, tuple(levels))


def configured_levels(data_config) -> list[int]:
    """The levels the data section asks for: data.toy_levels, or data.chain_lengths for the chains families."""
    return data_config.chain_lengths if data_config.toy_family in CHAIN_FAMILIES else data_config.toy_levels
