"""Run one stage with caching: key, hit/miss, atomic outputs, manifest written last.

A stage's output `X` (a Parquet file, or a policy folder for `update`) is complete only when
`X.manifest.json` exists beside it and records the same cache key. The key is the sha256 of the
stage name and version, its config section, the seed and step, and the content hashes of its
inputs, so editing a config or an upstream file re-runs exactly what depends on it, and
`oarctl status` can say why. The manifest also records where the stage ran (oarctl/provenance.py),
outside the key: a finished output stays finished on another machine. A policy folder is written by
what the update stage returns (`trained.write`, oarctl/training/save.py); the runner knows keys,
manifests and atomic outputs only.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import time
from pathlib import Path

from oarctl import provenance
from oarctl.artifacts import read_artifact, temporary_sibling, write_parquet
from oarctl.contract import Policy, StageContext, StageOutput  # noqa: F401 re-export for one release: oarctl.contract
from oarctl.distributed import rank
from oarctl.errors import InputError, OarError
from oarctl.hashing import HASHING, READING, sha256_file


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_if_dead(leftover: Path) -> None:
    pid = leftover.name.rsplit("-", 1)[-1]
    if pid.isdigit() and not _alive(int(pid)):
        shutil.rmtree(leftover) if leftover.is_dir() else leftover.unlink(missing_ok=True)


def remove_dead_temporaries(output: Path) -> None:
    """Delete `.NAME.tmp-PID` leftovers of writers that were killed (their PID is gone)."""
    for name in (output.name, manifest_path(output).name):
        for leftover in output.parent.glob(f".{name}.tmp-*"):
            _remove_if_dead(leftover)


def sweep_dead_temporaries(folder: Path) -> None:
    """The same for a whole run folder, once when a run (re)starts."""
    for leftover in sorted(folder.rglob(".*.tmp-*"), key=lambda p: len(p.parts), reverse=True):
        if leftover.exists():
            _remove_if_dead(leftover)


def manifest_path(output: Path) -> Path:
    return output.with_name(output.name + ".manifest.json")


def _canonical_hash(document: dict) -> str:
    return hashlib.sha256(json.dumps(document, sort_keys=True, default=str).encode()).hexdigest()


def input_hash(path: Path) -> str:
    if not path.is_file():
        raise OarError(f"{path}: {'is a directory, expected a Parquet file' if path.is_dir() else 'file not found'}")
    return sha256_file(path)


def key_parts(stage, section: dict, input_paths: dict[str, Path], context: StageContext) -> dict:
    inputs = {name: input_hash(path) for name, path in sorted(input_paths.items())}
    if context.policy is not None:
        inputs["policy"] = context.policy.identity
        if context.policy.backend != "transformers":  # other samples, same policy: keys of old runs unchanged
            inputs["backend"] = context.policy.backend
        if context.policy.backend == "vllm" and context.policy.vllm:  # float32 and bfloat16 engines sample apart
            inputs["engine_dtype"] = context.policy.vllm["dtype"]
    if context.reference is not None:
        inputs["reference"] = context.reference.identity
    return {"stage": stage.name, "version": stage.version, "config": section, "inputs": inputs,
            "seed": context.seed, "step": context.step}


def read_manifest(output: Path) -> dict | None:
    path = manifest_path(output)
    if not path.exists() or not output.exists():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError:
        return None  # a torn manifest cannot happen with atomic writes, but treat it as absent


NO_OUTPUT = "no output yet"


def _config_changes(stage: str, recorded: dict, current: dict) -> str:
    """The options of the stage's section whose value differs, as `section.key`."""
    names = sorted(k for k in set(recorded) | set(current) if recorded.get(k) != current.get(k))
    # prompt_template joins a generating stage's key from the data section (pipeline.key_section)
    return ", ".join(f"data.{name}" if name == "prompt_template" else f"{stage}.{name}" for name in names)


