"""One full RL step at Qwen2.5-1.5B's shape on a GPU, no download: time, tokens/s, peak memory per stage.

    python bench/gpu_check.py                 # CUDA + vLLM: sample (vllm), verify, attribute oar_g and
                                              # oar_p, reshape, update on a random-init 1.5B-shaped Qwen2
    python bench/gpu_check.py --tiny          # the same pipeline on CPU at toy size, transformers backend

After the step's update in this process, the same update runs again under `accelerate launch` with
configs/accelerate/fsdp.yaml over every visible GPU (--tiny: cpu-fsdp-2proc.yaml, two CPU ranks),
as `oarctl run` does with update.accelerate_config, and the largest weight difference between the
two checkpoints is printed (its peak memory is the launched processes', not measured here).

The model is randomly initialised with Qwen2.5-1.5B's configuration (hidden 1536, 28 layers,
12 heads, 2 key/value heads, intermediate 8960, vocab 151,936, tied embeddings) and saved in fp32;
the tokenizer is the toy character tokenizer (ids < 104), so the model's vocabulary is padded: a
random model samples mostly ids the tokenizer cannot name, which decode to nothing. Rewards are
therefore ~0 and the update moves little; what is measured is the machinery's cost, not learning.
Stages run in this process through `oarctl.pipeline.run_stage`, the function the `oarctl sample`,
`verify`, ... commands call, so each stage's peak GPU memory can be read (torch.cuda
max_memory_allocated; vLLM's key/value cache is allocated through torch and counts).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

QWEN25_15B = dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                  intermediate_size=8960, vocab_size=151_936, max_position_embeddings=32_768, rope_theta=1e6)
TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
            intermediate_size=128, vocab_size=1000, max_position_embeddings=512, rope_theta=1e4)


def _arguments():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="toy size on CPU with the transformers backend")
    parser.add_argument("--workdir", default="runs/gpu_check", help="model, artifacts and the new policy go here")
    parser.add_argument("--prompts", type=int, default=32, help="sample.prompts_per_step")
    parser.add_argument("--group", type=int, default=8, help="sample.group_size")
    parser.add_argument("--tokens", type=int, default=256, help="sample.max_new_tokens")
    return parser.parse_args()


def _build_policy(folder: Path, shape: dict) -> Path:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from oarctl.toy.tokenizer import build_tokenizer

    if (folder / "model.safetensors").exists() or (folder / "model.safetensors.index.json").exists():
        return folder
    tokenizer = build_tokenizer()
    config = Qwen2Config(**shape, tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.pad_token_id, dtype="float32")
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    return folder


def _overrides(args, policy: Path) -> list[str]:
    device, backend = ("cpu", "transformers") if args.tiny else ("cuda", "vllm")
    return [f"policy.path={policy}", f"policy.device={device}", f"policy.backend={backend}", "run.progress=false",
            f"sample.prompts_per_step={args.prompts}", f"sample.group_size={args.group}",
            f"sample.max_new_tokens={args.tokens}", f"update.sum_norm_length={args.tokens}",
            "update.mini_batch_size=64", "update.micro_batch_size=8", "attribute.batch_size=8",
            "verify.method=boxed", "vllm.dtype=bfloat16", f"vllm.max_model_len={args.tokens + 128}"]


def _peak_reset() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()


def _peak_gib() -> float:
    import torch

    return torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else float("nan")


def _run(name, config, inputs, output, policy, rows):
    from oarctl.pipeline import run_stage

    _peak_reset()
    started = time.perf_counter()
    manifest, _ = run_stage(name, config, inputs, output, policy_path=policy, force=True, log=lambda *a: None)
    rows.append((name if "attribute" not in str(output) else output.stem, time.perf_counter() - started,
                 _peak_gib(), manifest["metrics"]))
    return output


def _step(args, work: Path, policy: Path) -> list:
    from oarctl.artifacts import write_parquet
    from oarctl.config import load_config
    from oarctl.data import toy_prompts

    config = load_config(None, _overrides(args, policy))
    prompts = work / "prompts.parquet"
    write_parquet(toy_prompts("train", args.prompts, config.data.toy_levels), prompts)
    rows: list = []
    rollouts = _run("sample", config, {"prompts": prompts}, work / "rollouts.parquet", policy, rows)
    verified = _run("verify", config, {"rollouts": rollouts}, work / "verified.parquet", None, rows)
    for method in ("oar_g", "oar_p"):
        config.attribute.method = method
        attributions = _run("attribute", config, {"verified": verified}, work / f"attribute_{method}.parquet",
                            policy, rows)
    advantages = _run("reshape", config, {"attributions": attributions}, work / "advantages.parquet", None, rows)
    _run("update", config, {"advantages": advantages}, work / "policy_next", policy, rows)
    _launched_fsdp_update(args, config, advantages, work, policy, rows)
    return rows


def _launched_fsdp_update(args, config, advantages: Path, work: Path, policy: Path, rows) -> None:
    """The update again, under `accelerate launch` with FSDP; a row with the weight difference."""
    import subprocess

    import torch
    import yaml
    from safetensors.torch import load_file

    from oarctl.config import to_dict
    from oarctl.launch import update_command

    accelerate = Path(__file__).resolve().parents[1] / "configs" / "accelerate"
    file, ranks = ((accelerate / "cpu-fsdp-2proc.yaml", 2) if args.tiny else
                   (accelerate / "fsdp.yaml", torch.cuda.device_count()))
    (work / "config.yaml").write_text(yaml.safe_dump(to_dict(config), sort_keys=False))
    command = update_command(str(file), advantages, work / "policy_fsdp", policy, 0, work / "config.yaml", True)
    command[command.index("--config_file") + 2:command.index("--config_file") + 2] = ["--num_processes", str(ranks)]
    started = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True)
    seconds = time.perf_counter() - started
    one, other = load_file(work / "policy_next" / "model.safetensors"), load_file(work / "policy_fsdp" / "model.safetensors")
    difference = max(float((one[k].float() - other[k].float()).abs().max()) for k in one)
    rows.append((f"update_fsdp_x{ranks}", seconds, float("nan"), {"weight_difference": difference}))


def _report(rows, args) -> None:
    print(f"{'stage':<18} {'seconds':>8} {'peak GiB':>9}  notes")
    for name, seconds, peak, metrics in rows:
        note = ""
        if name == "sample":
            tokens = metrics["responses"] * metrics["response_length_mean"]
            note = f"{tokens:.0f} tokens, {tokens / seconds:.0f} tokens/s"
        elif name.startswith("update_fsdp"):
            note = f"accelerate launch; weights differ from the in-process update by {metrics['weight_difference']:.2e}"
        print(f"{name:<18} {seconds:>8.1f} {peak:>9.2f}  {note}")
    print(f"total {sum(r[1] for r in rows):.1f} s; "
          f"{args.prompts} prompts x {args.group} samples x <= {args.tokens} tokens")


def main() -> None:
    args = _arguments()
    if not args.tiny:
        import torch

        if not torch.cuda.is_available():
            sys.exit("error: bench/gpu_check.py needs a CUDA GPU and vllm (pip install -e '.[vllm]'); "
                     "use --tiny for the CPU version")
        from oarctl.policy.backends import vllm_installed

        if not vllm_installed():
            sys.exit("error: bench/gpu_check.py needs vllm (pip install -e '.[vllm]')")
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    name, shape = ("tiny_policy", TINY) if args.tiny else ("qwen25_15b_random", QWEN25_15B)
    policy = _build_policy(work / name, shape)
    print(f"policy {policy} ready in {time.perf_counter() - started:.1f} s")
    _report(_step(args, work, policy), args)


if __name__ == "__main__":
    main()
