"""fidelity: how well does an attribution method find the tokens that decide the outcome?

Reads a verified (or attributions) Parquet of rollouts and a policy; writes a Parquet of recalls
(schema `fidelity` in artifacts.py, one row per rollout x method x K), a markdown table and a PNG
plot beside it. This is the paper's causal-token recall, with an oracle we define ourselves (the
paper's exact protocol is not available to us, see the introduction of docs/method.md).

The counterfactual oracle, per sampled rollout and reasoning token t (the reasoning span of
`attribution/segments.py`, as the attribute stage sees it):
1. replace r_t by an alternative token,
2. regenerate the rest of the response greedily from prompt + r_<t + replacement,
3. grade the new response against the gold with the project's checker (`verify.method`),
4. t is *causal* if the verdict (correct / not correct) differs from the reference verdict.

Replacement (`fidelity.replacement`):
- `alternative` (default): the policy's most likely token at t other than r_t, never a special
  token. The counterfactual is then a text the policy itself would plausibly write, so a flip
  means "a different *choice* here changes the outcome", which is what credit assignment is about.
- `pad`: the tokenizer's pad token, OAR-P's perturbation. Out of distribution for the policy, and
  it would favour OAR-P, which measures exactly that perturbation; offered for comparison.

Reference verdict (`fidelity.reference`):
- `rollout` (default): the rollout's own response, regraded with the same checker. Caveat: the
  rollout was *sampled* but the rest is regenerated *greedily*, so a flip can also come from
  greedy decoding differing from the sampled tail, not from r_t alone.
- `greedy`: the greedy regeneration from prompt + r_<=t with r_t kept (a control per position);
  removes that confound at twice the generation cost.

Cost: R (or 2R) greedy generations per rollout of up to `fidelity.max_new_tokens` tokens, all
rollouts' prefixes batched together (`fidelity.batch_size` per generate call), plus one forward
pass per rollout to choose the alternatives.

Recall@K (`metrics.recall_at_k`): the share of the causal tokens among the method's top ceil(K x R)
reasoning tokens; rollouts without causal tokens are left out of the averages.

Where the rollouts carry ground-truth labels (`token_truth`, the chains toy world), every method is
also scored against them, beside the oracle: AUC and recall@K of the label-1 tokens
(oarctl/fidelity_truth.py), in extra columns and a second table.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from oarctl.artifacts import write_bytes_atomically
from oarctl.errors import OarError
from oarctl.metrics import mean_recalls, recall_at_k

# (prompt + response prefix) ids -> the generated continuation ids, one per prefix
Regenerate = Callable[[list[list[int]]], list[list[int]]]
# (response ids, gold answers) -> correct or not, one per response
IsCorrect = Callable[[list[list[int]], list[str]], list[bool]]


@dataclass(frozen=True)
class OracleCase:
    """One rollout as the oracle sees it; `reasoning` is a half-open span of response positions."""
    prompt_ids: list[int]
    response_ids: list[int]
    reasoning: tuple[int, int]
    gold: str


# ---- the oracle (pure: the model enters only through the two callables) --------------------------

def _counterfactual_responses(case: OracleCase, replacements: Sequence[int], keep_original: bool):
    """(prefix for the generator, response prefix) per reasoning position t."""
    start, end = case.reasoning
    if len(replacements) != end - start:
        raise ValueError(f"{len(replacements)} replacements for {end - start} reasoning tokens")
    pairs = []
    for t, replacement in zip(range(start, end), replacements):
        token = case.response_ids[t] if keep_original else int(replacement)
        head = list(case.response_ids[:t]) + [token]
        pairs.append((list(case.prompt_ids) + head, head))
    return pairs


def _regenerated(cases, replacements, regenerate: Regenerate, keep_original: bool) -> list[list[list[int]]]:
    """Per case, per reasoning position: the full new response (head + greedy continuation)."""
    pairs = [_counterfactual_responses(c, r, keep_original) for c, r in zip(cases, replacements)]
    flat = [pair for per_case in pairs for pair in per_case]
    continuations = regenerate([prefix for prefix, _ in flat]) if flat else []
    responses, index = [], 0
    for per_case in pairs:
        responses.append([head + list(continuations[index + i]) for i, (_, head) in enumerate(per_case)])
        index += len(per_case)
    return responses


def causal_tokens_batch(cases: Sequence[OracleCase], replacements: Sequence[Sequence[int]],
                        regenerate: Regenerate, is_correct: IsCorrect, reference: str = "rollout") -> list[np.ndarray]:
    """Per case, a bool array over its reasoning tokens: does replacing the token flip the verdict?

    One `regenerate` call (two with reference `greedy`) and one `is_correct` call for all cases, so
    the caller can batch the expensive generation across rollouts.
    """
    if reference not in ("rollout", "greedy"):
        raise ValueError(f"reference must be 'rollout' or 'greedy'; got {reference!r}")
    counterfactual = _regenerated(cases, replacements, regenerate, keep_original=False)
    control = _regenerated(cases, replacements, regenerate, keep_original=True) if reference == "greedy" else None
    responses, golds = [], []
    for index, case in enumerate(cases):
        references = control[index] if control is not None else [list(case.response_ids)]
        for response in counterfactual[index] + references:
            responses.append(response)
            golds.append(case.gold)
    verdicts = list(is_correct(responses, golds)) if responses else []
    results, offset = [], 0
    for index, case in enumerate(cases):
        length = len(counterfactual[index])
        flipped = np.array(verdicts[offset:offset + length], dtype=bool)
        reference_length = length if control is not None else 1
        expected = np.array(verdicts[offset + length:offset + length + reference_length], dtype=bool)
        results.append(flipped != expected)  # (R,), the single rollout verdict broadcasts
        offset += length + reference_length
    return results


def causal_tokens(case: OracleCase, replacements: Sequence[int], regenerate: Regenerate, is_correct: IsCorrect,
                  reference: str = "rollout") -> np.ndarray:
    """The oracle for one rollout (see `causal_tokens_batch`)."""
    return causal_tokens_batch([case], [replacements], regenerate, is_correct, reference)[0]


def pick_alternatives(logits, originals: Sequence[int], excluded: Sequence[int]) -> list[int]:
    """Per row of next-token logits (R, V), the argmax over tokens that are neither the original
    token of that position nor in `excluded` (special tokens)."""
    import torch

    masked = logits.float().clone()  # (R, V)
    if excluded:
        masked[:, list(excluded)] = -math.inf
    masked[torch.arange(masked.shape[0]), torch.as_tensor(list(originals), dtype=torch.long)] = -math.inf
    return masked.argmax(dim=-1).tolist()


# ---- the report ---------------------------------------------------------------------------------

def markdown_report(means: dict, methods: Sequence[str], ks: Sequence[float], header: list[str]) -> str:
    columns = [f"@{100 * k:g}%" for k in ks]
    lines = [*header, "", "| method | " + " | ".join(columns) + " |", "|---|" + "---:|" * len(columns)]
    for method in methods:
        values = [means.get(method, {}).get(round(float(k), 6), math.nan) for k in ks]
        lines.append(f"| {method} | " + " | ".join("n/a" if math.isnan(v) else f"{v:.3f}" for v in values) + " |")
    return "\n".join(lines) + "\n"


def plot_recalls(means: dict, methods: Sequence[str], ks: Sequence[float], path: Path, title: str) -> None:
    """Recall vs K, one line per method (matplotlib imported here: `oarctl --help` stays fast)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6, 4))
    percents = [100 * k for k in ks]
    for method in methods:
        axes.plot(percents, [means.get(method, {}).get(round(float(k), 6), math.nan) for k in ks], marker="o",
                  label=method)
    axes.set(xlabel="top-K% of reasoning tokens", ylabel="recall of causal tokens", ylim=(0, 1.02), title=title)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    temporary = path.with_name(f".{path.name}.tmp.png")
    figure.savefig(temporary, dpi=120)
    plt.close(figure)
    temporary.replace(path)


