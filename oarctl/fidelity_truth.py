"""Fidelity against the ground truth: how well each method's scores find the tokens the answer
depends on, where the rollouts carry `token_truth` (the chains toy world, oarctl/toy/truth.py).

Beside the regeneration oracle's causal tokens (oarctl/fidelity.py), a rollout with labels has a
second reference, known by construction: its label-1 reasoning tokens. Per rollout and method:
- truth recall@K: the share of label-1 tokens among the method's top ceil(K x R) reasoning tokens
  (the same selection as the oracle's recall@K; unknown tokens, label -1, are never hits);
- AUC: the probability that a random label-1 token scores above a random label-0 token (ties count
  one half, NaN scores rank lowest; unknown tokens left out); NaN without both kinds of tokens.
And once per input: how the oracle's causal tokens and the label-1 tokens overlap.

Label-1 tokens come in two classes (`toy/truth.token_classes`): the query's own step, which the box
copies, and the earlier chain, which reaches the answer only through later tokens. A method that
sees only direct effects (teacher-forced OAR) finds the first and not the second, so the AUC is split
by class (each against the free tokens), and the *weights* each class gets from Bi-Level reshaping
are reported beside the scores: the earlier/free weight ratio says whether a method's credit differs
from uniform (1.0) where it matters, whatever its AUC. Methods with their own credit rule get their own
weights (`credit_rules`): entropy_mask its 0/1 mask over the sampled rollouts' reasoning tokens (the
quantile of those tokens, not of a training batch's every token); ktae 1 + k / |A_i|, the factor its
key-token value changes the size of the token's push by (> 1: pushed up more, or down less, than its
sequence), with A_i the GRPO advantage of the rollout in its whole group.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from oarctl.credit_rules import batch_entropy_mask, rule_of
from oarctl.metrics import auc, recall_at_k
from oarctl.reshaping import bilevel_weights, carried_bilevel_weights
from oarctl.toy.truth import QUERY_STEP, token_classes

TRUTH_COLUMNS = ("truth_tokens", "truth_hits", "truth_recall", "truth_auc")
CLASSES = {"query": QUERY_STEP, "earlier": 1, "free": 0}  # the name of each class in columns and tables
CLASS_COLUMNS = ("query_tokens", "earlier_tokens", "free_tokens", "truth_auc_query", "truth_auc_earlier",
                 "weight_query", "weight_earlier", "weight_free")


def reasoning_labels(table, rollouts) -> list[np.ndarray] | None:
    """The token_truth labels over each rollout's reasoning span, or None when the table has none."""
    from oarctl.attribution.ground_truth import reasoning_truth

    return reasoning_truth(rollouts, table, "truth") if "token_truth" in table.column_names else None


def reasoning_classes(table, rollouts, tokenizer) -> list[np.ndarray] | None:
    """Per rollout, the class of each reasoning token (2 query step, 1 earlier chain, 0 free, -1 unknown),
    or None when the table has no token_truth."""
    if "token_truth" not in table.column_names:
        return None
    pairs = zip(table["problem"].to_pylist(), table["response_token_ids"].to_pylist(), rollouts)
    return [np.asarray(token_classes(problem, ids, tokenizer)[r.segments.reasoning[0]:r.segments.reasoning[1]],
                       dtype=np.int8) for problem, ids, r in pairs]


