"""Lenient grading of the forms multilingual and multiple-choice benchmarks produce (issue 43), one
family at a time: answer markers in other languages, choice letters against a letter gold, unit
words on one side, mixed numbers, decimals against exact values, complex expansions, answer sets
over several boxes, stray trailing delimiters. Each family has the wrong answers its rule must
refuse, and strict mode (the training reward) keeps its reading of every case."""
from __future__ import annotations

import pytest

from oarctl.verify import extract_answer, verify_batch
from oarctl.verify.extract import find_answer
from oarctl.verify.gold_readings import find_box_set, find_choice
from oarctl.verify.lenient_rules import complex_value, lenient_verdict, rewrite

TIMEOUT = 30.0  # seconds per engine check: on 2 shared cores a loaded machine makes 5 s a flaky limit

# (response, lenient answer, gold, lenient verdict)
MARKERS = [
    ("小明一共有 5 + 3 = 8 个苹果。答案是 8。", "8", "8", "correct"),
    ("答：小明有 8 个苹果。", "8", "8", "correct"),
    ("答案是 7/9", "7/9", "\\frac{7}{9}", "correct"),
    ("答案是 7/9", "7/9", "\\frac{9}{7}", "wrong"),
    ("La réponse est 24.", "24", "24", "correct"),
    ("Réponse : 3,5 kg", "3,5", "3.5", "correct"),
    ("La respuesta es 42.", "42", "24", "wrong"),
    ("Die Antwort lautet 18, da 3 · 6 = 18.", "18", "18", "correct"),
    ("Ответ — 24.", "24", "24", "correct"),
    ("Ответ: 12 см", "12", "12", "correct"),
    ("残りは 20 - 7 = 13 です。答えは13です。", "13", "13", "correct"),
    ("合計は 250 円です。\n答え：250", "250", "250", "correct"),
]
# a negation in another language before the last number: that number is not the answer
REFUSED_AFTER_NEGATION = ["La réponse est 12 et non 15.", "La respuesta es 12, no 15.",
                          "Die Antwort lautet 12, nicht 15.",
                          "答案是 12，而不是 15。"]


@pytest.mark.parametrize("response, answer, gold, verdict", MARKERS)
def test_answer_markers_of_other_languages(response, answer, gold, verdict):
    assert extract_answer(response, mode="lenient") == answer
    assert extract_answer(response) is None  # strict mode needs an English marker or a box
    assert verify_batch([response], [gold], extraction="lenient", timeout=TIMEOUT)[0].verdict == verdict


@pytest.mark.parametrize("response", REFUSED_AFTER_NEGATION)
def test_a_number_after_a_negation_is_never_the_answer(response):
    assert extract_answer(response, mode="lenient") is None
    assert verify_batch([response], ["15"], extraction="lenient", timeout=TIMEOUT)[0].verdict == "no_answer"


def test_the_second_path_does_not_overrule_an_answer_stated_after_a_marker():
    """math-verify reads the last number, 15; the response said its answer was 12."""
    response = "La respuesta es 12. Comprobación: 12 + 3 = 15."
    verdict = verify_batch([response], ["15"], extraction="lenient", timeout=TIMEOUT)[0]
    assert (verdict.verdict, verdict.extracted, verdict.second_path) == ("wrong", "12", False)


# (response, letter read, gold letter, lenient verdict)
CHOICES = [
    ("The opposite of hot is cold.\n\nAnswer: B, which is cold.", "B", "B", "correct"),
    ("Only the third option survives. C, since the other two fail the boundary condition.", "C", "C", "correct"),
    ("C, since the other two fail the boundary condition.", "C", "A", "wrong"),
    ("Comparing the energies, the correct choice is (B).", "B", "B", "correct"),
    ("B) 4.5 eV", "B", "\\text{(B)}", "correct"),
    ("Answer: (A) the dimer", "A", "(A)", "correct"),
    ("三个选项中只有 C 满足条件。\n答案：C", "C", "C", "correct"),
    ("Seule la proposition B convient.\nRéponse : B", "B", "A", "wrong"),
    ("The sky is blue, so the answer is C.\n\nAnswer: A", "A", "C", "wrong"),  # the last answer counts
]
# no letter: two letters named, an article or a pronoun, a letter that is only mentioned
NO_LETTER = [("It is either B or C; I cannot decide between them.", "B"), ("Option B is wrong, so D.", "B"),
             ("I think B.", "I"), ("A good guess would be 12.", "A"), ("The answer is a number.", "A")]


@pytest.mark.parametrize("response, letter, gold, verdict", CHOICES)
def test_choice_letters_against_a_letter_gold(response, letter, gold, verdict):
    found = find_choice(response, find_answer(response, "lenient"))
    assert found is not None and found.text == letter and response[found.start:found.end] == letter
    got = verify_batch([response], [gold], extraction="lenient", timeout=TIMEOUT)[0]
    assert (got.verdict, got.extracted) == (verdict, letter)


