"""Ground-truth credit labels of a chains response: which tokens the final answer depends on.

Reads a chains problem (`oarctl/toy/chains.py`) and a sampled response (its token ids, decoded
with the tokenizer that sampled them); writes one int8 label per response token, by construction
from the problem's definitions and the response's own steps. No model is involved.

    1   the answer depends on it: in every step on the answer's path (below), the characters of the
        variable's name, the two operands, the operator and the result; and the boxed answer itself
    0   it does not: filler words, spaces, the fixed punctuation (`=`, `.`, `\\boxed{`, `}`), whole
        distractor steps, restatements (of the question, `find e.`, or of a value, `e=42.`), steps of
        unknown or given variables, steps that are superseded (below), special tokens (eos)
   -1   unknown: text the grammar cannot read (a garbled or truncated step), up to the next space

The response is read as a program: segments separated by spaces, each a filler word, a step
`NAME=A+B=V.` / `NAME=A-B=V.`, a restatement `find NAME.` or `NAME=V.`, or the box `\\boxed{...}`. The answer's path
is found from the query backwards, through the *problem's* definitions and the *response's* steps:
the query's step is the last step named after the query before the (last) box, or before the end of
the response when it has no box; the step of its parent is the last step named after the parent
before that step, and so on down to the given start value, which has no step. The path is the
problem's chain of ancestors: a step is on it because of the variable it names, whatever it copied.

What "depends on" means where a response is malformed:
- a wrong value (bad arithmetic, a wrongly copied operand, a wrong operator) does not change the
  path: the step still defines its variable, and everything after it on the path copies from it;
  labels say where the answer comes from, not whether it is right;
- a missing step (a variable never computed, or its step unreadable) has no tokens to label; the
  search goes on below it: the grandparent's step is the last one before the nearest step found;
- a variable computed twice: only the last step before its use is on the path, the other is 0;
- no step for the query (skipped, garbled, or cut off) is a missing step like any other: the steps
  of its ancestors are still on the path (the box then copies a value that depends on them or on
  nothing, which labels cannot tell);
- a response that is truncated or has no box: the path is taken at the end of the response.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from oarctl.attribution.segments import token_offsets
from oarctl.toy.chains import ChainProblem, parse_problem

DEPENDS, FREE, UNKNOWN = 1, 0, -1
QUERY_STEP = 2  # a class of DEPENDS (token_classes): the query's own step, which the box copies

SEGMENT = re.compile(r"""
    (?P<space>\s+)
  | (?P<filler>(?:so|then|now|next|and)(?=\s))
  | (?P<question>find\ [a-z]\.)
  | (?P<step>(?P<name>[a-z])=(?P<left>\d+)(?P<op>[+\-])(?P<right>\d+)=(?P<value>-?\d+)\.)
  | (?P<restatement>[a-z]=-?\d+\.)
  | (?P<box>\\boxed\{(?P<answer>[^{}]*)\})
""", re.VERBOSE)
STEP_PARTS = ("name", "left", "op", "right", "value")  # the groups of a step the answer can depend on


@dataclass(frozen=True)
class Segment:
    kind: str  # space, filler, question, step, restatement, box, unknown
    start: int  # character span in the text, half-open
    end: int
    match: re.Match | None = None

    @property
    def name(self) -> str | None:
        return self.match.group("name") if self.kind == "step" else None


def parse_response(text: str) -> list[Segment]:
    """The response's segments in order; an unreadable stretch (to the next space) is `unknown`."""
    segments, position = [], 0
    while position < len(text):
        match = SEGMENT.match(text, position)
        if match is None:
            end = next((i for i in range(position + 1, len(text)) if text[i].isspace()), len(text))
            segments.append(Segment("unknown", position, end))
            position = end
            continue
        segments.append(Segment(match.lastgroup if match.lastgroup != "answer" else "box", match.start(),
                                match.end(), match))
        position = match.end()
    return segments


def _last_step(segments: list[Segment], name: str, before: int) -> int | None:
    return next((i for i in range(before - 1, -1, -1) if segments[i].name == name), None)


def answer_path(problem: ChainProblem, segments: list[Segment]) -> list[int]:
    """Indices of the steps on the answer's path, from the query's step down (see the module)."""
    boxes = [i for i, s in enumerate(segments) if s.kind == "box"]
    before = boxes[-1] if boxes else len(segments)
    path = []
    for name in problem.ancestors(problem.query):  # the query, its parent, ... down to the start
        index = _last_step(segments, name, before)
        if index is not None:  # a missing step: no tokens for it; its ancestors are still looked up
            path.append(index)
            before = index
    return path


