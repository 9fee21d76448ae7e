"""The loop end to end: smoke run, stage-by-stage from the shell == `oarctl run`, status, resume after
SIGKILL (byte-identical to an uninterrupted run, nothing finished recomputed), log-prob alignment."""
from __future__ import annotations

import json
import random
import re
import signal
import subprocess
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from conftest import hidden_temporaries, oarctl_executable, run_oarctl, sha256, walk_while_written
from oarctl.artifacts import SCHEMAS, read_artifact, write_parquet
from oarctl.checkpoints import load_policy
from oarctl.config import load_config
from oarctl.data import toy_prompts
from oarctl.pipeline import STAGES, STEP_OUTPUTS, STEP_STAGES, _stage_context, run_stage
from oarctl.stages import attribute, reshape, verify
from oarctl.policy.logprobs import response_token_stats

ACCURACY = re.compile(r"^held-out accuracy: base (\d+\.\d)% -> trained (\d+\.\d)% \(greedy; sampled avg@\d+ "
                      r"\d+\.\d% -> \d+\.\d%\)$", re.M)
ARTIFACT_KIND = {"rollouts.parquet": "rollouts", "verified.parquet": "verified",
                 "attributions.parquet": "attributions", "advantages.parquet": "advantages",
                 "update.parquet": "update_log"}


def parquet_files(folder: Path) -> dict[str, Path]:
    """Relative path -> file, for every finished Parquet file (not inside a hidden temporary)."""
    return {str(p.relative_to(folder)): p for p in sorted(folder.rglob("*.parquet"))
            if not any(".tmp-" in part for part in p.relative_to(folder).parts)}


def expected_outputs(run_dir: Path, steps: int, evals: list[int]) -> list[Path]:
    outputs = [run_dir / "eval" / "base.parquet"] + [run_dir / "eval" / f"step_{s:04d}.parquet" for s in evals]
    for step in range(steps):
        outputs += [run_dir / f"step_{step:04d}" / STEP_OUTPUTS[name] for name in STEP_STAGES]
    return outputs


def manifest_of(output: Path) -> Path:
    return output.with_name(output.name + ".manifest.json")


def status_rows(text: str) -> list[tuple[str, str, str]]:
    rows = []
    for line in text.splitlines():
        where, stage, state = line.split(None, 2)
        rows.append((where, stage, state))
    return rows


# ---- 10. smoke test -----------------------------------------------------------------------------

def test_run_end_to_end_then_everything_is_cached(cli, tiny_config, tmp_path):
    config = tiny_config(run={"steps": 3, "progress": False, "eval_every": 2, "keep_checkpoints": 1})
    run_dir = tmp_path / "R"
    result = cli("run", "-c", config, "--run-dir", run_dir)
    assert result.exit_code == 0, result.output
    match = ACCURACY.search(result.stdout)
    assert match, result.stdout
    assert "step 1/3: reward" in result.stderr and "step 3/3: reward" in result.stderr

    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines if x["kind"] == "step"] == [0, 1, 2]
    evals = [x for x in lines if x["kind"] == "eval"]
    assert [x["after_steps"] for x in evals] == [0, 2, 3]
    for line in evals:
        assert {"eval/greedy_accuracy", "eval/avg@2", "eval/pass@1", "eval/pass@2", "eval/prompts"} <= set(line)
        assert line["eval/prompts"] == 8
        assert 0 <= line["eval/pass@1"] <= line["eval/pass@2"] <= 1
    for line in lines:
        if line["kind"] == "step":
            assert {"sample/responses", "verify/reward_mean", "reshape/mixed_group_fraction", "update/loss",
                    "update/ratio_mean", "update/grad_norm"} <= set(line)
            assert line["sample/responses"] == 8
    assert float(match.group(1)) == pytest.approx(100 * evals[0]["eval/greedy_accuracy"], abs=0.05)
    assert float(match.group(2)) == pytest.approx(100 * evals[-1]["eval/greedy_accuracy"], abs=0.05)

    for output in expected_outputs(run_dir, 3, [1, 2]):
        assert output.exists() and manifest_of(output).exists(), output
    # keep_checkpoints=1: the step 0 policy lost its weights but kept its identity; the evaluated
    # step 1 and the final step 2 keep theirs
    assert sorted(p.name for p in (run_dir / "step_0000" / "policy").iterdir()) == ["PRUNED", "checkpoint.json"]
    assert (run_dir / "step_0001" / "policy" / "model.safetensors").exists()
    assert (run_dir / "step_0002" / "policy" / "model.safetensors").exists()
    assert hidden_temporaries(run_dir) == []

    before = {p: p.stat().st_mtime_ns for p in run_dir.rglob("*") if p.is_file() and p.name != "metrics.jsonl"
              and p.name != "config.yaml"}
    again = cli("run", "-c", config, "--run-dir", run_dir)
    assert again.exit_code == 0, again.output
    stage_lines = re.findall(r"^\[.*$", again.stderr, re.M)  # every stage says it was a cache hit
    assert stage_lines and all(line.endswith(": done (cached)") for line in stage_lines), again.stderr
    assert ACCURACY.search(again.stdout).groups() == match.groups()
    assert {p: p.stat().st_mtime_ns for p in before} == before


