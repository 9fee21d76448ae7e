"""The chains toy family and its ground-truth labels: generator, problem parser, response parser,
labels of hand-written responses (well formed and malformed), the token_truth column."""
from __future__ import annotations

import itertools
import random

import pytest

from oarctl.errors import OarError
from oarctl.toy import chains, truth
from oarctl.toy.tokenizer import build_tokenizer

PROBLEM = "a=34, b=a+7, c=b-5, x=b+3, d=c+8, e=d-2. Find e."


def marks(labels) -> str:
    """Labels as a string aligned with the text: 1, '.' for 0, '?' for -1."""
    return "".join({1: "1", 0: ".", -1: "?"}[label] for label in labels)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


# ---- the generator and the problem parser ---------------------------------------------------------

def test_problem_parses_to_its_structure_and_values():
    problem = chains.parse_problem(PROBLEM)
    assert problem.query == "e" and problem.text == PROBLEM
    assert problem.values() == {"a": 34, "b": 41, "c": 36, "x": 44, "d": 44, "e": 42}
    assert problem.ancestors("e") == ["e", "d", "c", "b"]  # the given start a has no step
    assert problem.ancestors("x") == ["x", "b"]


@pytest.mark.parametrize("text", ["Compute 47+6.", "a=34, b=a+7. Find z.", "a=34, c=b+1, b=a+2. Find c.",
                                  "a=3, a=a+1. Find a.", "a=34, b=a*7. Find b."])
def test_parser_refuses_other_texts(text):
    assert chains.parse_problem(text) is None


def _items(count: int, seed: int = 0, lengths=chains.DEFAULT_LENGTHS):
    return list(itertools.islice(chains.iter_problems(seed, lengths), count))


def test_stream_is_deterministic_and_lengths_are_levels():
    first = _items(50)
    assert first == _items(50) and first != _items(50, seed=1)
    assert {item["level"] for item in _items(300)} == set(chains.DEFAULT_LENGTHS)
    assert {item["level"] for item in _items(20, lengths=(2,))} == {2}
    with pytest.raises(OarError, match="chain lengths"):
        next(chains.iter_problems(0, (0,)))


def test_problems_have_a_chain_and_two_or_three_distractors_off_the_start():
    for item in _items(300):
        problem = chains.parse_problem(item["problem"])
        names = [d.name for d in problem.definitions]
        chain = [n for n in names if n in chains.CHAIN_NAMES]
        assert chain == list(chains.CHAIN_NAMES[:item["level"] + 1]) and problem.query == chain[-1]
        distractors = [d for d in problem.definitions if d.name in chains.DISTRACTOR_NAMES]
        assert 2 <= len(distractors) <= 3 and all(d.parent == "a" for d in distractors)
        assert names[0] == "a" and all(chains.LOW <= value <= chains.HIGH for value in problem.values().values())
        assert item["answer"] == str(problem.values()[problem.query])


def test_solutions_are_right_and_their_free_choices_vary():
    """Restatement, then every distractor, then the chain in order, then the box; every free choice is
    seen both ways over 300 solutions."""
    seen = {"filler": set(), "swapped": set(), "distractors": set(), "distractor order": set(), "restated": set()}
    for item in _items(300):
        problem = chains.parse_problem(item["problem"])
        values, by_name, chain = problem.values(), problem.by_name, problem.ancestors(problem.query)[::-1]
        segments = [s for s in truth.parse_response(item["solution"]) if s.kind not in ("space", "filler")]
        kinds = [s.kind for s in segments]
        assert kinds[-1] == "box" and segments[-1].match.group("answer") == item["answer"]
        assert "unknown" not in kinds and kinds.count("question") <= 1 and kinds[1:].count("question") == 0
        steps = [s.match for s in segments if s.kind == "step"]
        names = [m.group("name") for m in steps]
        extra = len(names) - len(chain)
        assert names[extra:] == chain and sorted(names[:extra]) == sorted(set(by_name) & set(chains.DISTRACTOR_NAMES))
        for match in steps:
            definition = by_name[match.group("name")]
            left, right = int(match.group("left")), int(match.group("right"))
            assert {left, right} == {values[definition.parent], definition.operand}
            assert match.group("op") == definition.op and int(match.group("value")) == values[definition.name]
            seen["swapped"].add(left == definition.operand and definition.op == "+")
        fillers = [s.match.group(0) for s in truth.parse_response(item["solution"]) if s.kind == "filler"]
        seen["filler"] |= set(fillers) | ({""} if len(fillers) < len(segments) - 1 else set())
        seen["distractors"].add(extra)
        seen["distractor order"].add(tuple(names[:extra]))
        seen["restated"].add(kinds[0] == "question")
        assert kinds[0] != "question" or segments[0].match.group(0) == f"find {problem.query}."
    assert seen["filler"] == {"", "so", "then", "now", "next", "and"} and seen["swapped"] == {True, False}
    assert seen["distractors"] == {2, 3} and {("x", "y"), ("y", "x")} <= seen["distractor order"]
    assert len([order for order in seen["distractor order"] if len(order) == 3]) == 6
    assert seen["restated"] == {True, False}


