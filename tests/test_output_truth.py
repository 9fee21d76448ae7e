"""What oarctl prints tells the truth (issue 41): a stage says why it runs or that it was cached, no
third-party warning about DeepSpeed (which nothing here uses), no progress-bar fragments in a log, and
`status` says what a folder it cannot read is not."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess

import pytest
import torch
import yaml

from conftest import oarctl_executable
from oarctl.pipeline import STEP_STAGES


def run_oarctl(*args, timeout: float = 600) -> subprocess.CompletedProcess:
    """Without DS_ACCELERATOR, which an update run in this test process may have set (and children inherit)."""
    environment = {k: v for k, v in os.environ.items() if k != "DS_ACCELERATOR"}
    return subprocess.run([oarctl_executable(), *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          env=environment)


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None or torch.cuda.is_available(),
                    reason="DeepSpeed's CPU warning needs DeepSpeed installed and no CUDA")
def test_a_one_step_run_piped_to_a_log_says_why_each_stage_runs_and_nothing_else(tiny_config, tmp_path):
    """One subprocess run (~1 min on 2 busy cores: DeepSpeed's import alone takes ~20 s, which the update's
    save_pretrained triggers through accelerate), with progress bars asked for: stderr is a pipe here."""
    config = tiny_config(run={"steps": 1, "progress": True})
    run_dir = tmp_path / "R"
    first = run_oarctl("run", "-c", config, "--run-dir", run_dir)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "Setting accelerator" not in first.stderr and "DeepSpeed" not in first.stderr, first.stderr
    assert "(not run)" not in first.stderr and "\r" not in first.stderr, first.stderr  # no bar fragments
    stages = re.findall(r"^\[(\w+)\] (\S+): (.*)$", first.stderr, re.M)
    assert [name for name, _, _ in stages] == ["evaluate", "sample", "verify", "attribute", "reshape", "update",
                                               "evaluate"]
    assert {state for _, _, state in stages} == {"running: no output yet"}
    changed = run_oarctl("run", "-c", config, "--run-dir", run_dir, "--set", "update.learning_rate=0.5")
    assert changed.returncode == 0, changed.stderr[-3000:]
    states = [(name, state) for name, _, state in re.findall(r"^\[(\w+)\] (\S+): (.*)$", changed.stderr, re.M)]
    assert states[:-1] == [("evaluate", "done (cached)"), *[(name, "done (cached)") for name in STEP_STAGES[:-1]],
                           ("update", "running: config changed (update.learning_rate)")]
    # the final evaluation reruns only if the weights changed (groups of equal rewards change none)
    assert states[-1][0] == "evaluate"


def test_save_policy_tells_deepspeed_there_is_no_gpu_before_transformers_imports_it(tiny_policy, tmp_path,
                                                                                     monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from oarctl.checkpoints import save_policy

    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    save_policy(AutoModelForCausalLM.from_pretrained(tiny_policy), AutoTokenizer.from_pretrained(tiny_policy),
                tmp_path / "p")
    assert os.environ.get("DS_ACCELERATOR") == (None if torch.cuda.is_available() else "cpu")
    monkeypatch.setenv("DS_ACCELERATOR", "mps")  # a value the user chose is theirs
    save_policy(AutoModelForCausalLM.from_pretrained(tiny_policy), AutoTokenizer.from_pretrained(tiny_policy),
                tmp_path / "q")
    assert os.environ["DS_ACCELERATOR"] == "mps"


def test_status_says_what_a_folder_is_not(cli, tmp_path):
    trl = tmp_path / "trl-oar"  # as OARGRPOTrainer(oar_log_dir=...) leaves it (oarctl/integrations/trl_log.py)
    (trl / "tokenizer").mkdir(parents=True)
    (trl / "step_0000").mkdir()
    (trl / "config.yaml").write_text(yaml.safe_dump({"policy": {"path": str(trl / "tokenizer")}}))
    (trl / "step_0000" / "advantages.parquet.manifest.json").write_text(json.dumps(
        {"stage": "trl_oar", "key_parts": {"config": {"trl": "0.29.0"}}}))
    result = cli("status", trl)
    assert result.exit_code == 2 and result.stderr.count("\n") == 1, result.output
    assert "not an `oarctl run` folder" in result.stderr and "written by a TRL 0.29.0 run" in result.stderr
    (tmp_path / "empty").mkdir()
    result = cli("status", tmp_path / "empty")
    assert result.exit_code == 2 and "not an `oarctl run` folder (no config.yaml" in result.stderr