# ---- with a policy: choosing replacements, regenerating, grading ---------------------------------

def sample_rows(num_rows: int, count: int, seed: int) -> list[int]:
    """`count` distinct rows drawn with `seed` (all rows when there are fewer), in file order."""
    if count >= num_rows:
        return list(range(num_rows))
    return sorted(np.random.default_rng([seed, num_rows]).choice(num_rows, size=count, replace=False).tolist())


def oracle_cases(table, rollouts) -> list[OracleCase]:
    """The sampled rows with the reasoning span of the attribution segmentation."""
    rows = zip(table["prompt_token_ids"].to_pylist(), table["response_token_ids"].to_pylist(),
               table["answer"].to_pylist(), rollouts)
    return [OracleCase(list(prompt), list(response), rollout.segments.reasoning, gold)
            for prompt, response, gold, rollout in rows]


def alternative_replacements(model, tokenizer, cases: Sequence[OracleCase]) -> list[list[int]]:
    """Per case, the policy's most likely non-special token other than r_t at each reasoning t.

    One teacher-forced pass per rollout: the logits at t - 1 are those that chose r_t.
    """
    import torch

    excluded = sorted(set(tokenizer.all_special_ids))
    choices = []
    with torch.no_grad():
        for case in cases:
            start, end = case.reasoning
            if end == start:
                choices.append([])
                continue
            if not case.prompt_ids and start == 0:
                raise OarError("fidelity: a rollout with an empty prompt has no logits for its first token")
            ids = torch.tensor(case.prompt_ids + case.response_ids[:end], device=model.device)[None]
            logits = model(input_ids=ids).logits[0]  # (T, V)
            positions = torch.arange(start, end) + len(case.prompt_ids) - 1
            choices.append(pick_alternatives(logits[positions.to(logits.device)].cpu(),
                                             case.response_ids[start:end], excluded))
    return choices


