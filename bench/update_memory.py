"""Peak memory of one update micro-batch: the full-vocabulary logits path it replaced against the chunked
log-probs of `oarctl.policy.logprobs.response_token_stats` (update.logit_chunk_tokens), same batch.

    python bench/update_memory.py            # 4 rows x 256 .. 2,048 response tokens
    python bench/update_memory.py --quick    # small, a smoke run

A random-init Qwen2 with Qwen2.5's 151,936-token vocabulary (hidden 256, 2 layers: the logits, not
the body, are what grows), float32 on CPU; the micro-batch runs the update's loss (clipped surrogate,
k3 KL to a reference, seq-mean-token-mean) and its backward, in a forked child whose resident-set
high-water mark above its start is the peak. The full-logits path holds ~6 fp32 (B, R, V) tensors;
where it would not fit in this machine's memory (`--full-up-to`) it is not run, and its peak is
PREDICTED by a straight line through its measured points (printed as such).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.attribution import measured  # noqa: E402  (forked child, peak RSS)

VOCAB = 151_936


def _model(hidden: int, layers: int):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=4096,
                         tie_word_embeddings=True, pad_token_id=0)
    return Qwen2ForCausalLM(config)


def _batch(rows: int, prompt: int, response: int):
    generator = torch.Generator().manual_seed(response)
    prompts = [torch.randint(1, VOCAB, (prompt,), generator=generator).tolist() for _ in range(rows)]
    responses = [torch.randint(1, VOCAB, (response,), generator=generator).tolist() for _ in range(rows)]
    return prompts, responses


def micro_batch(model, reference, prompts, responses, chunk_tokens: int | None) -> float:
    """Loss + backward of one micro-batch; chunk_tokens None: the full (B, R, V) logits path."""
    from oarctl.losses import policy_loss
    from oarctl.policy.logprobs import full_vocabulary_stats, pad_rows, response_token_stats

    mask = pad_rows([[1.0] * len(r) for r in responses], 0.0, torch.float32)
    if chunk_tokens is None:
        logprobs, entropy = full_vocabulary_stats(model, prompts, responses, 0)
        with torch.no_grad():
            ref, _ = full_vocabulary_stats(reference, prompts, responses, 0)
    else:
        logprobs, entropy = response_token_stats(model, prompts, responses, 0, 1.0, chunk_tokens)
        with torch.no_grad():
            ref, _ = response_token_stats(reference, prompts, responses, 0, 1.0, chunk_tokens)
    float((entropy * mask).sum())  # the logged mean, as the update stage takes it
    loss, _ = policy_loss(logprobs, logprobs.detach() - 0.1, torch.ones_like(mask), mask, max_length=len(responses[0]),
                          ref_logprobs=ref, kl_coef=0.01)
    loss.backward()
    return loss.detach().item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 512, 1024, 2048])
    parser.add_argument("--chunks", type=int, nargs="+", default=[1024, 4096], help="logit_chunk_tokens to run (the first: the ratio column)")
    parser.add_argument("--full-up-to", type=int, default=512, help="longest response the full-logits path runs at")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.lengths, args.chunks, args.full_up_to, args.hidden = [32, 64], [64], 64, 32
    torch.set_num_threads(2)
    model, reference = _model(args.hidden, args.layers), _model(args.hidden, args.layers)
    print(f"torch {torch.__version__}; random Qwen2, hidden {args.hidden}, {args.layers} layers, vocabulary {VOCAB}; "
          f"{args.rows} rows x (prompt {args.prompt} + R) tokens, float32, loss + backward; peak RSS above the start")
    print(f"{'R':>6} {'full logits MiB':>16} " + " ".join(f"{f'chunk {c} MiB':>15}" for c in args.chunks)
          + f" {'chunked / full':>15} {'loss difference':>16}")
    full_points = []
    for length in args.lengths:
        prompts, responses = _batch(args.rows, args.prompt, length)
        if length <= args.full_up_to:
            full_loss, _, full_peak = measured(lambda: micro_batch(model, reference, prompts, responses, None))
            full_points.append((length, full_peak))
            full = f"{full_peak:>16.0f}"
        else:
            slope, intercept = np.polyfit(*zip(*full_points), 1)
            full_peak, full_loss = slope * length + intercept, None
            full = f"{full_peak:>8.0f} (pred.)"
        chunked = [measured(lambda c=c: micro_batch(model, reference, prompts, responses, c)) for c in args.chunks]
        difference = "" if full_loss is None else f"{max(abs(loss - full_loss) for loss, _, _ in chunked):.1e}"
        print(f"{length:>6} {full} " + " ".join(f"{peak:>15.0f}" for _, _, peak in chunked)
              + f" {chunked[0][2] / full_peak:>15.3f} {difference:>16}", flush=True)
    print("full logits beyond --full-up-to: predicted by a line through the measured points above, "
          "peak = a + b R; (pred.) marks them")


if __name__ == "__main__":
    main()
