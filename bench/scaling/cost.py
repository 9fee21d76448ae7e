"""Cost bookkeeping: a stage's work summed over all GPUs, the seconds of its slowest GPU, and the bytes
it holds per GPU at its peak, by term."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from bench.scaling.formulas import roofline_seconds
from bench.scaling.model import Hardware


@dataclass
class Cost:
    """A stage (or a part of one): work summed over all GPUs, seconds of the slowest GPU, bytes held
    per GPU at the peak (by term)."""
    flops: float = 0.0
    hbm_bytes: float = 0.0
    link_bytes: float = 0.0
    seconds: float = 0.0
    held: dict = field(default_factory=dict)
    note: str = ""
    token_forwards: float = 0.0  # OAR-P: perturbed token-forwards
    vllm_fits: bool = True  # sample: vLLM's needs within gpu_memory_utilization
    decode_steps: int = 0

    def add(self, flops, hbm_bytes, hw: Hardware, dtype: str, link_bytes=0.0) -> float:
        seconds = float(np.sum(roofline_seconds(flops, hbm_bytes, link_bytes, hw, dtype)))
        self.flops += float(np.sum(flops))
        self.hbm_bytes += float(np.sum(hbm_bytes))
        self.link_bytes += float(np.sum(link_bytes))
        self.seconds += seconds
        return seconds

    def hold(self, **terms) -> None:
        """Keep, per term, the largest value seen (transient terms peak at the biggest batch)."""
        for name, value in terms.items():
            self.held[name] = max(self.held.get(name, 0.0), float(value))

    @property
    def held_bytes(self) -> float:
        return sum(self.held.values())

    def merge(self, other: "Cost") -> None:
        self.flops += other.flops
        self.hbm_bytes += other.hbm_bytes
        self.link_bytes += other.link_bytes
        self.seconds += other.seconds
        self.token_forwards += other.token_forwards
        self.hold(**other.held)


def spread_over_ranks(parts: list[Cost], ranks: int) -> Cost:
    """Whole groups dealt to `ranks` replicas, largest first to the least loaded (as even as
    oarctl.distributed.deal's token counts): the stage lasts as long as its busiest rank."""
    loads = [0.0] * ranks
    total = Cost()
    for part in sorted(parts, key=lambda p: -p.seconds):
        loads[loads.index(min(loads))] += part.seconds
        total.flops += part.flops
        total.hbm_bytes += part.hbm_bytes
        total.token_forwards += part.token_forwards
        total.hold(**part.held)
    total.seconds = max(loads) if parts else 0.0
    return total