def test_sequences_fit_the_chains_model(tokenizer):
    from oarctl.toy.pretrain import MAX_NEW_TOKENS, MAX_POSITIONS, _encode

    for item in _items(300, lengths=(8,)):
        prompt, response = _encode(tokenizer, item)
        assert len(response) <= MAX_NEW_TOKENS["chains"] and len(prompt) + len(response) <= MAX_POSITIONS["chains"]


# ---- labels of hand-written responses --------------------------------------------------------------

RIGHT = "b=34+7=41. so c=41-5=36. then x=41+3=44. d=36+8=44. now e=44-2=42. e=42. \\boxed{42}"
P = "1.1111.11."  # a step on the path, `b=34+7=41.`: name, operands, operator, result; not '=', '=', '.'
F = "."  # one free character
RIGHT_MARKS = (P + F + "so " .replace("s", F).replace("o", F).replace(" ", F) + P + F * 6 + F * 10 + F + P
               + F * 5 + P + F + F * 5 + F + F * 7 + "11" + F)


def test_labels_of_a_right_response_by_hand():
    assert len(RIGHT_MARKS) == len(RIGHT)
    assert marks(truth.character_labels(chains.parse_problem(PROBLEM), RIGHT)) == RIGHT_MARKS


def _labels(text: str) -> str:
    return marks(truth.character_labels(chains.parse_problem(PROBLEM), text))


def test_wrong_values_do_not_change_the_path():
    wrong = RIGHT.replace("c=41-5=36", "c=41-5=35").replace("d=36+8", "d=38+8").replace("42", "47")
    assert _labels(wrong) == RIGHT_MARKS


def test_a_missing_step_leaves_its_ancestors_on_the_path():
    assert _labels("b=34+7=41. d=36+8=44. e=44-2=42. \\boxed{42}") == P + F + P + F + P + F + F * 7 + "11" + F
    # the query itself never computed: the same rule, its ancestors' steps are still on the path
    assert _labels("b=34+7=41. c=41-5=36. d=36+8=44. \\boxed{44}") == (P + F) * 3 + F * 7 + "11" + F


def test_only_the_last_step_before_use_is_on_the_path():
    twice = "b=34+7=40. b=34+7=41. c=41-5=36. d=36+8=44. e=44-2=42. \\boxed{42}"
    assert _labels(twice) == F * 11 + (P + F) * 4 + F * 7 + "11" + F
    late = "b=34+7=41. c=41-5=36. d=36+8=44. e=44-2=42. b=34+7=41. \\boxed{42}"  # after its use: free
    assert _labels(late) == (P + F) * 4 + F * 11 + F * 7 + "11" + F


def test_unreadable_text_is_unknown_and_the_search_goes_on():
    text = "b=34+7=41. c=41-5=3x6. d=36+8=44. e=44-2=42. \\boxed{42}"
    assert _labels(text) == P + F + "?" * 11 + F + (P + F) * 2 + F * 7 + "11" + F


def test_without_a_box_the_path_is_taken_at_the_end_and_a_cut_step_is_unknown():
    assert _labels("b=34+7=41. c=41-5=36. d=36+8=44. e=44-2=42.") == (P + F) * 3 + P
    assert _labels("b=34+7=41. c=41-5=36. d=36+8=44. e=44-2=4") == (P + F) * 3 + "?" * 8
    assert _labels("b=34+7=41. c=41-5=36. \\boxed{4") == (P + F) * 2 + "?" * 8


