"""The bench's gradient passes: each batch's gradient under each method's token advantages, scored against
a reference gradient that shares no sample with it.

Reads the policy, the pool's rows and each method's token advantages; returns plain numbers: per method
and batch the dot product with the reference and the squared norm, per method and half the squared norm
of the sum of its batch gradients and that sum's dot product with the reference (oarctl/gradient_check/
summary.py turns them into cosines, intervals and effective batches).

Order of the passes, so that memory stays at the model, one micro-batch and two flat float32 buffers
(`reference`, `running`) beside the parameters' own `.grad`:
1. `reference` = R_A, the mean uniform (plain GRPO) gradient over the batches of half A;
2. every batch of half B under every method, scored against R_A; uniform runs last, so `running` then
   holds the sum of half B's uniform gradients, and R_B = running / K replaces R_A;
3. every batch of half A under every method, scored against R_B.
That is (2 x methods + 1) x K batch gradients (K batches per half). Each batch gradient is the update's:
`training.batch_loss.mini_batch_gradient` over the whole batch as one mini-batch, micro-batched as the
update plans it, at the stored sampling log-probs (ratio 1 when the policy is the one that sampled), no KL
term (its gradient is 0 there) and the model in eval mode (no dropout: results do not depend on a seed).
Dot products are summed in float64.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from oarctl.errors import OarError
from oarctl.training.batch_loss import mini_batch_gradient

COLUMNS = ("prompt_token_ids", "response_token_ids", "response_logprobs", "temperature")


@dataclass(frozen=True)
class BatchScore:
    method: str
    half: int  # the half the batch comes from (0 = A, 1 = B); its reference is the other half's
    batch: int
    dot: float  # <g, R>
    squared_norm: float  # |g|^2
    reference_squared_norm: float  # |R|^2


@dataclass(frozen=True)
class HalfSum:
    method: str
    half: int
    squared_norm: float  # |sum of the half's batch gradients|^2
    dot: float  # <that sum, R>


def _dot(left: list[torch.Tensor], right: list[torch.Tensor]) -> float:
    return float(sum(torch.dot(a.reshape(-1).double(), b.reshape(-1).double()) for a, b in zip(left, right)))


class Bench:
    """The policy and its two flat buffers; `batch` computes one batch gradient into `.grad`."""

    def __init__(self, model, pad_id: int, update_config):
        self.model, self.pad_id, self.config = model.eval(), pad_id, update_config
        self.parameters = [p for p in model.parameters() if p.requires_grad]
        size = sum(p.numel() for p in self.parameters)
        self.reference = torch.zeros(size, dtype=torch.float32, device=self.parameters[0].device)
        self.running = torch.zeros_like(self.reference)
        self.metrics: list[dict] = []  # of the uniform batches: ratio_mean, clip_fraction (ratio 1 expected)

    def _views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        return [part.view_as(p) for part, p in zip(flat.split([p.numel() for p in self.parameters]), self.parameters)]

    def batch(self, rows: list[dict]) -> tuple[list[torch.Tensor], dict]:
        for parameter in self.parameters:
            parameter.grad = None
        metrics = mini_batch_gradient(self.model, rows, self.config, self.pad_id)
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.parameters]
        return grads, metrics

    def accumulate(self, flat: torch.Tensor, grads: list[torch.Tensor]) -> None:
        for view, grad in zip(self._views(flat), grads):
            view.add_(grad)


def batch_rows(base: list[dict], advantages: list[list[float]], rows: list[int]) -> list[dict]:
    return [{**base[i], "token_advantages": advantages[i]} for i in rows]


def _reference_of(bench: Bench, base, uniform, batches) -> None:
    """`reference` = the mean uniform gradient over `batches`."""
    bench.reference.zero_()
    for rows in batches:
        grads, _ = bench.batch(batch_rows(base, uniform, rows))
        bench.accumulate(bench.reference, grads)
    bench.reference.div_(len(batches))


def _score_half(bench: Bench, base, advantages: dict, half: int, batches, log) -> tuple[list, list]:
    """Every batch of `half` under every method (uniform last) against `reference`."""
    scores, sums = [], []
    reference_norm = float(torch.dot(bench.reference.double(), bench.reference.double()))
    if reference_norm == 0:
        raise OarError(f"the reference gradient of half {'BA'[half]} is 0: every group there has equal rewards "
                       f"(a larger pool, or a policy whose groups have mixed rewards)")
    reference_views = bench._views(bench.reference)
    for method in [m for m in advantages if m != "uniform"] + ["uniform"]:
        bench.running.zero_()
        for index, rows in enumerate(batches):
            grads, metrics = bench.batch(batch_rows(base, advantages[method], rows))
            if method == "uniform":
                bench.metrics.append(metrics)
            scores.append(BatchScore(method, half, index, _dot(grads, reference_views), _dot(grads, grads),
                                     reference_norm))
            bench.accumulate(bench.running, grads)
        running = bench._views(bench.running)
        sums.append(HalfSum(method, half, _dot(running, running), _dot(running, reference_views)))
        log(f"[gradient-check] half {'AB'[half]}: {method} ({len(batches)} batches)")
    return scores, sums


def measure(model, pad_id: int, update_config, table, advantages: dict[str, list[list[float]]],
            halves: list[list[list[int]]], log=print) -> tuple[list[BatchScore], list[HalfSum], dict]:
    """All batch scores and half sums (see the module docstring), and what the uniform batches' loss
    reported (mean ratio and clip fraction: 1 and 0 when the policy sampled the pool)."""
    base = table.select(list(COLUMNS)).to_pylist()
    bench = Bench(model, pad_id, update_config)
    _reference_of(bench, base, advantages["uniform"], halves[0])
    scores, sums = _score_half(bench, base, advantages, 1, halves[1], log)
    bench.reference.copy_(bench.running).div_(len(halves[1]))  # R_B: uniform ran last on half B
    more_scores, more_sums = _score_half(bench, base, advantages, 0, halves[0], log)
    checks = {name: sum(m[name] for m in bench.metrics) / len(bench.metrics) for name in ("ratio_mean", "clip_fraction")}
    for parameter in bench.parameters:
        parameter.grad = None
    return scores + more_scores, sums + more_sums, checks
