"""Benchmark evaluation: maj@k and pass@k on hand-computed cases, per-benchmark / overall metrics,
and `oarctl evaluate` on two generated benchmark files (table, Parquet, summary files)."""
from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from oarctl.metrics import maj_at_k, majority_correct, pass_at_k, vote_metrics
from oarctl.stages.evaluate import evaluation_metrics


@pytest.mark.parametrize("answers, rewards, expected", [
    (["3", "2", "3", None], [0, 1, 0, 0], 0.0),      # "3" wins 2-1
    (["2", "3", "2"], [1, 0, 1], 1.0),              # "2" wins 2-1
    (["2", "3"], [1, 0], 1.0),                      # tie: the first-seen answer wins
    (["3", "2"], [0, 1], 0.0),                      # the same tie the other way round
    (["5", "7", "7", "5"], [1, 0, 0, 1], 1.0),      # tie 2-2: "5" was seen first
    ([None, None, "4"], [0, 0, 1], 1.0),            # no-answer samples never vote
    ([None, None], [0, 0], 0.0),                    # nobody voted
])
def test_majority_vote_hand_cases(answers, rewards, expected):
    assert majority_correct(answers, rewards) == expected


def test_maj_at_k_uses_the_first_k_samples():
    samples = [("2", 1.0), ("3", 0.0), ("3", 0.0), ("3", 0.0)]
    assert [maj_at_k(samples, k) for k in (1, 2, 3, 4)] == [1.0, 1.0, 0.0, 0.0]
    metrics = vote_metrics({"a": samples, "b": [("1", 1.0)] * 4}, [1, 4])
    assert metrics == {"maj@1": 1.0, "maj@4": 0.5}


def test_pass_at_k_codex_estimator_hand_values():
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)         # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(5, 2, 3) == pytest.approx(0.9)         # 1 - C(3,3)/C(5,3) = 1 - 1/10
    assert pass_at_k(8, 2, 4) == pytest.approx(1 - 15 / 70)  # C(6,4) = 15, C(8,4) = 70


class Settings:
    samples, temperature, top_p, max_new_tokens, pass_k, extraction = 2, 0.6, 0.95, 32, [1, 2], "lenient"


def _row(benchmark, prompt, mode, answer, reward):
    return {"benchmark": benchmark, "prompt_id": prompt, "mode": mode, "normalized_answer": answer, "reward": reward}


def test_per_benchmark_and_overall_metrics_by_hand():
    rows = [_row("a", "p1", "greedy", "1", 1.0), _row("a", "p2", "greedy", "9", 0.0),
            _row("b", "p1", "greedy", "5", 0.0),  # the same prompt id in another benchmark is another prompt
            _row("a", "p1", "sampled", "1", 1.0), _row("a", "p1", "sampled", "2", 0.0),
            _row("a", "p2", "sampled", "3", 0.0), _row("a", "p2", "sampled", "3", 0.0),
            _row("b", "p1", "sampled", "4", 1.0), _row("b", "p1", "sampled", "4", 1.0)]
    metrics = evaluation_metrics(rows, Settings)
    assert metrics["a/greedy_accuracy"] == 0.5 and metrics["b/greedy_accuracy"] == 0.0
    assert metrics["a/avg@2"] == 0.25 and metrics["b/avg@2"] == 1.0
    assert metrics["a/pass@2"] == 0.5 and metrics["b/pass@2"] == 1.0
    assert metrics["a/maj@2"] == 0.5 and metrics["b/maj@2"] == 1.0   # p1 of a: tie 1-1, "1" first
    assert metrics["a/prompts"] == 2 and metrics["b/prompts"] == 1
    # overall = mean over benchmarks (each counts once), prompts = total
    assert metrics["greedy_accuracy"] == 0.25 and metrics["avg@2"] == 0.625 and metrics["maj@2"] == 0.75
    assert metrics["prompts"] == 3 and metrics["benchmarks"] == ["a", "b"]
    assert (metrics["samples"], metrics["temperature"], metrics["max_new_tokens"]) == (2, 0.6, 32)


def test_heldout_only_keeps_the_old_metric_names():
    rows = [_row("heldout", "p", "greedy", "1", 1.0), _row("heldout", "p", "sampled", "1", 1.0),
            _row("heldout", "p", "sampled", None, 0.0)]
    metrics = evaluation_metrics(rows, Settings)
    assert not [key for key in metrics if "/" in key]
    assert {"greedy_accuracy", "avg@2", "pass@1", "pass@2", "maj@1", "maj@2", "prompts"} <= set(metrics)


