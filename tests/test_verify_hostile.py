"""The verifier and the attribution spans on hostile model output: nothing runs, nothing hangs.

A model's response is untrusted text. It may hold code (`__import__`, `eval`, `open`), numbers no
machine can expand (exponent towers, huge factorials, `1e99999999999`), pathological nesting, a
megabyte of answer, broken encodings and control characters. The contract checked here:

* nothing in a response is executed (every injection payload would create a file; none may exist);
* every verdict is one of the five, and no hostile item is ever rewarded unless genuinely equal;
* the batch finishes in bounded time: each item that reaches the pool costs at most its timeout,
  plus the time to spawn the workers that replace killed ones (measured, not guessed);
* the pool survives hangs, hard crashes (`os._exit`, SIGSEGV) and allocations beyond its cap, and
  keeps input order;
* the pure-string parts (extraction, normalisation, box spans, segmentation) are linear: they run
  in this process with no timeout, so a quadratic regex there is a denial of service.

The pool functions below are module-level so that spawned workers can unpickle them by reference
(the tests folder is on sys.path, as for `conftest`). This module imports nothing heavy at top level,
since every worker imports it.
"""
from __future__ import annotations

import math
import os
import signal
import time

import pytest

from oarctl.verify import equivalence
from oarctl.verify.boxed import boxed_span
from oarctl.verify.equivalence import is_equivalent, verify_batch
from oarctl.verify.cheap import quick_verdict
from oarctl.verify.extract import find_answer
from oarctl.verify.normalize import normalize
from oarctl.verify.pool import WorkerPool

TARGET = "@TARGET@"  # replaced per test by a path under tmp_path; the file must never appear
GOLD = "1"
VERDICTS = {"correct", "wrong", "no_answer", "timeout", "error"}
MB = 1_000_000
NEST = 10_000

_INVALID_UTF8 = b"\\boxed{\xff\xfe\xc3( \xed\xa0\x80 2}"

# Code injection. Payloads are space-free where possible: normalisation removes spaces around
# symbols, which would defuse `touch X` and make the check vacuous.
INJECTIONS = [
    "\\boxed{__import__('os').system('touch @TARGET@')}",
    '\\boxed{__import__("os").system("touch @TARGET@")}',
    "\\boxed{__import__('pathlib').Path('@TARGET@').touch()}",
    "\\boxed{open('@TARGET@','w').write('x')}",
    "\\boxed{eval(\"__import__('pathlib').Path('@TARGET@').touch()\")}",
    "\\boxed{exec(\"import pathlib;pathlib.Path('@TARGET@').touch()\")}",
    "\\boxed{(lambda:__import__('pathlib').Path('@TARGET@').touch())()}",
    "\\boxed{1+__import__('pathlib').Path('@TARGET@').touch()}",
    "\\boxed{__import__('subprocess').run(['touch','@TARGET@'])}",
    "\\boxed{getattr(__import__('pathlib'),'Path')('@TARGET@').touch()}",
    "\\boxed{().__class__.__base__.__subclasses__()}",
    "$\\boxed{\\text{__import__('pathlib').Path('@TARGET@').touch()}}$",
    "The answer is __import__('pathlib').Path('@TARGET@').touch()",
    "Answer: $exec(\"open('@TARGET@','w')\")$",
    "#### __import__('pathlib').Path('@TARGET@').touch()",
    "__import__('pathlib').Path('@TARGET@').touch()",
    "\\boxed{\\input{/etc/passwd}}",
    "\\boxed{\\def\\x{\\x}\\x}",
]

