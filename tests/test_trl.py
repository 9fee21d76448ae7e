"""OARGRPOTrainer (oarctl/integrations/trl.py): uniform attribution is stock TRL, OAR-G / OAR-P give what
`oarctl attribute` + `oarctl reshape` give on the same rollouts, two processes give what one gives, and a
TRL run's artifacts open with oarctl's tools. Completions are fixed (tests/trl_worker.py), so every
trainer compared here sees the same batch."""
from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

pytest.importorskip("trl")

from trl import GRPOTrainer  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

from oarctl.errors import OarError  # noqa: E402
from oarctl.integrations.trl import OARGRPOTrainer  # noqa: E402
from trl_worker import boxed_reward, dataset, fixed_completions_class, grpo_args  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


class GradientRecorder(TrainerCallback):
    """Parameter gradients at every optimizer step (before clipping is applied to the weights)."""

    def __init__(self):
        self.steps: list[dict[str, torch.Tensor]] = []

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.steps.append({name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None})


def _train(base, policy, data, folder: Path, attribution=None, log_dir=None, **overrides):
    """(trainer, gradients per step, the batches TRL generated) after training on fixed completions."""
    recorder = GradientRecorder()
    extra = {} if attribution is None else {"attribution": attribution, "oar_log_dir": log_dir}
    torch.manual_seed(0)
    trainer = fixed_completions_class(base)(model=str(policy), reward_funcs=boxed_reward,
                                            args=grpo_args(folder, **overrides), train_dataset=dataset(data),
                                            callbacks=[recorder], **extra)
    batches, generate = [], trainer._generate_and_score_completions
    trainer._generate_and_score_completions = lambda inputs: batches.append(generate(inputs)) or batches[-1]
    trainer.train()
    return trainer, recorder.steps, batches


def _losses(trainer) -> list[float]:
    return [line["loss"] for line in trainer.state.log_history if "loss" in line]


@pytest.mark.parametrize("loss_type, iterations", [("grpo", 1), ("dapo", 1), ("dr_grpo", 1), ("grpo", 2)])
def test_uniform_attribution_is_stock_trl(tiny_policy, signal_data, tmp_path, loss_type, iterations):
    settings = dict(loss_type=loss_type, num_iterations=iterations, max_steps=2, beta=0.04 if iterations == 2 else 0.0)
    stock_trainer, stock, _ = _train(GRPOTrainer, tiny_policy, signal_data["train"], tmp_path / "stock", **settings)
    oar, ours, batches = _train(OARGRPOTrainer, tiny_policy, signal_data["train"], tmp_path / "oar",
                                attribution="uniform", **settings)
    assert batches[0]["advantages"].dim() == 2 and batches[0]["advantages"].abs().sum() > 0  # token advantages, signal
    assert len(stock) == len(ours) == 2 and any(g.abs().sum() > 0 for g in stock[0].values())
    for step_stock, step_ours in zip(stock, ours):
        assert step_stock.keys() == step_ours.keys()
        for name in step_stock:
            torch.testing.assert_close(step_ours[name], step_stock[name], rtol=1e-5, atol=1e-8)
    assert len(_losses(oar)) == 2 and _losses(oar) == pytest.approx(_losses(stock_trainer), rel=1e-5, abs=1e-8)


def test_the_gradient_comparison_sees_a_different_attribution(tiny_policy, signal_data, tmp_path):
    """The control of the test above: `random` weights give other gradients than stock TRL."""
    _, stock, _ = _train(GRPOTrainer, tiny_policy, signal_data["train"], tmp_path / "stock")
    _, ours, _ = _train(OARGRPOTrainer, tiny_policy, signal_data["train"], tmp_path / "oar", attribution="random")
    assert any(not torch.allclose(ours[0][name], stock[0][name], rtol=1e-3, atol=1e-6) for name in stock[0])


# ---- OAR-G / OAR-P against the oarctl stages ---------------------------------------------------------

@pytest.fixture(scope="module")
def oar_runs(tiny_policy, signal_data, tmp_path_factory):
    """One training step per method, with its artifacts; {method: (trainer, batch, log dir)}."""
    runs = {}
    for method in ("oar_g", "oar_p", "oar_flow_local"):
        folder = tmp_path_factory.mktemp(f"trl-{method}")
        trainer, _, batches = _train(OARGRPOTrainer, tiny_policy, signal_data["train"], folder / "trl",
                                     attribution=method, log_dir=folder / "oar")
        runs[method] = trainer, batches[0], folder / "oar"
    return runs


