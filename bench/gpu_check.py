"""One full RL step at Qwen2.5-1.5B's shape on a GPU, no download: time, tokens/s, peak memory per stage.

    python bench/gpu_check.py                 # CUDA: sample (vLLM if installed, else transformers),
                                              # verify, attribute, reshape, update on a random-init
                                              # 1.5B-shaped Qwen2, then long-response attribution
    python bench/gpu_check.py --tiny          # the same pipeline on CPU at toy size, transformers backend
    python bench/gpu_check.py --parts long    # only the long-response attribution (and its update)
    python bench/gpu_check.py --parts twostep # two RL steps in a row: is the vLLM engine kept?

Part `long` (issue 14): synthetic rollouts of `--long-tokens` (2,048) toy tokens each, two groups of
`--group` with mixed rewards, go through the real stages: the attribute stage in bfloat16 with
oar_g (gradient checkpointing on), oar_p_span, oar_p_screened, and exact oar_p on `--exact-rows`
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
LONG_BUDGET, LONG_CHUNK = 65_536, 64  # part long's attribute.max_batch_tokens and chunk_size defaults
TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
            intermediate_size=128, vocab_size=1000, max_position_embeddings=512, rope_theta=1e4)


PARTS = ("step", "long", "twostep", "trl")


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


def _backend(args) -> str:
    from oarctl.policy.backends import vllm_installed

    if args.tiny:
        return "transformers"
    return ("vllm" if vllm_installed() else "transformers") if args.backend == "auto" else args.backend


def _overrides(args, policy: Path) -> list[str]:
    device, backend = ("cpu" if args.tiny else "cuda"), _backend(args)
    return [f"policy.path={policy}", f"policy.device={device}", f"policy.backend={backend}", "run.progress=false",
            f"sample.prompts_per_step={args.prompts}", f"sample.group_size={args.group}",
            f"sample.max_new_tokens={args.tokens}", f"update.sum_norm_length={args.tokens}",
            "update.mini_batch_size=64", "update.micro_batch_size=8", "attribute.batch_size=8",
            "verify.method=boxed", "vllm.dtype=bfloat16", f"vllm.max_model_len={args.tokens + 128}",
            f"attribute.dtype={'float32' if args.tiny else 'bfloat16'}", f"attribute.chunk_size={args.chunk}"]


def _peak_reset() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()


def _peak_gib() -> float:
    import torch

    return torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else float("nan")


def _run(name, config, inputs, output, policy, rows, step=0):
    from oarctl.pipeline import run_stage

    _peak_reset()
    started = time.perf_counter()
    manifest, _ = run_stage(name, config, inputs, output, step=step, policy_path=policy, force=True,
                            log=lambda *a: None)
    rows.append((output.stem if name == "attribute" else name, time.perf_counter() - started,
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
    for method in ("oar_g", "oar_p_span"):  # exact oar_p: part long, on a few responses
        config.attribute.method = method
        attributions = _run("attribute", config, {"verified": verified}, work / f"attribute_{method}.parquet",
                            policy, rows)
    advantages = _run("reshape", config, {"attributions": attributions}, work / "advantages.parquet", None, rows)
    _run("update", config, {"advantages": advantages}, work / "policy_next", policy, rows)
    _launched_fsdp_update(args, config, advantages, work, policy, rows)
    _persistent_fsdp_updates(args, config, advantages, work, policy, rows)
    return rows


def _two_steps(args, work: Path, policy: Path) -> list:
    """Part twostep: two RL steps in a row, the second on the first's checkpoint; a verdict row last."""
    from oarctl.artifacts import write_parquet
    from oarctl.config import load_config
    from oarctl.data import toy_prompts

    config = load_config(None, _overrides(args, policy) + ["attribute.method=oar_g"])
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
    ok, verdict = engine_reuse_verdict(_backend(args), second_sample)
    rows.append(("twostep engine", float("nan"), float("nan"), {"verdict": verdict, "ok": ok}))
    return rows


