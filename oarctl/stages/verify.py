"""verify: rollouts -> verified (extracted answer, its spans, normalised forms, verdict, 0/1 reward).

The checker is chosen by `verify.method`: `math` (extraction + math-verify in a killable worker
pool, see oarctl/verify) or `boxed` (the last \\boxed{} equals the gold text). `verify.extraction`
is `strict` by default, so a policy is rewarded only for an answer it states explicitly; the mode
is recorded in every row (`extraction`; `lenient+math-verify` where lenient mode's second path,
math-verify's own extraction, graded it).

The answer's character span in `response_text` is mapped to its token span in
`response_token_ids` with the sampling policy's tokenizer (the only use of the policy here); a
tokenizer that does not decode the ids back to the text is refused rather than giving wrong spans.

Latency is a measurement, not a result: it goes to the manifest's metrics (percentiles and the
slowest rows; names end in `_ms`), so that the artifact's bytes depend only on its inputs and a
rerun is identical.
"""
from __future__ import annotations

import numpy as np

from oarctl.artifacts import extend_table
from oarctl.contract import StageContext, StageOutput
from oarctl.errors import InputError
from oarctl.verify import CHECKERS, verdict_columns

VERSION = "5"  # 4: verify.extraction and the extraction column. 5: lenient mode's second path
SLOWEST_ROWS = 5


def latency_metrics(verdicts) -> dict:
    """Decision latency per row (repeats of a pair share its time): percentiles and the slowest rows."""
    latency = np.array([v.latency_ms for v in verdicts], dtype=np.float64)
    if latency.size == 0:
        return {}
    slowest = np.argsort(-latency, kind="stable")[:SLOWEST_ROWS]
    return {"latency_p50_ms": float(np.percentile(latency, 50)), "latency_p99_ms": float(np.percentile(latency, 99)),
            "latency_max_ms": float(latency.max()),
            "slowest_rows_ms": [[int(row), round(float(latency[row]), 3)] for row in slowest]}


def answer_token_spans(rollouts, verdicts, tokenizer, policy_path) -> list[tuple[int, int]]:
    from oarctl.verify.token_span import decodes_to, token_span

    spans = []
    rows = zip(rollouts["response_token_ids"].to_pylist(), rollouts["response_text"].to_pylist(), verdicts)
    for row, (ids, text, verdict) in enumerate(rows):
        if not decodes_to(tokenizer, ids, text):
            raise InputError(f"row {row}: response_token_ids do not decode to response_text with the tokenizer "
                             f"of {policy_path}; pass the policy that sampled them (--policy)")
        spans.append(token_span(tokenizer, ids, verdict.start, verdict.end))
    return spans


def run(inputs, config, context: StageContext) -> StageOutput:
    rollouts = inputs["rollouts"]
    verdicts = CHECKERS.get(config.method)(rollouts["response_text"].to_pylist(), rollouts["answer"].to_pylist(),
                                           timeout=config.timeout, workers=config.workers,
                                           memory_mb=config.memory_mb, extraction=config.extraction)
    columns = {**verdict_columns(verdicts, config.extraction), "reward": [v.reward for v in verdicts]}
    spans = answer_token_spans(rollouts, verdicts, context.policy.load_tokenizer(), context.policy.path)
    columns["answer_token_start"] = [start for start, _ in spans]
    columns["answer_token_end"] = [end for _, end in spans]
    statuses = columns["verdict"]
    metrics = {"reward_mean": float(np.mean(columns["reward"])),
               "no_answer_fraction": statuses.count("no_answer") / len(statuses),
               "timeouts": statuses.count("timeout"), "errors": statuses.count("error"),
               **latency_metrics(verdicts)}
    return StageOutput(extend_table(rollouts, columns, "verified"), metrics)
