"""A long run: 200 steps of the toy demo keep resident memory flat and grow the run folder linearly.

Slow (15-30 minutes on 2 cores): `make test-all` runs it, CI does not. The `oarctl run`
subprocess is watched from outside: at each "step k/N" line its resident memory (VmRSS from /proc)
and the run folder's size are recorded. The size read while the run goes on is noisy (a checkpoint
being written or pruned at that moment is ~11 MB on the toy), so linear growth is checked after
the run, folder by folder: every step leaves artifacts of about the same size, and only the
checkpoints meant to stay (the last `run.keep_checkpoints` and the evaluated ones) are still there.
`OARCTL_SOAK_STEPS` shortens it; `OARCTL_SOAK_REPORT=file.json` keeps the curves.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
STEP_LINE = re.compile(r"^step (\d+)/(\d+):")
WARM_UP = 10                  # steps before memory is expected to settle (allocator, caches)
WINDOW = 20                   # steps per median: RSS read at a step line swings by +-150 MiB (measured)
RSS_GROWTH_BOUND_MB = 64.0    # allowed rise of the median resident memory from the first window to the last
TREND_BOUND_MB = 32.0         # allowed upward trend over the second half, per 100 steps: a leak keeps growing
SIZE_LINEARITY = 0.999        # R^2 of the cumulative size of the step folders against the step number
STEP_SIZE_SPREAD = 1.5        # the largest step folder (without weights) against the median one


def resident_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def folder_mb(folder: Path) -> float:
    """Size on disk; read while the run writes, so a file or folder may vanish (pruned, renamed)."""
    for _ in range(100):
        try:
            paths = list(folder.rglob("*"))
            break
        except FileNotFoundError:
            continue
    total = 0
    for path in paths:
        try:
            total += path.stat().st_size if path.is_file() else 0
        except FileNotFoundError:
            pass
    return total / 2 ** 20


def step_folder_sizes(run_dir: Path) -> tuple[list[float], list[int]]:
    """(MiB of each step folder without its policy weights, steps whose weights are still on disk)."""
    sizes, kept = [], []
    for index, folder in enumerate(sorted(run_dir.glob("step_*"))):
        weights = folder / "policy" / "model.safetensors"
        if weights.exists():
            kept.append(index)
        sizes.append(folder_mb(folder) - (weights.stat().st_size / 2 ** 20 if weights.exists() else 0.0)
                     - (folder_mb(folder / "policy" / "training_state") if (folder / "policy" / "training_state").is_dir()
                        else 0.0))
    return sizes, kept


def soak_config(tmp_path: Path, steps: int) -> Path:
    config = yaml.safe_load((REPO / "configs" / "arithmetic.yaml").read_text())
    config["run"].update(steps=steps, progress=False, eval_every=50)
    config["sample"]["prompts_per_step"] = 32   # a quarter of the demo batch: 256 responses a step
    config["update"]["mini_batch_size"] = 256
    path = tmp_path / "soak.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def watch_run(config: Path, run_dir: Path) -> list[dict]:
    """Run `oarctl run` and record (step, rss_mb, run_dir_mb) at each step line."""
    command = [sys.executable, "-m", "oarctl.cli", "run", "-c", str(config), "--run-dir", str(run_dir)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={**os.environ, "OMP_NUM_THREADS": "1"})
    curve, tail = [], []
    for line in process.stdout:
        tail = (tail + [line])[-20:]
        match = STEP_LINE.match(line)
        if match:
            curve.append({"step": int(match.group(1)), "rss_mb": resident_mb(process.pid),
                          "run_dir_mb": folder_mb(run_dir)})
    assert process.wait() == 0, "".join(tail)
    return curve


def linear_fit(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(slope, R^2) of a least-squares line."""
    slope, intercept = np.polyfit(x, y, 1)
    residual = y - (slope * x + intercept)
    return float(slope), float(1 - residual.var() / y.var())


@pytest.mark.slow
def test_two_hundred_steps_keep_memory_flat_and_disk_linear(tmp_path):
    steps = int(os.environ.get("OARCTL_SOAK_STEPS", "200"))
    run_dir = tmp_path / "run"
    curve = watch_run(soak_config(tmp_path, steps), run_dir)
    sizes, kept = step_folder_sizes(run_dir)
    if os.environ.get("OARCTL_SOAK_REPORT"):
        Path(os.environ["OARCTL_SOAK_REPORT"]).write_text(json.dumps(
            {"curve": curve, "step_folder_mb": sizes, "checkpoints_kept": kept}, indent=1))
    assert [point["step"] for point in curve] == list(range(1, steps + 1))

    check_memory_and_disk(curve, sizes, kept, steps)
    print(f"run folder {folder_mb(run_dir):.1f} MiB")


def check_memory_and_disk(curve: list[dict], sizes: list[float], kept: list[int], steps: int) -> None:
    settled = [p for p in curve if p["step"] > WARM_UP]
    window = min(WINDOW, max(1, len(settled) // 3))
    step = np.array([p["step"] for p in settled], dtype=float)
    rss = np.array([p["rss_mb"] for p in settled])
    growth = float(np.median(rss[-window:]) - np.median(rss[:window]))
    second_half = step > steps / 2
    trend = linear_fit(step[second_half], rss[second_half])[0] * 100 if steps >= 50 else 0.0
    size_slope, size_r2 = linear_fit(np.arange(1, steps + 1, dtype=float), np.cumsum(sizes))
    print(f"\nresident memory (median of {window} steps): {np.median(rss[:window]):.0f} MiB after step {WARM_UP}, "
          f"{np.median(rss[-window:]):.0f} MiB at the end ({growth:+.1f} MiB); second-half trend {trend:+.1f} MiB "
          f"per 100 steps; range {rss.min():.0f}-{rss.max():.0f} MiB")
    print(f"step folders without weights: median {np.median(sizes) * 1024:.0f} KiB, max {max(sizes) * 1024:.0f} KiB; "
          f"cumulative {size_slope * 1024:.0f} KiB per step, R^2 {size_r2:.5f}; weights kept for steps {kept}")
    assert growth < RSS_GROWTH_BOUND_MB, f"resident memory grew {growth:.0f} MiB over {steps} steps"
    assert trend < TREND_BOUND_MB, f"resident memory still trends up in the second half: {trend:.1f} MiB per 100 steps"
    assert max(sizes) < STEP_SIZE_SPREAD * float(np.median(sizes)), "a step folder is much larger than the others"
    assert size_r2 > SIZE_LINEARITY, f"run folder size is not linear in steps (R^2 {size_r2:.5f})"
    evaluated = {k for k in range(steps) if (k + 1) % 50 == 0 or k + 1 == steps}
    assert set(kept) == evaluated | set(range(steps - 2, steps)), kept  # keep_checkpoints 2 + evaluated
