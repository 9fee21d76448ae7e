"""The tokens of a response that hold a character span of its decoded text.

The verify stage finds the answer on `response_text`, the sampled ids decoded without special
tokens; this maps that character span back to the sampled tokens. Decoded-prefix lengths grow with
the prefix, so a binary search needs O(log n) decodes per bound, not one decode per token: a
3,000-token response costs ~24 decodes. A token that ends inside a multi-byte character decodes to
U+FFFD; that partial character is not counted while searching, and the tokens holding the leading
bytes of the answer's first character are then added to the span, so it covers every byte.
"""
from __future__ import annotations


def _prefix_length(tokenizer, ids: list[int], count: int) -> int:
    text = tokenizer.decode(ids[:count], skip_special_tokens=True)  # as the sample stage decodes
    return len(text) - 1 if count < len(ids) and text.endswith("\ufffd") else len(text)


def _first_token_reaching(tokenizer, ids: list[int], char: int) -> int:
    """The smallest k such that the first k tokens decode to more than `char` characters, minus one:
    the index of the token that holds character `char`."""
    low, high = 0, len(ids)
    while low < high:
        middle = (low + high) // 2
        if _prefix_length(tokenizer, ids, middle + 1) > char:
            high = middle
        else:
            low = middle + 1
    return low


def _ends_inside_a_character(tokenizer, ids: list[int], count: int) -> bool:
    return tokenizer.decode(ids[:count], skip_special_tokens=True).endswith("\ufffd")


def token_span(tokenizer, ids: list[int], start: int, end: int) -> tuple[int, int]:
    """Half-open token span [a, b) of the tokens overlapping characters [start, end); (-1, -1) for none."""
    if start < 0 or end <= start:
        return -1, -1
    first = _first_token_reaching(tokenizer, ids, start)
    while first > 0 and _ends_inside_a_character(tokenizer, ids, first):
        first -= 1  # the leading bytes of the answer's first character belong to the answer
    last = _first_token_reaching(tokenizer, ids, end - 1)
    return (first, last + 1) if last < len(ids) else (-1, -1)


def decodes_to(tokenizer, ids: list[int], text: str) -> bool:
    """Whether `ids` decode to `text` as the sample stage wrote it (the right tokenizer)."""
    return tokenizer.decode(ids, skip_special_tokens=True) == text
