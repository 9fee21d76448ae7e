"""How large is each deviation from the authors' released code? Measured on the embedded toy policy.

    python bench/method_deviations.py             # the figures docs/method.md quotes (~1 min, 1 core)
    python bench/method_deviations.py --prompts 2 --group 2    # a smoke run

The chains toy policy (`toy-chains`) samples a batch of generated chains problems (configs/chains.yaml,
one torch thread); each rollout is segmented as the attribute stage segments it. Then, one deviation
at a time, oarctl's behaviour against the released code's on the same rollouts:
- outcome math in float64 against float32 (`outcome.OUTCOME_DTYPE`): OAR-P `last` scores and their
  Bi-Level weights end to end; beside it the float64 run with another chunk size (different float32
  forwards, the same math): the noise floor that no outcome dtype removes;
- the `+ 1e-8` beside tau: the released suppressed weight is n / (tau + 1e-8), ours n / tau; the
  relative change 1e-8 / (tau + 1e-8) is exact, so what is measured is tau;
- the quantile carry (`reshape.quantile_carry`): tokens suppressed per rollout, first rollout and
  the rest, and the share of the advantage mass on the top 10% of tokens;
- negative `answer_joint` scores (clamped to 0; the released log1p is NaN below -1);
- OAR-G `last` at the position predicting a_1 against the released position after the answer;
- OAR-G `answer_joint` without noise against the released noise.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.attribution import spearman  # noqa: E402
from oarctl.attribution import oar, outcome  # noqa: E402
from oarctl.reshaping import (_normalized, _weights, bilevel_weights, carried_bilevel_weights,  # noqa: E402
                              concentration_metrics)

CHAINS_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "chains.yaml"
RELEASED_EPSILON = 1e-8


def sample_rollouts(prompts: int, group: int, seed: int):
    """(model, rollouts): the toy chains policy's samples of `prompts` x `group`, segmented."""
    from oarctl.config import load_config
    from oarctl.data import toy_prompts
    from oarctl.runner import Policy, StageContext
    from oarctl.stages import sample
    from oarctl.toy import base_policy_dir

    config = load_config(CHAINS_CONFIG, [f"sample.prompts_per_step={prompts}", f"sample.group_size={group}",
                                         f"run.seed={seed}", "run.progress=false"])
    table = toy_prompts("train", prompts, config.data.chain_lengths, seed, family="chains")
    context = StageContext(seed=seed, step=0, policy=Policy(base_policy_dir("toy-chains")))
    model, tokenizer = context.policy.load()
    rollouts = sample.run({"prompts": table}, config.sample, context).table
    return model, [r for r in oar.segment_rows(rollouts, tokenizer) if r.reasoning[1] > r.reasoning[0]]


@contextmanager
def outcome_dtype(dtype):
    kept = outcome.OUTCOME_DTYPE
    outcome.OUTCOME_DTYPE = dtype
    try:
        yield
    finally:
        outcome.OUTCOME_DTYPE = kept


def oar_p(model, rollouts, mode: str = "last", chunk_size: int = 8) -> list[np.ndarray]:
    scores = oar.oar_p_batch(model, oar.items(rollouts), mode, model.config.pad_token_id, chunk_size)
    return [s.double().numpy() for s in scores]


def weight_gaps(scores_a, scores_b) -> np.ndarray:
    """|w_a - w_b| of every token: Bi-Level weights (the defaults) of two score sets of the same rollouts."""
    return np.concatenate([np.abs(bilevel_weights(a) - bilevel_weights(b)) for a, b in zip(scores_a, scores_b)])


