"""Artifacts: checked reads (one-line errors naming the file and the column/row), atomic writes."""
from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import BAD_ROLLOUTS, hidden_temporaries, rollouts_columns, write_rollouts
from oarctl import artifacts
from oarctl.artifacts import (ADVANTAGES, ROLLOUTS, SCHEMAS, VERIFIED, extend_table, make_table, read_artifact,
                              write_parquet)
from oarctl.errors import OarError


def verified_table(**replace) -> pa.Table:
    table = extend_table(make_table(rollouts_columns(2), "rollouts"),
                         {"extracted_answer": ["2", None], "reward": [1.0, 0.0], "answer_char_start": [7, -1],
                          "answer_char_end": [8, -1], "answer_token_start": [3, -1], "answer_token_end": [4, -1],
                          "normalized_answer": ["2", None], "normalized_gold": ["2", "2"],
                          "verdict": ["correct", "no_answer"], "parse_ok": [True, False],
                          "timed_out": [False, False], "extraction": ["strict", "strict"]}, "verified")
    for name, value in replace.items():
        table = table.set_column(table.column_names.index(name), name, pa.array(value))
    return table


def test_schemas_extend_each_other():
    names = [list(SCHEMAS[k].names) for k in ("rollouts", "verified", "attributions", "advantages")]
    for shorter, longer in zip(names, names[1:]):
        assert longer[:len(shorter)] == shorter
    assert ADVANTAGES.field("token_advantages").type == pa.list_(pa.float32())


def test_valid_file_reads_with_exact_schema_types(tmp_path):
    path = write_rollouts(tmp_path / "r.parquet", rows=4)
    table = read_artifact(path, "rollouts")
    assert table.num_rows == 4
    for field in ROLLOUTS:
        assert table.schema.field(field.name).type == field.type


def test_widened_types_are_cast_back_and_extra_columns_allowed(tmp_path):
    path = write_rollouts(tmp_path / "r.parquet", sample_index=pa.array([0, 1], pa.int64()),
                          temperature=pa.array([1.0, 1.0], pa.float64()))
    table = pq.read_table(path).append_column("my_note", pa.array(["a", "b"]))
    pq.write_table(table, path)
    table = read_artifact(path, "rollouts")
    assert table.schema.field("sample_index").type == pa.int32()
    assert table.schema.field("temperature").type == pa.float32()
    assert "my_note" in table.column_names


@pytest.mark.parametrize("name", sorted(BAD_ROLLOUTS))
def test_bad_files_raise_one_line_errors_naming_file_and_culprit(tmp_path, name):
    writer, expected = BAD_ROLLOUTS[name]
    path = writer(tmp_path / "bad.parquet")
    with pytest.raises(OarError) as error:
        read_artifact(path, "rollouts")
    message = str(error.value)
    assert message.startswith(str(path))
    for part in expected:
        assert part in message
    assert "\n" not in message


def test_lossy_casts_are_refused(tmp_path):
    path = write_rollouts(tmp_path / "r.parquet", sample_index=pa.array([0.5, 1.0]))
    with pytest.raises(OarError, match="'sample_index' has type double"):
        read_artifact(path, "rollouts")


def test_reward_as_text_is_refused(tmp_path):
    path = tmp_path / "v.parquet"
    pq.write_table(verified_table(reward=["correct", "wrong"]), path)
    with pytest.raises(OarError) as error:
        read_artifact(path, "verified")
    assert str(path) in str(error.value) and "'reward'" in str(error.value)


def test_reward_as_numeric_text_is_refused(tmp_path):
    path = tmp_path / "v.parquet"
    pq.write_table(verified_table(reward=["1.0", "0.0"]), path)
    with pytest.raises(OarError, match="'reward'"):
        read_artifact(path, "verified")


def attributions_table(**columns) -> pa.Table:
    """A verified table extended to the attributions schema; columns not given are null."""
    verified = verified_table()
    defaults = {"int32": 0, "bool": False, "string": "x"}
    extra = {f.name: [defaults.get(str(f.type))] * verified.num_rows
             for f in SCHEMAS["attributions"] if f.name not in verified.column_names}
    extra.update(columns)
    return extend_table(verified, extra, "attributions")