def test_show_prints_row_count_and_schema_of_every_artifact(cli, tiny_config, tmp_path):
    run_dir = tmp_path / "R"
    assert cli("run", "-c", tiny_config(run={"steps": 1, "progress": False}), "--run-dir", run_dir).exit_code == 0
    step = run_dir / "step_0000"
    cases = [(run_dir / "data" / "train.parquet", 32, "prompts"), (run_dir / "data" / "heldout.parquet", 8, "prompts"),
             (run_dir / "eval" / "base.parquet", 8 * (1 + 2), "eval_results"),
             (step / "policy", 1, "update_log")]
    cases += [(step / name, 8, kind) for name, kind in ARTIFACT_KIND.items() if name != "update.parquet"]
    for path, rows, kind in cases:
        result = cli("show", path, "-n", "1")
        assert result.exit_code == 0, result.output
        first = result.stdout.splitlines()[0]
        assert re.search(rf": {rows} rows, {len(SCHEMAS[kind])} columns$", first), first
        for field in SCHEMAS[kind]:  # list types print as list<element: ...> or list<item: ...>
            kind_of_type = str(field.type).split("<")[0]
            assert re.search(rf"^  {field.name}: {re.escape(kind_of_type)}\b", result.stdout, re.M), (path, field)
        assert "row 0:" in result.stdout and "row 1:" not in result.stdout
    manifest = cli("show", manifest_of(step / "rollouts.parquet"))
    assert manifest.exit_code == 0 and json.loads(manifest.stdout)["stage"] == "sample"
    metrics = cli("show", run_dir / "metrics.jsonl")
    assert metrics.exit_code == 0 and '"kind": "step"' in metrics.stdout


def _ran(stderr: str) -> list[str]:
    """The outputs of the stages a run ran (`[stage] OUT: running: why`), not those it found cached."""
    return [line.split()[1].rstrip(":") for line in stderr.splitlines()
            if line.startswith("[") and ": running: " in line]


def test_more_steps_resume_where_the_run_stopped(cli, tiny_config, tmp_path):
    config = tiny_config(signal=True)
    run_dir = tmp_path / "R"
    assert cli("run", "-c", config, "--run-dir", run_dir, "--steps", "1").exit_code == 0
    first = _snapshot(run_dir)
    longer = cli("run", "-c", config, "--run-dir", run_dir, "--steps", "2")
    assert longer.exit_code == 0, longer.output
    recomputed = _ran(longer.stderr)
    assert recomputed == [str(run_dir / "step_0001" / STEP_OUTPUTS[n]) for n in STEP_STAGES] + \
        [str(run_dir / "eval" / "step_0001.parquet")]
    assert {m: v for m, v in _snapshot(run_dir).items() if m in first} == first


def test_changing_evaluate_after_pruning_reruns(cli, tiny_config, tmp_path):
    config = tiny_config(signal=True, run={"steps": 2, "eval_every": 1, "keep_checkpoints": 1, "progress": False})
    run_dir = tmp_path / "R"
    assert cli("run", "-c", config, "--run-dir", run_dir).exit_code == 0
    assert not (run_dir / "step_0000" / "policy" / "PRUNED").exists()  # evaluated: kept
    result = cli("run", "-c", config, "--run-dir", run_dir, "--set", "evaluate.samples=3")
    assert result.exit_code == 0, result.output
    recomputed = _ran(result.stderr)
    # every evaluation again (the pruned step's policy is there because it was evaluated), no training stage
    assert sorted(recomputed) == [str(run_dir / "eval" / name) for name in
                                  ("base.parquet", "step_0000.parquet", "step_0001.parquet")], recomputed


