"""sample: prompts + policy -> rollouts (a group of responses per prompt).

Reads a prompts table and draws `prompts_per_step` of them for this step (a seeded permutation per
pass over the data, so every prompt is used once before any repeats). Each prompt is repeated
`group_size` times and sampled; the sampling log-probs are kept for the PPO ratio. With the vLLM
backend the metrics also say how the engine was obtained (`engine`: built, reloaded in place, or
reused) and the seconds of its load and canary check.

When every prompt is a chains toy problem (oarctl/toy/chains.py), the rollouts also get
`token_truth`, the ground-truth credit label of each response token (oarctl/toy/truth.py); other
prompt sets get no such column, so their rollouts are byte for byte what they were. The metrics then
also estimate the policy's entropy on the free tokens and on the answer's (`truth_entropy`).
"""
from __future__ import annotations

import numpy as np

from oarctl.artifacts import make_table
from oarctl.contract import StageContext, StageOutput
from oarctl.policy.backends import engine_report, generate
from oarctl.templates import encode, encode_prompt, resolve as resolve_template
from oarctl.toy.truth import truth_column

VERSION = "1"


def select_prompts(count: int, per_step: int, step: int, seed: int) -> list[int]:
    """Row indices for `step`: consecutive slices of per-epoch permutations of range(count)."""
    start = step * per_step
    permutations: dict[int, np.ndarray] = {}
    indices = []
    for position in range(start, start + per_step):
        epoch, offset = divmod(position, count)
        if epoch not in permutations:
            permutations[epoch] = np.random.default_rng([seed, epoch]).permutation(count)
        indices.append(int(permutations[epoch][offset]))
    return indices


def prompt_token_ids(tokenizer, problem: str, template="chat") -> list[int]:
    """The prompt's token ids under `template` (data.prompt_template; default: the model's own chat
    template with the problem as the user turn). See oarctl/templates.py."""
    return encode(tokenizer, problem, template)


def run(inputs, config, context: StageContext) -> StageOutput:
    prompts = inputs["prompts"]
    tokenizer = context.policy.load_tokenizer()  # the backend loads the weights it serves
    rows = select_prompts(prompts.num_rows, config.prompts_per_step, context.step, context.seed)
    chosen = prompts.take(rows).to_pylist()
    repeated = [row for row in chosen for _ in range(config.group_size)]
    template = resolve_template(context.prompt_template)
    encoded = {row["prompt_id"]: encode_prompt(tokenizer, row, template) for row in chosen}
    generations = generate(
        context.policy, [encoded[row["prompt_id"]] for row in repeated],
        temperature=config.temperature, top_p=config.top_p, max_new_tokens=config.max_new_tokens,
        seed=context.seed * 100_003 + context.step, batch_size=config.batch_size, progress=context.progress)
    columns = {
        "prompt_id": [r["prompt_id"] for r in repeated],
        "problem": [r["problem"] for r in repeated],
        "answer": [r["answer"] for r in repeated],
        "sample_index": [i % config.group_size for i in range(len(repeated))],
        "prompt_token_ids": [encoded[r["prompt_id"]] for r in repeated],
        "response_token_ids": [g.token_ids for g in generations],
        "response_logprobs": [g.logprobs for g in generations],
        "response_text": tokenizer.batch_decode([g.token_ids for g in generations], skip_special_tokens=True),
        "finish_reason": [g.finish_reason for g in generations],
        "temperature": [config.temperature] * len(repeated),
        "token_truth": truth_column([r["problem"] for r in repeated], [g.token_ids for g in generations], tokenizer),
    }
    lengths = [len(g.token_ids) for g in generations]
    metrics = {"responses": len(generations), "response_length_mean": float(np.mean(lengths)),
               "truncated_fraction": float(np.mean([g.finish_reason == "length" for g in generations])),
               **engine_report(context.policy), **truth_entropy(columns["token_truth"], columns["response_logprobs"])}
    return StageOutput(make_table(columns, "rollouts"), metrics)


def truth_entropy(labels: list[list[int]] | None, logprobs: list[list[float]]) -> dict:
    """Policy entropy on the tokens the answer does not depend on (label 0) and on those it does
    (label 1), estimated by the mean surprisal -log p of the sampled tokens (its expectation is the
    entropy at the sampling temperature). Uniform credit is argued to collapse the first faster."""
    if labels is None:
        return {}
    flat_labels = np.concatenate([np.asarray(row, np.int8) for row in labels])
    surprisal = -np.concatenate([np.asarray(row, np.float64) for row in logprobs])
    return {f"entropy_{name}_tokens": float(surprisal[flat_labels == label].mean())
            for name, label in (("free", 0), ("answer", 1)) if (flat_labels == label).any()}
