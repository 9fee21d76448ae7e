"""The table of contents: every stage, its inputs, its output, and the loop that chains them.

    prompts --sample--> rollouts --verify--> verified --attribute--> attributions
            --reshape--> advantages --update--> policy/ (next step's policy)
    held-out prompts --evaluate--> eval results (base policy, every `eval_every` steps, final)

Run folder layout (each output has `<name>.manifest.json` beside it):
    config.yaml  data/train.parquet  data/heldout.parquet  metrics.jsonl
    step_0000/{rollouts,verified,attributions,advantages}.parquet  step_0000/policy/
    eval/base.parquet  eval/step_0004.parquet ...
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import yaml

from oarctl import config as config_module
from oarctl.artifacts import write_bytes_atomically, write_parquet
from oarctl.errors import OarError
from oarctl.processes.launch import accelerate_config, launch_stage, start_stage, stop_update_worker, update_worker
from oarctl.processes import gpus
from oarctl.processes.gpus import rest_generation_engines
from oarctl.logging_backends import MetricsSinks
from oarctl.policy.paths import resolve_policy_path  # re-export for one release: oarctl.policy.paths
from oarctl.report.run_report import read_metrics
from oarctl.runner import (Policy, StageContext, key_parts, read_manifest, run_cached, sweep_dead_temporaries,
                           why_stale)
from oarctl.stages import attribute, evaluate, reshape, sample, update, verify


@dataclass(frozen=True)
class Stage:
    name: str
    function: Callable
    inputs: dict[str, str]  # input name -> artifact kind
    output_kind: str  # artifact kind, or "policy" for a checkpoint folder
    version: str
    uses_policy: bool


STAGES = {s.name: s for s in [
    Stage("sample", sample.run, {"prompts": "prompts"}, "rollouts", sample.VERSION, True),
    Stage("verify", verify.run, {"rollouts": "rollouts"}, "verified", verify.VERSION, True),  # tokenizer
    Stage("attribute", attribute.run, {"verified": "verified"}, "attributions", attribute.VERSION, True),
    Stage("reshape", reshape.run, {"attributions": "attributions"}, "advantages", reshape.VERSION, False),
    Stage("update", update.run, {"advantages": "advantages"}, "policy", update.VERSION, True),
    Stage("evaluate", evaluate.run, {"prompts": "prompts"}, "eval_results", evaluate.VERSION, True),
]}
STEP_STAGES = ["sample", "verify", "attribute", "reshape", "update"]
STEP_OUTPUTS = {"sample": "rollouts.parquet", "verify": "verified.parquet", "attribute": "attributions.parquet",
                "reshape": "advantages.parquet", "update": "policy"}


def _stage_context(name: str, config, step: int, policy_path: Path | None) -> StageContext:
    if config.policy.threads:
        import torch
        torch.set_num_threads(config.policy.threads)
    uses_reference = name == "update" and config.update.kl_coef > 0
    if policy_path is None and STAGES[name].uses_policy:  # a stage run on its own uses the configured policy
        policy_path = resolve_policy_path(config.policy.path)
    return StageContext(
        seed=config.run.seed, step=step, progress=config.run.progress, prompt_template=config.data.prompt_template,
        policy=_policy(config, policy_path, name) if STAGES[name].uses_policy else None,
        reference=Policy(resolve_policy_path(config.policy.path), config.policy.device) if uses_reference else None)


def _policy(config, path: Path, stage: str) -> Policy:
    """Only the generating stages get a backend other than transformers (it is in their cache key);
    attribute loads the weights in attribute.dtype (in its cache key too), the others in float32."""
    from oarctl.policy.backends import resolve

    backend = resolve(config.policy.backend) if stage in ("sample", "evaluate") else "transformers"
    dtype = config.attribute.dtype if stage == "attribute" else "float32"
    return Policy(path, config.policy.device, backend, config_module.section_dict(config, "vllm"), dtype)


TEMPLATED_STAGES = ("sample", "evaluate")


def key_section(config, name: str) -> dict:
    """The stage's config section as its cache key sees it. Stages that build prompts also depend on
    data.prompt_template; it joins the key only when not the default, so older runs keep their keys."""
    from oarctl.templates import DEFAULT, resolve

    section = config_module.section_dict(config, name)
    section.pop("accelerate_config", None)  # how the stage is launched, not what it computes
    section.pop("persistent", None)
    if name == "attribute":
        section = config_module.attribute_key(section, [config.attribute.method])
    section = config_module.keyed_when_set(name, section)
    if name in TEMPLATED_STAGES and config.data.prompt_template != DEFAULT:
        section["prompt_template"] = resolve(config.data.prompt_template).identity
    return section


def run_stage(name: str, config, input_paths: dict[str, Path], output: Path, *, step: int = 0,
              policy_path: Path | None = None, force: bool = False, log=print) -> tuple[dict, bool]:
    """Run one stage (cached) with the config's section; the CLI and the loop both come here."""
    context = _stage_context(name, config, step, policy_path)
    return run_cached(STAGES[name], key_section(config, name), getattr(config, name),
                      input_paths, output, context, force=force, log=log)