@pytest.fixture
def benchmark_files(tmp_path, signal_data):
    """Two small benchmarks in two formats; the tiny policy answers 1 or 2, so scores are mixed."""
    rows = [json.loads(line) for line in signal_data["heldout"].read_text().splitlines()]
    first = tmp_path / "first.jsonl"
    first.write_text("".join(json.dumps(r) + "\n" for r in rows[:2]))
    second = tmp_path / "second.parquet"
    pq.write_table(pa.Table.from_pylist(rows[2:5]), second)
    return {"first": str(first), "second": str(second)}


def test_cli_evaluates_two_benchmarks(cli, tiny_config, tmp_path, benchmark_files):
    config = tiny_config(evaluate={"benchmarks": benchmark_files, "samples": 2, "pass_k": [1, 2]})
    output = tmp_path / "out" / "eval.parquet"
    result = cli("evaluate", "-c", config, "-o", output)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[1] == "| benchmark | prompts | greedy | avg@2 | pass@1 | pass@2 | maj@1 | maj@2 |"
    assert [line.split(" | ")[0] for line in lines[3:6]] == ["| first", "| second", "| **overall**"]
    assert lines[5].split(" | ")[1] == "5"  # total prompts

    table = pq.read_table(output)
    assert table.num_rows == 5 * (1 + 2)
    assert table["benchmark"].to_pylist().count("first") == 2 * 3
    assert set(table["verdict"].to_pylist()) <= {"correct", "wrong", "no_answer", "timeout", "error"}
    summary = json.loads(output.with_name("eval.parquet.summary.json").read_text())
    assert list(summary["benchmarks"]) == ["first", "second"]
    manifest = json.loads(output.with_name("eval.parquet.manifest.json").read_text())["metrics"]
    assert summary["overall"]["greedy_accuracy"] == pytest.approx(
        (manifest["first/greedy_accuracy"] + manifest["second/greedy_accuracy"]) / 2)
    assert 0 < manifest["avg@2"] < 1  # mixed rewards: the table is not all zeros by construction
    assert output.with_name("eval.parquet.summary.md").read_text() == "\n".join(lines[1:]) + "\n"
    # graded as leaderboards grade, and saying so in the rows, the metrics and the summary
    assert set(table["extraction"].to_pylist()) <= {"lenient", "lenient+math-verify"}
    assert manifest["extraction"] == summary["settings"]["extraction"] == "lenient"
    assert "Answers extracted leniently" in result.stdout

    again = cli("evaluate", "-c", config, "-o", output)
    assert again.exit_code == 0 and "up to date" in again.stdout
    strict = cli("evaluate", "-c", config, "-o", output, "--set", "evaluate.extraction=strict")
    assert strict.exit_code == 0 and "up to date" not in strict.stdout  # the mode is in the cache key
    assert "Answers extracted strictly" in strict.stdout
    limited = cli("evaluate", "-c", config, "-o", tmp_path / "l.parquet", "--set", "evaluate.limit=1")
    assert limited.exit_code == 0, limited.output
    assert pq.read_table(tmp_path / "l.parquet").num_rows == 2 * (1 + 2)


def test_cli_evaluate_needs_exactly_one_source(cli, tiny_config, tmp_path, benchmark_files, signal_data):
    config = tiny_config(evaluate={"benchmarks": benchmark_files})
    both = cli("evaluate", signal_data["heldout"], "-c", config, "-o", tmp_path / "e.parquet")
    assert both.exit_code == 2 and "not both" in both.stderr
    neither = cli("evaluate", "-c", tiny_config(), "-o", tmp_path / "e.parquet")
    assert neither.exit_code == 2 and "evaluate.benchmarks" in neither.stderr
    bad = cli("evaluate", "-c", tiny_config(evaluate={"benchmarks": {"x": str(tmp_path / "nope.jsonl")}}),
              "-o", tmp_path / "e.parquet")
    assert bad.exit_code == 2 and "evaluate.benchmarks.x" in bad.stderr


def test_run_scores_the_benchmarks(cli, tiny_config, tmp_path, benchmark_files):
    config = tiny_config(run={"steps": 0, "progress": False}, evaluate={"benchmarks": benchmark_files})
    result = cli("run", "-c", config, "--run-dir", tmp_path / "R")
    assert result.exit_code == 0, result.output
    line = json.loads((tmp_path / "R" / "metrics.jsonl").read_text().splitlines()[0])
    assert {"eval/greedy_accuracy", "eval/first/greedy_accuracy", "eval/second/maj@2"} <= set(line)


def test_cli_evaluate_any_model_folder_with_policy(cli, tiny_config, tmp_path, benchmark_files, random_policy):
    """--policy takes a plain transformers folder (save_pretrained, no checkpoint.json of ours)."""
    config = tiny_config(evaluate={"benchmarks": benchmark_files, "samples": 1, "pass_k": [1]})
    result = cli("evaluate", "-c", config, "-o", tmp_path / "r.parquet", "--policy", random_policy)
    assert result.exit_code == 0, result.output
    assert "| **overall** | 5 |" in result.stdout
