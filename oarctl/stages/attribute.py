"""attribute: verified rollouts (+ policy) -> attributions (a raw score per response token).

Each rollout is split into reasoning / conclude / answer spans from its own sampled token ids;
the chosen method scores the reasoning tokens. Spans, probe flag and outcome mode are stored, so
anyone can recompute a score from this file and the policy. The policy is loaded in
`attribute.dtype` (bfloat16 halves a 7B copy to ~15 GB).

With `skip_uniform_groups`, rows of groups (one prompt_id) whose rewards are all equal are not
scored: their advantage is 0, so their token weights change nothing; their token_scores are all NaN.

Under `accelerate launch` (`attribute.accelerate_config` makes `oarctl run` do it) the ranks replicate
the policy, DDP-style: each loads all of it on its own device (cuda:LOCAL_RANK, else cpu over gloo) and
scores a share of the rows, whole groups at a time (OAR-G then still runs a group's prompt once), dealt
so the ranks' token counts are even (`distributed.deal`). Rank 0 gathers the scores and writes the file
one process writes: same rows, order and columns. Scores agree with one process's to float tolerance,
not always bit for bit: a method batches the rows it is given, so batch padding can differ by rank.
Noise seeds follow the table row (`Rollout.row`), not the rank.
"""
from __future__ import annotations

import contextlib
import dataclasses

import numpy as np

from oarctl.artifacts import extend_table
from oarctl.attribution import ATTRIBUTION_METHODS
from oarctl.attribution.base import segment_rows
from oarctl.attribution.rows import outcome_mode, rows_to_score, span_columns
from oarctl.checkpoints import loaded_files
from oarctl.contract import StageContext, StageOutput
from oarctl.distributed import checked_beside, deal, gather_to_rank_zero, process_state, rank, world_size

VERSION = "3"  # 3: outcome_mode recorded for every OAR-P variant (was None but for oar_p)


def rows_of_rank(verified, rows: list[int], ranks: int, index: int) -> list[int]:
    """This rank's share of `rows`: whole groups, balanced by prompt + response tokens."""
    if ranks == 1:
        return rows
    prompt_ids = verified["prompt_id"].to_pylist()
    tokens = [len(p) + len(r) for p, r in zip(verified["prompt_token_ids"].to_pylist(),
                                              verified["response_token_ids"].to_pylist())]
    dealt = deal([prompt_ids[i] for i in rows], [tokens[i] for i in rows], ranks)
    return [rows[i] for i in dealt[index]]


def _on_rank_device(context: StageContext, state) -> StageContext:
    """Under a launcher every rank loads its own copy on its own device, whatever policy.device says;
    the ranks check its files beside (_checked_policy)."""
    if state is None:
        return context
    policy = dataclasses.replace(context.policy, device=str(state.device), verified=True, _loaded=None)
    return dataclasses.replace(context, policy=policy)


def _checked_policy(context: StageContext, state):
    """Under a launcher the ranks verify the policy's files shared out (each file hashed by one rank),
    beside loading and scoring, and settle before the scores go to rank 0 (call on every rank). One plain
    process verifies as it loads instead."""
    if state is None:
        return contextlib.nullcontext()
    return checked_beside({context.policy.path: loaded_files(context.policy.path)}, state)


def _score(method, rollouts, verified, rows: list[int], config, context) -> dict[int, np.ndarray]:
    """{row: scores} of the method called on `rows` only (a rank without rows loads no model)."""
    if not rows:
        return {}
    return dict(zip(rows, method([rollouts[i] for i in rows], verified.take(rows), config, context)))


def _all_scores(scored: dict[int, np.ndarray], rollouts) -> list[list[float]]:
    """One list per table row; rows nobody scored are NaN throughout."""
    return [scored[i].tolist() if i in scored else [float("nan")] * r.response_length for i, r in enumerate(rollouts)]


def run(inputs, config, context: StageContext) -> StageOutput:
    verified = inputs["verified"]
    method = ATTRIBUTION_METHODS.get(config.method)
    rollouts = segment_rows(verified, context.policy.load_tokenizer())  # every rank: cheap, and the spans
    rows = rows_to_score(verified["prompt_id"].to_pylist(), verified["reward"].to_pylist(),
                         config.skip_uniform_groups)
    state = process_state()  # None without a launcher
    mine = rows_of_rank(verified, rows, world_size(), rank())
    with _checked_policy(context, state):
        scored = _score(method, rollouts, verified, mine, config, _on_rank_device(context, state))
    parts = gather_to_rank_zero(scored, state)
    metrics = {"method": config.method, "probe_fraction": sum(r.segments.uses_probe for r in rollouts) / len(rollouts),
               "scored_fraction": len(rows) / len(rollouts)}
    if config.method in ("oar_flow", "oar_flow_span", "oar_flow_local"):  # its knobs beside the outcome_mode
        metrics["flow_rule"] = config.flow_rule                          # column (the cache key leaves a default out)
    if config.method == "oar_flow_local":
        metrics["flow_horizon"] = config.flow_horizon
    if parts is None:  # not rank 0: it writes
        return StageOutput(None, metrics)
    scored = {row: scores for part in parts for row, scores in part.items()}
    columns = {"attribution_method": [config.method] * verified.num_rows,
               **span_columns(rollouts, outcome_mode(config)),
               "token_scores": _all_scores(scored, rollouts)}
    return StageOutput(extend_table(verified, columns, "attributions"), metrics)