def stage_state(name: str, config, input_paths: dict[str, Path], output: Path, *, step: int = 0,
                policy_path: Path | None = None) -> str:
    """'done', or why the stage would run now (for `oarctl status`)."""
    missing = [str(p) for p in [*input_paths.values(), policy_path] if p is not None and not p.exists()]
    if missing:
        return "waiting for " + ", ".join(missing)
    context = _stage_context(name, config, step, policy_path)
    parts = key_parts(STAGES[name], key_section(config, name), input_paths, context)
    return why_stale(output, parts) or "done"


def step_dir(run_dir: Path, step: int) -> Path:
    return run_dir / f"step_{step:04d}"


def prepare_run_dir(run_dir: Path, config) -> dict[str, Path]:
    """Record the config and write the prompt sets once (later stages hash these files)."""
    import pyarrow.parquet as pq

    from oarctl.data import load_prompts

    run_dir.mkdir(parents=True, exist_ok=True)
    sweep_dead_temporaries(run_dir)
    write_bytes_atomically(run_dir / "config.yaml", yaml.safe_dump(config_module.to_dict(config), sort_keys=False))
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
    source = evaluation_prompts(config, prompts, output.with_name(output.stem + ".benchmarks.parquet"))
    manifest, ran = run_stage("evaluate", config, {"prompts": source}, output, policy_path=policy_path,
                              force=force, log=log)
    write_bytes_atomically(output.with_name(output.name + ".summary.md"), summary.markdown(manifest["metrics"]))
    write_bytes_atomically(output.with_name(output.name + ".summary.json"), summary.as_json(manifest["metrics"]))
    return manifest, ran


def _evaluate(config, heldout: Path, policy: Path, output: Path, force: bool, log) -> dict:
    manifest, _ = run_stage("evaluate", config, {"prompts": heldout}, output, policy_path=policy,
                            force=force, log=log)
    return manifest["metrics"]


LAUNCHABLE_STAGES = ("attribute", "update")  # with `<stage>.accelerate_config`, run under accelerate launch


def _launched_stages(config) -> list[str]:
    return [name for name in LAUNCHABLE_STAGES if getattr(config, name).accelerate_config]


def _run_step(config, run_dir: Path, step: int, train: Path, policy: Path, force: bool, log,
              settle: Callable[[], None]) -> tuple[dict, Callable[[], dict]]:
    """The five stages of one RL step: ({stage: metrics} of the first four, a function giving the update's
    metrics once it is complete). A launched FSDP update is still writing its training state when this
    returns; `settle` waits for the previous step's, before anything that needs it or its GPUs."""
    folder = step_dir(run_dir, step)
    previous = {"sample": train}
    metrics = {}
    launched = _launched_stages(config)
    for name in STEP_STAGES:
        stage = STAGES[name]
        output = folder / STEP_OUTPUTS[name]
        (input_name,) = stage.inputs
        inputs = {input_name: previous[name]}
        if name in launched or (name == "verify" and gpus.shared_with_launches()):
            settle()
        if name == "update" and name in launched:
            return metrics, _update_in_background(config, inputs, output, step, policy, run_dir, force, log)
        if name in launched:
            _launched_stage(name, config, inputs, output, step, policy, run_dir, force, log)
        # a launched stage is written now: run_stage only reads its manifest
        manifest, _ = run_stage(name, config, inputs, output, step=step, policy_path=policy,
                                force=force and name not in launched, log=log)
        if name == "sample":
            rest_generation_engines()  # attribute and update get the engines' memory; reloaded next step
        metrics[name] = manifest["metrics"]
        following = STEP_STAGES.index(name) + 1
        if following < len(STEP_STAGES):
            previous[STEP_STAGES[following]] = output
    return metrics, lambda: metrics.pop("update")


def _update_in_background(config, inputs: dict, output: Path, step: int, policy: Path, run_dir: Path,
                          force: bool, log) -> Callable[[], dict]:
    """Launch the step's update and return once its policy is committed (or the launch ended); the
    function returned waits for the rest (the training state, the manifest) and gives its metrics."""
    def metrics() -> dict:
        return run_stage("update", config, inputs, output, step=step, policy_path=policy, log=log)[0]["metrics"]

    if not force and stage_state("update", config, inputs, output, step=step, policy_path=policy) == "done":
        return metrics
    (input_path,) = inputs.values()
    if config.update.persistent:  # the run's update ranks, launched once, keep the model from step to step
        launched = update_worker(config, run_dir, log).submit(input_path, output, policy, step, force, log)
    else:
        launched = start_stage("update", config, input_path, output, policy, step, run_dir / "config.yaml", force,
                               log)
    launched.wait_ready()

    def finished() -> dict:
        launched.finish()
        _require_done("update", config, inputs, output, step, policy)
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


