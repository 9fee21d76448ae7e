"""One full RL step at Qwen2.5-1.5B's shape on a GPU, no download: time, tokens/s, peak memory per stage.

    python bench/gpu_check.py                 # CUDA: sample (vLLM if installed, else transformers),
                                              # verify, attribute, reshape, update on a random-init
                                              # 1.5B-shaped Qwen2, then long-response attribution
    python bench/gpu_check.py --tiny          # the same pipeline on CPU at toy size, transformers backend
    python bench/gpu_check.py --parts long    # only the long-response attribution (and its update)
    python bench/gpu_check.py --parts twostep # two RL steps in a row: is the vLLM engine kept?

Part `long` (issue 14): synthetic rollouts of `--long-tokens` (2,048) toy tokens each, two groups of
`--group` with mixed rewards, go through the real stages: the attribute stage in bfloat16 with
oar_g (gradient checkpointing on), oar_p_span, oar_p_screened, oar_flow_local, and exact oar_p on `--exact-rows`
responses only, then reshape and the update (fp32 weights, AdamW) within `update.micro_batch_tokens`.
Each prints its seconds, seconds per response and peak GPU memory, so attribution is read next to
the update that follows it. The synthetic log-probs are not the policy's (the update's ratios are
off); what is measured is cost, not learning.

After the step's update in this process, the same update runs again under `accelerate launch` with
configs/accelerate/fsdp.yaml over every visible GPU (--tiny: cpu-fsdp-2proc.yaml, two CPU ranks),
as `oarctl run` does with update.accelerate_config, and the largest weight difference between the
two checkpoints is printed (its peak memory is the launched processes', not measured here), with
when the policy was committed (`policy_ready_seconds`: `oarctl run` samples from then on) and how long
the ranks then wrote the training state (`training_state_seconds`: what the engines' reload hides). fsdp.yaml
loads on rank 0 only (fsdp_cpu_ram_efficient_loading: the other ranks start from the meta device and
FSDP's sync_module_states broadcasts the weights, a path CPU FSDP refuses): a wrong broadcast shows
as a large weight difference.

Part `trl` (issue 29): examples/trl_oar.py, TRL's GRPOTrainer with OAR-G (`OARGRPOTrainer`), on the
random-init policy under `accelerate launch` with FSDP on one GPU (fsdp.yaml, one process): two steps
of 2 prompts x 8 completions, attribution on the shards with padded calls; then under DeepSpeed ZeRO-3
(deepspeed_zero3.yaml, when deepspeed is installed: never run on a CPU, accelerate needs a GPU for it)
and, with vLLM installed, under FSDP with TRL's vLLM colocate generation. --tiny: FSDP on two CPU ranks
(cpu-fsdp-2proc-trl.yaml).

Part `twostep` (issue 15): one RL step (sample, verify, attribute oar_g, reshape, update), then the
next on the checkpoint that update wrote, in this process as `oarctl run` chains them: after each
sample the engines rest (`rest_generation_engines`: asleep on a GPU), and the second sample must
find its engine kept and the new weights loaded in place (`engine: reloaded`, canary passed), else
the part fails. Each row is one part's seconds: sample (its engine load and canary in the notes),
resting the engines, verify, attribute, reshape, update (writing and hashing the checkpoint, with
its canary.json, in the notes). Without vLLM (the device image may lack it: sampling falls back to
transformers) the part says so and skips the engine-reuse check.

The model is randomly initialised with Qwen2.5-1.5B's configuration (hidden 1536, 28 layers,
12 heads, 2 key/value heads, intermediate 8960, vocab 151,936, tied embeddings) and saved in fp32;
the tokenizer is the toy character tokenizer (ids < 104), so the model's vocabulary is padded: a
random model samples mostly ids the tokenizer cannot name, which decode to nothing. Rewards are
therefore ~0 and the update moves little; what is measured is the machinery's cost, not learning.
Stages run in this process through `oarctl.pipeline.run_stage`, the function the `oarctl sample`,
`verify`, ... commands call, so each stage's peak GPU memory can be read (torch.cuda
max_memory_allocated; vLLM's key/value cache is allocated through torch and counts).

This file is the command; each part lives in bench/gpu_parts/ (its __init__.py lists them), the printed
table in bench/gpu_parts/rows.py.
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

from bench.gpu_parts.common import sampling_backend  # noqa: E402  (the parts import torch only when run)
from bench.gpu_parts.long import LONG_BUDGET, LONG_CHUNK, run_long  # noqa: E402
from bench.gpu_parts.rows import print_rows  # noqa: E402
from bench.gpu_parts.step import run_step  # noqa: E402
from bench.gpu_parts.trl import run_trl  # noqa: E402
from bench.gpu_parts.twostep import run_two_steps  # noqa: E402

QWEN25_15B = dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                  intermediate_size=8960, vocab_size=151_936, max_position_embeddings=32_768, rope_theta=1e6)
TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
            intermediate_size=128, vocab_size=1000, max_position_embeddings=512, rope_theta=1e4)


PARTS = ("step", "long", "twostep", "trl")
PART_RUNS = {"step": run_step, "long": run_long, "twostep": run_two_steps, "trl": run_trl}  # each returns its rows


def _arguments(argv: list[str] | None = None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="toy size on CPU with the transformers backend")
    parser.add_argument("--workdir", default="runs/gpu_check", help="model, artifacts and the new policy go here")
    parser.add_argument("--prompts", type=int, default=16, help="sample.prompts_per_step")
    parser.add_argument("--group", type=int, default=8, help="sample.group_size")
    parser.add_argument("--tokens", type=int, default=256, help="sample.max_new_tokens")
    parser.add_argument("--parts", nargs="+", default=list(PARTS), choices=PARTS,
                        help="step: one sampled RL step; long: long-response attribution and update; "
                             "twostep: two RL steps in a row, the vLLM engine kept between them; "
                             "trl: OARGRPOTrainer (examples/trl_oar.py) under FSDP, two steps")
    parser.add_argument("--backend", default="auto", choices=["auto", "vllm", "transformers"],
                        help="sampling backend (auto: vLLM when installed)")
    parser.add_argument("--long-tokens", type=int, default=2048, help="part long: response tokens")
    parser.add_argument("--exact-rows", type=int, default=2, help="part long: responses exact oar_p scores")
    parser.add_argument("--budget", type=int, default=LONG_BUDGET, help="part long: attribute.max_batch_tokens")
    parser.add_argument("--chunk", type=int, default=LONG_CHUNK, help="attribute.chunk_size (OAR-P)")
    return parser.parse_args(argv)


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
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):  # random init of 1.5B is slow on CPU
        model = Qwen2ForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    return folder


def _run_parts(args, work: Path, policy: Path) -> tuple[float, list[str]]:
    """Each part's rows as soon as it ends; a part that fails is reported and the next one still runs."""
    import traceback

    total, failed = 0.0, []
    print(f"{'stage':<40} {'seconds':>8} {'peak GiB':>9}  notes", flush=True)
    for part in args.parts:  # in the order given
        try:
            rows = PART_RUNS[part](args, work, policy)
        except Exception:  # noqa: BLE001 - a GPU check reports every failure and goes on
            traceback.print_exc()
            failed.append(part)
            continue
        print_rows(rows)
        if any(metrics.get("ok") is False for *_, metrics in rows):
            failed.append(part)
        total += sum(seconds for _, seconds, _, _ in rows if seconds == seconds)
    return total, failed


def main() -> None:
    args = _arguments()
    if not args.tiny:
        import torch

        if not torch.cuda.is_available():
            sys.exit("error: bench/gpu_check.py needs a CUDA GPU; use --tiny for the CPU version")
        if args.backend == "vllm":
            from oarctl.policy.backends import vllm_installed

            if not vllm_installed():
                sys.exit("error: bench/gpu_check.py --backend vllm needs vllm (pip install -e '.[vllm]')")
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    name, shape = ("tiny_policy", TINY) if args.tiny else ("qwen25_15b_random", QWEN25_15B)
    policy = _build_policy(work / name, shape)
    print(f"policy {policy} ready in {time.perf_counter() - started:.1f} s; sampling backend: {sampling_backend(args)}",
          flush=True)
    total, failed = _run_parts(args, work, policy)
    print(f"total {total:.1f} s; step: {args.prompts} prompts x {args.group} samples x <= {args.tokens} tokens; "
          f"long: {2 * args.group} responses x {args.long_tokens} tokens", flush=True)
    if failed:
        sys.exit(f"error: part(s) failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
