"""Peak memory of one attribution call, measured in a fresh process: is it bounded by the token budget?

    python bench/memory_probe.py --method oar_g --length 3072 --budget 4096 --checkpointing
    -> {"method": ..., "length": R, "rows": n, "tokens": n x (prompt + R + 4), "peak_mib": ..., "seconds": ...}

A random-init Qwen2 (seeded, `--hidden`, `--layers`, `--heads`, vocabulary `--vocab`) scores a batch
of `rows` identical-length responses, prompt (64 tokens) + R reasoning + `\\boxed{` + 3 answer
tokens, filling the budget (rows = budget // sequence length, at least 1). oar_g scores them all;
oar_p perturbs the first positions of one response, as many as fill one chunk under the budget,
twice over (every chunk at one length costs about the same tokens, so two stand for all R); oar_flow
the same tokens one by one and the rest of the reasoning as one more unit (the widest chunks are the
first ones; its per-unit state is O(R) whatever the number of units). The peak is the resident-set
high-water mark above the resident set just before the call (Linux clear_refs), after a warm-up
call on a short sequence so that one-off allocations are not counted.

The probe runs with MALLOC_MMAP_THRESHOLD_=65536 (`probe` sets it): every tensor buffer is then
its own mapping, returned when freed, so the high-water mark is that of live tensors and not of
glibc's heap fragmentation (without it, repeated runs of one call moved the peak by ~20%).

Why a fresh process: a forked child of a process that has run OpenMP threads can hang, and a peak
measured in a long-lived process includes whatever it held before.

On CPU, PyTorch's attention with a boolean mask takes the math path, which materialises
(rows, heads, query, key) scores: a term of heads x sequence length per token that the GPU's flash
and memory-efficient kernels do not have. `--heads 1` with a wide head keeps it small beside the
activations, so the probe sees the token-proportional memory that carries over to GPUs.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

PROMPT = 64


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def model(hidden: int, layers: int, heads: int, vocab: int, dtype: str = "float32"):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=1, head_dim=hidden // heads,
                         max_position_embeddings=4096, tie_word_embeddings=True, pad_token_id=vocab - 1)
    return Qwen2ForCausalLM(config).to(getattr(torch, dtype)).eval()


def response(length: int, vocab: int, seed: int = 0):
    ids = torch.randint(4, vocab - 1, (PROMPT + length + 4,), generator=torch.Generator().manual_seed(seed))
    return ids, (PROMPT, PROMPT + length), (PROMPT + length + 1, PROMPT + length + 4)


def call(policy, method: str, length: int, rows: int, args):
    from oarctl.attribution import oar

    items = [response(length, policy.config.vocab_size)] * rows
    if method == "oar_g":
        return oar.oar_g_batch(policy, items, "answer_mean", 1e-3, list(range(rows)), rows, args.budget,
                               args.checkpointing)
    ids, reasoning, answer = items[0]
    count = 2 * oar.chunk_rows(reasoning[0], len(ids), args.chunk, args.budget)
    spans = [(t, t + 1) for t in range(reasoning[0], min(reasoning[1], reasoning[0] + count))]
    if method == "oar_flow_local":  # the last tokens: the widest prefix, the fewest rows under the budget
        from oarctl.attribution.flow_local import local_drops

        local_drops(policy, ids, local_probe_span(reasoning, args), HORIZON, None, args.chunk, args.budget)
        return None
    if method == "oar_flow":  # the same first tokens one by one, then the rest as one unit (one row)
        from oarctl.attribution.flow import flow_scores

        flow_scores(policy, ids, reasoning, answer, flow_probe_units(spans, reasoning), "last", None, args.chunk,
                    args.budget)
        return None
    return oar.perturbation_scores(policy, ids, reasoning, answer, spans, "last", None, args.chunk, args.budget)


def flow_probe_units(spans, reasoning) -> list:
    return spans + ([(spans[-1][1], reasoning[1])] if spans[-1][1] < reasoning[1] else [])


HORIZON = 16  # oar_flow_local's attribute.flow_horizon default


def local_probe_span(reasoning, args) -> tuple[int, int]:
    """oar_flow_local's rows in the probe: the last ones of the reasoning, two forwards' worth."""
    from oarctl.attribution.flow_local import local_rows

    rows = local_rows(reasoning[1], reasoning[1] - 1, HORIZON, args.chunk, args.budget)
    return max(reasoning[0], reasoning[1] - 2 * rows), reasoning[1]


def local_in_flight(length: int, args) -> int:
    """The most tokens one oar_flow_local forward holds in the probe: the clean sequence, or rows x keys."""
    from oarctl.attribution.flow_local import local_rows

    _, reasoning, _ = response(length, args.vocab)
    start, end = local_probe_span(reasoning, args)
    rows = local_rows(end - start, start, HORIZON, args.chunk, args.budget)
    return max(end, rows * (start + rows - 1 + HORIZON))


def flow_in_flight(length: int, args) -> int:
    """The widest chunk oar_flow runs in the probe: rows x the suffix recomputed, from its own chunk plan."""
    from oarctl.attribution import oar

    ids, reasoning, answer = response(length, args.vocab)
    count = 2 * oar.chunk_rows(reasoning[0], len(ids), args.chunk, args.budget)  # as `call` perturbs
    end = oar._plan(ids, reasoning, answer, "last").end  # where a suffix pass stops
    units = flow_probe_units([(t, t + 1) for t in range(reasoning[0], min(reasoning[1], reasoning[0] + count))],
                             reasoning)
    chunks = oar._perturbation_chunks(units, end, args.chunk, args.budget)
    return max(len(chunk) * (end - units[chunk[0]][0]) for chunk in chunks)


def measure(args) -> dict:
    torch.set_num_threads(args.threads)
    policy = model(args.hidden, args.layers, args.heads, args.vocab)
    sequence = PROMPT + args.length + 4
    rows = max(1, args.budget // sequence) if args.method == "oar_g" else 1
    call(policy, args.method, 8, 2, args)  # warm-up: lazy initialisation is not the method's memory
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    start = _status_kib("VmRSS")
    started = time.perf_counter()
    call(policy, args.method, args.length, rows, args)
    seconds = time.perf_counter() - started
    suffix = args.length + 4  # an OAR-P chunk recomputes rows x the suffix after its first position
    in_flight = rows * sequence if args.method == "oar_g" else min(args.chunk, max(1, args.budget // suffix)) * suffix
    if args.method == "oar_flow":
        in_flight = flow_in_flight(args.length, args)
    if args.method == "oar_flow_local":
        in_flight = local_in_flight(args.length, args)
    return {"method": args.method, "length": args.length, "checkpointing": args.checkpointing, "rows": rows,
            "tokens": in_flight, "peak_mib": (_status_kib("VmHWM") - start) / 1024, "seconds": seconds}


def parser() -> argparse.ArgumentParser:
    options = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    options.add_argument("--method", choices=["oar_g", "oar_p", "oar_flow", "oar_flow_local"], required=True)
    options.add_argument("--length", type=int, required=True, help="reasoning tokens R")
    options.add_argument("--budget", type=int, default=4096, help="attribute.max_batch_tokens")
    options.add_argument("--checkpointing", action="store_true", help="OAR-G gradient checkpointing")
    options.add_argument("--chunk", type=int, default=256, help="oar_p: chunk_size (the budget caps it)")
    options.add_argument("--hidden", type=int, default=1024)
    options.add_argument("--layers", type=int, default=2)
    options.add_argument("--heads", type=int, default=1)
    options.add_argument("--vocab", type=int, default=512)
    options.add_argument("--threads", type=int, default=1)
    return options


def probe(**options) -> dict:
    """Run the probe in a fresh interpreter and return its measurement (for tests and benches)."""
    import os
    import subprocess
    import sys

    flags = []
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        if value is True:
            flags.append(flag)
        elif value is not False:
            flags += [flag, str(value)]
    environment = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    finished = subprocess.run([sys.executable, __file__, *flags], capture_output=True, text=True, check=True,
                              env=environment)
    return json.loads(finished.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    print(json.dumps(measure(parser().parse_args())))