def choose_replacements(strategy: str, model, tokenizer, cases: Sequence[OracleCase]) -> list[list[int]]:
    if strategy == "alternative":
        return alternative_replacements(model, tokenizer, cases)
    if tokenizer.pad_token_id is None:
        raise OarError("fidelity.replacement=pad: the policy's tokenizer has no pad token")
    return [[tokenizer.pad_token_id] * (case.reasoning[1] - case.reasoning[0]) for case in cases]


def greedy_regenerator(model, tokenizer, max_new_tokens: int, batch_size: int, progress: bool) -> Regenerate:
    from oarctl.policy.transformers_backend import generate

    def regenerate(prefixes: list[list[int]]) -> list[list[int]]:
        # Similar lengths in one batch pad less; greedy decoding makes the order irrelevant.
        order = sorted(range(len(prefixes)), key=lambda i: len(prefixes[i]))
        generations = generate(model, tokenizer, [prefixes[i] for i in order], temperature=0.0, top_p=1.0,
                               max_new_tokens=max_new_tokens, seed=0, batch_size=batch_size, progress=progress)
        continuations: list[list[int]] = [[] for _ in prefixes]
        for index, generation in zip(order, generations):
            continuations[index] = generation.token_ids
        return continuations
    return regenerate


def checker(tokenizer, verify_config) -> IsCorrect:
    """The project's checker (`verify.method`) on decoded responses, as the verify stage decodes them."""
    from oarctl.verify import CHECKERS

    check = CHECKERS.get(verify_config.method)

    def is_correct(responses: list[list[int]], golds: list[str]) -> list[bool]:
        texts = tokenizer.batch_decode(responses, skip_special_tokens=True)
        verdicts = check(texts, golds, timeout=verify_config.timeout, workers=verify_config.workers,
                         memory_mb=verify_config.memory_mb)
        return [verdict.reward == 1.0 for verdict in verdicts]
    return is_correct


GROUP_METHODS = ("ktae",)  # scored from statistics of whole groups: the sampled rows' groups are scored whole


def group_scores(name: str, verified, source_rows: Sequence[int], config, context) -> list[np.ndarray]:
    """A GROUP_METHODS method's scores of the sampled rows, computed on every row of their groups."""
    from oarctl.attribution import ATTRIBUTION_METHODS
    from oarctl.attribution.base import segment_rows

    prompt_ids = verified["prompt_id"].to_pylist()
    wanted = {prompt_ids[i] for i in source_rows}
    rows = [i for i, p in enumerate(prompt_ids) if p in wanted]
    table = verified.take(rows)
    full = ATTRIBUTION_METHODS.get(name)(segment_rows(table, context.policy.load_tokenizer()), table,
                                         config.attribute, context)
    return [full[rows.index(i)] for i in source_rows]


def group_advantages(verified, source_rows: Sequence[int], reshape) -> np.ndarray:
    """The sampled rows' sequence advantages in their whole groups (reshape.estimator)."""
    from oarctl.advantages import ADVANTAGE_ESTIMATORS

    codes = np.unique(verified["prompt_id"].to_pylist(), return_inverse=True)[1]
    rewards = np.asarray(verified["reward"].to_pylist(), dtype=np.float64)
    every = ADVANTAGE_ESTIMATORS.get(reshape.estimator)(rewards, codes, scale=reshape.scale, eps=reshape.eps)
    return every[list(source_rows)]


