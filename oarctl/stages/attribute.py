"""attribute: verified rollouts (+ policy) -> attributions (a raw score per response token).

Each rollout is split into reasoning / conclude / answer spans from its own sampled token ids;
the chosen method scores the reasoning tokens. Spans, probe flag and outcome mode are stored, so
anyone can recompute a score from this file and the policy.
"""
from __future__ import annotations

from oarctl.artifacts import extend_table
from oarctl.attribution import ATTRIBUTION_METHODS
from oarctl.attribution.oar import segment_rows
from oarctl.attribution.outcome import effective_mode
from oarctl.runner import StageContext, StageOutput

VERSION = "2"


def _mode(config) -> str | None:
    return {"oar_p": config.oar_p_mode, "oar_g": config.oar_g_mode}.get(config.method)


def _span_columns(rollouts, mode: str | None) -> dict:
    columns = {name: [] for name in ("outcome_mode", "reasoning_start", "reasoning_end", "conclude_start",
                                     "conclude_end", "answer_start", "answer_end", "uses_probe")}
    for rollout in rollouts:
        segments = rollout.segments
        columns["outcome_mode"].append(effective_mode(mode, segments.answer) if mode else None)
        for name in ("reasoning", "conclude", "answer"):
            start, end = getattr(segments, name)
            columns[f"{name}_start"].append(start)
            columns[f"{name}_end"].append(end)
        columns["uses_probe"].append(segments.uses_probe)
    return columns


def run(inputs, config, context: StageContext) -> StageOutput:
    verified = inputs["verified"]
    method = ATTRIBUTION_METHODS.get(config.method)
    tokenizer = context.policy.load_tokenizer()
    rollouts = segment_rows(verified, tokenizer)
    scores = method(rollouts, verified, config, context)
    columns = {"attribution_method": [config.method] * verified.num_rows, **_span_columns(rollouts, _mode(config)),
               "token_scores": [s.tolist() for s in scores]}
    metrics = {"method": config.method, "probe_fraction": sum(columns["uses_probe"]) / verified.num_rows}
    return StageOutput(extend_table(verified, columns, "attributions"), metrics)
