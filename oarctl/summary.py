"""The evaluation summary: evaluate's manifest metrics as a table (markdown) and as JSON.

Reads only the metrics dict (see oarctl/stages/evaluate.py evaluation_metrics), so a summary can be
rebuilt from any eval manifest.
"""
from __future__ import annotations

import json

SETTINGS = ("samples", "temperature", "top_p", "max_new_tokens", "extraction")


def _score_names(metrics: dict) -> list[str]:
    """greedy, avg@n, pass@k..., maj@k... in the order evaluate wrote them."""
    return [key for key in metrics
            if "/" not in key and (key == "greedy_accuracy" or key.startswith(("avg@", "pass@", "maj@")))]


def summary(metrics: dict) -> dict:
    """{"settings", "benchmarks": {name: scores}, "overall": scores or None (one unnamed set)}."""
    names = _score_names(metrics) + ["prompts"]
    benchmarks = metrics.get("benchmarks") or ["heldout"]
    if benchmarks == ["heldout"]:
        return {"settings": {k: metrics.get(k) for k in SETTINGS},
                "benchmarks": {"heldout": {k: metrics[k] for k in names}}, "overall": None}
    return {"settings": {k: metrics.get(k) for k in SETTINGS},
            "benchmarks": {b: {k: metrics[f"{b}/{k}"] for k in names} for b in benchmarks},
            "overall": {k: metrics[k] for k in names}}


def _extraction_note(mode: str | None) -> str:
    """Manifests older than evaluate.extraction were graded strictly."""
    if mode == "lenient":
        return ("Answers extracted leniently (explicit markers, else the last math expression or number, "
                "as public graders read them; one graded wrong or missing is read again by math-verify).")
    return "Answers extracted strictly (explicit markers only: \\boxed, ####, 'the answer is')."


def _cells(scores: dict, names: list[str]) -> list[str]:
    return [str(scores["prompts"])] + [f"{100 * scores[k]:.1f}" for k in names]


def markdown(metrics: dict) -> str:
    """One row per benchmark and an overall row (mean over benchmarks), scores in percent."""
    document = summary(metrics)
    names = _score_names(metrics)
    header = ["benchmark", "prompts"] + ["greedy" if k == "greedy_accuracy" else k for k in names]
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    for benchmark, scores in document["benchmarks"].items():
        lines.append("| " + " | ".join([benchmark] + _cells(scores, names)) + " |")
    if document["overall"] is not None:
        lines.append("| " + " | ".join(["**overall**"] + _cells(document["overall"], names)) + " |")
    settings = document["settings"]
    lines.append("")
    lines.append(f"Scores in %. Greedy: one response per prompt at temperature 0. Sampled: n = {settings['samples']} "
                 f"per prompt at temperature {settings['temperature']}, top_p {settings['top_p']}; "
                 f"at most {settings['max_new_tokens']} new tokens. {_extraction_note(settings['extraction'])} "
                 "pass@k is the unbiased estimator; "
                 "maj@k votes over the first k samples' normalized answers"
                 + ("; overall = mean over benchmarks, prompts = total." if document["overall"] else "."))
    return "\n".join(lines) + "\n"


def as_json(metrics: dict) -> str:
    return json.dumps(summary(metrics), indent=1) + "\n"