def reshaped(scores: list[np.ndarray], reshape, method: str = "", advantages=None) -> list[np.ndarray]:
    """The Bi-Level weights of each rollout's reasoning scores under a ReshapeConfig; with quantile_carry,
    in the rollouts' order, as the released code's batch loop (and the reshape stage) computes them.
    entropy_mask and ktae: their own weights (module docstring; ktae needs the rollouts' `advantages`)."""
    rule = rule_of(method)
    if rule == "entropy_mask":
        return batch_entropy_mask([np.asarray(s, dtype=np.float32) for s in scores], reshape.top_entropy_quantile)
    if rule == "ktae":
        return [1 + np.nan_to_num(np.asarray(s, dtype=np.float64)) / abs(a) if a else np.ones(len(s))
                for s, a in zip(scores, advantages)]
    spans = [np.asarray(s, dtype=np.float64) for s in scores]
    if reshape.quantile_carry:
        return carried_bilevel_weights(spans, reshape.quantile, reshape.beta, reshape.floor, reshape.preserve_mass,
                                       reshape.normalize)
    return [bilevel_weights(s, reshape.quantile, reshape.beta, reshape.floor, reshape.preserve_mass,
                            reshape.normalize) for s in spans]


def class_values(scores: np.ndarray, classes: np.ndarray, weights: np.ndarray) -> tuple:
    """One rollout's CLASS_COLUMNS: token counts, AUC of each label-1 class against the free tokens, and
    the mean Bi-Level weight of each class (NaN where the rollout has no such token)."""
    counts = [int((classes == c).sum()) for c in CLASSES.values()]
    free = classes == CLASSES["free"]
    aucs = [auc(scores[(classes == c) | free], (classes[(classes == c) | free] == c).astype(np.int8))
            for c in (CLASSES["query"], CLASSES["earlier"])]
    means = [float(weights[classes == c].mean()) if n else math.nan for c, n in zip(CLASSES.values(), counts)]
    return (*counts, *aucs, *means)


def class_columns(classes: list[np.ndarray], scores: dict, ks: Sequence[float], reshape, advantages=None) -> dict:
    """CLASS_COLUMNS in fidelity_columns' row order (rollout, method, K); repeated over K like truth_auc."""
    columns = {name: [] for name in CLASS_COLUMNS}
    weights = {method: reshaped(per_rollout, reshape, method, advantages) for method, per_rollout in scores.items()}
    for index, row_classes in enumerate(classes):
        for method, per_rollout in scores.items():
            values = class_values(per_rollout[index], row_classes, weights[method][index])
            for _ in ks:
                for name, value in zip(CLASS_COLUMNS, values):
                    columns[name].append(value)
    return columns


def class_summary(scores: list[np.ndarray], classes: list[np.ndarray], reshape, method: str = "",
                  advantages=None) -> dict:
    """Over rollouts: mean AUC (all label 1, query step, earlier chain, each against free) and the mean
    weight of every token of each class, pooled, with the earlier/free ratio."""
    weights = reshaped(scores, reshape, method, advantages)
    rows = [class_values(s, c, w) for s, c, w in zip(scores, classes, weights)]
    labels = [np.where(c > 0, 1, c) for c in classes]
    summary = {"auc": _nanmean([auc(s, l) for s, l in zip(scores, labels)]),
               "auc_query": _nanmean([r[3] for r in rows]), "auc_earlier": _nanmean([r[4] for r in rows])}
    for offset, name in enumerate(CLASSES):
        tokens = sum(r[offset] for r in rows)
        mass = sum(r[offset] * r[5 + offset] for r in rows if r[offset])
        summary[f"weight_{name}"] = mass / tokens if tokens else math.nan
    summary["earlier_free_ratio"] = summary["weight_earlier"] / summary["weight_free"]
    return summary


def _nanmean(values) -> float:
    values = [v for v in values if not math.isnan(v)]
    return float(np.mean(values)) if values else math.nan


