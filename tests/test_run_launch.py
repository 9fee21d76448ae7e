"""`oarctl run` with update.accelerate_config / attribute.accelerate_config: each step's update (here FSDP
over two CPU processes, as the 7B configs' fsdp.yaml over GPUs) or attribute stage (two CPU ranks, the
policy replicated) runs under `accelerate launch`, and the run continues from what the launched
processes wrote."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from conftest import hidden_temporaries, oarctl_executable
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[1]
FSDP_ON_TWO_CPU_PROCESSES = ROOT / "configs" / "accelerate" / "cpu-fsdp-2proc.yaml"
TWO_CPU_PROCESSES = ROOT / "configs" / "accelerate" / "cpu-2proc.yaml"


def _largest_difference(one: Path, two: Path) -> float:
    first, second = load_file(one / "model.safetensors"), load_file(two / "model.safetensors")
    assert first.keys() == second.keys()
    return max(float((first[name] - second[name]).abs().max()) for name in first)


def _in_process_then_launched(cli, config: Path, tmp_path: Path, stage: str, launcher: Path) -> list[str]:
    """Run the config in-process (tmp_path/single), then with the stage launched (tmp_path/launched):
    two steps, two launches. Returns the launch's --set arguments."""
    single = cli("run", "-c", config, "--run-dir", tmp_path / "single")
    assert single.exit_code == 0, single.output
    launch = ["--set", f"{stage}.accelerate_config={launcher}"]
    launched = cli("run", "-c", config, "--run-dir", tmp_path / "launched", *launch)
    assert launched.exit_code == 0, launched.output
    assert launched.output.count(f"{stage}: accelerate launch --config_file") == 2
    assert launched.output.count("accelerate launch --config_file") == 2  # the other stage stays in-process
    return launch


def _resumes_without_launching(cli, config: Path, run_dir: Path, launch: list[str]) -> None:
    resumed = cli("run", "-c", config, "--run-dir", run_dir, *launch)
    assert resumed.exit_code == 0, resumed.output
    assert "accelerate launch" not in resumed.output  # every launched stage is a cache hit: nothing launched


def test_a_run_launches_each_update_and_matches_the_in_process_run(cli, tiny_config, tiny_policy, tmp_path):
    """~40 s: two launches, each starting three Python processes that import torch."""
    config = tiny_config(signal=True, run={"steps": 2, "progress": False})
    launch = _in_process_then_launched(cli, config, tmp_path, "update", FSDP_ON_TWO_CPU_PROCESSES)
    # step 0: same batch, so the same weights up to float summation order; step 1 samples from them
    step = "step_0000/policy"
    assert _largest_difference(tiny_policy, tmp_path / "single" / step) > 1e-4  # the update did change them
    assert _largest_difference(tmp_path / "single" / step, tmp_path / "launched" / step) < 1e-5
    assert (tmp_path / "launched" / "step_0001" / "policy" / "checkpoint.json").exists()
    assert len(list((tmp_path / "launched" / step / "training_state" / "optimizer").glob("shard-*.safetensors"))) > 1  # FSDP AdamW
    _resumes_without_launching(cli, config, tmp_path / "launched", launch)
    _resumes_after_a_kill_between_the_policy_and_its_training_state(cli, config, tmp_path / "launched", launch)


def _resumes_after_a_kill_between_the_policy_and_its_training_state(cli, config: Path, run_dir: Path,
                                                                    launch: list[str]) -> None:
    """What a run killed while step 0's ranks wrote the training state leaves: the policy committed (and
    step 1 sampled from it meanwhile), no training_state/, a dead writer's temporary, no manifest. The
    rerun launches step 0's update again, which writes the same weights, so step 1's stages stay done."""
    policy = run_dir / "step_0000" / "policy"
    weights = (policy / "model.safetensors").read_bytes()
    shutil.rmtree(policy / "training_state")
    (run_dir / "step_0000" / "policy.manifest.json").unlink()
    (policy / ".training_state.tmp-999999999").mkdir()  # no such process: swept
    status = cli("status", run_dir)
    rows = [tuple(line.split(None, 2)) for line in status.stdout.splitlines()]
    assert ("step_0000", "update", "incomplete (no manifest)") in rows, status.stdout
    resumed = cli("run", "-c", config, "--run-dir", run_dir, *launch)
    assert resumed.exit_code == 0, resumed.output
    assert resumed.output.count("update: accelerate launch") == 1 and "(step 0)" in resumed.output
    assert not re.search(r"^\[sample\] .*: running", resumed.output, re.M)  # step 1: cache hits
    assert "step_0001/policy: running" not in resumed.output
    assert (policy / "model.safetensors").read_bytes() == weights
    assert (policy / "training_state" / "checkpoint.json").exists()
    assert hidden_temporaries(run_dir) == []


