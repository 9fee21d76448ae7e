"""The `chains` toy family: named-variable chains whose credit structure is known by construction.

A problem defines a chain of variables, each the previous one plus or minus a digit, and one or two
*distractors* (x, y) that hang off the chain but feed nothing; it asks for the chain's last variable:

    problem   a=34, b=a+7, c=b-5, x=b+3, d=c+8, e=d-2. Find e.
    solution  b=34+7=41. so c=41-5=36. d=36+8=44. now e=44-2=42. then x=3+41=44. e=42. \\boxed{42}

The chain has `length` steps (a given start value, then `length` computed variables b, c, ...), so
the answer depends on every chain step and on nothing else. A solution computes the chain first, in
order, so each step copies the result just before it; distractors come after the query's step.
A solution makes free choices that can never change the answer, each drawn uniformly when a
solution is generated (so a policy warm-started on them samples them with real entropy):
- a filler word before each step: nothing, `so `, `then ` or `now `;
- the operand order of an addition (`41+3` or `3+41`);
- whether each distractor is computed (after the chain), and in which order;
- an optional restatement of the answer (`e=42.`) before the box.
Which tokens the answer depends on is computed from a response's own steps in `oarctl/toy/truth.py`.

Values stay two-digit (10..99): an operation that would leave the range is flipped (+ <-> -), so every
step is "2-digit +/- 1-digit", the easy level of the arithmetic family; difficulty comes from the
length of the chain (one slip anywhere breaks it) and from copying the right earlier value.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Iterable, Iterator

from oarctl.errors import OarError

CHAIN_NAMES = "abcdefghijklm"  # a is the given start value; b.. the computed chain
DISTRACTOR_NAMES = "xyz"
MAX_LENGTH = len(CHAIN_NAMES) - 1
DEFAULT_LENGTHS: tuple[int, ...] = (4, 5, 6, 7, 8)
FILLERS = ("", "so ", "then ", "now ")
LOW, HIGH = 10, 99  # every value stays two-digit

DEFINITION = re.compile(r"([a-z])=(?:(\d+)|([a-z])([+\-])(\d+))")
PROBLEM = re.compile(r"((?:[a-z]=(?:\d+|[a-z][+\-]\d+), )*[a-z]=(?:\d+|[a-z][+\-]\d+))\. Find ([a-z])\.")


@dataclass(frozen=True)
class Definition:
    """`name=parent op operand` (a computed variable), or `name=value` (the given start)."""
    name: str
    parent: str | None  # None for the given start value
    op: str | None
    operand: int  # the literal digit; the value itself for the given start

    @property
    def text(self) -> str:
        if self.parent is None:
            return f"{self.name}={self.operand}"
        return f"{self.name}={self.parent}{self.op}{self.operand}"


@dataclass(frozen=True)
class ChainProblem:
    definitions: tuple[Definition, ...]  # in the problem's order (every parent before its children)
    query: str

    @property
    def by_name(self) -> dict[str, Definition]:
        return {d.name: d for d in self.definitions}

    def values(self) -> dict[str, int]:
        """Every variable's true value."""
        values: dict[str, int] = {}
        for d in self.definitions:
            values[d.name] = d.operand if d.parent is None else apply(values[d.parent], d.op, d.operand)
        return values

    def ancestors(self, name: str) -> list[str]:
        """The computed variables `name` depends on, itself included (the query's: the whole chain)."""
        by_name, out = self.by_name, []
        while name in by_name and by_name[name].parent is not None:
            out.append(name)
            name = by_name[name].parent
        return out

    @property
    def text(self) -> str:
        return ", ".join(d.text for d in self.definitions) + f". Find {self.query}."


def apply(left: int, op: str, right: int) -> int:
    return left + right if op == "+" else left - right


