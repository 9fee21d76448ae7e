"""The table of contents: every stage, what it reads and writes, and its traits; running one stage.

    prompts --sample--> rollouts --verify--> verified --attribute--> attributions
            --reshape--> advantages --update--> policy/ (next step's policy)
    held-out prompts --evaluate--> eval results (base policy, every `eval_every` steps, final)

A stage's row says everything the rest of the code needs to know about it (the CLI, the loop in
oarctl/loop.py, `oarctl status`): they read traits here and never test a stage's name. Only this
module imports oarctl.stages (tests/test_leaves.py).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from oarctl import schema
from oarctl.contract import Policy, StageContext, progress_shown
from oarctl.policy.paths import resolve_policy_path
from oarctl.runner import key_parts, run_cached, why_stale
from oarctl.stages import attribute, evaluate, reshape, sample, update, verify


@dataclass(frozen=True)
class Stage:
    name: str
    function: Callable
    inputs: dict[str, str]  # input name -> artifact kind
    output_kind: str  # artifact kind, or "policy" for a checkpoint folder
    version: str
    uses_policy: bool
    output_name: str = ""  # its output in a step folder (step_NNNN/); "" for a stage outside the step
    generates: bool = False  # samples with policy.backend (in its key); in a step the engines rest after it
    templated: bool = False  # builds prompts: a non-default data.prompt_template joins its key
    launchable: bool = False  # may run under `accelerate launch` (its section's accelerate_config)
    background: bool = False  # launched, it runs on while the next step samples (or in the persistent worker)
    waits_for_gpus: bool = False  # on GPUs it first waits for a launch still holding them (the stage after sampling)
    own_dtype: bool = False  # loads the policy in its section's dtype (in its key), else float32
    reference: bool = False  # gets the configured policy as KL reference when its section's kl_coef > 0
    key: Callable[[dict, object], dict] | None = None  # (section, config) -> the section as its key sees it


def _attribute_key(section: dict, config) -> dict:
    return schema.attribute_key(section, [config.attribute.method])


STAGES = {s.name: s for s in [
    Stage("sample", sample.run, {"prompts": "prompts"}, "rollouts", sample.VERSION, True,
          output_name="rollouts.parquet", generates=True, templated=True),
    Stage("verify", verify.run, {"rollouts": "rollouts"}, "verified", verify.VERSION, True,  # tokenizer
          output_name="verified.parquet", waits_for_gpus=True),
    Stage("attribute", attribute.run, {"verified": "verified"}, "attributions", attribute.VERSION, True,
          output_name="attributions.parquet", launchable=True, own_dtype=True, key=_attribute_key),
    Stage("reshape", reshape.run, {"attributions": "attributions"}, "advantages", reshape.VERSION, False,
          output_name="advantages.parquet"),
    Stage("update", update.run, {"advantages": "advantages"}, "policy", update.VERSION, True,
          output_name="policy", launchable=True, background=True, reference=True),
    Stage("evaluate", evaluate.run, {"prompts": "prompts"}, "eval_results", evaluate.VERSION, True,
          generates=True, templated=True),
]}
STEP_STAGES = ["sample", "verify", "attribute", "reshape", "update"]  # one RL step, in order
STEP_OUTPUTS = {name: STAGES[name].output_name for name in STEP_STAGES}
EVALUATE = "evaluate"  # the stage that scores a policy on held-out prompts (outside the step)


def _stage_context(name: str, config, step: int, policy_path: Path | None) -> StageContext:
    if config.policy.threads:
        import torch
        torch.set_num_threads(config.policy.threads)
    stage = STAGES[name]
    uses_reference = stage.reference and getattr(config, name).kl_coef > 0
    if policy_path is None and stage.uses_policy:  # a stage run on its own uses the configured policy
        policy_path = resolve_policy_path(config.policy.path)
    return StageContext(
        seed=config.run.seed, step=step, progress=progress_shown(config.run.progress),
        prompt_template=config.data.prompt_template,
        policy=_policy(config, policy_path, name) if stage.uses_policy else None,
        reference=Policy(resolve_policy_path(config.policy.path), config.policy.device) if uses_reference else None)


def _policy(config, path: Path, name: str) -> Policy:
    """Only the generating stages get a backend other than transformers (it is in their cache key);
    attribute loads the weights in attribute.dtype (in its cache key too), the others in float32."""
    from oarctl.policy.backends import resolve

    stage = STAGES[name]
    backend = resolve(config.policy.backend) if stage.generates else "transformers"
    dtype = getattr(config, name).dtype if stage.own_dtype else "float32"
    vllm = schema.section_dict(config, "vllm")
    if backend == "vllm":  # the dtype the engine serves joins the sample key (runner.key_parts)
        from oarctl.policy.vllm_backend import requested_dtype

        vllm["dtype"] = requested_dtype(path, vllm)
    return Policy(path, config.policy.device, backend, vllm, dtype)


def key_section(config, name: str) -> dict:
    """The stage's config section as its cache key sees it. Stages that build prompts also depend on
    data.prompt_template; it joins the key only when not the default, so older runs keep their keys."""
    from oarctl.templates import DEFAULT, resolve

    stage = STAGES[name]
    section = schema.section_dict(config, name)
    section.pop("accelerate_config", None)  # how the stage is launched, not what it computes
    section.pop("persistent", None)
    if stage.key is not None:
        section = stage.key(section, config)
    section = schema.keyed_when_set(name, section)
    if stage.templated and config.data.prompt_template != DEFAULT:
        section["prompt_template"] = resolve(config.data.prompt_template).identity
    return section


def run_stage(name: str, config, input_paths: dict[str, Path], output: Path, *, step: int = 0,
              policy_path: Path | None = None, force: bool = False, log=print,
              resident=None) -> tuple[dict, bool]:
    """Run one stage (cached) with the config's section; the CLI and the loop both come here (and the
    persistent update worker, with the `resident` state it keeps between steps)."""
    context = dataclasses.replace(_stage_context(name, config, step, policy_path), resident=resident)
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


def launched_stages(config) -> list[str]:
    """The stages this config runs under `accelerate launch`: launchable ones with an accelerate_config."""
    return [name for name, stage in STAGES.items() if stage.launchable and getattr(config, name).accelerate_config]
