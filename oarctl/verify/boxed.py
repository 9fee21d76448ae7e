"""Minimal verifier: the content of the last \\boxed{...} compared with the gold answer as text.

Pure string work (no eval, no sympy), so it is safe on untrusted model output and needs no timeout.
"""
from __future__ import annotations

BOXED = "\\boxed{"


def boxed_span(text: str) -> tuple[int, int] | None:
    """Character span (start, end) of the content of the last balanced \\boxed{...}, or None."""
    start = text.rfind(BOXED)
    while start != -1:
        depth, position = 1, start + len(BOXED)
        while position < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[position], 0)
            position += 1
        if depth == 0:
            return start + len(BOXED), position - 1
        start = text.rfind(BOXED, 0, start)  # unbalanced: try an earlier box
    return None


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
