"""A long run: 200 steps of the toy demo keep resident memory flat and grow the run folder linearly.

Slow (about 15 minutes on 2 cores): `make test-all` runs it, CI does not. The `oarctl run`
subprocess is watched from outside: at each "step k/N" line its resident memory (VmRSS from /proc)
and the run folder's size on disk are recorded. `OARCTL_SOAK_STEPS` shortens it;
`OARCTL_SOAK_REPORT=file.json` keeps the curve.
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
RSS_GROWTH_BOUND_MB = 64.0    # allowed rise of resident memory from the warm-up to the end
SIZE_LINEARITY = 0.99         # R^2 of the run folder's size against the step number


def resident_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def folder_mb(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 2 ** 20


def soak_config(tmp_path: Path, steps: int) -> Path:
    config = yaml.safe_load((REPO / "configs" / "demo.yaml").read_text())
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
    curve = watch_run(soak_config(tmp_path, steps), tmp_path / "run")
    if os.environ.get("OARCTL_SOAK_REPORT"):
        Path(os.environ["OARCTL_SOAK_REPORT"]).write_text(json.dumps(curve, indent=1))
    assert [point["step"] for point in curve] == list(range(1, steps + 1))

    settled = [p for p in curve if p["step"] > WARM_UP]
    step = np.array([p["step"] for p in settled], dtype=float)
    rss = np.array([p["rss_mb"] for p in settled])
    size = np.array([p["run_dir_mb"] for p in settled])
    growth = float(np.median(rss[-10:]) - np.median(rss[:10]))
    rss_slope, _ = linear_fit(step, rss)
    size_slope, size_r2 = linear_fit(step, size)
    print(f"\nresident memory: {rss[0]:.0f} MiB after step {WARM_UP + 1}, {rss[-1]:.0f} MiB after step {steps}; "
          f"median growth {growth:+.1f} MiB, slope {rss_slope * 100:+.2f} MiB per 100 steps")
    print(f"run folder: {size[0]:.1f} -> {size[-1]:.1f} MiB, {size_slope * 1024:.0f} KiB per step, R^2 {size_r2:.4f}")
    assert growth < RSS_GROWTH_BOUND_MB, f"resident memory grew {growth:.0f} MiB over {steps} steps"
    assert rss_slope * steps < RSS_GROWTH_BOUND_MB, f"resident memory trends up {rss_slope:.2f} MiB per step"
    assert size_r2 > SIZE_LINEARITY, f"run folder size is not linear in steps (R^2 {size_r2:.4f})"
