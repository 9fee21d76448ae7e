"""Per-token heatmaps as text: pure functions of (tokens, values, answer span) -> string.

Colours: a sequential ramp (pale yellow -> dark red) from the smallest to the largest finite
value of the row, so darker always means more credit; for signed values (token advantages) a
diverging ramp (blue < 0 < red) centred on 0 keeps the sign readable. NaN (raw scores outside
the reasoning span) is drawn neutral: no colour in the terminal, grey in HTML, `token` without
a bracket in plain text. The answer span (half-open, response-token indices) is underlined in the
terminal, outlined in HTML and wrapped in `<answer>...</answer>` in plain text.
"""
from __future__ import annotations

import html
import math

LOW, HIGH = (255, 255, 204), (189, 0, 38)  # sequential ramp ends
NEGATIVE, ZERO, POSITIVE = (33, 102, 172), (247, 247, 247), (178, 24, 43)  # diverging ramp
NEUTRAL_HTML = "#e0e0e0"
RESET, UNDERLINE = "\x1b[0m", "\x1b[4m"


def _mix(a: tuple, b: tuple, t: float) -> tuple[int, int, int]:
    return tuple(round(x + (y - x) * t) for x, y in zip(a, b))


def _finite(values) -> list[float]:
    return [v for v in values if v is not None and math.isfinite(v)]


def colour_scale(values):
    """value -> (r, g, b), or None for NaN; the scale is fixed by the row's finite values."""
    finite = _finite(values)
    low, high = (min(finite), max(finite)) if finite else (0.0, 0.0)
    diverging = low < 0 < high

    def colour(value):
        if value is None or not math.isfinite(value):
            return None
        if diverging:
            bound = max(-low, high)
            return _mix(ZERO, POSITIVE, value / bound) if value >= 0 else _mix(ZERO, NEGATIVE, -value / bound)
        return _mix(LOW, HIGH, 0.5 if high == low else (value - low) / (high - low))
    return colour


def luminance(rgb: tuple) -> float:
    """Relative luminance (ITU-R BT.709 weights): picks black or white text on a background."""
    r, g, b = rgb
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def display_text(token: str) -> str:
    """Whitespace made visible, so an empty-looking token still shows where its credit went."""
    return token.replace("\n", "\\n").replace("\t", "\\t")


def _in_span(index: int, span) -> bool:
    return span is not None and span[0] <= index < span[1]


def render_plain(tokens: list[str], values, span=None, digits: int = 2) -> str:
    """`token[value]` for every token; the answer span inside `<answer>...</answer>`."""
    parts = []
    for index, (token, value) in enumerate(zip(tokens, values)):
        if _in_span(index, span) and index == span[0]:
            parts.append("<answer>")
        finite = value is not None and math.isfinite(value)
        parts.append(display_text(token) + (f"[{value:.{digits}f}]" if finite else ""))
        if _in_span(index, span) and index == span[1] - 1:
            parts.append("</answer>")
    return "".join(parts)


def render_ansi(tokens: list[str], values, span=None) -> str:
    """Truecolor ANSI backgrounds (24-bit SGR 48;2), answer span underlined."""
    colour = colour_scale(values)
    parts = []
    for index, (token, value) in enumerate(zip(tokens, values)):
        rgb = colour(value)
        style = UNDERLINE if _in_span(index, span) else ""
        if rgb is not None:
            text = (0, 0, 0) if luminance(rgb) > 140 else (255, 255, 255)
            style += "\x1b[48;2;{};{};{}m\x1b[38;2;{};{};{}m".format(*rgb, *text)
        parts.append(f"{style}{display_text(token)}{RESET}" if style else display_text(token))
        if token.endswith("\n"):
            parts.append("\n")  # keep the response's own line breaks
    return "".join(parts)


def render_html(tokens: list[str], values, span=None) -> str:
    """One <span class="tok"> per token with its value as a tooltip; the answer span outlined."""
    colour = colour_scale(values)
    parts = []
    for index, (token, value) in enumerate(zip(tokens, values)):
        if _in_span(index, span) and index == span[0]:
            parts.append('<span class="answer">')
        rgb = colour(value)
        background = NEUTRAL_HTML if rgb is None else "#{:02x}{:02x}{:02x}".format(*rgb)
        ink = "#000" if rgb is None or luminance(rgb) > 140 else "#fff"
        title = "n/a" if rgb is None else f"{value:.4g}"
        parts.append(f'<span class="tok" style="background:{background};color:{ink}" title="{title}">'
                     f'{html.escape(display_text(token))}</span>')
        if _in_span(index, span) and index == span[1] - 1:
            parts.append("</span>")
    return "".join(parts)