def test_misaligned_token_scores_name_the_row(tmp_path):
    table = attributions_table(attribution_method=["uniform"] * 2, token_scores=[[1.0] * 10, [1.0]])
    path = tmp_path / "a.parquet"
    pq.write_table(table, path)
    with pytest.raises(OarError, match=r"row 1: column 'token_scores' has 1 values for 9 response tokens"):
        read_artifact(path, "attributions")


def test_a_verified_file_is_a_valid_rollouts_file(tmp_path):
    """Each artifact extends the previous one, so any later file can feed an earlier stage."""
    path = tmp_path / "v.parquet"
    pq.write_table(verified_table(), path)
    assert read_artifact(path, "rollouts").num_rows == 2
    with pytest.raises(OarError, match="missing column 'attribution_method'"):
        read_artifact(path, "attributions")


def test_make_table_missing_column_is_a_programming_error():
    columns = rollouts_columns(1)
    del columns["finish_reason"]
    with pytest.raises(ValueError, match="finish_reason"):
        make_table(columns, "rollouts")


# ---- write_parquet ------------------------------------------------------------------------------

def test_write_parquet_is_complete_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "deep" / "er" / "x.parquet"
    table = verified_table()
    write_parquet(table, path)
    assert pq.read_table(path).equals(table)
    assert hidden_temporaries(tmp_path) == []
    write_parquet(table.slice(0, 1), path)  # replaces an existing file
    assert pq.read_table(path).num_rows == 1
    assert hidden_temporaries(tmp_path) == []


@pytest.mark.parametrize("failing", ["write_table", "fsync", "replace"])
def test_failed_write_keeps_the_old_file_and_removes_the_temporary(tmp_path, monkeypatch, failing):
    path = tmp_path / "x.parquet"
    write_parquet(verified_table(), path)
    before = path.read_bytes()

    def write_half_then_fail(table, where, *args, **kwargs):
        open(where, "wb").write(b"PAR1 half")
        raise OSError(28, "No space left on device")

    def fail(*args, **kwargs):
        raise OSError(5, "Input/output error")

    if failing == "write_table":
        monkeypatch.setattr(artifacts.pq, "write_table", write_half_then_fail)
    elif failing == "fsync":
        monkeypatch.setattr(artifacts.os, "fsync", fail)
    else:
        monkeypatch.setattr(artifacts.os, "replace", fail)
    with pytest.raises(OarError) as error:
        write_parquet(verified_table().slice(0, 1), path)
    assert str(path) in str(error.value) and "cannot write" in str(error.value)
    assert path.read_bytes() == before
    assert hidden_temporaries(tmp_path) == []


def test_interrupted_write_removes_the_temporary(tmp_path, monkeypatch):
    path = tmp_path / "x.parquet"

    def interrupted(table, where, *args, **kwargs):
        open(where, "wb").write(b"PAR1 half")
        raise KeyboardInterrupt

    monkeypatch.setattr(artifacts.pq, "write_table", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_parquet(verified_table(), path)
    assert not path.exists()
    assert hidden_temporaries(tmp_path) == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write into read-only folders")
def test_read_only_folder_is_a_one_line_error(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    path = folder / "x.parquet"
    write_parquet(verified_table(), path)
    before = path.read_bytes()
    folder.chmod(0o555)
    try:
        with pytest.raises(OarError, match="cannot write"):
            write_parquet(verified_table().slice(0, 1), path)
        assert path.read_bytes() == before
        assert hidden_temporaries(tmp_path) == []
    finally:
        folder.chmod(0o755)


def test_verified_schema_allows_null_answers(tmp_path):
    path = tmp_path / "v.parquet"
    write_parquet(verified_table(), path)
    assert read_artifact(path, "verified")["extracted_answer"].to_pylist() == ["2", None]
    assert VERIFIED.field("extracted_answer").nullable
