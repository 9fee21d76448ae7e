"""What every part of bench/gpu_check.py uses: the config overrides of a run, a stage run in this process
(one row: seconds, peak GPU memory, metrics), the FSDP launcher and the weight difference of two checkpoints."""
from __future__ import annotations

import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository: configs/accelerate, examples/


def sampling_backend(args) -> str:
    from oarctl.policy.backends import vllm_installed

    if args.tiny:
        return "transformers"
    return ("vllm" if vllm_installed() else "transformers") if args.backend == "auto" else args.backend


def base_overrides(args, policy: Path) -> list[str]:
    device, backend = ("cpu" if args.tiny else "cuda"), sampling_backend(args)
    return [f"policy.path={policy}", f"policy.device={device}", f"policy.backend={backend}", "run.progress=false",
            f"sample.prompts_per_step={args.prompts}", f"sample.group_size={args.group}",
            f"sample.max_new_tokens={args.tokens}", f"update.sum_norm_length={args.tokens}",
            "update.mini_batch_size=64", "update.micro_batch_size=8", "attribute.batch_size=8",
            "verify.method=boxed", "vllm.dtype=bfloat16", f"vllm.max_model_len={args.tokens + 128}",
            f"attribute.dtype={'float32' if args.tiny else 'bfloat16'}", f"attribute.chunk_size={args.chunk}"]


def peak_reset() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()


def peak_gib() -> float:
    import torch

    return torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else float("nan")


def timed_stage(name, config, inputs, output, policy, rows, step=0):
    from oarctl.pipeline import run_stage

    peak_reset()
    started = time.perf_counter()
    manifest, _ = run_stage(name, config, inputs, output, step=step, policy_path=policy, force=True,
                            log=lambda *a: None)
    rows.append((output.stem if name == "attribute" else name, time.perf_counter() - started,
                 peak_gib(), manifest["metrics"]))
    return output


def fsdp_launcher(args, work: Path) -> tuple[Path, int]:
    """(accelerate config file, ranks): cpu-fsdp-2proc.yaml with --tiny; else fsdp.yaml with one process
    per GPU this machine has (it names 8), written into `work`."""
    import torch
    import yaml

    accelerate = ROOT / "configs" / "accelerate"
    if args.tiny:
        return accelerate / "cpu-fsdp-2proc.yaml", 2
    ranks = torch.cuda.device_count()
    file = work / "fsdp-this-machine.yaml"
    file.write_text(yaml.safe_dump({**yaml.safe_load((accelerate / "fsdp.yaml").read_text()), "num_processes": ranks}))
    return file, ranks


def weight_difference(one: Path, other: Path) -> float:
    """The largest absolute difference between two checkpoints' weights, however many files each has."""
    from oarctl.checkpoints import read_weights

    first, second = read_weights(one), read_weights(other)
    return max(float((first[k].float() - second[k].float()).abs().max()) for k in first)


def write_config(config, path: Path) -> None:
    import yaml

    from oarctl.config import to_dict

    path.write_text(yaml.safe_dump(to_dict(config), sort_keys=False))