@pytest.mark.parametrize("response, gold", NO_LETTER)
def test_no_letter_where_the_response_names_several_or_none(response, gold):
    assert find_choice(response, find_answer(response, "lenient")) is None
    assert verify_batch([response], [gold], extraction="lenient", timeout=TIMEOUT)[0].verdict != "correct"


def test_choice_letters_are_read_only_against_a_letter_gold():
    """Against a number the letter is not read: `B) 4.5 eV` is graded on its number."""
    assert verify_batch(["B) 4.5 eV"], ["4.5"], extraction="lenient", timeout=TIMEOUT)[0].extracted != "B"
    strict = verify_batch(["C, since the other two fail."], ["C"], extraction="strict", timeout=TIMEOUT)[0]
    assert strict.verdict == "no_answer"


@pytest.mark.parametrize("response, gold, verdict", [
    ("12", "12 apples", "correct"),
    ("\\boxed{12}", "12 apples", "correct"),
    ("13", "12 apples", "wrong"),
    ("\\boxed{12 apples}", "12 apple", "correct"),                       # a plural is the same word
    ("\\boxed{12 cm}", "12 m", "wrong"),                                 # another unit: never equal
    ("It takes \\boxed{3 \\text{ hours } 20 \\text{ minutes}}.", "3", "wrong"),  # a compound quantity
    ("The rope is \\boxed{2 m 50 cm} long.", "2", "wrong"),
])
def test_unit_words_on_one_side(response, gold, verdict):
    assert verify_batch([response], [gold], extraction="lenient", timeout=TIMEOUT)[0].verdict == verdict


@pytest.mark.parametrize("answer, read", [
    ("2 1/4", "\\frac{9}{4}"), ("2\\frac{1}{4}", "\\frac{9}{4}"), ("2 \\frac{1}{4}", "\\frac{9}{4}"),
    ("-2\\frac{1}{4}", "-\\frac{9}{4}"),  # minus the whole mixed number, never -2 + 1/4
    ("21/4", "21/4"), ("2\\frac{5}{4}", "2\\frac{5}{4}"), ("2 0/4", "2 0/4"),  # no mixed number
])
def test_mixed_numbers_are_read_whole(answer, read):
    assert rewrite(answer, answer, "1")[0] == read


@pytest.mark.parametrize("response, answer, gold, verdict", [
    ("The answer is 2 1/4.", "2 1/4", "2.25", "correct"),
    ("She needs 3 1/2 cups of flour.", "3 1/2", "3.5", "correct"),
    ("She needs 3 1/2 cups of flour.", "3 1/2", "\\frac{1}{2}", "wrong"),  # its last number alone is not it
    ("$\\boxed{-2\\frac{1}{4}}$", "-2\\frac{1}{4}", "-\\frac{7}{4}", "wrong"),
])
def test_mixed_numbers_in_responses(response, answer, gold, verdict):
    got = verify_batch([response], [gold], extraction="lenient", timeout=TIMEOUT)[0]
    assert (got.extracted, got.verdict) == (answer, verdict)


@pytest.mark.parametrize("pred, gold, equal", [
    ("1.25\\times10^{-3}", "\\frac{1}{800}", True),
    ("1.25\\times10^{-2}", "\\frac{1}{800}", None),     # exact values differ: left to the engine (not equal)
    ("6.02\\times10^{23}", "602000000000000000000000", True),
    ("3.14159", "\\pi", True),                          # 6 significant digits, within 1e-6
    ("1.41421356", "\\sqrt{2}", True),
    ("0.33", "\\frac{1}{3}", None),                     # too few digits for the tolerance
    ("3.1416", "\\pi", None),                           # 5 digits
    ("1.0", "\\frac{1000001}{1000000}", None),          # `1.0` is not 1.000001
    ("314160", "100000\\pi", None),                     # an integer is compared exactly, never with a tolerance
])
def test_decimals_against_exact_values(pred, gold, equal):
    assert lenient_verdict(pred, gold) is equal


@pytest.mark.parametrize("response, gold, verdict", [
    ("$\\boxed{1.25 \\times 10^{-3}}$", "\\frac{1}{800}", "correct"),
    ("$\\boxed{1.25 \\times 10^{-2}}$", "\\frac{1}{800}", "wrong"),
    ("$\\boxed{0.33}$", "\\frac{1}{3}", "wrong"),
    ("$\\boxed{(1+2i)(3-i)}$", "5+5i", "correct"),
    ("$\\boxed{(1+2i)(3-i)}$", "5-5i", "wrong"),
    ("$\\boxed{(2+i)^2}$", "3+4i", "correct"),
    ("$\\boxed{\\frac{1}{1+i}}$", "0.5-0.5i", "correct"),
])
def test_numeric_forms_graded(response, gold, verdict):
    assert verify_batch([response], [gold], extraction="lenient", timeout=TIMEOUT)[0].verdict == verdict


