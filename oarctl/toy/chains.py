"""The `chains` toy family: named-variable chains whose credit structure is known by construction.

A problem defines a chain of variables, each the previous one plus or minus a digit, and two or
three *distractors* (x, y, z) computed from the same start value but feeding nothing; it asks for
the chain's last variable (the `chains_wide` family: five or six distractors, x..u, chains of 4-6,
so that about half the steps are ones the answer ignores):

    problem   a=34, b=a+7, x=a+3, c=b-5, d=c+8, y=a-6, e=d-2. Find e.
    solution  find e. so y=34-6=28. x=3+34=37. b=7+34=41. then c=41-5=36. next d=36+8=44. e=44-2=42. \\boxed{42}

The chain has `length` steps (a given start value, then `length` computed variables b, c, ...), so
the answer depends on every chain step and on nothing else. A solution makes free choices that can
never change the answer, each drawn uniformly when a solution is generated (so a policy warm-started
on them samples them with real entropy):
- a filler word before each step: nothing, `so `, `then `, `now `, `next ` or `and `;
- the operand order of an addition (`34+7` or `7+34`);
- the order of the distractor steps, which commute (a solution computes them all, first);
- an optional restatement of the question (`find e.`) at the start.
The free choices are placed where no later step copies from them, so that they are inert for a policy
too, not only by the task's semantics: the restatement holds no number, the distractors come first
(the chain's first step copies the start value from the problem, as they do), and the chain is
written in order, each step copying the result just before it, with the box right after the query's
step. (An earlier version put the distractors between the query's step and the box: responses that
computed one were right half as often, the policy copying the wrong value into the box, so those
"free" tokens mattered after all.) The distractor steps are real arithmetic, as hard as the chain's,
that the answer does not depend on: an outcome reward credits their right and wrong digits alike
(blamed in a wrong response, rewarded in a right one), which is the credit-assignment error this
world is built to expose. Which tokens the answer depends on is computed from a response's own
steps in `oarctl/toy/truth.py`.

Values stay two-digit (10..99): an operation that would leave the range is flipped (+ <-> -), so every
step is "2-digit +/- 1-digit", the easy level of the arithmetic family; difficulty comes from the
length of the chain (one slip anywhere breaks it) and from finding each variable's definition.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Iterable, Iterator

from oarctl.errors import OarError

CHAIN_NAMES = "abcdefghijklm"  # a is the given start value; b.. the computed chain
DISTRACTOR_NAMES = "xyzwvu"  # the first three are the default world's; the wide world uses all six
DEFAULT_DISTRACTORS = (2, 3)  # fewest, most distractor steps a problem has
WIDE_DISTRACTORS = (5, 6)  # `chains_wide`: about as many steps the answer ignores as steps it needs
MAX_LENGTH = len(CHAIN_NAMES) - 1
DEFAULT_LENGTHS: tuple[int, ...] = (4, 5, 6, 7, 8)
WIDE_LENGTHS: tuple[int, ...] = (4, 5, 6)  # shorter chains keep the wide world's solutions within 224 tokens
FILLERS = ("", "so ", "then ", "now ", "next ", "and ")
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


def draw_problem(length: int, rng: random.Random, distractors: tuple[int, int] = DEFAULT_DISTRACTORS) -> ChainProblem:
    """A chain of `length` computed steps and `distractors` (fewest, most) steps off the start value a."""
    values = {"a": rng.randint(LOW, HIGH)}
    definitions = [Definition("a", None, None, values["a"])]
    for index in range(1, length + 1):
        name, parent = CHAIN_NAMES[index], CHAIN_NAMES[index - 1]
        op, digit = _step_op(rng, values[parent])
        values[name] = apply(values[parent], op, digit)
        definitions.append(Definition(name, parent, op, digit))
    for name in DISTRACTOR_NAMES[:rng.randint(*distractors)]:
        op, digit = _step_op(rng, values["a"])
        definitions.insert(rng.randint(1, len(definitions)), Definition(name, "a", op, digit))
    return ChainProblem(tuple(definitions), CHAIN_NAMES[length])


def _step_text(problem: ChainProblem, values: dict, name: str, rng: random.Random) -> str:
    d = problem.by_name[name]
    left, right = values[d.parent], d.operand
    if d.op == "+" and rng.random() < 0.5:
        left, right = right, left
    return f"{d.name}={left}{d.op}{right}={values[d.name]}."


def write_solution(problem: ChainProblem, rng: random.Random) -> str:
    """One correct solution, its free choices drawn uniformly (see the module docstring): the optional
    restatement, the distractors in any order, the chain in order, the box."""
    values = problem.values()
    chain = problem.ancestors(problem.query)[::-1]
    distractors = [d.name for d in problem.definitions if d.parent is not None and d.name not in chain]
    rng.shuffle(distractors)
    parts = [f"find {problem.query}."] if rng.random() < 0.5 else []
    parts += [_step_text(problem, values, name, rng) for name in distractors]
    parts += [_step_text(problem, values, name, rng) for name in chain]
    return " ".join(rng.choice(FILLERS) + part for part in parts) + f" \\boxed{{{values[problem.query]}}}"


def check_lengths(lengths: Iterable[int]) -> tuple[int, ...]:
    lengths = tuple(lengths)
    if not lengths or any(not isinstance(n, int) or not 1 <= n <= MAX_LENGTH for n in lengths):
        raise OarError(f"chain lengths must be a non-empty list of integers in 1..{MAX_LENGTH}, got {list(lengths)}")
    return lengths


def _rng(seed: int) -> random.Random:
    return random.Random(f"oarctl-chains-{seed}")  # str seed: stable across Python versions


def draw(length: int, rng: random.Random, distractors: tuple[int, int] = DEFAULT_DISTRACTORS) -> dict:
    """One problem as the toy task's dicts: problem, answer, solution, level (= chain length)."""
    problem = draw_problem(length, rng, distractors)
    return {"problem": problem.text, "answer": str(problem.values()[problem.query]),
            "solution": write_solution(problem, rng), "level": length}


def iter_problems(seed: int, lengths: tuple[int, ...] = DEFAULT_LENGTHS,
                  distractors: tuple[int, int] = DEFAULT_DISTRACTORS) -> Iterator[dict]:
    """Endless seeded stream of chain problems (repeats possible), lengths mixed uniformly."""
    lengths, rng = check_lengths(lengths), _rng(seed)
    while True:
        yield draw(rng.choice(lengths), rng, distractors)


def iter_wide_problems(seed: int, lengths: tuple[int, ...] = WIDE_LENGTHS) -> Iterator[dict]:
    """The `chains_wide` world: five or six distractor steps, chains of 4-6 (docs/testbed.md)."""
    return iter_problems(seed, lengths, WIDE_DISTRACTORS)
