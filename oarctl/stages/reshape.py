"""reshape: attributions -> advantages (sequence advantage, token weights, token advantages).

The sequence advantage comes from the estimator registry (GRPO by default, groups = prompt_id).
The method that made the scores picks its token credit rule (`credit_rules`): Bi-Level weights of the
reasoning tokens' raw scores for every OAR method and control, every other response token (conclude,
answer, closing brace, eos) keeping weight 1; TRL's entropy mask (`entropy_mask`: weights 0/1 over the
batch, no rescaling, no mass check); KTAE's additive key-token values (`ktae`: A_i + k_it, no mass check). With mass preservation on (Bi-Level), the reasoning
weights sum to the reasoning length, so every sequence's token advantages sum to its GRPO total
(advantage x length), which this stage checks. With `reshape.quantile_carry` the rows are weighted
in table order (prompt-major, each group's responses consecutive, as sampled) with the released
code's carried quantile level (`reshaping.carried_bilevel_weights`).
"""
from __future__ import annotations

from collections import Counter

import numpy as np

from oarctl.advantages import ADVANTAGE_ESTIMATORS
from oarctl.artifacts import extend_table
from oarctl.contract import StageContext, StageOutput
from oarctl.credit_rules import rule_of, token_credit
from oarctl.errors import InputError
from oarctl.reshaping import concentration_metrics

VERSION = "3"  # 3: credit-concentration metrics (top10_mass_share, effective_tokens); the rules of bilevel keep it


def group_ids(prompt_ids: list[str]) -> np.ndarray:
    index: dict[str, int] = {}
    return np.array([index.setdefault(p, len(index)) for p in prompt_ids], dtype=np.int64)


def _check_groups(prompt_ids: list[str]) -> None:
    """Group baselines need two or more responses per prompt; a lone one would get advantage 0."""
    counts = Counter(prompt_ids)
    for row, prompt_id in enumerate(prompt_ids):
        if counts[prompt_id] < 2:
            raise InputError(f"row {row}: prompt_id {prompt_id!r} has a group of 1 response; "
                             f"group advantages need at least 2 (sample.group_size)")


def _check_mass(advantage: float, weighted: np.ndarray, row: int) -> None:
    expected = advantage * len(weighted)
    if not np.isclose(weighted.sum(dtype=np.float64), expected, rtol=1e-4, atol=1e-4):
        raise InputError(f"row {row}: token advantages sum to {weighted.sum():.6g}, "
                         f"expected the GRPO total {expected:.6g}")


def run(inputs, config, context: StageContext) -> StageOutput:
    table = inputs["attributions"]
    rewards = np.asarray(table["reward"].to_numpy(zero_copy_only=False), dtype=np.float64)
    prompt_ids = table["prompt_id"].to_pylist()
    _check_groups(prompt_ids)
    groups = group_ids(prompt_ids)
    advantages = ADVANTAGE_ESTIMATORS.get(config.estimator)(rewards, groups, scale=config.scale, eps=config.eps)
    weights, per_token, reasoning = [], [], []
    spans = list(zip(table["reasoning_start"].to_pylist(), table["reasoning_end"].to_pylist()))
    rows = list(zip(table["token_scores"].to_pylist(), spans))
    method = table["attribution_method"][0].as_py() if table.num_rows else "uniform"
    checks_mass = config.preserve_mass and rule_of(method) == "bilevel"
    credit = zip(*token_credit(method, rows, advantages, config), spans)
    for row, (w, weighted, (start, end)) in enumerate(credit):
        if checks_mass:
            _check_mass(float(advantages[row]), weighted, row)
        weights.append(w.tolist())
        reasoning.append(w[start:end])
        per_token.append(weighted.tolist())
    mixed = [len(set(rewards[groups == g])) > 1 for g in np.unique(groups)]
    metrics = {"advantage_abs_mean": float(np.abs(advantages).mean()),
               "mixed_group_fraction": float(np.mean(mixed)), **concentration_metrics(reasoning, advantages)}
    columns = {"advantage": advantages.tolist(), "token_weights": weights, "token_advantages": per_token}
    return StageOutput(extend_table(table, columns, "advantages"), metrics)