# ---- 5. stage by stage from the shell == oarctl run ---------------------------------------------

def test_stage_by_stage_commands_equal_the_loop(cli, tiny_config, tmp_path):
    config = tiny_config(signal=True)
    run_dir, manual = tmp_path / "R", tmp_path / "S"
    looped = run_oarctl("run", "-c", config, "--run-dir", run_dir, "--steps", "2")  # a separate process
    assert looped.returncode == 0, looped.stderr
    train, heldout = run_dir / "data" / "train.parquet", run_dir / "data" / "heldout.parquet"
    policy: list = []
    for step in range(2):
        ours, theirs = manual / f"step_{step:04d}", run_dir / f"step_{step:04d}"
        commands = [
            ("sample", train, "rollouts.parquet", ["--step", step, *policy]),
            ("verify", ours / "rollouts.parquet", "verified.parquet", []),
            ("attribute", ours / "verified.parquet", "attributions.parquet", ["--step", step, *policy]),
            ("reshape", ours / "attributions.parquet", "advantages.parquet", []),
            ("update", ours / "advantages.parquet", "policy", ["--step", step, *policy]),
        ]
        for name, source, output, extra in commands:
            result = cli(name, source, "-o", ours / output, "-c", config, *extra)
            assert result.exit_code == 0, (name, result.output)
            assert result.stdout.startswith(f"{name}: wrote {ours / output}")
            if output.endswith(".parquet"):
                assert (ours / output).read_bytes() == (theirs / output).read_bytes(), (step, output)
        for name in ("model.safetensors", "training_state/optimizer.safetensors", "training_state/optimizer.json",
                     "training_state/checkpoint.json", "update.parquet", "checkpoint.json"):
            assert sha256(ours / "policy" / name) == sha256(theirs / "policy" / name), (step, name)
        policy = ["--policy", ours / "policy"]
    # the weights really moved, so the comparison above is not trivially true
    assert sha256(run_dir / "step_0001" / "policy" / "model.safetensors") != \
        sha256(Path(load_config(config).policy.path) / "model.safetensors")
    for output, extra in (("base.parquet", []), ("step_0001.parquet", policy)):
        result = cli("evaluate", heldout, "-o", manual / "eval" / output, "-c", config, *extra)
        assert result.exit_code == 0, result.output
        assert sha256(manual / "eval" / output) == sha256(run_dir / "eval" / output)
    # and the loop, rerun, accepts all of it as up to date
    rerun = run_oarctl("run", "-c", config, "--run-dir", run_dir, "--steps", "2")
    assert rerun.returncode == 0 and "running:" not in rerun.stderr


# ---- 7. status ----------------------------------------------------------------------------------