HUGE_VALUES = [
    "\\boxed{10^{10^{10^{10}}}}",
    "\\boxed{9^9^9^9}",
    "\\boxed{9^{9^{9^{9}}}}",
    "\\boxed{2^{2^{2^{2^{2^{100}}}}}}",
    "\\boxed{(10^{100})!}",
    "\\boxed{10^{100}!}",
    "\\boxed{\\sqrt[10^{10}]{2}}",
    "\\boxed{\\prod_{k=1}^{10^{10}} k}",
    "\\boxed{\\sum_{k=1}^{10^{12}} k^{k}}",
    "\\boxed{\\int_0^{\\infty} e^{-x^{10^{10}}} dx}",
    "\\boxed{\\sin^{10^{10}}(x)}",
    "\\boxed{1e99999999999}",          # a Fraction of it would build 10**99999999999 in-process
    "\\boxed{1e" + "9" * 30 + "}",     # beyond Decimal's exponent range
    "\\boxed{" + "1" * 100_000 + "}",  # 100k digits
    "\\boxed{" + "1" * 100_000 + "x}",  # 100k digits then a letter: a backtracking regex is quadratic
    "\\boxed{0." + "1" * 100_000 + "}",
    "The answer is " + "9" * MB,       # a million digits: a Fraction of it took ~40 s in-process
    "\\boxed{1.0000001}",
    "\\boxed{1/0}",
    "\\boxed{0/0}",
    "\\boxed{\\infty}",
]

