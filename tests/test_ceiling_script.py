"""scripts/ceiling.py, the pre-registered analysis of docs/results.md, on handmade runs whose answer is known."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "ceiling.py"


def write_run(folder: Path, rewards: list[float], finished: bool = True) -> None:
    """A run's metrics.jsonl: the base evaluation, one step line per reward, the final evaluation."""
    folder.mkdir(parents=True)
    lines = [{"kind": "eval", "after_steps": 0, "eval/greedy_accuracy": 0.5}]
    lines += [{"kind": "step", "step": step, "verify/reward_mean": r} for step, r in enumerate(rewards)]
    if finished:
        lines.append({"kind": "eval", "after_steps": len(rewards), "eval/greedy_accuracy": 0.6})
    (folder / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))


def run(*arguments) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, arguments)], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)


def test_paired_differences_intervals_and_equivalence_match_a_hand_computation(tmp_path):
    rng = np.random.default_rng(0)
    base = rng.uniform(0.3, 0.6, size=6)
    gains = {"better": np.array([0.05, 0.04, 0.06, 0.05, 0.03, 0.05]), "same": np.array([0.001, -0.001] * 3)}
    for seed, value in enumerate(base):
        write_run(tmp_path / f"uniform-s{seed}", [0.0, value, value])  # step 0 is left out of the accuracy
        for name, gain in gains.items():
            write_run(tmp_path / f"{name}-s{seed}", [0.9, value + gain[seed], value + gain[seed]])
    write_run(tmp_path / "better-s9", [0.0, 0.9], finished=False)  # unfinished: left out
    result = run(tmp_path, "--ceiling", "none")
    assert result.returncode == 0, result.stderr
    assert "seeds with every method finished: 6 (0, 1, 2, 3, 4, 5)" in result.stdout
    difference = 100 * gains["better"]
    half = 2.570582 * difference.std(ddof=1) / np.sqrt(6)  # Student t, 5 degrees of freedom, 97.5%
    expected = f"| better | {100 * (base + gains['better']).mean():.1f} | {difference.mean():+.2f} " \
               f"[{difference.mean() - half:+.2f}, {difference.mean() + half:+.2f}] | 6/6 | — |"
    assert expected in result.stdout
    rows = {line.split(" | ")[0][2:]: line for line in result.stdout.splitlines() if line.startswith("| ")}
    assert rows["same"].endswith("| yes |") and rows["better"].endswith("| no |")  # 90% interval inside +-1?
    assert rows["uniform"] == f"| uniform | {100 * base.mean():.1f} | — | — | — | — | — |"
    assert (tmp_path / "ceiling.md").read_text() == result.stdout


def test_the_fraction_of_the_ceiling_and_a_missing_ceiling(tmp_path):
    for seed, value in enumerate([0.4, 0.5, 0.45]):
        write_run(tmp_path / f"uniform-s{seed}", [0.0, value])
        write_run(tmp_path / f"truth-s{seed}", [0.0, value + 0.04 + 0.01 * seed])
        write_run(tmp_path / f"half-s{seed}", [0.0, value + (0.04 + 0.01 * seed) / 2])
    result = run(tmp_path)
    assert result.returncode == 0, result.stderr
    assert "| half | " in result.stdout and " | 0.50 [0.50, 0.50] | " in result.stdout
    missing = run(tmp_path, "--ceiling", "oracle")
    assert missing.returncode != 0 and "no finished run of 'oracle'" in missing.stderr
