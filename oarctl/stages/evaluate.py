"""evaluate: held-out prompts + policy -> eval results (greedy and sampled responses, graded).

Metrics: greedy accuracy, avg@k of `samples` sampled responses per prompt, unbiased pass@k.
The seed is fixed per run (not per step), so every checkpoint is scored on the same noise.
"""
from __future__ import annotations

from collections import defaultdict

import numpy as np

from oarctl.artifacts import make_table
from oarctl.metrics import group_metrics
from oarctl.policy.transformers_backend import generate
from oarctl.runner import StageContext, StageOutput
from oarctl.stages.sample import prompt_token_ids
from oarctl.verify import CHECKERS

VERSION = "1"


def _responses(model, tokenizer, prompts, config, context, temperature, copies):
    repeated = [row for row in prompts for _ in range(copies)]
    encoded = [prompt_token_ids(tokenizer, row["problem"]) for row in repeated]
    generations = generate(model, tokenizer, encoded, temperature=temperature, top_p=config.top_p,
                           max_new_tokens=config.max_new_tokens, seed=context.seed,
                           batch_size=config.batch_size, progress=context.progress)
    texts = tokenizer.batch_decode([g.token_ids for g in generations], skip_special_tokens=True)
    verdicts = CHECKERS.get(config.checker)(texts, [row["answer"] for row in repeated])
    for index, (row, generation, text, verdict) in enumerate(zip(repeated, generations, texts, verdicts)):
        yield {"prompt_id": row["prompt_id"], "problem": row["problem"], "answer": row["answer"],
               "mode": "greedy" if temperature == 0 else "sampled", "sample_index": index % copies,
               "response_token_ids": generation.token_ids, "response_text": text,
               "finish_reason": generation.finish_reason, "extracted_answer": verdict.extracted, "reward": verdict.reward}


def run(inputs, config, context: StageContext) -> StageOutput:
    prompts = inputs["prompts"].select(["prompt_id", "problem", "answer"]).to_pylist()
    model, tokenizer = context.policy.load()
    rows = list(_responses(model, tokenizer, prompts, config, context, 0.0, 1))
    rows += _responses(model, tokenizer, prompts, config, context, config.temperature, config.samples)
    sampled = defaultdict(list)
    for row in rows:
        if row["mode"] == "sampled":
            sampled[row["prompt_id"]].append(row["reward"])
    metrics = {"greedy_accuracy": float(np.mean([r["reward"] for r in rows if r["mode"] == "greedy"])),
               **group_metrics(sampled, config.pass_k), "prompts": len(prompts)}
    return StageOutput(make_table({k: [r[k] for r in rows] for k in rows[0]}, "eval_results"), metrics)