def test_a_launch_is_ready_when_its_stage_says_so_before_it_ends(tmp_path):
    """Launched.wait_ready returns once the launched process wrote the file named by OARCTL_READY_FILE
    (the update's policy is committed), while it still runs (the training state); finish waits for the
    end, and a failure there is an error naming the output."""
    from oarctl.errors import OarError
    from oarctl.processes.launch import Launched

    script = ("import os, pathlib, sys, time; pathlib.Path(os.environ['OARCTL_READY_FILE']).write_text('{}'); "
              "time.sleep(float(sys.argv[1])); sys.exit(int(sys.argv[2]))")
    output = tmp_path / "policy"
    ready = Launched("update", [sys.executable, "-c", script, "30", "0"], output, "fake.yaml")
    ready.wait_ready()
    assert ready.process.poll() is None  # ready, yet still running
    ready.process.terminate()
    with pytest.raises(OarError, match=f"{output}: the update under accelerate launch .fake.yaml. exited with code"):
        ready.finish()
    failing = Launched("update", [sys.executable, "-c", "import sys; sys.exit(3)"], output, "fake.yaml")
    with pytest.raises(OarError, match="exited with code 3"):
        failing.wait_ready()  # it ended without saying ready: its failure comes out here
    assert hidden_temporaries(tmp_path) == []


def test_a_persistent_update_worker_keeps_the_model_and_matches_one_launch_per_step(cli, tiny_config, tmp_path):
    """update.persistent: the FSDP ranks are launched once for the run and keep the model, AdamW state
    (and step counts) in memory; from the second step on they read no checkpoint bytes, yet every step's
    weights and AdamW state are byte for byte those of one launch per step (which reads them from disk),
    so the samples drawn from them are too. The run leaves no worker process and no temporary behind."""
    config = tiny_config(signal=True, run={"steps": 3, "progress": False, "eval_every": 0, "keep_checkpoints": 3},
                         update={"micro_batch_tokens": 80})
    launch = ["--set", f"update.accelerate_config={FSDP_ON_TWO_CPU_PROCESSES}"]
    per_step = cli("run", "-c", config, "--run-dir", tmp_path / "per_step", *launch)
    assert per_step.exit_code == 0, per_step.output
    persistent = cli("run", "-c", config, "--run-dir", tmp_path / "persistent", *launch, "--set", "update.persistent=true")
    assert persistent.exit_code == 0, persistent.output
    assert per_step.output.count("accelerate launch") == 3 and persistent.output.count("accelerate launch") == 1
    for step in ("step_0000", "step_0001", "step_0002"):
        one, two = tmp_path / "per_step" / step, tmp_path / "persistent" / step
        assert (one / "policy" / "model.safetensors").read_bytes() == (two / "policy" / "model.safetensors").read_bytes()
        state_one, state_two = one / "policy" / "training_state", two / "policy" / "training_state"
        assert (state_one / "optimizer.json").read_bytes() == (state_two / "optimizer.json").read_bytes()
        shards = sorted(p.name for p in (state_one / "optimizer").iterdir())
        assert shards and shards == sorted(p.name for p in (state_two / "optimizer").iterdir())
        for shard in (state_one / "optimizer").iterdir():  # the tensors (DCP's header order varies from run to run)
            first, second = load_file(shard), load_file(state_two / "optimizer" / shard.name)
            assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)
        assert (one / "rollouts.parquet").read_bytes() == (two / "rollouts.parquet").read_bytes()
        metrics = json.loads((two / "policy.manifest.json").read_text())["metrics"]
        kept = step != "step_0000"
        assert metrics["resident"] == int(kept) and (metrics["checkpoint_bytes_read"] == 0) == kept, (step, metrics)
    assert hidden_temporaries(tmp_path / "persistent") == []
    assert _wait_for(lambda: not _processes_naming(tmp_path / "persistent"), 30)
    _resumes_without_launching(cli, config, tmp_path / "persistent", [*launch, "--set", "update.persistent=true"])


def _token_scores(path: Path) -> list[np.ndarray]:
    return [np.array(s, dtype=np.float64) for s in pq.read_table(path)["token_scores"].to_pylist()]


def test_a_run_launches_each_attribute_stage_and_matches_the_in_process_run(cli, tiny_config, tmp_path):
    """~40-70 s: two launches of three Python processes. The embedded toy policy writes reasoning, so
    OAR-G has tokens to score; skip_uniform_groups leaves the uniform groups unscored on the ranks too."""
    config = tiny_config(policy={"path": "toy"}, run={"steps": 2, "progress": False},
                         sample={"prompts_per_step": 2, "group_size": 4, "max_new_tokens": 40},
                         attribute={"method": "oar_g", "skip_uniform_groups": True})
    launch = _in_process_then_launched(cli, config, tmp_path, "attribute", TWO_CPU_PROCESSES)
    # step 0: the same verified rows, so the same scores up to OAR-G's batching (tests/test_attribute_ranks.py)
    step = "step_0000/attributions.parquet"
    one, two = pq.read_table(tmp_path / "single" / step), pq.read_table(tmp_path / "launched" / step)
    assert one.drop(["token_scores"]).equals(two.drop(["token_scores"]))
    single_scores = _token_scores(tmp_path / "single" / step)
    assert any(np.isfinite(a).any() for a in single_scores)  # some group was mixed: scores to compare
    for a, b in zip(single_scores, _token_scores(tmp_path / "launched" / step), strict=True):
        assert np.array_equal(np.isnan(a), np.isnan(b))
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-3 * np.nanmax(np.abs(a), initial=0.0))
    assert (tmp_path / "launched" / "step_0001" / "attributions.parquet.manifest.json").exists()
    _resumes_without_launching(cli, config, tmp_path / "launched", launch)


