"""Paired margins against uniform (`oarctl compare`): per-prompt differences by hand, intervals,
grouping of runs whose reshape options differ."""
from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml
from test_compare import fake_run

from oarctl.report.compare import method_label
from oarctl.report.paired import differences, margin, per_prompt


def write_eval(folder, greedy: list[float], sampled: list[list[float]], step: int = 9) -> None:
    """eval/step_NNNN.parquet with one greedy and k sampled rows per prompt p0, p1, ..."""
    rows = []
    for index, (g, samples) in enumerate(zip(greedy, sampled)):
        rows.append({"prompt_id": f"p{index}", "mode": "greedy", "reward": g})
        rows += [{"prompt_id": f"p{index}", "mode": "sampled", "reward": r} for r in samples]
    (folder / "eval").mkdir(exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), folder / "eval" / f"step_{step:04d}.parquet")


def test_per_prompt_differences_and_margin_by_hand():
    import pandas as pd

    method = per_prompt(pd.DataFrame([{"prompt_id": "a", "mode": "greedy", "reward": 1.0},
                                      {"prompt_id": "a", "mode": "sampled", "reward": 1.0},
                                      {"prompt_id": "a", "mode": "sampled", "reward": 0.0},
                                      {"prompt_id": "b", "mode": "greedy", "reward": 0.0}]))
    assert method["a"] == (1.0, 0.5) and method["b"][0] == 0.0 and math.isnan(method["b"][1])
    diffs = differences(method, {"a": (0.0, 0.25), "b": (0.0, 0.0), "c": (1.0, 1.0)})
    assert diffs[:, 0].tolist() == [1.0, 0.0] and diffs[0, 1] == 0.25  # c: not scored by both
    mean, low, high = margin(np.array([1.0, 0.0, 1.0, 0.0]))
    assert mean == 0.5 and math.isclose(high - mean, 1.959964 * math.sqrt(1 / 3) / 2)
    assert all(math.isnan(v) for v in margin(np.array([1.0])))


def test_compare_prints_paired_margins_for_shared_seeds(cli, tmp_path):
    runs = []
    for seed in (0, 1):
        uniform = fake_run(tmp_path / f"u{seed}", "uniform", seed, [0.4, 0.5], [0.3], 1.0)
        truth = fake_run(tmp_path / f"t{seed}", "truth", seed, [0.4, 0.75], [0.3], 1.0)
        write_eval(uniform, [1, 0, 0, 1], [[1, 0], [0, 0], [0, 0], [1, 1]])
        write_eval(truth, [1, 1, 0, 1], [[1, 1], [0, 1], [0, 0], [1, 1]])  # +1 on p1: +25 points greedy
        runs += [uniform, truth]
    alone = fake_run(tmp_path / "g2", "oar_g", 2, [0.4, 0.6], [0.3], 1.0)  # no uniform run of seed 2
    write_eval(alone, [1, 1, 1, 1], [[1, 1]] * 4)
    result = cli("compare", *runs, alone, "-o", tmp_path / "c.html")
    assert result.exit_code == 0, result.output
    rows = [line for line in result.stdout.splitlines() if line.startswith("| truth | 2 | 8 |")]
    # greedy differences 0, 1, 0, 0 twice: mean 0.25, sd 0.4629, se 0.1637 -> +25.0 [-7.1, +57.1];
    # sampled 0.5, 0.5, 0, 0 twice: mean 0.25, sd 0.2673, se 0.0945 -> +25.0 [+6.5, +43.5]
    assert rows == ["| truth | 2 | 8 | +25.0 [-7.1, +57.1] | +25.0 [+6.5, +43.5] | s0: +25.0, s1: +25.0 |"]
    assert "| oar_g | " not in result.stdout.split("Paired against uniform")[1]
    assert "Paired against uniform" in (tmp_path / "c.html").read_text()


def test_runs_with_changed_reshape_options_are_their_own_method(tmp_path):
    assert method_label({"attribute": {"method": "truth"}}) == "truth"
    assert method_label({"attribute": {"method": "truth"}, "reshape": {"quantile": 0.25, "beta": 1.0}}) == "truth"
    label = method_label(yaml.safe_load("attribute: {method: truth}\nreshape: {quantile: 0.75, floor: 0.0}"))
    assert label == "truth [floor=0.0, quantile=0.75]"
