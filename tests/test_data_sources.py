"""Prompt sources: JSONL / JSON / Parquet files with a column mapping, level filter, empty answers,
hub names (offline: a fast one-line error), and the errors naming file, line and option."""
from __future__ import annotations

import json
import re
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from oarctl.config import load_config
from oarctl.data import load_benchmarks, load_prompts, problem_id
from oarctl.errors import OarError

ROWS = [{"id": "m-1", "problem": "P1", "answer": "1", "level": 3},
        {"id": "m-2", "problem": "P2", "answer": "", "level": 4},      # empty: dropped
        {"id": "m-3", "problem": "P3", "answer": None, "level": 5},    # null: dropped too
        {"id": "m-4", "problem": "P4", "answer": "4", "level": 1},
        {"id": "m-5", "problem": "P5", "answer": "5", "level": "Level 5"}]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def ids(table):
    return table["prompt_id"].to_pylist()


def test_jsonl_drops_empty_answers_and_logs_a_count(tmp_path):
    messages = []
    table = load_prompts(str(write_jsonl(tmp_path / "m.jsonl", ROWS)), "train", load_config(), log=messages.append)
    assert ids(table) == ["m-1", "m-4", "m-5"]
    assert table.column_names == ["prompt_id", "problem", "answer"]
    assert messages == [f"data.train: kept 3 rows of {tmp_path / 'm.jsonl'}; dropped 2 with an empty answer"]


def test_levels_filter_train_only_int_and_text_levels(tmp_path):
    path = str(write_jsonl(tmp_path / "m.jsonl", ROWS))
    config = load_config(None, ["data.levels=[3, 4, 5]"])
    messages = []
    assert ids(load_prompts(path, "train", config, log=messages.append)) == ["m-1", "m-5"]
    assert "dropped 1 outside data.levels [3, 4, 5]" in messages[0]
    assert ids(load_prompts(path, "heldout", config, log=messages.append)) == ["m-1", "m-4", "m-5"]


def test_json_list_and_parquet_with_a_column_mapping(tmp_path):
    mapped = [{"uid": f"q{i}", "question": f"Q{i}", "final": i} for i in range(3)]  # numeric answers
    (tmp_path / "q.json").write_text(json.dumps(mapped))
    pq.write_table(pa.Table.from_pylist(mapped), tmp_path / "q.parquet")
    config = load_config(None, ["data.problem_column=question", "data.answer_column=final", "data.id_column=uid"])
    for name in ("q.json", "q.parquet"):
        table = load_prompts(str(tmp_path / name), "train", config)
        assert table.to_pylist() == [{"prompt_id": f"q{i}", "problem": f"Q{i}", "answer": str(i)} for i in range(3)]


def test_ids_fall_back_to_prompt_id_then_the_problem_hash(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", [{"prompt_id": "x", "problem": "p", "answer": "1"},
                                       {"problem": "q", "answer": "2"}])
    assert ids(load_prompts(str(tmp_path / "a.jsonl"), "train", load_config())) == ["x", problem_id("q")]
    pq.write_table(pa.table({"problem": ["p", "q"], "answer": ["1", "2"]}), tmp_path / "b.parquet")
    assert ids(load_prompts(str(tmp_path / "b.parquet"), "train", load_config())) == [problem_id("p"), problem_id("q")]


@pytest.mark.parametrize("content, names", [
    ('{"problem": "p", "answer": "1"}\n{not json\n', ["line 2", "not valid JSON"]),
    ('{"problem": "p", "answer": "1"}\n\n{"answer": "1"}\n', ["line 3", "'problem'"]),
    ('{"problem": "p"}\n', ["missing column 'answer'", "data.answer_column"]),
    ('{"problem": ["p"], "answer": "1"}\n', ["line 1", "'problem'"]),
    ('[1, 2]\n', ["line 1", "JSON object"]),
    ('{"id": "a", "problem": "p", "answer": "1"}\n{"id": "a", "problem": "q", "answer": "2"}\n',
     ["line 2", "duplicate id 'a'"]),
    ('{"problem": "p", "answer": " "}\n', ["column 'answer' is empty in every row", "data.train"]),
    ('\n', ["has no rows"]),
])
def test_bad_jsonl_names_the_line(tmp_path, content, names):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(OarError) as error:
        load_prompts(str(path), "train", load_config(), log=lambda _: None)
    message = str(error.value)
    assert str(path) in message and "\n" not in message
    for name in names:
        assert name in message, message


def test_bad_parquet_and_json_files(tmp_path):
    (tmp_path / "x.parquet").write_text("not parquet")
    (tmp_path / "x.json").write_text('{"problem": "p"}')
    (tmp_path / "x.csv").write_text("problem,answer\n")
    for name, expected in [("x.parquet", "not a readable Parquet"), ("x.json", "JSON list"),
                           ("x.csv", "unknown data file type"), ("absent.jsonl", "data file not found (data.train)")]:
        with pytest.raises(OarError, match=re.escape(expected)):
            load_prompts(str(tmp_path / name), "train", load_config())


def test_hub_name_offline_fails_fast_naming_the_option():
    started = time.monotonic()
    with pytest.raises(OarError) as error:
        load_prompts("nobody-xyz/no-such-dataset:train", "train", load_config())
    assert time.monotonic() - started < 30
    message = str(error.value)
    assert message.startswith("data.train: cannot load Hugging Face dataset 'nobody-xyz/no-such-dataset:train'")
    assert "\n" not in message