STRUCTURE = [
    "\\boxed{" + "{" * NEST + "1" + "}" * NEST + "}",        # genuinely 1 (braces only group)
    "\\boxed{" * NEST,                                       # 10,000 unclosed boxes
    "\\boxed{" * NEST + "1",
    "{" * NEST + "\\boxed{2}",
    "}" * NEST + "\\boxed{2}",
    "\\boxed{" + "(" * 5_000 + "2" + ")" * 5_000 + "}",
    "\\boxed{" + "\\sqrt{" * 3_000 + "2" + "}" * 3_000 + "}",
    "\\boxed{" + "\\frac{1}{" * 2_000 + "2" + "}" * 2_000 + "}",
    "\\boxed{" + "x+" * (MB // 2) + "2}",                    # a 1 MB answer
    "a" * MB,                                               # 1 MB, no answer
    "answer is " * 100_000,
    "\\boxed{x}" * 100_000,
    "\\boxed{\\text{" + "a" * 100_000 + "}}",
    "\\boxed{" + "\\text{a}" * 20_000 + "}",
    "\\boxed{2" + "\\," * 100_000 + "}",
    "\\boxed{\\begin{pmatrix}" + "\\\\".join(["&".join(["1"] * 200)] * 200) + "\\end{pmatrix}}",
    "\\boxed{\\begin{matrix}1}",
    "\\boxed{\\end{matrix}}",
    "The answer is $\\frac{1}{$",
    "\\boxed{\\frac{1}{}",
    "\\boxed{\\frac{1}{}}",
    "\\boxed{\\left(}",
    "\\boxed{\\right)2}",
    "\\boxed{\\\\\\\\}",
    "\\boxed{}",
]

ENCODING = [
    _INVALID_UTF8.decode("utf-8", "surrogateescape"),
    _INVALID_UTF8.decode("utf-8", "replace"),
    "\\boxed{\x002}",
    "\\boxed{\x00}",
    "\\boxed{\x01\x02\x03\x1b[31m2\x1b[0m}",
    "\\boxed{\u202e2\u202c}",                 # right-to-left override
    "\\boxed{\u202e" + "\u200f" * 1000 + "}",
    "\\boxed{\ufeff\u2028\u2029}",
    "\\boxed{\udcff\udc80}",                  # lone surrogates
    "\\boxed{" + "\ufffd" * 10_000 + "}",
]

HOSTILE = INJECTIONS + HUGE_VALUES + STRUCTURE + ENCODING
# Items that may genuinely equal the gold: a verdict of correct is allowed for these only.
MAY_EQUAL_GOLD = {"\\boxed{" + "{" * NEST + "1" + "}" * NEST + "}"}


def armed(corpus: list[str], folder) -> tuple[list[str], list]:
    """The corpus with each injection aimed at its own file under `folder`, and those files."""
    responses, targets = [], []
    for index, response in enumerate(corpus):
        if TARGET in response:
            target = folder / f"pwned_{index}"
            targets.append(target)
            response = response.replace(TARGET, str(target))
        responses.append(response)
    return responses, targets


def test_corpus_is_big_enough():
    assert len(HOSTILE) >= 50
    assert len(INJECTIONS) >= 15 and all(isinstance(r, str) for r in HOSTILE)


def test_injection_payloads_are_live(tmp_path):
    """Positive control: the extracted, normalised payloads *do* create their files when a Python
    eval runs them, so the "no file" checks below are not vacuous. (The `os.system('touch X')`
    ones lose their space in normalisation, hence the space-free `pathlib`/`open` payloads.)"""
    responses, targets = armed(INJECTIONS, tmp_path)
    for response in responses:
        found = find_answer(response)
        if found is not None and "system(" not in found.text:
            try:
                eval(normalize(found.text), {})  # noqa: S307 - our own payloads, aimed at tmp_path
            except Exception:  # noqa: BLE001 - `1+None` and LaTeX fail after (or instead of) the touch
                pass
    assert sum(target.exists() for target in targets) >= 10


# ---- the whole verifier on the corpus ------------------------------------------------------------

def check_batch(corpus: list[str], tmp_path, monkeypatch, timeout: float = 2.0, workers: int = 2) -> list:
    """verify_batch on `corpus` against gold 1, with every check of the module docstring."""
    traps = tmp_path / "traps"
    traps.mkdir()
    responses, targets = armed(corpus, traps)

    monkeypatch.setattr(equivalence, "_MEMO", {})  # a cold memo: every pair is decided here
    reached = []  # (items that reached the pool, workers replaced)
    original_map = WorkerPool.map

    def recording_map(self, items):
        outcomes = original_map(self, items)
        reached.append((len(items), self.replaced))
        return outcomes

    monkeypatch.setattr(WorkerPool, "map", recording_map)

    started = time.perf_counter()
    verdicts = verify_batch(responses, [GOLD] * len(responses), timeout=timeout, workers=workers)
    elapsed = time.perf_counter() - started

    assert sorted(p.name for p in traps.iterdir()) == []  # nothing was executed
    assert not any(target.exists() for target in targets)
    assert len(verdicts) == len(responses)
    assert {v.verdict for v in verdicts} <= VERDICTS
    for original, response, verdict in zip(corpus, responses, verdicts):
        if original not in MAY_EQUAL_GOLD:
            assert verdict.reward == 0.0, (response[:80], verdict.verdict, (verdict.extracted or "")[:80])
        assert verdict.timed_out == (verdict.verdict == "timeout")
        if verdict.verdict == "no_answer":
            assert verdict.extracted is None and verdict.start == verdict.end == -1
        else:  # the answer's text; several boxed answers read as one set span the first box's content to the last's
            span = response[verdict.start:verdict.end]
            assert span == verdict.extracted or ("\\boxed" in span and
                                                 all(part in span for part in verdict.extracted.split(", ")))

    # Bounded time. Each item, from the moment a worker takes it, gets a verdict within its timeout
    # (plus killing and pipe detection). The whole batch: the pool runs `workers` items at a time,
    # so its work takes at most hard * timeout / workers + timeout (list scheduling), plus worker
    # start-ups (the first ones and each replacement, overlapping the work, each bounded by the
    # pool's start-up limit). The slack covers this process's string work on ~3 MB of text.
    from oarctl.verify.pool import STARTUP_SECONDS
    assert all(v.latency_ms < (timeout + SLACK) * 1e3 for v in verdicts), max(v.latency_ms for v in verdicts)
    hard, replaced = reached[0] if reached else (0, 0)
    assert hard <= len(corpus)
    pool_bound = hard * timeout / workers + timeout
    assert elapsed < pool_bound + 10.0 + (1 + replaced) * STARTUP_SECONDS, (elapsed, hard, replaced)

    # the process survives and an ordinary item still works
    assert [v.verdict for v in verify_batch(["\\boxed{2}", "\\boxed{\\frac{4}{2}}"], ["2", "2"],
                                            timeout=10.0, workers=1)] == ["correct", "correct"]
    return targets


def test_verify_batch_on_injections_and_encodings(tmp_path, monkeypatch):
    """The default-suite share of the corpus: every injection and encoding item (~15 s)."""
    targets = check_batch(INJECTIONS + ENCODING, tmp_path, monkeypatch)
    assert len(targets) >= 12


@pytest.mark.slow
def test_verify_batch_on_hostile_corpus(tmp_path, monkeypatch):
    """All of it, ~55 s on 2 busy cores: ~18 items time out and each replacement worker takes ~2 s
    to import the engine."""
    targets = check_batch(HOSTILE, tmp_path, monkeypatch)
    assert len(targets) >= 12


def test_is_equivalent_never_executes(tmp_path):
    target = tmp_path / "pwned"
    payloads = [f"__import__('os').system('touch {target}')",
                f"__import__('pathlib').Path('{target}').touch()",
                f"exec(\"open('{target}','w')\")"]
    for payload in payloads:
        assert is_equivalent(payload, "1", timeout=10.0) is False
    assert not target.exists()
    assert list(tmp_path.iterdir()) == []


def test_quick_path_is_exact_and_fast_on_huge_numbers():
    """Decided in this process, with no timeout: must not expand 10**99999999999 or a megadigit."""
    cases = [("1e99999999999", "1", False), ("9" * MB, "1", False), ("1" * 100_000 + "x", "1", None),
             ("1.0000001", "1", False), ("1.50", "1.5", True), ("1.5E3", "1500", True), ("1e" + "9" * 30, "1", None)]
    for pred, gold, expected in cases:
        started = time.perf_counter()
        assert quick_verdict(normalize(pred), gold) is expected, pred[:40]
        assert time.perf_counter() - started < 2.0, pred[:40]


# ---- the pool itself -----------------------------------------------------------------------------

def hostile_task(item):
    """What an untrusted item can do to a worker: item = (action, argument)."""
    action, argument = item
    if action == "echo":
        return argument
    if action == "sleep":
        time.sleep(argument)
        return "woke"
    if action == "exit":
        os._exit(argument)
    if action == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)
        time.sleep(10)
    if action == "alloc":
        return len(bytearray(argument))
    if action == "raise":
        raise ValueError(argument)
    if action == "unpicklable":
        return lambda: argument
    raise AssertionError(action)


