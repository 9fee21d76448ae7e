"""Lenient extraction, one rule per family of answer shape (issue 31), on hand-written cases: several
boxes that form one answer, a final sentence after an answer marker, a number in bold, an answer
marker in another language, a decimal or thousands comma, a unit or percent on one side only. Each
family also has cases the rule must refuse, and strict mode keeps its reading."""
from __future__ import annotations

import pytest

from oarctl.verify import extract_answer, verify_batch

# (response, lenient answer, gold, lenient verdict)
FAMILIES = [
    # several boxes joined by more than one connector word form one list; hedging stays a list too
    ("$x = \\boxed{-2} \\quad \\text{and} \\quad x = \\boxed{1}$", "-2, 1", "1, -2", "correct"),
    ("The roots are \\boxed{2} \\quad and \\quad \\boxed{7}.", "2, 7", "\\{2, 7\\}", "correct"),
    ("\\boxed{3} \\quad \\text{or} \\quad \\boxed{5}", "3, 5", "5", "wrong"),
    # a final sentence after an answer marker is read as a whole response is
    ("Final Answer: The area of the garden is 48.", "48", "48", "correct"),
    ("Final Answer: The area of the garden is 48 square meters. I hope it is correct.", "48", "48", "correct"),
    ("Final Answer: the smallest $k$ is 7.", "7", "7", "correct"),
    ("Final Answer: the smallest $k$ is 7.", "7", "8", "wrong"),
    # a number in bold is a number, not two multiplication signs
    ("Adding them, the total comes to **42**.", "42", "42", "correct"),
    ("因此，一共有**36颗**糖果。", "36", "36", "correct"),
    ("In total there are **42 marbles**.", "42", "41", "wrong"),
    # an answer marker in another language
    ("Réponse : il reste 15 billes.", "15", "15", "correct"),
    ("答案：小明有 8 个苹果。", "8", "8", "correct"),
    ("Ответ: 12.", "12", "12", "correct"),
    ("Die Antwort ist 9.", "9", "9", "correct"),
    # a decimal or thousands comma in running text, on either side
    ("Le prix final est donc de 3,75 euros.", "3,75", "3.75", "correct"),
    ("The total is 1.234,5 euros.", "1.234,5", "1234.5", "correct"),
    ("The answer is 3.75", "3.75", "3,75", "correct"),
    ("The town has 12,400 people in total.", "12,400", "12400", "correct"),
    ("\\boxed{12, 400}", "12, 400", "12400", "wrong"),          # a comma and a space: a list
    ("\\boxed{12,\\!400}", "12,\\!400", "12400", "correct"),
    # a unit or a percent on one side only
    ("The answer is 45%.", "45\\%", "45", "correct"),
    ("The answer is 45.", "45", "45\\%", "correct"),
    ("\\boxed{12\\text{ cm}}", "12\\text{ cm}", "12", "correct"),
    ("The tank holds $250$ liters.", "250", "250", "correct"),
]


@pytest.fixture(scope="module")
def lenient():
    return verify_batch([r for r, *_ in FAMILIES], [g for _, _, g, _ in FAMILIES], extraction="lenient", workers=2)


@pytest.mark.parametrize("index", range(len(FAMILIES)), ids=[case[0][:40] for case in FAMILIES])
def test_family_rule(lenient, index):
    response, answer, gold, verdict = FAMILIES[index]
    assert extract_answer(response, "lenient") == answer
    assert lenient[index].verdict == verdict
    assert lenient[index].graded_by == "oarctl"  # the first path decides, without math-verify's second reading


@pytest.mark.parametrize("response, gold", [
    ("It is 2**10 ways.", "10"),                  # a power, not bold
    ("Réponse : 3 + 4.", "7"),                    # an operand after the marker: no answer, as in English
    ("The answer is more than 10.", "10"),        # a hedge in the sentence after the marker
])
def test_family_rules_refuse_what_stays_ambiguous(response, gold):
    assert extract_answer(response, "lenient") in (None, "more than 10")
    verdict = verify_batch([response], [gold], extraction="lenient", workers=1)[0]
    assert verdict.verdict in ("no_answer", "wrong") and not verdict.second_path  # math-verify not asked either


def test_strict_mode_keeps_its_reading_of_the_same_shapes():
    assert extract_answer("$x = \\boxed{-2} \\quad \\text{and} \\quad x = \\boxed{1}$", "strict") == "1"
    assert extract_answer("Final Answer: The area of the garden is 48.", "strict") == "The area of the garden is 48"
    assert extract_answer("Adding them, the total comes to **42**.", "strict") is None
    assert extract_answer("Réponse : il reste 15 billes.", "strict") is None
    verdicts = verify_batch(["\\boxed{12, 400}", "The answer is 3.75"], ["12400", "3,75"], extraction="strict",
                            workers=1)
    assert [v.verdict for v in verdicts] == ["correct", "wrong"]  # as before issue 31
