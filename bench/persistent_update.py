"""One launch of the update per step against a persistent update worker (issue 15, update.persistent).

    python bench/persistent_update.py             # 4 steps of the embedded toy policy, ~3 min on 2 cores
    python bench/persistent_update.py --steps 2   # a smoke run

The same `oarctl run` twice, with the update launched on 2 CPU ranks (gloo) through
configs/accelerate/cpu-fsdp-2proc.yaml: once launched anew every step (each step starts accelerate,
the interpreters, the process group, reads the policy and the AdamW state and wraps the model), once
with update.persistent (the ranks are launched at the first step and keep the model, AdamW and step
counts in memory). It prints, measured, each run's wall seconds and what the worker saved per step
after the first (the difference over steps - 1: the first step launches either way), and per step the
update's own wall seconds (inside the ranks: loading, training, writing), its checkpoint bytes read,
whether it trained from memory, and when its policy was ready.
The two final policies must be byte-identical (that part carries over to GPUs; the seconds do not:
at 7B a launch also reads 15 GB and initialises CUDA and NCCL on 8 GPUs).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
FSDP = ROOT / "configs" / "accelerate" / "cpu-fsdp-2proc.yaml"


def write_config(folder: Path, steps: int, prompts: int) -> Path:
    config = folder / "config.yaml"
    config.write_text(yaml.safe_dump({
        "run": {"steps": steps, "progress": False, "eval_every": 0, "keep_checkpoints": steps},
        "data": {"toy_train_size": 256, "toy_heldout_size": 8},
        "sample": {"prompts_per_step": prompts, "group_size": 4, "max_new_tokens": 48},
        "attribute": {"method": "uniform"},
        "update": {"micro_batch_size": 8, "mini_batch_size": prompts * 4,
                   "accelerate_config": str(FSDP)}}))
    return config


def timed_run(config: Path, run_dir: Path, persistent: bool) -> float:
    command = [sys.executable, "-m", "oarctl.cli", "run", "-c", str(config), "--run-dir", str(run_dir),
               "--set", f"update.persistent={str(persistent).lower()}"]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    seconds = time.perf_counter() - started
    if done.returncode:
        raise SystemExit(f"oarctl run failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return seconds


def step_rows(run_dir: Path) -> list[dict]:
    """Per step: the update's own wall seconds and its metrics."""
    rows = []
    for folder in sorted(run_dir.glob("step_*")):
        manifest = json.loads((folder / "policy.manifest.json").read_text())
        update = manifest["metrics"]
        rows.append({"step": folder.name, "update_seconds": manifest["wall_seconds"],
                     "bytes_read": update["checkpoint_bytes_read"], "resident": update.get("resident", 0),
                     "policy_ready_seconds": update.get("policy_ready_seconds", float("nan"))})
    return rows


def final_weights_sha(run_dir: Path) -> str:
    last = sorted(run_dir.glob("step_*"))[-1] / "policy"
    digest = hashlib.sha256()
    for weights in sorted(last.glob("*.safetensors")):
        digest.update(weights.read_bytes())
    return digest.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=16, help="prompts per step (4 samples each)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        config = write_config(folder, args.steps, args.prompts)
        results = {}
        for name, persistent in (("launched per step", False), ("persistent worker", True)):
            seconds = timed_run(config, folder / name.replace(" ", "_"), persistent)
            results[name] = (seconds, step_rows(folder / name.replace(" ", "_")),
                             final_weights_sha(folder / name.replace(" ", "_")))
    print(f"{args.steps} steps of the toy policy, {args.prompts} prompts x 4 samples, update on 2 CPU ranks "
          f"(FSDP, gloo); measured\n")
    (launched, *_), (kept, *_) = results.values()
    for name, (seconds, *_) in results.items():
        print(f"{name:<20}{seconds:>8.1f} s the run")
    print(f"saved by the worker per step after the first: {(launched - kept) / max(1, args.steps - 1):.1f} s")
    print(f"\n{'run':<20}{'step':<11}{'update s':>9}{'bytes read':>12}{'from memory':>13}{'policy ready s':>16}")
    for name, (_, rows, _) in results.items():
        for row in rows:
            print(f"{name:<20}{row['step']:<11}{row['update_seconds']:>9.2f}{row['bytes_read']:>12,}"
                  f"{row['resident']:>13}{row['policy_ready_seconds']:>16.2f}")
    first, second = (sha for *_, sha in results.values())
    print(f"\nfinal weights sha256: {first[:16]} vs {second[:16]}: {'identical' if first == second else 'DIFFER'}")
    if first != second:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
