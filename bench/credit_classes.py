"""Which tokens does a credit method's weight go to, and where does the policy gradient live? Per-token
Bi-Level weights by the chains world's token classes (issue 38: why oar_flow_local stops helping once the
policy has trained; the answer is in docs/results/credit-pays.md).

    python bench/credit_classes.py POOL/verified.parquet -c configs/chains.yaml [--policy DIR] [--prompts 40]

Reads a verified chains pool (it needs `token_truth`, `response_logprobs`) and the policy that sampled it;
scores the first --prompts prompts' mixed-reward groups (the ones with a gradient) with `oar_flow_local`,
`oar_g` and `truth` through the registry and the config's attribute section. The weights come from the config's
reshape section and `normalize=rank`. Prints markdown tables; writes nothing. Token classes come from
oarctl/toy/truth.py's reading of each response: the parts of steps on the answer's path (`chain:`; the
query's own step `query:`), of `distractor:` steps, filler words, restatements (`question`). A token takes the
class of its first non-space character. 1 - p of the sampled token stands in for the size of its gradient
(d log p / d logits = onehot - p).
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as `python bench/credit_classes.py` from a clone
    sys.path.insert(0, str(REPO))

METHODS = ("oar_flow_local", "oar_g", "truth")
PART = {"name": "name", "left": "operand", "right": "operand", "op": "op", "value": "result"}
UNCERTAIN = 0.2  # 1 - p above this: a fork or a slip, the tokens that carry the gradient


def character_classes(problem, text: str) -> list[str]:
    """One class name per character of a chains response (see the module docstring)."""
    from oarctl.toy.truth import answer_path, parse_response

    segments = parse_response(text)
    path = answer_path(problem, segments)
    query = path[0] if path and segments[path[0]].name == problem.query else None
    classes = ["space"] * len(text)
    for index, segment in enumerate(segments):
        if segment.kind == "step":
            role = "query" if index == query else "chain" if index in path else "distractor"
            classes[segment.start:segment.end] = [f"{role}:punct"] * (segment.end - segment.start)
            for group, part in PART.items():
                start, end = segment.match.span(group)
                classes[start:end] = [f"{role}:{part}"] * (end - start)
        elif segment.kind != "space":
            classes[segment.start:segment.end] = [segment.kind] * (segment.end - segment.start)
    return classes


def token_classes(problem_text: str, ids: list[int], tokenizer) -> list[str]:
    from oarctl.toy.chains import parse_problem
    from oarctl.toy.truth import _readable_text

    text, offsets, special = _readable_text(tokenizer, list(ids))
    characters = character_classes(parse_problem(problem_text), text)
    out = []
    for i in range(len(ids)):
        named = [] if i in special else [c for c in characters[offsets[i]:offsets[i + 1]] if c != "space"]
        out.append(named[0] if named else "space")
    return out


def score_pool(verified: Path, config, policy_path: Path, prompts: int) -> list[dict]:
    """Per mixed-group response: classes, labels, 1 - p and each method's weights (default and rank)."""
    from oarctl.artifacts import read_artifact
    from oarctl.attribution.base import segment_rows
    from oarctl.contract import Policy, StageContext
    from oarctl.gradient_check.credit import token_scores
    from oarctl.reshaping import bilevel_weights

    table = read_artifact(verified, "verified")
    first = set(list(dict.fromkeys(table["prompt_id"].to_pylist()))[:prompts])
    table = table.take([i for i, p in enumerate(table["prompt_id"].to_pylist()) if p in first])
    rewards: dict[str, set] = {}
    for prompt, reward in zip(table["prompt_id"].to_pylist(), table["reward"].to_pylist()):
        rewards.setdefault(prompt, set()).add(reward)
    policy = Policy(policy_path, config.policy.device)
    _, tokenizer = policy.load()
    rollouts = segment_rows(table, tokenizer)
    context = StageContext(seed=config.run.seed, step=0, policy=policy, progress=False)
    attribute = dataclasses.replace(config.attribute, skip_uniform_groups=True)
    scores = {m: token_scores(m, table, rollouts, attribute, context) for m in METHODS}
    rows = table.select(["prompt_id", "problem", "response_token_ids", "response_logprobs", "token_truth"]).to_pylist()
    records = []
    for i, (row, rollout) in enumerate(zip(rows, rollouts)):
        start, end = rollout.segments.reasoning
        if len(rewards[row["prompt_id"]]) < 2 or end - start < 2:
            continue
        weights = {}
        for m in METHODS:
            for name, normalize in (("default", config.reshape.normalize), ("rank", "rank")):
                shape = config.reshape
                weights[m, name] = bilevel_weights(scores[m][i][start:end], shape.quantile, shape.beta, shape.floor,
                                                   shape.preserve_mass, normalize)
        records.append({"classes": token_classes(row["problem"], row["response_token_ids"], tokenizer)[start:end],
                        "labels": np.asarray(row["token_truth"][start:end]), "weights": weights,
                        "grad": 1.0 - np.exp(np.asarray(row["response_logprobs"][start:end], dtype=np.float64))})
    return records


