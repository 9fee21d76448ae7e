"""Benchmark the math answer verifier: `verify_batch` against plain sequential math-verify, on the
same rollout-like set in one run.

    python bench/verify.py            # all 500 MATH-500 problems x 8 responses (`make bench`)
    python bench/verify.py --quick    # 40 problems x 8, a smoke run
    python bench/verify.py --table bench/data/graders_heldout.jsonl   # a labelled table's cases instead

The set: for each problem a group of `--group` responses (default 8), each a little reasoning text
then one of: the gold answer boxed exactly; an equivalent rewritten form where one is easy
(integer k -> `\\frac{2k}{2}` or `k.0`, `\\frac{a}{b}` -> `\\dfrac{a}{b}`, else the exact gold);
a wrong answer repeated within the group (integer gold + 1, else another problem's answer);
`The answer is $X$.` with no box; or no answer at all. Deterministic (`--seed`). Every one of these
shapes is read by oarctl's own extraction, so none needs lenient mode's second path; `--table`
times a labelled table of bench/graders.py instead (its `kind` as the response kind), where some do.

- baseline: `math_verify.verify(math_verify.parse(gold), math_verify.parse(response))` per
  response, sequentially in this process (the full response text goes to parse, as math-verify
  users do; a bare gold is wrapped in `$...$` because math-verify's default extraction finds nothing
  in bare LaTeX such as `p - q`: oarctl.verify.second_path.math_verify_gold). An exception counts
  as wrong.
- ours, cold pool (the figure the speed-up claim is about):
  `oarctl.verify.verify_batch(responses, golds, extraction=--extraction)` (default `lenient`, as
  `oarctl evaluate` grades) with default workers (all cores at most; one per 64 pairs that need
  the engine), memo cleared first, no worker running before the call: pool start-up (importing and
  warming up the engine) is timed. In lenient mode, answers graded no answer or wrong may take the
  second path (math-verify's own parse of the whole response, oarctl/verify/second_path.py): the
  share that did, and the share it graded correct, are printed. The workers are stopped after
  timing so that their CPU-seconds are counted.
- ours, warm pool (printed for information, in parentheses): the same call again, memo cleared,
  with the workers already started and warmed up on other answers (bench/graders.py's labelled
  table), as in `oarctl run`, whose pool lives across steps. Its speed-up is against the same
  (cold, in-process) baseline.

The CPU-s column is the CPU time of this process (and, for ours, of its workers): on 2 shared cores
the wall-clock seconds move with other people's jobs, the CPU-seconds much less.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import random
import re
import time
from collections import Counter
from pathlib import Path

DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "math500_test.jsonl"
WARM_UP = Path(__file__).resolve().parent / "data" / "graders_labelled.jsonl"
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


def _children_cpu() -> float:
    times = os.times()
    return times.children_user + times.children_system


def baseline(responses: list[str], golds: list[str]) -> tuple[list[bool], float, float, int]:
    """(verdicts, seconds, CPU-seconds, exceptions)."""
    import math_verify

    from oarctl.verify.second_path import math_verify_gold

    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    verdicts, errors = [], 0
    started, cpu = time.perf_counter(), time.process_time()
    for response, gold in zip(responses, golds):
        try:
            verdicts.append(bool(math_verify.verify(math_verify.parse(math_verify_gold(gold)),
                                                    math_verify.parse(response))))
        except Exception:  # noqa: BLE001 - counted as wrong, as a reward function would
            verdicts.append(False)
            errors += 1
    return verdicts, time.perf_counter() - started, time.process_time() - cpu, errors


def ours(responses: list[str], golds: list[str], workers: int, extraction: str):
    """(verdicts, seconds, CPU-seconds of this process and of the workers) with a cold pool: none
    running before, its start-up timed; the workers are stopped after timing, to count their CPU."""
    from oarctl.verify import equivalence

    equivalence._MEMO.clear()
    started, cpu, workers_cpu = time.perf_counter(), time.process_time(), _children_cpu()
    verdicts = equivalence.verify_batch(responses, golds, workers=workers, extraction=extraction)
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    for pool in equivalence._POOLS.values():
        pool.close()
    return verdicts, seconds, cpu + _children_cpu() - workers_cpu


def ours_warm(responses: list[str], golds: list[str], workers: int, extraction: str):
    """(verdicts, seconds) with the pool already started and warmed on other answers (the labelled
    table of bench/graders.py), as in `oarctl run`, whose pool lives across steps; memo cleared."""
    from oarctl.verify import equivalence
    from oarctl.verify.pool import available_cores

    rows = [json.loads(line) for line in WARM_UP.read_text().splitlines() if line.strip()]
    pool = equivalence._pool(equivalence.DEFAULT_TIMEOUT, workers, equivalence.DEFAULT_MEMORY_MB)
    pool.start(workers or available_cores())
    equivalence.verify_batch([r["response"] for r in rows], [r["gold"] for r in rows], workers=workers,
                             extraction=extraction)
    equivalence._MEMO.clear()
    started = time.perf_counter()
    verdicts = equivalence.verify_batch(responses, golds, workers=workers, extraction=extraction)
    return verdicts, time.perf_counter() - started


def _tail(text: str, width: int = 60) -> str:
    text = text.replace("\n", " ")
    return text if len(text) <= width else "..." + text[-(width - 3):]


# the labelled tables of bench/graders.py: kind, response, gold, equal (and an optional source)
COLUMNS = {"kind", "response", "gold", "equal"}


def load_table(path: Path) -> list[dict]:
    if not path.is_file():
        raise SystemExit(f"error: {path}: no such labelled table")
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise SystemExit(f"error: {path}:{number}: not JSON ({error.msg})") from None
        if not isinstance(row, dict) or set(row) - {"source"} != COLUMNS:
            raise SystemExit(f"error: {path}:{number}: expected kind, response, gold, equal (and an optional source)")
        rows.append(row)
    return rows


def answer_set(args) -> tuple[list[str], list[str], list[str], str]:
    """(responses, golds, kinds, a description): the MATH-500 rollout set, or a labelled table."""
    if args.table is None:
        problems = load_problems(args.data, args.problems)
        described = f"{len(problems)} MATH-500 problems x {args.group} responses"
        return (*build_set(problems, args.group, args.seed), described)
    rows = load_table(args.table)
    return [r["response"] for r in rows], [r["gold"] for r in rows], [r["kind"] for r in rows], args.table.name


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
    parser.add_argument("--table", type=Path, help="a labelled table of bench/graders.py instead of MATH-500")
    parser.add_argument("--examples", type=int, default=10, help="disagreements to print")
    args = parser.parse_args()
    if args.quick:
        args.problems = 40

    from oarctl.verify.pool import available_cores

    responses, golds, kinds, described = answer_set(args)
    print(f"{described} = {len(responses)} answers, {len(set(zip(responses, golds)))} distinct; "
          f"kinds {dict(Counter(kinds))}; {available_cores()} core(s)")

    base, base_seconds, base_cpu, base_errors = baseline(responses, golds)
    got, our_seconds, our_cpu = ours(responses, golds, args.workers, args.extraction)
    warm, warm_seconds = ours_warm(responses, golds, args.workers, args.extraction)
    our_correct = [v.verdict == "correct" for v in got]

    n = len(responses)
    print(f"\n{'method':<42} {'answers':>8} {'seconds':>8} {'answers/s':>10} {'speed-up':>8} {'CPU-s':>6}")
    print(f"{'baseline: sequential math-verify':<42} {n:>8} {base_seconds:>8.2f} {n / base_seconds:>10.1f} "
          f"{1.0:>7.1f}x {base_cpu:>6.2f}")
    print(f"{'ours: verify_batch, ' + args.extraction + ', cold pool':<42} {n:>8} {our_seconds:>8.2f} "
          f"{n / our_seconds:>10.1f} {base_seconds / our_seconds:>7.1f}x {our_cpu:>6.2f}")
    print(f"{'(ours, warm pool, as across training steps)':<42} {n:>8} {warm_seconds:>8.2f} "
          f"{n / warm_seconds:>10.1f} {base_seconds / warm_seconds:>7.1f}x")
    if [v.verdict for v in warm] != [v.verdict for v in got]:
        print("warm pool: verdicts differ from the cold pool's")
    print(f"baseline exceptions (counted wrong): {base_errors}")
    print(f"ours: {dict(Counter(v.verdict for v in got))} "
          f"(of {', '.join(['correct', 'wrong', 'no_answer', 'timeout', 'error'])})")
    asked, graded = sum(v.second_path for v in got), sum(v.graded_by != "oarctl" for v in got)
    print(f"second path (math-verify's own extraction): needed by {asked}/{n} answers ({100 * asked / n:.1f}%), "
          f"graded correct {graded}/{n} ({100 * graded / n:.1f}%)")
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
