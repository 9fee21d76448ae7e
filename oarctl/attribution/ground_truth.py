"""`truth`: token scores from the ground-truth credit labels of the chains toy world (a ceiling).

Reads the `token_truth` column that the sample stage writes for chains rollouts
(oarctl/toy/truth.py); no model. Label 1 (the answer depends on the token) scores 1, label 0 (a free
choice or fixed punctuation) scores 0, and -1 (unreadable text, whose role is unknown) scores 1:
such text is where a response went wrong, so it keeps full credit rather than being suppressed.

With the default Bi-Level reshaping (q = 0.25), two-valued scores give label-1 tokens twice the
weight of label-0 tokens whenever more than a quarter of the reasoning is label 0 (tau is then 0,
nothing is suppressed, the top scores get 1 + beta); a quantile above the label-0 share (e.g.
`reshape.quantile: 0.75`) suppresses label 0 to `reshape.floor` instead. See docs/artifacts.md.
"""
from __future__ import annotations

import numpy as np

from oarctl.attribution import ATTRIBUTION_METHODS, on_reasoning
from oarctl.errors import InputError

UNKNOWN_SCORE = 1.0


def label_scores(labels) -> np.ndarray:
    """Scores of a run of labels: 1 -> 1, 0 -> 0, -1 (unknown) -> UNKNOWN_SCORE."""
    labels = np.asarray(labels, dtype=np.int8)
    return np.where(labels < 0, UNKNOWN_SCORE, labels).astype(np.float32)


@ATTRIBUTION_METHODS.register("truth")
def truth(rollouts, table, config, context) -> list[np.ndarray]:
    """The labels over each reasoning span (NaN elsewhere, as every method)."""
    if "token_truth" not in table.column_names:
        raise InputError("attribute.method truth needs the token_truth column, which only rollouts of the "
                         "chains toy world carry (data.toy_family: chains)")
    labels = table["token_truth"].to_pylist()
    scores = []
    for rollout, row_labels in zip(rollouts, labels):
        start, end = rollout.segments.reasoning
        scores.append(on_reasoning(rollout, label_scores(row_labels[start:end])))
    return scores
