"""The predictions beside a GPU measurement (bench/scale.py --measured: bench/gpu_check.py's long attribute
rows), and OARGRPOTrainer's weight memory per GPU (bench/scale.py --trl)."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from oarctl.config import Config

from bench.gpu_parts.long import LONG_BUDGET, LONG_CHUNK, LONG_METHODS, long_attribute_knobs  # (no torch)
from bench.scaling.attribute import attribute_stage
from bench.scaling.cost import Cost
from bench.scaling.formulas import parameters, trl_attribution_weight_bytes
from bench.scaling.lengths import Lengths
from bench.scaling.model import GB, SHAPES, Hardware, Shape
from bench.scaling.setting import Setting, apply_overrides


# bench/gpu_check.py's part long: its rows' methods and the attribute knobs it ran them with (its defaults)
GPU_CHECK_LONG = {f"long_attribute_{method}": (method, extra)
                  for method, extra in {**LONG_METHODS, "oar_p": []}.items()}
GPU_CHECK_KNOBS = long_attribute_knobs(LONG_BUDGET, LONG_CHUNK)


def one_gpu_attribute(shape: Shape, hw: Hardware, method: str, rows: int, group: int, prompt: int, response: int,
                      overrides: list[str]) -> Cost:
    """The attribute stage's predicted cost on one GPU for `rows` responses of one length."""
    config = Config()
    apply_overrides(config, overrides)
    lengths = Lengths(np.full(rows, response, dtype=np.int64), prompt, min(group, rows), response, response,
                      response ** 2, 1.0, 0.0)
    return attribute_stage(Setting("gpu_check", shape, config, lengths, 1.0), hw, method)


def measured_rows(log: Path) -> dict[str, tuple[float, float, int]]:
    """{row: (seconds, peak GiB, responses)} of a bench/gpu_check.py output's long attribute rows."""
    rows = {}
    for line in log.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 5 and parts[0] in GPU_CHECK_LONG and parts[3].isdigit():
            rows[parts[0]] = (float(parts[1]), float(parts[2]), int(parts[3]))
    return rows


def against_measured(log: Path, hw: Hardware, prompt: int, response: int) -> list[str]:
    """Predicted (these formulas, 1 GPU) beside measured (the log) for gpu_check's long attribute rows at
    the 1.5B shape; the efficiency each row really reached is predicted_at_1.0 / measured."""
    one = replace(hw, gpus=1)
    perfect = replace(one, efficiency=1.0)
    lines = [f"{'row':<32} {'responses':>9} {'measured s':>10} {'predicted s':>11} {'ratio':>6} "
             f"{'reached':>8} {'measured GiB':>12} {'predicted GB':>12}"]
    for name, (seconds, peak, rows) in measured_rows(log).items():
        method, extra = GPU_CHECK_LONG[name]
        knobs = GPU_CHECK_KNOBS + extra
        predicted = one_gpu_attribute(SHAPES["1.5b"], one, method, rows, 8, prompt, response, knobs)
        best = one_gpu_attribute(SHAPES["1.5b"], perfect, method, rows, 8, prompt, response, knobs)
        lines.append(f"{name:<32} {rows:>9} {seconds:>10.1f} {predicted.seconds:>11.1f} "
                     f"{seconds / predicted.seconds:>6.2f} {best.seconds / seconds:>8.2f} {peak:>12.2f} "
                     f"{predicted.held_bytes / GB:>12.2f}")
    return lines


def print_trl_memory(shape: Shape, gpus: int) -> None:
    print(f"OARGRPOTrainer attribution, {shape.name} ({parameters(shape) / 1e9:.2f} B parameters) on {gpus} GPUs: "
          f"weight bytes per GPU (PREDICTED; formulas in trl_attribution_weight_bytes)")
    for mode, held in trl_attribution_weight_bytes(shape, gpus).items():
        print(f"  {mode:<15} {held / GB:7.1f} GB")