def run_loop(config, run_dir: Path, force: bool = False, log=print) -> dict:
    """The whole loop, resumable: every finished stage is a cache hit on the next invocation."""
    for name in _launched_stages(config):  # a bad launcher file is an error now, not after sampling
        settings = accelerate_config(getattr(config, name).accelerate_config, f"{name}.accelerate_config")
        if name == "update" and config.update.persistent and settings.get("distributed_type") != "FSDP":
            raise OarError(f"{config.update.accelerate_config}: update.persistent needs an FSDP accelerate config "
                           f"(distributed_type: FSDP), this one is {settings.get('distributed_type', 'not set')}")
    data = prepare_run_dir(run_dir, config)
    base = resolve_policy_path(config.policy.path)
    lines = [{"kind": "eval", "after_steps": 0,
              **_flatten("eval", _evaluate(config, data["eval"], base, run_dir / "eval" / "base.parquet", force, log))}]
    policy, steps = base, config.run.steps
    recorded = _recorded_metrics(run_dir)
    sinks = MetricsSinks(config.logging, run_dir)  # TensorBoard / W&B beside metrics.jsonl, as configured
    unfinished = []  # [(step, metrics, update's metrics)]: a step whose launched update is still writing

    def settle() -> None:
        """Complete the last step: wait for its update, then log, evaluate and prune as it asks."""
        if not unfinished:
            return
        step, metrics, update_metrics = unfinished.pop()
        metrics["update"] = update_metrics()
        line = {"kind": "step", "step": step}
        for name, values in metrics.items():
            line.update(_flatten(name, values))
        lines.append(line)
        log(_step_summary(step, steps, line))
        if _evaluated(step, config):
            output = run_dir / "eval" / f"step_{step:04d}.parquet"
            lines.append({"kind": "eval", "after_steps": step + 1,
                          **_flatten("eval", _evaluate(config, data["eval"], step_dir(run_dir, step) / "policy",
                                                       output, force, log))})
        if not _replaying(lines, recorded):
            write_bytes_atomically(run_dir / "metrics.jsonl", "".join(json.dumps(x) + "\n" for x in lines))
        sinks.send(lines)
        _prune(run_dir, step, config)

    try:
        for step in range(steps):
            unfinished.append((step, *_run_step(config, run_dir, step, data["train"], policy, force, log, settle)))
            policy = step_dir(run_dir, step) / "policy"
            if _evaluated(step, config) or "update" not in _launched_stages(config):
                settle()  # at once unless the update runs on; an evaluation's line follows its step's
        settle()
    finally:
        stop_update_worker()  # update.persistent: its ranks leave with the run
    write_bytes_atomically(run_dir / "metrics.jsonl", "".join(json.dumps(x) + "\n" for x in lines))
    sinks.send(lines)
    sinks.close()
    evals = [x for x in lines if x["kind"] == "eval"]
    return {"base": evals[0], "final": evals[-1], "policy": str(policy)}


def _step_summary(step: int, steps: int, line: dict) -> str:
    return (f"step {step + 1}/{steps}: reward {line.get('verify/reward_mean', float('nan')):.3f}  "
            f"mixed groups {line.get('reshape/mixed_group_fraction', float('nan')):.2f}  "
            f"loss {line.get('update/loss', float('nan')):+.4f}  "
            f"clip {line.get('update/clip_fraction', float('nan')):.3f}  "
            f"entropy {line.get('update/entropy', float('nan')):.3f}")


def run_status(run_dir: Path, config) -> list[tuple[str, str, str]]:
    """(where, stage, state) rows, state = 'done' or the reason the stage would run."""
    train, heldout = run_dir / "data" / "train.parquet", run_dir / "data" / "heldout.parquet"
    if config.evaluate.benchmarks:
        heldout = _benchmarks_path(run_dir)
    base = resolve_policy_path(config.policy.path)
    rows = [("eval/base", "evaluate",
             stage_state("evaluate", config, {"prompts": heldout}, run_dir / "eval" / "base.parquet", policy_path=base))]
    policy = base
    for step in range(config.run.steps):
        folder, previous = step_dir(run_dir, step), train
        for name in STEP_STAGES:
            output = folder / STEP_OUTPUTS[name]
            (input_name,) = STAGES[name].inputs
            rows.append((folder.name, name, stage_state(name, config, {input_name: previous}, output,
                                                        step=step, policy_path=policy)))
            previous = output
        policy = folder / "policy"
        if _evaluated(step, config):
            output = run_dir / "eval" / f"step_{step:04d}.parquet"
            rows.append((f"eval/{folder.name}", "evaluate",
                         stage_state("evaluate", config, {"prompts": heldout}, output, policy_path=policy)))
    return rows