def test_distractors_restatements_and_unknown_names_are_free():
    text = "find e. x=41+3=44. so q=1+1=2. next a=34+0=34. e=42. \\boxed{42}"
    assert _labels(text) == F * (len(text) - 3) + "11" + F


# ---- token labels and the rollouts column -------------------------------------------------------------

def test_token_labels_with_the_toy_tokenizer(tokenizer):
    ids = tokenizer(RIGHT, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    labels = truth.token_truth(PROBLEM, ids, tokenizer)
    assert len(labels) == len(ids)
    box = tokenizer.convert_tokens_to_ids("\\boxed{")
    marker = RIGHT.index("\\boxed{")  # one token for the 7 characters of the marker; the eos is free
    assert marks(labels) == RIGHT_MARKS[:marker] + F + RIGHT_MARKS[marker + 7:] + F
    assert labels[ids.index(box)] == 0


def test_truth_column_only_for_chains_prompt_sets(tokenizer):
    ids = tokenizer(RIGHT, add_special_tokens=False)["input_ids"]
    column = truth.truth_column([PROBLEM, PROBLEM], [ids, ids[:5]], tokenizer)
    assert column[0] == truth.token_truth(PROBLEM, ids, tokenizer) and len(column[1]) == 5
    assert truth.truth_column([PROBLEM, "Compute 47+6."], [ids, ids], tokenizer) is None
    assert truth.truth_column(["Compute 47+6."], [ids], tokenizer) is None
    assert truth.token_truth("Compute 47+6.", ids, tokenizer) is None


def test_labels_of_generated_solutions_match_their_structure(tokenizer):
    """Every chain step of a generated solution is labelled, every distractor and filler is free."""
    for item in _items(100):
        problem = chains.parse_problem(item["problem"])
        labels = truth.character_labels(problem, item["solution"])
        assert -1 not in labels
        for segment in truth.parse_response(item["solution"]):
            text = item["solution"][segment.start:segment.end]
            ones = labels[segment.start:segment.end].count(1)
            if segment.kind == "step":
                on_path = segment.name in problem.ancestors(problem.query)
                assert ones == (len(text) - 3 if on_path else 0), text  # all but '=', '=', '.'
            elif segment.kind == "box":
                assert ones == len(item["answer"])
            else:
                assert ones == 0


def test_wide_world_has_five_or_six_distractors_and_free_labels_for_all(tokenizer):
    """chains_wide (data.toy_family): chains of 4-6 and five or six distractor steps off the start, each
    labelled free; its solutions fit the shipped model's budget."""
    from oarctl.toy.families import iter_problems
    from oarctl.toy.pretrain import MAX_NEW_TOKENS, MAX_POSITIONS, _encode

    counts = set()
    for item in itertools.islice(iter_problems("chains_wide", 3, chains.WIDE_LENGTHS), 200):
        problem = chains.parse_problem(item["problem"])
        distractors = [d for d in problem.definitions if d.name in chains.DISTRACTOR_NAMES]
        assert all(d.parent == "a" for d in distractors) and item["level"] in chains.WIDE_LENGTHS
        counts.add(len(distractors))
        labels = truth.character_labels(problem, item["solution"])
        for segment in truth.parse_response(item["solution"]):
            if segment.kind == "step" and segment.name in chains.DISTRACTOR_NAMES:
                assert 1 not in labels[segment.start:segment.end]
        prompt, response = _encode(tokenizer, item)
        assert len(response) <= MAX_NEW_TOKENS["chains_wide"]
        assert len(prompt) + len(response) <= MAX_POSITIONS["chains_wide"]
    assert counts == set(chains.WIDE_DISTRACTORS)


def test_default_stream_is_the_one_the_shipped_policy_and_kept_runs_used():
    """The chains stream of seed 0 hashes as it did before the wide world's knobs were added: the
    shipped base policy and the kept runs in docs/results/ were drawn from it."""
    import hashlib
    import json

    digest = hashlib.sha256(json.dumps(_items(200), sort_keys=True).encode()).hexdigest()
    assert digest == "5e33bd395cf3c3dabdc348e46de9846065517380e4e4c0c4c6979b42e64e23a4"


def test_random_strings_never_crash_the_parser():
    rng = random.Random(0)
    alphabet = "abcxyz0123456789+-=. \\boxed{}so"
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60)))
        labels = truth.character_labels(chains.parse_problem(PROBLEM), text)
        assert len(labels) == len(text) and set(labels) <= {-1, 0, 1}