def outcome_precision(model, rollouts) -> list[np.ndarray]:
    reference = oar_p(model, rollouts)
    floor = oar_p(model, rollouts, chunk_size=1)
    with outcome_dtype(torch.float32):
        single = oar_p(model, rollouts)
    values, moved = np.concatenate(reference), np.abs(np.concatenate(single) - np.concatenate(reference))
    relative = moved[values > 0] / values[values > 0]
    print("\n1. Outcome math float32 (released) vs float64 (oarctl), OAR-P last")
    print(f"   scores: 10/50/90th percentile {np.percentile(values, [10, 50, 90])}")
    print(f"   |float32 - float64|: max {moved.max():.2g}; relative median {np.median(relative):.2%}, "
          f"90th {np.percentile(relative, 90):.1%}, max {relative.max():.0%}")
    for name, other in (("float32 vs float64", single), ("float64 chunk 1 vs chunk 8 (floor)", floor)):
        gaps = weight_gaps(other, reference)
        print(f"   Bi-Level weights, {name}: max |dw| {gaps.max():.2g}, median {np.median(gaps):.1e}")
    return reference


def thresholds(scores) -> np.ndarray:
    """tau of each rollout's span at the default quantile (spans without a ranking left out)."""
    normalized = [n for n in (_normalized(s) for s in scores) if n is not None]
    return np.array([np.quantile(n, 0.25) for n in normalized])


def epsilon_effect(scores) -> None:
    taus = thresholds(scores)
    change = RELEASED_EPSILON / (taus[taus > 0] + RELEASED_EPSILON)
    print("\n2. The released + 1e-8 beside tau (suppressed weight n / (tau + 1e-8) vs n / tau)")
    print(f"   tau over rollouts: min {taus.min():.2g}, median {np.median(taus):.2g}, max {taus.max():.2g}")
    print(f"   relative change of a suppressed (unfloored) weight: median {np.median(change):.2%}, "
          f"max {change.max():.2%}")


def quantile_carry(scores, rollouts_per_prompt: int) -> None:
    plain = [bilevel_weights(s, preserve_mass=False) for s in scores]
    carried = carried_bilevel_weights(scores, preserve_mass=False)
    print("\n3. Quantile carry (reshape.quantile_carry), the batch in sampled order "
          f"({rollouts_per_prompt} rollouts per prompt, consecutive)")
    print(f"   carried level, rollouts 1-5: {' -> '.join(f'{level:.2g}' for level in carried_levels(scores)[:5])}")
    for name, weights in (("q = 0.25 every rollout (paper, default)", plain), ("carried (released)", carried)):
        suppressed = np.array([(w < 1).sum() for w in weights])
        lengths = np.array([w.size for w in weights])
        shares = concentration_metrics([w * w.size / w.sum() for w in weights], np.ones(len(weights)))
        print(f"   {name}: suppressed tokens, rollout 1: {suppressed[0]} of {lengths[0]}; rollouts 2..: mean "
              f"{suppressed[1:].mean():.2f} of {lengths[1:].mean():.0f}; top-10% mass share "
              f"{shares['top10_mass_share']:.3f}")
    longer = scores * 4  # a step of configs/chains.yaml samples 512 rollouts
    levels = carried_levels(longer)
    unsuppressed = sum(int((w < 1).sum() == 0) for w in carried_bilevel_weights(longer, preserve_mass=False))
    reached = f"reaches 0 at rollout {levels.index(0.0) + 1}" if 0.0 in levels else "stays above 0"
    print(f"   the batch repeated to {len(longer)} rollouts: the level {reached}; {unsuppressed} rollouts with no "
          f"token suppressed")


def carried_levels(scores) -> list[float]:
    """The released loop's quantile level before each rollout: q, then the previous rollout's tau."""
    levels = [0.25]
    for normalized in (_normalized(s) for s in scores[:-1]):
        levels.append(0.0 if normalized is None else float(np.quantile(normalized, levels[-1])))
    return levels


def unclamped_weights(scores: np.ndarray) -> np.ndarray:
    """The released Bi-Level weights of scores > -1: log1p of the raw scores, negatives included."""
    logged = np.log1p(scores)
    normalized = (logged - logged.min()) / (logged.max() - logged.min())
    return _weights(normalized, float(np.quantile(normalized, 0.25)), 1.0, 0.1, True)


