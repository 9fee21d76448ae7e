"""Attribution on sharded weights (oarctl/attribution/collective.py) and OARGRPOTrainer under FSDP1, on 2 CPU
processes (gloo; the trainer also under FSDP2): padded attribution gives the scores of one process with ranks holding different numbers
and lengths of responses, without a parameter gradient, under FSDP1 and DeepSpeed ZeRO-3; the same with the
FSDP weights gathered; an unpadded rank makes the launch fail; `uniform` under FSDP is stock TRL under
FSDP; OAR-G / OAR-P spans under FSDP give the token advantages of one process; the example runs under the
CPU FSDP config. Each launch takes ~15-60 s (two processes import torch / TRL)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

pytest.importorskip("trl")

from fsdp_attribution_worker import METHODS, RANK_ROWS, attribute_config, rollout_table, scores  # noqa: E402
from trl_fsdp_worker import ATTRIBUTION, uneven_completions_class  # noqa: E402
from trl_worker import boxed_reward, dataset, grpo_args  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"


def _free_port() -> int:
    import socket

    with socket.socket() as handle:
        handle.bind(("127.0.0.1", 0))
        return handle.getsockname()[1]


def _run(command: list[str], timeout: float, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)


def _load(policy: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(policy, dtype=torch.float32), AutoTokenizer.from_pretrained(policy)


# ---- one process: the padding adds calls of the planned kind and changes no score ------------------------

class ExtraCalls:
    """A stand-in CallSync: another rank always needs `extra` more calls; records the planned counts."""

    def __init__(self, extra: int):
        self.extra, self.planned = extra, []

    def most(self, count: int) -> int:
        self.planned.append(count)
        return count + self.extra


def _forwards(model, run) -> tuple[object, int]:
    calls = []
    handle = model.register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        return run(), len(calls)
    finally:
        handle.remove()


@pytest.mark.parametrize("method, forwards_per_call", [("oar_g", 3), ("oar_p", 1), ("oar_p_span", 1)])
def test_padding_makes_the_planned_calls_plus_dummies_and_changes_no_score(tiny_policy, method, forwards_per_call):
    """OAR-G's unit is one prefix batch (prefix, teacher and noisy forwards + a backward), OAR-P's one forward."""
    model, tokenizer = _load(tiny_policy)
    rows = RANK_ROWS[0] + RANK_ROWS[1]
    plain, plain_calls = _forwards(model, lambda: scores(model, tokenizer, rows, None, [method]))
    sync = ExtraCalls(extra=2)
    padded, padded_calls = _forwards(model, lambda: scores(model, tokenizer, rows, sync, [method]))
    for row, (a, b) in enumerate(zip(plain[method], padded[method])):
        np.testing.assert_array_equal(b, a, err_msg=f"row {row}")  # the same bytes: dummies leave no trace
    (planned,) = sync.planned  # one phase
    assert planned >= len(rows) and plain_calls == planned * forwards_per_call  # the plan is the calls made
    assert padded_calls == plain_calls + 2 * forwards_per_call  # two dummies of the phase's kind
    assert all(p.grad is None for p in model.parameters())


def test_screened_oar_p_pads_each_of_its_two_phases(tiny_policy):
    """oar_p_screened: an OAR-G phase (3 forwards a batch), then an OAR-P phase (1 a forward), each padded."""
    model, tokenizer = _load(tiny_policy)
    rows = RANK_ROWS[0] + RANK_ROWS[1]
    plain, plain_calls = _forwards(model, lambda: scores(model, tokenizer, rows, None, ["oar_p_screened"]))
    sync = ExtraCalls(extra=1)
    padded, padded_calls = _forwards(model, lambda: scores(model, tokenizer, rows, sync, ["oar_p_screened"]))
    for a, b in zip(plain["oar_p_screened"], padded["oar_p_screened"]):
        np.testing.assert_array_equal(b, a)
    batches, forwards = sync.planned
    assert plain_calls == 3 * batches + forwards and padded_calls == plain_calls + 3 + 1


# ---- 2 ranks, FSDP1: attribution on the shards ---------------------------------------------------------------

def _launch_attribution(policy: Path, out: Path, mode: str, timeout: float) -> subprocess.CompletedProcess:
    if mode.endswith("zero3"):
        pytest.importorskip("deepspeed")
    return _run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                 str(_free_port()), str(TESTS / "fsdp_attribution_worker.py"), str(policy), str(out), mode], timeout,
                env={**os.environ, "DS_ACCELERATOR": "cpu"})  # DeepSpeed's CPU accelerator (gloo)


@pytest.mark.parametrize("mode", ["padded", "gathered", "padded-zero3", "padded-empty"])
def test_attribution_on_sharded_ranks_gives_the_scores_of_one_process(tiny_policy, tmp_path, mode):
    """FSDP1 on the shards (padded calls) or on gathered weights (no collective), DeepSpeed ZeRO-3, and FSDP1
    with a rank that has nothing to score."""
    # the timeout only guards against a hang: ZeRO-3's 2 ranks on 2 busy cores once took over 120 s
    launched = _launch_attribution(tiny_policy, tmp_path / "ranks.json", mode, timeout=300)
    assert launched.returncode == 0, launched.stderr[-3000:]
    ranks = json.loads((tmp_path / "ranks.json").read_text())
    model, tokenizer = _load(tiny_policy)
    expected = scores(model, tokenizer, list(range(4)), None)
    assert [len(rank["rows"]) for rank in ranks] == ([4, 0] if mode == "padded-empty" else [3, 1])  # rank 1 pads
    for rank in ranks:
        assert rank["with_grad"] == []  # OAR-G's gradient is the embeddings', no parameter's
        for method in METHODS:
            for row, values in zip(rank["rows"], rank["scores"][method]):
                np.testing.assert_allclose(values, expected[method][row], rtol=1e-4, atol=1e-7,
                                           err_msg=f"{method} row {row}")
    assert any(np.nanmax(values) > 0 for values in expected["oar_g"])


@pytest.mark.parametrize("mode", ["unpadded", pytest.param("unpadded-zero3", marks=pytest.mark.slow)])
def test_a_rank_that_skips_its_dummy_calls_makes_the_launch_fail(tiny_policy, tmp_path, mode):
    """The control of the padding: rank 1 agrees on the counts but makes fewer calls; gloo's 10 s collective
    timeout (or a size mismatch) ends the launch, which never writes its result."""
    try:
        launched = _launch_attribution(tiny_policy, tmp_path / "ranks.json", mode, timeout=150)
    except subprocess.TimeoutExpired:
        launched = None  # hung: as bad, and what the padding prevents
    assert launched is None or (launched.returncode != 0 and "gloo" in launched.stderr)  # a collective failed
    assert not (tmp_path / "ranks.json").exists()


# ---- 2 ranks, FSDP1: OARGRPOTrainer -----------------------------------------------------------------------

@pytest.fixture(scope="module", params=["cpu-fsdp-2proc-trl", "cpu-fsdp2-2proc-trl"], ids=["fsdp1", "fsdp2"])
def fsdp_trl_run(request, tiny_policy, signal_data, tmp_path_factory) -> Path:
    """tests/trl_fsdp_worker.py once under FSDP1, once under FSDP2 (~30-90 s each): four short trainings."""
    out = tmp_path_factory.mktemp(f"trl-{request.param}")
    launched = _run([str(Path(sys.executable).parent / "accelerate"), "launch", "--config_file",
                     str(ROOT / "configs" / "accelerate" / f"{request.param}.yaml"), "--main_process_port",
                     str(_free_port()), str(TESTS / "trl_fsdp_worker.py"), str(tiny_policy), str(signal_data["train"]),
                     str(out)], timeout=300)
    assert launched.returncode == 0, launched.stderr[-3000:]
    return out


def test_uniform_under_fsdp_is_stock_trl_under_fsdp(fsdp_trl_run, tiny_policy):
    from safetensors.torch import load_file

    stock, ours = (json.loads((fsdp_trl_run / f"{name}.json").read_text())["losses"] for name in ("stock", "uniform"))
    assert len(stock) == 2 and ours == pytest.approx(stock, rel=1e-5, abs=1e-8)
    before = load_file(tiny_policy / "model.safetensors")
    stock, ours = (torch.load(fsdp_trl_run / f"{name}.pt") for name in ("stock", "uniform"))
    assert stock.keys() == ours.keys() and set(before) <= set(stock)
    for name in stock:
        torch.testing.assert_close(ours[name], stock[name], rtol=1e-5, atol=1e-5)
    assert any(not torch.allclose(stock[name], before[name], atol=1e-6) for name in before)  # it did train


@pytest.mark.parametrize("method", list(ATTRIBUTION))
def test_oar_under_fsdp_gives_the_token_advantages_of_one_process(fsdp_trl_run, tiny_policy, signal_data, tmp_path,
                                                                   method):
    from oarctl.integrations.trl import OARGRPOTrainer

    torch.manual_seed(0)
    uneven_completions_class(OARGRPOTrainer)(
        model=str(tiny_policy), reward_funcs=boxed_reward, train_dataset=dataset(signal_data["train"]),
        args=grpo_args(tmp_path / "trl", bf16=False), attribution=ATTRIBUTION[method], oar_log_dir=tmp_path).train()
    one, two = (pq.read_table(folder / "step_0000" / "advantages.parquet").to_pylist()
                for folder in (tmp_path, fsdp_trl_run / method))
    assert len(one) == len(two) == 8
    for row, (a, b) in enumerate(zip(one, two)):
        assert a["response_token_ids"] == b["response_token_ids"]
        for column in ("token_weights", "token_advantages"):
            np.testing.assert_allclose(b[column], a[column], rtol=1e-4, atol=1e-6, err_msg=f"{column}, row {row}")
    assert any(np.ptp(r["token_weights"]) > 0.1 for r in two)
    counts = [json.loads((fsdp_trl_run / f"counts-{rank}.json").read_text()) for rank in (0, 1)]
    assert any(mine < most for rank in counts for mine, most in rank)  # a rank padded its calls


def test_the_example_runs_under_the_cpu_fsdp_config(cli, tmp_path):
    """examples/trl_oar.py as the README launches it, shrunk to 2 steps of 2 prompts (~30-60 s)."""
    out = tmp_path / "trl-oar"
    launched = _run([str(Path(sys.executable).parent / "accelerate"), "launch", "--config_file",
                     str(ROOT / "configs" / "accelerate" / "cpu-fsdp-2proc-trl.yaml"), "--main_process_port",
                     str(_free_port()), str(ROOT / "examples" / "trl_oar.py"), "--steps", "2", "--prompts-per-step",
                     "2", "--out", str(out)], timeout=300)
    assert launched.returncode == 0, launched.stderr[-3000:]
    assert "2 steps in" in launched.stdout and "on 2 processes on cpu, FSDP;" in launched.stdout
    assert cli("show", out / "step_0001" / "advantages.parquet", "--row", "0").exit_code == 0


def test_a_bad_attribution_params_is_one_line_naming_the_option(tiny_policy, signal_data, tmp_path):
    from oarctl.errors import OarError
    from oarctl.integrations.trl import OARGRPOTrainer

    with pytest.raises(OarError, match="^attribution_params: expected 'sharded' or 'gathered', got 'all'$"):
        OARGRPOTrainer(model=str(tiny_policy), reward_funcs=boxed_reward, args=grpo_args(tmp_path),
                       train_dataset=dataset(signal_data["train"]), attribution_params="all")
