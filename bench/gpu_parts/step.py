"""Part step of bench/gpu_check.py: one sampled RL step (sample, verify, attribute oar_g and oar_p_span,
reshape, update), then the same update under `accelerate launch` with FSDP and through a persistent worker."""
from __future__ import annotations

import sys
import time
from pathlib import Path

from bench.gpu_parts.common import base_overrides, fsdp_launcher, timed_stage, weight_difference, write_config


def run_step(args, work: Path, policy: Path) -> list:
    """Part step: one sampled RL step in this process, then its update launched with FSDP and persistent."""
    from oarctl.artifacts import write_parquet
    from oarctl.config import load_config
    from oarctl.data import toy_prompts

    config = load_config(None, base_overrides(args, policy))
    prompts = work / "prompts.parquet"
    write_parquet(toy_prompts("train", args.prompts, config.data.toy_levels), prompts)
    rows: list = []
    rollouts = timed_stage("sample", config, {"prompts": prompts}, work / "rollouts.parquet", policy, rows)
    verified = timed_stage("verify", config, {"rollouts": rollouts}, work / "verified.parquet", None, rows)
    for method in ("oar_g", "oar_p_span"):  # exact oar_p: part long, on a few responses
        config.attribute.method = method
        attributions = timed_stage("attribute", config, {"verified": verified}, work / f"attribute_{method}.parquet",
                                   policy, rows)
    advantages = timed_stage("reshape", config, {"attributions": attributions}, work / "advantages.parquet", None, rows)
    timed_stage("update", config, {"advantages": advantages}, work / "policy_next", policy, rows)
    _launched_fsdp_update(args, config, advantages, work, policy, rows)
    _persistent_fsdp_updates(args, config, advantages, work, policy, rows)
    return rows


def _launched_fsdp_update(args, config, advantages: Path, work: Path, policy: Path, rows) -> None:
    """The update again, under `accelerate launch` with FSDP; a row with the weight difference, and the
    seconds the ranks took to write the weight files in turn and their AdamW shards."""
    import json
    import subprocess

    from oarctl.processes.launch import update_command

    file, ranks = fsdp_launcher(args, work)
    write_config(config, work / "config.yaml")
    command = update_command(str(file), advantages, work / "policy_fsdp", policy, 0, work / "config.yaml", True)
    started = time.perf_counter()
    launched = subprocess.run(command, capture_output=True, text=True)
    if launched.returncode:
        raise RuntimeError(f"the launched FSDP update failed ({launched.returncode}):\n{launched.stderr[-3000:]}")
    seconds = time.perf_counter() - started
    difference = weight_difference(work / "policy_next", work / "policy_fsdp")  # files the ranks wrote in turn
    io = json.loads((work / "policy_fsdp.manifest.json").read_text())["metrics"]
    rows.append((f"update_fsdp_x{ranks}", seconds, float("nan"),
                 {"weight_difference": difference, "weight_files": len(list((work / "policy_fsdp").glob("model*.safetensors"))),
                  **{key: io[key] for key in ("weight_file_write_seconds", "weight_file_hash_seconds",
                                              "optimizer_shard_write_seconds", "checkpoint_verify_seconds",
                                              "checkpoint_verify_waited_seconds", "policy_ready_seconds",
                                              "training_state_seconds") if key in io}}))


def _persistent_fsdp_updates(args, config, advantages: Path, work: Path, policy: Path, rows) -> None:
    """The same update twice through a persistent worker (update.persistent), as `oarctl run` sends it:
    the first request launches the ranks and loads the policy, the second trains on from what they kept
    (no launch, no checkpoint read). A row each: seconds from request to answer, resident, bytes read;
    the first one's weights must be those of the one-shot launch."""
    import dataclasses
    import json

    from oarctl.processes.launch import stop_update_worker, update_worker

    file, _ = fsdp_launcher(args, work)
    update = dataclasses.replace(config.update, accelerate_config=str(file), persistent=True)
    config = dataclasses.replace(config, update=update)  # the worker reads work/config.yaml, written below
    write_config(config, work / "config.yaml")
    try:
        for index, (source, output) in enumerate(((policy, work / "policy_kept1"), (work / "policy_kept1",
                                                                                    work / "policy_kept2"))):
            started = time.perf_counter()
            log = lambda message: print(message, file=sys.stderr)  # noqa: E731 - stdout holds the table
            update_worker(config, work, log).submit(advantages, output, source, index, True, log).finish()
            metrics = json.loads((output.parent / f"{output.name}.manifest.json").read_text())["metrics"]
            note = {key: metrics[key] for key in ("resident", "checkpoint_bytes_read", "policy_ready_seconds",
                                                  "training_state_seconds")}
            if index == 0:
                note["weight_difference"] = weight_difference(work / "policy_fsdp", output)
            rows.append((f"update_persistent_request{index + 1}", time.perf_counter() - started, float("nan"), note))
    finally:
        stop_update_worker()
