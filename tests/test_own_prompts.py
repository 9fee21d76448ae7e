"""The user's own prompts through every door (oarctl/data.py): JSONL, JSON, Parquet, a folder written by
`datasets`' save_to_disk (Dataset and DatasetDict), common column names found on their own, ids from a
stable hash of the problem, chat-format prompts, and the `oarctl sample` / `oarctl evaluate` /
`oarctl run` commands on such files with the tiny policy."""
from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from oarctl.artifacts import read_artifact
from oarctl.config import load_config
from oarctl.data import load_prompts, problem_id, stage_prompts
from oarctl.errors import OarError

QA = [{"question": f"Compute {40 + i}-{39 + i - i % 2}.", "answer": str(1 + i % 2)} for i in range(6)]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def write_every_format(folder, rows) -> dict:
    """The same rows as JSONL, JSON, Parquet and a save_to_disk folder (written by datasets itself)."""
    import datasets

    paths = {"jsonl": write_jsonl(folder / "p.jsonl", rows), "json": folder / "p.json",
             "parquet": folder / "p.parquet", "saved": folder / "saved"}
    paths["json"].write_text(json.dumps(rows))
    pq.write_table(pa.Table.from_pylist(rows), paths["parquet"])
    datasets.Dataset.from_list(rows).save_to_disk(str(paths["saved"]))
    return paths


def test_every_format_gives_the_same_prompts_and_says_which_columns(tmp_path):
    expected = [{"prompt_id": problem_id(r["question"]), "problem": r["question"], "answer": r["answer"]} for r in QA]
    for kind, path in write_every_format(tmp_path, QA).items():
        said = []
        table = load_prompts(str(path), "train", load_config(), log=said.append)
        assert table.to_pylist() == expected, kind
        assert said == [f"data.train: {path}: problems from column 'question', answers from column 'answer' "
                        "(set data.problem_column / data.answer_column to choose others)"], kind


def test_a_saved_dataset_dict_reads_the_configured_split(tmp_path):
    import datasets

    splits = datasets.DatasetDict({"train": datasets.Dataset.from_list(QA[:4]),
                                   "test": datasets.Dataset.from_list(QA[4:])})
    splits.save_to_disk(str(tmp_path / "dd"))
    config = load_config()
    assert load_prompts(str(tmp_path / "dd"), "train", config, log=print).num_rows == 4
    assert load_prompts(str(tmp_path / "dd"), "heldout", config, log=print).num_rows == 2
    with pytest.raises(OarError, match="has splits train, test, not 'validation'"):
        load_prompts(str(tmp_path / "dd"), "heldout", load_config(None, ["data.heldout_split=validation"]))


def test_common_names_are_tried_in_order_and_a_chosen_column_wins(tmp_path):
    rows = [{"prompt": "P", "problem": "Q", "solution": "3", "answer": "4"}]
    path = str(write_jsonl(tmp_path / "a.jsonl", rows))
    assert load_prompts(path, "train", load_config()).to_pylist()[0]["problem"] == "Q"
    chosen = load_config(None, ["data.problem_column=prompt", "data.answer_column=solution"])
    assert load_prompts(path, "train", chosen).select(["problem", "answer"]).to_pylist() == [
        {"problem": "P", "answer": "3"}]


def test_ids_are_a_stable_hash_of_the_problem_whatever_the_row(tmp_path):
    first = load_prompts(str(write_jsonl(tmp_path / "a.jsonl", QA)), "train", load_config(), log=print)
    second = load_prompts(str(write_jsonl(tmp_path / "b.jsonl", QA[::-1])), "train", load_config(), log=print)
    assert first["prompt_id"].to_pylist() == second["prompt_id"].to_pylist()[::-1]
    assert len(set(first["prompt_id"].to_pylist())) == len(QA)
    repeated = load_prompts(str(write_jsonl(tmp_path / "c.jsonl", [QA[0], QA[1], QA[0]])), "train", load_config(),
                            log=print)
    base = problem_id(QA[0]["question"])
    assert repeated["prompt_id"].to_pylist() == [base, problem_id(QA[1]["question"]), base + "-2"]


def test_chat_format_prompts_keep_their_messages_and_use_the_chat_template(tmp_path, tiny_policy):
    from transformers import AutoTokenizer

    from oarctl.templates import encode, encode_prompt

    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Compute 3-1."}]
    rows = [{"prompt": messages, "solution": "2"}, {"prompt": "Compute 5-4.", "solution": "1"}]
    path = write_jsonl(tmp_path / "chat.jsonl", rows)  # a Parquet column cannot mix the two kinds
    table = read_artifact(stage_prompts(str(path), tmp_path / "r.parquet", load_config(), "train", log=print),
                          "prompts")
    first, second = table.to_pylist()
    assert first["problem"] == "Compute 3-1." and json.loads(first["messages"]) == messages
    assert second["messages"] == "" and second["problem"] == "Compute 5-4."
    tokenizer = AutoTokenizer.from_pretrained(tiny_policy)
    chat_text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert "Be brief." in chat_text
    assert encode_prompt(tokenizer, first) == tokenizer(chat_text, add_special_tokens=False)["input_ids"]
    assert encode_prompt(tokenizer, second, "base") == encode(tokenizer, "Compute 5-4.", "base")


