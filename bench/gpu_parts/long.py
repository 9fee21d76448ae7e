"""Part long of bench/gpu_check.py: bf16 attribution of long synthetic responses by every method, each
cheap method's agreement with exact OAR-P, then reshape and the update. Its knobs are read by
bench/scale.py --measured, so this module imports no torch at module level."""
from __future__ import annotations

from pathlib import Path

from bench.gpu_parts.common import base_overrides, timed_stage

LONG_BUDGET, LONG_CHUNK = 65_536, 64  # part long's attribute.max_batch_tokens and chunk_size defaults


def _long_rollouts(args, path: Path, tokenizer) -> Path:
    """Two groups of `--group` responses of `--long-tokens` toy tokens each (reasoning of random sums,
    then `\\boxed{N}`), half of each group correct, so every group has mixed rewards."""
    import random

    from oarctl.artifacts import make_table, write_parquet

    generator, columns = random.Random(0), {name: [] for name in (
        "prompt_id", "problem", "answer", "sample_index", "prompt_token_ids", "response_token_ids",
        "response_logprobs", "response_text", "finish_reason", "temperature")}
    for row in range(2 * args.group):
        problem = f"Compute {row // args.group + 2}+3."
        reasoning = ""
        while len(reasoning) < args.long_tokens - 16:
            a, b = generator.randrange(100), generator.randrange(100)
            reasoning += f"{a}+{b}={a + b}. "
        text = reasoning[:args.long_tokens - 16] + f" \\boxed{{{5 + row // args.group + row % 2}}}"
        ids = tokenizer.encode(text, add_special_tokens=False)
        for name, value in (("prompt_id", f"p{row // args.group}"), ("problem", problem),
                            ("answer", str(5 + row // args.group)), ("sample_index", row % args.group),
                            ("prompt_token_ids", tokenizer.encode(problem, add_special_tokens=False)),
                            ("response_token_ids", ids), ("response_logprobs", [-1.0] * len(ids)),
                            ("response_text", text), ("finish_reason", "stop"), ("temperature", 1.0)):
            columns[name].append(value)
    write_parquet(make_table(columns, "rollouts"), path)
    return path


LONG_METHODS = {  # method: extra overrides
    "oar_g": ["attribute.gradient_checkpointing=true"],
    "oar_p_span": [],
    "oar_p_screened": [],
    "oar_flow_local": [],  # not a cheap OAR-P: its agreement row says how far its credit is from OAR-P's
}


def long_attribute_knobs(budget: int, chunk: int) -> list[str]:
    """The attribute settings of part long (bench/scale.py --measured predicts with the same)."""
    return ["attribute.dtype=bfloat16", f"attribute.max_batch_tokens={budget}", f"attribute.chunk_size={chunk}",
            "attribute.batch_size=64"]


def run_long(args, work: Path, policy: Path) -> list:
    """Part long: bf16 attribution of long responses by every method, then reshape and the update."""
    import pyarrow.parquet as pq
    from transformers import AutoTokenizer

    from oarctl.artifacts import write_parquet
    from oarctl.config import load_config

    overrides = base_overrides(args, policy) + long_attribute_knobs(args.budget, args.chunk) + [
        f"update.micro_batch_tokens={4 * (args.long_tokens + 32)}",
        f"update.sum_norm_length={args.long_tokens}", "update.micro_batch_size=64", "update.gradient_checkpointing=true"]
    rows: list = []
    rollouts = _long_rollouts(args, work / "long_rollouts.parquet", AutoTokenizer.from_pretrained(policy))
    config = load_config(None, overrides)
    verified = timed_stage("verify", config, {"rollouts": rollouts}, work / "long_verified.parquet", None, rows)
    responses = pq.read_table(verified).num_rows
    for method, extra in LONG_METHODS.items():
        config = load_config(None, overrides + [f"attribute.method={method}", *extra])
        attributions = timed_stage("attribute", config, {"verified": verified},
                                   work / f"long_attribute_{method}.parquet", policy, rows)
        rows[-1][3]["responses"] = responses
    few = work / "long_verified_few.parquet"
    write_parquet(pq.read_table(verified).take(list(range(args.exact_rows))), few)
    config = load_config(None, overrides + ["attribute.method=oar_p"])
    exact = timed_stage("attribute", config, {"verified": few}, work / "long_attribute_oar_p.parquet", policy, rows)
    rows[-1][3]["responses"] = args.exact_rows
    _agreement(exact, [work / f"long_attribute_{method}.parquet" for method in LONG_METHODS], rows)
    advantages = timed_stage("reshape", config, {"attributions": attributions}, work / "long_advantages.parquet", None,
                             rows)
    timed_stage("update", config, {"advantages": advantages}, work / "long_policy_next", policy, rows)
    rows[-1][3]["responses"] = responses
    return [(name if name.startswith("long") else f"long_{name}", *rest) for name, *rest in rows]


def _agreement(exact: Path, cheap: list[Path], rows: list) -> None:
    """Each cheap method against exact OAR-P on the rows exact scored: recall of its top 20%, Spearman."""
    import numpy as np
    import pyarrow.parquet as pq

    from bench.attribution import spearman, top_recall

    def reasoning_scores(path: Path, count: int) -> list:
        scores = pq.read_table(path).column("token_scores").to_pylist()[:count]
        return [np.array([v for v in row if v == v]) for row in scores]  # NaN outside the reasoning

    truth = reasoning_scores(exact, pq.read_table(exact).num_rows)
    for path in cheap:
        got = reasoning_scores(path, len(truth))
        recall = float(np.mean([top_recall(e, g) for e, g in zip(truth, got)]))
        rho = float(np.mean([spearman(e, g) for e, g in zip(truth, got)]))
        rows.append((f"{path.stem} vs oar_p", float("nan"), float("nan"),
                     {"agreement": f"top-20% recall {recall:.2f}, Spearman {rho:.2f} on {len(truth)} responses"}))