def parse_problem(problem: str) -> ChainProblem | None:
    """The structure of a chains problem text, or None when the text is not one (e.g. arithmetic)."""
    match = PROBLEM.fullmatch(problem.strip())
    if match is None:
        return None
    definitions = []
    for name, value, parent, op, operand in DEFINITION.findall(match.group(1)):
        definitions.append(Definition(name, None, None, int(value)) if value else
                           Definition(name, parent, op, int(operand)))
    names = [d.name for d in definitions]
    known: set[str] = set()
    for d in definitions:  # well formed: unique names, parents defined first, the query defined
        if d.parent is not None and d.parent not in known or d.name in known:
            return None
        known.add(d.name)
    return ChainProblem(tuple(definitions), match.group(2)) if match.group(2) in names else None


def _step_op(rng: random.Random, value: int) -> tuple[str, int]:
    """A random +/- digit, flipped when it would leave 10..99."""
    op, digit = rng.choice("+-"), rng.randint(2, 9)
    if not LOW <= apply(value, op, digit) <= HIGH:
        op = "-" if op == "+" else "+"
    return op, digit


def draw_problem(length: int, rng: random.Random) -> ChainProblem:
    """A chain of `length` computed steps with one or two distractors placed after their parents."""
    values = {"a": rng.randint(LOW, HIGH)}
    definitions = [Definition("a", None, None, values["a"])]
    for index in range(1, length + 1):
        name, parent = CHAIN_NAMES[index], CHAIN_NAMES[index - 1]
        op, digit = _step_op(rng, values[parent])
        values[name] = apply(values[parent], op, digit)
        definitions.append(Definition(name, parent, op, digit))
    for name in DISTRACTOR_NAMES[:rng.randint(1, 2)]:
        parent = CHAIN_NAMES[rng.randint(0, length - 1)]  # hangs off a chain variable before the query
        op, digit = _step_op(rng, values[parent])
        after = [d.name for d in definitions].index(parent) + 1
        position = rng.randint(after, len(definitions))  # anywhere after its parent
        definitions.insert(position, Definition(name, parent, op, digit))
    return ChainProblem(tuple(definitions), CHAIN_NAMES[length])


def write_solution(problem: ChainProblem, rng: random.Random) -> str:
    """One correct solution, its free choices drawn uniformly (see the module docstring): the chain
    in order, then the distractors it computes, in either order, then the optional restatement."""
    values, parts = problem.values(), []
    chain = problem.ancestors(problem.query)[::-1]
    distractors = [d.name for d in problem.definitions if d.parent is not None and d.name not in chain]
    rng.shuffle(distractors)
    for name in chain + [n for n in distractors if rng.random() < 0.5]:
        d = problem.by_name[name]
        left, right = values[d.parent], d.operand
        if d.op == "+" and rng.random() < 0.5:
            left, right = right, left
        parts.append(f"{rng.choice(FILLERS)}{d.name}={left}{d.op}{right}={values[d.name]}.")
    answer = values[problem.query]
    if rng.random() < 0.5:
        parts.append(f"{rng.choice(FILLERS)}{problem.query}={answer}.")
    return " ".join(parts) + f" \\boxed{{{answer}}}"


def check_lengths(lengths: Iterable[int]) -> tuple[int, ...]:
    lengths = tuple(lengths)
    if not lengths or any(not isinstance(n, int) or not 1 <= n <= MAX_LENGTH for n in lengths):
        raise OarError(f"chain lengths must be a non-empty list of integers in 1..{MAX_LENGTH}, got {list(lengths)}")
    return lengths


def _rng(seed: int) -> random.Random:
    return random.Random(f"oarctl-chains-{seed}")  # str seed: stable across Python versions


def draw(length: int, rng: random.Random) -> dict:
    """One problem as the toy task's dicts: problem, answer, solution, level (= chain length)."""
    problem = draw_problem(length, rng)
    return {"problem": problem.text, "answer": str(problem.values()[problem.query]),
            "solution": write_solution(problem, rng), "level": length}


def iter_problems(seed: int, lengths: tuple[int, ...] = DEFAULT_LENGTHS) -> Iterator[dict]:
    """Endless seeded stream of chain problems (repeats possible), lengths mixed uniformly."""
    lengths, rng = check_lengths(lengths), _rng(seed)
    while True:
        yield draw(rng.choice(lengths), rng)
