"""logging.backends: config validation (names, missing optional packages) and the TensorBoard sink,
read back with tensorboard's EventAccumulator after a real tiny run."""
from __future__ import annotations

import importlib.util
import json

import pytest

from oarctl import logging_backends
from oarctl.config import load_config
from oarctl.errors import OarError
from oarctl.logging_backends import BACKENDS, MetricsSinks, numeric


def test_default_is_jsonl_only_and_opens_no_sink(tmp_path):
    config = load_config()
    assert config.logging.backends == ["jsonl"]
    sinks = MetricsSinks(config.logging, tmp_path)
    sinks.send([{"kind": "step", "step": 0, "verify/reward_mean": 0.5}])
    assert sinks.sinks == [] and sinks.sent == 1 and list(tmp_path.iterdir()) == []
    assert BACKENDS.names() == ["jsonl", "tensorboard", "wandb"]


def test_unknown_backend_is_a_one_line_config_error():
    with pytest.raises(OarError, match=r"logging.backends: unknown logging backend 'csv'; choose from: jsonl"):
        load_config(None, ["logging.backends=[jsonl, csv]"])


def test_a_backend_without_its_package_is_an_error_at_load(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(logging_backends.importlib.util, "find_spec",
                        lambda name, *a: None if name in ("wandb", "tensorboard") else real(name, *a))
    for name in ("wandb", "tensorboard"):
        with pytest.raises(OarError, match=rf"logging.backends: {name} needs the '{name}' package \(pip install"):
            load_config(None, [f"logging.backends=[{name}]"])


def test_cli_reports_the_missing_package_and_exits_2(cli, monkeypatch):
    monkeypatch.setattr(logging_backends.importlib.util, "find_spec", lambda name, *a: None)
    result = cli("config", "--set", "logging.backends=[wandb]")
    assert result.exit_code == 2 and "wandb" in result.stderr and len(result.stderr.splitlines()) == 1


def test_numeric_keeps_metrics_only():
    assert numeric({"kind": "step", "step": 3, "a/b": 1, "c": 0.5, "d": "x", "e": True}) == {"a/b": 1.0, "c": 0.5}


def test_tensorboard_receives_every_step_and_eval_line(cli, tiny_config, tmp_path):
    pytest.importorskip("tensorboard", reason="tensorboard not installed (pip install 'oarctl[tensorboard]')")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = tmp_path / "R"
    config = tiny_config(signal=True, logging={"backends": ["jsonl", "tensorboard"]})
    result = cli("run", "-c", config, "--run-dir", run_dir)
    assert result.exit_code == 0, result.output
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    rewards = events.Scalars("verify/reward_mean")
    assert [(e.step, pytest.approx(e.value)) for e in rewards] == \
        [(x["step"], x["verify/reward_mean"]) for x in lines if x["kind"] == "step"]
    accuracy = events.Scalars("eval/greedy_accuracy")
    assert [e.step for e in accuracy] == [x["after_steps"] for x in lines if x["kind"] == "eval"] == [0, 2]
    assert "update/loss" in events.Tags()["scalars"]


def test_a_resumed_run_sends_tensorboard_each_step_once(cli, tiny_config, tmp_path):
    pytest.importorskip("tensorboard", reason="tensorboard not installed (pip install 'oarctl[tensorboard]')")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = tmp_path / "R"
    config = tiny_config(signal=True, logging={"backends": ["jsonl", "tensorboard"]})
    for steps in (2, 2, 3):  # a first run, the same command again (all cached), then one step more
        result = cli("run", "-c", config, "--run-dir", run_dir, "--steps", steps)
        assert result.exit_code == 0, result.output
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("verify/reward_mean")] == [0, 1, 2]
    assert sorted(e.step for e in events.Scalars("eval/greedy_accuracy")) == [0, 2, 3]


def test_wandb_offline_run_holds_every_line(cli, tiny_config, tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="wandb not installed (pip install 'oarctl[wandb]')")
    from wandb_files import offline_history

    for name, value in {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_CONSOLE": "off"}.items():
        monkeypatch.setenv(name, value)
    run_dir = tmp_path / "R"
    config = tiny_config(signal=True, logging={"backends": ["jsonl", "wandb"]})
    result = cli("run", "-c", config, "--run-dir", run_dir)
    assert result.exit_code == 0, result.output
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    (history,) = offline_history(run_dir / "wandb")
    by_step: dict[int, dict] = {}
    for row in history:
        by_step.setdefault(row["_step"], {}).update(row)
    for line in lines:
        at = by_step[line["step"] if line["kind"] == "step" else line["after_steps"]]
        assert {k: pytest.approx(v) for k, v in numeric(line).items()} == {k: at[k] for k in numeric(line)}
