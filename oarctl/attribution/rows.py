"""Which rows of a verified table an attribution method scores, and the span columns it records.

Shared by the attribute stage and the TRL trainer (oarctl/integrations/trl.py), so both write the
same attributions columns from the same segmented rollouts (`base.Rollout`).
"""
from __future__ import annotations

from oarctl.attribution.outcome import effective_mode

SPAN_NAMES = ("reasoning", "conclude", "answer")
# the methods whose outcome is attribute.oar_p_mode, and those whose outcome is OAR-G's (oar_g_mode)
PERTURBING_METHODS = ("oar_p", "oar_p_span", "oar_p_screened", "oar_flow", "oar_flow_span")
GRADIENT_METHODS = ("oar_g", "oar_flow_local")


def outcome_mode(config) -> str | None:
    """The outcome definition the configured method uses (None for methods without one)."""
    if config.method in PERTURBING_METHODS:
        return config.oar_p_mode
    return config.oar_g_mode if config.method in GRADIENT_METHODS else None


def span_columns(rollouts, mode: str | None) -> dict:
    """The attributions columns outcome_mode, <span>_start / _end and uses_probe, one value per rollout."""
    columns = {"outcome_mode": [], "uses_probe": [],
               **{f"{name}_{end}": [] for name in SPAN_NAMES for end in ("start", "end")}}
    for rollout in rollouts:
        segments = rollout.segments
        columns["outcome_mode"].append(effective_mode(mode, segments.answer) if mode else None)
        for name in SPAN_NAMES:
            start, end = getattr(segments, name)
            columns[f"{name}_start"].append(start)
            columns[f"{name}_end"].append(end)
        columns["uses_probe"].append(segments.uses_probe)
    return columns


def rows_to_score(prompt_ids: list, rewards: list, skip_uniform_groups: bool) -> list[int]:
    """Rows the method scores: all, or only those of groups (one prompt_id) with mixed rewards."""
    if not skip_uniform_groups:
        return list(range(len(prompt_ids)))
    group_rewards: dict = {}
    for prompt_id, reward in zip(prompt_ids, rewards):
        group_rewards.setdefault(prompt_id, set()).add(reward)
    return [row for row, prompt_id in enumerate(prompt_ids) if len(group_rewards[prompt_id]) > 1]
