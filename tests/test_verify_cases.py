"""verify (math): labelled (response-or-answer, gold, equal) cases of every answer kind, a third and
more of them near misses; zero false positives allowed. All cases go through one `verify_batch`
call (one pool of 2 workers), then each case checks its own verdict."""
from __future__ import annotations

import re

import pytest

from oarctl.verify import extract_answer, verify_batch
from oarctl.verify.extract import find_answer

CASES = [
    # integers
    ("42", "42", True), ("-7", "-7", True), ("+5", "5", True), ("007", "7", True), ("42", "43", False),
    ("-7", "7", False), ("420", "42", False), ("0", "-0", True), ("1", "0", False),
    # decimals
    ("0.5", "0.5", True), ("0.50", "0.5", True), (".5", "0.5", True), ("3.14", "3.14", True),
    ("3.14", "3.141", False), ("0.33", "\\frac{1}{3}", False), ("0.3", "0.03", False), ("2.0", "2", True),
    ("1.25", "1.2", False),
    # fractions
    ("\\frac{1}{2}", "0.5", True), ("\\frac12", "\\frac{1}{2}", True), ("1/2", "\\frac{1}{2}", True),
    ("\\dfrac{3}{4}", "\\frac{3}{4}", True), ("\\tfrac{3}{4}", "0.75", True), ("\\frac{2}{4}", "\\frac{1}{2}", True),
    ("\\frac{1}{2}", "\\frac{1}{3}", False), ("\\frac{2}{3}", "\\frac{3}{2}", False), ("-\\frac{1}{2}", "\\frac{1}{2}", False),
    ("\\frac{14}{3}", "\\frac{14}{3}", True), ("4\\frac{2}{3}", "\\frac{14}{3}", True), ("\\frac{4}{3}", "\\frac{14}{3}", False),
    # mixed numbers
    ("1\\frac{1}{2}", "\\frac{3}{2}", True), ("2\\frac{1}{4}", "2.25", True), ("2\\frac{1}{4}", "2.5", False),
    ("1\\frac{1}{2}", "\\frac{1}{2}", False),
    # percentages
    ("50\\%", "50", True), ("50\\%", "0.5", True), ("25\\%", "\\frac{1}{4}", True), ("50\\%", "5", False),
    ("12.5\\%", "12.5", True), ("40\\%", "60\\%", False),
    # scientific notation
    ("1.5e3", "1500", True), ("1.5\\times10^{3}", "1500", True), ("1.5 \\times 10^3", "1500", True),
    ("1.5e3", "150", False), ("2\\times10^{-3}", "0.002", True), ("2\\times10^{-3}", "0.02", False),
    ("3E2", "300", True),
    # radicals
    ("2\\sqrt{2}", "\\sqrt{8}", True), ("\\sqrt{2}/2", "\\frac{1}{\\sqrt{2}}", True), ("\\sqrt{3}", "\\sqrt{2}", False),
    ("2\\sqrt{3}", "3\\sqrt{2}", False), ("\\sqrt[3]{8}", "2", True), ("\\sqrt{12}", "2\\sqrt{3}", True),
    ("\\frac{\\sqrt{3}}{2}", "\\frac{\\sqrt{2}}{2}", False), ("1+\\sqrt{5}", "1-\\sqrt{5}", False),
    # pi and e
    ("\\pi", "\\pi", True), ("\\frac{\\pi}{2}", "\\pi/2", True), ("2\\pi", "\\pi", False), ("\\frac{\\pi}{3}", "\\frac{\\pi}{6}", False),
    ("1-1/e", "1-\\frac{1}{e}", True), ("1-1/e", "1+1/e", False), ("3\\pi", "9.42", False), ("\\pi r^2", "\\pi r^2", True),
    # intervals: open vs closed matters
    ("[0,9)", "[0,9)", True), ("[0,9)", "(0,9)", False), ("(0,9]", "(0,9)", False), ("[0,9]", "[0,9)", False),
    ("(-\\infty,3]", "(-\\infty, 3]", True), ("(-\\infty,3)", "(-\\infty,3]", False), ("[2,\\infty)", "[2, \\infty)", True),
    ("(1,5)", "(1,6)", False), ("\\left[0, 1\\right]", "[0,1]", True),
    ("(-\\infty,0)\\cup(1,\\infty)", "(-\\infty,0) \\cup (1,\\infty)", True),
    ("(-\\infty,0)\\cup(1,\\infty)", "(-\\infty,0] \\cup (1,\\infty)", False),
    # sets
    ("\\{1,2\\}", "\\{2,1\\}", True), ("\\{1,2\\}", "\\{1,2,3\\}", False), ("\\{1,2,3\\}", "\\{3,2,1\\}", True),
    ("\\{1,3\\}", "\\{1,2\\}", False), ("1,2,3", "3,2,1", True), ("1, 2", "1, 3", False), ("-2, 3", "3, -2", True),
    # tuples and ordered lists
    ("(1,2)", "(1,2)", True), ("(1,2)", "(2,1)", False), ("(1, 2, 3)", "(1,2,3)", True), ("(1,2,3)", "(3,2,1)", False),
    ("(3, \\frac{\\pi}{2})", "\\left( 3, \\frac{\\pi}{2} \\right)", True), ("(3, \\frac{\\pi}{2})", "(3, \\pi)", False),
    ("(-1,4)", "(1,4)", False), ("(0.5, 2)", "(\\frac{1}{2}, 2)", True),
    # matrices
    ("\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}", "\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}", True),
    ("\\begin{pmatrix}1&2\\\\3&5\\end{pmatrix}", "\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}", False),
    ("\\begin{pmatrix}2\\\\1\\end{pmatrix}", "\\begin{pmatrix}1\\\\2\\end{pmatrix}", False),
    ("\\begin{pmatrix}0.5\\\\1\\end{pmatrix}", "\\begin{pmatrix}\\frac{1}{2}\\\\1\\end{pmatrix}", True),
    ("\\begin{bmatrix}1&0\\\\0&1\\end{bmatrix}", "\\begin{pmatrix}1&0\\\\0&1\\end{pmatrix}", True),
    ("\\begin{pmatrix}1&0\\\\0&1\\end{pmatrix}", "\\begin{pmatrix}0&1\\\\1&0\\end{pmatrix}", False),
    # equations
    ("x = 3", "3", True), ("x=3", "x=3", True), ("3", "x = 3", True), ("x = 4", "3", False), ("y = 2x + 1", "y=2x+1", True),
    ("y = 2x + 1", "y = 2x - 1", False), ("y=-\\frac{1}{2}x+3", "y = -0.5x + 3", True), ("x = -3", "3", False),
    # inequalities
    ("x > 3", "x>3", True), ("3 < x", "x > 3", True), ("x \\ge 3", "x > 3", False), ("x < 3", "x > 3", False),
    ("x \\leq 5", "x \\le 5", True), ("x \\le 5", "x < 5", False),
    # units and degrees
    ("30^\\circ", "30", True), ("30^{\\circ}", "30^\\circ", True), ("30°", "30", True), ("60^\\circ", "30^\\circ", False),
    ("5\\text{ cm}", "5", True), ("5 \\text{ cm}", "5\\text{ cm}", True), ("5\\text{ m}", "5\\text{ cm}", False),
    ("12\\text{ inches}", "12\\text{ feet}", False), ("\\$5", "5", True), ("\\$5.50", "5.5", True), ("\\$5", "6", False),
    ("10\\text{ cm}^2", "10", True), ("6\\text{ cm}", "5\\text{ cm}", False),
    # thousands separators
    ("1,000", "1000", True), ("1{,}000", "1000", True), ("12,345,678", "12345678", True), ("1\\,000", "1000", True),
    ("1,000", "100", False), ("10,000", "1000", False), ("1,234.5", "1234.5", True),
    # text answers and choice letters
    ("\\text{Monday}", "Monday", True), ("monday", "\\text{Monday}", True), ("Tuesday", "\\text{Monday}", False),
    ("\\text{even}", "\\text{odd}", False), ("(B)", "B", True), ("B", "\\text{(B)}", True), ("C", "B", False),
    ("(A)", "(D)", False), ("\\text{no solution}", "\\text{No solution}", True), ("yes", "no", False),
    # algebraic expressions
    ("x^2+2x+1", "(x+1)^2", True), ("x^2+1", "(x+1)^2", False), ("2x", "x+x", True), ("x^2-1", "(x-1)(x+1)", True),
    ("3x+2", "2x+3", False), ("\\frac{x}{2}", "0.5x", True), ("a+b", "b+a", True), ("a-b", "b-a", False),
    # responses: extraction feeds the comparison
    ("So we get \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}", True),
    ("First \\boxed{3}, no wait, \\boxed{4}", "3", False),
    ("Thus \\fbox{7}", "7", True),
    ("Adding up: 3+4=7\n#### 7", "7", True),
    ("Adding up: 3+4=7\n#### 1,000", "1000", True),
    ("The final answer is $\\frac{3}{4}$.", "0.75", True),
    ("The answer is 12.", "12", True),
    ("The answer is 12.5. I hope", "12.5", True),
    ("Therefore the answer is (C).", "C", True),
    ("Answer: B", "C", False),
    ("I think it is 5", "5", False),                           # no final-answer marker: no answer
    ("The answer is \\(x = 2\\)", "2", True),
    ("\\boxed{1} ... the answer is 2", "1", True),               # a box beats a sentence
    ("x \\boxed{\\{1,2\\}} y", "\\{1, 2\\}", True),
    # gold answers given as solutions
    ("\\boxed{7}", "So the total is 7.\n#### 7", True),
    ("\\boxed{8}", "So the total is 7.\n#### 7", False),
    ("\\boxed{\\frac{1}{2}}", "The answer is \\boxed{0.5}", True),
]


