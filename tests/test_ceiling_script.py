"""scripts/ceiling.py, the pre-registered analysis of docs/results.md, on handmade runs whose answer is known."""
from __future__ import annotations

import contextlib
import io
import itertools
import json
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml
from conftest import load_script

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "ceiling.py"
# where every handmade run ran (the fields oarctl/provenance.py compares)
MACHINE = {"oarctl": {"version": "0.1.0", "source_sha256": "0" * 16}, "versions": {"torch": "2.13.0"},
           "machine": {"cpu": "test CPU", "cpu_capability": "AVX2", "gpu": None, "gpus": 0}}


def write_run(folder: Path, rewards: list[float], finished: bool = True, steps: int | None = None,
              provenance: dict | None = MACHINE, heldout: dict | None = None) -> None:
    """A run's config.yaml (run.steps: `steps`, default one per reward) and metrics.jsonl: the base
    evaluation, one step line per reward, the final evaluation when `finished` (greedy 0.6, or `heldout`'s)."""
    folder.mkdir(parents=True)
    config = {"run": {"seed": 0, "steps": len(rewards) if steps is None else steps}}
    (folder / "config.yaml").write_text(yaml.safe_dump({**config, "provenance": provenance} if provenance else config))
    lines = [{"kind": "eval", "after_steps": 0, "eval/greedy_accuracy": 0.5}]
    lines += [{"kind": "step", "step": step, "verify/reward_mean": r} for step, r in enumerate(rewards)]
    if finished:
        lines.append({"kind": "eval", "after_steps": len(rewards), **(heldout or {"eval/greedy_accuracy": 0.6})})
    (folder / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))


def run(*arguments) -> subprocess.CompletedProcess:
    """The script as a user runs it (a process of its own)."""
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, arguments)], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)


def run_here(ceiling, *arguments) -> SimpleNamespace:
    """The same, in this process (no second start of Python and its imports): returncode, stdout, stderr."""
    out, err, code = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            ceiling.main([str(a) for a in arguments])
        except SystemExit as exit_:
            code = exit_.code
    return SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())


def rows_of(stdout: str) -> dict[str, str]:
    return {line.split(" | ")[0][2:]: line for line in stdout.splitlines() if line.startswith("| ")}


@pytest.fixture(scope="module")
def ceiling():
    """scripts/ceiling.py as a module, for its statistics."""
    return load_script(SCRIPT)


def test_paired_differences_intervals_and_equivalence_match_a_hand_computation(tmp_path):
    rng = np.random.default_rng(0)
    base = rng.uniform(0.3, 0.6, size=6)
    gains = {"better": np.array([0.05, 0.04, 0.06, 0.05, 0.03, 0.05]), "same": np.array([0.001, -0.001] * 3)}
    for seed, value in enumerate(base):
        write_run(tmp_path / f"uniform-s{seed}", [0.0, value, value])  # step 0 is left out of the accuracy
        for name, gain in gains.items():
            write_run(tmp_path / f"{name}-s{seed}", [0.9, value + gain[seed], value + gain[seed]])
    write_run(tmp_path / "uniform-s9", [0.0, 0.9], steps=6)  # configured for 6 steps, 2 done: left out
    write_run(tmp_path / "better-s9", [0.0, 0.9])
    write_run(tmp_path / "same-s9", [0.0, 0.9])
    result = run(tmp_path, "--ceiling", "none")
    assert result.returncode == 0, result.stderr
    assert "seeds with every method finished: 6 (0, 1, 2, 3, 4, 5)" in result.stdout
    difference = 100 * gains["better"]
    half = 2.570582 * difference.std(ddof=1) / np.sqrt(6)  # Student t, 5 degrees of freedom, 97.5%
    walsh = [(a + b) / 2 for a, b in itertools.combinations_with_replacement(difference, 2)]
    # 6 of 6 seeds won: the signed-rank sum is at its maximum, p = 2 x (1/2)^6 = 0.03125
    expected = f"| better | {100 * (base + gains['better']).mean():.1f} | {difference.mean():+.2f} " \
               f"[{difference.mean() - half:+.2f}, {difference.mean() + half:+.2f}] | {np.median(walsh):+.2f} | " \
               f"0.0312 | 6/6 | — |"
    assert expected in result.stdout
    rows = rows_of(result.stdout)
    assert rows["same"].endswith("| yes |") and rows["better"].endswith("| no |")  # 90% interval inside +-1?
    assert re.search(r" \| [+-]0\.00 \| 1 \| 3/6 \| ", rows["same"])  # +-0.1 three times each: W+ at its centre, p = 1
    assert rows["uniform"] == f"| uniform | {100 * base.mean():.1f} | — | — | — | — | — | — | — |"
    assert (tmp_path / "ceiling.md").read_text() == result.stdout


