"""`mc_value`: Monte-Carlo step credit in the style of VinePPO (Kazemnejad et al., 2024).

Reads the verified rollouts and the rollout policy; writes one score per reasoning token. The
reasoning is cut into steps at its step boundaries (`step_boundaries`): its start, every position
right after a token that ends a sentence (`.` or a newline) and is followed by whitespace, and its
end. From each boundary b, K = `attribute.mc_samples` continuations of prompt + response[:b] are
sampled with the policy (the row's sampling temperature, top_p 1) and graded against the gold answer
with `attribute.mc_checker`; their success rate estimates the value V(b). The credit of the step
between two boundaries is V(b_k+1) - V(b_k), the change in the chance of success that step made, and
every token of the step gets |credit| as its score.

Where we deviate from VinePPO: VinePPO uses the signed step advantages as the policy-gradient
advantages; oarctl's reshaping only turns scores into non-negative weights of the sequence advantage
(which carries the sign). So the score is the *absolute* change: a step that lowered the chance of
success is exactly where a wrong response's blame belongs, and clipping negatives to 0 would hide it.
V at the reasoning's end is estimated too (the continuations write the box), not taken as the reward.

Budget: a continuation is cut at `attribute.mc_max_new_tokens` response tokens counted from the
response's start (set it to sample.max_new_tokens), so it has the budget the rollout had.

Cost: (steps + 1) x K continuations per scored row, each up to the rest of the budget; a chains
rollout of 6 steps with K = 4 samples 28 continuations, i.e. about 14 rollouts' worth of generation
(a continuation from b is on average half a response). On the toy world that makes the attribute
stage about 10x the sample stage; use `attribute.skip_uniform_groups` (rows whose group has one
reward have advantage 0 and need no scores). Each row is sampled in its own generate call, seeded by
(run seed, step, row), so its scores do not depend on which other rows are scored.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from oarctl.attribution.base import ATTRIBUTION_METHODS, on_reasoning, row_seed
from oarctl.attribution.segments import token_offsets

# (prefixes = prompt + response head, seed) -> the sampled continuation ids, one per prefix
Sample = Callable[[list[list[int]], int], list[list[int]]]
# (whole responses, gold answers) -> correct or not
IsCorrect = Callable[[list[list[int]], list[str]], list[bool]]
SENTENCE_ENDS = (".", "\n")


def step_boundaries(text: str, offsets: list[int], reasoning: tuple[int, int]) -> list[int]:
    """Token positions start = b_0 < ... < b_n = end cutting the reasoning into steps (module doc).

    `text` and `offsets` are the decoded response and its token offsets (segments.token_offsets).
    """
    start, end = reasoning
    cuts = [start]
    for position in range(start + 1, end):
        before, after = offsets[position], offsets[position + 1]
        if before > 0 and text[before - 1] in SENTENCE_ENDS and after > before and text[before].isspace():
            cuts.append(position)
    if end > start:
        cuts.append(end)
    return cuts


def boundary_values(prompt: list[int], response: list[int], boundaries: Sequence[int], gold: str, samples: int,
                    budget: int, sample: Sample, is_correct: IsCorrect, seed: int) -> np.ndarray:
    """V(b) for every boundary: the success rate of `samples` continuations from prompt + response[:b],
    all sampled in one call; a continuation is cut where the response would pass `budget` tokens."""
    heads = [list(response[:b]) for b in boundaries for _ in range(samples)]
    continuations = sample([list(prompt) + head for head in heads], seed)
    whole = [head + list(tail)[:max(0, budget - len(head))] for head, tail in zip(heads, continuations)]
    correct = np.asarray(is_correct(whole, [gold] * len(whole)), dtype=np.float64)
    return correct.reshape(len(boundaries), samples).mean(axis=1)


def spread_credit(values: np.ndarray, boundaries: Sequence[int], reasoning: tuple[int, int]) -> np.ndarray:
    """|V(b_k+1) - V(b_k)| on every token of step k, over the reasoning span (float32)."""
    start, end = reasoning
    scores = np.zeros(end - start, dtype=np.float32)
    for k in range(len(boundaries) - 1):
        scores[boundaries[k] - start:boundaries[k + 1] - start] = abs(values[k + 1] - values[k])
    return scores


def _policy_sampler(context, temperature: float, budget: int, batch_size: int) -> Sample:
    from oarctl.policy.backends import generate

    def sample(prefixes: list[list[int]], seed: int) -> list[list[int]]:
        generations = generate(context.policy, prefixes, temperature=temperature, top_p=1.0, max_new_tokens=budget,
                               seed=seed, batch_size=batch_size)
        return [g.token_ids for g in generations]
    return sample


def _checker(tokenizer, name: str) -> IsCorrect:
    from oarctl.verify import CHECKERS

    check = CHECKERS.get(name)

    def is_correct(responses: list[list[int]], golds: list[str]) -> list[bool]:
        texts = tokenizer.batch_decode(responses, skip_special_tokens=True)
        return [verdict.reward == 1.0 for verdict in check(texts, golds)]
    return is_correct


@ATTRIBUTION_METHODS.register("mc_value")
def mc_value(rollouts, table, config, context) -> list[np.ndarray]:
    """|change of the Monte-Carlo success estimate| per step, on the step's tokens."""
    _, tokenizer = context.policy.load()
    is_correct = _checker(tokenizer, config.mc_checker)
    prompts, responses = table["prompt_token_ids"].to_pylist(), table["response_token_ids"].to_pylist()
    golds, temperatures = table["answer"].to_pylist(), table["temperature"].to_pylist()
    scores = []
    for rollout, prompt, response, gold, temperature in zip(rollouts, prompts, responses, golds, temperatures):
        reasoning = rollout.segments.reasoning
        text, offsets = token_offsets(tokenizer, response)
        boundaries = step_boundaries(text, offsets, reasoning)
        if len(boundaries) < 2:  # an empty reasoning has nothing to score
            scores.append(on_reasoning(rollout, np.zeros(0, dtype=np.float32)))
            continue
        sample = _policy_sampler(context, temperature if temperature and temperature > 0 else 1.0,
                                 config.mc_max_new_tokens, config.batch_size)
        values = boundary_values(prompt, response, boundaries, gold, config.mc_samples, config.mc_max_new_tokens,
                                 sample, is_correct, row_seed(context.seed, context.step, rollout.row))
        scores.append(on_reasoning(rollout, spread_credit(values, boundaries, reasoning)))
    return scores
