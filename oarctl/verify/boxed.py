"""Minimal verifier: the content of the last \\boxed{...} compared with the gold answer as text.

Pure string work (no eval, no sympy), so it is safe on untrusted model output and needs no timeout.
"""
from __future__ import annotations

BOXED = "\\boxed{"


def box_spans(text: str, markers: tuple[str, ...] = (BOXED,)) -> list[tuple[int, int]]:
    """Character spans (start, end) of the contents of every balanced box, in order of opening.

    A box is any of `markers` (each ends with `{`). One pass with a stack of open braces (None for a
    plain brace, the content start for a box), so hostile text with thousands of unclosed boxes
    stays linear.
    """
    stack: list[int | None] = []
    spans: list[tuple[int, int]] = []
    position = 0
    while position < len(text):
        marker = next((m for m in markers if text.startswith(m, position)), None) if text[position] == "\\" else None
        if marker is not None:
            position += len(marker)
            stack.append(position)
            continue
        character = text[position]
        if character == "{":
            stack.append(None)
        elif character == "}" and stack:
            opened = stack.pop()
            if opened is not None:
                spans.append((opened, position))
        position += 1
    return sorted(spans)


def boxed_span(text: str, markers: tuple[str, ...] = (BOXED,)) -> tuple[int, int] | None:
    """The span of the content of the last-opened balanced box, or None."""
    spans = box_spans(text, markers)
    return spans[-1] if spans else None


def extract_boxed(text: str) -> str | None:
    span = boxed_span(text)
    return None if span is None else text[span[0]:span[1]]


def normalize(answer: str) -> str:
    """Whitespace-insensitive, so `1 2` never matches but ` 12 ` does."""
    return answer.strip()


def score(response_text: str, gold: str) -> tuple[str | None, float]:
    """(extracted answer, reward 1.0/0.0)."""
    extracted = extract_boxed(response_text)
    if extracted is None:
        return None, 0.0
    return extracted, float(normalize(extracted) == normalize(gold))
