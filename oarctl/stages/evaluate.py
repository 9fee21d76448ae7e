"""evaluate: prompts + policy -> eval results (greedy and sampled responses, graded).

The prompts are the held-out set, or several benchmarks in one table with a `benchmark` column
(evaluate.benchmarks; see oarctl/data.py load_benchmarks). Metrics, per benchmark and overall:
greedy accuracy, avg@n of `samples` sampled responses per prompt, unbiased pass@k, and maj@k
(majority vote over the normalized answers of the first k samples). With named benchmarks the
overall number is the mean over benchmarks (each counts once, as papers' "Avg." column does) and
per-benchmark metrics are `<name>/<metric>`. The seed is fixed per run (not per step), so every
checkpoint is scored on the same noise. Answers are read with `evaluate.extraction`, `lenient` by
default (as the graders behind published scores read them; see oarctl/verify/lenient.py), and the
mode is in every row (`lenient+math-verify` where math-verify's own extraction graded it), the
metrics and the summary.
"""
from __future__ import annotations

from collections import defaultdict

import numpy as np

from oarctl.artifacts import make_table
from oarctl.contract import StageContext, StageOutput
from oarctl.metrics import group_metrics, vote_metrics
from oarctl.policy.backends import generate
from oarctl.templates import encode_prompt, resolve as resolve_template
from oarctl.verify import CHECKERS
from oarctl.verify.equivalence import extraction_label

VERSION = "4"  # 2: benchmark, verdict and normalized_answer columns; maj@k; evaluate.limit. 3: extraction.
# 4: lenient mode's second path (math-verify's own extraction), `lenient+math-verify` rows
HELDOUT = "heldout"  # the benchmark name of a prompts table without a benchmark column


def _responses(model, tokenizer, prompts, config, context, temperature, copies):
    repeated = [row for row in prompts for _ in range(copies)]
    template = resolve_template(context.prompt_template)
    encoded = [encode_prompt(tokenizer, row, template) for row in repeated]
    generations = generate(context.policy, encoded, temperature=temperature, top_p=config.top_p,
                           max_new_tokens=config.max_new_tokens, seed=context.seed,
                           batch_size=config.batch_size, progress=context.progress)
    texts = tokenizer.batch_decode([g.token_ids for g in generations], skip_special_tokens=True)
    verdicts = CHECKERS.get(config.checker)(texts, [row["answer"] for row in repeated], extraction=config.extraction)
    for index, (row, generation, text, verdict) in enumerate(zip(repeated, generations, texts, verdicts)):
        yield {"prompt_id": row["prompt_id"], "problem": row["problem"], "answer": row["answer"],
               "benchmark": row["benchmark"], "verdict": verdict.verdict,
               "normalized_answer": verdict.normalized_answer,
               "mode": "greedy" if temperature == 0 else "sampled", "sample_index": index % copies,
               "response_token_ids": generation.token_ids, "response_text": text,
               "finish_reason": generation.finish_reason, "extracted_answer": verdict.extracted, "reward": verdict.reward,
               "extraction": extraction_label(verdict, config.extraction)}


def _prompt_rows(table, limit: int) -> list[dict]:
    """Rows with a benchmark name; `limit` keeps the first N prompts of each benchmark."""
    if "benchmark" not in table.column_names:
        table = table.append_column("benchmark", [[HELDOUT] * table.num_rows])
    rows, seen = [], defaultdict(int)
    columns = ["prompt_id", "problem", "answer", "benchmark"] + [c for c in ["messages"] if c in table.column_names]
    for row in table.select(columns).to_pylist():
        seen[row["benchmark"]] += 1
        if not limit or seen[row["benchmark"]] <= limit:
            rows.append(row)
    return rows


def _scores(rows: list[dict], ks: list[int]) -> dict:
    """greedy_accuracy, avg@n, pass@k, maj@k and prompts over the rows of one benchmark."""
    sampled = defaultdict(list)
    for row in rows:
        if row["mode"] == "sampled":
            sampled[row["prompt_id"]].append((row["normalized_answer"], row["reward"]))
    rewards = {prompt: [reward for _, reward in samples] for prompt, samples in sampled.items()}
    return {"greedy_accuracy": float(np.mean([r["reward"] for r in rows if r["mode"] == "greedy"])),
            **group_metrics(rewards, ks), **vote_metrics(sampled, ks), "prompts": len(sampled)}


def evaluation_metrics(rows: list[dict], config) -> dict:
    """Overall metrics (the held-out names of old), then `<benchmark>/<metric>` when named."""
    by_benchmark = defaultdict(list)
    for row in rows:
        by_benchmark[row["benchmark"]].append(row)
    per_benchmark = {name: _scores(part, config.pass_k) for name, part in by_benchmark.items()}
    settings = {"samples": config.samples, "temperature": config.temperature, "top_p": config.top_p,
                "max_new_tokens": config.max_new_tokens, "extraction": config.extraction,
                "benchmarks": list(per_benchmark)}
    if list(per_benchmark) == [HELDOUT]:
        return {**per_benchmark[HELDOUT], **settings}
    first = next(iter(per_benchmark.values()))
    overall = {key: float(np.mean([scores[key] for scores in per_benchmark.values()])) for key in first}
    overall["prompts"] = sum(scores["prompts"] for scores in per_benchmark.values())
    named = {f"{name}/{key}": value for name, scores in per_benchmark.items() for key, value in scores.items()}
    return {**overall, **named, **settings}


def run(inputs, config, context: StageContext) -> StageOutput:
    prompts = _prompt_rows(inputs["prompts"], config.limit)
    model, tokenizer = context.policy.load()
    rows = list(_responses(model, tokenizer, prompts, config, context, 0.0, 1))
    rows += _responses(model, tokenizer, prompts, config, context, config.temperature, config.samples)
    metrics = evaluation_metrics(rows, config)
    return StageOutput(make_table({k: [r[k] for r in rows] for k in rows[0]}, "eval_results"), metrics)
