"""Answer checking: a registry of checkers, each `(response_text, gold) -> (extracted, reward)`.

`boxed` is the minimal checker (last \\boxed{}, exact text match) the toy task needs.
"""
from oarctl.registry import Registry
from oarctl.verify import boxed

CHECKERS = Registry("verify method")
CHECKERS.register("boxed")(boxed.score)
