"""The symbolic check, run only inside a pool worker: math-verify on two normalised answers, or
(lenient mode's second path, second_path.py) on a whole response and its gold as written.

math-verify's own timeouts use signal.alarm, which fails outside the main thread and cannot stop
C-level work, so they are disabled here and the pool kills the worker process instead. The engine
is imported when a worker unpickles `check_pair`, before it reports ready, so its import time
never counts against an item's timeout.
"""
from __future__ import annotations

import logging
import re

from math_verify import parse, verify

from oarctl.verify.second_path import math_verify_gold

logging.getLogger("math_verify").setLevel(logging.CRITICAL)  # it warns on every disabled timeout

SCIENTIFIC = re.compile(r"^([-+]?(?:\d+\.?\d*|\.\d+))[eE]([-+]?\d+)$")


def _as_latex(answer: str) -> str:
    """A boxed answer, so math-verify's LaTeX extractor takes exactly this text.

    `1.5e3` becomes `1.5\\times10^{3}`: math-verify would read the `e` as Euler's number.
    """
    return "\\boxed{" + SCIENTIFIC.sub(r"\1\\times10^{\2}", answer) + "}"


def _readings(answer: str) -> list[str]:
    """`12.5\\%` may mean 0.125 or (against a gold of 12.5) the number 12.5; math-verify accepts
    `50\\%` = 50 but not `12.5\\%` = 12.5, so both readings are tried."""
    return [answer, answer[:-2]] if answer.endswith("\\%") else [answer]


def _equal(pred: str, gold: str) -> tuple[bool, bool]:
    parsed_gold = parse(_as_latex(gold), parsing_timeout=None)
    parsed_pred = parse(_as_latex(pred), parsing_timeout=None)
    if not parsed_gold or not parsed_pred:
        return False, False
    return bool(verify(parsed_gold, parsed_pred, timeout_seconds=None)), True


def check_pair(pair: tuple[str, str]) -> tuple[bool, bool]:
    """(equal, both parsed) for a (pred, gold) pair of normalised answers."""
    results = [_equal(pred, gold) for pred in _readings(pair[0]) for gold in _readings(pair[1])]
    return any(equal for equal, _ in results), any(parsed for _, parsed in results)


def check_response(response: str, gold: str) -> tuple[bool, bool, str | None]:
    """(equal, both parsed, math-verify's reading of the answer) as `verify(parse(gold),
    parse(response))`, math-verify's own extraction of both."""
    parsed_gold = parse(math_verify_gold(gold), parsing_timeout=None)
    parsed_response = parse(response, parsing_timeout=None)
    if not parsed_gold or not parsed_response:
        return False, False, None
    return bool(verify(parsed_gold, parsed_response, timeout_seconds=None)), True, str(parsed_response[-1])


def check_item(item: tuple) -> tuple[bool, bool, str | None]:
    """A pool item: an (answer, gold) pair, or a second-path ("response", response, gold)."""
    if len(item) == 3:
        return check_response(item[1], item[2])
    return (*check_pair(item), None)
