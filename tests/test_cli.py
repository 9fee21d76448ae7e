"""CLI: user errors are one `error:` line on stderr and exit code 2, never a traceback or a stray file."""
from __future__ import annotations

import pyarrow as pa
import pytest
from typer.main import get_command

from conftest import BAD_ROLLOUTS, hidden_temporaries, write_rollouts
from oarctl.cli import app


def stderr_lines(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.strip()]


def assert_user_error(result, *, names=()):
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert "Traceback" not in result.output
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit), result.exception
    errors = [line for line in stderr_lines(result) if line.startswith("error: ")]
    assert len(errors) == 1, result.stderr
    for name in names:
        assert name in errors[0], errors[0]
    assert result.stdout == ""
    return errors[0]


@pytest.mark.parametrize("name", sorted(BAD_ROLLOUTS))
def test_verify_bad_input_exits_2_without_output(cli, tmp_path, name):
    writer, expected = BAD_ROLLOUTS[name]
    bad = writer(tmp_path / "bad.parquet")
    out = tmp_path / "out" / "verified.parquet"
    result = cli("verify", bad, "-o", out)
    assert_user_error(result, names=[str(bad), *expected])
    assert not out.exists()
    assert not out.with_name(out.name + ".manifest.json").exists()
    assert hidden_temporaries(tmp_path) == []


@pytest.mark.parametrize("name", ["not-parquet", "misaligned-tokens"])
def test_verify_bad_input_prints_exactly_one_stderr_line(cli, tmp_path, name):
    bad = BAD_ROLLOUTS[name][0](tmp_path / "bad.parquet")
    result = cli("verify", bad, "-o", tmp_path / "out.parquet")
    assert result.exit_code == 2
    assert len(stderr_lines(result)) == 1 and result.stderr.startswith("error: "), result.stderr


@pytest.mark.parametrize("column", ["response_text", "response_token_ids"])
def test_null_values_in_required_columns_are_user_errors(cli, tmp_path, column):
    if column == "response_text":
        bad = write_rollouts(tmp_path / "bad.parquet", response_text=pa.array([None, "x"], pa.string()))
    else:
        bad = write_rollouts(tmp_path / "bad.parquet",
                             response_token_ids=pa.array([None, [1, 2]], pa.list_(pa.int32())),
                             response_logprobs=pa.array([None, [-1.0, -1.0]], pa.list_(pa.float32())))
    result = cli("verify", bad, "-o", tmp_path / "out.parquet")
    assert_user_error(result, names=[str(bad), column])


@pytest.mark.parametrize("args, names", [
    (["--set", "verify.bogus=1"], ["verify.bogus"]),
    (["--set", "sample.group_size=0"], ["sample.group_size"]),
    (["--set", "verify.method"], ["expected section.key=value"]),
    (["-c", "no/such/config.yaml"], ["config file not found"]),
])
def test_bad_config_exits_2_with_exactly_one_line(cli, tmp_path, args, names):
    good = write_rollouts(tmp_path / "r.parquet")
    out = tmp_path / "out.parquet"
    result = cli("verify", good, "-o", out, *args)
    assert_user_error(result, names=names)
    assert len(stderr_lines(result)) == 1
    assert not out.exists() and not out.with_name(out.name + ".manifest.json").exists()


def test_bad_config_file_is_one_line(cli, tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("sample:\n  group_size: many\n")
    result = cli("config", "-c", config)
    assert_user_error(result, names=[str(config), "sample.group_size"])
    assert len(stderr_lines(result)) == 1


def test_run_with_bad_set_writes_nothing(cli, tmp_path):
    run_dir = tmp_path / "R"
    result = cli("run", "--run-dir", run_dir, "--set", "run.bogus=3")
    assert_user_error(result, names=["run.bogus"])
    assert not run_dir.exists()


def test_status_and_show_of_missing_paths(cli, tmp_path):
    assert_user_error(cli("status", tmp_path / "nope"), names=["run folder not found"])
    assert_user_error(cli("show", tmp_path / "nope.parquet"), names=["file not found"])
    assert_user_error(cli("show", tmp_path / "nope.jsonl"), names=["file not found"])
    (tmp_path / "junk.parquet").write_text("junk")
    assert_user_error(cli("show", tmp_path / "junk.parquet"), names=["not a readable Parquet"])


def test_missing_policy_folder_is_a_user_error(cli, tmp_path):
    prompts = tmp_path / "p.parquet"
    assert cli("toy", "prompts", "-o", prompts, "-n", "4").exit_code == 0
    result = cli("sample", prompts, "-o", tmp_path / "r.parquet", "--policy", tmp_path / "no-policy")
    assert_user_error(result, names=["no-policy", "policy directory not found"])


def test_policy_without_safetensors_is_refused(cli, tmp_path):
    prompts = tmp_path / "p.parquet"
    assert cli("toy", "prompts", "-o", prompts, "-n", "4").exit_code == 0
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    (pickled / "pytorch_model.bin").write_bytes(b"not loaded")
    result = cli("sample", prompts, "-o", tmp_path / "r.parquet", "--policy", pickled)
    assert_user_error(result, names=["no safetensors weights"])


def test_toy_prompts_bad_split(cli, tmp_path):
    assert_user_error(cli("toy", "prompts", "-o", tmp_path / "p.parquet", "--split", "test"), names=["--split"])


def all_command_paths():
    root = get_command(app)
    paths = [[]]
    for name, command in root.commands.items():
        paths.append([name])
        for sub in getattr(command, "commands", {}) or {}:
            paths.append([name, sub])
    return paths


def test_every_command_is_listed():
    names = {" ".join(p) for p in all_command_paths()}
    assert {"sample", "verify", "attribute", "reshape", "update", "evaluate", "run", "show", "status",
            "config", "toy prompts", "toy build"} <= names


@pytest.mark.parametrize("path", all_command_paths(), ids=lambda p: " ".join(p) or "oarctl")
def test_help_works_for_every_command(cli, path):
    result = cli(*path, "--help")
    assert result.exit_code == 0, result.output
    assert "Usage" in result.stdout and "--help" in result.stdout
    assert result.stderr == ""


def test_no_arguments_shows_help(cli):
    result = cli()
    assert "Usage" in result.output
    assert "sample" in result.output and "status" in result.output
