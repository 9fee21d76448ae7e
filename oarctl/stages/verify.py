"""verify: rollouts -> verified (extracted answer and 0/1 reward per response).

The checker is chosen by `verify.method`; `boxed` compares the last \\boxed{} with the gold text.
"""
from __future__ import annotations

import numpy as np

from oarctl.artifacts import extend_table
from oarctl.runner import StageContext, StageOutput
from oarctl.verify import CHECKERS

VERSION = "1"


def run(inputs, config, context: StageContext) -> StageOutput:
    rollouts = inputs["rollouts"]
    check = CHECKERS.get(config.method)
    verdicts = [check(text, gold) for text, gold in
                zip(rollouts["response_text"].to_pylist(), rollouts["answer"].to_pylist())]
    extracted = [answer for answer, _ in verdicts]
    rewards = [reward for _, reward in verdicts]
    metrics = {"reward_mean": float(np.mean(rewards)),
               "no_answer_fraction": float(np.mean([a is None for a in extracted]))}
    return StageOutput(extend_table(rollouts, {"extracted_answer": extracted, "reward": rewards}, "verified"),
                       metrics)
