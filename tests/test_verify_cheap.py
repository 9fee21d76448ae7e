"""verify (math): the cheap exact path gives the engine's verdict wherever it decides.

Each rule of cheap.RULES may answer without math-verify only where math-verify would answer the
same, so moving a pair off the engine changes the speed, never the grade. Checked two ways: on
hand-picked tricky cases (expected cheap verdict, then the engine's verdict on the same pair), and
on every pair of bench/data/graders_labelled.jsonl (both extraction modes), a pair of every rule of
the test's own, and bench/verify.py's MATH-500 rollout set where ../shared holds it (a user's clone
has none). The engine must decide every pair (a timeout is no verdict). The two rules that are stricter than math-verify on purpose may only say
"not equal" where it says equal (never a false positive), and no other rule may differ at all.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from oarctl.verify import equivalence
from oarctl.verify.cheap import RULES, deciding_rule, elements, exact_value, quick_verdict
from oarctl.verify.extract import find_answer
from oarctl.verify.normalize import decimal_comma, normalize

BENCH = Path(__file__).resolve().parent.parent / "bench"
# Stricter than the engine by design: `5\text{ m}` is not `5\text{ cm}` (math-verify drops units),
# and plain numbers are exact (`1.0000001` is not `1`; math-verify rounds floats to 6 places).
STRICTER_THAN_ENGINE = {"different units", "plain numbers"}

# (pred, gold, cheap verdict: True / False / None = left to the engine), both as normalize leaves them
TRICKY = [
    ("0.5", "\\frac{1}{2}", True), ("\\frac{1}{2}", "0.5", True), ("1/2", "\\frac{1}{2}", True),
    ("1/3", "0.333", False), ("0.333", "\\frac{1}{3}", False), ("0.33", "\\frac{1}{3}", False),
    ("0.333333", "\\frac{1}{3}", None),          # within math-verify's 6-place rounding: its call
    ("0.3333333", "\\frac{1}{3}", None), ("\\frac{1}{3}", "0.33333", False),
    ("-0", "0", True), ("+5", "5", True), ("1e3", "1000", True), ("1.5e3", "\\frac{3000}{2}", True),
    ("\\frac 59", "\\frac{5}{9}", True), ("\\frac43", "\\frac{4}{3}", True), ("\\frac9{19}", "\\frac{9}{19}", True),
    ("\\frac{270}7", "\\frac{270}{7}", True), ("\\frac43", "1.3333", False), ("-\\frac{3}{8}", "\\frac 34", False),
    ("\\frac{84}{2}", "42", True), ("\\frac{1}{0}", "1", None), ("-1/3", "-\\frac{1}{3}", True),
    ("2,74", "2.74", False),                     # strict mode: a list {2, 74}, as the engine reads it
    ("1,2345", "12345", False), ("1,00", "1", False),
    # collections against a number: never equal while one element is far from the number
    ("(1,-16,-4,43)", "8", False), ("8", "(1,-16,-4,43)", False), ("(\\frac{3}{2},-13)", "28", False),
    ("(-1,6)", "\\frac{1}{2}", False), ("(3,4]", "40", False), ("[2,\\infty)", "2", False),
    ("(-\\infty,2)\\cup(3,\\infty)", "4", False), ("(0,9)\\cup(9,36)", "9", False),
    ("\\{1,2\\}", "1", False), ("3,5,7", "72", False), ("-2,1", "0", False), ("(1,2)", "1.5", False),
    ("\\begin{pmatrix}-2\\\\-14\\\\-7\\end{pmatrix}", "6", False), ("\\begin{bmatrix}1&0\\\\0&1\\end{bmatrix}", "1", False),
    ("[5,5]", "5", None), ("\\{5,5\\}", "5", None), ("5,5", "5", None),  # the set {5}: equal for the engine
    ("(5,5)", "5", None), ("[0.5,\\frac{1}{2}]", "0.5", None), ("[1,1]\\cup(3,3)", "1", None),
    ("\\begin{pmatrix}5\\end{pmatrix}", "5", None), ("\\begin{vmatrix}1&0\\\\0&1\\end{vmatrix}", "1", None),
    ("(-\\sqrt{3},\\sqrt{3})", "4", False), ("12\\pi", "(5,\\infty)", False), ("(2,4)", "12\\pi", False),
    ("[\\frac{\\pi^2}{8},\\frac{5 \\pi^2}{4}]", "4.5", False), ("(-\\sqrt{2},\\sqrt{2})", "1.414214", False),
    ("(1,2)", "1,2", None), ("(x,1)", "5", None),
    # words against a number: a product of symbols, unless every letter may be a constant
    ("even", "6", False), ("326.5", "Navin", False), ("B", "103", False), ("east", "12\\pi", False),
    ("e", "2.718282", None), ("E", "2.718282", None), ("ee", "7.389056", None), ("ii", "-1", None),
    ("don't", "0", None), ("ab-ba", "0", None), ("percent", "0.01", None), ("infinity", "5", None),
    ("no solution", "0", None),              # words after the first may be units the engine drops
    # expressions against a constant: one that varies, or a constant far from it
    ("14", "1+2\\sqrt{3}", False), ("10", "x^3+3x-6", False), ("55", "2k+2", False), ("-128", "\\frac{11+9a}{20}", False),
    ("6\\sqrt{2}", "3R^2", False), ("0.15", "-\\frac{\\pi}{6}", False), ("720", "11\\sqrt2", False),
    ("\\frac 34", "\\sqrt{66}", False), ("1+2\\sqrt{3}", "\\frac{\\sqrt{21}}{5}", False),
    ("2\\sqrt{2}", "\\sqrt{8}", None), ("1.414214", "\\sqrt{2}", None), ("x-x+5", "5", None),
    ("\\sqrt{2}^2-2", "0", None), ("2\\cdot3", "6", None), ("\\frac{x}{x}", "1", None),
    ("8 hours", "8", None), ("5m", "5", None), ("5 m", "5", None), ("2 d", "2", None),  # units: dropped
    ("2k", "55", None), ("2 3", "5", None), ("1\\frac{4}{5}", "\\frac{9}{5}", None),  # `2 3` = 5, a mixed number
    ("x(1)", "5", None), ("6-5i", "-50", None), ("i^2", "-1", None), ("2^3^2", "64", None), ("x^23", "5", None),
    # left to the engine
    ("50\\%", "0.5", None), ("12.5\\%", "12.5", None), ("x=5", "5", None), ("5", "x=5", None),
    # text, units (stricter than the engine: 5 m is not 5 cm)
    ("Monday", "monday", True), ("5\\text{m}", "5\\text{cm}", False),
]


@pytest.fixture(scope="module")
def engine():
    """The engine's verdict on pairs: the symbolic path itself (a pool of 2 workers), no memo."""
    def run(pairs: list[tuple[str, str]]) -> list[bool]:
        decisions = equivalence._symbolic(pairs, 20.0, 2, 2048)
        undecided = [(pair, d.verdict) for pair, d in zip(pairs, decisions, strict=True)
                     if d.verdict not in ("correct", "wrong")]
        assert undecided == []  # a timeout or an error is no verdict to check a rule against
        return [d.verdict == "correct" for d in decisions]
    return run


