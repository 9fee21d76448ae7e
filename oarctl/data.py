"""Prompt sets: the generated toy task, or the user's prompts as they have them.

One reader serves every door (`oarctl run`'s data.train / data.heldout / evaluate.benchmarks, and the
PROMPTS argument of `oarctl sample` and `oarctl evaluate`): a JSONL, JSON or Parquet file, a folder
written by `datasets`' `save_to_disk`, or a Hugging Face dataset name (`name[:config]:split`, offline
from the local cache when HF_DATASETS_OFFLINE=1). Whatever the source, the result is a `prompts`
table (prompt_id, problem, answer, and `messages` for chat-format prompts) that is written once as a
Parquet file, so every later stage hashes a file and not a generator.

Columns: data.problem_column / answer_column / id_column; left at their defaults, a source without
`problem` or `answer` has its column found among common names (question, prompt, solution, ...) and
the choice is said on stderr. A row without an id gets `prompt_id` from a stable hash of its problem
(the same problem gets the same id in any file, at any row). A problem may be a list of chat
messages ({"role", "content"}), as TRL takes prompts: `problem` is then its last user turn and
`messages` the whole list (JSON), which sample and evaluate encode with the policy's chat template.
Rows with an empty answer are dropped (and counted); data.levels keeps only training rows of the
listed difficulty levels.
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


# ---- readers: each gives (columns, rows), rows as (where, number, row) with `where` naming the
# ---- file and line/row for errors

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


def _dataset_rows(dataset, where: str):
    for index, row in enumerate(dataset):
        yield f"{where}: row {index}", index, row


def _saved_rows(path: Path, option: str, default_split: str):
    """A folder written by `Dataset.save_to_disk` (dataset_info.json + state.json), or by
    `DatasetDict.save_to_disk` (dataset_dict.json, one folder per split: `default_split` is read)."""
    if not (path / "dataset_dict.json").is_file() and not (path / "state.json").is_file():
        raise OarError(f"{path}: is a folder but not a dataset saved by datasets' save_to_disk (no state.json "
                       f"or dataset_dict.json); expected that, or a JSONL, JSON or Parquet file ({option})")
    from datasets import DatasetDict, load_from_disk

    try:
        dataset = load_from_disk(str(path))
    except Exception as error:  # noqa: BLE001 - datasets raises many types; all mean "cannot read"
        first = (str(error).splitlines() or [type(error).__name__])[0]
        raise OarError(f"{path}: cannot read the saved dataset ({first}) ({option})") from None
    if isinstance(dataset, DatasetDict):
        if default_split not in dataset:
            raise OarError(f"{path}: has splits {', '.join(dataset)}, not {default_split!r} "
                           f"(data.train_split / data.heldout_split choose; {option})")
        return _dataset_rows(dataset[default_split], f"{path} [{default_split}]")
    return _dataset_rows(dataset, str(path))


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
    return _dataset_rows(dataset, source)


def _rows(source: str, option: str, default_split: str):
    path = Path(source)
    if path.is_dir():
        return _saved_rows(path, option, default_split)
    if path.exists():
        readers = {".jsonl": _jsonl_rows, ".json": _json_rows, ".parquet": _parquet_rows}
        if path.suffix not in readers:
            raise OarError(f"{path}: unknown data file type {path.suffix!r}; expected .jsonl, .json or "
                           f".parquet, or a folder saved by datasets ({option})")
        return readers[path.suffix](path)
    if path.suffix in FILE_SUFFIXES or source.startswith((".", "/", "~")):
        raise OarError(f"{path}: data file not found ({option})")
    return _hub_rows(source, option, default_split)


# ---- columns: configured, or found among common names --------------------------------------------

# Tried in order when data.problem_column / answer_column are left at their defaults ("problem",
# "answer") and the source has no such column: the names of common math and TRL datasets.
PROBLEM_COLUMNS = ("problem", "question", "prompt", "query", "instruction", "input")
ANSWER_COLUMNS = ("answer", "final_answer", "solution", "ground_truth", "target", "output")


def _column(columns: list[str], key: str, candidates: tuple, data_config, source: str) -> str:
    """The column of data.<key>: the configured one, else (at the default) the first common name present."""
    configured = getattr(data_config, key)
    if configured in columns:
        return configured
    from oarctl.schema import DataConfig

    found = [name for name in candidates if name in columns]
    if configured != getattr(DataConfig, key) or not found:
        looked = "" if configured != getattr(DataConfig, key) else f"; nor {', '.join(candidates[1:])}"
        raise OarError(f"{source}: missing column {configured!r} (data.{key}{looked}); "
                       f"its columns: {', '.join(columns) or 'none'}")
    return found[0]


def _columns(first_row: dict, data_config, source: str, option: str, log) -> tuple[str, str]:
    columns = list(first_row)
    problem = _column(columns, "problem_column", PROBLEM_COLUMNS, data_config, source)
    answer = _column(columns, "answer_column", ANSWER_COLUMNS, data_config, source)
    if (problem, answer) != (data_config.problem_column, data_config.answer_column):
        log(f"{option}: {source}: problems from column {problem!r}, answers from column {answer!r} "
            f"(set data.problem_column / data.answer_column to choose others)")
    return problem, answer


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


def _is_message(item) -> bool:
    return isinstance(item, dict) and isinstance(item.get("role"), str) and isinstance(item.get("content"), str)


def _problem(row: dict, column: str, where: str) -> tuple[str, str]:
    """(problem text, messages JSON or ""): a chat-format problem is a list of {"role", "content"}
    messages, as TRL takes prompts; its text is the last user turn (what verify and reports show)."""
    value = row.get(column)
    if isinstance(value, list) and value and all(map(_is_message, value)):
        users = [message["content"] for message in value if message["role"] == "user"]
        if not users:
            raise OarError(f"{where}: column {column!r}: a chat-format prompt needs a 'user' message")
        messages = [{"role": m["role"], "content": m["content"]} for m in value]
        problem, chat = users[-1], json.dumps(messages, ensure_ascii=False)
    elif isinstance(value, str):
        problem, chat = value, ""
    else:
        raise OarError(f"{where}: missing or non-text field {column!r} (expected text, or a list of "
                       f"chat messages with 'role' and 'content')")
    if not problem.strip():
        raise OarError(f"{where}: empty problem (column {column!r})")
    return problem, chat


def problem_id(problem: str) -> str:
    """A stable id from the problem text alone: the same problem has it in any file and at any row."""
    import hashlib

    return "p-" + hashlib.sha256(problem.encode()).hexdigest()[:12]


def _level(row: dict) -> int | None:
    """An int level, or 'Level 3' as the MATH release writes it; None when absent or unreadable."""
    value = row.get("level")
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    match = re.fullmatch(r"\s*(?:level\s*)?(\d+)\s*", value, re.I) if isinstance(value, str) else None
    return int(match.group(1)) if match else None


def _warn(message: str) -> None:
    print(message, file=sys.stderr)


def _row_id(row: dict, data_config, where: str, problem: str, chat: str, ids: dict) -> str:
    """The row's id column, else its prompt_id, else the problem's hash (`-2`, `-3` for repeats)."""
    given = _text(row, data_config.id_column, where, required=False)
    given = given if given is not None else _text(row, "prompt_id", where, required=False)
    if given is not None:
        if given in ids:
            raise OarError(f"{where}: duplicate id {given!r} (column {data_config.id_column!r})")
        ids[given] = 1
        return given
    base = problem_id(chat or problem)
    ids[base] = ids.get(base, 0) + 1
    return base if ids[base] == 1 else f"{base}-{ids[base]}"


def read_prompts(source: str, option: str, data_config, *, default_split: str, levels=(), log=_warn) -> pa.Table:
    """A prompts table from a file, a saved dataset folder or a hub dataset, with the column mapping
    of `data_config`."""
    kept, empty, off_level, ids, columns = [], 0, 0, {}, None
    for where, _, row in _rows(source, option, default_split):
        if columns is None:
            columns = _columns(row, data_config, source, option, log)
        problem_column, answer_column = columns
        problem, chat = _problem(row, problem_column, where)
        # a null answer (math_train has two) is an empty answer: dropped and counted, not an error
        answer = _text(row, answer_column, where, required=answer_column not in row) or ""
        if levels and _level(row) not in levels:
            off_level += 1
            continue
        if not answer.strip():  # unanswerable rows would only ever score 0
            empty += 1
            continue
        kept.append((_row_id(row, data_config, where, problem, chat, ids), problem, answer, chat))
    if empty or off_level:
        log(f"{option}: kept {len(kept)} rows of {source}"
            + (f"; dropped {off_level} outside data.levels {list(levels)}" if off_level else "")
            + (f"; dropped {empty} with an empty answer" if empty else ""))
    if not kept:
        if empty and not off_level:
            raise OarError(f"{source}: column {columns[1]!r} is empty in every row ({option})")
        filtered = " left after the filters" if empty or off_level else ""
        raise OarError(f"{source}: has no rows{filtered} ({option})")
    return _prompts_table(kept)


def _prompts_table(kept: list[tuple]) -> pa.Table:
    """`messages` only when some prompt is chat-format ("" for the others), so plain prompt sets keep
    their bytes (and the stages reading them their cache keys)."""
    columns = {"prompt_id": [k[0] for k in kept], "problem": [k[1] for k in kept], "answer": [k[2] for k in kept]}
    if any(k[3] for k in kept):
        columns["messages"] = [k[3] for k in kept]
    return make_table(columns, "prompts")


def load_prompts(source: str, split: str, config, log=_warn) -> pa.Table:
    """A prompts table from 'toy', a file path (.jsonl, .json, .parquet), a folder saved by datasets,
    or a hub dataset name."""
    if source == "toy":
        count = config.data.toy_train_size if split == "train" else config.data.toy_heldout_size
        from oarctl.toy.families import configured_levels

        seed = config.run.seed if split == "train" else config.data.toy_heldout_seed
        return toy_prompts(split, count, configured_levels(config.data), seed, config.data.toy_family)
    return read_prompts(source, f"data.{split}", config.data, default_split=getattr(config.data, f"{split}_split"),
                        levels=config.data.levels if split == "train" else (), log=log)


def _with_messages(table: pa.Table) -> pa.Table:
    if "messages" in table.column_names:
        return table
    return table.append_column("messages", pa.array([""] * table.num_rows, pa.string()))


def load_benchmarks(config, log=_warn) -> pa.Table:
    """All of evaluate.benchmarks in one prompts table, plus a `benchmark` column naming each row's set."""
    tables = []
    for name, source in config.evaluate.benchmarks.items():
        table = read_prompts(source, f"evaluate.benchmarks.{name}", config.data,
                             default_split=config.data.heldout_split, log=log)
        tables.append(table.append_column("benchmark", pa.array([name] * table.num_rows, pa.string())))
    if any("messages" in table.column_names for table in tables):  # one schema for all of them
        tables = [_with_messages(table).select(["prompt_id", "problem", "answer", "messages", "benchmark"])
                  for table in tables]
    return pa.concat_tables(tables)


