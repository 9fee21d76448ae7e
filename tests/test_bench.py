"""The benchmarks run end to end (in their small `--quick` form) and report identical scores."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


def test_attribution_benchmark_quick_run_reports_exact_scores():
    result = subprocess.run([sys.executable, str(BENCH / "attribution.py"), "--quick"], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    differences = [float(d) for d in re.findall(r"x\s+(\d\.\de[-+]\d\d)", result.stdout)]
    assert len(differences) == 4  # two lengths on two models
    assert max(differences) < 1e-4
    assert re.search(r"attribute oar_g\s+\d+\.\d+\s+\d+\.\d+", result.stdout)
    assert re.search(r"^update\s+\d+\.\d+\s+1\.00$", result.stdout, re.MULTILINE)


def test_verify_benchmark_quick_run_gives_math_verify_verdicts():
    """bench/verify.py --quick: the same verdicts as sequential math-verify, cold and warm pool."""
    sys.path.insert(0, str(BENCH))
    try:
        from verify import DATA
    finally:
        sys.path.remove(str(BENCH))
    if not DATA.exists():
        pytest.skip(f"no {DATA}")
    result = subprocess.run([sys.executable, str(BENCH / "verify.py"), "--quick"], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "agreement: 320/320 verdicts agree, 0 differ" in result.stdout
    assert re.search(r"^ours: verify_batch, lenient, cold pool\s+320\s+\d+\.\d+\s+\d+\.\d+\s+\d+\.\dx\s+\d+\.\d+$",
                     result.stdout, re.MULTILINE)
    assert re.search(r"^\(ours, warm pool, as across training steps\)\s+320\s", result.stdout, re.MULTILINE)
    assert "verdicts differ from the cold pool's" not in result.stdout


@pytest.mark.slow  # ~10 s of one core, 25 s on the busy development machine
def test_method_deviations_benchmark_small_run_measures_every_deviation():
    """bench/method_deviations.py on 1 prompt x 2: every section runs, and the carried quantile
    suppresses fewer tokens after the first rollout than the paper's fixed q (docs/method.md, section 7)."""
    result = subprocess.run([sys.executable, str(BENCH / "method_deviations.py"), "--prompts", "1", "--group", "2"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert [int(n) for n in re.findall(r"^(\d)\. ", result.stdout, re.MULTILINE)] == [1, 2, 3, 4, 5]
    later = [float(x) for x in re.findall(r"rollouts 2\.\.: mean (\d+\.\d+)", result.stdout)]
    assert len(later) == 2 and later[1] < later[0]


def test_flow_cost_benchmark_prints_both_methods_and_their_ratio_per_length():
    """bench/flow_cost.py on two short lengths: a row per length with oar_p_span, oar_flow_local, the
    measured ratio (their quotient) and the predicted one, and oar_flow only up to --exact-up-to."""
    result = subprocess.run([sys.executable, str(BENCH / "flow_cost.py"), "--lengths", "24,48", "--rows", "1",
                             "--exact-up-to", "24"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    rows = re.findall(r"^\| (\d+) \| (\d+\.\d+) \| (\d+\.\d+) \| (\d+\.\d+) \| (\d+\.\d+) \| (.+) \|$", result.stdout,
                      re.MULTILINE)
    assert [int(r[0]) for r in rows] == [24, 48]
    for _, span, local, ratio, predicted, exact in rows:
        assert float(span) >= 0 and float(local) > 0 and float(predicted) > 0
    assert rows[0][5] != "(not run)" and rows[1][5] == "(not run)"