def answer_joint_clamp(model, rollouts) -> None:
    answered = [r for r in rollouts if r.answer[1] > r.answer[0]]
    scores = oar_p(model, answered, mode="answer_joint")
    negative = [s < 0 for s in scores]
    print("\n4. Negative answer_joint OAR-P scores (clamped to 0; the released log1p is NaN below -1)")
    print(f"   tokens below 0: {np.mean(np.concatenate(negative)):.1%}; rollouts with any: "
          f"{np.mean([n.any() for n in negative]):.0%}; rollouts with one below -1 (NaN weights): "
          f"{np.mean([(s < -1).any() for s in scores]):.0%}")
    kept = [s for s in scores if s.min() > -1 and s.max() > s.min()]
    gaps = np.concatenate([np.abs(bilevel_weights(s) - unclamped_weights(s)) for s in kept])
    print(f"   Bi-Level weights, clamped vs the released log1p of negatives ({len(kept)} rollouts without one "
          f"below -1): max |dw| {gaps.max():.2f}, median {np.median(gaps):.2f}")


def released_last(items: list[oar.Item]) -> list[oar.Item]:
    """The same OAR-G items with the released `last` outcome: the logits at the last answer token
    (an empty answer span at the answer's end puts `last` there)."""
    return [(ids[:answer[1]], reasoning, (answer[1], answer[1])) for ids, reasoning, answer in items]


def median_spearman(scores_a, scores_b) -> float:
    return float(np.median([spearman(a.numpy(), b.numpy()) for a, b in zip(scores_a, scores_b)]))


def oar_g_gap(name: str, ours, released, floor_name: str, floor: float) -> None:
    gaps = weight_gaps([s.numpy() for s in ours], [s.numpy() for s in released])
    print(f"   {name}: Spearman median {median_spearman(ours, released):.2f} ({floor_name}: {floor:.2f}); "
          f"Bi-Level max |dw| {gaps.max():.2f}, median {np.median(gaps):.2f}")


def oar_g_choices(model, rollouts) -> None:
    answered = oar.items([r for r in rollouts if r.answer[1] > r.answer[0]])
    seeds, others = list(range(len(answered))), [1000 + i for i in range(len(answered))]
    print("\n5. OAR-G choices (rollouts with an answer)")
    ours = oar.oar_g_batch(model, answered, "last", seeds=seeds)
    released = oar.oar_g_batch(model, released_last(answered), "last", seeds=seeds)
    reseeded = oar.oar_g_batch(model, answered, "last", seeds=others)
    oar_g_gap("last at a_1's predictor vs after the answer (released)", ours, released,
              "ours under another noise seed", median_spearman(ours, reseeded))
    quiet = oar.oar_g_batch(model, answered, "answer_joint", seeds=seeds)
    noisy = _with_answer_joint_noise(lambda: oar.oar_g_batch(model, answered, "answer_joint", seeds=seeds))
    renoised = _with_answer_joint_noise(lambda: oar.oar_g_batch(model, answered, "answer_joint", seeds=others))
    oar_g_gap("answer_joint without noise vs with (released)", quiet, noisy,
              "released under another noise seed", median_spearman(noisy, renoised))


def _with_answer_joint_noise(compute):
    """`compute()` with OAR-G's noise drawn for answer_joint too, as the released code draws it."""
    original = oar._noise
    oar._noise = lambda plans, *rest: original([dataclasses.replace(p, mode="last") for p in plans], *rest)
    try:
        return compute()
    finally:
        oar._noise = original


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    started = time.perf_counter()
    model, rollouts = sample_rollouts(args.prompts, args.group, args.seed)
    lengths = [r.reasoning[1] - r.reasoning[0] for r in rollouts]
    print(f"toy-chains policy, {len(rollouts)} rollouts with reasoning ({args.prompts} prompts x {args.group}, "
          f"seed {args.seed}), reasoning {min(lengths)}-{max(lengths)} tokens")
    scores = outcome_precision(model, rollouts)
    epsilon_effect(scores)
    quantile_carry(scores, args.group)
    answer_joint_clamp(model, rollouts)
    oar_g_choices(model, rollouts)
    print(f"\n{time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
