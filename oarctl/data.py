"""Prompt sets: the generated toy task, or a user's JSONL / Parquet file with problem and answer.

Whatever the source, the result is a `prompts` table (prompt_id, problem, answer) that the run
writes once into its folder, so every later stage hashes a file and not a generator.
"""
from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa

from oarctl.artifacts import make_table, read_artifact
from oarctl.errors import OarError

TOY_SEEDS = {"train": 1, "heldout": 2}


def toy_prompts(split: str, count: int, levels, seed: int = 0) -> pa.Table:
    """Distinct generated problems; the held-out split draws only from the reserved hash share,
    which pretraining of the base policy never saw, and train only from the rest."""
    from oarctl.toy.task import is_reserved, iter_problems

    want_reserved = split == "heldout"
    rows, seen, draws = [], set(), 0
    for item in iter_problems(seed * 10 + TOY_SEEDS[split], tuple(levels)):
        draws += 1
        if is_reserved(item["problem"]) == want_reserved and item["problem"] not in seen:
            seen.add(item["problem"])
            rows.append({"prompt_id": f"toy-{split}-{len(rows)}", **item})
        if len(rows) == count:
            break
        if draws > 200 * count + 10_000:  # the levels' problem space is smaller than asked
            raise OarError(f"data.toy_{split}_size: only {len(rows)} distinct {split} problems found "
                           f"for levels {list(levels)}; ask for fewer")
    return make_table({k: [r[k] for r in rows] for k in ("prompt_id", "problem", "answer")}, "prompts")


def _read_jsonl(path: Path) -> pa.Table:
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            raise OarError(f"{path}: line {number}: not valid JSON") from None
        missing = [k for k in ("problem", "answer") if not isinstance(row.get(k), str)]
        if missing:
            raise OarError(f"{path}: line {number}: missing or non-text field {missing[0]!r}")
        rows.append({"prompt_id": str(row.get("id", row.get("prompt_id", f"{path.stem}-{number}"))),
                     "problem": row["problem"], "answer": row["answer"]})
    if not rows:
        raise OarError(f"{path}: has no rows")
    return make_table({k: [r[k] for r in rows] for k in ("prompt_id", "problem", "answer")}, "prompts")


def load_prompts(source: str, split: str, config) -> pa.Table:
    """A prompts table from 'toy' or a file path (.jsonl or .parquet)."""
    if source == "toy":
        count = config.data.toy_train_size if split == "train" else config.data.toy_heldout_size
        return toy_prompts(split, count, config.data.toy_levels, config.run.seed)
    path = Path(source)
    if not path.exists():
        raise OarError(f"{path}: data file not found (data.{split})")
    if path.suffix == ".jsonl":
        return _read_jsonl(path)
    return read_artifact(path, "prompts").select(["prompt_id", "problem", "answer"])