# ---- the warm start of the chains policy -----------------------------------------------------------

def test_chains_pretrain_paused_and_resumed_equals_one_run(tmp_path):
    """Paused after its first step and run again, the warm start ends with the bytes of one run."""
    from safetensors.torch import load_file

    from oarctl.toy.pretrain import pretrain

    settings = dict(max_steps=4, eval_every=2, n_heldout=2, eval_samples=1, log=lambda _: None, family="chains",
                    levels=(2,), hidden_size=32, num_layers=1, batch_size=4, target_band=(0.99, 1.0), threads=1)
    whole = pretrain(tmp_path / "whole", **settings)
    paused = pretrain(tmp_path / "parts", state_dir=tmp_path / "state", time_limit=1e-9, **settings)
    assert paused == {"paused": True, "step": 1} and not (tmp_path / "parts").exists()
    resumed = pretrain(tmp_path / "parts", state_dir=tmp_path / "state", **settings)
    assert resumed["steps_run"] == whole["steps_run"] == 4 and resumed["family"] == "chains"
    flags = "--family chains --levels 2 --hidden 32 --layers 1 --heldout 2 --eval-samples 1 --threads 1"
    assert flags in resumed["command"]
    first, second = (load_file(str(tmp_path / name / "model.safetensors")) for name in ("whole", "parts"))
    assert first.keys() == second.keys() and all(first[k].equal(second[k]) for k in first)


@pytest.mark.parametrize("name, family, lengths", [("toy-chains", "chains", chains.DEFAULT_LENGTHS),
                                                    ("toy-chains-wide", "chains_wide", chains.WIDE_LENGTHS)])
def test_shipped_chains_policy_is_right_sometimes_and_reproducible_from_its_command(name, family, lengths):
    """The committed checkpoint loads offline, was chosen inside its band, greedy-solves some held-out
    chains but not most, and records the command (with the recipe `oarctl toy build` uses)."""
    import json

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from oarctl.toy import base_policy_dir
    from oarctl.toy.pretrain import MAX_NEW_TOKENS, RECIPES, evaluate, heldout_problems

    path = base_policy_dir(name)
    meta = json.loads((path / "base_policy.json").read_text())
    assert meta["in_band"] and meta["family"] == family and f"--family {family} " in meta["command"]
    recipe = RECIPES[family]
    for flag, value in (("--lr", recipe["lr"]), ("--hidden", recipe["hidden_size"]), ("--eval-every",
                                                                                        recipe["eval_every"])):
        assert f"{flag} {value}" in meta["command"]
    tok, model = AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path)
    problems = heldout_problems(family, 99, lengths, 32, set())
    greedy = evaluate(model, tok, problems, temperature=0.0, max_new_tokens=MAX_NEW_TOKENS[family])
    assert 0.05 < greedy["accuracy"] < 0.8


def test_truth_entropy_splits_sampled_surprisal_by_label():
    from oarctl.stages.sample import truth_entropy

    labels = [[0, 1, 1, -1], [0, 0, 1]]
    logprobs = [[-1.0, -0.5, -0.1, -9.0], [-3.0, -2.0, -0.3]]
    metrics = truth_entropy(labels, logprobs)
    assert metrics["entropy_free_tokens"] == pytest.approx((1.0 + 3.0 + 2.0) / 3)  # unknown (-1) is neither
    assert metrics["entropy_answer_tokens"] == pytest.approx((0.5 + 0.1 + 0.3) / 3)
    assert truth_entropy(None, logprobs) == {}
    assert truth_entropy([[1, 1]], [[-1.0, -2.0]]) == {"entropy_answer_tokens": pytest.approx(1.5)}
