"""The control methods: `uniform` (plain GRPO) and `random`.

`uniform` scores every reasoning token the same, so Bi-Level weights are all 1 and the update is
plain GRPO; `random` gives i.i.d. scores, the baseline any informed method must beat.
"""
from __future__ import annotations

import numpy as np

from oarctl.attribution.base import ATTRIBUTION_METHODS, on_reasoning


@ATTRIBUTION_METHODS.register("uniform")
def uniform(rollouts, table, config, context) -> list[np.ndarray]:
    """Plain GRPO: every reasoning token matters equally."""
    return [on_reasoning(r, 1.0) for r in rollouts]


@ATTRIBUTION_METHODS.register("random")
def random(rollouts, table, config, context) -> list[np.ndarray]:
    """A control: i.i.d. uniform scores, seeded by (seed, step, row)."""
    return [on_reasoning(r, np.random.default_rng([context.seed, context.step, r.row]).random(
        r.segments.reasoning[1] - r.segments.reasoning[0])) for r in rollouts]