def _oarctl_advantages(log_dir: Path, policy: Path, out: Path) -> list[list[float]]:
    """`oarctl attribute` then `oarctl reshape` on the TRL run's rollouts, with the config it recorded."""
    from oarctl.config import load_config
    from oarctl.pipeline import run_stage

    config = load_config(log_dir / "config.yaml")
    rollouts = log_dir / "step_0000" / "advantages.parquet"  # a superset of the verified table
    run_stage("attribute", config, {"verified": rollouts}, out / "attributions.parquet", step=0, policy_path=policy,
              log=lambda _: None)
    run_stage("reshape", config, {"attributions": out / "attributions.parquet"}, out / "advantages.parquet",
              log=lambda _: None)
    return pq.read_table(out / "advantages.parquet")["token_advantages"].to_pylist()


@pytest.mark.parametrize("method", ["oar_g", "oar_p", "oar_flow_local"])
def test_token_advantages_are_oarctl_attribute_then_reshape(oar_runs, tiny_policy, tmp_path, method):
    _, batch, log_dir = oar_runs[method]
    expected = _oarctl_advantages(log_dir, tiny_policy, tmp_path)
    fed = batch["advantages"]  # (B, T): what TRL's loss received
    lengths = batch["completion_mask"].sum(dim=1).tolist()
    assert len(expected) == fed.shape[0]
    for row, (values, length) in enumerate(zip(expected, lengths)):
        assert len(values) == length
        np.testing.assert_allclose(fed[row, :length].numpy(), values, rtol=1e-4, atol=1e-5, err_msg=f"row {row}")
    weights = pq.read_table(log_dir / "step_0000" / "advantages.parquet")["token_weights"].to_pylist()
    assert any(np.ptp(w) > 0.1 for w in weights)  # credit really is reshaped, not uniform


