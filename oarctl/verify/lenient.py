"""Lenient extraction: the fallbacks of the graders behind published scores, for evaluation.

Strict extraction (extract.py) needs an explicit marker, so a policy under training must state its
answer. Evaluation should score a model as leaderboards do, so lenient mode reads more shapes, and
returns no answer whenever a reading is ambiguous (a wrong "correct" is worse than a missed one):

1. the strict answer, where one of the form `12 apples` / `45 percent` / `\\$5` becomes the number
   (`45\\%` for percent words);
2. a response that is a bare expression, without prose or math delimiters (`x >= 5`, `2,74`);
3. else the later of the last math span (`$...$`, `$$...$$`, `\\[...\\]`, `\\(...\\)`) that reads as
   math and the last number of the prose outside the spans. A number next to an operator (`x > 5`,
   `2^10`) or a comma list (`1,2,3`) is ambiguous: no answer. `percent`, `per cent` or `%` after
   either makes it a percentage. Thousands separators are read by normalize; a decimal comma
   (`2,74`) by normalize.decimal_comma, which also sees the gold.

Pure string work, linear in the text (spans are paired in one left-to-right pass).
"""
from __future__ import annotations

import re

from oarctl.verify.extract import Extraction, closing, stripped

OPENER = re.compile(r"(?<!\\)\$\$|(?<!\\)\\\[|(?<!\\)\\\(|(?<!\\)\$")
CLOSERS = {"$$": "$$", "$": "$", "\\[": "\\]", "\\(": "\\)"}
# Commands and their first argument (`\text{cm}`, `\begin{pmatrix}`) never make a span prose.
COMMAND = re.compile(r"\\[A-Za-z]+(?:\{[^{}]*\})?")
# A bare word of three letters or more, or a letter of a script other than Latin and Greek (a
# Chinese sentence): prose, or a currency `$` paired with the next `$` (`$5 and $`).
PROSE_WORD = re.compile(r"(?<![A-Za-z])[A-Za-z]{3,}|[^\W\d_A-Za-z\u0370-\u03ff]")
NUMBER = re.compile(r"(?<![A-Za-z0-9_.,])-?(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+,\d+|\d+(?:\.\d+)?|\.\d+)(?:/\d+)?"
                    r"(?![A-Za-z0-9_]|[.,]\d)")
PERCENT_AFTER = re.compile(r"\s*(?:\\?%|percent\b|per\s+cent\b)", re.IGNORECASE)
# Next to one of these a number is part of an expression or a relation, not the answer.
OPERATOR_BEFORE = re.compile(r"(?:[\^*/+<>≤≥×÷{}_\\-]|\\(?:geq?|leq?|neq?|gt|lt|times|cdot))\s*$")
OPERATOR_AFTER = re.compile(r"\s*[\^*/+<>≤≥×÷=(){}_\\-]")
# Words before the last number that make it something other than the answer: a list's last item
# (`2, 4 and 8`), or a hedge (`17, since 16 fails`, `more than 10`, `not 6`).
NOT_THE_ANSWER_BEFORE = re.compile(r"(?:\d\s*(?:,|and|or|&)\s*(?:and\s+|or\s+)?"
                                   r"|\b(?:since|because|not|cannot|can't|isn't|except|unless|than|if|but|instead of"
                                   r"|maybe|perhaps|possibly)\s+(?:\S+\s+){0,2})$",
                                   re.IGNORECASE)
NUMBER_WITH_WORDS = re.compile(r"^(?:\\?\$\s*)?(-?[\d.,]+(?:/\d+)?)\s*(%|\\%|percent|per\s+cent)?"
                               r"(?:\s+[A-Za-z][A-Za-z ]*)?\.?$", re.IGNORECASE)
BARE_LIMIT = 300  # characters: a longer text without prose is not "just the answer"


def _number_only(found: Extraction) -> Extraction:
    """`12 apples` -> `12`, `45 percent` -> `45\\%`, `\\$5` -> `5`; anything else unchanged."""
    match = NUMBER_WITH_WORDS.match(found.text)
    if match is None or not any(c.isdigit() for c in match.group(1)):
        return found
    percent = "\\%" if match.group(2) else ""
    return Extraction(match.group(1) + percent, found.start, found.end)


def _reads_as_math(content: str) -> bool:
    content = content.strip()
    return bool(content) and not PROSE_WORD.search(COMMAND.sub(" ", content))


def math_spans(response: str) -> list[tuple[int, int, int, int]]:
    """(span start, content start, content end, span end) of each math span that reads as math. A pair that
    holds prose (two currency dollars) is skipped, and its closing `$` may open the next span."""
    spans, position = [], 0
    while True:
        opener = OPENER.search(response, position)
        if opener is None:
            return spans
        closer = CLOSERS[opener.group()]
        end = closing(response, closer, opener.end())
        if end >= len(response):
            return spans  # unclosed: the rest is not math
        if _reads_as_math(response[opener.end():end]):
            spans.append((opener.start(), opener.end(), end, end + len(closer)))
            position = end + len(closer)
        else:
            position = end if closer == "$" else end + len(closer)


def _with_percent(response: str, found: Extraction, after: int) -> Extraction:
    if PERCENT_AFTER.match(response, after) and not found.text.endswith("%"):
        return Extraction(found.text + "\\%", found.start, found.end)
    return found


def _last_number(response: str, spans: list) -> re.Match | None:
    """The last number outside the math spans."""
    last, inside = None, 0
    for match in NUMBER.finditer(response):
        while inside < len(spans) and spans[inside][3] <= match.start():
            inside += 1
        if inside < len(spans) and spans[inside][0] <= match.start():
            continue
        last = match
    return last


def _ambiguous(response: str, match: re.Match) -> bool:
    before = response[max(0, match.start() - 40):match.start()]
    return bool(OPERATOR_BEFORE.search(before[-8:]) or OPERATOR_AFTER.match(response, match.end())
                or NOT_THE_ANSWER_BEFORE.search(before))


def _last_expression(response: str) -> Extraction | None:
    spans = math_spans(response)
    number = _last_number(response, spans)
    if spans and (number is None or spans[-1][3] > number.start()):
        _, start, end, after = spans[-1]
        found = stripped(response, start, end)
        return None if found is None else _with_percent(response, found, after)
    if number is None or _ambiguous(response, number):
        return None
    return _with_percent(response, Extraction(number.group(), number.start(), number.end()), number.end())


def _bare(response: str) -> Extraction | None:
    """The whole response, when it is one short expression without prose or math delimiters."""
    if len(response.strip()) > BARE_LIMIT or OPENER.search(response) or "\n" in response.strip():
        return None
    return stripped(response, 0, len(response)) if _reads_as_math(response) else None


def find_lenient(response: str, strict: Extraction | None) -> Extraction | None:
    """The lenient answer, given the strict one (None when strict found nothing)."""
    if strict is not None:
        return _number_only(strict)
    return _bare(response) or _last_expression(response)