def _flat(records, key) -> np.ndarray:
    return np.concatenate([key(r) for r in records])


def _correlation(a: np.ndarray, b: np.ndarray) -> str:
    """Pearson's r, or a dash where either side is constant (uniform weights have no correlation)."""
    return "—" if a.std() == 0 or b.std() == 0 else f"{np.corrcoef(a, b)[0, 1]:+.2f}"


def report(records: list[dict]) -> str:
    classes, grad = _flat(records, lambda r: np.asarray(r["classes"])), _flat(records, lambda r: r["grad"])
    labels, uncertain = _flat(records, lambda r: r["labels"]), grad > UNCERTAIN
    weights = {key: _flat(records, lambda r, key=key: r["weights"][key]) for key in records[0]["weights"]}
    lines = [f"{len(records)} responses of mixed groups, {classes.size} reasoning tokens, "
             f"{uncertain.sum()} sampled with p < {1 - UNCERTAIN:.1f}", "",
             "| class | tokens | 1 - p mass | " + " | ".join(f"{m} w (default / rank)" for m in METHODS)
             + " | on p < 0.8 tokens: " + " | ".join(METHODS) + " |", "|---|---:|---:|" + "---:|" * 2 * len(METHODS)]
    for name in sorted(set(classes)):
        mask = classes == name
        if mask.mean() < 0.005:
            continue
        cells = [f"{weights[m, 'default'][mask].mean():.2f} / {weights[m, 'rank'][mask].mean():.2f}" for m in METHODS]
        forks = mask & uncertain
        cells += [f"{weights[m, 'default'][forks].mean():.2f}" if forks.sum() >= 20 else "—" for m in METHODS]
        mass = grad[mask].sum() / grad.sum()
        lines.append(f"| {name} | {mask.mean():.3f} | {mass:.3f} | " + " | ".join(cells) + " |")
    lines += ["", "| method | reshape | w label 1 / w label 0 | label 1's share of w x (1 - p) "
              "| corr(w, truth's w), p < 0.8 |",
              "|---|---|---:|---:|---:|"]
    lines.append(f"| uniform | — | 1.00 | {grad[labels == 1].sum() / grad.sum():.3f} | — |")
    for (m, name), w in weights.items():
        truth = weights["truth", "default"]
        lines.append(f"| {m} | {name} | {w[labels == 1].mean() / w[labels == 0].mean():.2f} | "
                     f"{(w * grad)[labels == 1].sum() / (w * grad).sum():.3f} | "
                     f"{_correlation(w[uncertain], truth[uncertain])} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from oarctl.config import load_config
    from oarctl.errors import OarError
    from oarctl.policy.paths import resolve_policy_path

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("verified", type=Path)
    parser.add_argument("-c", "--config", type=Path, default=None)
    parser.add_argument("--policy", type=Path, default=None, help="default: policy.path of the config")
    parser.add_argument("--prompts", type=int, default=40, help="the first N prompts' groups of the pool")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config)
        if config.policy.threads:
            import torch
            torch.set_num_threads(config.policy.threads)
        policy = args.policy or resolve_policy_path(config.policy.path)
        records = score_pool(args.verified, config, policy, args.prompts)
        if not records:
            raise OarError(f"{args.verified}: no mixed-reward group among the first {args.prompts} prompts")
    except OarError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(report(records))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