@pytest.mark.parametrize("rows, overrides, names", [
    ([{"text": "p", "answer": "1"}], [], ["missing column 'problem'", "data.problem_column", "its columns: text"]),
    ([{"question": "p", "label": "1"}], [], ["missing column 'answer'", "data.answer_column"]),
    ([{"problem": "p", "answer": "1"}], ["data.problem_column=q"], ["missing column 'q'", "data.problem_column"]),
    ([{"problem": "p", "answer": ""}, {"problem": "q", "answer": None}], [], ["column 'answer' is empty in every row"]),
    ([{"problem": " ", "answer": "1"}], [], ["row 0", "empty problem (column 'problem')"]),
    ([{"problem": [{"role": "system", "content": "x"}], "answer": "1"}], [], ["row 0", "needs a 'user' message"]),
])
def test_a_file_that_cannot_serve_names_itself_and_the_column(tmp_path, rows, overrides, names):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(rows))
    with pytest.raises(OarError) as error:
        load_prompts(str(path), "train", load_config(None, overrides), log=lambda _: None)
    message = str(error.value)
    assert str(path) in message and "\n" not in message
    for name in names:
        assert name in message, message


def test_a_folder_that_is_not_a_saved_dataset(tmp_path):
    (tmp_path / "tokenizer").mkdir()
    with pytest.raises(OarError, match="is a folder but not a dataset saved by datasets' save_to_disk"):
        load_prompts(str(tmp_path / "tokenizer"), "train", load_config())


def test_a_prompts_file_is_read_as_it_is_and_others_are_written_once_beside_the_output(tmp_path):
    config = load_config()
    jsonl = write_jsonl(tmp_path / "p.jsonl", QA)
    written = stage_prompts(str(jsonl), tmp_path / "r.parquet", config, "train", log=print)
    assert written == tmp_path / "r.prompts.parquet"
    modified = written.stat().st_mtime_ns
    assert stage_prompts(str(jsonl), tmp_path / "r.parquet", config, "train", log=print) == written
    assert written.stat().st_mtime_ns == modified  # unchanged content is not rewritten (its hash stays put)
    assert stage_prompts(str(written), tmp_path / "s.parquet", config, "train", log=print) == written


def test_sample_takes_parquet_and_jsonl_with_only_problem_and_answer(cli, tiny_config, tmp_path):
    rows = [{"problem": r["question"], "answer": r["answer"]} for r in QA]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "pa.parquet")
    write_jsonl(tmp_path / "pa.jsonl", rows)
    config = tiny_config()
    for name in ("pa.parquet", "pa.jsonl"):
        result = cli("sample", tmp_path / name, "-o", tmp_path / f"{name}.rollouts.parquet", "-c", config)
        assert result.exit_code == 0, result.output
        assert read_artifact(tmp_path / f"{name}.rollouts.parquet", "rollouts").num_rows == 2 * 4
    assert ((tmp_path / "pa.parquet.rollouts.parquet").read_bytes()
            == (tmp_path / "pa.jsonl.rollouts.parquet").read_bytes())


def test_evaluate_takes_a_saved_dataset(cli, tiny_config, tmp_path):
    import datasets

    datasets.Dataset.from_list(QA[:2]).save_to_disk(str(tmp_path / "held"))
    result = cli("evaluate", tmp_path / "held", "-o", tmp_path / "e.parquet", "-c", tiny_config())
    assert result.exit_code == 0, result.output
    assert set(pq.read_table(tmp_path / "e.parquet")["problem"].to_pylist()) == {r["question"] for r in QA[:2]}


def test_run_takes_a_saved_dataset_with_question_and_answer(cli, tiny_config, tmp_path, signal_data):
    import datasets

    rows = [json.loads(line) for line in signal_data["train"].read_text().splitlines()]
    datasets.Dataset.from_list([{"question": r["problem"], "answer": r["answer"]} for r in rows]).save_to_disk(
        str(tmp_path / "train"))
    config = tiny_config(signal=True, run={"steps": 1, "progress": False}, data={"train": str(tmp_path / "train")})
    result = cli("run", "-c", config, "--run-dir", tmp_path / "R")
    assert result.exit_code == 0, result.output
    assert "problems from column 'question'" in result.stderr
    train = pq.read_table(tmp_path / "R" / "data" / "train.parquet")
    assert train["prompt_id"].to_pylist()[0] == problem_id(rows[0]["problem"])
