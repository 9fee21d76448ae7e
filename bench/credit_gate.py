"""The credit gate (docs/results.md): every attribution method against the chains world's ground truth,
on rollouts the chains policy sampled itself, with the attribute time of each method, in one run.

    python bench/credit_gate.py                       # ~10 min on 1 core; writes runs/gate/gate.md
    python bench/credit_gate.py --sample 16 --methods uniform,truth,oar_flow   # a quick look

1. Samples `--prompts` training problems x 8 with the embedded chains policy (`oarctl toy prompts`,
   `oarctl sample`, `oarctl verify`: cached stages, as a user runs them).
2. Draws `--sample` rollouts (seeded) and scores them with each method exactly as the attribute
   stage does (the registry entry, the configured attribute section), timing each call.
3. Prints, per method: seconds, AUC against the labels, AUC of the query's own step and of the
   earlier chain (each against the free tokens), and the mean Bi-Level weight of each class with the
   earlier/free ratio, under the paper's normalisation (log1p + min-max) and under `rank`.
4. For oar_flow, the propagation rules side by side on the same perturbations (one engine pass).

The gate of issue 27: oar_flow (or its span variant) at AUC >= 0.75 and an earlier/free weight
ratio >= 1.4 at no more than 1.5x oar_p_span's attribute time.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
METHODS = "uniform,random,truth,truth_shuffled,truth_last,oar_g,oar_p,oar_p_span,oar_flow,oar_flow_span,oar_flow_local"


def oarctl(*args: str) -> None:
    subprocess.run([str(Path(sys.executable).parent / "oarctl"), *args], check=True, cwd=ROOT)


def rollouts_file(out: Path, config: str, prompts: int, sets: list[str]) -> Path:
    """Sampled and verified rollouts of the configured policy (cached stages: rerunning costs nothing)."""
    out.mkdir(parents=True, exist_ok=True)
    options = ["-c", config, *[a for s in sets for a in ("--set", s)]]
    oarctl("toy", "prompts", "-o", str(out / "prompts.parquet"), "-n", str(prompts), *options)
    oarctl("sample", str(out / "prompts.parquet"), "-o", str(out / "rollouts.parquet"), "--step", "0", *options)
    oarctl("verify", str(out / "rollouts.parquet"), "-o", str(out / "verified.parquet"), *options)
    return out / "verified.parquet"


def scored(methods: list[str], rollouts, table, config, context, verified=None, rows=()) -> tuple[dict, dict]:
    """{method: reasoning scores per rollout}, {method: seconds of the registry call}; a method of group
    statistics (ktae) scores the sampled rollouts within their whole groups of `verified`, as fidelity does."""
    from oarctl.attribution import ATTRIBUTION_METHODS
    from oarctl.fidelity import GROUP_METHODS, group_scores

    scores, seconds = {}, {}
    context.policy.load()  # loading is not a method's time
    for name in methods:
        started = time.perf_counter()
        if name in GROUP_METHODS and verified is not None:
            full = group_scores(name, verified, rows, config, context)
        else:
            full = ATTRIBUTION_METHODS.get(name)(rollouts, table, config.attribute, context)
        seconds[name] = time.perf_counter() - started
        scores[name] = [row[r.segments.reasoning[0]:r.segments.reasoning[1]] for row, r in zip(full, rollouts)]
        print(f"[gate] {name}: {seconds[name]:.1f} s", flush=True)
    return scores, seconds


def rule_scores(rollouts, config, context, span: bool) -> dict:
    """oar_flow's credit under every propagation rule, from one pass of the engine."""
    from oarctl.attribution.flow import FLOW_RULES, flow_method_scores

    per_rule = flow_method_scores(rollouts, config.attribute, context, span, tuple(FLOW_RULES.names()))
    name = "oar_flow_span" if span else "oar_flow"
    return {f"{name} ({rule})": scores for rule, scores in per_rule.items()}


