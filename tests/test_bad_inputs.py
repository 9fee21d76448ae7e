"""The bad-input corpus: every case is a broken file, option or folder fed to one stage command.

Each must exit with code 2 and one `error:` line that names the file, row or option and the
problem; no traceback, and nothing written (no output, no manifest, no leftover temporary).
The valid chain the cases start from (rollouts -> verified -> attributions -> advantages) is
built once per session with the real commands on a random-init policy.
"""
from __future__ import annotations

import math
import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import BAD_ROLLOUTS, hidden_temporaries, write_rollouts
from test_cli import assert_user_error

STAGE_OF = {"rollouts": "verify", "verified": "attribute", "attributions": "reshape", "advantages": "update"}
OUTPUT_OF = {"verify": "verified.parquet", "attribute": "attributions.parquet", "reshape": "advantages.parquet",
             "update": "policy"}


@pytest.fixture(scope="session")
def chain(tmp_path_factory, random_policy) -> dict[str, Path]:
    """Valid artifacts of every kind, 4 rollouts in 2 groups of 2, made by the CLI itself."""
    from typer.testing import CliRunner

    from oarctl.cli import app

    folder = tmp_path_factory.mktemp("chain")
    paths = {"rollouts": write_rollouts(folder / "rollouts.parquet", rows=4)}
    previous = "rollouts"
    for kind in ("verified", "attributions", "advantages"):
        paths[kind] = folder / f"{kind}.parquet"
        extra = ["--policy", random_policy] if kind == "attributions" else []
        result = CliRunner().invoke(app, [STAGE_OF[previous], str(paths[previous]), "-o", str(paths[kind]),
                                          *map(str, extra)])
        assert result.exit_code == 0, result.output
        previous = kind
    return paths


def _rewrite(source: Path, target: Path, **columns) -> Path:
    """A copy of `source` with some columns replaced (a value None drops the column)."""
    table = pq.read_table(source)
    for name, value in columns.items():
        if value is None:
            table = table.drop_columns([name])
        elif name in table.column_names:
            table = table.set_column(table.column_names.index(name), name, value)
        else:
            table = table.append_column(name, value)
    pq.write_table(table, target)
    return target


def _scores_with(value: float):
    def make(chain, target):
        table = pq.read_table(chain["attributions"])
        scores = table["token_scores"].to_pylist()
        scores[1] = [value if not math.isnan(s) else s for s in scores[1]]
        return _rewrite(chain["attributions"], target, token_scores=pa.array(scores, pa.list_(pa.float32())))
    return make


def _column(kind: str, **columns):
    return lambda chain, target: _rewrite(chain[kind], target, **columns)


def _rows(kind: str, keep):
    def make(chain, target):
        table = pq.read_table(chain[kind])
        pq.write_table(table.take(pa.array(keep(table.num_rows), pa.int64())), target)
        return target
    return make


def _lists(kind: str, name: str, change):
    def make(chain, target):
        values = pq.read_table(chain[kind])[name].to_pylist()
        values[2] = change(values[2])
        field = pq.read_schema(chain[kind]).field(name)
        return _rewrite(chain[kind], target, **{name: pa.array(values, field.type)})
    return make


