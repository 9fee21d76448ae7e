"""Prompt sets: the generated toy task, a local JSONL / JSON / Parquet file, or a Hugging Face dataset.

Whatever the source, the result is a `prompts` table (prompt_id, problem, answer) that the run
writes once into its folder, so every later stage hashes a file and not a generator. Columns are
mapped with data.problem_column / answer_column / id_column; rows with an empty answer are dropped
(and counted), and data.levels keeps only training rows of the listed difficulty levels.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pyarrow as pa

from oarctl.artifacts import make_table
from oarctl.errors import OarError

TOY_SEEDS = {"train": 1, "heldout": 2}
FILE_SUFFIXES = (".jsonl", ".json", ".parquet")


def toy_prompts(split: str, count: int, levels, seed: int = 0, family: str = "arithmetic") -> pa.Table:
    """Distinct generated problems of a toy family; the held-out split draws only from the reserved
    hash share, which pretraining of the base policies never saw, and train only from the rest."""
    from oarctl.toy.families import iter_problems
    from oarctl.toy.task import is_reserved

    want_reserved = split == "heldout"
    rows, seen, draws = [], set(), 0
    for item in iter_problems(family, seed * 10 + TOY_SEEDS[split], levels):
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


# ---- readers: each yields (where, row) with `where` naming the file and line/row for errors ------

def _jsonl_rows(path: Path):
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            raise OarError(f"{path}: line {number}: not valid JSON") from None
        if not isinstance(row, dict):
            raise OarError(f"{path}: line {number}: expected a JSON object")
        yield f"{path}: line {number}", number, row


def _json_rows(path: Path):
    try:
        document = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise OarError(f"{path}: not valid JSON (line {error.lineno})") from None
    if not isinstance(document, list):
        raise OarError(f"{path}: expected a JSON list of objects (one per problem)")
    for index, row in enumerate(document):
        if not isinstance(row, dict):
            raise OarError(f"{path}: row {index}: expected a JSON object")
        yield f"{path}: row {index}", index, row


def _parquet_rows(path: Path):
    from oarctl.artifacts import _open_parquet

    for index, row in enumerate(_open_parquet(path).to_pylist()):
        yield f"{path}: row {index}", index, row


def _hub_rows(source: str, option: str, default_split: str):
    """`name`, `name:split` or `name:config:split`, through datasets.load_dataset (cache or network)."""
    parts = source.split(":")
    if len(parts) > 3 or not all(parts):
        raise OarError(f"{option}: {source!r}: expected a file path or a hub dataset name[:config]:split")
    name, subset = parts[0], (parts[1] if len(parts) == 3 else None)
    split = parts[-1] if len(parts) > 1 else default_split
    from datasets import load_dataset

    try:
        dataset = load_dataset(name, subset, split=split)
    except Exception as error:  # noqa: BLE001 - datasets raises many types; all mean "cannot load"
        first = (str(error).splitlines() or [type(error).__name__])[0]
        raise OarError(f"{option}: cannot load Hugging Face dataset {source!r} ({first})") from None
    for index, row in enumerate(dataset):
        yield f"{source}: row {index}", index, row


def _rows(source: str, option: str, default_split: str):
    path = Path(source)
    if path.is_dir():
        raise OarError(f"{path}: is a directory, expected a JSONL, JSON or Parquet file ({option})")
    if path.exists():
        readers = {".jsonl": _jsonl_rows, ".json": _json_rows, ".parquet": _parquet_rows}
        if path.suffix not in readers:
            raise OarError(f"{path}: unknown data file type {path.suffix!r}; "
                           f"expected .jsonl, .json or .parquet ({option})")
        return readers[path.suffix](path)
    if path.suffix in FILE_SUFFIXES or source.startswith((".", "/", "~")):
        raise OarError(f"{path}: data file not found ({option})")
    return _hub_rows(source, option, default_split)


# ---- rows -> prompts --------------------------------------------------------------------------

def _text(row: dict, column: str, where: str, required: bool = True):
    value = row.get(column)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)  # numeric gold answers (GSM8K-style) are read as their text
    if not isinstance(value, str):
        if not required and value is None:
            return None
        raise OarError(f"{where}: missing or non-text field {column!r}")
    return value


def _level(row: dict) -> int | None:
    """An int level, or 'Level 3' as the MATH release writes it; None when absent or unreadable."""
    value = row.get("level")
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    match = re.fullmatch(r"\s*(?:level\s*)?(\d+)\s*", value, re.I) if isinstance(value, str) else None
    return int(match.group(1)) if match else None


def _warn(message: str) -> None:
    print(message, file=sys.stderr)


def read_prompts(source: str, option: str, data_config, *, default_split: str, levels=(), log=_warn) -> pa.Table:
    """A prompts table from a file or hub dataset, with the column mapping of `data_config`."""
    kept, empty, off_level, ids = [], 0, 0, set()
    stem = Path(source).stem if Path(source).suffix in FILE_SUFFIXES else source.replace("/", "_")
    for where, number, row in _rows(source, option, default_split):
        problem = _text(row, data_config.problem_column, where)
        # a null answer (math_train has two) is an empty answer: dropped and counted, not an error
        answer = _text(row, data_config.answer_column, where, required=data_config.answer_column not in row) or ""
        if levels and _level(row) not in levels:
            off_level += 1
            continue
        if not answer.strip():  # unanswerable rows would only ever score 0
            empty += 1
            continue
        prompt_id = _text(row, data_config.id_column, where, required=False)
        if prompt_id is None:
            prompt_id = _text(row, "prompt_id", where, required=False) or f"{stem}-{number}"
        if prompt_id in ids:
            raise OarError(f"{where}: duplicate id {prompt_id!r} (column {data_config.id_column!r})")
        ids.add(prompt_id)
        kept.append((prompt_id, problem, answer))
    if empty or off_level:
        log(f"{option}: kept {len(kept)} rows of {source}"
            + (f"; dropped {off_level} outside data.levels {list(levels)}" if off_level else "")
            + (f"; dropped {empty} with an empty answer" if empty else ""))
    if not kept:
        filtered = " left after the filters" if empty or off_level else ""
        raise OarError(f"{source}: has no rows{filtered} ({option})")
    return make_table({"prompt_id": [k[0] for k in kept], "problem": [k[1] for k in kept],
                       "answer": [k[2] for k in kept]}, "prompts")


def load_prompts(source: str, split: str, config, log=_warn) -> pa.Table:
    """A prompts table from 'toy', a file path (.jsonl, .json, .parquet) or a hub dataset name."""
    if source == "toy":
        count = config.data.toy_train_size if split == "train" else config.data.toy_heldout_size
        from oarctl.toy.families import configured_levels

        seed = config.run.seed if split == "train" else config.data.toy_heldout_seed
        return toy_prompts(split, count, configured_levels(config.data), seed, config.data.toy_family)
    return read_prompts(source, f"data.{split}", config.data, default_split=getattr(config.data, f"{split}_split"),
                        levels=config.data.levels if split == "train" else (), log=log)


def load_benchmarks(config, log=_warn) -> pa.Table:
    """All of evaluate.benchmarks in one prompts table, plus a `benchmark` column naming each row's set."""
    tables = []
    for name, source in config.evaluate.benchmarks.items():
        table = read_prompts(source, f"evaluate.benchmarks.{name}", config.data,
                             default_split=config.data.heldout_split, log=log)
        tables.append(table.append_column("benchmark", pa.array([name] * table.num_rows, pa.string())))
    return pa.concat_tables(tables)
