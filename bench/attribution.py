"""Benchmark OAR attribution: exact OAR-P against the naive recomputation, and the attribute stage
against the update stage on the same batch.

    python bench/attribution.py           # the full table (`make bench`)
    python bench/attribution.py --quick   # small lengths and batch, a smoke run of a few seconds

Part 1, for each model (the embedded toy policy, vocabulary 104; a random-init Qwen2 with Qwen2.5's
151,936-token vocabulary) and each reasoning length R, one random sequence prompt + R reasoning
tokens + `\\boxed{` + 3 answer tokens, outcome `last`:
- naive: every perturbed sequence recomputed in full with all its logits, as the reference code
  does (one copy at a time, so that it fits in memory). Each copy costs the same (the whole
  sequence), so it is timed on `--naive-positions` evenly spaced positions and the time is scaled
  to R; the scores are compared at those positions.
- ours: `oarctl.attribution.oar_p` over all R positions with `--chunk` perturbations per pass.
Every measurement runs in a forked child, so its peak memory (resident-set high-water mark above
the child's start) is its own and not a leftover of an earlier one.

Part 2: the toy policy samples a batch (the sample and verify stages of the demo config), then the
attribute stage runs with each method and the update stage runs once, on that same batch.
"""
from __future__ import annotations

import argparse
import multiprocessing
import time
from pathlib import Path

import numpy as np
import torch

from oarctl.attribution import oar

QWEN25_VOCAB = 151936
DEMO_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "demo.yaml"


# ---- measurement ---------------------------------------------------------------------------------

def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def _reset_peak_memory() -> bool:
    """Reset VmHWM to the current resident set (Linux >= 4.0); False where that is not allowed."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def measured(function) -> tuple[object, float, float | None]:
    """(result, seconds, peak MiB above the start or None) of `function()` run in a forked child."""
    context = multiprocessing.get_context("fork")
    receiver, sender = context.Pipe(duplex=False)

    def child():
        can_measure = _reset_peak_memory()
        start = _status_kib("VmRSS")
        started = time.perf_counter()
        result = function()
        seconds = time.perf_counter() - started
        sender.send((result, seconds, (_status_kib("VmHWM") - start) / 1024 if can_measure else None))

    process = context.Process(target=child)
    process.start()
    value = receiver.recv()
    process.join()
    return value


# ---- part 1: OAR-P against the naive recomputation ----------------------------------------------

@torch.no_grad()
def naive_oar_p(model, ids: torch.Tensor, positions: list[int], answer_start: int) -> np.ndarray:
    """KL(P || P^(t)) at the position predicting the first answer token, full recompute per t."""
    clean = torch.log_softmax(model(input_ids=ids[None]).logits[0, answer_start - 1].float(), dim=-1)
    scores = []
    for t in positions:
        perturbed = ids.clone()
        perturbed[t] = model.config.pad_token_id
        changed = torch.log_softmax(model(input_ids=perturbed[None]).logits[0, answer_start - 1].float(), dim=-1)
        scores.append(float((clean.exp() * (clean - changed)).sum()))
    return np.array(scores)


def toy_model():
    from oarctl.checkpoints import load_policy
    from oarctl.toy import base_policy_dir
    return load_policy(base_policy_dir())[0].eval()


def random_qwen2(hidden: int, layers: int):
    """A random-init Qwen2 of Qwen2.5's vocabulary, built from a config (nothing is downloaded)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=QWEN25_VOCAB, hidden_size=hidden, intermediate_size=3 * hidden,
                         num_hidden_layers=layers, num_attention_heads=hidden // 64, num_key_value_heads=max(1, hidden // 128),
                         max_position_embeddings=4096, tie_word_embeddings=True, pad_token_id=QWEN25_VOCAB - 1)
    return Qwen2ForCausalLM(config).eval()