def class_table(scores: dict, classes: list[np.ndarray], reshapes: dict, advantages=None) -> list[str]:
    """Markdown: per method and reshape, the class AUCs and the mean weight of each class."""
    lines = ["", "## Credit by class: the query's own step, the earlier chain, free tokens", "",
             "AUC of each label-1 class against the free tokens (mean over rollouts); mean Bi-Level weight of "
             "each class's tokens (pooled) under each reshape; earlier/free = 1.00 means uniform credit where "
             "it matters.", "",
             "| method | reshape | AUC | AUC query step | AUC earlier chain | weight query | weight earlier | "
             "weight free | earlier / free |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for method, per_rollout in scores.items():
        own = rule_of(method) != "bilevel"  # its weights do not depend on the Bi-Level variants
        variants = [(f"its own rule ({rule_of(method)})", next(iter(reshapes.values())))] if own else reshapes.items()
        for name, reshape in variants:
            s = class_summary(per_rollout, classes, reshape, method, advantages)
            cells = [s["auc"], s["auc_query"], s["auc_earlier"], s["weight_query"], s["weight_earlier"],
                     s["weight_free"], s["earlier_free_ratio"]]
            lines.append(f"| {method} | {name} | " + " | ".join("n/a" if math.isnan(v) else f"{v:.3f}"
                                                               for v in cells) + " |")
    return lines


def reshape_variants(reshape) -> dict:
    """The configured reshape and, beside it, the other score normalisations at the same knobs."""
    import dataclasses

    from oarctl.reshaping import SCORE_NORMALIZERS

    variants = {f"configured ({reshape.normalize}{', quantile_carry' if reshape.quantile_carry else ''})": reshape}
    for name in SCORE_NORMALIZERS.names():
        if name != reshape.normalize:
            variants[f"normalize={name}"] = dataclasses.replace(reshape, normalize=name)
    if not reshape.quantile_carry:  # the released code's batch loop: what it does to the contrast
        variants["quantile_carry (released code)"] = dataclasses.replace(reshape, quantile_carry=True)
    return variants


def truth_columns(labels: list[np.ndarray], scores: dict, ks: Sequence[float]) -> dict:
    """The truth columns of the fidelity artifact, rows in fidelity_columns' order (rollout, method, K)."""
    columns = {name: [] for name in TRUTH_COLUMNS}
    for index, row_labels in enumerate(labels):
        depends = row_labels == 1
        for per_rollout in scores.values():
            area = auc(per_rollout[index], row_labels)
            for k in ks:
                _, hits, recall = recall_at_k(per_rollout[index], depends, k)
                for name, value in zip(TRUTH_COLUMNS, (int(depends.sum()), hits, recall, area)):
                    columns[name].append(value)
    return columns


def oracle_agreement(causal: list[np.ndarray], labels: list[np.ndarray]) -> str:
    """One line: how the regeneration oracle's causal tokens and the label-1 tokens overlap."""
    both = sum(int((mask & (truth == 1)).sum()) for mask, truth in zip(causal, labels))
    flagged = sum(int(mask.sum()) for mask in causal)
    depends = sum(int((truth == 1).sum()) for truth in labels)
    known = sum(int((truth >= 0).sum()) for truth in labels)
    share = lambda part, whole: f"{part / whole:.1%}" if whole else "n/a"  # noqa: E731
    return (f"- ground truth (token_truth): {depends} of {known} labelled reasoning tokens are label 1; "
            f"{share(both, flagged)} of the oracle's causal tokens are label 1, {share(both, depends)} of the "
            f"label-1 tokens are causal")


def truth_report(result, methods: Sequence[str], ks: Sequence[float]) -> list[str]:
    """The markdown table against the ground truth: mean AUC and mean truth recall@K per method."""
    frame = result.to_pandas()
    columns = [f"@{100 * k:g}%" for k in ks]
    lines = ["", "## Against the ground truth (label-1 tokens of token_truth)", "",
             "| method | AUC | " + " | ".join(columns) + " |", "|---|---:|" + "---:|" * len(columns)]
    for method in methods:
        rows = frame[(frame["method"] == method) & (frame["truth_tokens"] > 0)]
        area = rows["truth_auc"].dropna().mean() if len(rows) else math.nan
        recalls = [rows[np.isclose(rows["k_fraction"], k)]["truth_recall"].mean() if len(rows) else math.nan
                   for k in ks]
        cells = ["n/a" if math.isnan(v) else f"{v:.3f}" for v in [area, *recalls]]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return lines
