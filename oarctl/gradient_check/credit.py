"""The pool's token advantages under each credit method, as the attribute and reshape stages make them,
the disjoint batches the bench scores, and what sampling the pool costs: timed again here on part of it,
or the seconds its sample stage recorded.

Reads a verified table (segmented like the attribute stage does) and the config's attribute and reshape
sections; writes nothing. Attribution goes through the registry (rows chosen by
`attribute.skip_uniform_groups` as the stage chooses them, the others NaN); reshaping is the stage's:
the estimator registry's sequence advantage, then the method's credit rule (`credit_rules.token_credit`:
Bi-Level weights for OAR and the controls, TRL's mask for entropy_mask, KTAE's additive rule). So the
Bi-Level knobs (`--set reshape.quantile=...`) reach the bench as they reach a run. One difference: the
entropy_mask rule thresholds the whole pool's entropies at once, where a run thresholds each step's batch.
"""
from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path

import numpy as np

from oarctl.advantages import ADVANTAGE_ESTIMATORS
from oarctl.attribution import ATTRIBUTION_METHODS
from oarctl.attribution.rows import rows_to_score
from oarctl.credit_rules import token_credit
from oarctl.errors import OarError


def dense_groups(prompt_ids: list[str]) -> np.ndarray:
    """0, 1, 2, ... per prompt_id in order of first appearance (the reshape stage's groups)."""
    index: dict[str, int] = {}
    return np.array([index.setdefault(p, len(index)) for p in prompt_ids], dtype=np.int64)


def token_scores(method: str, table, rollouts, attribute, context) -> list[np.ndarray]:
    """One float32 score per response token of every row (NaN where the method scores nothing)."""
    section = dataclasses.replace(attribute, method=method)
    rows = rows_to_score(table["prompt_id"].to_pylist(), table["reward"].to_pylist(), section.skip_uniform_groups)
    scores = [np.full(r.response_length, np.nan, dtype=np.float32) for r in rollouts]
    if rows:
        scored = ATTRIBUTION_METHODS.get(method)([rollouts[i] for i in rows], table.take(rows), section, context)
        for row, values in zip(rows, scored):
            scores[row] = np.asarray(values, dtype=np.float32)
    return scores


def pool_advantages(method: str, table, rollouts, config, context) -> tuple[list[list[float]], float]:
    """(token advantages of every row, seconds of attribution + reshaping) under `method`."""
    started = time.perf_counter()
    scores = token_scores(method, table, rollouts, config.attribute, context)
    section = config.reshape
    rewards = np.asarray(table["reward"].to_numpy(zero_copy_only=False), dtype=np.float64)
    groups = dense_groups(table["prompt_id"].to_pylist())
    advantages = ADVANTAGE_ESTIMATORS.get(section.estimator)(rewards, groups, scale=section.scale, eps=section.eps)
    spans = [r.segments.reasoning for r in rollouts]
    _, per_token = token_credit(method, list(zip(scores, spans)), advantages, section)
    return [np.asarray(t).tolist() for t in per_token], time.perf_counter() - started


def prompt_batches(prompt_ids: list[str], batch_prompts: int, seed: int, path: Path) -> list[list[list[int]]]:
    """Two halves of disjoint batches of `batch_prompts` whole groups: per half, per batch, its table rows.
    Prompts are dealt in a seeded random order; those that fill no batch are left out."""
    rows_of: dict[str, list[int]] = {}
    for row, prompt_id in enumerate(prompt_ids):
        rows_of.setdefault(prompt_id, []).append(row)
    small = [p for p, rows in rows_of.items() if len(rows) < 2]
    if small:
        raise OarError(f"{path}: prompt_id {small[0]!r} has a group of 1 response; group advantages need >= 2")
    prompts = list(rows_of)
    per_half = len(prompts) // 2 // batch_prompts
    if per_half < 2:
        raise OarError(f"{path}: {len(prompts)} prompts make {per_half} batch(es) of {batch_prompts} prompts per "
                       f"half; the bench needs >= 2 per half (a larger pool, or a smaller --batch-prompts)")
    order = [prompts[i] for i in np.random.default_rng([seed, len(prompts)]).permutation(len(prompts))]
    halves = []
    for half in range(2):
        first = half * per_half * batch_prompts
        batches = [order[first + b * batch_prompts:first + (b + 1) * batch_prompts] for b in range(per_half)]
        halves.append([[row for p in batch for row in rows_of[p]] for batch in batches])
    return halves


def _manifest(path: Path) -> dict | None:
    try:
        return json.loads(path.with_name(path.name + ".manifest.json").read_text())
    except (OSError, ValueError):
        return None


def sample_seconds(verified_path: Path) -> tuple[float, str]:
    """(seconds, where they come from) of the sample stage that made the rollouts this verified file grades:
    the rollouts file named by the verify manifest's input hash, beside it; NaN when there is none."""
    verify = _manifest(verified_path)
    wanted = ((verify or {}).get("key_parts") or {}).get("inputs", {}).get("rollouts")
    if not wanted:
        return math.nan, f"no verify manifest beside {verified_path}"
    for candidate in sorted(verified_path.parent.glob("*.parquet")):
        manifest = _manifest(candidate)
        if manifest and manifest.get("stage") == "sample" and manifest.get("output_sha256") == wanted:
            return float(manifest["wall_seconds"]), f"{candidate}'s sample manifest"
    return math.nan, f"no sample manifest of its rollouts beside {verified_path}"


def timed_sampling(policy, table, prompts: int, sample) -> tuple[float, str]:
    """(seconds, how) sampling the whole pool would take, measured here: the first `prompts` of the pool's
    prompts sampled again with the sample section's options, as many responses each as the pool has, in
    this process under the load the credit was timed under, then scaled by the pool's rows over the rows
    sampled. A ratio of credit to sampling seconds is then measured in one run, not across two."""
    from oarctl.policy.backends import generate

    ids, token_ids = table["prompt_id"].to_pylist(), table["prompt_token_ids"].to_pylist()
    first: dict[str, int] = {}
    for row, prompt in enumerate(ids):
        first.setdefault(prompt, row)
    chosen = list(first)[:prompts]
    group = round(len(ids) / len(first))
    batch = [token_ids[first[prompt]] for prompt in chosen for _ in range(group)]
    started = time.perf_counter()
    generate(policy, batch, temperature=sample.temperature, top_p=sample.top_p, max_new_tokens=sample.max_new_tokens,
             seed=0, batch_size=sample.batch_size)
    seconds = time.perf_counter() - started
    return seconds * len(ids) / len(batch), (f"timed here: {len(chosen)} prompts x {group} sampled again in "
                                             f"{seconds:.1f} s, x {len(ids)}/{len(batch)} rows of the pool")
