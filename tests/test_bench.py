"""The benchmarks run end to end (in their small `--quick` form) and report identical scores."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

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
