"""Find the final answer in a response: its text and its character span.

Two modes. `strict` (the training reward: a policy must state its answer) reads only the explicit
forms below; `lenient` (evaluation, as public graders score) tries them first, then the fallbacks
of lenient.py.

Strict forms, most explicit first: the last \\boxed{...} / \\fbox{...} (nested braces; several
boxes in a row with only connectors between them, `\\boxed{1} or \\boxed{4}`, are one list `1, 4`,
so hedging over answers is never rewarded as the last of them), a GSM8K `#### X` line, then the
last "the (final) answer is X" / "Answer: X" (X up to the end of the sentence, or the whole `$...$`
when X starts with one). Pure string work, linear in the text, safe on any input.
"""
from __future__ import annotations

import re

from oarctl.errors import OarError
from oarctl.verify.answer_text import BOX_MARKERS, CLOSERS, Extraction, box_run, closing, stripped
from oarctl.verify.boxed import box_spans
from oarctl.verify.lenient import find_lenient

GSM8K = re.compile(r"^[ \t]*####[ \t]*(\S[^\n]*)", re.MULTILINE)
ANSWER_IS = re.compile(r"\banswer\s*(?:is\s*:?|:)[ \t]*(?P<open>\$\$|\$|\\\[|\\\()?", re.IGNORECASE)
# The sentence ends at a period followed by a space or the end, never at a decimal point.
SENTENCE_END = re.compile(r"\.(?=\s|$)|\n")


EXTRACTION_MODES = ("strict", "lenient")


def _boxed(response: str) -> Extraction | None:
    """The last box, or the run of boxes it ends (several answers are one list, never the last)."""
    spans = box_spans(response, BOX_MARKERS)
    if not spans:
        return None
    return box_run(response, spans) or stripped(response, *spans[-1])


def _gsm8k(response: str) -> Extraction | None:
    matches = list(GSM8K.finditer(response))
    return stripped(response, *matches[-1].span(1)) if matches else None


def _answer_is(response: str) -> Extraction | None:
    matches = list(ANSWER_IS.finditer(response))
    if not matches:
        return None
    match = matches[-1]
    start = match.end()
    if match.group("open"):  # math mode: up to its closing delimiter
        end = closing(response, CLOSERS[match.group("open")], start)
    else:
        found = SENTENCE_END.search(response, start)
        end = len(response) if found is None else found.start()
    return stripped(response, start, end)


def check_mode(mode: str) -> str:
    if mode not in EXTRACTION_MODES:
        raise OarError(f"extraction mode {mode!r}: choose one of {', '.join(EXTRACTION_MODES)}")
    return mode


def _strict(response: str) -> Extraction | None:
    for finder in (_boxed, _gsm8k, _answer_is):
        found = finder(response)
        if found is not None:
            return found
    return None


def find_answer(response: str, mode: str = "strict") -> Extraction | None:
    """The final answer of a response (or of a dataset's gold solution), None when there is none."""
    found = _strict(response)
    if check_mode(mode) == "strict":
        return found
    return find_lenient(response, found)  # lenient builds on the strict answer


def extract_answer(response: str, mode: str = "strict") -> str | None:
    """The final answer's text. A building block of strict grading, with `is_equivalent`: lenient
    grading also reads with the gold in hand (gold_readings.py, lenient_rules.py) and takes a second
    path, so grade a response as evaluation does with `oarctl.verify.grade`."""
    found = find_answer(response, mode)
    return None if found is None else found.text