def test_cheap_verdicts_on_tricky_cases():
    got = [(pred, gold, quick_verdict(pred, gold)) for pred, gold, _ in TRICKY]
    assert got == TRICKY


def test_tricky_cases_match_the_engine(engine):
    """What the rules decide on the tricky cases is the engine's verdict, and the cases they must
    leave alone really are ones where a cheap guess would be wrong."""
    verdicts = engine([(pred, gold) for pred, gold, _ in TRICKY])
    for (pred, gold, _), equal in zip(TRICKY, verdicts):
        rule = deciding_rule(pred, gold)
        if rule is not None and rule[0] not in STRICTER_THAN_ENGINE:
            assert rule[1] == equal, (pred, gold, rule)
    engine_calls = {(pred, gold): equal for (pred, gold, _), equal in zip(TRICKY, verdicts)}
    for pair in [("0.333333", "\\frac{1}{3}"), ("[5,5]", "5"), ("\\{5,5\\}", "5"), ("5,5", "5"), ("ee", "7.389056"),
                 ("\\begin{vmatrix}1&0\\\\0&1\\end{vmatrix}", "1"), ("e", "2.718282"), ("x=5", "5"),
                 ("1.414214", "\\sqrt{2}"), ("8 hours", "8"), ("5m", "5"), ("2 3", "5"), ("1\\frac{4}{5}", "\\frac{9}{5}"),
                 ("x-x+5", "5"), ("2\\sqrt{2}", "\\sqrt{8}")]:
        assert engine_calls[pair], pair