def _one_step(config, prompts: Path, folder: Path, policy: Path, step: int, rows: list) -> Path:
    """The five stages of `step` into `folder`, the engines rested after sampling as `oarctl run` does;
    returns the new checkpoint."""
    from oarctl.launch import rest_generation_engines

    rollouts = _run("sample", config, {"prompts": prompts}, folder / "rollouts.parquet", policy, rows, step)
    started = time.perf_counter()
    rest_generation_engines()
    rows.append(("rest_engines", time.perf_counter() - started, _peak_gib(), {}))
    verified = _run("verify", config, {"rollouts": rollouts}, folder / "verified.parquet", None, rows, step)
    attributions = _run("attribute", config, {"verified": verified}, folder / "attribute_oar_g.parquet", policy,
                        rows, step)
    advantages = _run("reshape", config, {"attributions": attributions}, folder / "advantages.parquet", None, rows,
                      step)
    _run("update", config, {"advantages": advantages}, folder / "policy", policy, rows, step)
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


def _long_rollouts(args, path: Path, tokenizer) -> Path:
    """Two groups of `--group` responses of `--long-tokens` toy tokens each (reasoning of random sums,
    then `\\boxed{N}`), half of each group correct, so every group has mixed rewards."""
    import random

    from oarctl.artifacts import make_table, write_parquet

    generator, columns = random.Random(0), {name: [] for name in (
        "prompt_id", "problem", "answer", "sample_index", "prompt_token_ids", "response_token_ids",
        "response_logprobs", "response_text", "finish_reason", "temperature")}
    for row in range(2 * args.group):
        problem = f"Compute {row // args.group + 2}+3."
        reasoning = ""
        while len(reasoning) < args.long_tokens - 16:
            a, b = generator.randrange(100), generator.randrange(100)
            reasoning += f"{a}+{b}={a + b}. "
        text = reasoning[:args.long_tokens - 16] + f" \\boxed{{{5 + row // args.group + row % 2}}}"
        ids = tokenizer.encode(text, add_special_tokens=False)
        for name, value in (("prompt_id", f"p{row // args.group}"), ("problem", problem),
                            ("answer", str(5 + row // args.group)), ("sample_index", row % args.group),
                            ("prompt_token_ids", tokenizer.encode(problem, add_special_tokens=False)),
                            ("response_token_ids", ids), ("response_logprobs", [-1.0] * len(ids)),
                            ("response_text", text), ("finish_reason", "stop"), ("temperature", 1.0)):
            columns[name].append(value)
    write_parquet(make_table(columns, "rollouts"), path)
    return path


LONG_METHODS = {  # method: extra overrides
    "oar_g": ["attribute.gradient_checkpointing=true"],
    "oar_p_span": [],
    "oar_p_screened": [],
}


def long_attribute_knobs(budget: int, chunk: int) -> list[str]:
    """The attribute settings of part long (bench/scale.py --measured predicts with the same)."""
    return ["attribute.dtype=bfloat16", f"attribute.max_batch_tokens={budget}", f"attribute.chunk_size={chunk}",
            "attribute.batch_size=64"]


def _long(args, work: Path, policy: Path) -> list:
    """Part long: bf16 attribution of long responses by every method, then reshape and the update."""
    import pyarrow.parquet as pq
    from transformers import AutoTokenizer

    from oarctl.artifacts import write_parquet
    from oarctl.config import load_config

    overrides = _overrides(args, policy) + long_attribute_knobs(args.budget, args.chunk) + [
        f"update.micro_batch_tokens={4 * (args.long_tokens + 32)}",
        f"update.sum_norm_length={args.long_tokens}", "update.micro_batch_size=64", "update.gradient_checkpointing=true"]
    rows: list = []
    rollouts = _long_rollouts(args, work / "long_rollouts.parquet", AutoTokenizer.from_pretrained(policy))
    config = load_config(None, overrides)
    verified = _run("verify", config, {"rollouts": rollouts}, work / "long_verified.parquet", None, rows)
    responses = pq.read_table(verified).num_rows
    for method, extra in LONG_METHODS.items():
        config = load_config(None, overrides + [f"attribute.method={method}", *extra])
        attributions = _run("attribute", config, {"verified": verified}, work / f"long_attribute_{method}.parquet",
                            policy, rows)
        rows[-1][3]["responses"] = responses
    few = work / "long_verified_few.parquet"
    write_parquet(pq.read_table(verified).take(list(range(args.exact_rows))), few)
    config = load_config(None, overrides + ["attribute.method=oar_p"])
    exact = _run("attribute", config, {"verified": few}, work / "long_attribute_oar_p.parquet", policy, rows)
    rows[-1][3]["responses"] = args.exact_rows
    _agreement(exact, [work / f"long_attribute_{method}.parquet" for method in LONG_METHODS], rows)
    advantages = _run("reshape", config, {"attributions": attributions}, work / "long_advantages.parquet", None, rows)
    _run("update", config, {"advantages": advantages}, work / "long_policy_next", policy, rows)
    rows[-1][3]["responses"] = responses
    return [(name if name.startswith("long") else f"long_{name}", *rest) for name, *rest in rows]


def _agreement(exact: Path, cheap: list[Path], rows: list) -> None:
    """Each cheap method against exact OAR-P on the rows exact scored: recall of its top 20%, Spearman."""
    import numpy as np
    import pyarrow.parquet as pq

    from bench.attribution import spearman, top_recall

    def reasoning_scores(path: Path, count: int) -> list:
        scores = pq.read_table(path).column("token_scores").to_pylist()[:count]
        return [np.array([v for v in row if v == v]) for row in scores]  # NaN outside the reasoning

    truth = reasoning_scores(exact, pq.read_table(exact).num_rows)
    for path in cheap:
        got = reasoning_scores(path, len(truth))
        recall = float(np.mean([top_recall(e, g) for e, g in zip(truth, got)]))
        rho = float(np.mean([spearman(e, g) for e, g in zip(truth, got)]))
        rows.append((f"{path.stem} vs oar_p", float("nan"), float("nan"),
                     {"agreement": f"top-20% recall {recall:.2f}, Spearman {rho:.2f} on {len(truth)} responses"}))


def _launched_fsdp_update(args, config, advantages: Path, work: Path, policy: Path, rows) -> None:
    """The update again, under `accelerate launch` with FSDP; a row with the weight difference, and the
    seconds the ranks took to write the weight files in turn and their AdamW shards."""
    import json
    import subprocess

    from oarctl.launch import update_command

    file, ranks = _fsdp_launcher(args, work)
    _write_config(config, work / "config.yaml")
    command = update_command(str(file), advantages, work / "policy_fsdp", policy, 0, work / "config.yaml", True)
    started = time.perf_counter()
    launched = subprocess.run(command, capture_output=True, text=True)
    if launched.returncode:
        raise RuntimeError(f"the launched FSDP update failed ({launched.returncode}):\n{launched.stderr[-3000:]}")
    seconds = time.perf_counter() - started
    difference = _weight_difference(work / "policy_next", work / "policy_fsdp")  # files the ranks wrote in turn
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

    from oarctl.launch import stop_update_worker, update_worker

    file, _ = _fsdp_launcher(args, work)
    update = dataclasses.replace(config.update, accelerate_config=str(file), persistent=True)
    config = dataclasses.replace(config, update=update)  # the worker reads work/config.yaml, written below
    _write_config(config, work / "config.yaml")
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
                note["weight_difference"] = _weight_difference(work / "policy_fsdp", output)
            rows.append((f"update_persistent_request{index + 1}", time.perf_counter() - started, float("nan"), note))
    finally:
        stop_update_worker()


def _fsdp_launcher(args, work: Path) -> tuple[Path, int]:
    """(accelerate config file, ranks): cpu-fsdp-2proc.yaml with --tiny; else fsdp.yaml with one process
    per GPU this machine has (it names 8), written into `work`."""
    import torch
    import yaml

    accelerate = Path(__file__).resolve().parents[1] / "configs" / "accelerate"
    if args.tiny:
        return accelerate / "cpu-fsdp-2proc.yaml", 2
    ranks = torch.cuda.device_count()
    file = work / "fsdp-this-machine.yaml"
    file.write_text(yaml.safe_dump({**yaml.safe_load((accelerate / "fsdp.yaml").read_text()), "num_processes": ranks}))
    return file, ranks


def _trl(args, work: Path, policy: Path) -> list:
    """examples/trl_oar.py (OARGRPOTrainer, oar_g, 2 prompts x 8 completions, two steps) on the policy under
    `accelerate launch`: FSDP on one GPU, ZeRO-3 and FSDP + vLLM when installed (--tiny: FSDP on two CPU
    ranks). A row each: seconds, the example's own line (steps, processes, peak GPU memory of rank 0)."""
    import subprocess

    root = Path(__file__).resolve().parents[1]
    accelerate = root / "configs" / "accelerate"
    runs = [("fsdp", accelerate / "cpu-fsdp-2proc-trl.yaml", 2, [])]
    if not args.tiny:  # one GPU: fsdp.yaml; ZeRO-3 (through accelerate it needs a GPU) and vLLM when installed
        runs = [(kind, _one_process(accelerate / f"{kind}.yaml", work), 1, []) for kind in ("fsdp", "deepspeed_zero3")
                if kind == "fsdp" or _installed("deepspeed")]
        runs += [("fsdp_vllm", runs[0][1], 1, ["--vllm"])] if _backend(args) == "vllm" else []
    rows = []
    for kind, file, ranks, extra in runs:
        command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(file),
                   str(root / "examples" / "trl_oar.py"), "--model", str(policy), "--steps", "2",
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


def _weight_difference(one: Path, other: Path) -> float:
    """The largest absolute difference between two checkpoints' weights, however many files each has."""
    from oarctl.checkpoints import read_weights

    first, second = read_weights(one), read_weights(other)
    return max(float((first[k].float() - second[k].float()).abs().max()) for k in first)


def _write_config(config, path: Path) -> None:
    import yaml

    from oarctl.config import to_dict

    path.write_text(yaml.safe_dump(to_dict(config), sort_keys=False))


def _note(name: str, seconds: float, metrics: dict) -> str:
    if name.endswith("sample"):
        tokens = metrics["responses"] * metrics["response_length_mean"]
        return f"{tokens:.0f} tokens, {tokens / seconds:.0f} tokens/s" + _engine_note(metrics)
    if "verdict" in metrics:
        return ("" if metrics["ok"] else "FAILED: ") + metrics["verdict"]
    if name.endswith("update") and "checkpoint_write_seconds" in metrics:
        return (f"checkpoint written in {metrics['checkpoint_write_seconds']:.1f} s, hashed in "
                f"{metrics['checkpoint_hash_seconds']:.1f} s ({metrics['checkpoint_bytes_written'] / 2**30:.2f} GiB)")
    if name.startswith("update_persistent"):
        return ", ".join(f"{key} {value:.3g}" if isinstance(value, float) else f"{key} {value}"
                         for key, value in metrics.items())
    if name.startswith("update_fsdp"):
        io = ", ".join(f"{key} {metrics[key]}" for key in metrics if key.endswith("_seconds"))
        return (f"accelerate launch; weights differ from the in-process update by {metrics['weight_difference']:.2e}; "
                f"{metrics.get('weight_files', '?')} weight files written by the ranks in turn; {io}")
    if "agreement" in metrics:
        return metrics["agreement"]
    if "trl" in metrics:
        return metrics["trl"]
    if "responses" in metrics:
        return f"{metrics['responses']} responses, {seconds / metrics['responses']:.2f} s each"
    return ""


def _engine_note(metrics: dict) -> str:
    """The vLLM sample's engine: how it was obtained, its load and canary seconds ('' without vLLM)."""
    if "engine" not in metrics:
        return ""
    note = (f"; engine {metrics['engine']} ({metrics['engine_load_seconds']:.1f} s), "
            f"canary {metrics['canary_seconds']:.2f} s")
    return note + (f", {metrics['canary_failures']} canary failure(s)" if metrics["canary_failures"] else "")


def _print_rows(rows) -> None:
    for name, seconds, peak, metrics in rows:
        print(f"{name:<40} {seconds:>8.1f} {peak:>9.2f}  {_note(name, seconds, metrics)}", flush=True)


def _run_parts(args, work: Path, policy: Path) -> tuple[float, list[str]]:
    """Each part's rows as soon as it ends; a part that fails is reported and the next one still runs."""
    import traceback

    total, failed = 0.0, []
    print(f"{'stage':<40} {'seconds':>8} {'peak GiB':>9}  notes", flush=True)
    for part in args.parts:  # in the order given
        try:
            rows = {"step": _step, "long": _long, "twostep": _two_steps, "trl": _trl}[part](args, work, policy)
        except Exception:  # noqa: BLE001 - a GPU check reports every failure and goes on
            traceback.print_exc()
            failed.append(part)
            continue
        _print_rows(rows)
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
    print(f"policy {policy} ready in {time.perf_counter() - started:.1f} s; sampling backend: {_backend(args)}",
          flush=True)
    total, failed = _run_parts(args, work, policy)
    print(f"total {total:.1f} s; step: {args.prompts} prompts x {args.group} samples x <= {args.tokens} tokens; "
          f"long: {2 * args.group} responses x {args.long_tokens} tokens", flush=True)
    if failed:
        sys.exit(f"error: part(s) failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
