"""Lenient mode's second path (math-verify's own extraction of the whole response, second_path.py):
when it is taken and when oarctl's reading stands, how its verdicts are recorded, that it runs in the
killable pool; strict mode's verdicts unchanged, row for row, from before the second path existed;
and the held-out table of bench/graders.py (zero false positives, agreement at least math-verify's)."""
from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from oarctl.verify import verdict_columns, verify_batch
from oarctl.verify.second_path import math_verify_gold

from bench_graders import math_verify_grader  # tests/bench_graders.py

BENCH_DATA = Path(__file__).resolve().parent.parent / "bench" / "data"
# The strict verdict of every row of the labelled tables, written by the checker of commit e613466
# (before the second path and the family rules of issue 31); the rows of graders_heldout_multilingual.jsonl
# by the checker of commit 53c3bb8, before the rules of issue 43. After a deliberate change of strict
# mode, rewrite it with `python tests/test_verify_second_path.py`.
STRICT_VERDICTS = Path(__file__).resolve().parent / "data" / "strict_verdicts.jsonl"
FIELDS = ("extracted", "start", "end", "normalized_answer", "normalized_gold", "verdict", "parse_ok", "timed_out")

# (response, gold): oarctl's first reading is wrong or absent, math-verify's reading elsewhere is right
SECOND_PATH_CORRECT = [
    ("It was 12 before; now it is 3,400.5kg.", "3400.5"),   # the first path reads 12
    ("There are 12 000 people.", "12000"),                   # a space between thousands
]
# (response, gold, first-path verdict): oarctl's reading stands, though math-verify alone would say correct
READING_STANDS = [
    ("The smallest such integer is 17, since 16 fails.", "16", "no_answer"),  # a hedge lenient refused
    ("So we need 3 + 4.", "7", "no_answer"),                                   # an operand lenient refused
    ("$2^{10}.$", "2", "wrong"),                      # math-verify would read a part of the same answer
    ("The answer is $1/3.$", "1", "wrong"),           # ... or compare the same answer differently
    ("La respuesta es 12. Comprobación: 12 + 3 = 15.", "15", "wrong"),  # an answer after a marker stands
]


def rows_of(name: str) -> list[dict]:
    return [json.loads(line) for line in (BENCH_DATA / name).read_text().splitlines() if line.strip()]


def test_second_path_grades_what_oarctl_misread_and_says_so():
    responses, golds = zip(*SECOND_PATH_CORRECT)
    lenient = verify_batch(list(responses), list(golds), extraction="lenient", workers=2)
    assert [(v.verdict, v.graded_by, v.second_path) for v in lenient] == [("correct", "math-verify", True)] * 2
    for response, verdict in zip(responses, lenient):  # the span holds math-verify's reading when it is in the text
        assert verdict.start < 0 or response[verdict.start:verdict.end] == verdict.extracted
    assert verdict_columns(lenient, "lenient")["extraction"] == ["lenient+math-verify"] * 2
    strict = verify_batch(list(responses), list(golds), extraction="strict", workers=2)
    assert [(v.verdict, v.graded_by, v.second_path) for v in strict] == [("no_answer", "oarctl", False)] * 2
    assert verdict_columns(strict, "strict")["extraction"] == ["strict"] * 2


def test_math_verify_alone_says_correct_where_oarctl_reading_stands():
    """The premise of READING_STANDS: plain math-verify calls these correct, so the guards are what
    keeps lenient mode from it."""
    from math_verify import parse, verify

    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    for response, gold, _ in READING_STANDS:
        assert verify(parse(math_verify_gold(gold)), parse(response)), response


def test_refusals_and_math_readings_of_oarctl_stand():
    responses, golds, first = zip(*READING_STANDS)
    verdicts = verify_batch(list(responses), list(golds), extraction="lenient", workers=2)
    assert [v.verdict for v in verdicts] == list(first)
    assert all(v.graded_by == "oarctl" for v in verdicts)
    # refusals never ask math-verify, nor does an answer stated after an answer marker (`The answer is $1/3.$`)
    assert [v.second_path for v in verdicts] == [False, False, True, False, False]