SLACK = 3.0  # kill + join + pipe detection on a busy machine


def test_pool_timeout_kills_and_goes_on():
    with WorkerPool(hostile_task, workers=1, timeout=1.0, memory_mb=1024) as pool:
        outcomes = pool.map([("sleep", 10_000), ("echo", 1), ("echo", 2)])
        assert [o.status for o in outcomes] == ["timeout", "ok", "ok"]
        assert [o.value for o in outcomes[1:]] == [1, 2]
        assert 1000.0 <= outcomes[0].latency_ms < (1.0 + SLACK) * 1000
        assert pool.replaced == 1
        assert [o.value for o in pool.map([("echo", "again")])] == ["again"]  # the pool is reusable


def test_pool_survives_hard_crashes():
    items = [("exit", 1), ("echo", "a"), ("segv", None), ("echo", "b"), ("raise", "boom"), ("unpicklable", 0),
             ("echo", "c")]
    with WorkerPool(hostile_task, workers=1, timeout=10.0, memory_mb=1024) as pool:
        outcomes = pool.map(items)
        assert [o.status for o in outcomes] == ["error", "ok", "error", "ok", "error", "error", "ok"]
        assert "worker died" in outcomes[0].value and "exit code 1" in outcomes[0].value
        assert "worker died" in outcomes[2].value and str(-signal.SIGSEGV) in outcomes[2].value
        assert outcomes[4].value == "ValueError: boom"
        assert [outcomes[i].value for i in (1, 3, 6)] == ["a", "b", "c"]
        assert pool.replaced == 2  # the two dead workers; exceptions keep their worker


def test_pool_memory_cap_gives_memory_error():
    with WorkerPool(hostile_task, workers=1, timeout=20.0, memory_mb=300) as pool:
        outcomes = pool.map([("alloc", 2 * 1024 ** 3), ("alloc", 10 * 2 ** 20), ("echo", "alive")])
        assert outcomes[0].status == "error" and outcomes[0].value.startswith("MemoryError")
        assert [(o.status, o.value) for o in outcomes[1:]] == [("ok", 10 * 2 ** 20), ("ok", "alive")]
        assert pool.replaced == 0  # a MemoryError is caught in the worker, which goes on


