"""Lenient extraction: the fallbacks of the graders behind published scores, for evaluation.

Strict extraction (extract.py) needs an explicit marker, so a policy under training must state its
answer. Evaluation should score a model as leaderboards do, so lenient mode reads more shapes, and
returns no answer whenever a reading is ambiguous (a wrong "correct" is worse than a missed one):

1. the strict answer, where one of the form `12 apples` / `45 percent` / `\\$5` becomes the number
   (`45\\%` for percent words), a sentence after an answer marker (`Final Answer: The largest $n$
   is 34.`) is read as in 3 below, and a run of boxes may be joined by several connector words
   (`\\boxed{-2} \\quad \\text{and} \\quad \\boxed{1}` is the list `-2, 1`);
2. the sentence after an answer marker of another language (`Réponse :`, `答案：`, `Ответ:`), read
   as in 3 below; else a response that is a bare expression, without prose or math delimiters
   (`x >= 5`, `2,74`);
3. else the later of the last math span (`$...$`, `$$...$$`, `\\[...\\]`, `\\(...\\)`) that reads as
   math and the last number of the prose outside the spans. A number next to an operator (`x > 5`,
   `2^10`) or a comma list (`1,2,3`) is ambiguous: no answer. `percent`, `per cent` or `%` after
   either makes it a percentage. Markdown bold (`**92**`) is formatting, not two operators.
   Thousands separators are read by normalize; a decimal comma (`2,74`) by normalize.decimal_comma,
   which also sees the gold.

`refuses` says where the last expression was refused as ambiguous, so that lenient mode's second
path (second_path.py) does not overrule that refusal.

Pure string work, linear in the text (spans are paired in one left-to-right pass).
"""
from __future__ import annotations

import re

from oarctl.verify.boxed import box_spans
from oarctl.verify.answer_text import BOX_MARKERS, CLOSERS, Extraction, box_run, closing, stripped

OPENER = re.compile(r"(?<!\\)\$\$|(?<!\\)\\\[|(?<!\\)\\\(|(?<!\\)\$")
# Commands and their first argument (`\text{cm}`, `\begin{pmatrix}`) never make a span prose.
COMMAND = re.compile(r"\\[A-Za-z]+(?:\{[^{}]*\})?")
# A bare word of three letters or more, or a letter of a script other than Latin and Greek (a
# Chinese sentence): prose, or a currency `$` paired with the next `$` (`$5 and $`).
PROSE_WORD = re.compile(r"(?<![A-Za-z])[A-Za-z]{3,}|[^\W\d_A-Za-z\u0370-\u03ff]")
NUMBER = re.compile(r"(?<![A-Za-z0-9_.,])-?(?:\d{1,3}(?:\.\d{3})+,\d+|\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+,\d+"
                    r"|\d+(?:\.\d+)?|\.\d+)(?:/\d+)?(?![A-Za-z0-9_]|[.,]\d)")
PERCENT_AFTER = re.compile(r"\s*(?:\\?%|percent\b|per\s+cent\b)", re.IGNORECASE)
# Next to one of these a number is part of an expression or a relation, not the answer.
OPERATOR_BEFORE = re.compile(r"(?:[\^*/+<>≤≥×÷{}_\\-]|\\(?:geq?|leq?|neq?|gt|lt|times|cdot))\s*$")
# A backslash that ends the text (`185\\`, a stray line break `\\\\`) closes the answer, not an operator.
OPERATOR_AFTER = re.compile(r"\s*(?:[\^*/+<>≤≥×÷=(){}_-]|\\(?!\\?\s*$))")
# Words before the last number that make it something other than the answer: a list's last item
# (`2, 4 and 8`), or a hedge (`17, since 16 fails`, `more than 10`, `not 6`).
NOT_THE_ANSWER_BEFORE = re.compile(r"(?:\d\s*(?:,|and|or|&)\s*(?:and\s+|or\s+)?"
                                   r"|\b(?:since|because|not|cannot|can't|isn't|except|unless|than|if|but|instead of"
                                   r"|maybe|perhaps|possibly"
                                   # the same in other languages: `12 et non 15`, `12, no 15`, `не 15`, `而不是 15`
                                   r"|non|pas|sauf|nicht|kein|keine|no|não|не|нет)\s+(?:\S+\s+){0,2}"
                                   r"|(?:不是|而非|ではなく|でなく)\s*)$",
                                   re.IGNORECASE)