@pytest.mark.parametrize("stage", ["attribute", "update"])
def test_a_missing_accelerate_config_is_one_line(cli, tiny_config, tmp_path, stage):
    result = cli("run", "-c", tiny_config(), "--run-dir", tmp_path / "run",
                 "--set", f"{stage}.accelerate_config=no/such.yaml")
    assert result.exit_code != 0
    assert f"no/such.yaml: {stage}.accelerate_config file not found" in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "run" / "step_0000").exists()  # checked before the run starts


@pytest.mark.parametrize("launcher, message", [
    (None, "update.persistent needs update.accelerate_config"),
    (str(ROOT / "configs" / "accelerate" / "cpu-2proc.yaml"),
     "cpu-2proc.yaml: update.persistent needs an FSDP accelerate config (distributed_type: FSDP), this one is MULTI_GPU")])
def test_a_persistent_update_without_fsdp_is_one_line(cli, tiny_config, tmp_path, launcher, message):
    """update.persistent keeps FSDP ranks: asked without a launcher, or with another strategy, it is an
    error before the run starts, not a worker that silently reloads every step (or none at all)."""
    launch = ["--set", f"update.accelerate_config={launcher}"] if launcher else []
    result = cli("run", "-c", tiny_config(), "--run-dir", tmp_path / "run", *launch, "--set", "update.persistent=true")
    assert result.exit_code != 0
    assert message in result.output and "Traceback" not in result.output
    assert not (tmp_path / "run" / "step_0000").exists()


def _processes_naming(path: Path) -> list[int]:
    """Live processes whose command line names `path` (the launcher and its ranks name the launched
    stage's input file)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and str(path).encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue  # it ended while we looked
    return found


def _wait_for(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return condition()


# launched -> (stage, accelerate config, what its launcher and ranks name (in the run folder), its output,
# the file that finishes it, more --set)
LAUNCHED = {"update": ("update", FSDP_ON_TWO_CPU_PROCESSES, "step_0000/advantages.parquet", "policy",
                       "policy.manifest.json", []),
            "persistent update": ("update", FSDP_ON_TWO_CPU_PROCESSES, ".update-worker.tmp-", "policy",
                                  "policy.manifest.json", ["--set", "update.persistent=true"]),
            "attribute": ("attribute", TWO_CPU_PROCESSES, "step_0000/verified.parquet", "attributions.parquet",
                          "attributions.parquet.manifest.json", [])}


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc to find the launched processes")
@pytest.mark.parametrize("launched", list(LAUNCHED))
def test_a_run_killed_during_a_launched_stage_leaves_no_rank_behind_and_resumes(tiny_config, tmp_path, launched):
    """SIGKILL of `oarctl run` while the launcher and both ranks are up: the launcher gets SIGTERM
    (parent-death signal) and stops its ranks; rerunning the command finishes the step. The persistent
    update worker too: the rerun starts one that reads the checkpoint from disk."""
    stage, launcher_config, name, output_name, finished, extra = LAUNCHED[launched]
    config = tiny_config(signal=True, run={"steps": 1, "progress": False})
    run = tmp_path / "run"
    command = [oarctl_executable(), "run", "-c", str(config), "--run-dir", str(run),
               "--set", f"{stage}.accelerate_config={launcher_config}", *extra]
    named = f"{run}/{name}"
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert _wait_for(lambda: len(_processes_naming(named)) >= 3, 120), "launcher + 2 ranks never ran"
    finally:
        process.kill()
        process.wait()
    # torchrun gives its ranks 30 s after SIGTERM, then SIGKILLs them: wait past that grace period
    assert _wait_for(lambda: not _processes_naming(named), 60), _processes_naming(named)
    # stopped, not finished as orphans (ranks that outlive the run would write the step on their own,
    # racing the rerun's launch; killed this early, they were still importing torch)
    assert not (run / "step_0000" / output_name).exists()
    assert not (run / "step_0000" / f"{output_name}.manifest.json").exists()

    resumed = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert (run / "step_0000" / finished).exists()
    assert (run / "step_0000" / "policy" / "checkpoint.json").exists()
    assert hidden_temporaries(run) == []