def test_attribution_leaves_parameter_gradients_and_training_mode_alone(tiny_policy, signal_data, tmp_path):
    import pyarrow as pa

    from oarctl.attribution.base import segment_rows

    trainer = OARGRPOTrainer(model=str(tiny_policy), reward_funcs=boxed_reward, args=grpo_args(tmp_path),
                             train_dataset=dataset(signal_data["train"]), attribution="oar_g")
    tokenizer = trainer.processing_class
    response = tokenizer("5-3=2. \\boxed{2}", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    table = pa.table({"prompt_token_ids": [tokenizer("Compute 5-3.")["input_ids"]], "response_token_ids": [response],
                      "temperature": [1.0]})
    trainer.model.train()
    (scores,) = trainer._scores({"rollouts": segment_rows(table, tokenizer), "scored": [0], "table": table})
    reasoning = len("5-3=2. ")  # one token per character; "\\boxed{2}" and eos keep weight 1
    assert np.isfinite(scores[:reasoning]).all() and np.isnan(scores[reasoning:]).all()
    assert trainer.model.training
    assert all(p.grad is None for p in trainer.model.parameters())


def test_logs_carry_reshape_metrics_and_attribution_seconds(oar_runs):
    trainer, _, _ = oar_runs["oar_g"]
    line = next(x for x in trainer.state.log_history if "loss" in x)
    assert line["oar/attribution_seconds"] > 0
    assert 0 < line["oar/top10_mass_share"] <= 1 and line["oar/effective_tokens"] > 1


def test_artifacts_open_with_show_report_and_fidelity(oar_runs, tiny_policy, cli, tmp_path):
    _, batch, log_dir = oar_runs["oar_g"]
    artifact = log_dir / "step_0000" / "advantages.parquet"
    assert (log_dir / "step_0000" / "advantages.parquet.manifest.json").is_file()
    shown = cli("show", artifact, "--row", "0", "--no-color")
    assert shown.exit_code == 0 and "boxed" in shown.stdout, shown.stderr
    import json

    (line,) = [json.loads(x) for x in (log_dir / "metrics.jsonl").read_text().splitlines()]
    assert line["step"] == 0 and {"verify/reward_mean", "reshape/top10_mass_share", "attribute/seconds",
                                  "update/entropy", "update/loss"} <= set(line)
    report = cli("report", log_dir)
    assert report.exit_code == 0 and (log_dir / "report.html").is_file(), report.stderr
    assert "Token credit (step_0000/advantages.parquet)" in (log_dir / "report.html").read_text()
    fidelity = cli("fidelity", artifact, "-o", tmp_path / "fidelity.parquet", "--policy", tiny_policy,
                   "--sample", "2", "--methods", "oar_g,random", "--set", "fidelity.max_new_tokens=8")
    assert fidelity.exit_code == 0, fidelity.stderr
    assert pq.read_table(tmp_path / "fidelity.parquet").num_rows > 0


# ---- refused options ----------------------------------------------------------------------------------

@pytest.mark.parametrize("attribution, named", [
    ("nope", "attribute.method"), ({"quantile": 2.0}, "reshape.quantile"), ({"scale": "batch"}, "'scale'"),
    ({"typo": 1}, "'typo'"), (["oar_g"], "attribution"), ({"update.learning_rate": 1.0}, "'update.learning_rate'"),
    ({"reshape.beta": "big"}, "reshape.beta")])
def test_bad_attribution_options_name_the_option(tiny_policy, signal_data, tmp_path, attribution, named):
    with pytest.raises(OarError, match=named) as caught:
        OARGRPOTrainer(model=str(tiny_policy), reward_funcs=boxed_reward, args=grpo_args(tmp_path),
                       train_dataset=dataset(signal_data["train"]), attribution=attribution)
    assert "\n" not in str(caught.value)


def test_tools_are_refused_at_construction(tiny_policy, signal_data, tmp_path):
    def calculator(expression: str) -> str:
        """Evaluate an expression.

        Args:
            expression: the arithmetic to do.
        """
        return expression

    with pytest.raises(OarError, match="^tools: "):
        OARGRPOTrainer(model=str(tiny_policy), reward_funcs=boxed_reward, args=grpo_args(tmp_path),
                       train_dataset=dataset(signal_data["train"]), tools=[calculator])


# ---- processes ------------------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as handle:
        handle.bind(("127.0.0.1", 0))
        return handle.getsockname()[1]


def test_two_processes_give_the_token_advantages_of_one(tiny_policy, signal_data, tmp_path):
    """~30-60 s: the launcher and two processes each import torch and TRL."""
    launched = subprocess.run(
        [str(Path(sys.executable).parent / "accelerate"), "launch", "--config_file",
         str(ROOT / "configs" / "accelerate" / "cpu-2proc.yaml"), "--main_process_port", str(_free_port()),
         str(ROOT / "tests" / "trl_worker.py"), str(tiny_policy), str(signal_data["train"]), str(tmp_path / "two")],
        capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert launched.returncode == 0, launched.stderr[-3000:]
    _train(OARGRPOTrainer, tiny_policy, signal_data["train"], tmp_path / "trl", attribution="oar_g",
           log_dir=tmp_path / "one")
    one, two = (pq.read_table(tmp_path / name / "step_0000" / "advantages.parquet").to_pylist()
                for name in ("one", "two"))
    assert len(one) == len(two) == 8
    for row, (a, b) in enumerate(zip(one, two)):
        assert (a["prompt_token_ids"], a["response_token_ids"]) == (b["prompt_token_ids"], b["response_token_ids"])
        np.testing.assert_allclose(b["token_advantages"], a["token_advantages"], rtol=1e-4, atol=1e-6,
                                   err_msg=f"row {row}")
    assert len({r["prompt_id"] for r in two}) == 2 and any(np.ptp(r["token_weights"]) > 0.1 for r in two)


def _logged_rows(offline_history, folder, key: str, seconds: float = 30.0) -> dict:
    """The offline run's history as one {metric: last value}, read until `key` is there: on busy cores
    wandb's service process can still be writing the run file when `wandb.finish()` returns (seen in CI)."""
    deadline = time.monotonic() + seconds
    while True:
        (history,) = offline_history(folder)
        logged = {name: value for row in history for name, value in row.items()}
        if key in logged or time.monotonic() > deadline:
            return logged
        time.sleep(0.5)


def test_wandb_offline_gets_trl_and_oar_metrics(tiny_policy, signal_data, tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    from wandb_files import offline_history

    for name, value in {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_CONSOLE": "off",
                        "WANDB_DIR": str(tmp_path), "WANDB_PROJECT": "oarctl-test"}.items():
        monkeypatch.setenv(name, value)
    wandb.teardown()  # wandb reads WANDB_DIR once per process: an earlier test's W&B run would keep its folder
    trainer, _, _ = _train(OARGRPOTrainer, tiny_policy, signal_data["train"], tmp_path / "trl", attribution="oar_g",
                           report_to=["wandb"], max_steps=2)
    wandb.finish()  # transformers leaves the run open; finishing it flushes the run file
    expected = [line for line in trainer.state.log_history if "loss" in line][-1]
    logged = _logged_rows(offline_history, tmp_path / "wandb", "train/oar/attribution_seconds")
    for name in ("oar/attribution_seconds", "oar/top10_mass_share", "oar/effective_tokens", "loss"):
        assert logged[f"train/{name}"] == pytest.approx(expected[name])


def test_the_example_trains_and_its_artifacts_open(cli, tmp_path):
    """examples/trl_oar.py, shrunk to 2 steps of 2 prompts (docs/trl.md measures the full 20 steps)."""
    out = tmp_path / "trl-oar"
    finished = subprocess.run([sys.executable, str(ROOT / "examples" / "trl_oar.py"), "--steps", "2",
                               "--prompts-per-step", "2", "--out", str(out)], capture_output=True, text=True,
                              timeout=300, cwd=tmp_path)
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert "2 steps in" in finished.stdout
    assert cli("show", out / "step_0001" / "advantages.parquet", "--row", "0").exit_code == 0
    assert cli("report", out).exit_code == 0 and (out / "report.html").is_file()
