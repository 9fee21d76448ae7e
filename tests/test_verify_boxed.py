"""verify.boxed: the last balanced \\boxed{} (nested braces, unbalanced boxes), and the 0/1 reward."""
from __future__ import annotations

import pytest

from oarctl.verify.boxed import boxed_span, extract_boxed, score


@pytest.mark.parametrize("text, expected", [
    ("47+6=53. \\boxed{53}", "53"),
    ("\\boxed{1} no wait \\boxed{2}", "2"),                       # the last box wins
    ("so \\boxed{\\frac{1}{2}} done", "\\frac{1}{2}"),           # nested braces
    ("\\boxed{{a}{b{c}}}", "{a}{b{c}}"),                          # deeper nesting
    ("\\boxed{7} then \\boxed{8", "7"),                           # unbalanced last box: an earlier one
    ("\\boxed{7} then \\boxed{8}}", "8"),                         # a stray closing brace after it
    ("\\boxed{9", None),                                           # unbalanced only box
    ("no box at all: 42", None),
    ("", None),
    ("\\boxed{}", ""),                                             # empty but present
    ("boxed{3}", None),                                            # no backslash: not a box
    ("\\boxed{ 12 }", " 12 "),                                     # raw content; scoring strips
    ("\\boxed{a\\boxed{b}}", "b"),                                 # a box inside a box: the last one
])
def test_extract_boxed(text, expected):
    assert extract_boxed(text) == expected


def test_span_points_at_the_content():
    text = "x \\boxed{4{2}} y"
    start, end = boxed_span(text)
    assert text[start:end] == "4{2}"
    assert text[end] == "}" and text[start - len("\\boxed{"):start] == "\\boxed{"


@pytest.mark.parametrize("response, gold, expected", [
    ("47+6=53. \\boxed{53}", "53", ("53", 1.0)),
    ("\\boxed{ 53 }", "53", (" 53 ", 1.0)),        # surrounding whitespace does not matter
    ("\\boxed{53}", " 53\n", ("53", 1.0)),
    ("\\boxed{5 3}", "53", ("5 3", 0.0)),          # inner whitespace does
    ("\\boxed{54}", "53", ("54", 0.0)),
    ("\\boxed{53} oops \\boxed{54}", "53", ("54", 0.0)),
    ("the answer is 53", "53", (None, 0.0)),
    ("\\boxed{53", "53", (None, 0.0)),
    ("\\boxed{}", "53", ("", 0.0)),
    ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}", ("\\frac{1}{2}", 1.0)),
])
def test_score(response, gold, expected):
    extracted, reward = score(response, gold)
    assert (extracted, reward) == expected
    assert type(reward) is float


def test_many_unbalanced_boxes():
    text = "\\boxed{" * 300 + "1"
    assert extract_boxed(text) is None
    assert extract_boxed(text + "}") == "1"
    assert extract_boxed("\\boxed{2}" + text) == "2"


class CountingText(str):
    """A str that counts character lookups by index (what boxed_span's brace scan does)."""
    lookups = 0

    def __getitem__(self, index):
        CountingText.lookups += 1
        return str.__getitem__(self, index)


def test_scan_is_linear_in_the_text_length():
    text = CountingText("\\boxed{" * 300 + "1")
    CountingText.lookups = 0
    assert boxed_span(text) is None
    assert CountingText.lookups <= 10 * len(text), CountingText.lookups
