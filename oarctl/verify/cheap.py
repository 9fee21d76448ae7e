"""The cheap path: verdicts decided in this process, without the symbolic engine.

`quick_verdict(pred, gold)` tries the rules of `RULES` in order on two normalised answers; each
returns True (equal), False (not equal) or None (not its case), and the first that decides wins.
None from all of them sends the pair to the engine (math-verify in a worker). A rule may decide
only where it gives the engine's own verdict, so it changes the speed, never the grade:
tests/test_verify_cheap.py checks every rule against the engine on hand-picked tricky cases and on
every pair of bench/verify.py's set and bench/data/graders_labelled.jsonl. The typed rules
(a constant against a word, a collection or an expression) only ever say "not equal", and only
with a margin no rounding of the engine's can bridge; values come from exact numbers and arith.py.

Two rules are stricter than the engine on purpose, and older than the typed ones: plain numbers
compare exactly (`1.0000001` is not `1`, where math-verify rounds floats to 6 places), and answers
in different `\\text{}` units are not equal (math-verify drops units: `5 m` = `5 cm`). Pure string
and small-number work, bounded: no number of more than 100 digits is ever expanded.
"""
from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import Callable

from oarctl.verify.arith import Value, evaluate
from oarctl.verify.normalize import plain_number

# `\frac{84}{2}`, `-\frac{3}{4}`, and TeX's one-digit shorthands `\frac12`, `\frac 59`, `\frac{270}7`
FRACTION = re.compile(r"^(-?)\\frac\s*(?:\{(-?\d{1,100})\}|(\d))\s*(?:\{(\d{1,100})\}|(\d))$")
SLASH = re.compile(r"^(-?\d{1,100})/(\d{1,100})$")
TEXT = re.compile(r"^[A-Za-z][A-Za-z '\-]*$")
# One word of letters: math-verify reads it as a product of symbols, never a number, as long as one
# letter is a variable (`e` is Euler's number, `i` may be the imaginary unit: `ee` = e^2 and `ii` =
# -1 are numbers) and latex2sympy does not rewrite it (`percent`, `pct`, `inf`, `and`, `or`; unit
# words are dropped only after a number, hence one word). No hyphen (`ab-ba` = 0) or apostrophe.
WORD = re.compile(r"^[A-Za-z]{1,40}$")
REWRITTEN_WORDS = re.compile(r"inf|pct|percent|sqrt|^and$|^or$", re.IGNORECASE)
CONSTANT_LETTERS = set("eEiI")
UNIT = re.compile(r"\\(?:text|mbox|mathrm)\{\s*([A-Za-z][A-Za-z ]*?)\s*\}")
# Matrices as math-verify compares them; not vmatrix, a determinant (a number).
MATRIX = re.compile(r"^\\begin\{([pb]matrix)\}(.*)\\end\{\1\}$", re.DOTALL)
INFINITY = {"\\infty": 1, "+\\infty": 1, "-\\infty": -1}
OPENERS, CLOSERS = "([{", ")]}"
MAX_ELEMENTS = 1000  # a longer collection is left to the engine (and its timeout)
# Closer than this and math-verify may call two values equal (floats rounded to 6 places, 15
# significant digits): such pairs go to the engine.
ABSOLUTE_MARGIN = 1e-6
RELATIVE_MARGIN = 1e-9


def exact_value(answer: str) -> Fraction | None:
    """The exact value of a plain number of at most 100 digits and exponent, of `\\frac{a}{b}` (or a
    shorthand) or `a/b` with integers of at most 100 digits (b != 0); None otherwise (never a huge
    expansion: a Fraction of `1e99999999999` would build 10**99999999999)."""
    number = plain_number(answer)
    if number is not None:
        small = number.is_finite() and len(number.as_tuple().digits) <= 100 and abs(number.adjusted()) <= 100
        return Fraction(number) if small else None
    match = FRACTION.match(answer)
    if match is not None:
        sign, numerator, denominator = match.group(1), match.group(2) or match.group(3), match.group(4) or match.group(5)
        return _ratio(numerator, denominator, -1 if sign else 1)
    match = SLASH.match(answer)
    return None if match is None else _ratio(match.group(1), match.group(2), 1)


def _ratio(numerator: str, denominator: str, sign: int) -> Fraction | None:
    return None if int(denominator) == 0 else sign * Fraction(int(numerator), int(denominator))


