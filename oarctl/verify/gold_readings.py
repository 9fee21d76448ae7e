"""Lenient mode's readings that need the gold: a choice letter when the gold is one, and an
unordered answer set spread over several boxes when the gold is a list. Strict mode and other golds
read answers as extract.py and lenient.py do. Pure string work.

**Choice letters**, when the gold is one (`C`, `(C)`, `\\text{(C)}`), as GPQA- and MMLU-style
graders read them. Where the answer is: the lenient answer when there is one (`Answer: B, which is
cold` gives `B, which is cold`), then the last sentence or line of the response. In it, the letter is
- the letter it starts with, alone or in brackets, before a comma, period, colon, bracket or
  space (`C, since the other two fail`, `(A) the dimer`, `B) 4.5 eV`); or
- the letter after the last `answer`, `choice` or `option` word, or an answer marker of another
  language (`the correct choice is (B)`, `答案：C`, `Réponse : B`).
Guards: a place that names two different letters (`either B or C`, `not A but B`) gives no letter;
a capital `A` or `I` before a lowercase word is an article or a pronoun, not a letter.

**Several boxes**, when the gold is a list or set of two or more elements (`-3, 2`, `\\{1, 5\\}`):
`The first root is $\\boxed{2}$ and the second root is $\\boxed{-3}$.` is the list `2, -3`. The last
box and the boxes before it, back to the first gap that is not a short phrase naming the next
element: a gap of more than GAP_LIMIT characters, across a sentence end, or with a word of doubt,
correction or conclusion (`I first thought $\\boxed{2}$, but that fails; the answer is
$\\boxed{3}$` stays `3`).
"""
from __future__ import annotations

import re

from oarctl.verify.answer_text import BOX_MARKERS, Extraction
from oarctl.verify.boxed import box_spans
from oarctl.verify.cheap import top_level_split
from oarctl.verify.lenient import FOREIGN_ANSWER

GOLD_LETTER = re.compile(r"^[A-J]$")
LEADING = re.compile(r"^\s*(?:\*\*)?\(?([A-J])\)?(?:\*\*)?(?=[\s,.:;)]|$)")
# A word that names the answer, then (matched apart, from where it ends) the letter. One regular
# expression for both would give a run of spaces several ways to split: polynomial on hostile text.
NAMING = re.compile(r"\b(?:answer|choice|option)\b(?:[ \t]+(?:is|would[ \t]+be)\b)?", re.IGNORECASE)
NAMED_LETTER = re.compile(r"[\s:：]*(?:\*\*)?\(?([A-J])\)?(?![\w'])")
LETTER = re.compile(r"(?<![\w'])\(?([A-J])\)?(?![\w'])")
ARTICLE_OR_PRONOUN = re.compile(r"[AI] [a-z]")
SENTENCE_END = re.compile(r"(?<=[.!?。])\s+|\n+")


def is_letter(gold_form: str) -> bool:
    return bool(GOLD_LETTER.match(gold_form))


def _places(response: str, found: Extraction | None) -> list[tuple[str, int]]:
    """(a text where the answer may be, its offset in the response): the lenient answer, then the
    last sentence or line."""
    places = []
    if found is not None and response[found.start:found.end] == found.text:
        places.append((found.text, found.start))
    stripped = response.rstrip()
    starts = [match.end() for match in SENTENCE_END.finditer(stripped)]
    start = starts[-1] if starts else 0
    return places + [(stripped[start:], start)]


def _letters(text: str) -> set[str]:
    """The letters a text names; `A` and `I` before a lowercase word are an article and a pronoun."""
    return {match.group(1) for match in LETTER.finditer(text)
            if not ARTICLE_OR_PRONOUN.match(text, match.start(), match.end() + 2)}


def _named(text: str) -> re.Match | None:
    """The letter after the last word or marker that names the answer (`choice is (B)`, `答案：C`)."""
    ends = [match.end() for pattern in (NAMING, FOREIGN_ANSWER) for match in pattern.finditer(text)]
    return NAMED_LETTER.match(text, max(ends)) if ends else None


def _choice_in(text: str, offset: int) -> Extraction | None:
    match = LEADING.match(text)
    if match is None or ARTICLE_OR_PRONOUN.match(text, match.start(1), match.end(1) + 2):
        match = _named(text)
    if match is None or _letters(text) != {match.group(1)}:
        return None
    return Extraction(match.group(1), offset + match.start(1), offset + match.end(1))


def find_choice(response: str, found: Extraction | None) -> Extraction | None:
    """The choice letter of a response, with its span; None where it names none, or several."""
    for text, offset in _places(response, found):
        choice = _choice_in(text, offset)
        if choice is not None:
            return choice
    return None


# ---- several boxes ------------------------------------------------------------------------------

GAP_LIMIT = 80
BOX_GAP_END = re.compile(r"[.!?。](?:\s|$)")
NOT_A_LIST = re.compile(r"\b(?:but|however|wait|actually|instead|not|no|fails?|wrong|mistake|incorrect|correct\w*"
                        r"|check\w*|recheck\w*|verif\w*|so|thus|therefore|hence|answer|final|maybe|perhaps|then"
                        r"|first|initially|thought|guess\w*|or)\b", re.IGNORECASE)


def is_collection(gold_form: str) -> bool:
    """Whether the gold is a list or set of two or more elements (an interval or tuple is not)."""
    inside = gold_form[2:-2] if gold_form.startswith("\\{") and gold_form.endswith("\\}") else gold_form
    parts = top_level_split(inside, ",")
    return parts is not None and len(parts) >= 2


def _joins(gap: str) -> bool:
    return len(gap) <= GAP_LIMIT and not BOX_GAP_END.search(gap) and not NOT_A_LIST.search(gap)


def find_box_set(response: str, found: Extraction | None) -> Extraction | None:
    """The boxes that end the response read as one list, when the answer read so far is the last box
    alone; None otherwise."""
    spans = box_spans(response, BOX_MARKERS)
    if len(spans) < 2 or found is None or not spans[-1][0] <= found.start <= found.end <= spans[-1][1]:
        return None
    run = [spans[-1]]
    for span in reversed(spans[:-1]):
        if not _joins(response[span[1] + 1:run[-1][0]]):
            break
        run.append(span)
    parts = [response[start:end].strip() for start, end in reversed(run)]
    if len(parts) < 2 or not all(parts):
        return None
    return Extraction(", ".join(parts), run[-1][0], run[0][1])
