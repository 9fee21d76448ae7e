"""What a prediction assumes beyond the formulas, set once a run from the command line (bench/scale.py
--fragmentation, --disk-gbps, --hash-gbps): the allocator headroom on activations (calibrated, below)
and the checkpoint disk and sha256 rates."""
from __future__ import annotations

_FRAGMENTATION = {"value": 1.25}  # --fragmentation
_IO = {"disk": 3.0, "hash": 1.07}  # --disk-gbps, --hash-gbps


def configure(headroom: float, disk_gbps: float, hash_gbps: float) -> None:
    """The run's --fragmentation, --disk-gbps and --hash-gbps."""
    _FRAGMENTATION["value"] = headroom
    _IO.update(disk=disk_gbps, hash=hash_gbps)


def fragmentation() -> float:
    """Allocator headroom on activations: the caching allocator's peak over the saved tensors
    (measured 2026-12-03 on a scaled random Qwen2, hidden 448: ~1.24x on OAR-G)."""
    return _FRAGMENTATION["value"]


def io_rates() -> tuple[float, float]:
    """(disk GB/s per writer, sha256 GB/s per thread) of the checkpoint traffic."""
    return _IO["disk"], _IO["hash"]
