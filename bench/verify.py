"""Benchmark the math answer verifier: `verify_batch` against plain sequential math-verify, on the
same rollout-like set in one run.

    python bench/verify.py            # all 500 MATH-500 problems x 8 responses (`make bench`)
    python bench/verify.py --quick    # 40 problems x 8, a smoke run

The set: for each problem a group of `--group` responses (default 8), each a little reasoning text
then one of: the gold answer boxed exactly; an equivalent rewritten form where one is easy
(integer k -> `\\frac{2k}{2}` or `k.0`, `\\frac{a}{b}` -> `\\dfrac{a}{b}`, else the exact gold);
a wrong answer repeated within the group (integer gold + 1, else another problem's answer);
`The answer is $X$.` with no box; or no answer at all. Deterministic (`--seed`).

- baseline: `math_verify.verify(math_verify.parse("$gold$"), math_verify.parse(response))` per
  response, sequentially in this process (the full response text goes to parse, as math-verify
  users do; the gold is wrapped in `$...$` because math-verify's default extraction finds nothing
  in bare LaTeX such as `p - q`). An exception counts as wrong.
- ours: `oarctl.verify.verify_batch(responses, golds, extraction=--extraction)` (default
  `lenient`, as `oarctl evaluate` grades) with default workers (all cores), memo cleared first,
  pool start-up included.
"""
from __future__ import annotations

import argparse
import json
import logging
import random
import re
import time
from collections import Counter
from pathlib import Path

DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "math500_test.jsonl"
INTEGER = re.compile(r"^-?\d+$")
FRACTION = re.compile(r"^\\frac\{(-?\d+)\}\{(\d+)\}$")
REASONING = [
    "Let me work through this step by step. First I set up the relevant equations.",
    "We simplify the expression and collect like terms, checking each step carefully.",
    "Consider the cases separately; combining them gives the result below.",
    "Substituting the known values and simplifying, we get the final value.",
]


