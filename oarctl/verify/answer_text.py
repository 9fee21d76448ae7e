"""What strict and lenient extraction share: the `Extraction` an extractor returns (an answer's text
and its character span), trimming a span, closing math mode, and reading a run of boxes as one list.

extract.py (strict) and lenient.py (evaluation's fallbacks) both build on these; extract.py hands a
lenient request on to lenient.py, so the shared parts live here rather than in either of them.
Pure string work.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from oarctl.verify.boxed import BOXED

BOX_MARKERS = (BOXED, "\\fbox{")
CLOSERS = {"$$": "$$", "$": "$", "\\[": "\\]", "\\(": "\\)"}
# Between the close of one box and the content of the next: `$ and $x = \\boxed{`, `, \\boxed{`.
CONNECTOR = re.compile(r"[\s$,;]*(?:(?:and|or|&|\\quad|\\qquad|\\text\{\s*(?:and|or)\s*\})[\s$,;]*)?"
                       r"(?:[A-Za-z](?:_\d)?\s*=\s*)?\\(?:boxed|fbox)\{")


@dataclass(frozen=True)
class Extraction:
    text: str    # the answer as read: response[start:end], except for a run of boxes and lenient readings
    start: int   # character span of the answer in the response, half-open
    end: int


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


def closing(response: str, closer: str, start: int) -> int:
    """Where math mode closes, skipping escaped dollars (`$\\$36$`); the end of the text if never."""
    end = response.find(closer, start)
    while closer.startswith("$") and end > 0 and response[end - 1] == "\\":
        end = response.find(closer, end + 1)
    return len(response) if end < 0 else end