# ---- a stage command's PROMPTS argument ----------------------------------------------------------

def _is_prompts_file(path: Path, data_config) -> bool:
    """A Parquet file that already is a prompts table (as `oarctl run` and `oarctl toy prompts` write)."""
    import pyarrow.parquet as pq

    from oarctl.schema import DataConfig

    if path.suffix != ".parquet" or not path.is_file():
        return False
    if (data_config.problem_column, data_config.answer_column) != (DataConfig.problem_column, DataConfig.answer_column):
        return False
    try:
        names = pq.read_schema(path).names
    except (pa.ArrowInvalid, OSError):
        return False  # read_prompts says what is wrong with it
    return {"prompt_id", "problem", "answer"} <= set(names)


def stage_prompts(source: str, output: Path, config, split: str, log=_warn) -> Path:
    """The prompts file `oarctl sample` / `oarctl evaluate` read for SOURCE: the file itself when it
    already is a prompts table, else SOURCE read as `oarctl run` reads data.<split> and written beside
    OUTPUT as `<output stem>.prompts.parquet` (rewritten only when its content changed, so the stage's
    cache key stays put). The same source gives the same file, and the same stage output, as in a run."""
    import pyarrow.parquet as pq

    from oarctl.artifacts import write_parquet

    path = Path(source)
    if _is_prompts_file(path, config.data):
        return path
    table = load_prompts(source, split, config, log=log)
    target = output.with_name(output.stem + ".prompts.parquet")
    if not target.exists() or not pq.read_table(target).equals(table):
        write_parquet(table, target)
    log(f"prompts: {table.num_rows} rows of {source} -> {target}")
    return target
