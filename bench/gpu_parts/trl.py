"""Part trl of bench/gpu_check.py: examples/trl_oar.py (OARGRPOTrainer) under `accelerate launch`."""
from __future__ import annotations

import sys
import time
from pathlib import Path

from bench.gpu_parts.common import ROOT, sampling_backend


def run_trl(args, work: Path, policy: Path) -> list:
    """examples/trl_oar.py (OARGRPOTrainer, oar_g, 2 prompts x 8 completions, two steps) on the policy under
    `accelerate launch`: FSDP on one GPU, ZeRO-3 and FSDP + vLLM when installed (--tiny: FSDP on two CPU
    ranks). A row each: seconds, the example's own line (steps, processes, peak GPU memory of rank 0)."""
    import subprocess

    accelerate = ROOT / "configs" / "accelerate"
    runs = [("fsdp", accelerate / "cpu-fsdp-2proc-trl.yaml", 2, [])]
    if not args.tiny:  # one GPU: fsdp.yaml; ZeRO-3 (through accelerate it needs a GPU) and vLLM when installed
        runs = [(kind, _one_process(accelerate / f"{kind}.yaml", work), 1, []) for kind in ("fsdp", "deepspeed_zero3")
                if kind == "fsdp" or _installed("deepspeed")]
        runs += [("fsdp_vllm", runs[0][1], 1, ["--vllm"])] if sampling_backend(args) == "vllm" else []
    rows = []
    for kind, file, ranks, extra in runs:
        command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(file),
                   str(ROOT / "examples" / "trl_oar.py"), "--model", str(policy), "--steps", "2",
                   "--prompts-per-step", "2", "--out", str(work / f"trl-oar-{kind}"), *extra]
        started = time.perf_counter()
        launched = subprocess.run(command, capture_output=True, text=True)
        if launched.returncode:
            raise RuntimeError(f"examples/trl_oar.py under {kind} failed ({launched.returncode}):\n"
                               f"{launched.stderr[-3000:]}")
        line = next(x for x in launched.stdout.splitlines() if " steps in " in x)
        rows.append((f"trl_{kind}_x{ranks}", time.perf_counter() - started, float("nan"), {"trl": line}))
    return rows


def _one_process(config: Path, work: Path) -> Path:
    """`config` with num_processes 1, written into `work`."""
    import yaml

    file = work / f"{config.stem}-one-gpu.yaml"
    file.write_text(yaml.safe_dump({**yaml.safe_load(config.read_text()), "num_processes": 1}))
    return file


def _installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None