def sequence(model, prompt: int, reasoning: int, seed: int):
    """Random ids prompt + reasoning + one conclude token + 3 answer tokens, and the spans."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, model.config.vocab_size - 1, (prompt + reasoning + 4,), generator=generator)
    return ids, (prompt, prompt + reasoning), (prompt + reasoning + 1, prompt + reasoning + 4)


def compare_oar_p(name: str, model, args) -> None:
    parameters = sum(p.numel() for p in model.parameters()) / 1e6
    print(f"\nOAR-P, {name}: {parameters:.1f}M parameters, vocabulary {model.config.vocab_size}, prompt {args.prompt} "
          f"tokens, chunk {args.chunk}, outcome last")
    print(f"{'R':>6} {'naive s':>9} {'ours s':>8} {'speed-up':>8} {'max |diff|':>10} {'of':>5} "
          f"{'naive MiB':>9} {'ours MiB':>8} {'ours KiB/token':>14}")
    for length in args.lengths:
        ids, reasoning, answer = sequence(model, args.prompt, length, seed=length)
        count = min(length, args.naive_positions)
        positions = np.linspace(reasoning[0], reasoning[1] - 1, count).round().astype(int).tolist()
        expected, naive_seconds, naive_peak = measured(lambda: naive_oar_p(model, ids, positions, answer[0]))
        naive_seconds *= length / count
        got, seconds, peak = measured(lambda: oar.oar_p(model, ids, reasoning, answer, "last",
                                                        chunk_size=args.chunk).numpy())
        difference = np.abs(got[np.array(positions) - reasoning[0]] - expected).max()
        per_token = "n/a" if peak is None else f"{peak * 1024 / ids.numel():.0f}"
        print(f"{length:>6} {naive_seconds:>9.2f} {seconds:>8.2f} {naive_seconds / seconds:>7.1f}x "
              f"{difference:>10.1e} {count:>5} {_mib(naive_peak):>9} {_mib(peak):>8} {per_token:>14}")


def _mib(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f}"


# ---- part 2: attribute stage against update stage ------------------------------------------------

def stage_costs(args) -> None:
    from oarctl.config import load_config
    from oarctl.data import toy_prompts
    from oarctl.runner import Policy, StageContext
    from oarctl.stages import attribute, reshape, sample, update, verify
    from oarctl.toy import base_policy_dir

    config = load_config(DEMO_CONFIG, [f"sample.prompts_per_step={args.prompts}", "run.progress=false"])
    prompts = toy_prompts("train", args.prompts, config.data.toy_levels, config.run.seed)
    context = StageContext(seed=0, step=0, policy=Policy(base_policy_dir()))
    context.policy.load()
    rollouts = sample.run({"prompts": prompts}, config.sample, context).table
    verified = verify.run({"rollouts": rollouts}, config.verify, context).table
    lengths = [len(p) + len(r) for p, r in zip(verified["prompt_token_ids"].to_pylist(),
                                               verified["response_token_ids"].to_pylist())]
    attributions, timings = None, {}
    for method in args.methods:
        config.attribute.method = method
        started = time.perf_counter()
        attributions = attribute.run({"verified": verified}, config.attribute, context).table
        timings[f"attribute {method}"] = time.perf_counter() - started
    advantages = reshape.run({"attributions": attributions}, config.reshape, context).table
    started = time.perf_counter()
    update.run({"advantages": advantages}, config.update, context)
    timings["update"] = time.perf_counter() - started
    print(f"\nStages on one batch of the toy demo: {verified.num_rows} responses ({args.prompts} prompts x "
          f"{config.sample.group_size}), {np.mean(lengths):.0f} tokens per sequence on average, "
          f"OAR-G batch {config.attribute.batch_size}, OAR-P chunk {config.attribute.chunk_size}, "
          f"update micro-batch {config.update.micro_batch_size}")
    print(f"{'stage':<22} {'seconds':>8} {'/ update':>9}")
    for name, seconds in timings.items():
        print(f"{name:<22} {seconds:>8.2f} {seconds / timings['update']:>9.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small lengths, model and batch: a smoke run")
    parser.add_argument("--lengths", type=int, nargs="+", default=[64, 256, 1024], help="reasoning lengths R")
    parser.add_argument("--prompt", type=int, default=64, help="prompt tokens before the reasoning")
    parser.add_argument("--chunk", type=int, default=8, help="OAR-P perturbations per forward pass")
    parser.add_argument("--naive-positions", type=int, default=32, help="positions the naive method is timed on")
    parser.add_argument("--hidden", type=int, default=256, help="hidden size of the random Qwen2")
    parser.add_argument("--layers", type=int, default=4, help="layers of the random Qwen2")
    parser.add_argument("--prompts", type=int, default=128, help="prompts of the stage batch (x group size 8)")
    parser.add_argument("--methods", nargs="+", default=["uniform", "entropy", "oar_g", "oar_p"])
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    args = parser.parse_args()
    if args.quick:
        args.lengths, args.prompt, args.naive_positions, args.prompts = [8, 24], 8, 8, 4
        args.hidden, args.layers = 64, 1
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s), float32 on CPU")
    compare_oar_p("embedded toy policy", toy_model(), args)
    compare_oar_p("random-init Qwen2", random_qwen2(args.hidden, args.layers), args)
    stage_costs(args)


if __name__ == "__main__":
    main()