def test_status_after_a_partial_run_and_after_a_config_change(cli, tiny_config, tmp_path):
    config = tiny_config(signal=True)  # run.steps: 2
    run_dir = tmp_path / "R"
    assert cli("run", "-c", config, "--run-dir", run_dir, "--steps", "1").exit_code == 0

    recorded = status_rows(cli("status", run_dir).stdout)  # uses R/config.yaml (steps: 1)
    assert recorded == [("eval/base", "evaluate", "done")] + [("step_0000", n, "done") for n in STEP_STAGES] + \
        [("eval/step_0000", "evaluate", "done")]

    result = cli("status", run_dir, "-c", config)  # two steps: the second is pending
    assert result.exit_code == 0, result.output
    rows = status_rows(result.stdout)
    assert len(rows) == 1 + 2 * len(STEP_STAGES) + 1  # base, two steps, the final evaluation
    assert rows[-1] == ("eval/step_0001", "evaluate", f"waiting for {run_dir / 'step_0001' / 'policy'}")
    assert all(state == "done" for where, _, state in rows if where in ("eval/base", "step_0000"))
    pending = {stage: state for where, stage, state in rows if where == "step_0001"}
    assert pending["sample"] == "no output yet"
    assert pending["verify"] == f"waiting for {run_dir / 'step_0001' / 'rollouts.parquet'}"
    assert pending["update"] == f"waiting for {run_dir / 'step_0001' / 'advantages.parquet'}"

    changed = status_rows(cli("status", run_dir, "--set", "sample.temperature=0.5").stdout)
    assert [r for r in changed if r[2] != "done"] == [
        ("step_0000", "sample", "config changed (sample.temperature)"),
        *[("step_0000", name, "will rerun (input changes)") for name in STEP_STAGES[1:]],
        ("eval/step_0000", "evaluate", "will rerun (input changes)")]
    changed = status_rows(cli("status", run_dir, "--set", "update.learning_rate=0.001").stdout)
    assert [r for r in changed if r[2] != "done"] == [
        ("step_0000", "update", "config changed (update.learning_rate)"),
        ("eval/step_0000", "evaluate", "will rerun (input changes)")]
    changed = status_rows(cli("status", run_dir, "--set", "run.seed=3").stdout)
    assert {r[1] for r in changed if r[2] == "seed changed"} == {"evaluate", *STEP_STAGES}

    manifest_of(run_dir / "step_0000" / "verified.parquet").unlink()
    torn = status_rows(cli("status", run_dir).stdout)
    assert ("step_0000", "verify", "incomplete (no manifest)") in torn
    (run_dir / "step_0000" / "advantages.parquet").write_bytes(b"edited by hand")
    torn = status_rows(cli("status", run_dir).stdout)
    assert ("step_0000", "update", "input changed (advantages)") in torn


# ---- 6. resume after SIGKILL --------------------------------------------------------------------

def _manifests(run_dir: Path) -> set[Path]:
    """The finished stages' manifests (safe while a run writes)."""
    return set(walk_while_written(run_dir, "*.manifest.json")) if run_dir.exists() else set()


def _snapshot(run_dir: Path) -> dict[Path, tuple]:
    """Every finished stage: its manifest text and its output's mtime (Parquet outputs)."""
    state = {}
    for manifest in run_dir.rglob("*.manifest.json"):
        output = manifest.with_name(manifest.name[: -len(".manifest.json")])
        state[manifest] = (manifest.read_text(), output.stat().st_mtime_ns if output.is_file() else None)
    return state


def _assert_unchanged(snapshot: dict, attempt: int) -> None:
    for manifest, (text, mtime) in snapshot.items():
        assert manifest.exists(), f"attempt {attempt}: finished stage lost its manifest: {manifest}"
        output = manifest.with_name(manifest.name[: -len(".manifest.json")])
        assert manifest.read_text() == text, f"attempt {attempt}: finished stage recomputed: {output}"
        if mtime is not None:
            assert output.stat().st_mtime_ns == mtime, f"attempt {attempt}: output rewritten: {output}"


def _wait_for_temporary(process, run_dir: Path, marker: str, seconds: float = 60) -> str | None:
    """As soon as a half-written file or folder whose name holds `marker` exists, its name."""
    deadline = time.monotonic() + seconds
    while process.poll() is None and time.monotonic() < deadline:
        found = [p.name for p in hidden_temporaries(run_dir)] if run_dir.exists() else []
        if any(marker in name for name in found):
            return next(name for name in found if marker in name)
        time.sleep(0.001)
    return None


