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

Part 3 (`--parts methods`): every attribution method on one response of R = 256, 1,024 and 3,072
reasoning tokens, on a random-init Qwen2 of Qwen2.5-7B's proportions scaled to CPU size with the
151,936-token vocabulary: time, peak memory, and for the cheap methods the recall of exact OAR-P's
top-20% tokens and the Spearman correlation with it. Above `--exact-up-to`, exact OAR-P is timed on
a few evenly spaced chunks and scaled (its scores are not computed, so no recall there).
Part 4 (`--parts precision`): bf16 against fp32 scores of the same weights.

Part 2: the toy policy samples a batch (the sample and verify stages of the demo config), then the
attribute stage runs with each method and the update stage runs once, on that same batch.
"""
from __future__ import annotations

import argparse
import multiprocessing
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from oarctl.attribution import oar

QWEN25_VOCAB = 151936
DEMO_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "arithmetic.yaml"


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


# ---- part 3: every method at real lengths on a model of real proportions --------------------------

def scaled_qwen2(hidden: int, layers: int, dtype=torch.float32):
    """A random-init Qwen2 with Qwen2.5-7B's proportions (head dim 128 -> 64 here, 7 query heads per
    key/value head, intermediate / hidden = 18944 / 3584, untied) and Qwen2.5's vocabulary."""
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(0)
    heads = max(1, hidden // 64)
    config = Qwen2Config(vocab_size=QWEN25_VOCAB, hidden_size=hidden, intermediate_size=round(hidden * 18944 / 3584),
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=max(1, heads // 7),
                         max_position_embeddings=4096, tie_word_embeddings=False, pad_token_id=QWEN25_VOCAB - 1)
    return Qwen2ForCausalLM(config).to(dtype).eval()


def ranks(values: np.ndarray) -> np.ndarray:
    return np.argsort(np.argsort(values, kind="stable"), kind="stable").astype(float)


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.corrcoef(ranks(a), ranks(b))[0, 1])


def top_recall(exact: np.ndarray, cheap: np.ndarray, share: float = 0.2) -> float:
    """Share of exact OAR-P's top-`share` tokens that are also among the cheap method's top-`share`."""
    count = max(1, round(share * exact.size))
    return len(set(np.argsort(-exact)[:count]) & set(np.argsort(-cheap)[:count])) / count


def _methods(model, ids, reasoning, answer, config, seed: int = 0) -> dict:
    """name -> function returning (R,) scores: the registry's methods as the attribute stage runs them."""
    from oarctl.attribution import oar_p_cheap

    item, pad = (ids, reasoning, answer), model.config.pad_token_id

    def oar_g(checkpointing):
        return lambda: oar.oar_g_batch(model, [item], config.oar_g_mode, config.noise_std, [seed], 1,
                                       config.max_batch_tokens, checkpointing)[0].numpy()

    def span(spread_by):
        return lambda: oar_p_cheap.span_scores(model, item, torch.from_numpy(oar_g(True)()) if spread_by == "oar_g" else None,
                                               replace(config, span_spread=spread_by), pad).numpy()

    return {"oar_g": oar_g(False), "oar_g checkpointed": oar_g(True),
            "oar_p_span even": span("even"), "oar_p_span oar_g": span("oar_g"),
            "oar_p_screened": lambda: oar_p_cheap.screened_scores(model, item, torch.from_numpy(oar_g(True)()),
                                                                  config, pad, seed + 1)[0].numpy()}


def _exact(model, ids, reasoning, answer, config, sampled: int | None):
    """Exact OAR-P: (scores or None, seconds, peak MiB); with `sampled`, only that many evenly spaced
    chunks are timed and the time is scaled by chunks (each costs about its suffix length)."""
    if sampled is None:
        return measured(lambda: oar.oar_p(model, ids, reasoning, answer, config.oar_p_mode, None, config.chunk_size,
                                          config.max_batch_tokens).numpy())
    starts = np.linspace(reasoning[0], reasoning[1] - config.chunk_size, sampled).round().astype(int)
    spans = [(int(t) + i, int(t) + i + 1) for t in starts for i in range(config.chunk_size)]
    _, seconds, peak = measured(lambda: oar.perturbation_scores(model, ids, reasoning, answer, spans, config.oar_p_mode,
                                                                None, config.chunk_size, config.max_batch_tokens).numpy())
    return None, seconds * (reasoning[1] - reasoning[0]) / len(spans), peak


def method_table(args) -> None:
    from oarctl.config import AttributeConfig

    model = scaled_qwen2(args.scale_hidden, args.scale_layers)
    config = AttributeConfig(chunk_size=args.chunk, max_batch_tokens=args.budget)
    parameters = sum(p.numel() for p in model.parameters()) / 1e6
    print(f"\nEvery method, random-init Qwen2 of Qwen2.5-7B's proportions: hidden {args.scale_hidden}, "
          f"{args.scale_layers} layers, {model.config.num_attention_heads} heads / {model.config.num_key_value_heads} kv, "
          f"intermediate {model.config.intermediate_size}, vocabulary {QWEN25_VOCAB} ({parameters:.0f}M parameters); "
          f"prompt {args.prompt}, OAR-P chunk {args.chunk}, max_batch_tokens {args.budget}, span {config.span_tokens} "
          f"tokens, screen {config.screen_fraction} + audit {config.audit_fraction}, at most {config.max_perturbations} "
          f"perturbations; measured, one response per row")
    print(f"{'R':>5} {'method':<20} {'seconds':>8} {'/ exact':>8} {'peak MiB':>9} {'top-20% recall':>15} {'Spearman':>9}")
    for length in args.scale_lengths:
        ids, reasoning, answer = sequence(model, args.prompt, length, seed=length)
        sampled = args.exact_chunks if length > args.exact_up_to else None
        exact, exact_seconds, peak = _exact(model, ids, reasoning, answer, config, sampled)
        note = f" (timed on {sampled} chunks, scaled)" if sampled else ""
        print(f"{length:>5} {'oar_p (exact)':<20} {exact_seconds:>8.2f} {1:>8.2f} {_mib(peak):>9} {'':>15} {'':>9}{note}")
        for name, function in _methods(model, ids, reasoning, answer, config).items():
            scores, seconds, peak = measured(function)
            quality = (f"{top_recall(exact, scores):>15.2f} {spearman(exact, scores):>9.2f}" if exact is not None
                       else f"{'n/a':>15} {'n/a':>9}")
            print(f"{length:>5} {name:<20} {seconds:>8.2f} {seconds / exact_seconds:>8.3f} {_mib(peak):>9} {quality}",
                  flush=True)


def precision_table(args) -> None:
    """bf16 against fp32 scores of the same model (Spearman), for OAR-G and exact OAR-P."""
    from oarctl.config import AttributeConfig

    config = AttributeConfig(chunk_size=args.chunk)
    fp32 = scaled_qwen2(args.scale_hidden, args.scale_layers)
    bf16 = scaled_qwen2(args.scale_hidden, args.scale_layers, torch.bfloat16)
    length = args.scale_lengths[0]
    ids, reasoning, answer = sequence(fp32, args.prompt, length, seed=length)
    print(f"\nbfloat16 against float32, same weights, R = {length} (outcome math in float64 in both); measured")
    print(f"{'method':<12} {'Spearman':>9} {'top-20% recall':>15}")
    for name, run in (("oar_g", lambda m: oar.oar_g(m, ids, reasoning, answer, config.oar_g_mode, config.noise_std)),
                      ("oar_g s=0.1", lambda m: oar.oar_g(m, ids, reasoning, answer, config.oar_g_mode, 0.1)),
                      ("oar_p", lambda m: oar.oar_p(m, ids, reasoning, answer, config.oar_p_mode, None, config.chunk_size))):
        reference, low = run(fp32).numpy(), run(bf16).numpy()
        print(f"{name:<12} {spearman(reference, low):>9.2f} {top_recall(reference, low):>15.2f}", flush=True)


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
    parser.add_argument("--parts", nargs="+", default=["naive", "stages", "methods", "precision"])
    parser.add_argument("--scale-lengths", type=int, nargs="+", default=[256, 1024, 3072], help="part 3: lengths R")
    parser.add_argument("--scale-hidden", type=int, default=256, help="part 3: hidden size of the scaled Qwen2")
    parser.add_argument("--scale-layers", type=int, default=4, help="part 3: layers of the scaled Qwen2")
    parser.add_argument("--budget", type=int, default=16384, help="part 3: attribute.max_batch_tokens")
    parser.add_argument("--exact-up-to", type=int, default=1024, help="part 3: longer R time exact OAR-P on samples")
    parser.add_argument("--exact-chunks", type=int, default=8, help="part 3: chunks timed there")
    args = parser.parse_args()
    if args.quick:
        args.lengths, args.prompt, args.naive_positions, args.prompts = [8, 24], 8, 8, 4
        args.hidden, args.layers = 64, 1
        args.scale_lengths, args.scale_hidden, args.scale_layers, args.exact_up_to = [24, 48], 64, 1, 24
        args.exact_chunks = 2
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s), float32 on CPU")
    if "naive" in args.parts:
        compare_oar_p("embedded toy policy", toy_model(), args)
        compare_oar_p("random-init Qwen2", random_qwen2(args.hidden, args.layers), args)
    if "stages" in args.parts:
        stage_costs(args)
    if "methods" in args.parts:
        method_table(args)
    if "precision" in args.parts:
        precision_table(args)


if __name__ == "__main__":
    main()
