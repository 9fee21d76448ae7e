"""gradient-check: how well does one training batch's gradient, under each credit method's token
advantages, point along the policy gradient? A bench that needs no ground truth and no training run.

Reads a verified Parquet of one policy's own rollouts (a pool: chains wants >= 256 prompts x 8 samples)
and that policy; writes OUTPUT (Parquet, schema `gradient_check` in artifacts.py, one row per method),
OUTPUT.md (the printed table and its conditions) and OUTPUT.png (cosine per method with its interval).

1. credit.py: the pool's token advantages under each method, as `attribute` + `reshape` make them (the
   attribute and reshape config sections apply, Bi-Level knobs included), timed per method;
2. the pool's prompts, in a seeded order, split into two halves of disjoint batches of `batch_prompts`
   whole groups (default sample.prompts_per_step: a training batch); the same batches for every method;
3. gradients.py: each batch's gradient with the update's loss, scored against the plain GRPO (uniform)
   gradient of the other half, which shares no sample with it;
4. summary.py: cosines with 95% intervals, paired differences to uniform, the noise-corrected cosine,
   the effective batch and `expected_cosine`, the check of the assumption the effective batch rests on;
5. cost: `cost_vs_sampling` = the method's seconds over the seconds sampling the pool takes: `sample_seconds`
   when given; else, with `time_sampling` N > 0 (the default, 32), `time_sampling` prompts of the pool sampled
   again here after the credit, scaled to the pool (credit and sampling timed in one process, under one load),
   where the pool's backend is transformers (a vLLM engine's start would swamp so short a sample); else the
   seconds its sample manifest beside the verified file recorded, else NaN. `pays`:
   effective_batch - 1 >= cost_vs_sampling, i.e. the credit costs less than the extra samples it is worth.

It is not a pipeline stage (nothing caches it) and no stage imports it. Same input, config and seed:
every column but the measured `seconds`, `cost_vs_sampling` and `pays` has the same bytes.
"""
from __future__ import annotations

import math
from pathlib import Path

from oarctl.errors import OarError

MEASURED_COLUMNS = ("seconds", "cost_vs_sampling", "pays")  # times, and what follows from them: not seeded


TIME_SAMPLING = 32  # prompts of the pool sampled again to time sampling in the bench's own run (0: off)


def check_options(methods: list[str], batch_prompts: int | None, sample_seconds: float | None,
                  time_sampling: int = TIME_SAMPLING) -> list[str]:
    """The methods to run, uniform first (the reference's credit and every difference's baseline)."""
    from oarctl.attribution import ATTRIBUTION_METHODS

    if not methods:
        raise OarError("--methods: expected comma-separated attribution method names")
    for name in methods:
        if name not in ATTRIBUTION_METHODS:
            raise OarError(f"--methods: unknown attribution method {name!r}; choose from: "
                           f"{', '.join(ATTRIBUTION_METHODS.names())}")
    if batch_prompts is not None and batch_prompts < 1:
        raise OarError(f"--batch-prompts: expected a positive number of prompts, got {batch_prompts}")
    if sample_seconds is not None and not sample_seconds > 0:
        raise OarError(f"--sample-seconds: expected a positive number of seconds, got {sample_seconds}")
    if time_sampling < 0:
        raise OarError(f"--time-sampling: expected a number of prompts >= 0 (0: off), got {time_sampling}")
    return ["uniform"] + [m for m in dict.fromkeys(methods) if m != "uniform"]


def run_gradient_check(verified_path: Path, output: Path, config, policy_path: Path, methods: list[str],
                       batch_prompts: int | None = None, sample_seconds: float | None = None,
                       time_sampling: int = TIME_SAMPLING, log=print) -> str:
    """The whole command; returns the markdown table (also written to OUTPUT.md)."""
    from oarctl.artifacts import make_table, read_artifact, write_bytes_atomically, write_parquet
    from oarctl.attribution.base import segment_rows
    from oarctl.contract import Policy, StageContext
    from oarctl.gradient_check import credit, gradients, report, summary
    from oarctl.policy.backends import resolve

    methods = check_options(methods, batch_prompts, sample_seconds, time_sampling)
    if config.policy.threads:
        import torch
        torch.set_num_threads(config.policy.threads)
    table = read_artifact(verified_path, "verified")
    size = batch_prompts or config.sample.prompts_per_step
    halves = credit.prompt_batches(table["prompt_id"].to_pylist(), size, config.run.seed, verified_path)
    policy = Policy(Path(policy_path), config.policy.device)
    model, tokenizer = policy.load()
    rollouts = segment_rows(table, tokenizer)
    context = StageContext(seed=config.run.seed, step=0, policy=policy, progress=False)
    advantages, seconds = {}, []
    for method in methods:
        advantages[method], elapsed = credit.pool_advantages(method, table, rollouts, config, context)
        seconds.append(elapsed)
        log(f"[gradient-check] credit {method}: {elapsed:.1f} s")
    scores, sums, checks = gradients.measure(model, tokenizer.pad_token_id, config.update, table, advantages,
                                             halves, log)
    references = summary.reference_checks(scores, sums)
    columns = summary.summarise(scores, sums, methods, references["references_cosine"])
    if sample_seconds:
        sampling, source = sample_seconds, "--sample-seconds"
    elif time_sampling and resolve(config.policy.backend) == "transformers":
        # after the gradients: sampling draws random numbers, and the seeded columns must not move
        sampling, source = credit.timed_sampling(policy, table, time_sampling, config.sample)
    else:
        sampling, source = credit.sample_seconds(verified_path)
    log(f"[gradient-check] sampling: {sampling:.1f} s ({source})")
    columns.update(summary.cost_columns(seconds, sampling, columns["effective_batch"]))
    write_parquet(make_table(columns, "gradient_check"), output)
    header = _header(verified_path, policy_path, table.num_rows, halves, size, (sampling, source),
                     {**checks, **references})
    text = report.markdown(columns, header)
    write_bytes_atomically(output.with_suffix(".md"), text)
    report.plot(columns, output.with_suffix(".png"), f"{len(halves[0]) * 2} batches of {size} prompts")
    return text


def _header(path: Path, policy_path: Path, rows: int, halves, size: int, sampling: tuple[float, str],
            checks: dict) -> list[str]:
    used = sum(len(batch) for half in halves for batch in half)
    seconds, source = sampling
    return ["# Gradient check: one batch's gradient under each credit method against the policy gradient", "",
            f"- pool: `{path}` ({rows} rollouts; {used} in {len(halves[0])} + {len(halves[1])} disjoint batches of "
            f"{size} prompts); policy: `{policy_path}`",
            "- reference: the plain GRPO (uniform) gradient of the other half; cos(R, true gradient) estimated "
            f"A {checks['reference_cosine_a']:.3f}, B {checks['reference_cosine_b']:.3f}; cos(R_A, R_B) measured "
            f"{checks['references_cosine']:.3f} (about their product if the model holds)",
            f"- the update's loss at the stored log-probs: ratio mean {checks['ratio_mean']:.4f}, clip fraction "
            f"{checks['clip_fraction']:.4f} (1 and 0 when the policy sampled the pool)",
            "- effective batch = (1/c_uniform^2 - 1) / (1/c^2 - 1), c the corrected cosine; it assumes the method's "
            "expected gradient points along the true one (expected cosine ~1); split-half: the same with "
            "c = cosine / sqrt(cos(R_A, R_B)), the steadier estimate when uniform's expected cosine is far from 1",
            "- sampling: " + (f"{seconds:.1f} s ({source})" if not math.isnan(seconds) else
                              f"unknown ({source}; give --sample-seconds)")]
