"""Token attribution methods: one registry, one signature.

Every method maps a verified table (plus the policy in the context, if it needs one) to one raw
score per response token. Reshaping turns scores into weights; `uniform` gives equal scores, so
Bi-Level weights are all 1 and the update is plain GRPO.
"""
from __future__ import annotations

import numpy as np

from oarctl.registry import Registry

ATTRIBUTION_METHODS = Registry("attribution method")


@ATTRIBUTION_METHODS.register("uniform")
def uniform(table, context) -> list[np.ndarray]:
    """Plain GRPO: every token matters equally."""
    return [np.ones(len(ids), dtype=np.float32) for ids in table["response_token_ids"].to_pylist()]


@ATTRIBUTION_METHODS.register("random")
def random(table, context) -> list[np.ndarray]:
    """A control: i.i.d. uniform scores, seeded by (seed, step, row)."""
    lengths = [len(ids) for ids in table["response_token_ids"].to_pylist()]
    return [np.random.default_rng([context.seed, context.step, row]).random(n).astype(np.float32)
            for row, n in enumerate(lengths)]
