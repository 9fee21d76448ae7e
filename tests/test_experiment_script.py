"""scripts/experiment.sh end to end at a tiny size: paired seeds on one held-out set, the base
evaluation shared within a seed, the paired tables, the cost by stage and fidelity against the truth."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_tiny_experiment_pairs_seeds_on_one_heldout_set(tmp_path):
    wrapper = tmp_path / "oarctl"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m oarctl.cli "$@"\n')
    wrapper.chmod(0o755)
    out = tmp_path / "exp"
    env = {**os.environ, "OUT": str(out), "OARCTL": str(wrapper), "SEEDS": "0 1", "METHODS": "uniform truth", "CEILING_SEEDS": "",
           "STEPS": "2", "PROMPTS": "2", "HELDOUT": "8", "EVAL_EVERY": "0", "FIDELITY_SAMPLE": "2",
           "FIDELITY_METHODS": "truth,random", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "KEEP": str(tmp_path / "kept")}
    result = subprocess.run(["bash", str(REPO / "scripts" / "experiment.sh")], env=env, capture_output=True,
                            text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]

    def base_eval(run: str) -> dict:
        lines = [json.loads(x) for x in (out / run / "metrics.jsonl").read_text().splitlines()]
        return next(x for x in lines if x.get("kind") == "eval" and x["after_steps"] == 0)

    # one held-out set for every seed: greedy decoding of the same base scores it the same
    assert base_eval("uniform-s0")["eval/greedy_accuracy"] == base_eval("uniform-s1")["eval/greedy_accuracy"]
    for seed in (0, 1):  # truth's base evaluation is uniform's, taken from the cache, not recomputed
        assert base_eval(f"truth-s{seed}") == base_eval(f"uniform-s{seed}")
        assert "base.parquet: done (cached)" in (out / f"truth-s{seed}.log").read_text()
        assert "base.parquet: running: no output yet" in (out / f"uniform-s{seed}.log").read_text()
    table = (out / "compare.md").read_text()
    assert "Paired difference to uniform" in table
    assert "| truth | 2 |" in table
    fidelity = (out / "fidelity.md").read_text()
    assert "truth" in fidelity and "random" in fidelity
    # every finished run is kept (metrics and config): a clone without runs/ picks them up instead of training
    for run in ("uniform-s0", "uniform-s1", "truth-s0", "truth-s1"):
        assert (tmp_path / "kept" / run / "metrics.jsonl").read_bytes() == (out / run / "metrics.jsonl").read_bytes()
        assert (tmp_path / "kept" / run / "config.yaml").is_file()
        assert len(json.loads((tmp_path / "kept" / run / "seconds.json").read_text())["steps"]) == 2  # STEPS
    import shutil

    shutil.rmtree(out / "truth-s1")  # as in a fresh clone: the run is gone, its kept metrics are not
    again = subprocess.run(["bash", str(REPO / "scripts" / "experiment.sh")], env=env, capture_output=True,
                           text=True, timeout=900)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert "truth seed 1: finished before" in again.stdout and not (out / "truth-s1" / "step_0000").exists()
    assert (out / "truth-s1" / "seconds.json").is_file()  # its cost comes back with it
    assert "| truth | 2 |" in (out / "compare.md").read_text()
    cost = table.split("Seconds per step by stage")[1]
    assert "| uniform |" in cost and "| truth |" in cost


def test_the_samples_control_runs_grpo_on_one_and_a_half_times_the_responses(tmp_path):
    """`uniform_1.5x` (issue 40's positive control): plain GRPO with 1.5x the prompts a step, all of its
    responses in one optimizer step. A stand-in oarctl records each call; its --set overrides come after the
    experiment's defaults, so they are the ones the config keeps (later overrides win)."""
    calls = tmp_path / "calls"
    fake = tmp_path / "oarctl"
    fake.write_text(  # `run`: write a finished run's metrics; anything else: do nothing
        '#!/usr/bin/env bash\necho "$*" >> "' + str(calls) + '"\n'
        'if [ "$1" = run ]; then while [ $# -gt 0 ]; do [ "$1" = --run-dir ] && dir=$2; shift; done\n'
        '  mkdir -p "$dir" && echo \'{"kind": "eval", "after_steps": 2, "eval/avg@1": 0.5}\' > "$dir/metrics.jsonl"; echo done; fi\n')
    fake.chmod(0o755)
    env = {**os.environ, "OUT": str(tmp_path / "exp"), "OARCTL": str(fake), "SEEDS": "7",
           "METHODS": "uniform uniform_1.5x", "CEILING_SEEDS": "", "STEPS": "2", "PROMPTS": "24"}
    result = subprocess.run(["bash", str(REPO / "scripts" / "experiment.sh")], env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    run = next(line.split() for line in calls.read_text().splitlines() if "uniform_1.5x-s7" in line)
    overrides = [run[i + 1] for i, word in enumerate(run) if word == "--set"]

    def last(key: str) -> str:
        return [o for o in overrides if o.startswith(key + "=")][-1].split("=", 1)[1]

    assert last("sample.prompts_per_step") == "36" and last("update.mini_batch_size") == "288"
    assert last("attribute.method") == "uniform" and last("run.seed") == "7"


def test_the_wide_experiment_refuses_a_worktree_that_is_not_the_plans_commit(tmp_path):
    """scripts/wide_credit.sh runs issue 40's experiment only from a clean checkout of the plan's commit:
    runs of other code would not pair with the kept ones."""
    tree = tmp_path / "tree"
    tree.mkdir()
    git = ["git", "-C", str(tree), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    (tree / "file").write_text("x")
    subprocess.run([*git, "add", "file"], check=True)
    subprocess.run([*git, "commit", "-qm", "another commit"], check=True)
    result = subprocess.run(["bash", str(REPO / "scripts" / "wide_credit.sh")], env={**os.environ, "TREE": str(tree)},
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr == (f"error: {tree} is not a clean checkout of ceab40e: the runs must use the plan's "
                             "code unchanged\n")