@pytest.mark.parametrize("text, value", [("(1+2i)(3-i)", 5 + 5j), ("i^2", -1), ("-3-4i", -3 - 4j), ("x+i", None),
                                         ("2 3", None), ("1/2", None), ("i^{11}", None), ("(" * 300, None)])
def test_complex_values_are_read_only_in_their_small_grammar(text, value):
    assert complex_value(text) == value


def test_complex_rule_needs_a_gold_in_a_plus_bi_form():
    assert lenient_verdict("i^2", "-1") is None  # `i` may be a variable: the engine decides
    assert lenient_verdict("(1+i)^2", "2i") is True


@pytest.mark.parametrize("response, gold, verdict", [
    ("The first root is $\\boxed{2}$ and the second root is $\\boxed{-3}$.", "-3, 2", "correct"),
    ("The first root is $\\boxed{2}$ and the second root is $\\boxed{-3}$.", "\\{2, -3\\}", "correct"),
    ("The first root is $\\boxed{2}$ and the second root is $\\boxed{3}$.", "-3, 2", "wrong"),
    ("I first thought $\\boxed{2}$, but that fails the check; the answer is $\\boxed{3}$.", "2, 3", "wrong"),
    ("We get $\\boxed{2}$. Checking again, we get $\\boxed{3}$.", "2, 3", "wrong"),   # a sentence between
    ("First \\boxed{3}, then correcting, \\boxed{5}.", "5", "correct"),   # a single gold: the last box
])
def test_answer_sets_over_several_boxes(response, gold, verdict):
    assert verify_batch([response], [gold], extraction="lenient", timeout=TIMEOUT)[0].verdict == verdict


def test_box_set_reads_only_when_the_last_box_is_the_answer():
    response = "So $\\boxed{2}$ and $\\boxed{3}$ and the answer is 7."
    assert find_box_set(response, find_answer(response, "lenient")) is None


@pytest.mark.parametrize("response, answer, gold, verdict", [
    ("The answer is 185\\", "185", "185", "correct"),
    ("The answer is 186\\", "186", "185", "wrong"),
    ("**Answer:** 12\\", "12", "12", "correct"),
    ("**Answer:** 21\\", "21", "12", "wrong"),
    ("答案：12\\", "12", "12", "correct"),
    ("185\\", "185", "185\\", "correct"),      # a gold with the same stray backslash
])
def test_stray_trailing_delimiters(response, answer, gold, verdict):
    got = verify_batch([response], [gold], extraction="lenient", timeout=TIMEOUT)[0]
    assert (got.extracted, got.verdict) == (answer, verdict)
    assert response[got.start:got.end] == answer


def test_strict_mode_never_takes_the_lenient_readings():
    responses = ["答案是 8。", "C, since the other two fail.", "\\boxed{3 1/2}", "The answer is 185\\",
                 "The first root is $\\boxed{2}$ and the second root is $\\boxed{-3}$.", "\\boxed{(1+2i)(3-i)}"]
    golds = ["8", "C", "3.5", "185", "-3, 2", "5+5i"]
    strict = verify_batch(responses, golds, extraction="strict", timeout=TIMEOUT)
    assert [v.verdict for v in strict] == ["no_answer", "no_answer", "wrong", "wrong", "wrong", "wrong"]


# ---- hostile text: the readings that need the gold stay linear ------------------------------------

SIZE = 50_000  # characters: a quadratic pass takes half a minute or more, a linear one well under a second
HOSTILE = {
    "marker_then_spaces": "答案" + " " * SIZE + "!",
    "answer_is_then_spaces": "the answer is" + " \t" * SIZE + "?",
    "letters": "A B " * (SIZE // 4),
    "unit_words": "1" + " " * SIZE + "x" + " " * SIZE + "!",
    "boxes_with_prose": "\\boxed{1} and then " * (SIZE // 20),
    "digits": "1" * SIZE + "x 1/2",
    "open_parentheses": "(" * SIZE + "i",
    "backslashes": "The answer is 1" + "\\" * SIZE,
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_gold_readings_and_lenient_rules_are_linear(name):
    import time

    from oarctl.verify.normalize import normalize

    text = HOSTILE[name]
    started = time.perf_counter()
    found = find_answer(text, "lenient")
    find_choice(text, found)
    find_box_set(text, found)
    answer = normalize(found.text if found else text)
    rewrite(text, answer, "12 apples")
    for gold in ("12 apples", "5+5i", "\\frac{1}{3}", "3"):
        lenient_verdict(answer, gold)
        lenient_verdict(gold, answer)
    assert time.perf_counter() - started < 10.0, name
