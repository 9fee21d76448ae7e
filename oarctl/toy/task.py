"""Seeded arithmetic reasoning problems for the embedded toy world.

Each problem is one short expression; its solution writes every intermediate result as its own
`expr=value.` step and ends with `\\boxed{answer}`. Multi-step levels exist on purpose: an error in
one intermediate step (and only there) is exactly the structure token-level credit assignment
targets. All levels have problem spaces of hundreds to thousands of items, so a hash-defined
held-out share (`is_reserved`) can be kept out of training and still cover every level.

Levels (uniformly mixed by default):
  1  2-digit +/- 1-digit            `Compute 47+6.`     -> `47+6=53. \\boxed{53}`
  2  2-digit +/- 2-digit            `Compute 47-36.`    -> `47-36=11. \\boxed{11}`
  3  2-digit x 1-digit, decomposed  `Compute 47*6.`     -> `40*6=240. 7*6=42. 240+42=282. \\boxed{282}`
  4  a +/- b*c (precedence)         `Compute 12+7*3.`   -> `7*3=21. 12+21=33. \\boxed{33}`
  5  a + b - c, left to right       `Compute 47+38-25.` -> `47+38=85. 85-25=60. \\boxed{60}`
"""
from __future__ import annotations

import random
import zlib
from typing import Callable, Iterable, Iterator

from oarctl.errors import OarError

DEFAULT_LEVELS: tuple[int, ...] = (1, 2, 3, 4, 5)
RESERVED_BUCKETS = 10  # 1 in 10 problems (by hash) never appears in pretraining
MAX_TRIES = 10_000  # draws per problem before a level counts as exhausted

Step = tuple[str, int]  # ("47+6", 53)


def _level1(rng: random.Random) -> tuple[str, list[Step]]:
    """2-digit +/- 1-digit: the easiest level, one step with at most one carry."""
    a, b = rng.randint(10, 99), rng.randint(1, 9)
    op = rng.choice("+-")
    expr = f"{a}{op}{b}"
    return expr, [(expr, a + b if op == "+" else a - b)]


def _level2(rng: random.Random) -> tuple[str, list[Step]]:
    """2-digit +/- 2-digit, never negative: one step, carries/borrows in two places."""
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    op = rng.choice("+-")
    if op == "-" and a < b:
        a, b = b, a
    expr = f"{a}{op}{b}"
    return expr, [(expr, a + b if op == "+" else a - b)]


def _level3(rng: random.Random) -> tuple[str, list[Step]]:
    """2-digit x 1-digit by place value: tens product, units product, then their sum."""
    a, b = rng.randint(11, 99), rng.randint(2, 9)
    if a % 10 == 0:
        a += 1  # keep the units product non-trivial, so all problems have three steps
    tens, units = a - a % 10, a % 10
    steps = [(f"{tens}*{b}", tens * b), (f"{units}*{b}", units * b)]
    steps.append((f"{tens * b}+{units * b}", a * b))
    return f"{a}*{b}", steps


def _level4(rng: random.Random) -> tuple[str, list[Step]]:
    """a +/- b*c: multiply first (precedence), then combine; never negative."""
    b, c = rng.randint(2, 9), rng.randint(2, 9)
    op = rng.choice("+-")
    a = rng.randint(max(10, b * c) if op == "-" else 10, 99)
    value = a + b * c if op == "+" else a - b * c
    return f"{a}{op}{b}*{c}", [(f"{b}*{c}", b * c), (f"{a}{op}{b * c}", value)]


def _level5(rng: random.Random) -> tuple[str, list[Step]]:
    """a + b - c with 2-digit numbers, left to right; c <= a+b so never negative."""
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    c = rng.randint(10, min(99, a + b))
    return f"{a}+{b}-{c}", [(f"{a}+{b}", a + b), (f"{a + b}-{c}", a + b - c)]


LEVELS: dict[int, Callable[[random.Random], tuple[str, list[Step]]]] = {
    1: _level1, 2: _level2, 3: _level3, 4: _level4, 5: _level5}


def render(expr: str, steps: list[Step]) -> tuple[str, str, str]:
    """(problem, solution, answer) texts for one expression and its steps."""
    answer = str(steps[-1][1])
    body = " ".join(f"{lhs}={value}." for lhs, value in steps)
    return f"Compute {expr}.", f"{body} \\boxed{{{answer}}}", answer


def is_reserved(problem: str) -> bool:
    """Deterministic hash split: reserved problems are kept out of pretraining (held-out pool)."""
    return zlib.crc32(problem.encode()) % RESERVED_BUCKETS == 0


def _check_levels(levels: Iterable[int]) -> tuple[int, ...]:
    levels = tuple(levels)
    unknown = [lv for lv in levels if lv not in LEVELS]
    if not levels or unknown:
        raise OarError(f"toy task levels must be a non-empty subset of {sorted(LEVELS)}, got {levels}")
    return levels


def _rng(seed: int) -> random.Random:
    return random.Random(f"oarctl-toy-{seed}")  # str seed: stable across Python versions


def _draw(level: int, rng: random.Random) -> dict:
    problem, solution, answer = render(*LEVELS[level](rng))
    return {"problem": problem, "answer": answer, "solution": solution, "level": level}


def iter_problems(seed: int, levels: tuple[int, ...] = DEFAULT_LEVELS) -> Iterator[dict]:
    """Endless seeded stream of problems (repeats possible), levels mixed uniformly: pretraining."""
    levels, rng = _check_levels(levels), _rng(seed)
    while True:
        yield _draw(rng.choice(levels), rng)


def generate_problems(n: int, seed: int, levels: tuple[int, ...] = DEFAULT_LEVELS,
                      exclude: set[str] | frozenset[str] = frozenset()) -> list[dict]:
    """n distinct problems, levels mixed uniformly, skipping texts in `exclude` (e.g. a train set).

    The level is drawn first and retried within that level, so a level whose space `exclude`
    mostly covers keeps its share. Same arguments -> identical list. Raises OarError rather
    than spin when a level cannot supply another distinct problem.
    """
    levels, rng = _check_levels(levels), _rng(seed)
    seen: set[str] = set()
    out: list[dict] = []
    while len(out) < n:
        level = rng.choice(levels)
        for _ in range(MAX_TRIES):
            item = _draw(level, rng)
            if item["problem"] not in seen and item["problem"] not in exclude:
                break
        else:
            raise OarError(f"toy level {level} ran out of distinct problems after {len(out)} of {n} "
                           f"(excluding {len(exclude)} texts); ask for fewer or add levels")
        seen.add(item["problem"])
        out.append({"prompt_id": f"toy-s{seed}-{len(out)}", **item})
    return out
