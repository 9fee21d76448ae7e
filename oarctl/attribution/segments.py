"""Split a sampled response into reasoning, conclude and answer, from its token ids.

Reads the response's sampled token ids and the tokenizer; writes half-open spans relative to the
response (section 2 of docs/method.md):

    reasoning [0, c)      everything before the final-answer marker
    conclude  [c, a)      the tokens of the `\\boxed{` marker
    answer    [a, b)      the tokens of the content of the last balanced \\boxed{...}
    (rest)    [b, n)      the closing `}`, any trailing text and the eos: neither, plain advantage

The answer is found on the text decoded from the sampled ids themselves, never by re-tokenising
the response text (which can drift from what was sampled): each token gets the character range it
adds to the decoded text, and the character span of the box content is mapped back to the tokens
that overlap it. A token straddling two parts goes to the later one (e.g. a BPE token `{1` is an
answer token, a token ` \\boxed` is a conclude token).

No extractable answer (no balanced box): the reasoning is the whole response except its trailing
special tokens (eos), and the conclude part is the probe text, tokenised on its own and appended
after the reasoning. `probe_ids` is then non-empty and the spans describe the *attributed*
sequence prompt + reasoning + probe, not the response. The answer span is empty, so every outcome
mode falls back to `last`. An empty box `\\boxed{}` keeps its real marker as conclude with an empty
answer, and falls back to `last` the same way.

Cost of the character offsets: one decode of a window of `WINDOW` tokens (two decodes) per token,
O(n * WINDOW); if the pieces do not join into the full decode (a decoder with long-range clean-up
rules), the exact fallback decodes every prefix, O(n^2) characters.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from oarctl.verify.boxed import BOXED, boxed_span

PROBE_TEXT = "\n\nThe final answer is \\boxed{"
WINDOW = 8  # tokens of left context per incremental decode; enough for any UTF-8 character


@dataclass(frozen=True)
class Segments:
    reasoning: tuple[int, int]
    conclude: tuple[int, int]
    answer: tuple[int, int]
    probe_ids: list[int] = field(default_factory=list)

    @property
    def uses_probe(self) -> bool:
        return bool(self.probe_ids)

    @property
    def has_answer(self) -> bool:
        return self.answer[1] > self.answer[0]


def _decode(tokenizer, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def _incremental_offsets(tokenizer, ids: list[int]) -> list[int]:
    """offsets[i] = characters of the decoded text before token i (len n + 1), by windowed diffs.

    A token that ends inside a multi-byte character adds nothing (its decode ends in U+FFFD); the
    character is credited to the token that completes it.
    """
    offsets, total, pending = [0], 0, 0
    for index in range(len(ids)):
        start = max(0, index - pending - WINDOW)
        before = _decode(tokenizer, ids[start:index - pending])
        after = _decode(tokenizer, ids[start:index + 1])
        if after.endswith("\ufffd"):
            pending += 1
            offsets.append(total)
            continue
        total += len(after) - len(before)
        pending = 0
        offsets.append(total)
    return offsets


def _prefix_offsets(tokenizer, ids: list[int]) -> list[int]:
    """Exact but quadratic: the length of every decoded prefix, kept non-decreasing."""
    offsets = [0]
    for index in range(1, len(ids) + 1):
        text = _decode(tokenizer, ids[:index])
        length = len(text) - 1 if text.endswith("\ufffd") and index < len(ids) else len(text)
        offsets.append(max(offsets[-1], length))
    return offsets


def token_offsets(tokenizer, ids: list[int]) -> tuple[str, list[int]]:
    """(decoded text, offsets): token i covers text[offsets[i]:offsets[i + 1]]."""
    text = _decode(tokenizer, ids)
    offsets = _incremental_offsets(tokenizer, ids)
    if offsets[-1] != len(text):
        offsets = _prefix_offsets(tokenizer, ids)
    return text, offsets


def _token_at(offsets: list[int], char: int) -> int:
    """The token whose character range holds `char`, moved back over the zero-width tokens just
    before it (the leading bytes of a multi-byte character belong with the token completing it)."""
    index = next((i for i in range(len(offsets) - 1) if offsets[i + 1] > char), len(offsets) - 1)
    while index > 0 and offsets[index - 1] == offsets[index]:
        index -= 1
    return index


def _reasoning_end(response_token_ids: list[int], tokenizer) -> int:
    """The response without its trailing special tokens (eos, pad)."""
    special = set(tokenizer.all_special_ids)
    end = len(response_token_ids)
    while end > 0 and response_token_ids[end - 1] in special:
        end -= 1
    return end


def segment(response_token_ids: list[int], tokenizer, probe_text: str = PROBE_TEXT) -> Segments:
    """Spans of reasoning, conclude and answer; with a probe when there is no answer (see module)."""
    ids = list(response_token_ids)
    text, offsets = token_offsets(tokenizer, ids)
    span = boxed_span(text)
    if span is None:
        end = _reasoning_end(ids, tokenizer)
        probe_ids = tokenizer(probe_text, add_special_tokens=False)["input_ids"]
        conclude_end = end + len(probe_ids)
        return Segments((0, end), (end, conclude_end), (conclude_end, conclude_end), list(probe_ids))
    content_start, content_end = span
    conclude_start = _token_at(offsets, content_start - len(BOXED))
    answer_start = _token_at(offsets, content_start)
    answer_end = _token_at(offsets, content_end - 1) + 1 if content_end > content_start else answer_start
    return Segments((0, conclude_start), (conclude_start, answer_start), (answer_start, answer_end))


def sequence_spans(prompt_len: int, segments: Segments) -> dict[str, tuple[int, int]]:
    """The spans as absolute indices into prompt + response (prompt + reasoning + probe)."""
    return {name: (start + prompt_len, end + prompt_len)
            for name, (start, end) in (("reasoning", segments.reasoning), ("conclude", segments.conclude),
                                       ("answer", segments.answer))}


def attributed_sequence(prompt_ids: list[int], response_token_ids: list[int], segments: Segments) -> list[int]:
    """The ids the outcome is computed on: prompt + response up to the answer end, or + probe."""
    if segments.uses_probe:
        return list(prompt_ids) + list(response_token_ids[:segments.reasoning[1]]) + list(segments.probe_ids)
    return list(prompt_ids) + list(response_token_ids[:segments.answer[1]])