def kill_and_resume(cli, tmp_path: Path, config: Path, kills: int, seed: int, max_delay: float,
                    inside_writes: bool = False):
    """Start `oarctl run` as a process and SIGKILL it at a seeded random moment, `kills` times, each
    attempt resuming the folder the previous one left; then resume it to the end (in-process).
    `inside_writes`: two attempts in three are instead killed while a checkpoint or an artifact is
    being written (its hidden temporary exists)."""
    rng = random.Random(seed)
    run_dir = tmp_path / "killed"
    killed, snapshot, inside = set(), {}, []
    for attempt in range(kills):
        log = tmp_path / f"attempt_{attempt}.log"
        with open(log, "w") as handle:
            process = subprocess.Popen([oarctl_executable(), "run", "-c", str(config), "--run-dir", str(run_dir)],
                                       stdout=handle, stderr=subprocess.STDOUT)
        if inside_writes and attempt % 3 < 2:
            # Aimed: kill the moment a checkpoint (even attempts) or a Parquet artifact (odd) is being written.
            writing = _wait_for_temporary(process, run_dir, ".policy.tmp-" if attempt % 2 == 0 else ".parquet.tmp-")
            inside += [writing] if writing and process.poll() is None else []
        else:
            # Start the clock when this attempt finishes its first stage: by then the imports and the
            # first model load (seconds) are over, and the remaining stages take well under a second.
            finished = _manifests(run_dir)
            deadline = time.monotonic() + 60
            while process.poll() is None and _manifests(run_dir) <= finished and time.monotonic() < deadline:
                time.sleep(0.005)
            time.sleep(rng.uniform(0.0, max_delay))
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
            killed.add(process.pid)
        returncode = process.wait(timeout=120)
        if process.pid not in killed:
            assert returncode == 0, log.read_text()
        _assert_unchanged(snapshot, attempt)
        snapshot = _snapshot(run_dir)
    result = cli("run", "-c", config, "--run-dir", run_dir)
    assert result.exit_code == 0, result.output
    _assert_unchanged(snapshot, kills)
    return run_dir, killed, inside


def check_resumed_run(cli, tmp_path: Path, config: Path, kills: int, seed: int, max_delay: float,
                      inside_writes: bool = False, steps: int = 3):
    run_dir, killed, inside = kill_and_resume(cli, tmp_path, config, kills, seed, max_delay, inside_writes)
    assert killed, "no run was killed: the delays are too long for this machine"
    if inside_writes:  # at least one kill landed inside a checkpoint write and one inside an artifact write
        assert any(".policy.tmp-" in n for n in inside) and any(".parquet.tmp-" in n for n in inside), inside
    print(f"{len(killed)} kills, {len(inside)} inside writes: {inside}")
    evals = [s for s in range(steps) if (s + 1) % EVAL_EVERY == 0 or s == steps - 1]
    for output in expected_outputs(run_dir, steps, evals):
        assert output.exists() and manifest_of(output).exists(), output
    # Leftovers of killed writers are swept when the run resumes.
    assert hidden_temporaries(run_dir) == []
    files = parquet_files(run_dir)
    for relative, path in files.items():
        assert pq.read_table(path).num_rows > 0, relative

    clean = tmp_path / "clean"
    uninterrupted = cli("run", "-c", config, "--run-dir", clean)
    assert uninterrupted.exit_code == 0, uninterrupted.output
    clean_files = parquet_files(clean)
    assert sorted(clean_files) == sorted(files)
    for relative in files:
        assert sha256(files[relative]) == sha256(clean_files[relative]), relative
    final = f"step_{steps - 1:04d}/policy"
    for name in ("model.safetensors", "training_state/optimizer.safetensors", "checkpoint.json"):
        assert sha256(run_dir / final / name) == sha256(clean / final / name), name
    for output in expected_outputs(run_dir, steps, evals):
        ours = json.loads(manifest_of(output).read_text())
        theirs = json.loads(manifest_of(clean / output.relative_to(run_dir)).read_text())
        assert (ours["key"], ours["output_sha256"]) == (theirs["key"], theirs["output_sha256"]), output
    # same values (key order differs: a cache hit reads the manifest's sorted metrics back), timings aside
    assert results_of(run_dir / "metrics.jsonl") == results_of(clean / "metrics.jsonl")
    return killed


def _measurement(name: str) -> bool:
    """Metrics of how a process did the work, not of its result: timings, memory peaks, and the checkpoint
    bytes it read or verified (a resumed process verifies on reading what another process wrote)."""
    return (name.endswith(("_ms", "_seconds")) or "_rss_mb" in name
            or name.endswith(("checkpoint_bytes_read", "checkpoint_bytes_verified")))


def results_of(metrics_file: Path) -> list[dict]:
    """The metrics that are results, without the measurements that vary from run to run."""
    records = [json.loads(line) for line in metrics_file.read_text().splitlines()]
    return [{k: v for k, v in record.items() if not _measurement(k)} for record in records]


EVAL_EVERY = 2


