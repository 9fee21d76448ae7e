"""The RL loop over the table of stages (oarctl/pipeline.py): `oarctl run`, a step, settling a step whose
update runs on, metrics, pruning, and `oarctl status`. It reads the stages' traits from the table and
never tests a stage's name; processes and GPUs are oarctl/processes/'s.

Run folder layout (each output has `<name>.manifest.json` beside it):
    config.yaml  data/train.parquet  data/heldout.parquet  metrics.jsonl
    step_0000/{rollouts,verified,attributions,advantages}.parquet  step_0000/policy/
    eval/base.parquet  eval/step_0004.parquet ...
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import yaml

from oarctl import provenance, schema
from oarctl.artifacts import write_bytes_atomically, write_parquet
from oarctl.errors import OarError
from oarctl.logging_backends import MetricsSinks
from oarctl.pipeline import EVALUATE, STAGES, STEP_STAGES, launched_stages, run_stage, stage_state
from oarctl.policy.paths import resolve_policy_path
from oarctl.processes import gpus
from oarctl.processes.gpus import rest_generation_engines
from oarctl.processes.launch import accelerate_config, launch_stage, start_stage, stop_update_worker, update_worker
from oarctl.report.run_report import read_metrics
from oarctl.runner import sweep_dead_temporaries


def step_dir(run_dir: Path, step: int) -> Path:
    return run_dir / f"step_{step:04d}"


def prepare_run_dir(run_dir: Path, config) -> dict[str, Path]:
    """Record the config and write the prompt sets once (later stages hash these files)."""
    import pyarrow.parquet as pq

    from oarctl.data import load_prompts

    run_dir.mkdir(parents=True, exist_ok=True)
    sweep_dead_temporaries(run_dir)
    recorded = {**schema.to_dict(config), "provenance": provenance.record()}  # where it (re)started; not a setting
    write_bytes_atomically(run_dir / "config.yaml", yaml.safe_dump(recorded, sort_keys=False))
    paths = {}
    for split, source in (("train", config.data.train), ("heldout", config.data.heldout)):
        paths[split] = run_dir / "data" / f"{split}.parquet"
        table = load_prompts(source, split, config)
        if not paths[split].exists() or not pq.read_table(paths[split]).equals(table):
            write_parquet(table, paths[split])
    paths["eval"] = evaluation_prompts(config, paths["heldout"], _benchmarks_path(run_dir))
    return paths


def _benchmarks_path(run_dir: Path) -> Path:
    return run_dir / "data" / "benchmarks.parquet"


def evaluation_prompts(config, heldout: Path | None, benchmarks_path: Path) -> Path:
    """What evaluate scores: the held-out file, or evaluate.benchmarks written as one prompts table
    (rewritten only when its content changed, so its hash, and evaluate's cache, stay put)."""
    import pyarrow.parquet as pq

    from oarctl.data import load_benchmarks

    if not config.evaluate.benchmarks:
        return heldout
    table = load_benchmarks(config)
    if not benchmarks_path.exists() or not pq.read_table(benchmarks_path).equals(table):
        write_parquet(table, benchmarks_path)
    return benchmarks_path


def evaluate_command(config, prompts: Path | None, output: Path, policy_path: Path, force: bool = False,
                     log=print) -> tuple[dict, bool]:
    """`oarctl evaluate`: score PROMPTS or evaluate.benchmarks, write `<output>.summary.{md,json}`."""
    from oarctl import summary

    if prompts is not None and config.evaluate.benchmarks:
        raise OarError(f"{prompts}: give either a prompts file or evaluate.benchmarks, not both")
    if prompts is None and not config.evaluate.benchmarks:
        raise OarError("evaluate: give a prompts file, or set evaluate.benchmarks in the config")
    if prompts is not None:  # the user's prompts, as `oarctl run` reads data.heldout
        from oarctl.data import stage_prompts

        prompts = stage_prompts(str(prompts), output, config, "heldout", log=log)
    source = evaluation_prompts(config, prompts, output.with_name(output.stem + ".benchmarks.parquet"))
    manifest, ran = run_stage(EVALUATE, config, {"prompts": source}, output, policy_path=policy_path,
                              force=force, log=log)
    write_bytes_atomically(output.with_name(output.name + ".summary.md"), summary.markdown(manifest["metrics"]))
    write_bytes_atomically(output.with_name(output.name + ".summary.json"), summary.as_json(manifest["metrics"]))
    return manifest, ran


def _evaluate(config, heldout: Path, policy: Path, output: Path, force: bool, log) -> dict:
    manifest, _ = run_stage(EVALUATE, config, {"prompts": heldout}, output, policy_path=policy,
                            force=force, log=log)
    return manifest["metrics"]


def run_step(config, run_dir: Path, step: int, train: Path, policy: Path, force: bool, log,
             settle: Callable[[], None]) -> tuple[dict, Callable[[], dict]]:
    """The stages of one RL step: ({stage: metrics} of all but the last, a function giving {last stage:
    metrics} once it is complete). A launched background stage (the FSDP update) is still writing its
    training state when this returns; `settle` waits for the previous step's, before anything that
    needs it or its GPUs."""
    folder = step_dir(run_dir, step)
    source, metrics = train, {}
    launched = launched_stages(config)
    for name in STEP_STAGES:
        stage = STAGES[name]
        output = folder / stage.output_name
        (input_name,) = stage.inputs
        inputs = {input_name: source}
        if name in launched or (stage.waits_for_gpus and gpus.shared_with_launches()):
            settle()
        if stage.background and name in launched:
            return metrics, _in_background(name, config, inputs, output, step, policy, run_dir, force, log)
        if name in launched:
            _launched_stage(name, config, inputs, output, step, policy, run_dir, force, log)
        # a launched stage is written now: run_stage only reads its manifest
        manifest, _ = run_stage(name, config, inputs, output, step=step, policy_path=policy,
                                force=force and name not in launched, log=log)
        if stage.generates:
            rest_generation_engines()  # attribute and update get the engines' memory; reloaded next step
        metrics[name] = manifest["metrics"]
        source = output
    return metrics, lambda: {name: metrics.pop(name)}


def _in_background(name: str, config, inputs: dict, output: Path, step: int, policy: Path, run_dir: Path,
                   force: bool, log) -> Callable[[], dict]:
    """Launch the step's stage and return once its output may be read (the update's policy is committed,
    or the launch ended); the function returned waits for the rest (the training state, the manifest)
    and gives {name: its metrics}."""
    def metrics() -> dict:
        return {name: run_stage(name, config, inputs, output, step=step, policy_path=policy, log=log)[0]["metrics"]}

    if not force and stage_state(name, config, inputs, output, step=step, policy_path=policy) == "done":
        return metrics
    (input_path,) = inputs.values()
    if getattr(config, name).persistent:  # the run's update ranks, launched once, keep the model from step to step
        launched = update_worker(config, run_dir, log).submit(input_path, output, policy, step, force, log)
    else:
        launched = start_stage(name, config, input_path, output, policy, step, run_dir / "config.yaml", force, log)
    launched.wait_ready()

    def finished() -> dict:
        launched.finish()
        _require_done(name, config, inputs, output, step, policy)
        return metrics()
    return finished


def _launched_stage(name: str, config, inputs: dict, output: Path, step: int, policy: Path, run_dir: Path,
                    force: bool, log) -> None:
    """The step's stage under `accelerate launch` (oarctl/processes/launch.py), unless it is already done."""
    if not force and stage_state(name, config, inputs, output, step=step, policy_path=policy) == "done":
        return
    (input_path,) = inputs.values()
    launch_stage(name, config, input_path, output, policy, step, run_dir / "config.yaml", force, log)
    _require_done(name, config, inputs, output, step, policy)


def _require_done(name: str, config, inputs: dict, output: Path, step: int, policy: Path) -> None:
    state = stage_state(name, config, inputs, output, step=step, policy_path=policy)
    if state != "done":  # never run twice: the run would otherwise redo the stage in its own process
        raise OarError(f"{output}: the launched {name} did not leave this run's output ({state})")


def _evaluated(step: int, config) -> bool:
    return step + 1 == config.run.steps or bool(config.run.eval_every and (step + 1) % config.run.eval_every == 0)


def _prune(run_dir: Path, step: int, config) -> None:
    """Drop old weights, except those of evaluated steps (a changed evaluate config reruns on them)."""
    from oarctl.checkpoints import prune

    old_step = step - config.run.keep_checkpoints
    old = step_dir(run_dir, old_step) / "policy"
    if old_step >= 0 and not _evaluated(old_step, config) and old.is_dir() and not (old / "PRUNED").exists():
        prune(old)


def _flatten(prefix: str, metrics: dict) -> dict:
    return {f"{prefix}/{key}": value for key, value in metrics.items() if isinstance(value, (int, float))}


def _recorded_metrics(run_dir: Path) -> list[dict]:
    """The lines a previous invocation left in metrics.jsonl ([] if none or unreadable)."""
    try:
        return read_metrics(run_dir)
    except OarError:
        return []


def _replaying(lines: list[dict], recorded: list[dict]) -> bool:
    """True while a resumed run is still re-deriving lines the file already holds further: writing
    them would shrink metrics.jsonl to an earlier step, and a reader (status, compare) would see the
    base evaluation as the last one."""
    key = lambda x: (x.get("kind"), x.get("step"), x.get("after_steps"))  # noqa: E731
    return len(lines) < len(recorded) and [key(x) for x in lines] == [key(x) for x in recorded[:len(lines)]]


def _check_launchers(config) -> None:
    """A bad launcher file is an error now, not after sampling."""
    for name in launched_stages(config):
        section = getattr(config, name)
        settings = accelerate_config(section.accelerate_config, f"{name}.accelerate_config")
        if getattr(section, "persistent", False) and settings.get("distributed_type") != "FSDP":
            raise OarError(f"{section.accelerate_config}: {name}.persistent needs an FSDP accelerate config "
                           f"(distributed_type: FSDP), this one is {settings.get('distributed_type', 'not set')}")


class _Run:
    """One invocation of the loop: its prompt files, its metric lines, and the step not yet settled (one
    whose launched background stage is still writing)."""

    def __init__(self, config, run_dir: Path, force: bool, log):
        self.config, self.run_dir, self.force, self.log = config, run_dir, force, log
        self.data = prepare_run_dir(run_dir, config)
        self.base = resolve_policy_path(config.policy.path)
        self.lines = [self._evaluation(0, self.base, run_dir / "eval" / "base.parquet")]
        self.recorded = _recorded_metrics(run_dir)
        self.sinks = MetricsSinks(config.logging, run_dir)  # TensorBoard / W&B beside metrics.jsonl, as configured
        self.unfinished = []  # [(step, metrics, the last stage's metrics)]

    def _evaluation(self, after_steps: int, policy: Path, output: Path) -> dict:
        metrics = _evaluate(self.config, self.data["eval"], policy, output, self.force, self.log)
        return {"kind": "eval", "after_steps": after_steps, **_flatten("eval", metrics)}

    def step(self, step: int, policy: Path) -> None:
        self.unfinished.append((step, *run_step(self.config, self.run_dir, step, self.data["train"], policy,
                                                self.force, self.log, self.settle)))

    def settle(self) -> None:
        """Complete the last step: wait for its update, then log, evaluate and prune as it asks."""
        if not self.unfinished:
            return
        step, metrics, last_metrics = self.unfinished.pop()
        metrics.update(last_metrics())
        line = {"kind": "step", "step": step}
        for name, values in metrics.items():
            line.update(_flatten(name, values))
        self.lines.append(line)
        self.log(_step_summary(step, self.config.run.steps, line))
        if _evaluated(step, self.config):
            output = self.run_dir / "eval" / f"step_{step:04d}.parquet"
            self.lines.append(self._evaluation(step + 1, step_dir(self.run_dir, step) / "policy", output))
        if not _replaying(self.lines, self.recorded):
            self.write_metrics()
        self.sinks.send(self.lines)
        _prune(self.run_dir, step, self.config)

    def write_metrics(self) -> None:
        write_bytes_atomically(self.run_dir / "metrics.jsonl", "".join(json.dumps(x) + "\n" for x in self.lines))


def run_loop(config, run_dir: Path, force: bool = False, log=print) -> dict:
    """The whole loop, resumable: every finished stage is a cache hit on the next invocation."""
    _check_launchers(config)
    run = _Run(config, run_dir, force, log)
    policy = run.base
    runs_on = any(STAGES[name].background for name in launched_stages(config))
    try:
        for step in range(config.run.steps):
            run.step(step, policy)
            policy = step_dir(run_dir, step) / "policy"
            if _evaluated(step, config) or not runs_on:
                run.settle()  # at once unless the update runs on; an evaluation's line follows its step's
        run.settle()
    finally:
        stop_update_worker()  # update.persistent: its ranks leave with the run
    run.write_metrics()
    run.sinks.send(run.lines)
    run.sinks.close()
    evals = [x for x in run.lines if x["kind"] == "eval"]
    return {"base": evals[0], "final": evals[-1], "policy": str(policy)}


def _step_summary(step: int, steps: int, line: dict) -> str:
    return (f"step {step + 1}/{steps}: reward {line.get('verify/reward_mean', float('nan')):.3f}  "
            f"mixed groups {line.get('reshape/mixed_group_fraction', float('nan')):.2f}  "
            f"loss {line.get('update/loss', float('nan')):+.4f}  "
            f"clip {line.get('update/clip_fraction', float('nan')):.3f}  "
            f"entropy {line.get('update/entropy', float('nan')):.3f}")


WILL_RERUN = "will rerun (input changes)"


def require_run_folder(run_dir: Path, config_given: bool) -> None:
    """`oarctl status` reads folders `oarctl run` wrote; say what another folder is not, in one line."""
    for manifest in sorted(run_dir.glob("step_*/*.manifest.json"))[:1]:
        try:
            recorded = json.loads(manifest.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        stage = recorded.get("stage")
        if stage not in STAGES:
            trl = (recorded.get("key_parts") or {}).get("config", {}).get("trl")
            by = f"a TRL {trl} run (OARGRPOTrainer's oar_log_dir)" if trl else f"stage {stage!r}"
            raise OarError(f"{run_dir}: not an `oarctl run` folder: {manifest.relative_to(run_dir)} was written by "
                           f"{by}, which has no stages to check; read it with oarctl report / oarctl show")
    if not config_given and not (run_dir / "config.yaml").is_file():
        raise OarError(f"{run_dir}: not an `oarctl run` folder (no config.yaml, which `oarctl run` writes first); "
                       f"give a config with -c to see what a run there would do")


def run_status(run_dir: Path, config) -> list[tuple[str, str, str]]:
    """(where, stage, state) rows, state = 'done' or the reason the stage would run. A stage that is done
    but downstream of one that will run (later in its step, every later step, the evaluations of their
    policies) is `will rerun (input changes)`: its recorded inputs are about to be rewritten."""
    train, heldout = run_dir / "data" / "train.parquet", run_dir / "data" / "heldout.parquet"
    if config.evaluate.benchmarks:
        heldout = _benchmarks_path(run_dir)
    base = resolve_policy_path(config.policy.path)
    rows = [("eval/base", EVALUATE,
             stage_state(EVALUATE, config, {"prompts": heldout}, run_dir / "eval" / "base.parquet", policy_path=base))]
    policy, upstream_runs = base, False
    for step in range(config.run.steps):
        folder, previous = step_dir(run_dir, step), train
        for name in STEP_STAGES:
            output = folder / STAGES[name].output_name
            (input_name,) = STAGES[name].inputs
            state = stage_state(name, config, {input_name: previous}, output, step=step, policy_path=policy)
            state, upstream_runs = _downstream(state, upstream_runs)
            rows.append((folder.name, name, state))
            previous = output
        policy = folder / "policy"
        if _evaluated(step, config):
            output = run_dir / "eval" / f"step_{step:04d}.parquet"
            state = stage_state(EVALUATE, config, {"prompts": heldout}, output, policy_path=policy)
            rows.append((f"eval/{folder.name}", EVALUATE, _downstream(state, upstream_runs)[0]))
    return rows


def _downstream(state: str, upstream_runs: bool) -> tuple[str, bool]:
    """(the state shown, whether what follows depends on a stage that will run)."""
    if upstream_runs and state == "done":
        return WILL_RERUN, True
    return state, upstream_runs or not (state == "done" or state.startswith("waiting for"))
