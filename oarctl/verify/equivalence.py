"""The `math` checker: extraction, normalisation, a cheap exact path, then math-verify in a pool.

Repeated (answer, gold) pairs are decided once per batch and remembered across batches (a group
of 8 samples repeats answers a lot); only pairs the cheap path (cheap.py) cannot settle reach a
worker, so integer answers (the toy task) never start one. The first such pair starts a worker at
once, so that its import overlaps the extraction of the rest of the batch. In lenient mode, answers
graded no answer or wrong get a second path (second_path.py) through the same pool, and readings
that need the gold come first: a choice letter when the gold is one and several boxes as one list
when the gold is a list (gold_readings.py), then the pair rules of lenient_rules.py (mixed numbers,
units on one side, decimals against exact values, complex numbers), which decide before the cheap
path and are never remembered, so strict pairs never meet them.

`grade` grades one response as the verify stage does (`verify_batch` on a batch of one);
`extract_answer` (extract.py) and `is_equivalent` are the strict building blocks beneath it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace

from oarctl.verify import gold_readings, lenient_rules, second_path
from oarctl.verify.extract import check_mode, find_answer
from oarctl.verify.cheap import quick_verdict
from oarctl.verify.normalize import decimal_comma, normalize, spaced_list
from oarctl.verify.pool import WorkerPool

DEFAULT_TIMEOUT = 5.0
DEFAULT_MEMORY_MB = 2048
MEMO_LIMIT = 100_000
# A fresh worker takes about a CPU-second to import and warm up the engine, the time of ~80 typical
# checks, so a batch starts one more worker per this many engine pairs, up to `workers`. Measured on
# bench/verify.py's 44 engine pairs, 2 shared cores at load 3: one worker 1.3 s and 1.3 CPU-s, two
# workers 2.1 s and 2.1 CPU-s.
PAIRS_PER_WORKER = 64
_MEMO: dict[tuple, "Decision"] = {}  # settled (pred, gold) or second-path item -> decision, process-wide
_POOLS: dict[tuple, WorkerPool] = {}  # idle workers stop at exit (pool.py's atexit hook)


@dataclass(frozen=True)
class Decision:
    verdict: str         # "correct", "wrong", "timeout" or "error"
    parse_ok: bool       # the answers parsed (always true on the cheap path)
    latency_ms: float    # time spent deciding this pair (shared by its repeats)
    answer: str | None = None  # the second path's reading of the answer (math-verify's extraction)


@dataclass(frozen=True)
class Verdict:
    extracted: str | None
    start: int                   # character span of the answer in the response; -1 when none
    end: int
    normalized_answer: str | None
    normalized_gold: str | None
    verdict: str                 # "correct", "wrong", "no_answer", "timeout" or "error"
    parse_ok: bool
    timed_out: bool
    latency_ms: float
    graded_by: str = "oarctl"    # whose extraction read the answer: oarctl's, or math-verify's (second path)
    second_path: bool = False    # lenient mode asked math-verify too (the first path said no answer or wrong)

    @property
    def reward(self) -> float:
        return float(self.verdict == "correct")


def verdict_columns(verdicts: list[Verdict], extraction: str) -> dict:
    """The verified artifact's columns that come from the verdicts alone (not the reward, nor the token
    spans, which need the tokenizer); `extraction` is recorded in every row, as `lenient+math-verify`
    where the second path graded it."""
    return {"extracted_answer": [v.extracted for v in verdicts], "answer_char_start": [v.start for v in verdicts],
            "answer_char_end": [v.end for v in verdicts], "normalized_answer": [v.normalized_answer for v in verdicts],
            "normalized_gold": [v.normalized_gold for v in verdicts], "verdict": [v.verdict for v in verdicts],
            "parse_ok": [v.parse_ok for v in verdicts], "timed_out": [v.timed_out for v in verdicts],
            "extraction": [extraction_label(v, extraction) for v in verdicts]}


def extraction_label(verdict: Verdict, extraction: str) -> str:
    return extraction if verdict.graded_by == "oarctl" else f"{extraction}+{verdict.graded_by}"


def normalized_gold(gold: str) -> str:
    """Gold answers get the same treatment; a full solution (`#### 42`, `\\boxed{}`) gives its answer."""
    found = find_answer(gold)
    return normalize(gold if found is None else found.text)


def _quick(pair: tuple[str, str]) -> Decision | None:
    started = time.perf_counter()
    equal = quick_verdict(*pair)
    if equal is None:
        return None
    return Decision("correct" if equal else "wrong", True, (time.perf_counter() - started) * 1e3)


def _pool(timeout: float, workers: int, memory_mb: int) -> WorkerPool:
    """One pool per setting, kept for the process's life: the next batch (the next step's verify,
    the next benchmark) finds its workers started and the engine imported."""
    key = (timeout, workers, memory_mb)
    if key not in _POOLS:  # named, not imported: only the workers import the engine
        _POOLS[key] = WorkerPool("oarctl.verify.symbolic:check_item", workers=workers, timeout=timeout,
                                 memory_mb=memory_mb, items_per_worker=PAIRS_PER_WORKER)
    return _POOLS[key]


def _symbolic(items: list[tuple], timeout: float, workers: int, memory_mb: int) -> list[Decision]:
    outcomes = _pool(timeout, workers, memory_mb).map(items)
    decisions = []
    for outcome in outcomes:
        if outcome.status == "ok":
            equal, parse_ok, answer = outcome.value
            decisions.append(Decision("correct" if equal else "wrong", parse_ok, outcome.latency_ms, answer))
        else:
            decisions.append(Decision(outcome.status, False, outcome.latency_ms))
    return decisions


def decide(pairs: list[tuple], *, timeout: float = DEFAULT_TIMEOUT, workers: int = 0,
           memory_mb: int = DEFAULT_MEMORY_MB) -> dict[tuple, Decision]:
    """A decision per distinct normalised (pred, gold) pair or second-path item (never cheap)."""
    decided = {pair: _MEMO[pair] for pair in set(pairs) if pair in _MEMO}
    hard = []
    for pair in set(pairs) - decided.keys():
        quick = _quick(pair) if len(pair) == 2 else None
        if quick is None:
            hard.append(pair)
        else:
            decided[pair] = quick
    if hard:
        decided.update(zip(hard, _symbolic(hard, timeout, workers, memory_mb)))
    if len(_MEMO) > MEMO_LIMIT:
        _MEMO.clear()
    # Timeouts and errors may be load-dependent, so only settled verdicts are remembered; whole
    # responses (second-path items) seldom repeat across batches and would hold their text.
    _MEMO.update({pair: d for pair, d in decided.items() if d.verdict in ("correct", "wrong") and len(pair) == 2})
    return decided


def needs_engine(pair: tuple[str, str] | None) -> bool:
    return pair is not None and pair not in _MEMO and _quick(pair) is None


def _pair(found, gold_form: str, extraction: str, response: str = "") -> tuple[str, str] | None:
    if found is None:
        return None
    pred = normalize(found.text)
    if extraction != "lenient":
        return pred, gold_form
    # a decimal comma on either side, read against the other side's plain number
    pred, gold = spaced_list(found.text, decimal_comma(pred, gold_form)), decimal_comma(gold_form, pred)
    written = response[found.start:found.end] or found.text  # before `12 apples` was read as `12`
    return lenient_rules.rewrite(written, pred, gold)


def _found(response: str, gold_form: str, mode: str):
    """The answer as the mode reads it; in lenient mode a choice letter when the gold is one, and
    several boxes as one list when the gold is a list."""
    found = find_answer(response, mode)
    if mode != "lenient":
        return found
    if gold_readings.is_letter(gold_form):
        return gold_readings.find_choice(response, found) or found
    if gold_readings.is_collection(gold_form):
        return gold_readings.find_box_set(response, found) or found
    return found


def _lenient_decision(pair: tuple[str, str] | None) -> Decision | None:
    """The verdict of a lenient pair rule (lenient_rules.py), None when none decides."""
    if pair is None:
        return None
    started = time.perf_counter()
    equal = lenient_rules.lenient_verdict(*pair)
    if equal is None:
        return None
    return Decision("correct" if equal else "wrong", True, (time.perf_counter() - started) * 1e3)


def verify_batch(responses: list[str], golds: list[str], *, timeout: float = DEFAULT_TIMEOUT,
                 workers: int = 0, memory_mb: int = DEFAULT_MEMORY_MB, extraction: str = "strict") -> list[Verdict]:
    """One Verdict per (response, gold); hung, crashing or huge items get `timeout`/`error`, reward 0.

    `extraction`: `strict` (explicit answer markers only) or `lenient` (graders' fallbacks, see
    extract.py, then math-verify's own extraction for answers graded no answer or wrong, see
    second_path.py). Gold answers are always read strictly: a bare gold such as `x >= 5` is the answer.
    """
    mode, gold_forms = check_mode(extraction), {gold: normalized_gold(gold) for gold in set(golds)}
    limits = {"timeout": timeout, "workers": workers, "memory_mb": memory_mb}
    found, pairs, settled, engine_started = [], [], {}, False
    for response, gold in zip(responses, golds):
        found.append(_found(response, gold_forms[gold], mode))
        pairs.append(_pair(found[-1], gold_forms[gold], extraction, response))
        if mode == "lenient" and pairs[-1] not in settled:  # each distinct pair once (groups repeat answers)
            settled[pairs[-1]] = _lenient_decision(pairs[-1])
        if settled.get(pairs[-1]) is not None:
            continue
        if not engine_started and (_unanswered(mode, response, found[-1]) or needs_engine(pairs[-1])):
            _pool(timeout, workers, memory_mb).start()  # imports the engine while we extract the rest
            engine_started = True
    # Responses without an answer take the second path in the same round as the first path's pairs.
    unanswered = [second_path.item(response, gold) for response, gold, answer in zip(responses, golds, found)
                  if _unanswered(mode, response, answer)]
    settled = {pair: decision for pair, decision in settled.items() if decision is not None}
    engine_pairs = [p for p in pairs if p is not None and p not in settled]
    decisions = {**decide(engine_pairs + unanswered, **limits), **settled}
    verdicts = [_first_verdict(answer, gold_forms[gold], pair, decisions)
                for answer, gold, pair in zip(found, golds, pairs)]
    return _with_second_path(responses, golds, found, verdicts, decisions, limits) if mode == "lenient" else verdicts


def _unanswered(mode: str, response: str, answer) -> bool:
    """A response without an answer that the second path will read (it needs the engine)."""
    return mode == "lenient" and answer is None and second_path.deserves_second_path(response, None, "no_answer")


def _first_verdict(answer, gold_form: str, pair, decisions: dict) -> Verdict:
    if pair is None:
        return Verdict(None, -1, -1, None, gold_form, "no_answer", False, False, 0.0)
    decision = decisions[pair]
    return Verdict(answer.text, answer.start, answer.end, pair[0], pair[1], decision.verdict, decision.parse_ok,
                   decision.verdict == "timeout", decision.latency_ms)


def _with_second_path(responses, golds, found, verdicts: list[Verdict], decisions: dict, limits: dict) -> list[Verdict]:
    """Lenient mode: math-verify's own reading of every response graded no answer or wrong."""
    items = {index: second_path.item(responses[index], golds[index]) for index, verdict in enumerate(verdicts)
             if second_path.deserves_second_path(responses[index], found[index], verdict.verdict)}
    missing = [item for item in items.values() if item not in decisions]
    if missing:
        decisions = {**decisions, **decide(missing, **limits)}
    return [_second_verdict(verdict, responses[index], decisions[items[index]]) if index in items else verdict
            for index, verdict in enumerate(verdicts)]