def why_stale(output: Path, parts: dict) -> str | None:
    """None when the finished output matches `parts`; else a short reason it must (re)run:
    `no output yet`, `incomplete (no manifest)`, or what changed, e.g. `config changed (sample.top_p)`."""
    manifest = read_manifest(output)
    if manifest is None:
        return NO_OUTPUT if not output.exists() else "incomplete (no manifest)"
    if manifest["key"] == _canonical_hash(parts):
        return None
    recorded = manifest["key_parts"]
    changed = [f"{name} changed" for name in ("version", "seed", "step") if recorded.get(name) != parts[name]]
    if recorded.get("config") != parts["config"]:
        options = _config_changes(parts["stage"], recorded.get("config") or {}, parts["config"])
        changed.insert(0, f"config changed ({options})")
    inputs = [n for n in sorted(set(recorded["inputs"]) | set(parts["inputs"]))
              if recorded["inputs"].get(n) != parts["inputs"].get(n)]
    if inputs:
        changed.append(f"input changed ({', '.join(inputs)})")
    return ", ".join(changed or ["key changed"])


def write_manifest(output: Path, parts: dict, metrics: dict, seconds: float, output_hash: str | None) -> dict:
    manifest = {"stage": parts["stage"], "key": _canonical_hash(parts), "key_parts": parts,
                "output_sha256": output_hash, "metrics": metrics, "wall_seconds": round(seconds, 3),
                "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    if not rank() == 0:
        return manifest  # rank 0 writes it
    manifest["provenance"] = provenance.record()  # beside the key, never in it: a cache hit holds on any machine
    path = manifest_path(output)
    temporary = temporary_sibling(path)
    temporary.write_text(json.dumps(manifest, indent=1, sort_keys=True, default=str))
    temporary.replace(path)
    return manifest


def _write_outputs(stage, result: StageOutput, output: Path) -> tuple[str, dict]:
    """(the output's hash, metrics of the checkpoint's I/O: bytes written and hashed, seconds)."""
    if stage.output_kind != "policy":
        write_parquet(result.table, output)
        return sha256_file(output), {}
    return result.trained.write(result.table, output)  # the checkpoint: oarctl/training/save.py


def _load_io(hashed: dict, read: dict) -> dict:
    """Checkpoint bytes this process read and verified while the stage ran, and the seconds (of the
    verification, those it waited for when it ran beside the work: the rest was hidden)."""
    return {"checkpoint_bytes_read": READING["bytes"] - read["bytes"],
            "checkpoint_read_seconds": round(READING["seconds"] - read["seconds"], 3),
            "checkpoint_bytes_verified": HASHING["bytes"] - hashed["bytes"],
            "checkpoint_verify_seconds": round(HASHING["seconds"] - hashed["seconds"], 3),
            "checkpoint_verify_waited_seconds": round(HASHING["waited"] - hashed["waited"], 3)}


def run_cached(stage, section: dict, section_config, input_paths: dict[str, Path], output: Path,
               context: StageContext, force: bool = False, log=print) -> tuple[dict, bool]:
    """Run `stage` unless its output is already complete for the same key. Returns (manifest, ran)."""
    parts = key_parts(stage, section, input_paths, context)
    reason = "forced (--force)" if force else why_stale(output, parts)
    if reason is None:
        log(f"[{stage.name}] {output}: done (cached)")
        return read_manifest(output), False
    inputs = {name: read_artifact(path, stage.inputs[name]) for name, path in input_paths.items()}
    log(f"[{stage.name}] {output}: running: {reason}")
    if rank() == 0:
        manifest_path(output).unlink(missing_ok=True)  # the old output is no longer vouched for
        remove_dead_temporaries(output)
        shutil.rmtree(temporary_sibling(output), ignore_errors=True)  # this process's own, from a failed try
    started, hashed, read = time.perf_counter(), dict(HASHING), dict(READING)
    try:
        result = stage.function(inputs, section_config, dataclasses.replace(context, output=output))
    except InputError as error:  # a problem of one row of the input: name the file
        raise OarError(f"{' + '.join(map(str, input_paths.values()))}: {error}") from None
    load_io = _load_io(hashed, read) if stage.output_kind == "policy" else {}
    output_hash, io = _write_outputs(stage, result, output) if rank() == 0 else (None, {})
    if stage.output_kind == "policy":
        io["policy_ready_seconds"] = round(time.perf_counter() - started, 3)  # from here on it may be sampled
    if result.after_commit is not None:  # the training state, written by every rank (FSDP)
        io = result.after_commit(io)
    io = {**load_io, **io}
    return write_manifest(output, parts, {**result.metrics, **io}, time.perf_counter() - started, output_hash), True


def require_complete(output: Path) -> dict:
    manifest = read_manifest(output)
    if manifest is None:
        raise OarError(f"{output}: stage output is incomplete (no manifest)")
    return manifest
