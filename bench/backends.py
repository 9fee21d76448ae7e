"""Time the two generation backends side by side on the same policy and prompts.

    python bench/backends.py                          # toy base policy, 256 prompts x 48 tokens, CPU
    python bench/backends.py --policy DIR --prompts 1024 --tokens 256 --device cuda
    python bench/backends.py --data-parallel 2        # also N vLLM engines (vllm.data_parallel_size)

Prints start-up (engine build / model load), a warm-up call, then the best of `--repeats` timed
calls of each backend, in tokens per second. Sampling at temperature 1, as the sample stage does;
max_new_tokens is a cap, so tokens/s counts the tokens actually generated.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _arguments():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", default="toy", help="policy folder (default: the embedded toy policy)")
    parser.add_argument("--prompts", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch-size", type=int, default=128, help="transformers batch (sample.batch_size)")
    parser.add_argument("--dtype", default="float32", help="vllm.dtype")
    parser.add_argument("--data-parallel", type=int, default=1, help="also time N vLLM engines (N > 1)")
    return parser.parse_args()


def _prompts(tokenizer, count: int) -> list[list[int]]:
    from oarctl.templates import encode

    return [encode(tokenizer, f"Compute {10 + i % 80}+{1 + i % 9}.") for i in range(count)]


def _best(call, repeats: int) -> tuple[float, int]:
    call()  # warm-up: first calls allocate caches and pick kernels
    best, tokens = float("inf"), 0
    for _ in range(repeats):
        started = time.perf_counter()
        generations = call()
        best = min(best, time.perf_counter() - started)
        tokens = sum(len(g.token_ids) for g in generations)
    return best, tokens


def _replicated(path, settings: dict, prompts, sampling: dict, args) -> tuple:
    """N engines in worker processes; start-up = the first call (workers start, build, canary-check)."""
    from oarctl.policy import vllm_replicas
    from oarctl.runner import Policy

    policy = Policy(path, args.device, "vllm", settings)
    started = time.perf_counter()
    vllm_replicas.generate(policy, prompts[:1], **sampling)
    load = time.perf_counter() - started
    try:
        seconds, tokens = _best(lambda: vllm_replicas.generate(policy, prompts, **sampling), args.repeats)
    finally:
        vllm_replicas.stop()
    return f"vllm x{args.data_parallel}", load, seconds, tokens


def main() -> None:
    args = _arguments()
    from oarctl.checkpoints import load_policy, policy_identity
    from oarctl.config import load_config, section_dict
    from oarctl.policy.paths import resolve_policy_path
    from oarctl.policy import transformers_backend, vllm_backend

    path = resolve_policy_path(args.policy)
    sampling = dict(temperature=1.0, top_p=1.0, max_new_tokens=args.tokens, seed=0)
    rows = []
    started = time.perf_counter()
    model, tokenizer = load_policy(path, args.device)
    load = time.perf_counter() - started
    prompts = _prompts(tokenizer, args.prompts)
    seconds, tokens = _best(lambda: transformers_backend.generate(model, tokenizer, prompts, batch_size=args.batch_size,
                                                                  **sampling), args.repeats)
    rows.append(("transformers", load, seconds, tokens))
    settings = section_dict(load_config(None, [f"vllm.dtype={args.dtype}",
                                               f"vllm.enforce_eager={str(args.device == 'cpu').lower()}"]), "vllm")
    started = time.perf_counter()
    llm, _ = vllm_backend.engine(path, settings, policy_identity(path))
    load = time.perf_counter() - started
    seconds, tokens = _best(lambda: vllm_backend.generate_with(llm, prompts, **sampling), args.repeats)
    rows.append(("vllm", load, seconds, tokens))
    if args.data_parallel > 1:
        rows.append(_replicated(path, {**settings, "data_parallel_size": args.data_parallel}, prompts, sampling, args))
    print(f"{args.prompts} prompts x <= {args.tokens} new tokens, policy {path}, device {args.device}")
    print(f"{'backend':<13} {'start-up s':>10} {'generate s':>10} {'tokens':>7} {'tokens/s':>9}")
    for name, load, seconds, tokens in rows:
        print(f"{name:<13} {load:>10.2f} {seconds:>10.2f} {tokens:>7} {tokens / seconds:>9.0f}")
    print(f"vllm / transformers generate time: {rows[1][2] / rows[0][2]:.2f}x")
    if args.data_parallel > 1:
        print(f"vllm x{args.data_parallel} / vllm generate time: {rows[2][2] / rows[1][2]:.2f}x")


if __name__ == "__main__":
    main()