def kill_config(tiny_config, steps: int = 3):
    return tiny_config(signal=True, run={"steps": steps, "eval_every": EVAL_EVERY, "keep_checkpoints": 2,
                                         "progress": False})


def test_resume_after_kill_is_identical_to_an_uninterrupted_run(cli, tiny_config, tmp_path):
    check_resumed_run(cli, tmp_path, kill_config(tiny_config), kills=3, seed=20240601, max_delay=0.4)


@pytest.mark.slow
def test_resume_after_twenty_kills_some_inside_writes(cli, tiny_config, tmp_path):
    # 8 steps: enough stages and writes that all 20 attempts are killed before the run ends
    killed = check_resumed_run(cli, tmp_path, kill_config(tiny_config, steps=8), kills=20, seed=7, max_delay=0.1,
                               inside_writes=True, steps=8)
    assert len(killed) == 20


# ---- 11. update log-probs == sampling log-probs -------------------------------------------------

@pytest.mark.parametrize("which, temperature, top_p", [("random", 1.0, 1.0), ("random", 0.7, 0.9),
                                                       ("tiny", 1.0, 1.0), ("tiny", 1.3, 1.0)])
def test_update_logprobs_equal_sampling_logprobs(tmp_path, tiny_policy, random_policy, which, temperature, top_p):
    policy = random_policy if which == "random" else tiny_policy
    prompts = tmp_path / "prompts.parquet"
    write_parquet(toy_prompts("train", 16, [1, 2, 3, 4, 5], 0), prompts)
    config = load_config(None, [f"policy.path={policy}", "run.progress=false", "sample.prompts_per_step=6",
                                "sample.group_size=2", "sample.max_new_tokens=12", "sample.batch_size=5",
                                f"sample.temperature={temperature}", f"sample.top_p={top_p}",
                                "update.mini_batch_size=12", "update.micro_batch_size=5"])
    rollouts = tmp_path / "rollouts.parquet"
    run_stage("sample", config, {"prompts": prompts}, rollouts, policy_path=policy, log=lambda *a: None)
    rows = pq.read_table(rollouts).to_pylist()
    assert len({len(r["prompt_token_ids"]) for r in rows}) > 1  # left padding differs across the batch

    model, tokenizer = load_policy(policy)
    responses = [r["response_token_ids"] for r in rows]
    with torch.no_grad():
        logprobs, _ = response_token_stats(model, [r["prompt_token_ids"] for r in rows], responses,
                                           tokenizer.pad_token_id, [r["temperature"] for r in rows], chunk_tokens=7)
    for index, row in enumerate(rows):
        stored = torch.tensor(row["response_logprobs"])
        torch.testing.assert_close(logprobs[index, :len(stored)], stored, atol=1e-4, rtol=0)

    # through the real update stage: the first optimizer step sees ratio 1 on every token, no clipping
    context = _stage_context("update", config, 0, policy)
    table = read_artifact(rollouts, "rollouts")
    table = verify.run({"rollouts": table}, config.verify, context).table
    table = attribute.run({"verified": table}, config.attribute, context).table
    table = reshape.run({"attributions": table}, config.reshape, context).table
    result = STAGES["update"].function({"advantages": table}, config.update, context)
    log = result.table.to_pylist()
    assert len(log) == 1
    assert log[0]["ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    assert log[0]["clip_fraction"] == 0.0


def test_a_resumed_run_never_shows_a_shorter_metrics_file(cli, tiny_config, tmp_path):
    """Resuming re-derives every finished step from the cache; meanwhile metrics.jsonl must keep all
    its lines, or `oarctl compare` reading it then takes the base evaluation for the final one."""
    from oarctl.loop import run_loop

    config = tiny_config(signal=True, run={"steps": 3, "progress": False, "eval_every": 1})
    run_dir = tmp_path / "R"
    assert cli("run", "-c", config, "--run-dir", run_dir).exit_code == 0
    count = lambda: len((run_dir / "metrics.jsonl").read_text().splitlines())  # noqa: E731
    full, seen = count(), []
    run_loop(load_config(config), run_dir, log=lambda *_, **__: seen.append(count()))
    assert full == 7 and len(seen) >= 3 and set(seen) == {7}  # base eval + 3 x (step, eval)
    assert count() == 7