NUMBER_WITH_WORDS = re.compile(r"^(?:\\?\$\s*)?(-?[\d.,]+(?:/\d+)?)\s*(%|\\%|percent|per\s+cent)?"
                               r"(?:\s+[A-Za-z][A-Za-z ]*)?\.?$", re.IGNORECASE)
# A whole number and a proper fraction after it, `3 1/2`: one mixed number (equivalence reads its value).
MIXED_BEFORE = re.compile(r"(?<![\d.,/])-?\d{1,9}[ \t]+$")
# Markdown bold marks before an answer (`**Answer:** 12` reads `** 12`); trailing ones: stray_end.
STRAY_START = re.compile(r"^(?:\*\*|\s)+")
BARE_LIMIT = 300  # characters: a longer text without prose is not "just the answer"
# Markdown bold around a short run of text; it opens after a space or punctuation, never inside `2**10`.
BOLD = re.compile(r"(?<![A-Za-z0-9_*])\*\*(?=[^\s*])([^*\n]{1,200}?)(?<=[^\s*])\*\*(?!\*)")
# Between two boxes of one answer in lenient mode: any run of spaces, delimiters, commas, `and`, `or`,
# `\quad`, `\text{and}` (strict mode's answer_text.CONNECTOR allows one word), then maybe `x =`.
LIST_CONNECTOR = re.compile(r"(?:[\s$,;&]|\\[,;:! ]|\\q?quad\b|\\text\{\s*(?:(?:and|or|,)\s*)?\}|\band\b|\bor\b)*"
                            r"(?:[A-Za-z](?:_\d)?\s*=\s*)?\\(?:boxed|fbox)\{")
# "Answer" in other languages (`Réponse :`, `La respuesta es`, `Die Antwort lautet`, `Ответ —`, `答案是`,
# `答：`, `答えは`), then an optional verb, dash or colon; its sentence ends at `.`, `。` or a newline.
FOREIGN_ANSWER = re.compile(r"(?:\b(?:réponse|respuesta|resposta|risposta|antwort|ответ)\b"
                            r"|答案|答え|答(?=\s*[:：])|الإجابة|الجواب|उत्तर)"
                            r"\s*(?:(?:est|es|é|è|ist|lautet|равен)\b|[—–]|是|为|為|は|:|：)?\s*[:：]?\s*",
                            re.IGNORECASE)
FOREIGN_SENTENCE_END = re.compile(r"\.(?=\s|$)|[。\n]")


def _number_only(found: Extraction) -> Extraction:
    """`12 apples` -> `12`, `45 percent` -> `45\\%`, `\\$5` -> `5`; anything else unchanged."""
    match = NUMBER_WITH_WORDS.match(found.text)
    if match is None or not any(c.isdigit() for c in match.group(1)):
        return found
    percent = "\\%" if match.group(2) else ""
    return Extraction(match.group(1) + percent, found.start, found.end)


def reads_as_math(content: str) -> bool:
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
        if reads_as_math(response[opener.end():end]):
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


def _unbold(response: str) -> str:
    """The response with bold markers blanked, same length (spans into it are spans into the response)."""
    return BOLD.sub(lambda match: f"  {match.group(1)}  ", response)


def _last_candidates(text: str) -> tuple[list, re.Match | None, bool]:
    """(math spans, last number outside them, whether the last span comes after that number)."""
    spans = math_spans(text)
    number = _last_number(text, spans)
    return spans, number, bool(spans) and (number is None or spans[-1][3] > number.start())


def _last_expression(response: str) -> Extraction | None:
    plain = _unbold(response)
    spans, number, span_is_last = _last_candidates(plain)
    if span_is_last:
        _, start, end, after = spans[-1]
        found = stripped(plain, start, end)
        return None if found is None else _with_percent(plain, found, after)
    if number is None or _ambiguous(plain, number):
        return None
    return _with_percent(plain, _mixed(plain, number), number.end())