def load_problems(path: Path, count: int) -> list[dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return rows[:count]


def equivalent_form(gold: str, rng: random.Random) -> str:
    """An easy equivalent rewrite of the gold answer, or the gold itself when none is easy."""
    if INTEGER.match(gold):
        k = int(gold)
        return f"\\frac{{{2 * k}}}{{2}}" if rng.random() < 0.5 else f"{k}.0"
    match = FRACTION.match(gold)
    if match:
        return f"\\dfrac{{{match.group(1)}}}{{{match.group(2)}}}"
    return gold


def wrong_answer(gold: str, index: int, golds: list[str]) -> str:
    if INTEGER.match(gold):
        return str(int(gold) + 1)
    for step in range(1, len(golds)):  # the next problem's answer that differs from this one
        other = golds[(index + step) % len(golds)]
        if other != gold:
            return other
    return gold + "+1"


def build_set(problems: list[dict], group: int, seed: int) -> tuple[list[str], list[str], list[str]]:
    """(responses, golds, kinds) with `group` responses per problem."""
    rng = random.Random(seed)
    golds_all = [p["answer"] for p in problems]
    kinds_cycle = ["exact", "exact", "equivalent", "wrong", "wrong", "answer_is", "exact", "none"]
    responses, golds, kinds = [], [], []
    for index, gold in enumerate(golds_all):
        kinds_here = [kinds_cycle[i % len(kinds_cycle)] for i in range(group)]
        rng.shuffle(kinds_here)
        wrong = wrong_answer(gold, index, golds_all)  # the same wrong answer repeats within the group
        for kind in kinds_here:
            text = rng.choice(REASONING) + " " + rng.choice(REASONING)
            if kind == "exact":
                text += f"\n\nTherefore the answer is $\\boxed{{{gold}}}$."
            elif kind == "equivalent":
                text += f"\n\nSo we obtain $\\boxed{{{equivalent_form(gold, rng)}}}$."
            elif kind == "wrong":
                text += f"\n\nHence the result is $\\boxed{{{wrong}}}$."
            elif kind == "answer_is":
                text += f"\n\nThe answer is ${gold}$."
            else:
                text += "\n\nI am not sure how to finish this problem."
            responses.append(text)
            golds.append(gold)
            kinds.append(kind)
    return responses, golds, kinds


def baseline(responses: list[str], golds: list[str]) -> tuple[list[bool], float, int]:
    import math_verify

    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    verdicts, errors = [], 0
    started = time.perf_counter()
    for response, gold in zip(responses, golds):
        try:
            verdicts.append(bool(math_verify.verify(math_verify.parse(f"${gold}$"), math_verify.parse(response))))
        except Exception:  # noqa: BLE001 - counted as wrong, as a reward function would
            verdicts.append(False)
            errors += 1
    return verdicts, time.perf_counter() - started, errors


def ours(responses: list[str], golds: list[str], workers: int, extraction: str):
    from oarctl.verify import equivalence

    equivalence._MEMO.clear()
    started = time.perf_counter()
    verdicts = equivalence.verify_batch(responses, golds, workers=workers, extraction=extraction)
    return verdicts, time.perf_counter() - started


def _tail(text: str, width: int = 60) -> str:
    text = text.replace("\n", " ")
    return text if len(text) <= width else "..." + text[-(width - 3):]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="40 problems: a smoke run")
    parser.add_argument("--problems", type=int, default=500, help="MATH-500 problems (x group)")
    parser.add_argument("--group", type=int, default=8, help="responses per problem")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=0, help="verify_batch workers (0: all cores)")
    parser.add_argument("--extraction", choices=["strict", "lenient"], default="lenient",
                        help="verify_batch extraction mode")
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--examples", type=int, default=10, help="disagreements to print")
    args = parser.parse_args()
    if args.quick:
        args.problems = 40

    from oarctl.verify.pool import available_cores

    problems = load_problems(args.data, args.problems)
    responses, golds, kinds = build_set(problems, args.group, args.seed)
    print(f"{len(problems)} MATH-500 problems x {args.group} responses = {len(responses)} answers, "
          f"{len(set(zip(responses, golds)))} distinct; kinds {dict(Counter(kinds))}; "
          f"{available_cores()} core(s)")

    base, base_seconds, base_errors = baseline(responses, golds)
    got, our_seconds = ours(responses, golds, args.workers, args.extraction)
    our_correct = [v.verdict == "correct" for v in got]

    n = len(responses)
    print(f"\n{'method':<34} {'answers':>8} {'seconds':>8} {'answers/s':>10} {'speed-up':>8}")
    print(f"{'baseline: sequential math-verify':<34} {n:>8} {base_seconds:>8.2f} {n / base_seconds:>10.1f} {1.0:>7.1f}x")
    print(f"{'ours: verify_batch, ' + args.extraction:<34} {n:>8} {our_seconds:>8.2f} {n / our_seconds:>10.1f} "
          f"{base_seconds / our_seconds:>7.1f}x")
    print(f"baseline exceptions (counted wrong): {base_errors}")
    print(f"ours: {dict(Counter(v.verdict for v in got))} "
          f"(of {', '.join(['correct', 'wrong', 'no_answer', 'timeout', 'error'])})")
    by_kind = Counter((k, v.verdict) for k, v in zip(kinds, got))
    print("ours by response kind: " + "; ".join(f"{k}/{verdict}={c}" for (k, verdict), c in sorted(by_kind.items())))

    differ = [i for i in range(n) if base[i] != our_correct[i]]
    print(f"\nagreement: {n - len(differ)}/{n} verdicts agree, {len(differ)} differ "
          f"(baseline correct, ours not: {sum(base[i] for i in differ)}; ours correct, baseline not: "
          f"{sum(our_correct[i] for i in differ)})")
    if differ:
        print(f"{'response tail':<62} {'gold':<24} {'baseline':>8} {'ours':>10}")
        for i in differ[:args.examples]:
            print(f"{_tail(responses[i]):<62} {golds[i][:24]:<24} {str(base[i]):>8} {got[i].verdict:>10}")


if __name__ == "__main__":
    main()