def table_lines(scores: dict, seconds: dict, classes, reshape, advantages=None) -> list[str]:
    """Per method its row; entropy_mask and ktae weigh by their own rule (the same in both weight columns)."""
    from oarctl.fidelity_truth import class_summary

    rank = dataclasses.replace(reshape, normalize="rank")
    paper = dataclasses.replace(reshape, normalize="log1p_minmax")
    lines = ["| method | attribute s | AUC | AUC query step | AUC earlier chain | earlier/free weight (log1p+min-max) "
             "| earlier/free weight (rank) | weight query / earlier / free (rank) |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    for name, per_rollout in scores.items():
        method = name.split(" ")[0]
        s = class_summary(per_rollout, classes, paper, method, advantages)
        r = class_summary(per_rollout, classes, rank, method, advantages)
        time_cell = f"{seconds[name]:.1f}" if name in seconds else "(same pass)"
        lines.append(f"| {name} | {time_cell} | {s['auc']:.3f} | {s['auc_query']:.3f} | {s['auc_earlier']:.3f} | "
                     f"{s['earlier_free_ratio']:.2f} | {r['earlier_free_ratio']:.2f} | "
                     f"{r['weight_query']:.2f} / {r['weight_earlier']:.2f} / {r['weight_free']:.2f} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/gate")
    parser.add_argument("-c", "--config", default="configs/chains.yaml")
    parser.add_argument("--prompts", type=int, default=16, help="training problems sampled (x 8 samples)")
    parser.add_argument("--sample", type=int, default=64, help="rollouts scored")
    parser.add_argument("--methods", default=METHODS)
    parser.add_argument("--set", action="append", default=[], help="config override, section.key=value")
    args = parser.parse_args()

    import torch

    from oarctl.artifacts import read_artifact
    from oarctl.attribution.oar import segment_rows
    from oarctl.config import load_config
    from oarctl.fidelity import group_advantages, sample_rows
    from oarctl.fidelity_truth import reasoning_classes
    from oarctl.policy.paths import resolve_policy_path
    from oarctl.runner import Policy, StageContext

    torch.set_num_threads(1)
    out = ROOT / args.out
    config = load_config(ROOT / args.config, args.set)
    verified = read_artifact(rollouts_file(out, args.config, args.prompts, args.set), "verified")
    rows = sample_rows(verified.num_rows, args.sample, config.run.seed)
    table = verified.take(rows)
    policy = Policy(resolve_policy_path(config.policy.path))
    context = StageContext(seed=config.run.seed, step=0, policy=policy)
    rollouts = segment_rows(table, policy.load_tokenizer())
    classes = reasoning_classes(table, rollouts, policy.load_tokenizer())
    methods = args.methods.split(",")
    scores, seconds = scored(methods, rollouts, table, config, context, verified, rows)
    for name in ("oar_flow", "oar_flow_span"):
        if name in methods:
            scores.update(rule_scores(rollouts, config, context, span=name == "oar_flow_span"))
    tokens = sum(c.size for c in classes)
    header = [f"# Credit gate: {len(rollouts)} sampled rollouts of `{config.policy.path}`, {tokens} reasoning tokens "
              f"(query step {sum(int((c == 2).sum()) for c in classes)}, earlier chain "
              f"{sum(int((c == 1).sum()) for c in classes)}, free {sum(int((c == 0).sum()) for c in classes)}); "
              f"oar_p_mode {config.attribute.oar_p_mode}, span_tokens {config.attribute.span_tokens}, "
              f"chunk_size {config.attribute.chunk_size}, reshape q {config.reshape.quantile} beta "
              f"{config.reshape.beta} floor {config.reshape.floor}; 1 torch thread", ""]
    advantages = group_advantages(verified, rows, config.reshape)  # ktae's class weights: 1 + k / |A|
    report = "\n".join(header + table_lines(scores, seconds, classes, config.reshape, advantages)) + "\n"
    (out / "gate.md").write_text(report)
    print(report)


if __name__ == "__main__":
    main()