def test_pool_keeps_order_with_mixed_failures():
    items = [("sleep", 0.6), ("echo", 0), ("exit", 3), ("sleep", 10_000), ("echo", 1), ("sleep", 0.1),
             ("segv", None), ("echo", 2), ("sleep", 10_000), ("echo", 3)]
    expected = [("ok", "woke"), ("ok", 0), ("error", None), ("timeout", None), ("ok", 1), ("ok", "woke"),
                ("error", None), ("ok", 2), ("timeout", None), ("ok", 3)]
    timeout, workers = 1.5, 2
    with WorkerPool(hostile_task, workers=workers, timeout=timeout, memory_mb=1024) as pool:
        started = time.perf_counter()
        outcomes = pool.map(items)
        elapsed = time.perf_counter() - started
        assert len(outcomes) == len(items)
        for outcome, (status, value) in zip(outcomes, expected):
            assert outcome.status == status
            if value is not None:
                assert outcome.value == value
        assert pool.replaced == 4  # two killed at their deadline, two found dead
        # at most every item at its full timeout, two at a time, plus 2 + 4 worker starts (~1-3 s each)
        assert elapsed < math.ceil(len(items) / workers) * timeout + (workers + pool.replaced) * 5.0 + SLACK


def test_pool_starts_no_more_workers_than_the_batch_is_worth(monkeypatch):
    from oarctl.verify import pool as pool_module

    started = []
    monkeypatch.setattr(pool_module._Worker, "__init__",
                        lambda self, *a, _init=pool_module._Worker.__init__: started.append(1) or _init(self, *a))
    with WorkerPool(hostile_task, workers=2, timeout=10.0, memory_mb=1024, items_per_worker=4) as pool:
        assert [o.value for o in pool.map([("echo", i) for i in range(4)])] == [0, 1, 2, 3]
        assert len(started) == 1  # 4 items: one worker
        assert [o.value for o in pool.map([("echo", i) for i in range(5)])] == [0, 1, 2, 3, 4]
        assert len(started) == 2  # 5 items: a second one may start (the first alone may finish them)


def test_pool_starts_every_worker_once_an_item_is_slow(monkeypatch):
    """Two items are worth one worker, until one of them runs past SLOW_ITEM_SECONDS."""
    from oarctl.verify import pool as pool_module

    started = []
    monkeypatch.setattr(pool_module._Worker, "__init__",
                        lambda self, *a, _init=pool_module._Worker.__init__: started.append(1) or _init(self, *a))
    with WorkerPool(hostile_task, workers=2, timeout=30.0, memory_mb=1024, items_per_worker=10) as pool:
        outcomes = pool.map([("sleep", 3.0), ("sleep", 3.0)])
        assert [o.value for o in outcomes] == ["woke", "woke"]
        assert len(started) == 2


def test_pool_start_does_not_wait_and_map_takes_the_started_worker():
    with WorkerPool(hostile_task, workers=2, timeout=10.0, memory_mb=1024, items_per_worker=4) as pool:
        started = time.perf_counter()
        pool.start()
        assert time.perf_counter() - started < 0.5  # the worker imports in the background
        pool.start()  # already one started or starting: nothing more
        assert len(pool._starting) == 1
        process = pool._starting[0].process
        assert [o.value for o in pool.map([("echo", 1), ("echo", 2)])] == [1, 2]
        assert [w.process for w in pool._idle] == [process] and pool._starting == []


def test_verify_batch_starts_the_engine_at_the_first_pair_that_needs_it(monkeypatch):
    """While the rest of the batch is extracted, and never for pairs the cheap path decides."""
    monkeypatch.setattr(equivalence, "_MEMO", {})
    extracted, starts = [], []
    monkeypatch.setattr(equivalence, "find_answer", lambda *a: extracted.append(1) or find_answer(*a))
    monkeypatch.setattr(WorkerPool, "start", lambda self, count=1: starts.append(len(extracted)))
    verify_batch(["\\boxed{2}", "\\boxed{\\frac{4}{2}}", "\\boxed{(1,2)}"], ["2"] * 3)
    assert starts == []  # all three decided without the engine
    extracted.clear()
    verdicts = verify_batch(["\\boxed{2}", "\\boxed{\\sqrt{4}}", "\\boxed{3}", "\\boxed{2\\sqrt{2}}"], ["2"] * 4,
                            workers=1)
    assert starts == [1 + 2]  # the gold, then two responses: the rest is extracted while it starts
    assert [v.verdict for v in verdicts] == ["correct", "correct", "wrong", "wrong"]


