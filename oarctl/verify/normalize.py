"""Canonical text of an answer, and the cheap decisions that need no symbolic engine.

`normalize` removes what never changes a value (math delimiters, \\left/\\right, spacing commands,
\\dfrac, degree marks, dollar signs, thousands separators, a trailing period, a \\text{} wrapper,
the parentheses of a choice letter) and writes Unicode relation and operator signs (≥, ×, −) as
LaTeX. Pure string work, linear in the text.
"""
from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from fractions import Fraction

CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
DELIMITERS = [("$$", "$$"), ("$", "$"), ("\\[", "\\]"), ("\\(", "\\)")]
# `(?<!\\)`: the second backslash of a matrix row break `\\ 3` is no spacing command.
NEUTRAL = re.compile(r"\\left\b|\\right\b|(?<!\\)\\[!,;: ]|~|\\displaystyle\b|\\\$|\^\s*\{\s*\\circ\s*\}|\^\s*\\circ\b|\\circ\b|°")
WRAPPER = re.compile(r"^\\(?:text|textbf|mathrm|mbox|mathbf)\{([^{}]*)\}$")
CHOICE = re.compile(r"^\(([A-Ea-e])\)$")
THOUSANDS = re.compile(r"^[-+]?\d{1,3}(?:[, ]\d{3})+(?:\.\d+)?$")  # `1,000`, and `1\,000` once spaced
FRACTION = re.compile(r"^(-?)\\frac\{(-?\d{1,100})\}\{(\d{1,100})\}$")  # `\frac{84}{2}`, `-\frac{3}{4}`
# One way to split the digits (no `\d+\.?\d*`): `1` * 100k + `x` backtracked quadratically.
NUMBER = re.compile(r"^[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?$")
TEXT = re.compile(r"^[A-Za-z][A-Za-z '\-]*$")
SPACE_AROUND_SYMBOL = re.compile(r"\s*([^\w\s\\])\s*")
DECIMAL_COMMA = re.compile(r"^-?\d+,(?:\d{1,2}|\d{4,})$")  # not exactly 3 digits after the comma
UNICODE_MATH = {"≥": "\\geq ", "≤": "\\leq ", "≠": "\\neq ", "−": "-", "×": "\\times ", "÷": "\\div "}
UNIT = re.compile(r"\\(?:text|mbox|mathrm)\{\s*([A-Za-z][A-Za-z ]*?)\s*\}")


def _unwrap_delimiters(answer: str) -> str:
    for opener, closer in DELIMITERS:
        if len(answer) >= len(opener) + len(closer) and answer.startswith(opener) and answer.endswith(closer):
            return answer[len(opener):-len(closer)].strip()
    return answer


def normalize(answer: str) -> str:
    answer = _unwrap_delimiters(CONTROL.sub("", answer).strip())
    for symbol, command in UNICODE_MATH.items():
        answer = answer.replace(symbol, command)
    answer = NEUTRAL.sub(" ", answer.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac"))
    answer = answer.replace("{,}", ",")
    answer = SPACE_AROUND_SYMBOL.sub(r"\1", " ".join(answer.split())).rstrip(".")
    for pattern in (WRAPPER, CHOICE):
        answer = pattern.sub(r"\1", answer).strip()
    if THOUSANDS.match(answer):
        answer = answer.replace(",", "").replace(" ", "")
    return answer


def decimal_comma(pred: str, gold: str) -> str:
    """Lenient mode's reading of a number written with a comma, given the normalised gold.

    `2,74` is 2.74 when the digits after the comma are not exactly three (`1,000` is a thousand,
    which normalize already reads) and the gold is a single number: against a gold list such as
    `{1,2}` the comma separates answers.
    """
    if DECIMAL_COMMA.match(pred) and plain_number(gold) is not None:
        return pred.replace(",", ".")
    return pred


def plain_number(answer: str) -> Decimal | None:
    """The exact value of a plain decimal (`-12`, `0.50`, `1.5E3`), None for anything else.

    A Decimal, not a Fraction: Decimals compare exactly without expanding the number, while a
    Fraction of `1e99999999999` builds 10**99999999999 and one of a million digits takes ~40 s.
    """
    if not NUMBER.match(answer):
        return None
    try:
        return Decimal(answer)
    except (InvalidOperation, ValueError):
        return None


def exact_fraction(answer: str) -> Fraction | None:
    """The exact value of a plain number of at most 100 digits and exponent, or of `\\frac{a}{b}`
    with integers of at most 100 digits (b != 0); None otherwise (never a huge expansion)."""
    number = plain_number(answer)
    if number is not None:
        small = number.is_finite() and len(number.as_tuple().digits) <= 100 and abs(number.adjusted()) <= 100
        return Fraction(number) if small else None
    match = FRACTION.match(answer)
    if match is None or int(match.group(3)) == 0:
        return None
    return Fraction(int(match.group(2)), int(match.group(3))) * (-1 if match.group(1) else 1)


def is_text(answer: str) -> bool:
    """Words only (`Monday`, `B`, `even`): compared as case-insensitive text, never symbolically."""
    return bool(TEXT.match(answer))


def units(answer: str) -> set[str]:
    """Unit words written as \\text{cm} etc.; math-verify drops them, so `5 m` would equal `5 cm`."""
    return {word.lower() for word in UNIT.findall(answer)}


def quick_verdict(pred: str, gold: str) -> bool | None:
    """Equal / not equal when decidable without the symbolic engine, None otherwise.

    Both arguments are normalised. Sound in both directions: a True is never a false positive and a
    False never rejects an equivalent form the engine would accept.
    """
    if pred == gold:
        return True
    pred_number, gold_number = plain_number(pred), plain_number(gold)
    if pred_number is not None and gold_number is not None:
        return pred_number == gold_number
    # An integer fraction of the same exact value is equal (`\frac{84}{2}` = `42`); a different
    # value is left to the engine, whose numeric tolerance may still accept it.
    pred_exact, gold_exact = exact_fraction(pred), exact_fraction(gold)
    if pred_exact is not None and gold_exact is not None and pred_exact == gold_exact:
        return True
    if is_text(pred) and is_text(gold):
        return pred.lower() == gold.lower()
    pred_units, gold_units = units(pred), units(gold)
    if pred_units and gold_units and pred_units != gold_units:
        return False
    return None
