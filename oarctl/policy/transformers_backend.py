"""Batched sampling and teacher-forced log-probs with a transformers causal LM.

Log-probs are those of the *sampling policy*: log_softmax(logits / temperature) of the sampled
token, before top-p truncation (vLLM reports the same by default). The update stage recomputes the
same quantity under the new weights, so the PPO ratio compares like with like.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from tqdm.auto import tqdm


@dataclass
class Generation:
    token_ids: list[int]  # response only, final eos included when produced
    logprobs: list[float]  # one per response token
    finish_reason: str  # "stop" (eos) or "length" (max_new_tokens reached)


def _left_pad(batch: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(ids) for ids in batch)
    input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(batch), width), dtype=torch.long)
    for row, ids in enumerate(batch):
        input_ids[row, width - len(ids):] = torch.tensor(ids, dtype=torch.long)
        attention_mask[row, width - len(ids):] = 1
    return input_ids, attention_mask


def _trim(tokens: list[int], logprobs: list[float], eos_id: int) -> Generation:
    if eos_id in tokens:
        end = tokens.index(eos_id) + 1
        return Generation(tokens[:end], logprobs[:end], "stop")
    return Generation(tokens, logprobs, "length")


@torch.no_grad()
def _generate_batch(model, batch, *, temperature, top_p, max_new_tokens, pad_id, eos_id):
    input_ids, attention_mask = _left_pad(batch, pad_id)
    device = model.device
    greedy = temperature <= 0
    sampling = {} if greedy else {"temperature": temperature, "top_p": top_p, "top_k": 0}
    output = model.generate(
        input_ids=input_ids.to(device),
        attention_mask=attention_mask.to(device),
        do_sample=not greedy,
        max_new_tokens=max_new_tokens,
        pad_token_id=pad_id,
        eos_token_id=eos_id,
        output_logits=True,
        return_dict_in_generate=True,
        **sampling,
    )
    new_tokens = output.sequences[:, input_ids.shape[1]:]  # (B, N)
    logits = torch.stack(output.logits, dim=1).float()  # (B, N, V)
    if not greedy:
        logits = logits / temperature
    logprobs = torch.log_softmax(logits, dim=-1).gather(-1, new_tokens.unsqueeze(-1)).squeeze(-1)
    return [_trim(t.tolist(), lp.tolist(), eos_id) for t, lp in zip(new_tokens.cpu(), logprobs.cpu())]


def generate(model, tokenizer, prompt_token_ids: list[list[int]], *, temperature: float, top_p: float,
             max_new_tokens: int, seed: int, batch_size: int = 64, progress: bool = False) -> list[Generation]:
    """Sample one response per prompt (repeat a prompt to get a group). temperature 0 = greedy.

    Each batch reseeds torch from (seed, batch start), so results do not depend on what ran before.
    """
    model.eval()
    results: list[Generation] = []
    starts = range(0, len(prompt_token_ids), batch_size)
    for start in tqdm(starts, desc="generate", unit="batch", disable=not progress, leave=False):
        torch.manual_seed(seed * 1_000_003 + start)
        results += _generate_batch(
            model, prompt_token_ids[start:start + batch_size], temperature=temperature, top_p=top_p,
            max_new_tokens=max_new_tokens, pad_id=tokenizer.pad_token_id, eos_id=tokenizer.eos_token_id)
    return results
