"""Attribute seconds of oar_p_span, oar_flow_local and oar_flow as responses grow, in one run.

    python bench/flow_cost.py                         # ~3 min on 1 core
    python bench/flow_cost.py --lengths 128,512 --rows 2 --hidden 256 --layers 4

The credit gate (bench/credit_gate.py) times the methods on the chains world's own rollouts: about
125 reasoning tokens. There oar_flow_local costs about 2x oar_p_span, because it recomputes R x
horizon positions where windows of 8 recompute about R^2 / 16. This bench measures how that ratio
moves with R. Each method is called through the attribute registry, exactly as the attribute stage
calls it, with configs/chains.yaml's attribute section, on `--rows` responses of random tokens: a
64-token prompt, R reasoning tokens and `\\boxed{` plus 3 answer tokens. The model is a random-init
Qwen2 with the chains policy's shape (hidden 96, 3 layers, 4 heads, vocabulary 104) and room for
4,096 positions. Random weights do not change the time of a forward; `--hidden` / `--layers` give
a wider model. All on one torch thread.
Nothing else should run meanwhile: a benchmark times one torch job at a time.

Prints, per R, each method's seconds per response and oar_flow_local / oar_p_span (measured). It also
prints the recomputed positions of each: windows ~ sum over windows of (end - window start), and
oar_flow_local R x horizon plus OAR-G's ~3 passes over the sequence (predicted from the code's plans).
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path
from types import SimpleNamespace

import torch

ROOT = Path(__file__).resolve().parents[1]
PROMPT, ANSWER = 64, 3


def policy(hidden: int, layers: int, heads: int, vocab: int):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=heads, max_position_embeddings=4096,
                         tie_word_embeddings=True, pad_token_id=0)
    return Qwen2ForCausalLM(config).eval()


def rollouts(length: int, rows: int, vocab: int) -> list:
    from oarctl.attribution.base import Rollout

    made = []
    for row in range(rows):
        ids = torch.randint(4, vocab, (PROMPT + length + 1 + ANSWER,), generator=torch.Generator().manual_seed(row))
        reasoning, answer = (PROMPT, PROMPT + length), (PROMPT + length + 1, PROMPT + length + 1 + ANSWER)
        made.append(Rollout(SimpleNamespace(reasoning=(0, length)), ids, reasoning, answer,
                            response_length=length + 1 + ANSWER, row=row))
    return made


def seconds(method: str, batch: list, config, context) -> float:
    from oarctl.attribution import ATTRIBUTION_METHODS

    started = time.perf_counter()
    ATTRIBUTION_METHODS.get(method)(batch, None, config, context)
    return (time.perf_counter() - started) / len(batch)


def positions(method: str, length: int, config) -> int:
    """Recomputed positions per response (predicted from the code's plans): windows' suffixes, or rows x horizon
    plus OAR-G's ~3 passes (teacher, noisy forward, backward) over the response."""
    from oarctl.attribution.oar_p_cheap import windows

    end = PROMPT + length + 1 + 1  # the `last` outcome's sequence ends after the position predicting a_1
    if method == "oar_p_span":
        return sum(end - a for a, _ in windows((PROMPT, PROMPT + length), config.span_tokens, config.max_perturbations))
    if method == "oar_flow_local":
        return length * config.flow_horizon + 3 * (length + 1 + ANSWER)
    return length * (end - PROMPT) // 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", default="128,256,512,1024,2048")
    parser.add_argument("--rows", type=int, default=2, help="responses per method and length")
    parser.add_argument("--exact-up-to", type=int, default=512, help="time oar_flow only up to this R (it is ~R^2)")
    parser.add_argument("--hidden", type=int, default=96)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=104)
    args = parser.parse_args()

    from oarctl.config import load_config

    torch.set_num_threads(1)
    config = load_config(ROOT / "configs" / "chains.yaml").attribute
    model = policy(args.hidden, args.layers, args.heads, args.vocab)
    tokenizer = SimpleNamespace(pad_token_id=0)
    context = SimpleNamespace(policy=SimpleNamespace(load=lambda: (model, tokenizer)), seed=0, step=0, call_sync=None)
    seconds("oar_flow_local", rollouts(16, 1, args.vocab), config, context)  # warm-up: first calls are slower
    print(f"# attribute seconds per response, {args.rows} random responses per length, model hidden {args.hidden} x "
          f"{args.layers} layers, span_tokens {config.span_tokens}, chunk_size {config.chunk_size}, flow_horizon "
          f"{config.flow_horizon}; 1 torch thread (measured)\n")
    print("| R | oar_p_span s | oar_flow_local s | local / span (measured) | local / span positions (predicted) "
          "| oar_flow s |")
    print("|---:|---:|---:|---:|---:|---:|")
    for length in [int(x) for x in args.lengths.split(",")]:
        batch = rollouts(length, args.rows, args.vocab)
        span, local = seconds("oar_p_span", batch, config, context), seconds("oar_flow_local", batch, config, context)
        exact = f"{seconds('oar_flow', batch, config, context):.2f}" if length <= args.exact_up_to else "(not run)"
        predicted = positions("oar_flow_local", length, config) / positions("oar_p_span", length, config)
        print(f"| {length} | {span:.2f} | {local:.2f} | {local / span:.2f} | {predicted:.2f} | {exact} |", flush=True)


if __name__ == "__main__":
    main()