def character_labels(problem: ChainProblem, text: str) -> list[int]:
    """One label per character of `text` (the rules of the module docstring)."""
    segments = parse_response(text)
    labels = [FREE] * len(text)
    for segment in segments:
        if segment.kind == "unknown":
            labels[segment.start:segment.end] = [UNKNOWN] * (segment.end - segment.start)
    boxes = [s for s in segments if s.kind == "box"]
    if boxes:
        start, end = boxes[-1].match.span("answer")
        labels[start:end] = [DEPENDS] * (end - start)
    for index in answer_path(problem, segments):
        match = segments[index].match
        for part in STEP_PARTS:
            start, end = match.span(part)
            labels[start:end] = [DEPENDS] * (end - start)
    return labels


def _readable_text(tokenizer, ids: list[int]) -> tuple[str, list[int], set[int]]:
    """The decoded text with special tokens blanked to spaces, its token offsets, the special positions."""
    text, offsets = token_offsets(tokenizer, ids)
    special_ids = set(tokenizer.all_special_ids)
    special = {i for i, token in enumerate(ids) if token in special_ids}
    characters = list(text)
    for i in special:
        characters[offsets[i]:offsets[i + 1]] = [" "] * (offsets[i + 1] - offsets[i])
    return "".join(characters), offsets, special


def character_classes(problem: ChainProblem, text: str) -> list[int]:
    """`character_labels`, with the label-1 characters of the query's own step (and the box) as
    QUERY_STEP: what an outcome read off the answer by teacher forcing can see directly. The other
    label-1 characters are the earlier chain, which reaches the answer only through later tokens."""
    labels = character_labels(problem, text)
    segments = parse_response(text)
    path = answer_path(problem, segments)
    spans = [segments[path[0]]] if path and segments[path[0]].name == problem.query else []
    spans += [s for s in segments if s.kind == "box"][-1:]
    for segment in spans:
        labels[segment.start:segment.end] = [QUERY_STEP if v == DEPENDS else v
                                             for v in labels[segment.start:segment.end]]
    return labels


def _per_token(characters: list[int], offsets: list[int], special: set[int], count: int) -> list[int]:
    """A token takes its characters' highest class (QUERY_STEP > DEPENDS), else -1 if any is -1, else 0."""
    values = []
    for i in range(count):
        covered = set(characters[offsets[i]:offsets[i + 1]]) if i not in special else set()
        positive = max((v for v in covered if v > 0), default=None)
        values.append(positive if positive is not None else UNKNOWN if UNKNOWN in covered else FREE)
    return values


def token_labels(problem: ChainProblem, response_token_ids: list[int], tokenizer) -> list[int]:
    """One label per response token: 1 if any of its characters is 1, else -1 if any is -1, else 0."""
    text, offsets, special = _readable_text(tokenizer, list(response_token_ids))
    return _per_token(character_labels(problem, text), offsets, special, len(response_token_ids))


def token_classes(problem: str, response_token_ids: list[int], tokenizer) -> list[int] | None:
    """One class per response token: QUERY_STEP (2), earlier chain (1), free (0), unknown (-1); None
    when `problem` is not a chains problem. Labels are the classes with 2 read as 1."""
    parsed = parse_problem(problem)
    if parsed is None:
        return None
    text, offsets, special = _readable_text(tokenizer, list(response_token_ids))
    return _per_token(character_classes(parsed, text), offsets, special, len(response_token_ids))


def token_truth(problem: str, response_token_ids: list[int], tokenizer) -> list[int] | None:
    """The labels of one response, or None when `problem` is not a chains problem."""
    parsed = parse_problem(problem)
    return None if parsed is None else token_labels(parsed, response_token_ids, tokenizer)


def truth_column(problems: list[str], responses: list[list[int]], tokenizer) -> list[list[int]] | None:
    """The rollouts' `token_truth` column, or None unless every problem is a chains problem (a
    mixed or other prompt set gets no column, so the artifacts of other worlds stay as they were)."""
    parsed = {problem: parse_problem(problem) for problem in set(problems)}
    if not parsed or any(p is None for p in parsed.values()):
        return None
    return [token_labels(parsed[problem], ids, tokenizer) for problem, ids in zip(problems, responses)]
