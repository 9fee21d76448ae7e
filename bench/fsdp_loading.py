"""Host memory of an FSDP update when only rank 0 reads the policy (issue 15, "Loading once").

    python bench/fsdp_loading.py            # a random-init Qwen2 of 72M parameters (289 MB in fp32), ~2 min
    python bench/fsdp_loading.py --hidden 256 --layers 2   # a smoke run

The embedded toy policy samples one small batch (sample, verify, attribute uniform, reshape), then
the same update runs twice on a random-init Qwen2 with the toy tokenizer, launched on 2 CPU ranks
(gloo) with configs/accelerate/cpu-fsdp-2proc.yaml: once as shipped (fsdp_cpu_ram_efficient_loading:
rank 0 reads the weights, rank 1 builds the model on the meta device and receives them by broadcast),
once with every rank reading the weights. It prints each run's peak resident memory per rank, once
loaded and prepared and over the whole stage (the update manifest's host_load_peak_rss_mb_* and
host_peak_rss_mb_*), measured, and the largest weight difference between the two checkpoints (they
must agree: that part carries over). The memory does not: on CPU, FSDP refuses sync_module_states,
so the other ranks allocate the whole model and receive rank 0's weights by broadcast before FSDP
shards it (a full copy each, as if they had read it), and every rank later gathers the full weights
on CPU to write its turn of the weight files. On GPUs FSDP broadcasts unit by unit into GPU memory and the gather is in
GPU memory too, so there the other ranks skip their fp32 host copy (4 bytes per parameter: 30.5 GB
each at 7B): predicted, not measured here (bench/gpu_check.py's FSDP row runs that path).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
FSDP = ROOT / "configs" / "accelerate" / "cpu-fsdp-2proc.yaml"


def _oarctl(*args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "oarctl.cli", *args], capture_output=True, text=True, cwd=ROOT)
    if done.returncode:
        raise SystemExit(f"oarctl {args[0]} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")


def batch(folder: Path) -> tuple[Path, Path]:
    """(advantages.parquet, config.yaml): one step's batch of the embedded toy policy."""
    config = folder / "config.yaml"
    config.write_text(yaml.safe_dump({
        "run": {"progress": False}, "data": {"toy_train_size": 64, "toy_heldout_size": 8},
        "sample": {"prompts_per_step": 8, "group_size": 4, "max_new_tokens": 48},
        "attribute": {"method": "uniform"}, "update": {"micro_batch_size": 8, "mini_batch_size": 32}}))
    _oarctl("toy", "prompts", "-o", str(folder / "prompts.parquet"), "-n", "64")
    previous = folder / "prompts.parquet"
    for stage, output in (("sample", "rollouts"), ("verify", "verified"), ("attribute", "attributions"),
                          ("reshape", "advantages")):
        _oarctl(stage, str(previous), "-o", str(folder / f"{output}.parquet"), "-c", str(config))
        previous = folder / f"{output}.parquet"
    return previous, config


def random_policy(folder: Path, hidden: int, layers: int, vocabulary: int) -> Path:
    """A random-init Qwen2 (Qwen2.5's head and MLP ratios) with the toy tokenizer, as safetensors."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from oarctl.policy.paths import resolve_policy_path
    from oarctl.checkpoints import load_tokenizer

    tokenizer = load_tokenizer(resolve_policy_path("toy"))
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=vocabulary, hidden_size=hidden, intermediate_size=hidden * 27 // 5,
                         num_hidden_layers=layers, num_attention_heads=max(1, hidden // 128) * 2,
                         num_key_value_heads=max(1, hidden // 512), max_position_embeddings=512,
                         tie_word_embeddings=False, pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id)
    model = Qwen2ForCausalLM(config)
    policy = folder / "policy"
    model.save_pretrained(policy, safe_serialization=True)
    tokenizer.save_pretrained(policy)
    return policy


def launched_update(advantages: Path, config: Path, policy: Path, output: Path, rank_zero_only: bool) -> dict:
    """The update under accelerate launch on 2 CPU ranks (the command `oarctl run` launches); its manifest's
    metrics."""
    from oarctl.processes.launch import update_command

    settings = yaml.safe_load(FSDP.read_text())
    settings["fsdp_config"].update(fsdp_cpu_ram_efficient_loading=rank_zero_only, fsdp_sync_module_states=rank_zero_only)
    launcher_file = output.parent / f"{output.name}-accelerate.yaml"
    launcher_file.write_text(yaml.safe_dump(settings))
    command = update_command(str(launcher_file), advantages, output, policy, 0, config, False)
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    if done.returncode:
        raise SystemExit(f"the launched update failed:\n{done.stderr[-3000:]}")
    return json.loads(output.with_name(output.name + ".manifest.json").read_text())["metrics"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--vocabulary", type=int, default=32768)
    args = parser.parse_args(argv)
    from safetensors.torch import load_file

    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        advantages, config = batch(work)
        policy = random_policy(work, args.hidden, args.layers, args.vocabulary)
        weights = sum(p.stat().st_size for p in policy.glob("model*.safetensors"))
        print(f"policy: random-init Qwen2, hidden {args.hidden}, {args.layers} layers, vocabulary "
              f"{args.vocabulary}: {weights / 1e6:.0f} MB of fp32 weights; 2 CPU ranks, FSDP full shard")
        runs = {name: launched_update(advantages, config, policy, work / name, name == "rank 0 reads")
                for name in ("every rank reads", "rank 0 reads")}
        one, two = (load_file(work / name / "model.safetensors") for name in runs)
        difference = max(float((one[k] - two[k]).abs().max()) for k in one)
        print(f"{'peak host MB (measured)':<24}{'rank 0 loaded':>14}{'rank 1 loaded':>14}{'rank 0 whole':>13}"
              f"{'rank 1 whole':>13}")
        for name, m in runs.items():
            print(f"{name:<24}{m['host_load_peak_rss_mb_rank0']:>14.0f}{m['host_load_peak_rss_mb_other_ranks']:>14.0f}"
                  f"{m['host_peak_rss_mb_rank0']:>13.0f}{m['host_peak_rss_mb_other_ranks']:>13.0f}")
        key = "host_load_peak_rss_mb_other_ranks"
        saved = runs["every rank reads"][key] - runs["rank 0 reads"][key]
        print(f"once loaded and prepared, rank 1 held {saved:.0f} MB less with rank 0 reading alone "
              f"({saved * 1e6 / weights:.2f}x the fp32 weights; on CPU, see the docstring); the two checkpoints "
              f"differ by at most {difference:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
