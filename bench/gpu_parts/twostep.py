"""Part twostep of bench/gpu_check.py: two RL steps in a row, the second on the first's checkpoint, and
whether the second sample found its vLLM engine kept."""
from __future__ import annotations

import time
from pathlib import Path

from bench.gpu_parts.common import base_overrides, peak_gib, sampling_backend, timed_stage


def run_two_steps(args, work: Path, policy: Path) -> list:
    """Part twostep: two RL steps in a row, the second on the first's checkpoint; a verdict row last."""
    from oarctl.artifacts import write_parquet
    from oarctl.config import load_config
    from oarctl.data import toy_prompts

    config = load_config(None, base_overrides(args, policy) + ["attribute.method=oar_g"])
    folder = work / "twostep"
    folder.mkdir(parents=True, exist_ok=True)
    prompts = folder / "prompts.parquet"
    write_parquet(toy_prompts("train", 2 * args.prompts, config.data.toy_levels), prompts)
    rows: list = []
    for step in (0, 1):
        before = len(rows)
        policy = _one_step(config, prompts, folder / f"step_{step}", policy, step, rows)
        rows[before:] = [(f"twostep{step + 1}_{name}", *rest) for name, *rest in rows[before:]]
    second_sample = next(metrics for name, _, _, metrics in rows if name == "twostep2_sample")
    ok, verdict = engine_reuse_verdict(sampling_backend(args), second_sample)
    rows.append(("twostep engine", float("nan"), float("nan"), {"verdict": verdict, "ok": ok}))
    return rows


def _one_step(config, prompts: Path, folder: Path, policy: Path, step: int, rows: list) -> Path:
    """The five stages of `step` into `folder`, the engines rested after sampling as `oarctl run` does;
    returns the new checkpoint."""
    from oarctl.processes.gpus import rest_generation_engines

    rollouts = timed_stage("sample", config, {"prompts": prompts}, folder / "rollouts.parquet", policy, rows, step)
    started = time.perf_counter()
    rest_generation_engines()
    rows.append(("rest_engines", time.perf_counter() - started, peak_gib(), {}))
    verified = timed_stage("verify", config, {"rollouts": rollouts}, folder / "verified.parquet", None, rows, step)
    attributions = timed_stage("attribute", config, {"verified": verified}, folder / "attribute_oar_g.parquet",
                               policy, rows, step)
    advantages = timed_stage("reshape", config, {"attributions": attributions}, folder / "advantages.parquet", None,
                             rows, step)
    timed_stage("update", config, {"advantages": advantages}, folder / "policy", policy, rows, step)
    return folder / "policy"


def engine_reuse_verdict(backend: str, second_sample: dict) -> tuple[bool, str]:
    """(passed, one line) on how the second step's sample got its engine."""
    if backend != "vllm":
        return True, "vLLM not used (not installed, or --backend transformers): the engine-reuse check is skipped"
    engine, failures = second_sample.get("engine"), second_sample.get("canary_failures", 0)
    if engine == "reloaded" and not failures:
        return True, (f"engine kept: new weights loaded in place in {second_sample['engine_load_seconds']:.1f} s, "
                      f"canary {second_sample['canary_seconds']:.2f} s")
    return False, f"engine NOT kept: {engine} (canary failures {failures}); expected an in-place reload"