def _second_verdict(first: Verdict, response: str, decision: Decision) -> Verdict:
    """The first path's verdict, unless math-verify's reading is correct (only a "correct" counts:
    the second path is a second chance, never a second way to be wrong)."""
    latency_ms = first.latency_ms + decision.latency_ms
    start, end = second_path.span_of(response, decision.answer or "")
    overlaps = second_path.same_reading(first.extracted, (first.start, first.end), (start, end))
    if decision.verdict != "correct" or overlaps:
        return replace(first, second_path=True, latency_ms=latency_ms)
    return Verdict(decision.answer, start, end, normalize(decision.answer), first.normalized_gold, "correct", True,
                   False, latency_ms, graded_by=second_path.GRADED_BY, second_path=True)


def grade(response: str, gold: str, extraction: str = "lenient", *, timeout: float = DEFAULT_TIMEOUT,
          workers: int = 0, memory_mb: int = DEFAULT_MEMORY_MB) -> Verdict:
    """One response against its gold, graded as the verify stage and `oarctl evaluate` grade it: the
    Verdict of `verify_batch` on a batch of one (lenient by default, as evaluation; `strict` as the
    training reward), the second path and the readings that need the gold included."""
    return verify_batch([response], [gold], timeout=timeout, workers=workers, memory_mb=memory_mb,
                        extraction=extraction)[0]


def is_equivalent(pred: str, gold: str, timeout: float = DEFAULT_TIMEOUT) -> bool:
    """Whether a final answer (not a whole response) equals the gold answer; False on timeout.

    A strict building block: no lenient reading (no second path, no choice letter, no lenient pair
    rule), so `extract_answer(text, mode="lenient")` followed by this call may grade lower than
    `grade(text, gold)`, which is the one call that grades as the verify stage does."""
    pair = (normalize(pred), normalized_gold(gold))
    return decide([pair], timeout=timeout, workers=1)[pair].verdict == "correct"
