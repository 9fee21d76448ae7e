"""attribute: verified rollouts (+ policy) -> attributions (a raw score per response token)."""
from __future__ import annotations

from oarctl.artifacts import extend_table
from oarctl.attribution import ATTRIBUTION_METHODS
from oarctl.runner import StageContext, StageOutput

VERSION = "1"


def run(inputs, config, context: StageContext) -> StageOutput:
    verified = inputs["verified"]
    scores = ATTRIBUTION_METHODS.get(config.method)(verified, context)
    columns = {"attribution_method": [config.method] * verified.num_rows,
               "token_scores": [s.tolist() for s in scores]}
    return StageOutput(extend_table(verified, columns, "attributions"), {"method": config.method})