def test_the_fraction_of_the_ceiling_is_reported_only_when_the_ceiling_excludes_0(tmp_path, ceiling):
    for seed, value in enumerate([0.4, 0.5, 0.45]):
        write_run(tmp_path / f"uniform-s{seed}", [0.0, value])
        write_run(tmp_path / f"truth-s{seed}", [0.0, value + 0.04 + 0.01 * seed])  # +4, +5, +6: [+2.52, +7.48]
        write_run(tmp_path / f"half-s{seed}", [0.0, value + (0.04 + 0.01 * seed) / 2])
        write_run(tmp_path / f"flat-s{seed}", [0.0, value + (0.04, -0.03, 0.01)[seed]])  # +4, -3, +1
    result = run_here(ceiling, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "ceiling truth - uniform: +5.00 [+2.52, +7.48] points (95% CI), excludes 0" in result.stdout
    assert "| half | " in result.stdout and " | 0.50 [0.50, 0.50] | " in result.stdout
    flat = run_here(ceiling, tmp_path, "--ceiling", "flat")  # the same runs with a ceiling whose interval includes 0
    assert flat.returncode == 0, flat.stderr
    assert "ceiling flat - uniform: +0.67 [" in flat.stdout
    assert "includes 0: the fraction of it is not reported" in flat.stdout
    rows = rows_of(flat.stdout)
    assert " | not reported | " in rows["half"] and " | not reported | " in rows["truth"]
    missing = run_here(ceiling, tmp_path, "--ceiling", "oracle")
    assert missing.returncode == 2 and "no finished run of 'oracle'" in missing.stderr


def test_a_run_is_finished_when_it_recorded_its_configured_steps(tmp_path, ceiling):
    write_run(tmp_path / "done", [0.0, 0.5, 0.7], finished=False)  # every step, its final evaluation not yet written
    write_run(tmp_path / "short", [0.0, 0.5, 0.7], steps=4)  # evaluated after 3 of its 4 steps
    assert ceiling.on_policy(tmp_path / "done") == 0.6 and ceiling.on_policy(tmp_path / "short") is None
    write_run(tmp_path / "longer", [0.0, 0.5, 0.7, 0.9], steps=3)  # trained on past its budget: step 3 not counted
    assert ceiling.on_policy(tmp_path / "longer") == 0.6
    (tmp_path / "uniform-s1").mkdir()
    (tmp_path / "uniform-s1" / "metrics.jsonl").write_text("")
    refused = run_here(ceiling, tmp_path)
    missing = tmp_path / "uniform-s1" / "config.yaml"
    assert refused.returncode == 2
    assert refused.stderr == f"error: {missing}: file not found (the configured steps tell when a run has finished)\n"


def test_runs_of_another_machine_are_refused_unless_allow_mixed(tmp_path, ceiling):
    other = {**MACHINE, "versions": {"torch": "2.14.0"}}
    for seed, value in enumerate([0.4, 0.5]):
        write_run(tmp_path / f"uniform-s{seed}", [0.0, value])
        write_run(tmp_path / f"truth-s{seed}", [0.0, value + 0.05], provenance=other if seed else MACHINE)
    refused = run_here(ceiling, tmp_path)
    assert refused.returncode == 2 and len(refused.stderr.splitlines()) == 1 and not refused.stdout
    assert "torch 2.13.0 vs 2.14.0" in refused.stderr and "--allow-mixed" in refused.stderr
    mixed = run_here(ceiling, tmp_path, "--allow-mixed")
    assert mixed.returncode == 0 and "provenance MIXED (compared anyway, --allow-mixed)" in mixed.stdout
    for seed in (0, 1):
        write_run(tmp_path / f"late-s{seed}", [0.0, 0.5], provenance=None)  # no provenance at all: unknown
    assert "recorded no provenance" in run_here(ceiling, tmp_path, "--allow-mixed").stdout


def test_seeds_restricts_the_analysis_to_one_seed_set(tmp_path, ceiling):
    """--seeds 1-3 analyses seeds 1..3 only and writes ceiling-s1-3.md; seeds 4-5 tell another story."""
    for seed in range(1, 6):
        gain = 0.1 if seed <= 3 else -0.1 + 0.01 * seed  # set 1-3: +10 points; set 4-5: about -5.5
        write_run(tmp_path / f"uniform-s{seed}", [0.3, 0.4, 0.5 + 0.01 * seed])
        write_run(tmp_path / f"truth-s{seed}", [0.3, 0.4 + gain, 0.5 + 0.01 * seed + gain])
    first = run_here(ceiling, tmp_path, "--seeds", "1-3", "--ceiling", "none")
    assert first.returncode == 0 and first.stdout.startswith("seeds with every method finished: 3 (1, 2, 3)")
    assert rows_of(first.stdout)["truth"].startswith("| truth | 56.0 | +10.00 [+10.00, +10.00] |")
    assert (tmp_path / "ceiling-s1-3.md").read_text() == first.stdout and not (tmp_path / "ceiling.md").exists()
    second = run_here(ceiling, tmp_path, "--seeds", "4,5", "--ceiling", "none")
    assert second.returncode == 0 and second.stdout.startswith("seeds with every method finished: 2 (4, 5)")
    assert rows_of(second.stdout)["truth"].startswith("| truth | 41.8 | -5.50 [-11.85, +0.85] |")
    bad = run_here(ceiling, tmp_path, "--seeds", "one-two")
    assert bad.returncode == 2 and bad.stderr.startswith("error: --seeds: expected FIRST-LAST")


def test_the_half_ceiling_contrast_and_the_figures(tmp_path, ceiling):
    """(method - uniform) - 0.5 (truth - uniform) paired by seed: 0 for a method at exactly half the ceiling,
    -2.5 for one at uniform when the ceiling is +5; --figures writes the forest plot and the curves as PNGs,
    the same bytes each time."""
    for seed, value in enumerate([0.4, 0.5, 0.45]):
        write_run(tmp_path / f"uniform-s{seed}", [0.0, value])
        write_run(tmp_path / f"truth-s{seed}", [0.0, value + 0.04 + 0.01 * seed])  # +4, +5, +6
        write_run(tmp_path / f"half-s{seed}", [0.0, value + (0.04 + 0.01 * seed) / 2])
        write_run(tmp_path / f"same-s{seed}", [0.0, value])
    result = run_here(ceiling, tmp_path, "--figures")
    assert result.returncode == 0, result.stderr
    assert "half-ceiling contrast, (method - uniform) - 0.5 x (truth - uniform)" in result.stdout
    half = re.search(r"^- half: (\S+) \[(\S+), (\S+)\]$", result.stdout, re.M)
    assert half and all(abs(float(x)) < 1e-9 for x in half.groups())  # float rounding may print -0.00
    assert "- same: -2.50 [-3.74, -1.26]" in result.stdout  # -2, -2.5, -3
    forest, curves = tmp_path / "forest.png", tmp_path / "curves.png"
    assert f"wrote {forest}" in result.stdout and f"wrote {curves}" in result.stdout
    first = forest.read_bytes(), curves.read_bytes()
    assert all(data.startswith(b"\x89PNG") for data in first)
    assert run_here(ceiling, tmp_path, "--figures").returncode == 0
    assert (forest.read_bytes(), curves.read_bytes()) == first


def test_held_out_accuracy_after_the_last_step_is_scored_with_the_same_tests(tmp_path, ceiling):
    for seed, value in enumerate([0.4, 0.5, 0.45]):
        for method, gain in (("uniform", 0.0), ("better", 0.02 + 0.01 * seed)):  # +2, +3, +4 points
            write_run(tmp_path / f"{method}-s{seed}", [0.0, 0.5],
                      heldout={"eval/greedy_accuracy": value + gain, "eval/avg@1": value - gain})
    write_run(tmp_path / "better-s3", [0.0, 0.5], heldout={"eval/avg@1": 0.5})  # no greedy: left out of that table
    write_run(tmp_path / "uniform-s3", [0.0, 0.5], heldout={"eval/avg@1": 0.5})
    greedy = run_here(ceiling, tmp_path, "--metric", "heldout_greedy", "--ceiling", "none")
    assert greedy.returncode == 0, greedy.stderr
    assert greedy.stdout.startswith("seeds with every method finished: 3 (0, 1, 2)")
    assert "| method | held-out greedy accuracy |" in greedy.stdout
    assert rows_of(greedy.stdout)["better"].startswith("| better | 48.0 | +3.00 [+0.52, +5.48] | +3.00 |")
    assert (tmp_path / "ceiling-heldout_greedy.md").read_text() == greedy.stdout
    sampled = run_here(ceiling, tmp_path, "--metric", "heldout_sampled", "--ceiling", "none")
    assert sampled.stdout.startswith("seeds with every method finished: 4 (0, 1, 2, 3)")
    assert rows_of(sampled.stdout)["better"].startswith("| better | 44.0 | -2.25 [-4.97, +0.47] |")
    refused = run_here(ceiling, tmp_path, "--metric", "heldout_greedy", "--figures")
    assert refused.returncode == 2 and refused.stderr.startswith("error: --figures draws the on-policy accuracy")


def write_seconds(folder: Path, seconds_a_step: float, steps: int) -> None:
    """A kept run's seconds.json (scripts/keep_seconds.py's format): every step costs `seconds_a_step`."""
    step = {"sample": seconds_a_step / 2, "verify": 0.0, "attribute": seconds_a_step / 4, "reshape": 0.0,
            "update": seconds_a_step / 4}
    (folder / "seconds.json").write_text(json.dumps({"steps": [step] * steps}))


def test_equal_time_counts_the_steps_the_baselines_wall_clock_reaches(tmp_path, ceiling):
    """Runs of 7 steps (policies 1-6 scored); `slow` costs ~3x the baseline a step, so in the baseline's
    time (6 x 11 s) it reaches 6 x 11 / 31 = 2.129 steps: steps 1 and 2, and 0.129 of step 3."""
    for seed, start in enumerate([0.30, 0.40, 0.35]):
        rewards = [0.0] + [start + 0.01 * step for step in range(1, 7)]
        for method, cost, shift in (("control", 10.0, 0.0), ("slow", 30.0, 0.05), ("cheap", 5.0, 0.0)):
            write_run(tmp_path / f"{method}-s{seed}", [r + shift * (i > 0) for i, r in enumerate(rewards)])
            write_seconds(tmp_path / f"{method}-s{seed}", cost + seed, 7)  # medians: 11, 31, 6
    result = run_here(ceiling, tmp_path, "--metric", "equal_time", "--baseline", "control", "--ceiling", "none")
    assert result.returncode == 0, result.stderr
    assert "equal time: control's last scored policy (step 6) comes after 6 x 11.0 s" in result.stdout
    assert "- slow: 31.0 s a step, 2.13 steps\n" in result.stdout
    assert "- cheap: 6.0 s a step, 6.00 steps (capped: its runs have no later steps)" in result.stdout
    # slow: start + 0.05 + 0.01 x (1 + 2 + 0.129 x 3) / 2.129 = start + 0.0659; control over 1-6: start + 0.035
    reach = 6 * 11 / 31
    gain = 100 * (0.05 + 0.01 * (1 + 2 + (reach - 2) * 3) / reach - 0.035)
    assert rows_of(result.stdout)["slow"].startswith(f"| slow | {35 + 3.5 + gain:.1f} | {gain:+.2f} [{gain:+.2f}, ")
    assert rows_of(result.stdout)["cheap"].startswith("| cheap | 38.5 | +0.00 [")
    assert (tmp_path / "ceiling-equal_time.md").is_file()
    (tmp_path / "slow-s1" / "seconds.json").unlink()
    missing = run_here(ceiling, tmp_path, "--metric", "equal_time", "--baseline", "control")
    assert missing.returncode == 2
    assert missing.stderr == (f"error: {tmp_path / 'slow-s1'}: no stage seconds for each of its 7 steps "
                              "(scripts/keep_seconds.py keeps them beside a kept run)\n")


def test_the_bench_prediction_beside_the_measured_gains(tmp_path, ceiling):
    # uniform 40..46 points; the 1.5x control +2 on every seed, so 0.5 more batch buys 2 points: k = 2.5
    # predicts (2.5 - 1) / 0.5 x 2 = +6 and k = 0.5 predicts -2. truth measures +6 +- 0.5 (inside), ktae
    # -1 +- 0.5: its 95% interval, -1 +- 3.182 x 0.577 / 2 = [-1.92, -0.08], leaves -2 out.
    for seed, base in enumerate([0.40, 0.42, 0.44, 0.46]):
        wobble = 0.005 if seed % 2 else -0.005
        for method, value in (("uniform", base), ("uniform_1.5x", base + 0.02), ("truth", base + 0.06 + wobble),
                              ("ktae", base - 0.01 + wobble)):
            write_run(tmp_path / f"{method}-s{seed}", [0.5, value, value])
    result = run_here(ceiling, tmp_path, "--ceiling", "none", "--predict", "truth=2.5,ktae=0.5",
                      "--control", "uniform_1.5x=1.5")
    assert result.returncode == 0, result.stderr
    assert "predicted gain = (k - 1) / (1.5 - 1) x (uniform_1.5x - uniform) = (k - 1) x +4.00 points" in result.stdout
    rows = {line.split(" | ")[0][2:]: line for line in result.stdout.split("the bench's prediction")[1].splitlines()
            if line.startswith("| ")}
    assert rows["truth"] == "| truth | 2.50 | +6.00 | +6.00 [+5.08, +6.92] | yes |"
    assert rows["ktae"] == "| ktae | 0.50 | -2.00 | -1.00 [-1.92, -0.08] | no |"
    assert ("measured gains in the predicted order: yes; every prediction inside its interval: no -> the bench "
            "does not predict training here") in result.stdout


@pytest.mark.parametrize("arguments, message", [
    (["--predict", "truth=2"], "--predict and --control go together"),
    (["--predict", "truth", "--control", "uniform_1.5x=1.5"], "--predict: expected METHOD=NUMBER"),
    (["--predict", "truth=2", "--control", "uniform_1.5x=1"], "--control: expected one METHOD=FACTOR with FACTOR above 1"),
    (["--predict", "oar_p=2", "--control", "uniform_1.5x=1.5"], "--predict/--control: no finished run of 'oar_p'"),
])
def test_bench_prediction_options_are_refused_in_one_line(tmp_path, ceiling, arguments, message):
    for seed in range(2):
        for method in ("uniform", "uniform_1.5x"):
            write_run(tmp_path / f"{method}-s{seed}", [0.5, 0.4 + seed / 10, 0.4])
    result = run_here(ceiling, tmp_path, "--ceiling", "none", *arguments)
    assert result.returncode == 2 and result.stderr.startswith("error: ") and message in result.stderr
    assert result.stderr.count("\n") == 1