# ---- pure-string parts: linear on hostile text ---------------------------------------------------

LINEAR_INPUTS = {
    "nested": "\\boxed{" + "{" * NEST + "1" + "}" * NEST + "}",
    "unclosed": "\\boxed{" * NEST,
    "unclosed_then_box": "\\boxed{" * NEST + "\\boxed{7}",
    "open_braces": "{" * NEST * 10,
    "megabyte_box": "\\boxed{" + "x" * MB + "}",
    "megabyte_plain": "a" * MB,
    "megabyte_backslashes": "\\" * MB,
    "megabyte_answer_is": "answer is " * (MB // 10),
    "megabyte_gsm8k": "#### " + " \t" * (MB // 2),
    "megabyte_digits": "The answer is " + "1" * MB + "x",
    "megabyte_spaces": "\\boxed{" + " " * MB + "1" + " " * MB + "}",
    "megabyte_units": "\\boxed{" + "\\text{a " * (MB // 8) + "}",
    "megabyte_escaped_dollars": "The answer is $" + "\\$" * (MB // 2),
    # lenient fallbacks: dollar pairs holding prose, unclosed display math, numbers everywhere
    "megabyte_currency": "$5 and " * (MB // 7),
    "megabyte_dollars": "$" * MB,
    "megabyte_unclosed_display": "\\[" * (MB // 2),
    "megabyte_numbers": "1,2 " * (MB // 4),
    "megabyte_run_of_boxes": "\\boxed{1} and " * (MB // 16),
}


@pytest.mark.parametrize("name", sorted(LINEAR_INPUTS))
def test_extraction_is_linear(name):
    text = LINEAR_INPUTS[name]
    started = time.perf_counter()
    boxed_span(text)
    for mode in ("strict", "lenient"):
        found = find_answer(text, mode)
        if found is not None:
            assert 0 <= found.start < found.end <= len(text)
            quick_verdict(normalize(found.text), GOLD)
    # a pure-Python pass over 1 MB takes ~1-2 s on a quiet core (9 s seen with 5 jobs on 2 cores);
    # a quadratic one would take hours, so a loose bound still tells them apart
    assert time.perf_counter() - started < 60.0, name


def test_box_spans_on_hostile_nesting():
    nested = LINEAR_INPUTS["nested"]
    assert boxed_span(nested) == (len("\\boxed{"), len(nested) - 1)
    assert boxed_span(LINEAR_INPUTS["unclosed"]) is None
    text = LINEAR_INPUTS["unclosed_then_box"]
    assert text[slice(*boxed_span(text))] == "7"
    assert find_answer(LINEAR_INPUTS["unclosed"]) is None


def test_segment_on_hostile_text():
    """Segmentation (the attribution stage's first step) on nested and unclosed boxes."""
    from oarctl.attribution.segments import PROBE_TEXT, segment
    from oarctl.toy.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    eos = tokenizer.eos_token_id

    nested = encode("so " + "\\boxed{" + "{" * 2_000 + "1" + "}" * 2_000 + "}") + [eos]
    started = time.perf_counter()
    segments = segment(nested, tokenizer)
    assert time.perf_counter() - started < 10.0
    assert tokenizer.decode(nested[slice(*segments.conclude)]).strip() == "\\boxed{"
    assert tokenizer.decode(nested[slice(*segments.answer)]) == "{" * 2_000 + "1" + "}" * 2_000

    unclosed = encode("\\boxed{" * 2_000) + [eos]
    started = time.perf_counter()
    segments = segment(unclosed, tokenizer)
    assert time.perf_counter() - started < 10.0
    assert segments.uses_probe and segments.reasoning == (0, len(unclosed) - 1)
    assert segments.probe_ids == encode(PROBE_TEXT) and not segments.has_answer

    control = encode("a\x00b\x1b[0m \\boxed{2}") + [eos]  # characters without a token are dropped
    segments = segment(control, tokenizer)
    assert tokenizer.decode(control[slice(*segments.answer)]) == "2"
