"""`oarctl.verify.grade`, the one call that grades an answer as the verify stage does: the same
Verdict as `verify_batch` on every case of bench/data's labelled tables; lenient by default; and
the held-out table of issue 43 (bench/data/graders_heldout_multilingual.jsonl): lenient grading has
no false positive there and agrees with its labels more often than plain math-verify."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from oarctl.verify import equivalence, extract_answer, grade, is_equivalent, verify_batch

from bench_graders import math_verify_grader  # tests/bench_graders.py

BENCH_DATA = Path(__file__).resolve().parent.parent / "bench" / "data"
TIMEOUT = 30.0  # seconds per engine check: a loaded machine must not turn a verdict into a timeout


def rows_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _without_latency(verdict):
    return replace(verdict, latency_ms=0.0)


# The two older tables send ~130 answers to the second path, one engine round each when graded one by
# one (~1 min on 2 loaded cores): `make test-all` runs them, `make test` the newest table.
SLOW_TABLES = ("graders_labelled.jsonl", "graders_heldout.jsonl")
TABLES = [pytest.param(path.name, marks=[pytest.mark.slow] if path.name in SLOW_TABLES else [])
          for path in sorted(BENCH_DATA.glob("*.jsonl"))]


def test_every_table_of_bench_data_is_compared():
    assert {param.values[0] for param in TABLES} >= {*SLOW_TABLES, "graders_heldout_multilingual.jsonl"}


@pytest.mark.parametrize("table", TABLES)
def test_grade_gives_the_verdict_of_verify_batch_on_every_labelled_case(table):
    rows = rows_of(BENCH_DATA / table)
    responses, golds = [row["response"] for row in rows], [row["gold"] for row in rows]
    batch = verify_batch(responses, golds, extraction="lenient", timeout=TIMEOUT)
    one_by_one = [grade(response, gold, timeout=TIMEOUT) for response, gold in zip(responses, golds)]
    differ = [(i, one, many) for i, (one, many) in enumerate(zip(one_by_one, batch))
              if _without_latency(one) != _without_latency(many)]
    assert differ == []


def test_grade_is_lenient_by_default_and_strict_on_request():
    response = "Seule la proposition B convient.\nRéponse : B"
    assert grade(response, "B").verdict == "correct"
    assert grade(response, "B", "strict").verdict == "no_answer"
    assert grade(response, "B", extraction="strict") == verify_batch([response], ["B"], extraction="strict")[0]


def test_the_strict_building_blocks_grade_lower_than_grade():
    """The two doors of the issue: extract_answer + is_equivalent skip the readings that need the gold
    and the second path; grade() does not."""
    response = "The opposite of hot is cold.\n\nAnswer: B, which is cold."
    assert not is_equivalent(extract_answer(response, mode="lenient"), "B")
    assert grade(response, "B").verdict == "correct"


@pytest.mark.slow  # ~10 s on 2 shared cores: 104 cases through oarctl lenient and plain math-verify
def test_multilingual_held_out_no_false_positive_and_more_agreement_than_math_verify():
    rows = rows_of(BENCH_DATA / "graders_heldout_multilingual.jsonl")
    assert len(rows) >= 100 and all(row["source"] for row in rows)
    responses, golds, labels = [r["response"] for r in rows], [r["gold"] for r in rows], [r["equal"] for r in rows]
    equivalence._MEMO.clear()
    lenient = [v.verdict == "correct" for v in verify_batch(responses, golds, extraction="lenient", timeout=TIMEOUT)]
    assert [r for r, said, label in zip(rows, lenient, labels) if said and not label] == []
    plain = math_verify_grader(responses, golds)
    agree = sum(said == label for said, label in zip(lenient, labels))
    assert agree > sum(said == label for said, label in zip(plain, labels))