def _mixed(text: str, number: re.Match) -> Extraction:
    """The number, or the mixed number it ends (`3 1/2` read whole: its last number alone is `1/2`)."""
    whole = MIXED_BEFORE.search(text, max(0, number.start() - 20), number.start()) if "/" in number.group() else None
    if whole is None:
        return Extraction(number.group(), number.start(), number.end())
    return Extraction(text[whole.start():number.end()], whole.start(), number.end())


def refuses(text: str) -> bool:
    """Whether the last expression of a text is a number refused as ambiguous (a hedge, a list's last
    item, an operand): no reading of that text should overrule the refusal."""
    plain = _unbold(text)
    _, number, span_is_last = _last_candidates(plain)
    return number is not None and not span_is_last and _ambiguous(plain, number)


def _within(found: Extraction | None, offset: int) -> Extraction | None:
    """An answer found in a part of the response that starts at `offset`, with the response's span."""
    return None if found is None else Extraction(found.text, found.start + offset, found.end + offset)


def _sentence(response: str, strict: Extraction) -> Extraction:
    """`Final Answer: The largest $n$ is 34.` -> `34`: an answer read after a marker that is a sentence
    (prose, not in a box) is read as a whole response is; kept as it is when that finds nothing."""
    in_box = response[:strict.start].endswith(BOX_MARKERS)
    if in_box or reads_as_math(strict.text) or response[strict.start:strict.end] != strict.text:
        return strict
    return _within(_last_expression(strict.text), strict.start) or strict


def _lenient_box_run(response: str, strict: Extraction) -> Extraction:
    """A run of boxes joined by several connector words, where strict mode read only the last box."""
    spans = box_spans(response, BOX_MARKERS)
    if not spans or not spans[-1][0] <= strict.start <= strict.end <= spans[-1][1]:
        return strict
    return box_run(response, spans, LIST_CONNECTOR) or strict


def _foreign_answer(response: str) -> Extraction | None:
    """The sentence after the last answer marker of another language, read as a whole response is."""
    markers = list(FOREIGN_ANSWER.finditer(response))
    if not markers:
        return None
    start = markers[-1].end()
    found = FOREIGN_SENTENCE_END.search(response, start)
    end = len(response) if found is None else found.start()
    return _within(_last_expression(response[start:end]), start)


def _bare(response: str) -> Extraction | None:
    """The whole response, when it is one short expression without prose or math delimiters."""
    if len(response.strip()) > BARE_LIMIT or OPENER.search(response) or "\n" in response.strip():
        return None
    return stripped(response, 0, len(response)) if reads_as_math(response) else None


def stray_end(text: str) -> int:
    """Where a text ends without what may trail an answer by accident: spaces, backslashes (a stray
    `\\`, a TeX line break `\\\\`) and markdown bold marks. A loop from the end, linear in what it removes
    (a regular expression anchored at the end would retry from every position: quadratic)."""
    end = len(text)
    while end > 0:
        if text[end - 1].isspace() or text[end - 1] == "\\":
            end -= 1
        elif text.startswith("**", end - 2, end):
            end -= 2
        else:
            break
    return end


def _trimmed(found: Extraction | None) -> Extraction | None:
    """`185\\` -> `185`, `** 12` -> `12`: the answer without the stray marks around it (its span shrinks too)."""
    if found is None:
        return None
    head = STRAY_START.match(found.text)
    start, end = head.end() if head else 0, stray_end(found.text)
    if (start, end) == (0, len(found.text)) or start >= end:
        return found
    return Extraction(found.text[start:end], found.start + start, found.end - (len(found.text) - end))


def find_lenient(response: str, strict: Extraction | None) -> Extraction | None:
    """The lenient answer, given the strict one (None when strict found nothing)."""
    if strict is not None:
        found = _number_only(_lenient_box_run(response, strict))
        return _trimmed(_sentence(response, found) if found is strict else found)
    return _trimmed(_foreign_answer(response) or _bare(response) or _last_expression(response))
