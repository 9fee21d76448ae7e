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

from oarctl.attribution.base import ATTRIBUTION_METHODS, on_reasoning
from oarctl.errors import InputError

UNKNOWN_SCORE = 1.0


def label_scores(labels) -> np.ndarray:
    """Scores of a run of labels: 1 -> 1, 0 -> 0, -1 (unknown) -> UNKNOWN_SCORE."""
    labels = np.asarray(labels, dtype=np.int8)
    return np.where(labels < 0, UNKNOWN_SCORE, labels).astype(np.float32)


def reasoning_truth(rollouts, table, method: str) -> list[np.ndarray]:
    """The token_truth labels over each rollout's reasoning span."""
    if "token_truth" not in table.column_names:
        raise InputError(f"attribute.method {method} needs the token_truth column, which only rollouts of the "
                         "chains toy world carry (data.toy_family: chains)")
    return [np.asarray(labels[r.segments.reasoning[0]:r.segments.reasoning[1]], dtype=np.int8)
            for r, labels in zip(rollouts, table["token_truth"].to_pylist())]


@ATTRIBUTION_METHODS.register("truth")
def truth(rollouts, table, config, context) -> list[np.ndarray]:
    """The labels over each reasoning span (NaN elsewhere, as every method)."""
    return [on_reasoning(r, label_scores(labels)) for r, labels in zip(rollouts, reasoning_truth(rollouts, table, "truth"))]


@ATTRIBUTION_METHODS.register("truth_shuffled")
def truth_shuffled(rollouts, table, config, context) -> list[np.ndarray]:
    """A control: truth's scores permuted within each reasoning span (seeded by seed, step, row): the same
    weight histogram as truth, no information about which tokens matter."""
    scores = []
    for r, labels in zip(rollouts, reasoning_truth(rollouts, table, "truth_shuffled")):
        rng = np.random.default_rng([context.seed, context.step, r.row])
        scores.append(on_reasoning(r, rng.permutation(label_scores(labels))))
    return scores


@ATTRIBUTION_METHODS.register("truth_last")
def truth_last(rollouts, table, config, context) -> list[np.ndarray]:
    """A control: label 1 only on the query's own step (the step the box copies), the earlier chain 0:
    the most a method that sees only direct effects on the answer can know. Unknown text scores as in truth."""
    # imported here: oarctl.toy.truth reads the segments module of this package (an import cycle at load)
    from oarctl.toy.truth import QUERY_STEP, token_classes

    reasoning_truth(rollouts, table, "truth_last")  # the same error without chains rollouts
    tokenizer = context.policy.load_tokenizer()
    scores = []
    for r, problem, ids in zip(rollouts, table["problem"].to_pylist(), table["response_token_ids"].to_pylist()):
        classes = np.asarray(token_classes(problem, ids, tokenizer)[r.segments.reasoning[0]:r.segments.reasoning[1]])
        last = np.where(classes == QUERY_STEP, 1, np.where(classes < 0, -1, 0))
        scores.append(on_reasoning(r, label_scores(last)))
    return scores