def method_scores(methods: Sequence[str], rollouts, table, config, context, verified=None,
                  source_rows: Sequence[int] = ()) -> dict[str, list[np.ndarray]]:
    """Reasoning-token scores of each registry method, exactly as the attribute stage computes them (a
    GROUP_METHODS method on the sampled rows' whole groups of `verified`, as in a training step)."""
    from oarctl.attribution import ATTRIBUTION_METHODS

    scores = {}
    for name in methods:
        if name in GROUP_METHODS and verified is not None:
            full = group_scores(name, verified, source_rows, config, context)
        else:
            full = ATTRIBUTION_METHODS.get(name)(rollouts, table, config.attribute, context)
        scores[name] = [row[r.segments.reasoning[0]:r.segments.reasoning[1]] for row, r in zip(full, rollouts)]
    return scores


def fidelity_columns(source_rows, table, causal, scores: dict, ks: Sequence[float]) -> dict:
    """One row per rollout x method x K (the `fidelity` artifact)."""
    names = ["source_row", "prompt_id", "sample_index", "reward", "method", "k_fraction", "top_k",
             "reasoning_tokens", "causal_tokens", "causal_positions", "hits", "recall"]
    columns = {name: [] for name in names}
    info = zip(source_rows, table["prompt_id"].to_pylist(), table["sample_index"].to_pylist(),
               table["reward"].to_pylist(), causal, range(len(causal)))
    for source_row, prompt_id, sample_index, reward, mask, index in info:
        positions = np.flatnonzero(mask).tolist()
        for method, per_rollout in scores.items():
            for k in ks:
                count, hits, recall = recall_at_k(per_rollout[index], mask, k)
                for name, value in zip(names, (source_row, prompt_id, sample_index, reward, method, k, count,
                                               mask.size, len(positions), positions, hits, recall)):
                    columns[name].append(value)
    return columns


def _header(path: Path, policy_path: Path, config, cases, causal, rewards, seconds: dict) -> list[str]:
    with_causal = sum(bool(mask.any()) for mask in causal)
    correct = [reward == 1.0 for reward in rewards]
    correct_with_causal = sum(bool(mask.any()) and right for mask, right in zip(causal, correct))
    reasoning = sum(mask.size for mask in causal)
    fraction = sum(int(mask.sum()) for mask in causal) / max(1, reasoning)
    section = config.fidelity
    return ["# Attribution fidelity: recall of the top-K% reasoning tokens against the causal oracle", "",
            f"- input: `{path}` ({len(cases)} rollouts sampled, seed {config.run.seed}); policy: `{policy_path}`",
            f"- oracle: replacement `{section.replacement}`, reference `{section.reference}`, greedy regeneration "
            f"of up to {section.max_new_tokens} tokens, checker `{config.verify.method}`",
            f"- rollouts with >= 1 causal token: {with_causal} of {len(cases)} (recalls average over these): "
            f"{correct_with_causal} of {sum(correct)} correct, {with_causal - correct_with_causal} of "
            f"{len(cases) - sum(correct)} wrong; causal tokens: {fraction:.1%} of {reasoning} reasoning tokens",
            f"- time: oracle {seconds['oracle']:.1f} s, methods {seconds['methods']:.1f} s"]


VERSION = "2"  # 2: credit by class (the query's step, the earlier chain) and Bi-Level weights per class


def fidelity_key(input_path: Path, config, policy_path: Path) -> dict:
    """The cache key of `oarctl fidelity`, as the runner keys a stage: what it reads and the options that
    change its result (the fidelity, verify, attribute and reshape sections, the seed that draws the rollouts)."""
    from oarctl.checkpoints import policy_identity
    from oarctl.runner import input_hash
    from oarctl.schema import attribute_key, section_dict

    sections = {name: section_dict(config, name) for name in ("fidelity", "verify", "attribute", "reshape")}
    sections["attribute"].pop("accelerate_config", None)  # how a stage is launched, not what it computes
    sections["attribute"] = attribute_key(sections["attribute"], config.fidelity.methods)
    return {"stage": "fidelity", "version": VERSION, "config": sections, "seed": config.run.seed, "step": 0,
            "inputs": {"verified": input_hash(Path(input_path)), "policy": policy_identity(policy_path)}}


