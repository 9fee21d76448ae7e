"""Answer checking: a registry of batch checkers, each
`(responses, golds, *, timeout, workers, memory_mb, extraction) -> list[Verdict]`.

`math` (the full verifier: extraction in `strict` or `lenient` mode, normalisation, math-verify in
a killable pool) and `boxed` (last \\boxed{}, exact text match; pure string work, no modes).

One answer: `grade(response, gold, extraction="lenient")` returns the Verdict the verify stage
gives it (the same code path as `verify_batch`); `extract_answer` and `is_equivalent` are the
strict building blocks beneath it.
"""
from oarctl.registry import Registry
from oarctl.verify import boxed
from oarctl.verify.equivalence import Verdict, grade, is_equivalent, verdict_columns, verify_batch
from oarctl.verify.extract import extract_answer

CHECKERS = Registry("verify method")
CHECKERS.register("math")(verify_batch)


@CHECKERS.register("boxed")
def boxed_batch(responses: list[str], golds: list[str], **_limits) -> list[Verdict]:
    """The boxed checker in the batch shape; it needs no limits (no symbolic work) and reads only
    the last box, whatever the extraction mode."""
    verdicts = []
    for response, gold in zip(responses, golds):
        span = boxed.boxed_span(response)
        if span is None:
            verdicts.append(Verdict(None, -1, -1, None, boxed.normalize(gold), "no_answer", False, False, 0.0))
            continue
        answer = response[span[0]:span[1]]
        correct = boxed.score(response, gold)[1] == 1.0
        verdicts.append(Verdict(answer, span[0], span[1], boxed.normalize(answer), boxed.normalize(gold),
                                "correct" if correct else "wrong", True, False, 0.0))
    return verdicts


__all__ = ["CHECKERS", "Verdict", "extract_answer", "grade", "is_equivalent", "verdict_columns", "verify_batch"]
