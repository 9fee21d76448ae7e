"""Lenient mode's rules on a normalised (answer, gold) pair: forms that evaluation reads as the
leaderboards do and the training reward (strict mode) does not. Strict pairs never meet them.

`rewrite(raw, pred, gold)` first reads a form as its value, on either side:
- a mixed number, `2 1/4` or `2\\frac{1}{4}` (a whole number, then a proper fraction), is
  `\\frac{9}{4}`; `-2\\frac{1}{4}` is -9/4, never -2 + 1/4; `21/4` (no space) stays 21/4;
- a gold of a number and unit words (`12 apples`) is the number, when the answer is a number
  written without any word (`12`); an answer written with unit words other than the gold's
  (`12 cm` against `12 m`) keeps its words, for the rule below;
- a gold's trailing backslash (`185\\`) is dropped, as lenient extraction drops the answer's.

Then `RULES`, in order, each returning True (equal), False (not equal) or None (not its case);
the first that decides wins, before the cheap path and the engine (equivalence.py):
- different unit words: `12 cm` is not `12 m` (the engine drops both words); plurals are one word;
- compound quantity: `3 \\text{ hours } 20 \\text{ minutes}` (two numbers, each with a unit) is
  not a single number (`3`), which the engine would read after dropping the units;
- decimal against exact: a plain decimal or scientific notation (`1.25 \\times 10^{-3}`, `6.02e23`)
  equals an exact number or constant (`\\frac{1}{800}`, `\\sqrt{2}`, `\\pi`) of the same value; or
  of a value within a relative tolerance of 1e-6, when the decimal has at least 6 significant
  digits (`3.14159` = `\\pi`; `0.33` is not `\\frac{1}{3}`, `1.0` is not `1.000001`). math-verify
  rounds both sides to 6 decimal places instead, an absolute tolerance that fails on large values;
- complex numbers: against a gold in the form `a+bi`, an answer whose value, with `i` the
  imaginary unit, is the same (`(1+2i)(3-i)` = `5+5i`) or far from it (`5-5i`); the values are
  read by the small parser at the end of this module.
"""
from __future__ import annotations

import re
from decimal import Decimal
from fractions import Fraction

from oarctl.verify.cheap import Rule, constant, exact_value, first_verdict
from oarctl.verify.lenient import stray_end
from oarctl.verify.normalize import plain_number

MIXED = re.compile(r"^(-?)(\d{1,9})(?:\s*\\frac\{(\d{1,9})\}\{(\d{1,9})\}|\s+(\d{1,9})/(\d{1,9}))$")
NUMBER_AND_WORDS = re.compile(r"^(-?\d[\d.]*(?:/\d+)?)\s+[A-Za-z][A-Za-z ]*$")
# A number and unit words, plain or in one `\text{}`: `12 cm`, `12\text{ apples}`.
UNIT_WORDS = re.compile(r"^\$?\s*-?\d[\d.,]*(?:/\d+)?\s*(?:\\(?:text|mbox|mathrm)\{)?\s*"
                        r"([A-Za-z][A-Za-z ]*?)\s*\}?\.?$")
# A number, then a unit (`3\text{ hours }`, `2 m`): two of them make a compound quantity. A lone `i`
# or `e` after a number is the imaginary unit or an exponent (`2i \cdot 3i`, `2e5`), not a unit.
WITH_UNIT = re.compile(r"\d\s*(?:\\(?:text|mbox|mathrm)\s*\{\s*)?(?![ie](?![A-Za-z]))[A-Za-z]")
SCIENTIFIC = re.compile(r"^(-?\d+(?:\.\d+)?)\s*(?:\\times|\\cdot)\s*10\^(?:\{(-?\d{1,3})\}|(\d))$")
COMPLEX_FORM = re.compile(r"^-?(?:\d+(?:\.\d+)?\s*[-+]\s*)?(?:\d+(?:\.\d+)?)?\s*i$")
UNIT_LIMIT = 200
RELATIVE_TOLERANCE = Decimal("1e-6")
SIGNIFICANT_DIGITS = 6
COMPLEX_SAME, COMPLEX_FAR = 1e-9, 1e-6  # relative: the same value (float rounding), or another one


