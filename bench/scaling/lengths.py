"""The response lengths a prediction assumes: a censored lognormal evaluated at its quantiles, and where
the reasoning, conclusion and answer of a response lie."""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import numpy as np

from bench.scaling.model import ANSWER_TOKENS, CLOSING_TOKENS, CONCLUDE_TOKENS


def _lognormal_censored_moment(mu: float, sigma: float, cap: float, k: int) -> float:
    """E[min(X, cap)^k], X ~ LogNormal(mu, sigma):
    e^{k mu + k^2 sigma^2 / 2} Phi((ln cap - mu - k sigma^2) / sigma) + cap^k (1 - Phi((ln cap - mu) / sigma))."""
    phi = statistics.NormalDist().cdf
    z = (math.log(cap) - mu) / sigma
    return math.exp(k * mu + k * k * sigma * sigma / 2) * phi(z - k * sigma) + cap ** k * (1 - phi(z))


@dataclass(frozen=True)
class Lengths:
    responses: np.ndarray  # (n,) response tokens, grouped: rows [g G, (g + 1) G) are prompt g's samples
    prompt: int
    group: int
    cap: int
    mean: float  # E[R] of the distribution
    second: float  # E[R^2]
    at_cap: float  # P(R = cap)
    sigma: float


def response_lengths(n: int, group: int, prompt: int, mean: float, cap: int, sigma: float, seed: int = 0) -> Lengths:
    """n lengths R = min(X, cap), X ~ LogNormal(mu, sigma), mu solved (bisection) so that E[R] = mean;
    taken at the quantiles (i + 1/2) / n and shuffled (seeded) into groups of `group`."""
    low, high = -5.0, math.log(cap) + 5
    for _ in range(200):
        mu = (low + high) / 2
        low, high = (mu, high) if _lognormal_censored_moment(mu, sigma, cap, 1) < mean else (low, mu)
    inverse = statistics.NormalDist(mu, sigma).inv_cdf
    quantiles = [min(cap, max(CONCLUDE_TOKENS + ANSWER_TOKENS + CLOSING_TOKENS + 1, round(math.exp(inverse((i + 0.5) / n)))))
                 for i in range(n)]
    shuffled = np.random.default_rng(seed).permutation(np.array(quantiles, dtype=np.int64))
    at_cap = 1 - statistics.NormalDist().cdf((math.log(cap) - mu) / sigma)
    return Lengths(shuffled, prompt, group, cap, _lognormal_censored_moment(mu, sigma, cap, 1),
                   _lognormal_censored_moment(mu, sigma, cap, 2), at_cap, sigma)


def reasoning_tokens(response):
    return np.maximum(1, np.asarray(response) - CONCLUDE_TOKENS - ANSWER_TOKENS - CLOSING_TOKENS)


def attributed_end(prompt: int, response):
    """The attributed sequence is cut at the last outcome position (the one predicting the last answer
    token): prompt + reasoning + conclude + answer - 1."""
    return prompt + reasoning_tokens(response) + CONCLUDE_TOKENS + ANSWER_TOKENS - 1


def outcome_positions(mode: str) -> int:
    return 1 if mode == "last" else ANSWER_TOKENS
