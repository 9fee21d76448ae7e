"""Lenient mode's second path: math-verify's own extraction of the whole response.

oarctl's extraction (extract.py, lenient.py) reads the shapes it was written for. In lenient mode a
response it grades as no answer or as wrong goes once more to math-verify, called as its users call
it: `verify(parse(gold), parse(response))` (symbolic.check_response), in the same killable worker
pool and under the same timeout as the equivalence checks. Only a "correct" from this path changes
a verdict, so its false positives are at most math-verify's; its verdicts are recorded as graded
by `math-verify` (the `extraction` column reads `lenient+math-verify`). Strict mode (the training
reward) never takes it: a reward must not depend on a reading the policy did not state.

Not taken where oarctl's reading stands: a last number that lenient extraction refused as
ambiguous (`17, since 16 fails`, `more than 10`, `3 + 4`), which math-verify would read as the
answer, and a wrong answer read from the only box of the response (math-verify reads that same box
first, and the first path already compared it). Its "correct" is not taken either where its reading
overlaps an answer oarctl read as math (`2` of `$2^{10}.$`): the second path is a second reading of
the response, never a second comparison of the same answer (math-verify takes `$1/3.$` for 1).
Nor is it taken on a response without a digit or a backslash or dollar sign, where math-verify's
default extraction finds nothing (it reads `The answer is C` as nothing): a worker's time saved.
Nor where the answer stands in the sentence of an answer marker, in any language (`La respuesta
es 12. Comprobación: 12 + 3 = 15.`): the response stated its answer, and math-verify's reading of
another number (its last, 15) is a misreading, not a second chance.
"""
from __future__ import annotations

import re

from oarctl.verify.boxed import box_spans
from oarctl.verify.answer_text import BOX_MARKERS, Extraction
from oarctl.verify.lenient import FOREIGN_ANSWER, reads_as_math, refuses

GRADED_BY = "math-verify"
SECOND_CHANCE = ("no_answer", "wrong")
# A gold with math delimiters or a box of its own is parsed as written; a bare one (`p - q`) inside
# `$...$`, since math-verify's default extraction finds nothing in bare LaTeX.
MATH_MARKUP = re.compile(r"(?<!\\)\$|\\\(|\\\[|\\boxed\{")
ANYTHING_TO_PARSE = re.compile(r"[\d$\\]")
# An answer marker (`the answer is`, `Answer:`, `####`, or one of another language), then the rest of
# its sentence up to the answer.
MARKER_BEFORE = re.compile(r"(?:\banswer\s*(?:is\b|:)|####|" + FOREIGN_ANSWER.pattern + r")[^.\n。]{0,80}$",
                           re.IGNORECASE)


def math_verify_gold(gold: str) -> str:
    """The gold as a math-verify user passes it to `parse`."""
    return gold if MATH_MARKUP.search(gold) else f"${gold}$"


def item(response: str, gold: str) -> tuple[str, str, str]:
    """A pool item of the second path (the first path's items are (answer, gold) pairs)."""
    return ("response", response, gold)


def deserves_second_path(response: str, found: Extraction | None, verdict: str) -> bool:
    if verdict not in SECOND_CHANCE:
        return False
    if found is None:
        return bool(ANYTHING_TO_PARSE.search(response)) and not refuses(response)
    if not reads_as_math(found.text) and refuses(found.text):  # a prose answer such as `more than 10`
        return False
    return not _lone_box(response, found) and not after_marker(response, found)


def after_marker(response: str, found: Extraction) -> bool:
    """Whether the answer stands in the sentence of an answer marker (any language)."""
    return bool(MARKER_BEFORE.search(response, max(0, found.start - 200), found.start))


def _lone_box(response: str, found: Extraction) -> bool:
    """Whether the answer is the content of the response's only box."""
    spans = box_spans(response, BOX_MARKERS)
    return len(spans) == 1 and (found.start, found.end) == spans[0]


def same_reading(first: str | None, first_span: tuple[int, int], second_span: tuple[int, int]) -> bool:
    """Whether the second path read (a part of) the answer the first path read as math; a first
    answer that is prose (`Jane started 3 hours ago`) is the first path's misreading, not an answer."""
    overlap = second_span[0] < first_span[1] and first_span[0] < second_span[1]
    return first is not None and second_span[0] >= 0 and overlap and reads_as_math(first)


def span_of(response: str, answer: str) -> tuple[int, int]:
    """Where math-verify's reading of the answer stands in the response (its last occurrence);
    (-1, -1) when it rewrote the text."""
    start = response.rfind(answer) if answer else -1
    return (start, start + len(answer)) if start >= 0 else (-1, -1)