def _mixed(answer: str) -> str:
    match = MIXED.match(answer)
    if match is None:
        return answer
    sign, whole = match.group(1), int(match.group(2))
    numerator, denominator = (int(g) for g in (match.group(3) or match.group(5), match.group(4) or match.group(6)))
    if not 0 < numerator < denominator:
        return answer  # `2\frac{5}{4}` is no mixed number in any reading
    return f"{sign}\\frac{{{whole * denominator + numerator}}}{{{denominator}}}"


def _gold_without_words(raw: str, pred: str, gold: str) -> str:
    match = NUMBER_AND_WORDS.match(gold)
    bare_number = exact_value(pred) is not None and not re.search(r"[A-Za-z]", raw)
    return match.group(1) if match is not None and bare_number else gold


def unit_words(answer: str) -> str | None:
    """`12 apples` -> `apple`: the unit words after a number, lower case and singular; None if none
    (and for a text of more than UNIT_LIMIT characters: unit answers are short)."""
    if len(answer) > UNIT_LIMIT:
        return None
    match = UNIT_WORDS.match(" ".join(answer.split()))
    return None if match is None else " ".join(word.lower().removesuffix("s") for word in match.group(1).split())


def rewrite(raw: str, pred: str, gold: str) -> tuple[str, str]:
    """(pred, gold) with the forms above read as their values; `raw` is the answer as written."""
    pred, gold = _mixed(pred), _mixed(gold[:stray_end(gold)] or gold)
    raw_units, gold_units = unit_words(raw), unit_words(gold)
    if raw_units and gold_units and raw_units != gold_units:
        return raw.strip(), gold
    return pred, _gold_without_words(raw, pred, gold)


def different_unit_words(pred: str, gold: str) -> bool | None:
    pred_units, gold_units = unit_words(pred), unit_words(gold)
    return False if pred_units and gold_units and pred_units != gold_units else None


def compound_quantity(pred: str, gold: str) -> bool | None:
    for first, second in ((pred, gold), (gold, pred)):
        if len(WITH_UNIT.findall(first)) >= 2 and exact_value(second) is not None:
            return False
    return None


def _decimal(answer: str) -> Decimal | None:
    """A plain decimal or scientific notation, exactly (at most 3 exponent digits)."""
    match = SCIENTIFIC.match(answer)
    if match is not None:
        return Decimal(match.group(1)).scaleb(int(match.group(2) or match.group(3)))
    number = plain_number(answer)
    return number if number is not None and abs(number.adjusted()) <= 100 else None


def decimal_against_exact(pred: str, gold: str) -> bool | None:
    for first, second in ((pred, gold), (gold, pred)):
        decimal = _decimal(first)
        if decimal is None or "." not in first and "e" not in first.lower() and "10^" not in first:
            continue  # an integer is compared exactly by the cheap path
        exact = exact_value(second)
        if exact is not None and Fraction(decimal) == exact:
            return True
        value = float(exact) if exact is not None else getattr(constant(second), "value", None)
        if value is None or value == 0 or len(decimal.normalize().as_tuple().digits) < SIGNIFICANT_DIGITS:
            continue
        if abs(Decimal(value) - decimal) <= RELATIVE_TOLERANCE * abs(Decimal(value)):
            return True
    return None


def complex_numbers(pred: str, gold: str) -> bool | None:
    if not COMPLEX_FORM.match(gold):
        return None
    pred_value, gold_value = complex_value(pred), complex_value(gold)
    if pred_value is None or gold_value is None:
        return None
    distance, size = abs(pred_value - gold_value), max(1.0, abs(pred_value), abs(gold_value))
    return True if distance <= COMPLEX_SAME * size else False if distance > COMPLEX_FAR * size else None


