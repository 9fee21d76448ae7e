"""Lenient extraction (evaluation) against strict (the training reward): hand-checked cases of
every shape the lenient fallbacks read, the ambiguous shapes they refuse, the decimal-comma rule,
and the labelled grader table of bench/graders.py (zero false positives in both modes)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from oarctl.errors import OarError
from oarctl.verify import extract_answer, verify_batch
from oarctl.verify.extract import find_answer
from oarctl.verify.normalize import decimal_comma

TABLE = Path(__file__).resolve().parent.parent / "bench" / "data" / "graders_labelled.jsonl"

# (response, what lenient extracts, gold, lenient verdict); strict finds no answer in any of them.
SHAPES = [
    ("Answer \\[ 9 \\]", "9", "9", "correct"),
    ("After solving, we get $1/2$", "1/2", "\\frac{1}{2}", "correct"),
    ("The final result is $$(a + b)^2$$", "(a + b)^2", "a^2+2ab+b^2", "correct"),
    ("$28$ percent", "28\\%", "28\\%", "correct"),
    ("$28$ percent", "28\\%", "82\\%", "wrong"),
    ("Therefore $x \\geq 5$ is the solution.", "x \\geq 5", "x >= 5", "correct"),
    ("Therefore $x > 5$ is the solution.", "x > 5", "x >= 5", "wrong"),
    ("The matrix is $\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}$.",
     "\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}", "\\begin{bmatrix}1&2\\\\3&4\\end{bmatrix}", "correct"),
    ("We find \\[ \\left(\\begin{array}{cc} 1 & 0 \\\\ 2 & 1 \\end{array}\\right) \\]",
     "\\left(\\begin{array}{cc} 1 & 0 \\\\ 2 & 1 \\end{array}\\right)", "\\begin{pmatrix}1&0\\\\2&1\\end{pmatrix}",
     "correct"),
    ("The decimal is 2,74", "2,74", "2.74", "correct"),
    ("所以，小明一共有 12 个苹果。", "12", "12", "correct"),
    ("He pays $12 each for 3 items, so $36 in all.", "36", "36", "correct"),
    ("The farm sold 1,000 eggs", "1,000", "1000", "correct"),
    ("About 40 per cent of the voters agreed.", "40\\%", "40", "correct"),
    ("The rope is 12 meters long.", "12", "12", "correct"),
    ("x >= 5", "x >= 5", "x\\geq 5", "correct"),
]


@pytest.mark.parametrize("response, answer, gold, verdict", SHAPES)
def test_lenient_reads_what_strict_does_not(response, answer, gold, verdict):
    assert extract_answer(response) is None
    assert extract_answer(response, mode="lenient") == answer
    assert verify_batch([response], [gold], extraction="lenient", workers=1)[0].verdict == verdict


def test_a_run_of_boxes_is_one_list_in_both_modes():
    for mode in ("strict", "lenient"):
        assert extract_answer("\\boxed{1} and \\boxed{2}", mode) == "1, 2"
        assert extract_answer("$x = \\boxed{-2}$ and $x = \\boxed{3}$.", mode) == "-2, 3"
        assert extract_answer("Part (a): \\boxed{3}. Part (b) gives \\boxed{7}.", mode) == "7"  # words between
    verdicts = verify_batch(["\\boxed{1} and \\boxed{2}", "So $\\boxed{1}$ or $\\boxed{4}$."], ["{1,2}", "4"], workers=1)
    assert [v.verdict for v in verdicts] == ["correct", "wrong"]  # hedging over answers earns nothing


@pytest.mark.parametrize("response", [
    "So x > 5 works.",                        # a relation, not a number
    "The numbers 1,2,3 work",                 # a comma list
    "The values 2, 4, 6 and 8 all work",      # the last item of a list
    "The smallest such integer is 17, since 16 fails.",  # a hedge before the last number
    "It cannot be 9 since the sum is odd.",
    "So we need 3 + 4.",                      # part of an expression
    "The pattern repeats, so step 2^10 lands on it.",
    "I could not finish this one.",
    "这道题我不会做。",
    "",
])
def test_lenient_gives_no_answer_when_ambiguous(response):
    assert find_answer(response, "lenient") is None


def test_strict_answers_are_kept_and_cleaned_in_lenient():
    assert extract_answer("The answer is 12 apples.", "lenient") == "12"
    assert extract_answer("So the answer is 45 percent.", "lenient") == "45\\%"
    assert extract_answer("The answer is \\boxed{3} or so, 7.", "lenient") == "3"  # strict first


def test_decimal_comma_rule():
    assert decimal_comma("2,74", "2.74") == "2.74"
    assert decimal_comma("-0,5", "-0.5") == "-0.5"
    assert decimal_comma("3,1416", "3.1416") == "3.1416"   # four digits: a decimal comma too
    assert decimal_comma("1,2", "\\{1,2\\}") == "1,2"        # against a gold list the comma separates
    assert decimal_comma("1,000", "1000") == "1,000"        # exactly three digits: thousands (normalize)
    responses, golds = ["The answer is 2,74", "The answer is 1,000"], ["2.74", "1000"]
    assert [v.verdict for v in verify_batch(responses, golds, workers=1)][1] == "correct"  # thousands: both modes
    assert [v.verdict for v in verify_batch(responses, golds, extraction="lenient", workers=1)] == ["correct"] * 2


def test_unknown_mode_is_a_one_line_error():
    with pytest.raises(OarError, match="extraction mode 'loose': choose one of strict, lenient"):
        extract_answer("\\boxed{1}", mode="loose")
    with pytest.raises(OarError, match="extraction mode"):
        verify_batch(["\\boxed{1}"], ["1"], extraction="loose")


@pytest.mark.slow  # ~12 s on 2 shared cores: 306 cases, most through the engine
def test_labelled_table_has_no_false_positive_in_either_mode():
    rows = [json.loads(line) for line in TABLE.read_text().splitlines() if line.strip()]
    assert len(rows) >= 300 and sum(not row["equal"] for row in rows) * 3 >= len(rows)
    responses, golds = [row["response"] for row in rows], [row["gold"] for row in rows]
    for mode in ("strict", "lenient"):
        verdicts = verify_batch(responses, golds, extraction=mode, workers=2)
        false_positives = [row for row, v in zip(rows, verdicts) if v.verdict == "correct" and not row["equal"]]
        assert false_positives == [], mode
    assert all((v.verdict == "correct") == row["equal"] for row, v in zip(rows, verdicts))  # lenient agrees