def test_a_hub_name_goes_to_datasets_with_its_config_and_split_then_the_column_mapping(monkeypatch):
    """What datasets returns for a hub name is mapped like a file (no network: load_dataset is
    replaced by one returning a real in-memory Dataset, and records what it was asked)."""
    import datasets

    asked = []

    def load_dataset(name, subset, split):
        asked.append((name, subset, split))
        return datasets.Dataset.from_dict({"question": ["Q0", "Q1"], "final": [3, 4], "uid": ["a", "b"]})

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    config = load_config(None, ["data.problem_column=question", "data.answer_column=final", "data.id_column=uid"])
    table = load_prompts("someorg/math-set:hard:test", "train", config)
    assert table.to_pylist() == [{"prompt_id": "a", "problem": "Q0", "answer": "3"},
                                 {"prompt_id": "b", "problem": "Q1", "answer": "4"}]
    load_prompts("someorg/math-set", "train", config)
    assert asked == [("someorg/math-set", "hard", "test"), ("someorg/math-set", None, "train")]


def test_bad_hub_spec():
    with pytest.raises(OarError, match="name\\[:config\\]:split"):
        load_prompts("a:b:c:d", "heldout", load_config())


def test_benchmarks_table_names_each_row(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", ROWS[:1])
    write_jsonl(tmp_path / "b.jsonl", ROWS[3:])
    config = load_config(None, [f"evaluate.benchmarks={{alpha: {tmp_path / 'a.jsonl'}, beta: {tmp_path / 'b.jsonl'}}}"])
    table = load_benchmarks(config)
    assert table["benchmark"].to_pylist() == ["alpha", "beta", "beta"]
    assert ids(table) == ["m-1", "m-4", "m-5"]


def test_cli_run_with_a_parquet_train_set(cli, tiny_config, tmp_path, signal_data):
    rows = [json.loads(line) for line in signal_data["train"].read_text().splitlines()]
    pq.write_table(pa.table({"q": [r["problem"] for r in rows], "a": [r["answer"] for r in rows],
                             "level": [3 + i % 2 for i in range(len(rows))]}), tmp_path / "train.parquet")
    # the held-out file uses the same column mapping
    held = [json.loads(line) for line in signal_data["heldout"].read_text().splitlines()]
    pq.write_table(pa.table({"q": [r["problem"] for r in held], "a": [r["answer"] for r in held]}),
                   tmp_path / "held.parquet")
    config = tiny_config(signal=True, run={"steps": 1, "progress": False},
                         data={"train": str(tmp_path / "train.parquet"), "heldout": str(tmp_path / "held.parquet"),
                               "problem_column": "q", "answer_column": "a", "id_column": "none", "levels": [3]})
    result = cli("run", "-c", config, "--run-dir", tmp_path / "R")
    assert result.exit_code == 0, result.output
    train = pq.read_table(tmp_path / "R" / "data" / "train.parquet")
    assert train.num_rows == len(rows) // 2 and train["prompt_id"][0].as_py() == problem_id(rows[0]["problem"])


def test_hub_policy_name_offline_is_one_line_naming_the_option(tmp_path):
    from oarctl.policy.paths import resolve_policy_path

    started = time.monotonic()
    with pytest.raises(OarError) as error:
        resolve_policy_path("nobody-xyz/no-such-model")
    assert time.monotonic() - started < 30
    assert str(error.value).startswith("policy.path: cannot fetch Hugging Face model 'nobody-xyz/no-such-model'")
    assert resolve_policy_path(str(tmp_path)) == tmp_path  # a local folder is used as it is


def test_a_hub_model_name_in_the_local_cache_is_used_offline(tmp_path):
    """`policy.path: owner/name` resolves through huggingface_hub's cache (here a snapshot laid out
    by hand, as a download leaves it), and a stage runs on it with HF_HUB_OFFLINE=1."""
    import os
    import shutil
    import subprocess

    from conftest import oarctl_executable
    from oarctl.toy import base_policy_dir

    commit = "0123456789abcdef0123456789abcdef01234567"
    repository = tmp_path / "hub" / "models--someorg--tiny-math"
    shutil.copytree(base_policy_dir(), repository / "snapshots" / commit)
    (repository / "refs").mkdir()
    (repository / "refs" / "main").write_text(commit)
    environment = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}

    def oarctl(*args):
        return subprocess.run([oarctl_executable(), *map(str, args)], capture_output=True, text=True, timeout=120,
                              env=environment, cwd=tmp_path)

    assert oarctl("toy", "prompts", "-o", "prompts.parquet", "-n", "2").returncode == 0
    result = oarctl("evaluate", "prompts.parquet", "-o", "eval.parquet", "--set", "policy.path=someorg/tiny-math",
                    "--set", "evaluate.samples=1", "--set", "evaluate.pass_k=[1]", "--set", "run.progress=false")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "greedy" in result.stdout and (tmp_path / "eval.parquet").exists()


def test_toy_heldout_is_the_same_for_every_run_seed_and_train_is_not():
    def problems(split, seed, heldout_seed=0):
        config = load_config(overrides=[f"run.seed={seed}", f"data.toy_heldout_seed={heldout_seed}",
                                        "data.toy_heldout_size=16", "data.toy_train_size=16"])
        return load_prompts("toy", split, config)["problem"].to_pylist()

    assert problems("heldout", 0) == problems("heldout", 3)  # paired seeds are scored on one set
    assert problems("heldout", 0) != problems("heldout", 0, heldout_seed=1)
    assert problems("train", 0) != problems("train", 3)
