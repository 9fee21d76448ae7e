"""Canonical text of an answer (the decisions made on it without the engine are in cheap.py).

`normalize` removes what never changes a value (math delimiters, \\left/\\right, spacing commands,
\\dfrac, degree marks, dollar signs, thousands separators, a trailing period, a \\text{} wrapper,
the parentheses of a choice letter) and writes Unicode relation and operator signs (≥, ×, −) as
LaTeX. Pure string work, linear in the text.
"""
from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
DELIMITERS = [("$$", "$$"), ("$", "$"), ("\\[", "\\]"), ("\\(", "\\)")]
# `(?<!\\)`: the second backslash of a matrix row break `\\ 3` is no spacing command.
NEUTRAL = re.compile(r"\\left\b|\\right\b|(?<!\\)\\[!,;: ]|~|\\displaystyle\b|\\\$|\^\s*\{\s*\\circ\s*\}|\^\s*\\circ\b|\\circ\b|°")
WRAPPER = re.compile(r"^\\(?:text|textbf|mathrm|mbox|mathbf)\{([^{}]*)\}$")
CHOICE = re.compile(r"^\(([A-Ea-e])\)$")
THOUSANDS = re.compile(r"^[-+]?\d{1,3}(?:[, ]\d{3})+(?:\.\d+)?$")  # `1,000`, and `1\,000` once spaced
# One way to split the digits (no `\d+\.?\d*`): `1` * 100k + `x` backtracked quadratically.
NUMBER = re.compile(r"^[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?$")
SPACE_AROUND_SYMBOL = re.compile(r"\s*([^\w\s\\])\s*")
DECIMAL_COMMA = re.compile(r"^-?\d+,(?:\d{1,2}|\d{4,})$")  # not exactly 3 digits after the comma
EUROPEAN = re.compile(r"^-?\d{1,3}(?:\.\d{3})+,\d+$")  # `1.234,5`: dots group thousands, the comma is decimal
# Groups of three digits after a comma and a plain space: `32, 349` lists two numbers.
SPACED_LIST = re.compile(r"^\$?\s*-?\d{1,3}(?:,[ \t]+\d{3})+\s*\$?$")
UNICODE_MATH = {"≥": "\\geq ", "≤": "\\leq ", "≠": "\\neq ", "−": "-", "×": "\\times ", "÷": "\\div "}


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
    which normalize already reads), and `1.234,5` is 1234.5, when the gold is a single number:
    against a gold list such as `{1,2}` the comma separates answers.
    """
    if plain_number(gold) is None:
        return pred
    if EUROPEAN.match(pred):
        return pred.replace(".", "").replace(",", ".")
    return pred.replace(",", ".") if DECIMAL_COMMA.match(pred) else pred


def spaced_list(raw: str, pred: str) -> str:
    """Lenient mode's reading of `32, 349` (the answer as written, then normalised): a list, since a
    thousands separator stands right against the digits (`32,349`, `32{,}349`, `32,\\!349`);
    normalize alone reads all of them as 32349."""
    if not SPACED_LIST.match(raw.strip()):
        return pred
    return ", ".join(part.strip(" \t$") for part in raw.split(","))


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