RULES: dict[str, Rule] = {
    "different unit words": different_unit_words,
    "compound quantity": compound_quantity,
    "decimal against exact": decimal_against_exact,
    "complex numbers": complex_numbers,
}


def lenient_verdict(pred: str, gold: str) -> bool | None:
    """Equal / not equal by a lenient rule, None when none decides."""
    decided = first_verdict(RULES, pred, gold)
    return None if decided is None else decided[1]


# ---- complex values -----------------------------------------------------------------------------
# The value of a short complex-number expression (`(1+2i)(3-i)`, `(2+i)^2`, `\\frac{1}{1+i}`), `i` the
# imaginary unit: numbers, `i`, `+ -`, products (side by side, `\\cdot`, `\\times`), small integer
# powers, `\\frac{...}{...}`, parentheses and braces; anything else (another letter, a function, `/`)
# is not read. A hand-written parser of bounded length: no eval, no sympy, bounded time.

COMPLEX_MAX_LENGTH = 200
COMPLEX_MAX_POWER = 10
COMPLEX_TOKEN = re.compile(r"\s*(?:(\d+(?:\.\d+)?)|(\\(?:frac|cdot|times))(?![A-Za-z])|(i)(?![A-Za-z])|([-+^(){}]))")


class Unreadable(Exception):
    pass


def _tokens(text: str) -> list[str]:
    tokens, position = [], 0
    while position < len(text):
        match = COMPLEX_TOKEN.match(text, position)
        if match is None:
            if text[position:].strip():
                raise Unreadable(text[position:position + 10])
            break
        tokens.append(match.group(match.lastindex))
        position = match.end()
    return tokens


class _ComplexReader:
    def __init__(self, tokens: list[str]):
        self.tokens, self.position = tokens, 0

    def peek(self) -> str | None:
        return self.tokens[self.position] if self.position < len(self.tokens) else None

    def take(self, expected: str | None = None) -> str:
        token = self.peek()
        if token is None or (expected is not None and token != expected):
            raise Unreadable(f"expected {expected}")
        self.position += 1
        return token

    def expression(self) -> complex:
        sign = -1 if self.peek() == "-" else 1
        if self.peek() in ("+", "-"):
            self.take()
        total = sign * self.term()
        while self.peek() in ("+", "-"):
            sign = 1 if self.take() == "+" else -1
            total += sign * self.term()
        return total

    def term(self) -> complex:
        value = self.power()
        while self.peek() not in (None, "+", "-", ")", "}"):
            if self.peek() in ("\\cdot", "\\times"):
                self.take()
            elif self.peek()[0].isdigit() and self.tokens[self.position - 1][0].isdigit():
                raise Unreadable("a number after a number")
            value *= self.power()
        return value

    def power(self) -> complex:
        base = self.atom()
        if self.peek() != "^":
            return base
        self.take()
        braced = self.peek() == "{"
        if braced:
            self.take()
        exponent = self.take()
        if braced:
            self.take("}")
        if not exponent.isdigit() or int(exponent) > COMPLEX_MAX_POWER or (not braced and len(exponent) > 1):
            raise Unreadable("power")
        return base ** int(exponent)

    def atom(self) -> complex:
        token = self.take()
        if token == "i":
            return 1j
        if token[0].isdigit():
            return complex(float(token))
        if token == "\\frac":
            numerator, denominator = self.group(), self.group()
            if denominator == 0:
                raise Unreadable("division by zero")
            return numerator / denominator
        if token in ("(", "{"):
            inner = self.expression()
            self.take(")" if token == "(" else "}")
            return inner
        raise Unreadable(token)

    def group(self) -> complex:
        self.take("{")
        inner = self.expression()
        self.take("}")
        return inner


def complex_value(text: str) -> complex | None:
    """The value, None when the text is not read (or is too long)."""
    if len(text) > COMPLEX_MAX_LENGTH:
        return None
    try:
        reader = _ComplexReader(_tokens(text))
        value = reader.expression()
    except (Unreadable, OverflowError, ZeroDivisionError, RecursionError):
        return None
    return value if reader.peek() is None else None