def constant(answer: str) -> Value | None:
    """The value of an exact number or of a constant expression arith.py reads (`1+2\\sqrt{3}`,
    `12\\pi`); None for anything else, collections and expressions with variables included."""
    exact = exact_value(answer)
    if exact is not None:
        return Value(float(exact), abs(float(exact)))
    read = evaluate(answer)
    return read[0][0] if read is not None and not read[1] else None


def far(a: Value, b: Value) -> bool:
    """Values no float rounding or precision of the engine can make equal (an infinity is far from
    any number), nor our own float rounding (`scale`)."""
    if math.isinf(a.value) or math.isinf(b.value):
        return a.value != b.value
    distance = abs(a.value - b.value)
    return distance > ABSOLUTE_MARGIN and distance > RELATIVE_MARGIN * max(a.scale, b.scale, abs(a.value), abs(b.value))


def _element(text: str) -> Value | None:
    if text in INFINITY:
        return Value(INFINITY[text] * math.inf, math.inf)
    return constant(text)


def _closing_index(text: str, start: int) -> int | None:
    """Where the bracket group opened at `start` closes (any bracket kinds: `[0,9)` is an interval),
    None if never."""
    depth = 0
    for index in range(start, len(text)):
        if text[index] in OPENERS:
            depth += 1
        elif text[index] in CLOSERS:
            depth -= 1
            if depth == 0:
                return index
    return None


def top_level_split(text: str, separator: str) -> list[str] | None:
    """`text` split at the separators outside any bracket; None when brackets do not balance."""
    parts, depth, start = [], 0, 0
    index = 0
    while index < len(text):
        character = text[index]
        if character in OPENERS:
            depth += 1
        elif character in CLOSERS:
            depth -= 1
            if depth < 0:
                return None
        elif depth == 0 and text.startswith(separator, index):
            parts.append(text[start:index])
            start = index + len(separator)
            index = start
            continue
        index += 1
    return parts + [text[start:]] if depth == 0 else None


def _bracketed(text: str) -> str | None:
    """The inside of `(...)`, `[...)`, `\\{...\\}` etc. when one bracket pair spans all of `text`."""
    if text.startswith("\\{") and text.endswith("\\}"):
        text = text[1:-2] + "}"  # `\{1,2\}` read as `{1,2}`
    if len(text) >= 2 and text[0] in OPENERS and _closing_index(text, 0) == len(text) - 1:
        return text[1:-1]
    return None


def elements(answer: str) -> list[Value] | None:
    """The values of a tuple, interval, set, bare list (two or more elements) or pmatrix/bmatrix
    whose elements are all constants (or +-infinity); None for anything else."""
    matrix = MATRIX.match(answer)
    if matrix is not None:
        texts = [cell for row in matrix.group(2).split("\\\\") for cell in row.split("&") if cell.strip()]
    else:
        inside = _bracketed(answer)
        texts = top_level_split(answer if inside is None else inside, ",")
        if texts is None or len(texts) < 2:
            return None
    if len(texts) > MAX_ELEMENTS:
        return None
    values = [_element(text.strip()) for text in texts]
    return values if values and all(value is not None for value in values) else None


def proper_intervals(answer: str) -> bool:
    """A union (`\\cup`) of intervals, each with constant or infinite ends, the left far below the
    right: an infinite set, never a single number."""
    parts = top_level_split(answer, "\\cup")
    if parts is None or not 2 <= len(parts) <= MAX_ELEMENTS:
        return False
    for part in parts:
        values = elements(part) if _bracketed(part) is not None else None
        if values is None or len(values) != 2 or not values[0].value < values[1].value or not far(*values):
            return False
    return True


def is_text(answer: str) -> bool:
    """Words only (`Monday`, `B`, `even`): compared as case-insensitive text, never symbolically."""
    return bool(TEXT.match(answer))


def units(answer: str) -> set[str]:
    """Unit words written as \\text{cm} etc.; math-verify drops them, so `5 m` would equal `5 cm`."""
    return {word.lower() for word in UNIT.findall(answer)}


# ---- the rules, in order ------------------------------------------------------------------------

def identical(pred: str, gold: str) -> bool | None:
    return True if pred == gold else None


