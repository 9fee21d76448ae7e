"""bench/graders.py's plain math-verify grader, for the tests that hold lenient grading against it: one copy of
how plain math-verify grades a case (a grader that raises gives no credit), the bench's."""
from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"


def math_verify_grader(responses: list[str], golds: list[str]) -> list[bool]:
    sys.path.insert(0, str(BENCH))
    try:
        from graders import math_verify_grader as grader
    finally:
        sys.path.remove(str(BENCH))
    return grader(responses, golds)
