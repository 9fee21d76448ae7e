"""The README's promise: every artifact kind opens in polars and DuckDB with the values pyarrow reads,
token columns as lists. The files come from a real tiny run (+ `oarctl fidelity`). polars and duckdb
are dev dependencies only."""
from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from oarctl.artifacts import SCHEMAS

pl = pytest.importorskip("polars")
duckdb = pytest.importorskip("duckdb")


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory, tiny_policy, signal_data):
    """{kind: path} of one file of every artifact kind."""
    from typer.testing import CliRunner

    from oarctl.cli import app

    folder = tmp_path_factory.mktemp("open")
    config = folder / "tiny.yaml"
    config.write_text(json.dumps({
        "run": {"steps": 1, "progress": False}, "policy": {"path": str(tiny_policy)},
        "data": {"train": str(signal_data["train"]), "heldout": str(signal_data["heldout"])},
        "sample": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 16},  # gradient-check: 2 batches a half
        "evaluate": {"samples": 2, "max_new_tokens": 16, "pass_k": [1, 2]},
        "update": {"mini_batch_size": 8, "micro_batch_size": 4}}))  # JSON is YAML
    run, step = folder / "R", folder / "R" / "step_0000"
    runner = CliRunner()
    assert runner.invoke(app, ["run", "-c", str(config), "--run-dir", str(run)]).exit_code == 0
    fidelity = runner.invoke(app, ["fidelity", str(step / "verified.parquet"), "-o", str(folder / "fidelity.parquet"),
                                   "-c", str(config), "--sample", "2", "--methods", "random"])
    assert fidelity.exit_code == 0, fidelity.output
    check = runner.invoke(app, ["gradient-check", str(step / "verified.parquet"), "-o", str(folder / "check.parquet"),
                                "-c", str(config), "--methods", "random", "--batch-prompts", "1"])
    assert check.exit_code == 0, check.output
    paths = {"prompts": run / "data" / "train.parquet", "update_log": step / "policy" / "update.parquet",
             "eval_results": run / "eval" / "base.parquet", "fidelity": folder / "fidelity.parquet",
             "gradient_check": folder / "check.parquet"}
    paths.update({kind: step / f"{kind}.parquet" for kind in ("rollouts", "verified", "attributions", "advantages")})
    assert set(paths) == set(SCHEMAS)
    return paths


def _same(rows: list[dict], expected: list[dict]) -> bool:
    """Equal values; JSON text so that NaN (token_scores outside the reasoning) equals NaN."""
    return json.dumps(rows, sort_keys=True) == json.dumps(expected, sort_keys=True)


@pytest.mark.parametrize("kind", sorted(SCHEMAS))
def test_every_artifact_opens_in_polars_and_duckdb(artifacts, kind):
    path = artifacts[kind]
    expected = pq.read_table(path).to_pylist()
    frame = pl.read_parquet(path)
    assert frame.columns == [f.name for f in pq.read_schema(path)] and _same(frame.to_dicts(), expected)
    relation = duckdb.sql(f"SELECT * FROM read_parquet('{path}')")
    assert _same([dict(zip(relation.columns, row)) for row in relation.fetchall()], expected)
    for field in SCHEMAS[kind]:
        if str(field.type).startswith("list"):  # token columns stay lists of numbers, not blobs or text
            assert isinstance(frame.schema[field.name], pl.List)
            assert dict(zip(relation.columns, relation.types))[field.name].id == "list"


def test_token_advantages_unnest_in_duckdb_and_explode_in_polars(artifacts):
    path = artifacts["advantages"]
    table = pq.read_table(path)
    tokens = sum(len(ids) for ids in table["response_token_ids"].to_pylist())
    total = sum(sum(values) for values in table["token_advantages"].to_pylist())
    count, summed = duckdb.sql(f"SELECT count(*), sum(a) FROM (SELECT unnest(token_advantages) AS a "
                               f"FROM read_parquet('{path}'))").fetchall()[0]
    assert count == tokens and summed == pytest.approx(total, abs=1e-4)
    exploded = pl.read_parquet(path).select(pl.col("token_advantages").explode())
    assert exploded.height == tokens and exploded["token_advantages"].sum() == pytest.approx(total, abs=1e-4)