def plain_numbers(pred: str, gold: str) -> bool | None:
    """Exact decimals (`0.50` = `0.5`, `1.5E3` = `1500`); never expanded, so `1e99999999999` is safe."""
    pred_number, gold_number = plain_number(pred), plain_number(gold)
    if pred_number is None or gold_number is None:
        return None
    return pred_number == gold_number


def exact_numbers(pred: str, gold: str) -> bool | None:
    """Numbers and integer fractions: the same value is equal (`\\frac{84}{2}` = `42`), values far
    apart are not (`\\frac{1}{3}` vs `0.33`); close values are left to the engine's rounding
    (`0.333333` = `\\frac{1}{3}` there)."""
    pred_value, gold_value = exact_value(pred), exact_value(gold)
    if pred_value is None or gold_value is None:
        return None
    if pred_value == gold_value:
        return True
    return False if far(constant(pred), constant(gold)) else None


def words(pred: str, gold: str) -> bool | None:
    return pred.lower() == gold.lower() if is_text(pred) and is_text(gold) else None


def different_units(pred: str, gold: str) -> bool | None:
    pred_units, gold_units = units(pred), units(gold)
    return False if pred_units and gold_units and pred_units != gold_units else None


def _constant_and_other(pred: str, gold: str) -> tuple[Value, str] | None:
    """(the value, the other answer) when one side is a constant and the other is not read as one;
    the pred is tried first."""
    for first, second in ((pred, gold), (gold, pred)):
        value = constant(first)
        if value is not None and constant(second) is None:
            return value, second
    return None


def constant_against_word(pred: str, gold: str) -> bool | None:
    """`6` vs `even`: a product of symbols with a variable is never a constant."""
    found = _constant_and_other(pred, gold)
    if found is None or not WORD.match(found[1]) or REWRITTEN_WORDS.search(found[1]):
        return None
    return None if set(found[1]) <= CONSTANT_LETTERS else False


def constant_against_collection(pred: str, gold: str) -> bool | None:
    """`4` vs `(1,-16,-4,43)`, `12\\pi` vs `[2,\\infty)`, `\\{1,2\\}`, `1,2`, a matrix,
    `(1,2)\\cup(3,4)`: a constant never equals a collection of two or more constant elements as long
    as one of them is far from it (`[5,5]`, `\\{5,5\\}` and `5,5` are the set {5}, which
    math-verify does call equal to 5), nor a union of proper intervals."""
    found = _constant_and_other(pred, gold)
    if found is None:
        return None
    value, other = found
    if proper_intervals(other):
        return False
    values = elements(other)
    return False if values is not None and any(far(element, value) for element in values) else None


def constant_against_expression(pred: str, gold: str) -> bool | None:
    """`14` vs `1+2\\sqrt{3}`, `10` vs `x^3+3x-6`, `6\\sqrt{2}` vs `3R^2`: an expression arith.py
    reads is not equal to a constant when it takes two values (it has a variable and is not
    constant, so no simplification makes it a number) or when its one value is far from it."""
    for first, second in ((pred, gold), (gold, pred)):
        value, read = constant(first), evaluate(second)
        if value is None or read is None:
            continue
        (at_one_point, at_another), has_variables = read
        if has_variables:
            return False if far(at_one_point, at_another) else None
        return False if far(at_one_point, value) else None
    return None


Rule = Callable[[str, str], "bool | None"]
RULES: dict[str, Rule] = {
    "identical": identical,
    "plain numbers": plain_numbers,
    "exact numbers": exact_numbers,
    "words": words,
    "different units": different_units,
    "constant against word": constant_against_word,
    "constant against collection": constant_against_collection,
    "constant against expression": constant_against_expression,
}


def first_verdict(rules: dict[str, Rule], pred: str, gold: str) -> tuple[str, bool] | None:
    """(the rule's name, its verdict) of the first of `rules`, in order, that decides; None when none does."""
    for name, rule in rules.items():
        verdict = rule(pred, gold)
        if verdict is not None:
            return name, verdict
    return None


def deciding_rule(pred: str, gold: str) -> tuple[str, bool] | None:
    """(the rule's name, its verdict) of the first rule of RULES that decides; None when none does."""
    return first_verdict(RULES, pred, gold)


def quick_verdict(pred: str, gold: str) -> bool | None:
    """Equal / not equal when decidable without the symbolic engine, None otherwise. Both arguments
    are normalised."""
    decided = deciding_rule(pred, gold)
    return None if decided is None else decided[1]
