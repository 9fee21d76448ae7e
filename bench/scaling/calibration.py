"""The CPU calibration (torch, transformers; bench/scale.py --calibrate): the formulas of
bench/scaling/formulas.py measured on a random-init Qwen2 of the 7B's proportions scaled down."""
from __future__ import annotations

import time

from bench.scaling.formulas import (activation_bytes_per_token_layer, backward_to_inputs_flops,
                                    checkpoint_bytes_per_token_layer, forward_flops)
from bench.scaling.model import ANSWER_TOKENS, CLOSING_TOKENS, CONCLUDE_TOKENS, Shape, dtype_bytes

TINY = Shape("tiny Qwen2", 448, 2, 7, 1, 2368, 512, False)  # as the 7B: heads / kv heads 7, I / H 5.29; head dim 64


def tiny_model(layers: int, dtype: str = "float32", attention: str = "sdpa"):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(hidden_size=TINY.hidden, intermediate_size=TINY.intermediate, num_hidden_layers=layers,
                         num_attention_heads=TINY.heads, num_key_value_heads=TINY.kv_heads, vocab_size=TINY.vocab,
                         max_position_embeddings=2048, pad_token_id=0, tie_word_embeddings=False)
    config._attn_implementation = attention
    return Qwen2ForCausalLM(config).to(getattr(torch, dtype)).eval()


def tiny_items(prompt: int, reasoning: list[int]):
    """One group: a shared prompt, responses reasoning + conclude + answer (+ closing)."""
    import torch

    generator = torch.Generator().manual_seed(0)
    head = torch.randint(1, TINY.vocab, (prompt,), generator=generator)
    items = []
    for r in reasoning:
        tail = torch.randint(1, TINY.vocab, (r + CONCLUDE_TOKENS + ANSWER_TOKENS + CLOSING_TOKENS,), generator=generator)
        answer = prompt + r + CONCLUDE_TOKENS
        items.append((torch.cat([head, tail]), (prompt, prompt + r), (answer, answer + ANSWER_TOKENS)))
    return items


def _oar_g(model, items, checkpointing: bool):
    """oar_g_batch on one batch; (scores, note). Falls back, marked, when the API has no checkpointing yet."""
    import inspect

    from oarctl.attribution.oar import oar_g_batch

    if "gradient_checkpointing" in inspect.signature(oar_g_batch).parameters:
        return oar_g_batch(model, items, "answer_mean", 1e-3, list(range(len(items))), len(items),
                           max_batch_tokens=0, gradient_checkpointing=checkpointing), ""
    if not checkpointing:
        return oar_g_batch(model, items, "answer_mean", 1e-3, list(range(len(items))), len(items)), ""
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})  # FALLBACK
    model.train()
    import torch
    ids = torch.nn.utils.rnn.pad_sequence([i for i, _, _ in items], batch_first=True)
    embeds = model.get_input_embeddings()(ids).detach().requires_grad_(True)
    loss = model(inputs_embeds=embeds, use_cache=False).logits[:, -1].float().logsumexp(-1).sum()
    torch.autograd.grad(loss, embeds)
    model.gradient_checkpointing_disable()
    model.eval()
    return None, "FALLBACK: oar_g_batch has no gradient_checkpointing; plain forward/backward, no prefix cache"


def autograd_saved_bytes(model, items, checkpointing: bool) -> tuple[int, str]:
    """Bytes of the distinct non-parameter storages autograd saves during one oar_g_batch call."""
    import torch

    parameters_ = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in parameters_:
            seen[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        _, note = _oar_g(model, items, checkpointing)
    return sum(seen.values()), note


def suffix_tokens(items) -> int:
    """Rows x padded suffix of one OAR-G batch: what the graph is built over (the prompt is cached)."""
    P = items[0][1][0]
    return len(items) * max(answer[1] - 1 - P for _, _, answer in items)


def calibrate() -> list[str]:
    """Measured vs predicted on CPU: forward FLOPs (FlopCounterMode, eager attention: it counts the
    full score matrix, so A = T^2 per row), OAR-G's backward/forward FLOPs ratio, and the bytes per token per layer
    OAR-G keeps, from the difference of a 2- and a 4-layer model (fp32 and bf16, without and with checkpointing)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    lines = []
    started = time.time()
    model = tiny_model(2, attention="eager")
    B, T = 2, 128
    ids = torch.randint(1, TINY.vocab, (B, T), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(input_ids=ids)
    measured = counter.get_total_flops()
    predicted = forward_flops(TINY, B * T, B * T * T, B * T)
    lines.append(f"forward FLOPs, tiny Qwen2 (H {TINY.hidden}, 2 layers, {TINY.heads} heads of {TINY.head_dim}, "
                 f"{TINY.kv_heads} kv head, I {TINY.intermediate}, V {TINY.vocab}), {B} x {T} tokens: measured "
                 f"{measured / 1e9:.3f} GFLOP, predicted {predicted / 1e9:.3f} ({100 * (measured / predicted - 1):+.2f}%)")
    items = tiny_items(24, [160, 140, 120, 100])
    with FlopCounterMode(display=False) as counter:
        _oar_g(model, items, False)
    measured = counter.get_total_flops()
    P, S, n = 24, suffix_tokens(items) // len(items), len(items)
    f = forward_flops(TINY, n * S, n * (P + S) * S, n * n * ANSWER_TOKENS)  # eager: every (query, key), union logits
    prefix = forward_flops(TINY, P, P * P, 0)
    predicted = prefix + 2 * f + backward_to_inputs_flops(f)
    lines.append(f"OAR-G FLOPs (oar_g_batch, one group of {n}, eager attention): measured {measured / 1e9:.3f} GFLOP, "
                 f"predicted {predicted / 1e9:.3f} ({100 * (measured / predicted - 1):+.2f}%): backward to inputs "
                 f"= {(measured - prefix - 2 * f) / f:.2f}x forward (formula: 1x)")
    notes = set()
    for dtype, reasoning in (("float32", [160, 140, 120, 100]), ("bfloat16", [32, 24])):  # bf16 matmuls are slow on CPU
        items = tiny_items(24, reasoning)
        tokens = suffix_tokens(items)
        b = dtype_bytes(dtype)
        for checkpointing in (False, True):
            saved = {}
            for layers in (2, 4):
                saved[layers], note = autograd_saved_bytes(tiny_model(layers, dtype), items, checkpointing)
                notes.add(note)
            per_layer = (saved[4] - saved[2]) / 2 / tokens
            predicted = (checkpoint_bytes_per_token_layer if checkpointing else activation_bytes_per_token_layer)(TINY, b)
            formula = "H b" if checkpointing else "b (9H + 4I) + 2H (4 - b)"
            lines.append(f"OAR-G kept bytes per token per layer, {dtype}, {'with' if checkpointing else 'without'} "
                         f"checkpointing ({tokens} suffix tokens): measured {per_layer:.0f}, predicted {predicted} "
                         f"[{formula}] ({100 * (per_layer / predicted - 1):+.2f}%)")
    lines += [f"NOTE {n}" for n in notes if n]
    lines.append(f"(calibration took {time.time() - started:.0f} s on this CPU)")
    return lines