def run_fidelity(input_path: Path, output: Path, config, policy_path: Path, log=print,
                 force: bool = False) -> tuple[str, bool]:
    """The whole command: oracle, method scores, Parquet + markdown + PNG, manifest last.
    Returns (the markdown, whether it ran): an output whose manifest has the same key is reused."""
    from oarctl.hashing import sha256_file
    from oarctl.runner import manifest_path, why_stale, write_manifest

    parts = fidelity_key(input_path, config, policy_path)
    report_path = output.with_suffix(".md")
    if not force and why_stale(output, parts) is None and report_path.is_file():
        return report_path.read_text(), False
    manifest_path(output).unlink(missing_ok=True)  # the old output is no longer vouched for
    started = time.perf_counter()
    report, metrics = _measure(input_path, output, config, policy_path, log)
    write_manifest(output, parts, metrics, time.perf_counter() - started, sha256_file(output))
    return report, True


def _measure(input_path: Path, output: Path, config, policy_path: Path, log) -> tuple[str, dict]:
    """Oracle, method scores and the three output files; returns (markdown, manifest metrics)."""
    from oarctl.artifacts import make_table, read_artifact, write_parquet
    from oarctl.attribution.base import segment_rows
    from oarctl.fidelity_truth import (class_columns, class_table, oracle_agreement, reasoning_classes,
                                       reasoning_labels, reshape_variants, truth_columns)
    from oarctl.contract import Policy, StageContext, progress_shown

    if config.policy.threads:
        import torch
        torch.set_num_threads(config.policy.threads)
    section = config.fidelity
    verified = read_artifact(input_path, "verified")
    source_rows = sample_rows(verified.num_rows, section.sample, config.run.seed)
    table = verified.take(source_rows)
    policy = Policy(Path(policy_path), config.policy.device)
    model, tokenizer = policy.load()
    rollouts = segment_rows(table, tokenizer)
    cases = oracle_cases(table, rollouts)

    started = time.perf_counter()
    replacements = choose_replacements(section.replacement, model, tokenizer, cases)
    log(f"[fidelity] oracle: {sum(len(r) for r in replacements)} counterfactuals over {len(cases)} rollouts")
    regenerate = greedy_regenerator(model, tokenizer, section.max_new_tokens, section.batch_size,
                                    progress_shown(config.run.progress))
    causal = causal_tokens_batch(cases, replacements, regenerate, checker(tokenizer, config.verify), section.reference)
    seconds = {"oracle": time.perf_counter() - started}

    started = time.perf_counter()
    context = StageContext(seed=config.run.seed, step=0, policy=policy, progress=False)
    scores = method_scores(section.methods, rollouts, table, config, context, verified, source_rows)
    seconds["methods"] = time.perf_counter() - started

    columns = fidelity_columns(source_rows, table, causal, scores, section.ks)
    labels = reasoning_labels(table, rollouts)
    advantages = group_advantages(verified, source_rows, config.reshape)  # ktae's class weights
    classes = reasoning_classes(table, rollouts, tokenizer)
    if labels is not None:
        columns.update(truth_columns(labels, scores, section.ks))
        columns.update(class_columns(classes, scores, section.ks, config.reshape, advantages))
    result = make_table(columns, "fidelity")
    write_parquet(result, output)
    header = _header(input_path, policy_path, config, cases, causal, table["reward"].to_pylist(), seconds)
    if labels is not None:
        header.append(oracle_agreement(causal, labels))
    metrics = {"rollouts": len(cases), "oracle_seconds": seconds["oracle"], "methods_seconds": seconds["methods"]}
    classes_report = [] if classes is None else class_table(scores, classes, reshape_variants(config.reshape),
                                                            advantages)
    return write_report(result, header, section, output, classes_report), metrics


def write_report(result, header: list[str], section, output: Path, classes_report: Sequence[str] = ()) -> str:
    """The markdown table (returned, and saved as OUTPUT.md) and the plot (OUTPUT.png)."""
    from oarctl.fidelity_truth import truth_report

    means = mean_recalls(result)
    report = markdown_report(means, section.methods, section.ks, header)
    if "truth_auc" in result.column_names:
        report += "\n".join(truth_report(result, section.methods, section.ks)) + "\n"
    if classes_report:
        report += "\n".join(classes_report) + "\n"
    write_bytes_atomically(output.with_suffix(".md"), report)
    rollouts = len(set(result.filter(result["causal_tokens"].to_numpy() > 0)["source_row"].to_pylist()))
    plot_recalls(means, section.methods, section.ks, output.with_suffix(".png"),
                 f"causal-token recall ({rollouts} rollouts with causal tokens)")
    return report
