"""bench/credit_frontier.py: the frontier plot of gradient-check tables, on tiny generated tables."""
from __future__ import annotations

import math
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.credit_frontier import main, read_points, shown_better  # noqa: E402


def _table(path: Path, rows: list[tuple]) -> Path:
    names = ("method", "effective_batch", "cost_vs_sampling", "vs_uniform_low")
    pq.write_table(pa.table({n: [r[i] for r in rows] for i, n in enumerate(names)}), path)
    return path


def test_plot_and_table_of_two_policies(tmp_path, capsys):
    base = _table(tmp_path / "base.parquet", [("uniform", 1.0, 0.001, math.nan), ("cheap", 1.3, 0.05, 0.01),
                                              ("dear", 1.3, 0.5, 0.02)])
    part = _table(tmp_path / "part.parquet", [("uniform", 9.0, 9.0, 9.0), ("noisy", 1.1, 0.02, -0.03)])
    trained = _table(tmp_path / "trained.parquet", [("uniform", 1.0, 0.0, math.nan), ("cheap", 0.9, math.nan, -0.1)])
    out = tmp_path / "frontier.png"
    assert main(["--base", str(base), str(part), "--trained", str(trained), "-o", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = {tuple(cell.strip() for cell in line.split("|")[1:3]): line
            for line in capsys.readouterr().out.splitlines() if line.startswith(("| base", "| trained"))}
    # pays: effective batch - 1 >= cost; shown better: the interval's low end above 0
    assert rows[("base", "cheap")].endswith("| yes | yes |")
    assert rows[("base", "dear")].endswith("| no | yes |")
    assert rows[("base", "noisy")].endswith("| yes | no |")
    assert rows[("trained", "cheap")].endswith("| no | no |")  # no measured cost: not plotted, never "pays"
    assert "9.00x" not in rows[("base", "uniform")]  # a method found twice keeps its first table's row


def test_first_table_wins_and_uniform_is_not_better(tmp_path):
    a = _table(tmp_path / "a.parquet", [("uniform", 1.0, 0.0, math.nan), ("x", 1.2, 0.1, 0.001)])
    b = _table(tmp_path / "b.parquet", [("x", 0.5, 0.1, -1.0)])
    points = {p["method"]: p for p in read_points([a, b])}
    assert points["x"]["effective_batch"] == 1.2
    assert shown_better(points["x"]) and not shown_better(points["uniform"])


def test_a_table_without_the_columns_is_one_error_line(tmp_path, capsys):
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"method": ["uniform"], "cosine": [0.3]}), bad)
    assert main(["--base", str(bad), "-o", str(tmp_path / "f.png")]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("error: ") and str(bad) in error and "effective_batch" in error
    assert len(error.splitlines()) == 1 and not (tmp_path / "f.png").exists()