def test_second_path_is_never_a_second_way_to_be_wrong():
    responses = ["\\boxed{5}", "So $\\boxed{1}$ or $\\boxed{4}$.", "I could not finish.", "We got stuck at step 3."]
    verdicts = verify_batch(responses, ["6", "4", "3", "4"], extraction="lenient", workers=2)
    assert [v.verdict for v in verdicts] == ["wrong", "wrong", "no_answer", "wrong"]
    # a lone box is read the same by both; math-verify finds nothing in prose without a digit or markup
    assert [v.second_path for v in verdicts] == [False, True, False, True]


def test_second_path_runs_in_the_killable_pool_under_the_same_timeout():
    """A tiny timeout kills the second path's item (its worker); the first verdict stands."""
    verdicts = verify_batch(["There are 12 000 people."], ["12000"], extraction="lenient", workers=1, timeout=1e-3)
    assert (verdicts[0].verdict, verdicts[0].graded_by, verdicts[0].second_path) == ("wrong", "oarctl", True)


TABLES = ("graders_labelled.jsonl", "graders_heldout.jsonl", "graders_heldout_multilingual.jsonl")


def strict_verdicts() -> list[dict]:
    """The strict verdict of every row of the tables, each naming its table and line."""
    rows = [(name, line, row) for name in TABLES for line, row in enumerate(rows_of(name), 1)]
    verdicts = verify_batch([row["response"] for *_, row in rows], [row["gold"] for *_, row in rows],
                            extraction="strict", workers=2, timeout=20.0)
    assert {(v.graded_by, v.second_path) for v in verdicts} == {("oarctl", False)}
    return [{"table": name, "line": line, **{field: getattr(v, field) for field in FIELDS}}
            for (name, line, _), v in zip(rows, verdicts)]


def test_strict_verdicts_are_unchanged_row_for_row():
    expected = [json.loads(line) for line in STRICT_VERDICTS.read_text().splitlines()]
    got = strict_verdicts()
    assert len(got) == len(expected)
    assert [(e["table"], e["line"]) for e, g in zip(expected, got) if e != g] == []


@pytest.mark.slow  # ~20 s on 2 shared cores: 245 cases through oarctl lenient and plain math-verify
def test_held_out_cases_no_false_positive_and_at_least_math_verify_agreement():
    rows = rows_of("graders_heldout.jsonl")
    assert len(rows) >= 200 and all(row["source"] for row in rows)
    responses, golds, labels = [r["response"] for r in rows], [r["gold"] for r in rows], [r["equal"] for r in rows]
    lenient = [v.verdict == "correct" for v in verify_batch(responses, golds, extraction="lenient", workers=2)]
    assert [r for r, said, label in zip(rows, lenient, labels) if said and not label] == []
    plain = math_verify_grader(responses, golds)
    agree = sum(said == label for said, label in zip(lenient, labels))
    assert agree >= sum(said == label for said, label in zip(plain, labels))


@pytest.mark.parametrize("content, message", [(None, "no such labelled table"), ("nope\n", ":1: not JSON"),
                                              ('{"kind": "x"}\n', ":1: expected kind, response, gold, equal")])
def test_a_bad_labelled_table_is_a_one_line_error(tmp_path, content, message):
    table = tmp_path / "table.jsonl"
    if content is not None:
        table.write_text(content)
    for script in ("graders.py", "verify.py"):
        result = subprocess.run([sys.executable, str(BENCH_DATA.parent / script), "--table", str(table)],
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 1 and result.stderr.count("\n") == 1 and message in result.stderr, result.stderr


@pytest.mark.parametrize("gold, as_parsed", [("p - q", "$p - q$"), ("$9$", "$9$"), ("\\boxed{3}", "\\boxed{3}"),
                                             ("\\$5", "$\\$5$"), ("\\(x\\)", "\\(x\\)")])
def test_gold_is_parsed_as_math_verify_users_write_it(gold, as_parsed):
    assert math_verify_gold(gold) == as_parsed


if __name__ == "__main__":
    STRICT_VERDICTS.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in strict_verdicts()))
