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
from dataclasses import dataclass

from oarctl.errors import OarError
from oarctl.verify.boxed import BOXED, box_spans

BOX_MARKERS = (BOXED, "\\fbox{")
GSM8K = re.compile(r"^[ \t]*####[ \t]*(\S[^\n]*)", re.MULTILINE)
ANSWER_IS = re.compile(r"\banswer\s*(?:is\s*:?|:)[ \t]*(?P<open>\$\$|\$|\\\[|\\\()?", re.IGNORECASE)
CLOSERS = {"$$": "$$", "$": "$", "\\[": "\\]", "\\(": "\\)"}
# Between the close of one box and the content of the next: `$ and $x = \\boxed{`, `, \\boxed{`.
CONNECTOR = re.compile(r"[\s$,;]*(?:(?:and|or|&|\\quad|\\qquad|\\text\{\s*(?:and|or)\s*\})[\s$,;]*)?"
                       r"(?:[A-Za-z](?:_\d)?\s*=\s*)?\\(?:boxed|fbox)\{")
# The sentence ends at a period followed by a space or the end, never at a decimal point.
SENTENCE_END = re.compile(r"\.(?=\s|$)|\n")


@dataclass(frozen=True)
class Extraction:
    text: str    # the answer as read: response[start:end], except for a run of boxes and lenient readings
    start: int   # character span of the answer in the response, half-open
    end: int


EXTRACTION_MODES = ("strict", "lenient")


def stripped(response: str, start: int, end: int) -> Extraction | None:
    """The span without surrounding whitespace, or None when nothing is left."""
    while start < end and response[start].isspace():
        start += 1
    while end > start and response[end - 1].isspace():
        end -= 1
    return Extraction(response[start:end], start, end) if end > start else None


def box_run(response: str, spans: list[tuple[int, int]], connector: re.Pattern = CONNECTOR) -> Extraction | None:
    """Boxes in a row at the end of the boxed ones, read as one list; None for fewer than two.
    `connector`: what may stand between two boxes of the run, up to the next box's content."""
    run = spans[-1:]  # from the last box backwards
    for span in reversed(spans[:-1]):
        gap = response[span[1] + 1:run[-1][0]]
        if span[1] >= run[-1][0] or not connector.fullmatch(gap):
            break
        run.append(span)
    if len(run) < 2:
        return None
    run.reverse()
    parts = [response[start:end].strip() for start, end in run]
    return Extraction(", ".join(parts), run[0][0], run[-1][1]) if all(parts) else None


def _boxed(response: str) -> Extraction | None:
    """The last box, or the run of boxes it ends (several answers are one list, never the last)."""
    spans = box_spans(response, BOX_MARKERS)
    if not spans:
        return None
    return box_run(response, spans) or stripped(response, *spans[-1])


def _gsm8k(response: str) -> Extraction | None:
    matches = list(GSM8K.finditer(response))
    return stripped(response, *matches[-1].span(1)) if matches else None


def closing(response: str, closer: str, start: int) -> int:
    """Where math mode closes, skipping escaped dollars (`$\\$36$`); the end of the text if never."""
    end = response.find(closer, start)
    while closer.startswith("$") and end > 0 and response[end - 1] == "\\":
        end = response.find(closer, end + 1)
    return len(response) if end < 0 else end


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
    from oarctl.verify.lenient import find_lenient  # lenient builds on this module's parts

    return find_lenient(response, found)


def extract_answer(response: str, mode: str = "strict") -> str | None:
    found = find_answer(response, mode)
    return None if found is None else found.text
