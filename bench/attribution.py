"""Time OAR-P and OAR-G against their naive versions on the toy model; print the ratios.

    python bench/attribution.py [--reasoning 200] [--hidden 128] [--layers 4] [--chunk 64]

Naive OAR-P: one full forward pass per perturbed sequence with all logits (what the reference code
computes, one copy at a time so that it fits memory). Naive OAR-G: one response per forward and
backward pass, all logits. Both scores are compared, so a speed-up never hides a wrong answer.
"""
from __future__ import annotations

import argparse
import time

import torch

from oarctl.attribution import oar
from oarctl.toy.model import build_model
from oarctl.toy.tokenizer import build_tokenizer


@torch.no_grad()
def naive_oar_p(model, ids, reasoning_span, answer_span):
    """`last` outcome, full recompute per position."""
    position = answer_span[0] - 1
    clean = torch.log_softmax(model(input_ids=ids[None]).logits[0, position], dim=-1)
    scores = []
    for t in range(*reasoning_span):
        perturbed = ids.clone()
        perturbed[t] = model.config.pad_token_id
        changed = torch.log_softmax(model(input_ids=perturbed[None]).logits[0, position], dim=-1)
        scores.append((clean.exp() * (clean - changed)).sum())
    return torch.stack(scores)


def naive_oar_g(model, items, noise_std, seeds):
    """`answer_mean` outcome, one response at a time, all logits."""
    results = []
    for (ids, (start, end), (answer_start, answer_end)), seed in zip(items, seeds):
        with torch.no_grad():
            clean = model(input_ids=ids[None]).logits[0, answer_start - 1:answer_end - 1]
            teacher = torch.log_softmax(clean.mean(0), -1)
        leaf = model.get_input_embeddings()(ids).detach().requires_grad_(True)
        noise = torch.zeros_like(leaf)
        noise[start:end] = torch.randn((end - start, leaf.shape[-1]),
                                       generator=torch.Generator().manual_seed(seed)) * noise_std
        logits = model(inputs_embeds=(leaf + noise)[None]).logits[0, answer_start - 1:answer_end - 1]
        noisy = torch.log_softmax(logits.mean(0), -1)
        (gradient,) = torch.autograd.grad((teacher.exp() * (teacher - noisy)).sum(), leaf)
        results.append((gradient * leaf).sum(-1).abs()[start:end].detach())
    return results


def timed(function):
    started = time.perf_counter()
    result = function()
    return result, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt", type=int, default=40, help="prompt tokens")
    parser.add_argument("--reasoning", type=int, default=200, help="reasoning tokens per response")
    parser.add_argument("--responses", type=int, default=8, help="responses for OAR-G")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--chunk", type=int, default=64, help="OAR-P chunk size")
    parser.add_argument("--vocab", type=int, default=0,
                        help="vocabulary size of the model (0 = the toy tokenizer's); a real one shows "
                             "what projecting only the outcome positions saves")
    args = parser.parse_args()
    torch.set_num_threads(1)
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, hidden_size=args.hidden, num_layers=args.layers,
                        max_positions=args.prompt + args.reasoning + 16).eval()
    if args.vocab:
        model.resize_token_embeddings(args.vocab, mean_resizing=False)
    generator = torch.Generator().manual_seed(0)
    boxed = tokenizer.convert_tokens_to_ids("\\boxed{")

    def sequence(reasoning):
        body = torch.randint(4, 90, (args.prompt + reasoning,), generator=generator)
        return torch.cat([body, torch.tensor([boxed]), torch.randint(4, 90, (3,), generator=generator)])

    ids = sequence(args.reasoning)
    reasoning, answer = (args.prompt, args.prompt + args.reasoning), (ids.numel() - 3, ids.numel())
    expected, naive_seconds = timed(lambda: naive_oar_p(model, ids, reasoning, answer))
    got, fast_seconds = timed(lambda: oar.oar_p(model, ids, reasoning, answer, "last", chunk_size=args.chunk))
    error = (got - expected).abs().max().item()
    print(f"OAR-P  R={args.reasoning} V={model.config.vocab_size} chunk={args.chunk}  "
          f"naive {naive_seconds:7.2f} s  ours {fast_seconds:7.2f} s  "
          f"x{naive_seconds / fast_seconds:5.1f}  max |diff| {error:.1e}")

    lengths = [args.reasoning - 10 * i for i in range(args.responses)]
    items = []
    for length in lengths:
        ids = sequence(length)
        items.append((ids, (args.prompt, args.prompt + length), (ids.numel() - 3, ids.numel())))
    seeds = list(range(len(items)))
    expected, naive_seconds = timed(lambda: naive_oar_g(model, items, oar.NOISE_STD, seeds))
    got, fast_seconds = timed(lambda: oar.oar_g_batch(model, items, "answer_mean", oar.NOISE_STD, seeds))
    error = max((g - e).abs().max().item() for g, e in zip(got, expected))
    print(f"OAR-G  B={len(items)}  naive {naive_seconds:7.2f} s  ours {fast_seconds:7.2f} s  "
          f"x{naive_seconds / fast_seconds:5.1f}  max |diff| {error:.1e}")


if __name__ == "__main__":
    main()
