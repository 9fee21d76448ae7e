"""Token attribution methods: one registry, one signature.

Every method maps segmented rollouts (`oar.Rollout`: spans and the attributed sequence), the
verified table, the `attribute` config section and the stage context (seed, step, policy) to one
raw score per response token: a score on reasoning tokens, NaN on the others (conclude, answer,
closing brace, eos), which keep the plain GRPO advantage. `uniform` scores every reasoning token
the same, so Bi-Level weights are all 1 and the update is plain GRPO.
"""
from __future__ import annotations

import numpy as np

from oarctl.registry import Registry

ATTRIBUTION_METHODS = Registry("attribution method")


def on_reasoning(rollout, values) -> np.ndarray:
    """Scores in place on the reasoning tokens, NaN on the others (they keep the plain advantage)."""
    full = np.full(rollout.response_length, np.nan, dtype=np.float32)
    start, end = rollout.segments.reasoning
    full[start:end] = values
    return full


@ATTRIBUTION_METHODS.register("uniform")
def uniform(rollouts, table, config, context) -> list[np.ndarray]:
    """Plain GRPO: every reasoning token matters equally."""
    return [on_reasoning(r, 1.0) for r in rollouts]


@ATTRIBUTION_METHODS.register("random")
def random(rollouts, table, config, context) -> list[np.ndarray]:
    """A control: i.i.d. uniform scores, seeded by (seed, step, row)."""
    return [on_reasoning(r, np.random.default_rng([context.seed, context.step, r.row]).random(
        r.segments.reasoning[1] - r.segments.reasoning[0])) for r in rollouts]


from oarctl.attribution import oar  # noqa: E402  (registers oar_p, oar_g, entropy)
from oarctl.attribution import oar_p_cheap  # noqa: E402,F401  (registers oar_p_span, oar_p_screened)
from oarctl.attribution import flow  # noqa: E402,F401  (registers oar_flow, oar_flow_span)
from oarctl.attribution import ground_truth  # noqa: E402,F401  (registers truth, truth_shuffled, truth_last)
from oarctl.attribution import mc_value  # noqa: E402,F401  (registers mc_value)
from oarctl.attribution.oar import oar_g, oar_g_batch, oar_p, oar_p_batch  # noqa: E402,F401  (the public API)
