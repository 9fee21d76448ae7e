"""bench/credit_classes.py: the token classes of a chains response, and the report's shares on generated records."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.credit_classes import character_classes, report  # noqa: E402
from oarctl.toy.chains import parse_problem  # noqa: E402

PROBLEM = "a=72, b=a+6, c=b+9, y=a+6, x=a-6. Find c."


def test_steps_on_the_path_distractors_fillers_and_the_query_step():
    text = "then x=72-6=66. now b=72+6=78. and c=78+9=87. \\boxed{87}"
    classes = character_classes(parse_problem(PROBLEM), text)
    words = ("then", "x=", "-6", "66", "b=", "+6", "=78", "c=", "87.", "\\boxed")
    at = {word: classes[text.index(word)] for word in words}
    assert at["then"] == "filler" and at["\\boxed"] == "box"
    assert at["x="] == "distractor:name" and at["-6"] == "distractor:op" and at["66"] == "distractor:result"
    assert at["b="] == "chain:name" and at["+6"] == "chain:op" and at["=78"] == "chain:punct"
    assert at["c="] == "query:name" and at["87."] == "query:result"  # the query's own step, which the box copies
    assert classes[text.index("72")] == "distractor:operand" and classes[text.index("78+9")] == "query:operand"


def test_report_shares_follow_the_weights_and_the_gradient_sizes():
    labels = np.array([1, 0, 0, 1])
    grad = np.array([0.5, 0.5, 0.0, 0.0])  # only the first two tokens carry gradient
    ones, truth = np.ones(4), np.array([2.0, 1.0, 1.0, 2.0])
    weights = {(m, r): (truth if m == "truth" else ones) for m in ("oar_flow_local", "oar_g", "truth")
               for r in ("default", "rank")}
    record = {"classes": ["chain:name", "filler", "filler", "chain:result"], "labels": labels, "grad": grad,
              "weights": weights}
    text = report([record] * 30)
    rows = {tuple(c.strip() for c in line.split("|")[1:3]): line for line in text.splitlines() if line.startswith("| ")}
    assert "| 0.500 |" in rows[("uniform", "—")]  # label 1 holds half the 1 - p mass
    assert "| 2.00 | 0.667 |" in rows[("truth", "default")]  # weight 2 on it: 2 x 0.5 / (2 x 0.5 + 0.5)
    assert "| 1.00 | 0.500 |" in rows[("oar_g", "rank")]
    assert "| filler | 0.500 | 0.500 |" in text