# name -> (input kind, writer(chain, target) -> bad input path, substrings the error line must hold)
CASES = {
    **{f"rollouts-{name}": ("rollouts", lambda chain, target, w=writer: w(target), expected)
       for name, (writer, expected) in BAD_ROLLOUTS.items()},
    "rollouts-null-answer": ("rollouts", _column("rollouts", answer=pa.array([None, "2", "2", "2"], pa.string())),
                             ["'answer'"]),
    "rollouts-token-ids-as-floats": ("rollouts", _column("rollouts", response_token_ids=pa.array(
        [[1.5, 2.5]] * 4, pa.list_(pa.float64()))), ["'response_token_ids'"]),
    "verified-missing-reward": ("verified", _column("verified", reward=None), ["'reward'", "missing"]),
    "verified-reward-nan": ("verified", _column("verified", reward=pa.array([1.0, math.nan, 0.0, 0.0], pa.float32())),
                            ["'reward'", "row 1"]),
    "verified-reward-as-text": ("verified", _column("verified", reward=pa.array(["1", "0", "0", "0"])), ["'reward'"]),
    "verified-no-rows": ("verified", _rows("verified", lambda n: []), ["no rows"]),
    "verified-empty-response": ("verified", _lists("verified", "response_token_ids", lambda ids: []),
                                ["row 2", "'response_logprobs'"]),
    "attributions-inf-score": ("attributions", _scores_with(math.inf), ["row 1", "'token_scores'"]),
    "attributions-negative-inf-score": ("attributions", _scores_with(-math.inf), ["row 1", "'token_scores'"]),
    "attributions-scores-misaligned": ("attributions", _lists("attributions", "token_scores", lambda s: s[:-1]),
                                       ["row 2", "'token_scores'"]),
    "attributions-missing-spans": ("attributions", _column("attributions", reasoning_start=None),
                                   ["'reasoning_start'", "missing"]),
    "attributions-group-of-one": ("attributions", _rows("attributions", lambda n: list(range(n - 1))),
                                  ["row 2", "group of 1", "sample.group_size"]),
    "advantages-nan-token-advantage": ("advantages", _lists("advantages", "token_advantages",
                                                            lambda a: [math.nan] * len(a)),
                                       ["row 2", "'token_advantages'"]),
    "advantages-missing-token-advantages": ("advantages", _column("advantages", token_advantages=None),
                                            ["'token_advantages'", "missing"]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_artifact_exits_2_naming_it_and_writes_nothing(cli, chain, random_policy, tmp_path, name):
    kind, writer, expected = CASES[name]
    bad = writer(chain, tmp_path / f"bad-{kind}.parquet")
    stage = STAGE_OF[kind]
    output = tmp_path / "out" / OUTPUT_OF[stage]
    policy = ["--policy", random_policy] if stage in ("attribute", "update") else []
    result = cli(stage, bad, "-o", output, *policy)
    assert_user_error(result, names=[str(bad), *expected])
    assert not output.exists() and not output.with_name(output.name + ".manifest.json").exists()
    assert hidden_temporaries(tmp_path) == []


OPTION_CASES = {
    "unknown-section": (["--set", "nosuch.key=1"], ["nosuch"]),
    "unknown-key": (["--set", "reshape.betta=1"], ["reshape.betta"]),
    "wrong-type": (["--set", "reshape.beta=large"], ["reshape.beta"]),
    "out-of-range-quantile": (["--set", "reshape.quantile=1.5"], ["reshape.quantile"]),
    "negative-floor": (["--set", "reshape.floor=-1"], ["reshape.floor"]),
    "unknown-estimator": (["--set", "reshape.estimator=ppo9"], ["ppo9"]),
    "list-for-number": (["--set", "reshape.beta=[1,2]"], ["reshape.beta"]),
}


@pytest.mark.parametrize("name", sorted(OPTION_CASES))
def test_bad_option_exits_2_naming_it(cli, chain, tmp_path, name):
    args, expected = OPTION_CASES[name]
    output = tmp_path / "advantages.parquet"
    assert_user_error(cli("reshape", chain["attributions"], "-o", output, *args), names=expected)
    assert not output.exists()


def test_unknown_key_in_a_config_file(cli, chain, tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("reshape:\n  quantile: 0.25\n  bogus_key: 3\n")
    output = tmp_path / "advantages.parquet"
    assert_user_error(cli("reshape", chain["attributions"], "-o", output, "-c", config),
                      names=[str(config), "bogus_key"])
    assert not output.exists()


def test_model_directory_without_weights(cli, chain, random_policy, tmp_path):
    hollow = tmp_path / "hollow"
    shutil.copytree(random_policy, hollow)
    for weights in hollow.glob("*.safetensors"):
        weights.unlink()
    output = tmp_path / "attributions.parquet"
    assert_user_error(cli("attribute", chain["verified"], "-o", output, "--policy", hollow), names=[str(hollow)])
    assert not output.exists()


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root ignores directory permissions")
def test_read_only_output_directory(cli, chain, tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        output = locked / "verified.parquet"
        assert_user_error(cli("verify", chain["rollouts"], "-o", output), names=[str(locked)])
        assert list(locked.iterdir()) == []
    finally:
        locked.chmod(0o700)


def test_output_path_is_an_existing_directory(cli, chain, tmp_path):
    output = tmp_path / "verified.parquet"
    output.mkdir()
    assert_user_error(cli("verify", chain["rollouts"], "-o", output), names=[str(output)])


def test_the_corpus_is_large_enough():
    assert len(CASES) + len(OPTION_CASES) + 4 >= 30
