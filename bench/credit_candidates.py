"""Cheap credit candidates of issue 38 on the gradient bench, without adding them to oarctl: the harness that
made docs/results/credit-pays.md's tables.

    python bench/credit_candidates.py POOL/verified.parquet -c configs/chains.yaml --batch-prompts 16 \
        --methods uniform,confidence,surprisal,oar_g~rank -o check.parquet   # + every oarctl gradient-check option

It registers the candidates in the attribution registry of this process only (`install`), then runs
`oarctl gradient-check` with the arguments given. Nothing is written but the bench's own outputs.
- `confidence`: p of the sampled token, `surprisal`: -log p, both from the sampler's `response_logprobs`
  column (no forward pass);
- `excess_surprisal`: max(0, surprisal - entropy of the token's distribution), one no-grad forward (`entropy`'s);
- `METHOD~VARIANT`: METHOD's scores under a reshape override for that row only (VARIANTS: `default`, `rank`
  = reshape.normalize=rank, `q75` = reshape.quantile=0.75). The scores are computed once per METHOD and reused,
  so a variant's `seconds` is not its cost: the first variant of a method pays for all.
Measured results, and what was dropped: docs/results/credit-pays.md. None was kept as an oarctl method.
"""
from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as `python bench/credit_candidates.py` from a clone
    sys.path.insert(0, str(REPO))

from oarctl.attribution.base import on_reasoning  # noqa: E402

VARIANTS = {"default": {}, "rank": {"normalize": "rank"}, "q75": {"quantile": 0.75}}
VARIANT_BASES = ("oar_g", "oar_flow_local", "confidence", "surprisal", "excess_surprisal", "entropy")


def logprob_scores(rollouts, table, transform) -> list[np.ndarray]:
    """transform(log p of each sampled reasoning token), from the table's response_logprobs; NaN elsewhere."""
    scores = []
    for rollout, logprobs in zip(rollouts, table["response_logprobs"].to_pylist()):
        start, end = rollout.segments.reasoning
        values = transform(np.asarray(logprobs[start:end], dtype=np.float64))
        scores.append(on_reasoning(rollout, values.astype(np.float32)))
    return scores


def confidence(rollouts, table, config, context) -> list[np.ndarray]:
    """p of the sampled token: sure tokens score high."""
    return logprob_scores(rollouts, table, np.exp)


def surprisal(rollouts, table, config, context) -> list[np.ndarray]:
    """-log p of the sampled token: forks and slips score high."""
    return logprob_scores(rollouts, table, np.negative)


def excess_surprisal(rollouts, table, config, context) -> list[np.ndarray]:
    """max(0, surprisal - entropy): a draw less likely than a typical one from its distribution."""
    from oarctl.attribution.oar import token_entropy_batch

    model, _ = context.policy.load()
    temperatures = [t if t and t > 0 else 1.0 for t in table["temperature"].to_pylist()]
    entropies = token_entropy_batch(model, [(r.input_ids, r.reasoning) for r in rollouts], temperatures,
                                    config.batch_size, config.max_batch_tokens)
    surprisals = surprisal(rollouts, table, config, context)
    scores = []
    for rollout, values, entropy in zip(rollouts, surprisals, entropies):
        start, end = rollout.segments.reasoning
        scores.append(on_reasoning(rollout, np.maximum(0.0, values[start:end] - entropy.numpy())))
    return scores


def reshape_for(method: str, config):
    """The config a row of `method` is reshaped with: a `~VARIANT` row gets its override."""
    if "~" not in method:
        return config
    variant = method.split("~", 1)[1]
    return dataclasses.replace(config, reshape=dataclasses.replace(config.reshape, **VARIANTS[variant]))


def install(log=print) -> None:
    """Register the candidates and the variants, and make the bench reshape each row by `reshape_for`."""
    from oarctl.attribution import ATTRIBUTION_METHODS
    from oarctl.gradient_check import credit

    for function in (confidence, surprisal, excess_surprisal):
        ATTRIBUTION_METHODS.register(function.__name__)(function)
    cache: dict[tuple, list] = {}
    for base in VARIANT_BASES:
        for variant in VARIANTS:
            def cached(rollouts, table, config, context, base=base):
                key = (base, tuple(r.row for r in rollouts))
                if key not in cache:
                    started = time.perf_counter()
                    cache[key] = ATTRIBUTION_METHODS.get(base)(rollouts, table, config, context)
                    log(f"[credit-candidates] scored {base}: {time.perf_counter() - started:.1f} s")
                return cache[key]
            ATTRIBUTION_METHODS.register(f"{base}~{variant}")(cached)
    original = credit.pool_advantages
    credit.pool_advantages = lambda method, table, rollouts, config, context: original(
        method, table, rollouts, reshape_for(method, config), context)


if __name__ == "__main__":
    from oarctl.cli import app

    install()
    sys.argv = ["oarctl", "gradient-check"] + sys.argv[1:]
    app()