def test_exact_values_and_elements():
    assert exact_value("\\frac 59") * 9 == 5 and exact_value("-\\frac{3}{4}") == exact_value("-0.75")
    assert exact_value("1e99999999999") is None and exact_value("\\frac{1}{0}") is None
    assert exact_value("9" * 101) is None and exact_value("x") is None
    assert elements("(1,2)") is not None and elements("(1,2)\\cup(3,4)") is None and elements("(a+5)(b+2)") is None
    assert elements("(1") is None and elements("1)") is None and elements("(5)") is None
    assert len(elements("\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}")) == 4


def _pairs(responses: list[str], golds: list[str], mode: str) -> set[tuple[str, str]]:
    """The normalised (pred, gold) pairs verify_batch would decide."""
    gold_forms = {gold: equivalence.normalized_gold(gold) for gold in set(golds)}
    return {equivalence._pair(find_answer(r, mode), gold_forms[g], mode) for r, g in zip(responses, golds)} - {None}


# (pred, gold) pairs of every rule, so the test does not depend on the shared MATH-500 data being there
OWN_PAIRS = {("103", "B"), ("42", "Evelyn"), ("(2,4)", "12\\pi"), ("-128", "\\frac{11+9a}{20}"),
             ("-2", "\\frac{1}{8}"), ("Tuesday", "Monday"), ("0.5", "\\frac{1}{2}")}


def _bench_pairs() -> set[tuple[str, str]]:
    sys.path.insert(0, str(BENCH))
    try:
        import graders
        import verify
    finally:
        sys.path.remove(str(BENCH))
    rows = graders.load_table(graders.TABLE)
    sets = [([row["response"] for row in rows], [row["gold"] for row in rows])]
    if verify.DATA.exists():
        responses, golds, _ = verify.build_set(verify.load_problems(verify.DATA, 500), 8, 0)
        sets.append((responses, golds))
    return OWN_PAIRS | {pair for responses, golds in sets for mode in ("strict", "lenient")
                        for pair in _pairs(responses, golds, mode)}


def test_every_rule_matches_the_engine_on_the_bench_and_labelled_pairs(engine):
    decided = {pair: deciding_rule(*pair) for pair in _bench_pairs()}
    decided = {pair: rule for pair, rule in decided.items() if rule is not None}
    by_rule = {name for name, _ in decided.values()}
    assert {"exact numbers", "constant against collection", "constant against word", "constant against expression"} <= by_rule
    pairs = sorted(decided)
    differ = [(pair, decided[pair]) for pair, equal in zip(pairs, engine(pairs)) if equal != decided[pair][1]]
    assert [d for d in differ if d[1][0] not in STRICTER_THAN_ENGINE] == []
    assert [d for d in differ if d[1][1]] == []  # never correct where the engine says not equal


def test_rules_have_names_and_run_in_order():
    assert list(RULES)[0] == "identical"
    assert quick_verdict(normalize("1{,}000"), "1000") is True
    assert quick_verdict(decimal_comma("2,74", "2.74"), "2.74") is True  # lenient mode's reading