def as_response(case: str) -> str:
    """Bare answers are boxed; responses (with a box, `####` or an `answer` phrase) are used as is."""
    return case if re.search(r"\\boxed|\\fbox|####|answer|I think", case, re.IGNORECASE) else f"\\boxed{{{case}}}"


@pytest.fixture(scope="module")
def verdicts():
    return verify_batch([as_response(c) for c, _, _ in CASES], [g for _, g, _ in CASES], timeout=10.0, workers=2)


def test_the_table_is_big_and_mostly_hard():
    assert len(CASES) >= 150
    assert sum(not equal for _, _, equal in CASES) >= len(CASES) / 3


@pytest.mark.parametrize("index", range(len(CASES)), ids=[f"{c[:30]}~{g[:20]}" for c, g, _ in CASES])
def test_case(verdicts, index):
    case, gold, equal = CASES[index]
    verdict = verdicts[index]
    assert verdict.verdict in ("correct", "wrong", "no_answer"), verdict
    assert (verdict.verdict == "correct") is equal, verdict
    assert verdict.reward == float(equal)


def test_no_false_positives(verdicts):
    false_positives = [c for c, v in zip(CASES, verdicts) if not c[2] and v.reward]
    assert false_positives == []


@pytest.mark.parametrize("response, answer", [
    ("so \\boxed{\\frac{1}{2}} done", "\\frac{1}{2}"),
    ("\\boxed{{a}{b{c}}}", "{a}{b{c}}"),
    ("\\boxed{1} then \\fbox{2}", "2"),
    ("\\fbox{ 9 }", "9"),
    ("\\boxed{7} then \\boxed{8", "7"),
    ("work\n#### 72\n", "72"),
    ("#### 1\nmore\n#### 2", "2"),
    ("The final answer is $x^2$.", "x^2"),
    ("final answer is $$\\frac{1}{2}$$", "\\frac{1}{2}"),
    ("The answer is 3.14. Done.", "3.14"),
    ("the answer is: 17", "17"),
    ("Answer: (D)", "(D)"),
    ("The answer is \\[y=1\\] indeed", "y=1"),
    ("The answer is $5", "5"),                                   # unclosed math: to the end
    ("The answer is $\\$36$.", "\\$36"),                     # an escaped dollar does not close math mode
    ("The answer is $\\$32,\\!348$ in all.", "\\$32,\\!348"),
    ("no answer here 5", None),
    ("", None),
    ("The answer is   ", None),
])
def test_extract_answer(response, answer):
    assert extract_answer(response) == answer


def test_span_points_into_the_response():
    response = "We have 2+2.\nThe final answer is $\\frac{8}{2}$. Yes."
    found = find_answer(response)
    assert response[found.start:found.end] == found.text == "\\frac{8}{2}"
    verdict = verify_batch([response], ["4"], workers=1)[0]
    assert (verdict.start, verdict.end, verdict.verdict) == (found.start, found.end, "correct")
